//! Node processes: the `ledger-node` binary as a child, with real faults (SIGKILL, SIGSTOP).

use std::process::Stdio;
use std::time::Duration;

use jetshard_testkit::ChildNode;
use tokio::process::Command;

/// One ownership line a node printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// `ACQUIRED`, `RELEASED`, `READY` or `STOPPED`.
    pub what: String,
    /// The partition (ownership lines).
    pub partition: u32,
    /// The generation (ownership lines).
    pub generation: u64,
    /// When, in unix milliseconds (ownership lines).
    pub at_ms: u128,
    /// The whole line, e.g. `SERVER s1`.
    pub text: String,
}

/// A running `ledger-node` child process; killed when dropped.
pub struct Node {
    /// Its node id.
    pub id: String,
    process: ChildNode,
}

/// More settings of a node, for [`Node::start_with`]; the defaults give what [`Node::start`]
/// starts.
#[derive(Clone, Debug, Default)]
pub struct NodeOptions {
    /// Options after the positional arguments of `ledger-node` (`--replicas 3`, `--creds f`...).
    pub args: Vec<String>,
    /// Where the node's stderr (its log) goes; inherited from the test when `None`.
    pub log_file: Option<std::path::PathBuf>,
}

/// Settings of a node.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// Partitions.
    pub partitions: u32,
    /// Pin TTL.
    pub pin_ttl: Duration,
    /// Ack wait.
    pub ack_wait: Duration,
    /// Extra environment (faults).
    pub env: Vec<(String, String)>,
}

impl Node {
    /// Starts a node and waits (bounded) until its shard system runs.
    pub async fn start(url: &str, id: &str, spec: &NodeSpec) -> Node {
        Node::start_with(url, id, spec, &NodeOptions::default()).await
    }

    /// Starts a node with more options and waits (bounded) until its shard system runs.
    /// `urls` may list several servers, comma-separated.
    pub async fn start_with(urls: &str, id: &str, spec: &NodeSpec, options: &NodeOptions) -> Node {
        let node = Node::spawn(urls, id, spec, options);
        jetshard_testkit::wait_until(Duration::from_secs(20), "node ready", || async {
            node.printed("READY")
        })
        .await
        .expect("node did not start");
        node
    }

    /// Starts a node without waiting for it to be ready.
    pub fn spawn(urls: &str, id: &str, spec: &NodeSpec, options: &NodeOptions) -> Node {
        let stderr = match &options.log_file {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .expect("open the node's log file"),
            ),
            None => Stdio::inherit(),
        };
        let mut command = Command::new(node_binary());
        command
            .args([urls, id, &spec.partitions.to_string()])
            .arg(spec.pin_ttl.as_millis().to_string())
            .arg(spec.ack_wait.as_millis().to_string())
            .args(&options.args)
            .envs(spec.env.iter().cloned())
            .stderr(stderr);
        Node {
            id: id.to_owned(),
            process: ChildNode::spawn(id, command).expect("spawn ledger-node"),
        }
    }

    /// Whether the node printed a line starting with `what` (`READY`, `STOPPED`...).
    pub fn printed(&self, what: &str) -> bool {
        self.process.printed(what)
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<Line> {
        self.process
            .lines()
            .into_iter()
            .map(|line| {
                let parts: Vec<&str> = line.split_whitespace().collect();
                Line {
                    what: parts.first().copied().unwrap_or_default().to_owned(),
                    partition: parts.get(1).and_then(|p| p.parse().ok()).unwrap_or(0),
                    generation: parts.get(2).and_then(|p| p.parse().ok()).unwrap_or(0),
                    at_ms: parts.get(3).and_then(|p| p.parse().ok()).unwrap_or(0),
                    text: line.clone(),
                }
            })
            .collect()
    }

    /// The partitions this node owns now, by its own account.
    pub fn owned(&self) -> Vec<u32> {
        self.process.owned().into_iter().collect()
    }

    /// The node's child process (its lines, signals).
    pub fn process(&self) -> &ChildNode {
        &self.process
    }

    /// The first acquisition of `partition` at or after `since_ms`.
    pub fn acquired_after(&self, partition: u32, since_ms: u128) -> Option<Line> {
        self.lines()
            .into_iter()
            .find(|l| l.what == "ACQUIRED" && l.partition == partition && l.at_ms >= since_ms)
    }

    /// The server the node is connected to, by its last `SERVER` line.
    pub fn server(&self) -> Option<String> {
        self.lines()
            .into_iter()
            .rev()
            .find(|l| l.what == "SERVER")
            .and_then(|l| l.text.split_whitespace().nth(1).map(str::to_owned))
    }

    /// Whether the process still runs (it is reaped if it has exited).
    pub fn is_running(&mut self) -> bool {
        self.process.exited().is_none()
    }

    /// Whether the node has acquired `partition` under `generation`.
    pub fn acquired(&self, partition: u32, generation: u64) -> bool {
        self.lines()
            .iter()
            .any(|l| l.what == "ACQUIRED" && l.partition == partition && l.generation == generation)
    }

    /// SIGKILL, and reap.
    pub async fn kill(&mut self) {
        self.process.kill().await.expect("SIGKILL a node");
    }

    /// SIGSTOP: the process freezes with whatever it had received.
    pub fn pause(&self) {
        self.process.freeze().expect("SIGSTOP a node");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.process.thaw().expect("SIGCONT a node");
    }

    /// SIGTERM, and wait (bounded) for a graceful exit; SIGKILL after 20 s.
    pub async fn terminate(&mut self) {
        self.process.terminate(Duration::from_secs(20)).await;
    }
}

/// Unix time in milliseconds.
pub fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// The `ledger-node` binary cargo built beside the running test (`target/<profile>/`).
fn node_binary() -> std::path::PathBuf {
    if let Ok(path) = std::env::var("CARGO_BIN_EXE_ledger-node") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    profile_dir.join("ledger-node")
}
