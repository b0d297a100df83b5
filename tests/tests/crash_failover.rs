//! Crash detection: a killed owner's partitions move as soon as its death is known (its
//! `<t>.alive.<incarnation>` gets "no responders"), not after the pin TTL; a stalled owner,
//! whose probes merely time out, keeps its pin until the TTL; and a partition moved away from a
//! live owner (a wrong verdict) keeps every promise.

use std::time::Duration;

use jetshard_testkit::wait_until;
use jetshard_tests::node::now_ms;
use jetshard_tests::{Scenario, init_tracing};

fn entities(count: usize) -> Vec<String> {
    (0..count).map(|e| format!("e{e}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owner_is_replaced_within_a_second_under_a_30_s_pin_ttl() {
    init_tracing();
    let mut s = Scenario::single(2).await.pin_ttl(Duration::from_secs(30));
    let entities = entities(20);
    let mut a = s.node("a").await;
    s.append_to_all(&entities, 0).await;
    s.wait_owns_all(&a).await;
    let b = s.node("b").await;

    let rounds = 20;
    let mut killed_at = 0;
    for n in 1..rounds {
        if n == rounds / 2 {
            a.kill().await;
            killed_at = now_ms();
        }
        s.append_to_all(&entities, n).await;
    }
    wait_until(
        Duration::from_secs(10),
        "b to own both partitions",
        || async { b.owned().len() == 2 },
    )
    .await
    .unwrap();
    for partition in 0..2 {
        let taken = b.acquired_after(partition, killed_at).expect("b took over");
        let takeover_ms = taken.at_ms - killed_at;
        eprintln!(
            "partition {partition}: taken over {takeover_ms} ms after SIGKILL (pin TTL 30 s)"
        );
        assert!(takeover_ms < 1000, "takeover took {takeover_ms} ms");
    }
    // Every entity holds 0..rounds, each once, in order, under its partition's generation.
    s.check().await;
}

/// Every live process watches, so two standbys find the dead owner at the same moment; the
/// server's unpin names no pin, and a second unpin would take the partition from the standby the
/// first one let in. Only the watch that stores the unpin record first may unpin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owner_s_partitions_move_once_though_two_standbys_watch() {
    init_tracing();
    let partitions = 8;
    let mut s = Scenario::single(partitions)
        .await
        .pin_ttl(Duration::from_secs(30));
    let entities = entities(40);
    let mut a = s.node("a").await;
    s.append_to_all(&entities, 0).await;
    s.wait_owns_all(&a).await;
    let b = s.node("b").await;
    let c = s.node("c").await;
    // Both standbys watch a: each has read a's claims (they pull, so they are running).
    s.append_to_all(&entities, 1).await;

    a.kill().await;
    let killed_at = now_ms();
    for n in 2..6 {
        s.append_to_all(&entities, n).await;
    }
    wait_until(
        Duration::from_secs(10),
        "b and c to own every partition",
        || async {
            let mut owned = b.owned();
            owned.extend(c.owned());
            owned.sort_unstable();
            owned.dedup();
            owned.len() == partitions as usize
        },
    )
    .await
    .unwrap();
    // Every command is served (so any second unpin has long happened) ...
    s.check().await;
    // ... and each partition was taken once, by one of them, with one new generation.
    for partition in 0..partitions {
        let takeovers: Vec<(String, u64)> = [&b, &c]
            .iter()
            .flat_map(|node| {
                node.lines()
                    .into_iter()
                    .filter(|l| {
                        l.what == "ACQUIRED" && l.partition == partition && l.at_ms >= killed_at
                    })
                    .map(|l| (node.id.clone(), l.generation))
            })
            .collect();
        assert_eq!(
            takeovers.len(),
            1,
            "partition {partition} moved more than once after the kill: {takeovers:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_owner_is_not_moved_by_probes_that_time_out() {
    init_tracing();
    let pin_ttl = Duration::from_secs(3);
    let mut s = Scenario::single(2).await.pin_ttl(pin_ttl);
    let entities = entities(10);
    let a = s.node("a").await;
    s.append_to_all(&entities, 0).await;
    s.wait_owns_all(&a).await;
    let b = s.node("b").await;

    a.pause();
    let stopped_at = now_ms();
    s.append_to_all(&entities, 1).await;
    wait_until(
        Duration::from_secs(15),
        "b to own both partitions",
        || async { b.owned().len() == 2 },
    )
    .await
    .unwrap();
    for partition in 0..2 {
        let taken = b
            .acquired_after(partition, stopped_at)
            .expect("b took over");
        let takeover_ms = taken.at_ms - stopped_at;
        eprintln!("partition {partition}: taken over {takeover_ms} ms after SIGSTOP (pin TTL 3 s)");
        // The pin was last refreshed at most a pull's expiry (TTL / 3) before the stop; every
        // probe of `a` in between waited a whole second for an answer and counted for nothing.
        assert!(
            takeover_ms >= 1800,
            "a stalled owner was moved after {takeover_ms} ms, before its pin TTL"
        );
    }
    a.resume();
    s.append_to_all(&entities, 2).await;
    s.check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_moved_away_from_a_live_owner_keeps_every_promise() {
    init_tracing();
    let mut s = Scenario::single(2).await;
    let entities = entities(20);
    let a = s.node("a").await;
    s.append_to_all(&entities, 0).await;
    s.wait_owns_all(&a).await;
    let b = s.node("b").await;
    let commands = s.js.get_stream("LEDGER_CMD").await.expect("command stream");

    // What a wrong verdict does: the live owner's pins are taken away while it works.
    for n in 1..30 {
        s.append_to_all(&entities, n).await;
        if n % 3 == 0 {
            for partition in 0..2 {
                commands
                    .unpin_consumer(&format!("ledger-p{partition}"), "owners")
                    .await
                    .expect("unpin");
            }
        }
    }
    let report = s.check().await;
    let acquisitions = a
        .lines()
        .iter()
        .chain(b.lines().iter())
        .filter(|l| l.what == "ACQUIRED")
        .count();
    eprintln!("{acquisitions} acquisitions; {:?}", report.summary());
    assert!(acquisitions > 2, "no partition was moved");
}
