//! What the example's multi-node tests share: three `order-processor node` processes started
//! and ready, every partition owned, and the busiest one SIGKILLed and taken over; the load
//! beside them, and the example's other commands (`verify`, `get`) run to their end.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::process::{Child, Command};

use jetshard_testkit::{owned_by, wait_until};
use order_processor::nodes::{NodeProcess, NodeSettings};

/// The example's binary, as cargo built it for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_order-processor");

/// The nodes of a test; prints their log tails if the test fails, so a failure explains itself.
pub struct Nodes(pub Vec<NodeProcess>);

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

/// The settings of every node of these tests: 8 partitions, pin TTL 1 s, ack wait 3 s.
pub fn settings() -> NodeSettings {
    NodeSettings {
        partitions: 8,
        pin_ttl: Duration::from_millis(1000),
        ack_wait: Duration::from_millis(3000),
    }
}

/// Starts nodes `a`, `b` and `c` on `url` with `flags` (their logs in `logs`), and waits until
/// each is ready.
pub async fn start_three(url: &str, logs: &Path, flags: &[String]) -> Nodes {
    let mut nodes = Nodes(Vec::new());
    for id in ["a", "b", "c"] {
        let log = logs.join(format!("{id}.log"));
        let node = NodeProcess::spawn_with(BIN.as_ref(), url, id, &settings(), &log, flags)
            .expect("spawn node");
        nodes.0.push(node);
    }
    for node in &mut nodes.0 {
        node.wait_ready(Duration::from_secs(30))
            .await
            .expect("node ready");
    }
    nodes
}

/// Waits until the nodes own every partition, SIGKILLs the one owning the most, and waits until
/// the survivors own every partition. Returns the victim's index, the partitions it owned and
/// the survivors' indexes.
pub async fn kill_the_busiest(nodes: &mut Nodes) -> (usize, Vec<u32>, Vec<usize>) {
    let all: BTreeSet<u32> = (0..settings().partitions).collect();
    wait_until(Duration::from_secs(20), "every partition owned", || async {
        owned_by(nodes.0.iter().map(NodeProcess::process)) == all
    })
    .await
    .expect("ownership");
    let victim = (0..nodes.0.len())
        .max_by_key(|i| nodes.0[*i].owned().len())
        .unwrap_or(0);
    let killed_parts = nodes.0[victim].owned();
    nodes.0[victim].kill().await.expect("SIGKILL");
    let survivors: Vec<usize> = (0..nodes.0.len()).filter(|i| *i != victim).collect();
    wait_until(
        Duration::from_secs(20),
        "the survivors own every partition",
        || async { owned_by(survivors.iter().map(|i| nodes.0[*i].process())) == all },
    )
    .await
    .expect("takeover after the kill");
    (victim, killed_parts, survivors)
}

/// Starts `order-processor load --nats-url <url> <args>` beside the test (its output piped,
/// killed if the test ends first).
pub fn start_load(url: &str, args: &[&str]) -> Child {
    Command::new(BIN)
        .args(["load", "--nats-url", url])
        .args(args)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn load")
}

/// Waits at most 60 s for the load to end, and asserts that it succeeded.
pub async fn finish_load(mut load: Child) {
    let loaded = tokio::time::timeout(Duration::from_secs(60), load.wait())
        .await
        .expect("load finished in time")
        .expect("load exit status");
    assert!(loaded.success(), "load failed");
}

/// Runs `order-processor <args>` to its end, at most `within`: how it exited, and its stdout.
pub async fn output(args: &[&str], within: Duration) -> (ExitStatus, String) {
    let output = tokio::time::timeout(
        within,
        Command::new(BIN).args(args).kill_on_drop(true).output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{} finished in time", args[0]))
    .unwrap_or_else(|e| panic!("{} ran: {e}", args[0]));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    (output.status, stdout)
}
