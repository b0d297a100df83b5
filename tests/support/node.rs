//! Node processes: the `ledger-node` binary as a child, with real faults (SIGKILL, SIGSTOP).

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

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
    child: Child,
    lines: Arc<Mutex<Vec<Line>>>,
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
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true);
        let mut child = command.spawn().expect("spawn ledger-node");
        let stdout = child.stdout.take().expect("stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let parts: Vec<&str> = line.split_whitespace().collect();
                let parsed = Line {
                    what: parts.first().copied().unwrap_or_default().to_owned(),
                    partition: parts.get(1).and_then(|p| p.parse().ok()).unwrap_or(0),
                    generation: parts.get(2).and_then(|p| p.parse().ok()).unwrap_or(0),
                    at_ms: parts.get(3).and_then(|p| p.parse().ok()).unwrap_or(0),
                    text: line.clone(),
                };
                sink.lock().unwrap().push(parsed);
            }
        });
        Node {
            id: id.to_owned(),
            child,
            lines,
        }
    }

    /// Whether the node printed a line starting with `what` (`READY`, `STOPPED`...).
    pub fn printed(&self, what: &str) -> bool {
        self.lines.lock().unwrap().iter().any(|l| l.what == what)
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<Line> {
        self.lines.lock().unwrap().clone()
    }

    /// The partitions this node owns now, by its own account.
    pub fn owned(&self) -> Vec<u32> {
        let mut owned = std::collections::BTreeSet::new();
        for line in self.lines() {
            match line.what.as_str() {
                "ACQUIRED" => {
                    owned.insert(line.partition);
                }
                "RELEASED" => {
                    owned.remove(&line.partition);
                }
                _ => {}
            }
        }
        owned.into_iter().collect()
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
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Whether the node has acquired `partition` under `generation`.
    pub fn acquired(&self, partition: u32, generation: u64) -> bool {
        self.lines()
            .iter()
            .any(|l| l.what == "ACQUIRED" && l.partition == partition && l.generation == generation)
    }

    fn signal(&self, signal: i32) {
        let pid = self.child.id().expect("node running") as i32;
        // SAFETY: sending a signal to our own child process.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal})");
    }

    /// SIGKILL, and reap.
    pub async fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait().await;
    }

    /// SIGSTOP: the process freezes with whatever it had received.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// SIGTERM, and wait (bounded) for a graceful exit.
    pub async fn terminate(&mut self) {
        self.signal(libc::SIGTERM);
        let _ = tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await;
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
