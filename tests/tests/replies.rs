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
