//! Node processes seen from outside: the lines a node prints, and `order-processor node`
//! children with real faults (SIGKILL, SIGSTOP / SIGCONT, SIGTERM). The demo and the
//! integration test drive nodes with this.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use jetshard_testkit::ChildNode;
use tokio::process::Command;

/// One line a node prints on stdout, for programs that watch it.
///
/// ```text
/// READY <node>
/// ACQUIRED <partition> <generation> <unix ms> <node>
/// RELEASED <partition> <generation> <unix ms> <node> <reason...>
/// STOPPED <node>
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeLine {
    /// The shard system runs.
    Ready {
        /// The node.
        node: String,
    },
    /// The node took a partition: its generation is claimed and its state rebuilt.
    Acquired {
        /// The partition.
        partition: u32,
        /// The generation claimed.
        generation: u64,
        /// When, in unix milliseconds.
        at_ms: u128,
        /// The node.
        node: String,
    },
    /// The node stopped owning a partition.
    Released {
        /// The partition.
        partition: u32,
        /// The generation left.
        generation: u64,
        /// When, in unix milliseconds.
        at_ms: u128,
        /// The node.
        node: String,
        /// Why.
        reason: String,
    },
    /// The node shut down gracefully.
    Stopped {
        /// The node.
        node: String,
    },
}

impl fmt::Display for NodeLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeLine::Ready { node } => write!(f, "READY {node}"),
            NodeLine::Acquired {
                partition,
                generation,
                at_ms,
                node,
            } => write!(f, "ACQUIRED {partition} {generation} {at_ms} {node}"),
            NodeLine::Released {
                partition,
                generation,
                at_ms,
                node,
                reason,
            } => write!(
                f,
                "RELEASED {partition} {generation} {at_ms} {node} {reason}"
            ),
            NodeLine::Stopped { node } => write!(f, "STOPPED {node}"),
        }
    }
}

impl NodeLine {
    /// Reads a line printed by a node; `None` for anything else.
    pub fn parse(line: &str) -> Option<NodeLine> {
        let mut words = line.trim().splitn(6, ' ');
        let what = words.next()?;
        if let "READY" | "STOPPED" = what {
            let node = words.next()?.to_owned();
            return Some(if what == "READY" {
                NodeLine::Ready { node }
            } else {
                NodeLine::Stopped { node }
            });
        }
        let partition = words.next()?.parse().ok()?;
        let generation = words.next()?.parse().ok()?;
        let at_ms = words.next()?.parse().ok()?;
        let node = words.next()?.to_owned();
        match what {
            "ACQUIRED" => Some(NodeLine::Acquired {
                partition,
                generation,
                at_ms,
                node,
            }),
            "RELEASED" => Some(NodeLine::Released {
                partition,
                generation,
                at_ms,
                node,
                reason: words.next().unwrap_or_default().to_owned(),
            }),
            _ => None,
        }
    }
}

/// Unix time in milliseconds.
pub fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Settings every node of a group shares.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// Partitions.
    pub partitions: u32,
    /// Pin TTL.
    pub pin_ttl: Duration,
    /// Ack wait.
    pub ack_wait: Duration,
}

/// A running `order-processor node` child process (a testkit [`ChildNode`]). Killed when
/// dropped, and when the process that started it dies.
pub struct NodeProcess {
    /// Its node id.
    pub id: String,
    process: ChildNode,
    log: PathBuf,
}

impl NodeProcess {
    /// Starts `exe node ...` with its log (stderr) going to `log`, and reads its stdout lines.
    /// Does not wait for it to be ready: see [`wait_ready`](Self::wait_ready). Start it from a
    /// thread that lives as long as the process (the main thread, or a test's thread): the
    /// kernel ties the kill at the parent's death to the thread that forked.
    ///
    /// # Errors
    /// If the process cannot be started or the log file created.
    pub fn spawn(
        exe: &Path,
        nats_url: &str,
        id: &str,
        settings: &NodeSettings,
        log: &Path,
    ) -> anyhow::Result<NodeProcess> {
        Self::spawn_with(exe, nats_url, id, settings, log, &[])
    }

    /// Like [`spawn`](Self::spawn), with more arguments for `node` (e.g. `--metrics-addr`).
    ///
    /// # Errors
    /// As [`spawn`](Self::spawn).
    pub fn spawn_with(
        exe: &Path,
        nats_url: &str,
        id: &str,
        settings: &NodeSettings,
        log: &Path,
        extra: &[String],
    ) -> anyhow::Result<NodeProcess> {
        let log_file = std::fs::File::create(log)
            .with_context(|| format!("create node log {}", log.display()))?;
        let mut command = Command::new(exe);
        command
            .arg("node")
            .args(["--nats-url", nats_url, "--node-id", id])
            .args(["--partitions", &settings.partitions.to_string()])
            .args(["--pin-ttl-ms", &settings.pin_ttl.as_millis().to_string()])
            .args(["--ack-wait-ms", &settings.ack_wait.as_millis().to_string()])
            .args(extra)
            .stderr(log_file);
        let process = ChildNode::spawn(id, command)
            .with_context(|| format!("start {} node", exe.display()))?;
        Ok(NodeProcess {
            id: id.to_owned(),
            process,
            log: log.to_owned(),
        })
    }

    /// Waits (bounded) until the node printed `READY`.
    ///
    /// # Errors
    /// If it did not within `within`, or exited; the error holds its log's tail.
    pub async fn wait_ready(&mut self, within: Duration) -> anyhow::Result<()> {
        if let Err(e) = self.process.wait_printed("READY", within).await {
            anyhow::bail!("{e}:\n{}", self.log_tail(20));
        }
        Ok(())
    }

    /// The child process (its raw lines, signals; [`jetshard_testkit::owned_by`]).
    pub fn process(&self) -> &ChildNode {
        &self.process
    }

    /// Every line it printed so far.
    pub fn lines(&self) -> Vec<NodeLine> {
        self.process
            .lines()
            .iter()
            .filter_map(|line| NodeLine::parse(line))
            .collect()
    }

    /// The partitions it owns now, by its own account.
    pub fn owned(&self) -> Vec<u32> {
        self.process.owned().into_iter().collect()
    }

    /// Its acquisitions at or after `since_ms`: (partition, generation, at_ms).
    pub fn acquired_since(&self, since_ms: u128) -> Vec<(u32, u64, u128)> {
        self.lines()
            .into_iter()
            .filter_map(|l| match l {
                NodeLine::Acquired {
                    partition,
                    generation,
                    at_ms,
                    ..
                } if at_ms >= since_ms => Some((partition, generation, at_ms)),
                _ => None,
            })
            .collect()
    }

    /// Its releases so far: (partition, generation, reason).
    pub fn released(&self) -> Vec<(u32, u64, String)> {
        self.lines()
            .into_iter()
            .filter_map(|l| match l {
                NodeLine::Released {
                    partition,
                    generation,
                    reason,
                    ..
                } => Some((partition, generation, reason)),
                _ => None,
            })
            .collect()
    }

    /// The path of its log.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn signal(&self, signal: i32, name: &str) -> anyhow::Result<()> {
        self.process
            .signal(signal)
            .with_context(|| format!("{name} to node {}", self.id))
    }

    /// SIGKILL: a crash. Waits until the process is reaped.
    ///
    /// # Errors
    /// If the signal cannot be sent.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.process
            .kill()
            .await
            .with_context(|| format!("SIGKILL to node {}", self.id))
    }

    /// SIGSTOP: the process freezes with whatever it holds; its connection stays open.
    ///
    /// # Errors
    /// If the signal cannot be sent.
    pub fn freeze(&self) -> anyhow::Result<()> {
        self.signal(libc::SIGSTOP, "SIGSTOP")
    }

    /// SIGCONT: a frozen process runs again.
    ///
    /// # Errors
    /// If the signal cannot be sent.
    pub fn thaw(&self) -> anyhow::Result<()> {
        self.signal(libc::SIGCONT, "SIGCONT")
    }

    /// SIGTERM (graceful shutdown), without waiting for the exit.
    ///
    /// # Errors
    /// If the signal cannot be sent.
    pub fn request_stop(&self) -> anyhow::Result<()> {
        self.signal(libc::SIGTERM, "SIGTERM")
    }

    /// SIGTERM (graceful shutdown), waiting at most `within` for the exit, then SIGKILL.
    /// Returns whether it exited by itself with success.
    pub async fn terminate(&mut self, within: Duration) -> bool {
        self.process
            .terminate(within)
            .await
            .is_some_and(|status| status.success())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_back_what_was_printed() {
        let lines = [
            NodeLine::Ready { node: "a".into() },
            NodeLine::Acquired {
                partition: 3,
                generation: 2,
                at_ms: 1_700_000_000_123,
                node: "a".into(),
            },
            NodeLine::Released {
                partition: 3,
                generation: 2,
                at_ms: 1_700_000_000_456,
                node: "a".into(),
                reason: "fenced: a newer generation owns the partition".into(),
            },
            NodeLine::Stopped { node: "a".into() },
        ];
        for line in lines {
            assert_eq!(NodeLine::parse(&line.to_string()), Some(line));
        }
        assert_eq!(NodeLine::parse("2026-01-01 INFO something"), None);
        assert_eq!(NodeLine::parse("ACQUIRED x 1 2 a"), None);
    }
}
