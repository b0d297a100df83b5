//! The outbox: messages a command sends are published only after its events are durable, and a
//! crash between the event write and the publish is made good by the next owner, each message
//! stored once by its JetStream target.

use std::time::Duration;

use async_nats::jetstream::stream;
use futures::StreamExt;
use jetshard::{Reply, ShardSystem};
use jetshard_testkit::wait_until;
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::model::Op;
use jetshard_tests::{Scenario, init_tracing};

const WITHIN: Duration = Duration::from_secs(20);

/// A stream that stores what the ledger publishes to `sink.>`.
async fn sink(s: &Scenario) -> stream::Stream {
    s.js.create_stream(stream::Config {
        name: "SINK".into(),
        subjects: vec!["sink.>".into()],
        ..Default::default()
    })
    .await
    .unwrap()
}

/// How many messages the sink stream holds.
async fn stored(s: &Scenario) -> u64 {
    let sink = s.js.get_stream("SINK").await.unwrap();
    sink.cached_info().state.messages
}

/// Waits until the command forwarded to `dst` (`Push { n }`) is applied there and the sink holds
/// one message.
async fn forwarded_once(s: &Scenario, n: u64) {
    wait_until(WITHIN, &format!("dst pushed {n}"), || async {
        s.sender
            .get("dst", Duration::from_secs(1))
            .await
            .is_ok_and(|snapshot| snapshot.state == vec![n])
    })
    .await
    .unwrap();
    wait_until(WITHIN, "the sink message", || async {
        stored(s).await == 1
    })
    .await
    .unwrap();
}

/// Sends `Forward { n, to: "dst" }` to `src` and waits for its answer: applied.
async fn forward(s: &Scenario, n: u64) -> Reply<Ledger> {
    let command = LedgerCmd::Forward {
        n,
        to: "dst".into(),
    };
    let reply: Reply<Ledger> = s.sender.request("src", &command, WITHIN).await.unwrap();
    assert!(matches!(reply, Reply::Applied { .. }), "{reply:?}");
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_sends_its_outbox_after_its_events_are_durable() {
    init_tracing();
    let s = Scenario::single(2).await;
    let sink = sink(&s).await;
    let system = s.system("n1").await;
    let reply = forward(&s, 7).await;
    // The command to another entity was applied, and the message stored, once.
    forwarded_once(&s, 7).await;
    let message = sink
        .get_last_raw_message_by_subject("sink.7")
        .await
        .unwrap();
    // Spread, each command stream numbers its own commands: the id names the partition too.
    let names = s.config("n1").build().unwrap().names();
    let source = if names.is_spread() {
        let src = jetshard::EntityId::new("src").unwrap();
        format!("{}:", jetshard::partition_of(&src, names.partitions()))
    } else {
        String::new()
    };
    assert_eq!(
        message.headers.get("Nats-Msg-Id").map(|v| v.as_str()),
        Some(format!("ledger:{source}{}:out:1", reply.command_seq()).as_str())
    );
    assert_eq!(&message.payload[..], b"7");

    // A rejected command sends nothing.
    let rejected = s
        .sender
        .request("src", &LedgerCmd::Refuse, WITHIN)
        .await
        .unwrap();
    assert!(matches!(rejected, Reply::Rejected { .. }));
    system.shutdown().await.unwrap();
    assert_eq!(stored(&s).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_event_write_and_the_publish_is_made_good_by_the_next_owner() {
    init_tracing();
    let s = Scenario::single(1).await;
    sink(&s).await;
    // Every publish to the sink, including those the stream drops as duplicates.
    let mut published = s.client.subscribe("sink.>").await.unwrap();

    // The node dies applying `Appended { n: 500 }`: after the write of the events and the
    // outbox records, before the outbox is published.
    let mut doomed = s
        .node_with("doomed", &[("LEDGER_ABORT_ON_APPLY", "500")])
        .await;
    s.sender
        .send("warm", &LedgerCmd::Push { n: 0 })
        .await
        .unwrap();
    s.wait_owns_all(&doomed).await;
    let forward = s
        .sender
        .send(
            "src",
            &LedgerCmd::Forward {
                n: 500,
                to: "dst".into(),
            },
        )
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WITHIN;
    while doomed.is_running() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the node did not die applying"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(stored(&s).await, 0, "published before the crash");

    // The next owner publishes the outbox again; the forwarded command runs once.
    let heir = s.node("heir").await;
    s.wait_owns_all(&heir).await;
    forwarded_once(&s, 500).await;
    let first = tokio::time::timeout(WITHIN, published.next())
        .await
        .unwrap();
    assert!(first.is_some());
    // The source command itself was applied once (its redelivery is a duplicate).
    let src = s.sender.get("src", WITHIN).await.unwrap();
    assert_eq!((src.state, src.last_command_seq), (vec![500], forward));

    // A restart of the owner publishes nothing again: the outbox is confirmed.
    drop(heir);
    let heir2 = s.node("heir2").await;
    s.sender
        .send("warm", &LedgerCmd::Push { n: 1 })
        .await
        .unwrap();
    s.wait_owns_all(&heir2).await;
    wait_until(WITHIN, "warm pushed 1", || async {
        s.sender
            .get("warm", Duration::from_secs(1))
            .await
            .is_ok_and(|snapshot| snapshot.state == vec![0, 1])
    })
    .await
    .unwrap();
    assert_eq!(stored(&s).await, 1);
    let dst = s.sender.get("dst", WITHIN).await.unwrap();
    assert_eq!(dst.state, vec![500], "the forwarded command ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_stream_from_before_the_outbox_is_given_its_subject() {
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    js.create_stream(stream::Config {
        name: "LEDGER_JOURNAL".into(),
        subjects: vec![
            "ledger.evt.*.*".into(),
            "ledger.fence.*".into(),
            "ledger.dlq.*".into(),
        ],
        allow_atomic_publish: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let config = jetshard_tests::ledger_config(1, "n1").build().unwrap();
    let system = jetshard::ShardSystem::start::<Ledger>(client, config)
        .await
        .unwrap();
    let mut journal = js.get_stream("LEDGER_JOURNAL").await.unwrap();
    let subjects = journal.info().await.unwrap().config.subjects.clone();
    assert!(
        subjects.contains(&"ledger.out.*".to_owned()),
        "{subjects:?}"
    );
    system.shutdown().await.unwrap();
}

/// Forgets that the partition's last outbox command was confirmed, as if its owner had died
/// between the publish and the done record: deletes the done record, which must be the last
/// record on `ledger.out.0`. Returns its journal sequence.
async fn forget_the_done_record(s: &Scenario) -> u64 {
    let journal = s.js.get_stream("LEDGER_JOURNAL").await.unwrap();
    let done = journal
        .get_last_raw_message_by_subject("ledger.out.0")
        .await
        .unwrap();
    assert!(
        done.headers.get("Jetshard-Outbox-Done").is_some(),
        "the last outbox record is not a done record: {:?}",
        done.headers
    );
    assert!(journal.delete_message(done.sequence).await.unwrap());
    done.sequence
}

/// Restarts the server (the command stream forgets the msg ids of the commands consumed), then
/// starts a new owner, which publishes the outbox again; waits until it confirmed it again.
async fn republish_after_a_server_restart(s: &Scenario, node: &str, deleted: u64) -> ShardSystem {
    s.server().kill().unwrap();
    s.server().restart().await.unwrap();
    let system = s.system(node).await;
    s.sender
        .send(&format!("warm-{node}"), &LedgerCmd::Push { n: 0 })
        .await
        .unwrap();
    wait_until(WITHIN, "the outbox confirmed again", || async {
        let Ok(journal) = s.js.get_stream("LEDGER_JOURNAL").await else {
            return false;
        };
        journal
            .get_last_raw_message_by_subject("ledger.out.0")
            .await
            .is_ok_and(|m| m.sequence > deleted && m.headers.get("Jetshard-Outbox-Done").is_some())
    })
    .await
    .unwrap();
    system
}

/// Asserts that the first record on `subject` carries `header`.
async fn assert_first_has(journal: &stream::Stream, subject: &str, header: &str) {
    let first = journal
        .get_first_raw_message_by_subject(subject, 1)
        .await
        .unwrap();
    assert!(
        first.headers.get(header).is_some(),
        "{subject}: no {header}: {:?}",
        first.headers
    );
}

/// `dst`'s state once a `Push { n }` sent now was applied (commands to one entity are
/// applied in their stream order, so every copy stored before it was handled by then).
async fn dst_after_push(s: &Scenario, n: u64) -> Vec<u64> {
    s.sender.send("dst", &LedgerCmd::Push { n }).await.unwrap();
    wait_until(WITHIN, "dst applied the push", || async {
        s.sender
            .get("dst", Duration::from_secs(1))
            .await
            .is_ok_and(|snapshot| snapshot.state.contains(&n))
    })
    .await
    .unwrap();
    s.sender.get("dst", WITHIN).await.unwrap().state
}

/// nats-server forgets, on a restart, the msg ids of the commands a work-queue command stream
/// no longer holds (`dedup_after_restart.rs`): an outbox message published again then is
/// stored again. The target entity remembers the origins of the messages it applied, in its
/// events (first round: loaded from its events) and in its snapshots (second round: loaded
/// from a snapshot, its events purged), and answers the copy as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_message_published_again_after_a_server_restart_is_applied_once() {
    init_tracing();
    let s = Scenario::single(1).await;
    let config = |node: &str| s.config(node).compaction(false);
    let system = s.system_with(config("n1")).await;
    forward(&s, 5).await;
    assert_eq!(dst_after_push(&s, 6).await, vec![5, 6]);
    system.shutdown().await.unwrap();
    // Each round: the record that names the origin, the record purged so that dst loads from
    // the other, the next owner, the push after the copy.
    let rounds = [
        // dst loaded from its events (its snapshot removed).
        (
            "ledger.evt.0.dst",
            "Jetshard-Origin",
            "ledger.snap.0.dst",
            "n2",
            7,
        ),
        // dst loaded from the snapshot n2 wrote when it let dst go (a roll-up: the subject's
        // only record), its events gone.
        (
            "ledger.snap.0.dst",
            "Jetshard-Origins",
            "ledger.evt.0.dst",
            "n3",
            8,
        ),
    ];
    let mut expected = vec![5, 6];
    for (named_in, header, purged, node, n) in rounds {
        let journal = s.js.get_stream("LEDGER_JOURNAL").await.unwrap();
        assert_first_has(&journal, named_in, header).await;
        journal.purge().filter(purged).await.unwrap();
        let deleted = forget_the_done_record(&s).await;
        let system = republish_after_a_server_restart(&s, node, deleted).await;
        expected.push(n);
        assert_eq!(dst_after_push(&s, n).await, expected, "{node}");
        system.shutdown().await.unwrap();
    }
}

/// A message its target refuses for longer than the publish's patience (here a full stream
/// that discards new messages) is published again, by a recovery the owner starts at once,
/// as soon as the target takes it, without waiting for another owner of the partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_refused_past_the_publish_patience_is_published_once_the_target_takes_it() {
    init_tracing();
    let s = Scenario::single(1).await;
    let mut config = stream::Config {
        name: "SINK".into(),
        subjects: vec!["sink.>".into()],
        max_messages: 1,
        discard: stream::DiscardPolicy::New,
        ..Default::default()
    };
    s.js.create_stream(config.clone()).await.unwrap();
    s.js.publish("sink.full", "taken".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let system = s.system("n1").await;
    forward(&s, 7).await;
    // Refused past the publish's patience (15 s): the owner's recovery goes on trying.
    tokio::time::sleep(Duration::from_secs(18)).await;
    assert_eq!(stored(&s).await, 1, "the full sink took the message");
    config.max_messages = -1;
    s.js.update_stream(config).await.unwrap();
    wait_until(
        Duration::from_secs(30),
        "the refused message published",
        || async {
            s.js.get_stream("SINK")
                .await
                .unwrap()
                .get_last_raw_message_by_subject("sink.7")
                .await
                .is_ok()
        },
    )
    .await
    .unwrap();
    assert_eq!(stored(&s).await, 2);
    system.shutdown().await.unwrap();
}

/// A write answered "not confirmed" that lands anyway (the server stopped while it was on its
/// way): its command comes back a duplicate at its retry, and its outbox, which that write
/// holds, is published then, each message stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_of_a_write_not_confirmed_that_landed_is_published() {
    init_tracing();
    // A long pin TTL: the generation outlives the pause, so no takeover recovers the outbox.
    let mut s = Scenario::single(2).await.pin_ttl(Duration::from_secs(10));
    sink(&s).await;
    let system = s.system_with(s.doubting_config("n1")).await;
    let forward = LedgerCmd::Forward {
        n: 4,
        to: "dst".into(),
    };
    // Recorded as what it does to its own entity: `n` appended once.
    s.send_unconfirmed(&system, "src", 4, forward, Op::Push(4))
        .await;
    forwarded_once(&s, 4).await;
    s.wait_holds("src", &[4]).await;
    system.shutdown().await.expect("shut down");
}
