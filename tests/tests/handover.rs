//! Graceful shutdown: a stopping node finishes and acknowledges what it holds and releases its
//! pins, so a standby takes over at once rather than after the pin TTL.

use std::time::Duration;

use futures::StreamExt;

use jetshard::wire::{HDR_SNAPSHOT_UPTO, Names};
use jetshard::{EntityId, OwnershipChange, OwnershipEvent};
use jetshard_testkit::wait_until;
use jetshard_tests::node::now_ms;
use jetshard_tests::{Scenario, init_tracing, wait_drained};
use tokio::sync::broadcast::error::RecvError;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_node_hands_its_partitions_over_well_before_the_pin_ttl() {
    init_tracing();
    // A long pin TTL: a takeover that waited for it would take 5 s.
    let mut s = Scenario::single(2)
        .await
        .pin_ttl(Duration::from_secs(5))
        .ack_wait(Duration::from_secs(5));
    let entities: Vec<String> = (0..10).map(|e| format!("e{e}")).collect();

    let mut a = s.node("a").await;
    s.append_to_all(&entities, 0).await;
    s.wait_owns_all(&a).await;
    let b = s.node("b").await;

    let rounds = 20;
    let mut stopped_at = 0;
    let mut a_owned = Vec::new();
    for n in 1..rounds {
        if n == rounds / 2 {
            // Balancing may already have moved a partition to b.
            a_owned = a.owned();
            stopped_at = now_ms();
            a.terminate().await;
        }
        s.append_to_all(&entities, n).await;
    }
    assert!(a.printed("STOPPED"), "a did not stop gracefully");
    // Every entity holds 0..rounds, each once, in order, under its partition's generation.
    s.check_within(Duration::from_secs(30)).await;
    assert!(!a_owned.is_empty());
    for partition in a_owned {
        let taken = b
            .acquired_after(partition, stopped_at)
            .expect("b took over");
        let handover_ms = taken.at_ms - stopped_at;
        eprintln!(
            "partition {partition}: handed over {handover_ms} ms after SIGTERM (pin TTL 5000 ms)"
        );
        assert!(
            handover_ms < 2500,
            "handover took {handover_ms} ms: the pin was not released"
        );
    }
}

/// A release hands each entity over as a snapshot: every entity the stopping owner held has a
/// snapshot that covers its last event, so the next owner loads it with one read (not its
/// events since its last snapshot, while its commands wait), and goes on from the right state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_owner_leaves_a_snapshot_of_every_entity_it_held() {
    init_tracing();
    let mut s = Scenario::single(2).await;
    // No periodic snapshots: only the release writes them.
    let a = s.system_with(s.config("a").snapshot_every(0)).await;
    let entities: Vec<String> = (0..8).map(|e| format!("e{e}")).collect();
    for n in 0..5 {
        s.append_to_all(&entities, n).await;
    }
    wait_drained(&s.js, Duration::from_secs(30))
        .await
        .expect("every command acknowledged");
    a.shutdown().await.expect("a stops");

    let names = Names::new("ledger");
    for entity in &entities {
        let id = EntityId::new(entity).expect("id");
        let partition = jetshard::partition_of(&id, 2);
        let journal =
            s.js.get_stream(jetshard_tests::ledger_journal_of(&s.js, partition).await)
                .await
                .expect("journal");
        let last_event = journal
            .get_last_raw_message_by_subject(&names.event_subject(partition, &id))
            .await
            .expect("its events")
            .sequence;
        let snapshot = journal
            .get_last_raw_message_by_subject(&names.snapshot_subject(partition, &id))
            .await
            .unwrap_or_else(|e| panic!("{entity} has no snapshot after the release: {e}"));
        let upto: u64 = snapshot
            .headers
            .get(HDR_SNAPSHOT_UPTO)
            .and_then(|v| v.as_str().parse().ok())
            .expect("the snapshot says what it covers");
        assert_eq!(
            upto, last_event,
            "{entity}'s snapshot covers its last event"
        );
    }

    // The next owner goes on from there.
    let _b = s.system("b").await;
    s.append_to_all(&entities, 5).await;
    s.check_within(Duration::from_secs(30)).await;
}

/// A process stopped during the cool-down after a hand-off stops at once: its owner of the
/// partition it handed off holds nothing, and does not wait out the ack wait for its pulls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_stopped_while_cooling_down_after_a_hand_off_stops_at_once() {
    init_tracing();
    // Cool-down: two pin TTLs (4 s). Before the fix, the stop waited for the ack wait (10 s).
    let mut s = Scenario::single(4)
        .await
        .pin_ttl(Duration::from_secs(2))
        .ack_wait(Duration::from_secs(10));
    let entities: Vec<String> = (0..4).map(|p| jetshard_tests::id_in("e", p, 4)).collect();
    let a = s.system("a").await;
    let mut events = a.ownership_events();
    s.append_to_all(&entities, 0).await;
    wait_until(
        Duration::from_secs(20),
        "a to own every partition",
        || async {
            a.status()
                .await
                .is_ok_and(|p| p.iter().all(|p| p.generation.is_some()))
        },
    )
    .await
    .expect("a owns all");
    let b = s.system("b").await;
    // a hands two partitions off to b.
    let handed_off = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match events.recv().await {
                Ok(OwnershipEvent {
                    change: OwnershipChange::Released { reason },
                    ..
                }) if reason == "handed off" => return,
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => panic!("a stopped"),
            }
        }
    })
    .await;
    assert!(handed_off.is_ok(), "a handed nothing off within 20 s");
    let stopping = tokio::time::Instant::now();
    a.shutdown().await.expect("a stops");
    let took = stopping.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "a took {took:?} to stop during its cool-down"
    );
    s.append_to_all(&entities, 1).await;
    s.check_within(Duration::from_secs(30)).await;
    drop(b);
}

/// A stopping process's standby may still have a pull open at the server when the partition's
/// pin is free, and be pinned through it. It must give that pin back at once: nobody else
/// would (it never claimed the partition, so no crash watch finds its owner dead), and the
/// partition would wait for the pin's TTL after the process is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_pinned_while_its_process_stops_gives_the_pin_back_at_once() {
    init_tracing();
    // A long pin TTL: a takeover that waited for it would take 10 s. A pull stays open for a
    // third of it, long enough to be pinned through after the stop began.
    let ttl = Duration::from_secs(10);
    let mut s = Scenario::single(1)
        .await
        .pin_ttl(ttl)
        .ack_wait(Duration::from_secs(5));
    let a = s.system("a").await;
    // No command yet: a's owner of the partition is a standby with a pull open.
    let names = Names::new("ledger");
    let client = async_nats::connect(s.server().url())
        .await
        .expect("connect");
    let mut heartbeats = client
        .subscribe(names.membership_subject())
        .await
        .expect("subscribe to heartbeats");
    // The subscription must be registered at the server before the stop says "leaving", or
    // the heartbeat goes to nobody. `flush` only writes it out (async-nats 0.51 sends no PING);
    // the server handles a connection's operations in order, so the answer to a request sent
    // after it (here "no responders") means it is in place. The full suite on a loaded machine
    // once missed the heartbeat without this.
    let synced = client.request("handover.sync", "".into()).await;
    assert!(
        synced.is_err_and(|e| e.kind() == async_nats::RequestErrorKind::NoResponders),
        "a round trip through the server"
    );
    let stopping = tokio::spawn(a.shutdown());
    // The stop says "leaving" just before it tells the owners to release.
    let leaving = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(message) = heartbeats.next().await {
            let heartbeat: serde_json::Value =
                serde_json::from_slice(&message.payload).expect("a heartbeat");
            if heartbeat["leaving"] == true {
                return;
            }
        }
    })
    .await;
    // CI once missed it: the stop dropped its client before the heartbeat was written out.
    leaving.expect("a says it is leaving before it releases");
    // The server pins a's open pull with this command, while a's owner is releasing.
    s.send("e0", jetshard_tests::model::Op::Append(0)).await;
    stopping.await.expect("join").expect("a stops");
    let b = s.system("b").await;
    let started = tokio::time::Instant::now();
    wait_until(
        Duration::from_secs(20),
        "b to acquire the partition",
        || async {
            b.status()
                .await
                .is_ok_and(|p| p.iter().all(|p| p.generation.is_some()))
        },
    )
    .await
    .expect("b acquires");
    let took = started.elapsed();
    eprintln!("b acquired {took:?} after it started (pin TTL {ttl:?})");
    assert!(
        took < Duration::from_secs(4),
        "b acquired {took:?} after it started: a kept the pin it was given while stopping"
    );
    s.check_within(Duration::from_secs(30)).await;
}
