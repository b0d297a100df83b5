//! Three `order-processor node` processes against a real server: while orders load, one node
//! is SIGKILLed and another frozen (SIGSTOP) past its pin TTL and thawed; `verify` then finds
//! every command answered exactly once, as the rules say, and no write from a stale owner.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use jetshard_testkit::{NatsServer, wait_until};
use order_processor::nodes::unix_ms;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_finds_no_violation_after_one_node_is_killed_and_another_frozen_past_its_pin_ttl() {
    let started = Instant::now();
    let server = NatsServer::start().await.expect("nats-server");
    let url = server.url();
    let logs = tempfile::tempdir().expect("temp dir");
    let mut nodes = common::start_three(&url, logs.path(), &[]).await;

    // About 2,500 commands over 10 s: the load outlasts both faults.
    let load = common::start_load(&url, &["--orders", "500", "--rate", "250"]);

    let (victim, killed_parts, survivors) = common::kill_the_busiest(&mut nodes).await;

    // Stall: the survivor owning the most partitions freezes with what it holds.
    let frozen = *survivors
        .iter()
        .max_by_key(|i| nodes.0[**i].owned().len())
        .expect("a survivor");
    let last = survivors
        .iter()
        .copied()
        .find(|i| *i != frozen)
        .expect("another survivor");
    let frozen_parts = nodes.0[frozen].owned();
    assert!(!frozen_parts.is_empty());
    let frozen_at_ms = unix_ms();
    let frozen_at = Instant::now();
    nodes.0[frozen].freeze().expect("SIGSTOP");
    wait_until(
        Duration::from_secs(20),
        "the last node took the frozen node's partitions",
        || async {
            let taken: BTreeSet<u32> = nodes.0[last]
                .acquired_since(frozen_at_ms)
                .into_iter()
                .map(|(partition, _, _)| partition)
                .collect();
            frozen_parts.iter().all(|p| taken.contains(p))
        },
    )
    .await
    .expect("takeover after the freeze");
    // The pin lapses a pin TTL after the frozen node's last pull, which it sent at most a
    // third of the TTL (the pull expiry) before it froze.
    let stalled_for = frozen_at.elapsed();
    assert!(
        stalled_for >= common::settings().pin_ttl / 2,
        "taken over {stalled_for:?} after the freeze: too soon for the pin TTL to have run out"
    );

    // Thaw: the stale owner finds its pin gone or its writes fenced, and steps down.
    let thawed_at_ms = unix_ms();
    nodes.0[frozen].thaw().expect("SIGCONT");
    wait_until(
        Duration::from_secs(20),
        "the thawed node stepped down",
        || async {
            let released: BTreeSet<u32> = nodes.0[frozen]
                .released()
                .into_iter()
                .map(|(p, _, _)| p)
                .collect();
            frozen_parts.iter().all(|p| released.contains(p))
        },
    )
    .await
    .expect("step down after the thaw");

    common::finish_load(load).await;

    let verify = ["verify", "--nats-url", &url, "--settle-secs", "30"];
    let (verified, report) = common::output(&verify, Duration::from_secs(60)).await;
    eprintln!(
        "killed {} (partitions {killed_parts:?}), froze {} for {stalled_for:?} (partitions {frozen_parts:?}), thawed at {thawed_at_ms}\n{report}",
        nodes.0[victim].id, nodes.0[frozen].id
    );
    assert!(verified.success(), "verify found violations:\n{report}");
    assert!(report.contains("violations: 0"), "{report}");
    let takeovers: usize = report
        .lines()
        .find_map(|l| l.strip_prefix("takeovers: "))
        .and_then(|n| n.trim().parse().ok())
        .expect("takeovers line");
    assert!(
        takeovers >= killed_parts.len() + frozen_parts.len(),
        "{takeovers} takeovers"
    );
    for node in survivors {
        nodes.0[node].terminate(Duration::from_secs(20)).await;
    }
    eprintln!("test took {:?}", started.elapsed());
}
