//! Node processes seen from outside: the lines a node prints, and `order-processor node`
//! children with real faults (SIGKILL, SIGSTOP / SIGCONT, SIGTERM). The demo and the
//! integration test drive nodes with this.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

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

/// Makes the kernel SIGKILL the child when its parent dies, so that a demo or test killed
/// itself (Ctrl-C twice, `kill -9`, a CI timeout) leaves no node behind. `kill_on_drop` covers
/// every other ending. The kernel ties this to the forking *thread*: spawn from a thread that
/// lives as long as the process (the main thread, or a test's thread).
fn die_with_parent(command: &mut Command) {
    // SAFETY: `getpid` is async-signal-safe.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs between fork and exec and makes only async-signal-safe system
    // calls (prctl, getppid); it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect: nobody would kill us then.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
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

/// A running `order-processor node` child process. Killed when dropped.
pub struct NodeProcess {
    /// Its node id.
    pub id: String,
    child: Child,
    pid: i32,
    /// Set once the process has been reaped: its pid may then belong to another process.
    reaped: bool,
    lines: Arc<Mutex<Vec<NodeLine>>>,
    log: PathBuf,
}

impl NodeProcess {
    /// Starts `exe node ...` with its log (stderr) going to `log`, and reads its stdout lines.
    /// Does not wait for it to be ready: see [`wait_ready`](Self::wait_ready).
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
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .kill_on_drop(true);
        die_with_parent(&mut command);
        let mut child = command
            .spawn()
            .with_context(|| format!("start {} node", exe.display()))?;
        let pid = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .context("node process id")?;
        let stdout = child.stdout.take().context("node stdout")?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        // Ends when the child's stdout closes, i.e. when it exits.
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if let Some(parsed) = NodeLine::parse(&line) {
                    sink.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(parsed);
                }
            }
        });
        Ok(NodeProcess {
            id: id.to_owned(),
            child,
            pid,
            reaped: false,
            lines,
            log: log.to_owned(),
        })
    }

    /// Waits (bounded) until the node printed `READY`.
    ///
    /// # Errors
    /// If it did not within `within`, or exited; the error holds its log's tail.
    pub async fn wait_ready(&mut self, within: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self
                .lines()
                .iter()
                .any(|l| matches!(l, NodeLine::Ready { .. }))
            {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                self.reaped = true;
                anyhow::bail!(
                    "node {} exited ({status}) before it was ready:\n{}",
                    self.id,
                    self.log_tail(20)
                );
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!(
                    "node {} not ready after {within:?}:\n{}",
                    self.id,
                    self.log_tail(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every line it printed so far.
    pub fn lines(&self) -> Vec<NodeLine> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The partitions it owns now, by its own account.
    pub fn owned(&self) -> Vec<u32> {
        let mut owned = std::collections::BTreeSet::new();
        for line in self.lines() {
            match line {
                NodeLine::Acquired { partition, .. } => {
                    owned.insert(partition);
                }
                NodeLine::Released { partition, .. } => {
                    owned.remove(&partition);
                }
                _ => {}
            }
        }
        owned.into_iter().collect()
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
        if self.reaped {
            anyhow::bail!("{name} to node {}: it has exited", self.id);
        }
        // SAFETY: kill(2) on the pid of our own child, which is not reaped yet (checked
        // above), so the pid cannot have been reused.
        let rc = unsafe { libc::kill(self.pid, signal) };
        if rc != 0 {
            anyhow::bail!(
                "{name} to node {} (pid {}): {}",
                self.id,
                self.pid,
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// SIGKILL: a crash. Waits until the process is reaped.
    ///
    /// # Errors
    /// If the signal cannot be sent.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.signal(libc::SIGKILL, "SIGKILL")?;
        let _ = self.child.wait().await;
        self.reaped = true;
        Ok(())
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
        if self.signal(libc::SIGTERM, "SIGTERM").is_err() {
            return false;
        }
        let _ = self.signal(libc::SIGCONT, "SIGCONT");
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(Ok(status)) => {
                self.reaped = true;
                status.success()
            }
            _ => {
                let _ = self.kill().await;
                false
            }
        }
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
