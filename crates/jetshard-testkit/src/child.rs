//! Node processes as children: a program that runs a shard system and prints what it owns, one
//! line per change (`ACQUIRED <partition> ...`, `RELEASED <partition> ...`, `READY ...`), started
//! as a child with its stdout read line by line, and given real faults (SIGKILL, SIGSTOP /
//! SIGCONT, SIGTERM). jetshard's integration tests, its benchmarks and the example's demo drive
//! their node processes with this; each reads the rest of its own lines' format.

use std::collections::BTreeSet;
use std::io;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A running child process whose stdout lines are kept; SIGKILLed when dropped, and (on Linux)
/// when the process that started it dies.
#[derive(Debug)]
pub struct ChildNode {
    id: String,
    child: Child,
    pid: libc::pid_t,
    /// Set once the process has been reaped: its pid may then belong to another process.
    reaped: bool,
    lines: Arc<Mutex<Vec<String>>>,
}

impl ChildNode {
    /// Starts `command` as node `id`, its stdout piped and read line by line (stdin closed;
    /// stderr as `command` says). Does not wait for it to be ready: see
    /// [`wait_printed`](Self::wait_printed). On Linux the kernel kills it when the thread that
    /// started it ends (`PR_SET_PDEATHSIG`): start it from one that lives as long as the process
    /// or the test (the main thread, a test's thread, a runtime's worker).
    ///
    /// # Errors
    /// If the process cannot be started.
    pub fn spawn(id: &str, mut command: Command) -> io::Result<ChildNode> {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        crate::process::die_with_parent(command.as_std_mut());
        let mut child = command.spawn()?;
        let pid = child
            .id()
            .and_then(|pid| libc::pid_t::try_from(pid).ok())
            .ok_or_else(|| io::Error::other("the child has no process id"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| io::Error::other("the child's stdout is not piped"))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        // Ends when the child's stdout closes, i.e. when it exits.
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                sink.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(line);
            }
        });
        Ok(ChildNode {
            id: id.to_owned(),
            child,
            pid,
            reaped: false,
            lines,
        })
    }

    /// Its node id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Every line it printed so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether it printed a line whose first word is `word` (`READY`, `STOPPED`...).
    pub fn printed(&self, word: &str) -> bool {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|line| line.split_whitespace().next() == Some(word))
    }

    /// Waits (bounded) until it printed a line whose first word is `word`.
    ///
    /// # Errors
    /// If it did not within `within`, or exited before.
    pub async fn wait_printed(&mut self, word: &str, within: Duration) -> io::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.printed(word) {
                return Ok(());
            }
            if let Some(status) = self.exited() {
                return Err(io::Error::other(format!(
                    "node {} exited ({status}) before it printed {word}",
                    self.id
                )));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("node {} did not print {word} within {within:?}", self.id),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The partitions it owns now, by its own account: its `ACQUIRED <partition> ...` lines
    /// less its `RELEASED <partition> ...` lines.
    pub fn owned(&self) -> BTreeSet<u32> {
        let mut owned = BTreeSet::new();
        for line in self.lines() {
            let mut words = line.split_whitespace();
            let (Some(what), Some(Ok(partition))) =
                (words.next(), words.next().map(str::parse::<u32>))
            else {
                continue;
            };
            match what {
                "ACQUIRED" => {
                    owned.insert(partition);
                }
                "RELEASED" => {
                    owned.remove(&partition);
                }
                _ => {}
            }
        }
        owned
    }

    /// Its exit status, if it has exited (then it is reaped).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.try_wait().ok().flatten();
        self.reaped |= status.is_some();
        status
    }

    /// Sends `signal` (a `libc::SIG*`) to the process.
    ///
    /// # Errors
    /// If it has exited, or kill(2) fails.
    pub fn signal(&self, signal: libc::c_int) -> io::Result<()> {
        if self.reaped {
            return Err(io::Error::other(format!(
                "signal {signal} to node {}: it has exited",
                self.id
            )));
        }
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own child's, not
        // reaped yet (checked above), so it cannot have been reused.
        if unsafe { libc::kill(self.pid, signal) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// SIGKILL (a crash), and reap.
    ///
    /// # Errors
    /// If the signal cannot be sent.
    pub async fn kill(&mut self) -> io::Result<()> {
        self.signal(libc::SIGKILL)?;
        let _ = self.child.wait().await;
        self.reaped = true;
        Ok(())
    }

    /// SIGSTOP: the process freezes with whatever it holds; its connections stay open.
    ///
    /// # Errors
    /// If the signal cannot be sent.
    pub fn freeze(&self) -> io::Result<()> {
        self.signal(libc::SIGSTOP)
    }

    /// SIGCONT: a frozen process runs again.
    ///
    /// # Errors
    /// If the signal cannot be sent.
    pub fn thaw(&self) -> io::Result<()> {
        self.signal(libc::SIGCONT)
    }

    /// SIGTERM (a graceful stop, also of a frozen process: SIGCONT follows), waiting at most
    /// `within` for the exit, then SIGKILL. Its exit status if it exited by itself in time.
    pub async fn terminate(&mut self, within: Duration) -> Option<ExitStatus> {
        self.signal(libc::SIGTERM).ok()?;
        let _ = self.signal(libc::SIGCONT);
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(Ok(status)) => {
                self.reaped = true;
                Some(status)
            }
            _ => {
                let _ = self.kill().await;
                None
            }
        }
    }
}

/// The partitions `nodes` own between them, by their own accounts ([`ChildNode::owned`]).
pub fn owned_by<'a>(nodes: impl IntoIterator<Item = &'a ChildNode>) -> BTreeSet<u32> {
    nodes.into_iter().flat_map(ChildNode::owned).collect()
}
