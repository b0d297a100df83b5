//! Graceful shutdown: a stopping node finishes and acknowledges what it holds and releases its
//! pins, so a standby takes over at once rather than after the pin TTL.

use std::time::Duration;

use jetshard_tests::node::now_ms;
use jetshard_tests::{Scenario, init_tracing};

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
