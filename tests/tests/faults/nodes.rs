//! Node processes by slot: started, killed, frozen, stopped, started again; who owns what;
//! their logs for a failure message.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use jetshard_testkit::wait_until;
use jetshard_tests::node::{Node, NodeOptions, NodeSpec};

/// One place for a node process; a node killed or stopped there can be started again under a
/// new id (`a1`, `a2`, ...).
pub struct Slot {
    /// `a`, `b`, `c`...
    pub name: String,
    /// How often a node was started here.
    pub incarnation: u32,
    /// The node, if one was started and not yet removed.
    pub node: Option<Node>,
    /// Whether it is frozen (SIGSTOP).
    pub paused: bool,
    /// The servers it connects to.
    pub urls: String,
}

/// The node processes of one schedule.
pub struct Nodes {
    /// The slots.
    pub slots: Vec<Slot>,
    spec: NodeSpec,
    args: Vec<String>,
    logs: tempfile::TempDir,
}

impl Nodes {
    /// The settings every node runs with.
    pub fn spec(&self) -> &NodeSpec {
        &self.spec
    }

    /// Starts one node per entry of `urls` (its server list).
    pub async fn start(urls: Vec<String>, spec: NodeSpec, args: Vec<String>) -> Nodes {
        let mut logs = tempfile::Builder::new()
            .prefix("jetshard-nodes-")
            .tempdir()
            .expect("log dir");
        if std::env::var_os("JETSHARD_KEEP_LOGS").is_some() {
            // For a replay: the nodes' whole logs, kept after the test.
            logs.disable_cleanup(true);
            eprintln!("node logs kept in {}", logs.path().display());
        }
        let mut nodes = Nodes {
            slots: urls
                .into_iter()
                .enumerate()
                .map(|(i, urls)| Slot {
                    name: ((b'a' + i as u8) as char).to_string(),
                    incarnation: 0,
                    node: None,
                    paused: false,
                    urls,
                })
                .collect(),
            spec,
            args,
            logs,
        };
        // The first node provisions the streams alone; the others then start side by side.
        nodes.spawn(0);
        nodes.wait_ready(0).await;
        for slot in 1..nodes.slots.len() {
            nodes.spawn(slot);
        }
        for slot in 1..nodes.slots.len() {
            nodes.wait_ready(slot).await;
        }
        nodes
    }

    fn log_path(&self, id: &str) -> PathBuf {
        self.logs.path().join(format!("{id}.log"))
    }

    fn spawn(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        s.incarnation += 1;
        let id = format!("{}{}", s.name, s.incarnation);
        let options = NodeOptions {
            args: self.args.clone(),
            log_file: Some(self.logs.path().join(format!("{id}.log"))),
        };
        s.node = Some(Node::spawn(&s.urls, &id, &self.spec, &options));
        s.paused = false;
    }

    async fn wait_ready(&self, slot: usize) {
        let node = self.slots[slot].node.as_ref().expect("node");
        if let Err(e) = wait_until(Duration::from_secs(30), "node ready", || async {
            node.printed("READY")
        })
        .await
        {
            panic!("{e}: {}", self.log_tail(&node.id, 40));
        }
    }

    /// Starts a new node in `slot` (whose node is gone) and waits until it runs.
    pub async fn restart(&mut self, slot: usize) {
        self.spawn(slot);
        self.wait_ready(slot).await;
    }

    /// The node in `slot`, if it runs and is not frozen.
    pub fn live(&mut self, slot: usize) -> Option<&Node> {
        let s = &mut self.slots[slot];
        if s.paused {
            return None;
        }
        let node = s.node.as_mut()?;
        node.is_running().then_some(&*node)
    }

    /// The slot of the live node that owns `partition` by its own account.
    pub fn owner_of(&mut self, partition: u32) -> Option<usize> {
        (0..self.slots.len()).find(|&slot| {
            self.live(slot)
                .is_some_and(|n| n.owned().contains(&partition))
        })
    }

    /// The slots of live nodes.
    pub fn live_slots(&mut self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&slot| self.live(slot).is_some())
            .collect()
    }

    /// SIGKILL.
    pub async fn kill(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        if let Some(node) = s.node.as_mut() {
            if s.paused {
                node.resume();
            }
            node.kill().await;
        }
        s.paused = false;
    }

    /// SIGTERM and wait (bounded) for the graceful exit.
    pub async fn terminate(&mut self, slot: usize) {
        if let Some(node) = self.slots[slot].node.as_mut() {
            node.terminate().await;
        }
    }

    /// SIGSTOP.
    pub fn pause(&mut self, slot: usize) {
        if let Some(node) = &self.slots[slot].node {
            node.pause();
            self.slots[slot].paused = true;
        }
    }

    /// SIGCONT.
    pub fn resume(&mut self, slot: usize) {
        if let Some(node) = &self.slots[slot].node
            && self.slots[slot].paused
        {
            node.resume();
            self.slots[slot].paused = false;
        }
    }

    /// Thaws frozen nodes and starts a node in every slot whose node is gone.
    pub async fn recover(&mut self) {
        for slot in 0..self.slots.len() {
            self.resume(slot);
            let running = self.slots[slot].node.as_mut().is_some_and(Node::is_running);
            if !running {
                self.restart(slot).await;
            }
        }
    }

    /// Waits (bounded) until every partition is owned by some live node.
    pub async fn wait_all_owned(
        &mut self,
        partitions: u32,
        within: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            if (0..partitions).all(|p| self.owner_of(p).is_some()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("not every partition owned after {within:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last `lines` lines of a node's log.
    pub fn log_tail(&self, id: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path(id)).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Every log line of every node that contains `needle`, prefixed with the node's id.
    pub fn grep_logs(&self, needle: &str, limit: usize) -> String {
        let mut found = Vec::new();
        for slot in &self.slots {
            for incarnation in 1..=slot.incarnation {
                let id = format!("{}{incarnation}", slot.name);
                let text = std::fs::read_to_string(self.log_path(&id)).unwrap_or_default();
                found.extend(
                    text.lines()
                        .filter(|l| l.contains(needle))
                        .map(|l| format!("{id}: {l}")),
                );
            }
        }
        found.sort_by(|a, b| {
            a.split_once(": ")
                .map(|x| x.1)
                .cmp(&b.split_once(": ").map(|x| x.1))
        });
        found.truncate(limit);
        found.join("\n")
    }

    /// Copies every node's whole log to a directory that outlives the test (for a failed
    /// schedule) and returns its path.
    pub fn keep_logs(&self, seed: u64) -> String {
        let dir = std::env::temp_dir().join(format!(
            "jetshard-failed-seed-{seed}-{}",
            std::process::id()
        ));
        let copied = std::fs::create_dir_all(&dir).and_then(|()| {
            for entry in std::fs::read_dir(self.logs.path())? {
                let entry = entry?;
                std::fs::copy(entry.path(), dir.join(entry.file_name()))?;
            }
            Ok(())
        });
        match copied {
            Ok(()) => dir.display().to_string(),
            Err(e) => format!("(not kept: {e})"),
        }
    }

    /// Every node's ownership lines and the tail of its log, for a failure message.
    pub fn describe(&self) -> String {
        let mut text = String::new();
        for slot in &self.slots {
            for incarnation in 1..=slot.incarnation {
                let id = format!("{}{incarnation}", slot.name);
                let _ = writeln!(text, "---- node {id} log tail:\n{}", self.log_tail(&id, 25));
            }
            if let Some(node) = &slot.node {
                let lines: Vec<String> = node.lines().into_iter().map(|l| l.text).collect();
                let _ = writeln!(text, "---- node {} stdout: {}", node.id, lines.join(" | "));
            }
        }
        text
    }
}
