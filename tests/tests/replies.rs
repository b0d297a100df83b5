//! Typed replies: a client that asks gets the events its command wrote and the entity's own
//! rejection, decoded into the entity's types; an untyped client still reads the JSON outcome.

use std::time::Duration;

use jetshard::{CommandOutcome, Reply};
use jetshard_tests::ledger::{Ledger, LedgerCmd, LedgerEvt};
use jetshard_tests::{Scenario, init_tracing};

const WITHIN: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_returns_the_events_and_the_typed_rejection() {
    init_tracing();
    let s = Scenario::single(2).await;
    let system = s.system("n1").await;
    let sender = &s.sender;

    let reply: Reply<Ledger> = sender
        .request("r", &LedgerCmd::AppendMany { from: 0, count: 3 }, WITHIN)
        .await
        .unwrap();
    let Reply::Applied {
        command_seq,
        events,
    } = reply
    else {
        panic!("not applied: {reply:?}");
    };
    assert_eq!(command_seq, 1);
    assert_eq!(
        events,
        (0..3)
            .map(|n| LedgerEvt::Appended { n })
            .collect::<Vec<_>>()
    );

    let reply = sender
        .request("r", &LedgerCmd::Append { n: 9 }, WITHIN)
        .await
        .unwrap();
    assert!(
        matches!(&reply, Reply::Rejected { command_seq: 2, rejection } if rejection == "expected 3, got 9"),
        "{reply:?}"
    );

    let reply = sender
        .request("r", &LedgerCmd::Panic, WITHIN)
        .await
        .unwrap();
    assert!(
        matches!(&reply, Reply::DeadLettered { reason, .. } if reason.contains("panicked")),
        "{reply:?}"
    );

    // The untyped outcome of the same kind of command is unchanged.
    let outcome = sender
        .request_outcome("r", &LedgerCmd::Append { n: 3 }, WITHIN)
        .await
        .unwrap();
    assert_eq!(
        outcome,
        CommandOutcome::Applied {
            command_seq: 4,
            events: 1
        }
    );
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_reads_as_the_documented_json_outcome_with_payload_fields() {
    init_tracing();
    let s = Scenario::single(1).await;
    let system = s.system("n1").await;
    let client = async_nats::connect(s.server().url()).await.unwrap();
    let inbox = client.new_inbox();
    let mut answers = client.subscribe(inbox.clone()).await.unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(jetshard::wire::HDR_REPLY_TO, inbox.as_str());
    let js = async_nats::jetstream::new(client.clone());
    let payload = serde_json::to_vec(&LedgerCmd::Append { n: 0 }).unwrap();
    js.publish_with_headers("ledger.cmd.x", headers, payload.into())
        .await
        .unwrap()
        .await
        .unwrap();
    let answer = tokio::time::timeout(WITHIN, futures::StreamExt::next(&mut answers))
        .await
        .expect("an answer in time")
        .expect("an answer");
    let json: serde_json::Value = serde_json::from_slice(&answer.payload).unwrap();
    assert_eq!(json["outcome"], "applied", "{json}");
    assert_eq!(json["events"], 1, "{json}");
    assert_eq!(
        json["event_payloads"].as_array().map(Vec::len),
        Some(1),
        "{json}"
    );
    system.shutdown().await.unwrap();
}

/// The owner writes the events of a requested command and dies (abort: as a SIGKILL) before it
/// answers or acknowledges it; the next owner finds it applied. The client asked once, so its
/// answer is the command's own outcome with its events, not a `Duplicate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_applied_by_an_owner_that_died_before_answering_gets_its_events() {
    init_tracing();
    let s = Scenario::single(1).await;
    // `a` aborts between the durable write of `Appended { n: 4 }` and its answer and ack.
    let a = s.node_with("a", &[("LEDGER_ABORT_ON_APPLY", "4")]).await;
    for n in 0..4 {
        let reply = s
            .sender
            .request("x", &LedgerCmd::Append { n }, WITHIN)
            .await
            .unwrap();
        assert!(matches!(reply, Reply::Applied { .. }), "{reply:?}");
    }
    s.wait_owns_all(&a).await;
    let b = s.node("b").await;
    let reply = s
        .sender
        .request("x", &LedgerCmd::Append { n: 4 }, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(b.owned() == vec![0], "b answered, so b owns the partition");
    match reply {
        Reply::Applied { events, .. } => {
            assert_eq!(events, vec![LedgerEvt::Appended { n: 4 }]);
        }
        other => panic!("a first-time request after a takeover answered {other:?}"),
    }
}

/// `request_with_key`: a retry after a request that got no outcome (no owner ran) listens where
/// the stored command is answered and gets its typed outcome; the command is stored once. A
/// send of the same key after that answer is the one `Duplicate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_request_retried_gets_the_typed_outcome_and_only_a_resend_is_a_duplicate() {
    init_tracing();
    let s = Scenario::single(1).await;
    s.provision().await;
    let command = LedgerCmd::AppendMany { from: 0, count: 2 };
    let first = s
        .sender
        .request_with_key("k", "op-1", &command, Duration::from_millis(300))
        .await;
    let stored_seq = match first {
        Err(jetshard::Error::NoOutcome { command_seq, .. }) => command_seq,
        other => panic!("no owner runs, yet {other:?}"),
    };
    // The retry listens before an owner starts.
    let sender = s.sender.clone();
    let retry = tokio::spawn(async move {
        sender
            .request_with_key("k", "op-1", &command, Duration::from_secs(20))
            .await
    });
    let system = s.system("n1").await;
    let reply = retry.await.unwrap().unwrap();
    match reply {
        Reply::Applied {
            command_seq,
            events,
        } => {
            assert_eq!(command_seq, stored_seq);
            assert_eq!(
                events,
                vec![LedgerEvt::Appended { n: 0 }, LedgerEvt::Appended { n: 1 }]
            );
        }
        other => panic!("the retry answered {other:?}"),
    }
    // Sent again after its answer went out: a duplicate of the same command, nothing stored.
    let again = s
        .sender
        .request_with_key(
            "k",
            "op-1",
            &LedgerCmd::AppendMany { from: 0, count: 2 },
            Duration::from_millis(500),
        )
        .await
        .unwrap();
    assert!(
        matches!(again, Reply::Duplicate { command_seq, .. } if command_seq == stored_seq),
        "{again:?}"
    );
    // Another key is another command (rejected here: the ledger is at 2).
    let other = s
        .sender
        .request_with_key("k", "op-2", &LedgerCmd::Append { n: 0 }, WITHIN)
        .await
        .unwrap();
    assert!(
        matches!(&other, Reply::Rejected { rejection, .. } if rejection == "expected 2, got 0"),
        "{other:?}"
    );
    system.shutdown().await.unwrap();
}

/// What an owner that rejected a requested command and handed the entity over (a snapshot
/// recording `rejected <reason>`) before acknowledging it leaves behind: the next owner gets the
/// redelivery, finds it processed, and answers the client with the typed rejection, not a
/// `Duplicate`. The journal is written here as that owner of generation 1 would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_request_rejected_before_a_takeover_is_answered_with_its_rejection() {
    use async_nats::HeaderMap;
    use jetshard::FenceRecord;
    use jetshard::wire::{
        HDR_COMMAND_SEQ, HDR_EXPECTED_SUBJECT, HDR_EXPECTED_SUBJECT_SEQ, HDR_GENERATION,
        HDR_LAST_OUTCOME, HDR_ROLLUP, HDR_SNAPSHOT_UPTO, HDR_STATE_VERSION, Names,
    };

    init_tracing();
    let s = Scenario::single(1).await;
    s.provision().await;
    let sender = s.sender.clone();
    let request = tokio::spawn(async move {
        sender
            .request("x", &LedgerCmd::Append { n: 9 }, Duration::from_secs(20))
            .await
    });
    let js = s.js.clone();
    jetshard_testkit::wait_until(WITHIN, "the command is stored", || {
        let js = js.clone();
        async move {
            let Ok(mut commands) = js.get_stream("LEDGER_CMD").await else {
                return false;
            };
            commands.info().await.is_ok_and(|i| i.state.messages == 1)
        }
    })
    .await
    .unwrap();
    let mut commands = s.js.get_stream("LEDGER_CMD").await.unwrap();
    let command_seq = commands.info().await.unwrap().state.last_sequence;

    let names = Names::new("ledger");
    let mut headers = HeaderMap::new();
    headers.insert(HDR_GENERATION, "1");
    let fence = serde_json::to_vec(&FenceRecord::new(0, 1, "handed-over")).unwrap();
    let fence_seq =
        s.js.publish_with_headers(names.fence_subject(0), headers.clone(), fence.into())
            .await
            .unwrap()
            .await
            .unwrap()
            .sequence;
    headers.insert(HDR_COMMAND_SEQ, command_seq.to_string());
    headers.insert(HDR_SNAPSHOT_UPTO, "0");
    headers.insert(HDR_STATE_VERSION, "1");
    headers.insert(HDR_ROLLUP, "sub");
    headers.insert(HDR_LAST_OUTCOME, "rejected expected 2, got 9");
    headers.insert(HDR_EXPECTED_SUBJECT_SEQ, fence_seq.to_string());
    headers.insert(HDR_EXPECTED_SUBJECT, names.fence_subject(0));
    s.js.publish_with_headers(
        names.snapshot_subject(0, &jetshard::EntityId::new("x").unwrap()),
        headers,
        "[0,1]".into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();

    let system = s.system("n1").await;
    let reply = request.await.unwrap().unwrap();
    assert!(
        matches!(&reply, Reply::Rejected { command_seq: seq, rejection } if *seq == command_seq && rejection == "expected 2, got 9"),
        "{reply:?}"
    );
    system.shutdown().await.unwrap();
}
