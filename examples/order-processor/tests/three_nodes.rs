//! Three `order-processor node` processes against a real server: while orders load, one node
//! is SIGKILLed and another frozen (SIGSTOP) past its pin TTL and thawed; `verify` then finds
//! every command answered exactly once, as the rules say, and no write from a stale owner.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

use jetshard_testkit::{NatsServer, owned_by, wait_until};
use order_processor::nodes::{NodeProcess, NodeSettings, unix_ms};

const BIN: &str = env!("CARGO_BIN_EXE_order-processor");

/// Prints the nodes' log tails if the test fails, so a failure explains itself.
struct Nodes(Vec<NodeProcess>);

impl Drop for Nodes {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for node in &self.0 {
                eprintln!(
                    "---- {} ({})\n{}",
                    node.id,
                    node.log().display(),
                    node.log_tail(40)
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_finds_no_violation_after_one_node_is_killed_and_another_frozen_past_its_pin_ttl() {
    let started = Instant::now();
    let server = NatsServer::start().await.expect("nats-server");
    let url = server.url();
    let logs = tempfile::tempdir().expect("temp dir");
    let settings = NodeSettings {
        partitions: 8,
        pin_ttl: Duration::from_millis(1000),
        ack_wait: Duration::from_millis(3000),
    };
    let mut nodes = Nodes(Vec::new());
    for id in ["a", "b", "c"] {
        let log = logs.path().join(format!("{id}.log"));
        let node = NodeProcess::spawn(BIN.as_ref(), &url, id, &settings, &log).expect("spawn node");
        nodes.0.push(node);
    }
    for node in &mut nodes.0 {
        node.wait_ready(Duration::from_secs(30))
            .await
            .expect("node ready");
    }

    // About 2,500 commands over 10 s: the load outlasts both faults.
    let mut load = tokio::process::Command::new(BIN)
        .args([
            "load",
            "--nats-url",
            &url,
            "--orders",
            "500",
            "--rate",
            "250",
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn load");

    let all: BTreeSet<u32> = (0..settings.partitions).collect();
    wait_until(Duration::from_secs(20), "every partition owned", || async {
        owned_by(nodes.0.iter().map(NodeProcess::process)) == all
    })
    .await
    .expect("ownership");

    // Crash: the node owning the most partitions.
    let victim = (0..3)
        .max_by_key(|i| nodes.0[*i].owned().len())
        .unwrap_or(0);
    let killed_parts = nodes.0[victim].owned();
    nodes.0[victim].kill().await.expect("SIGKILL");
    let survivors: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    wait_until(
        Duration::from_secs(20),
        "the survivors own every partition",
        || async { owned_by(survivors.iter().map(|i| nodes.0[*i].process())) == all },
    )
    .await
    .expect("takeover after the kill");

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
        stalled_for >= settings.pin_ttl / 2,
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

    let loaded = tokio::time::timeout(Duration::from_secs(60), load.wait())
        .await
        .expect("load finished in time")
        .expect("load exit status");
    assert!(loaded.success(), "load failed");

    let verify = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(BIN)
            .args(["verify", "--nats-url", &url, "--settle-secs", "30"])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("verify finished in time")
    .expect("verify ran");
    let report = String::from_utf8_lossy(&verify.stdout);
    eprintln!(
        "killed {} (partitions {killed_parts:?}), froze {} for {stalled_for:?} (partitions {frozen_parts:?}), thawed at {thawed_at_ms}\n{report}",
        nodes.0[victim].id, nodes.0[frozen].id
    );
    assert!(
        verify.status.success(),
        "verify found violations:\n{report}"
    );
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
