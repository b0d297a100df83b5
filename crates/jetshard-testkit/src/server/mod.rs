//! One `nats-server` process with JetStream, owned by the test that started it; its builder
//! (configuration, arguments, client options) in `builder.rs`, the wait until it answers in
//! `ready.rs`.

mod builder;
mod ready;

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use async_nats::ConnectOptions;

pub use self::builder::NatsServerBuilder;
use crate::Error;
use crate::process::{self, Signal};

/// How long [`NatsServer::start`] and [`NatsServer::restart`] wait for a server by default.
pub(crate) const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`NatsServer::stop`] waits after SIGTERM before it sends SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The pause between two readiness probes and between two looks at an exiting process.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// How many lines of the server's log go into errors and panic output.
const LOG_TAIL_LINES: usize = 40;

/// How often a server start is retried when its freshly picked port was taken meanwhile.
pub(crate) const START_ATTEMPTS: usize = 3;

/// A `nats-server` with JetStream on a loopback port, its file store in a temporary
/// directory that lives as long as this value.
///
/// Dropping it SIGKILLs and reaps the process (a paused one too), so no test leaks a server;
/// when the drop happens during a panic, the tail of the server's log is printed to stderr,
/// where the test harness shows it with the failure. On Linux the process is also killed when
/// the test process dies.
///
/// Methods take `&self`: the handle can be shared (e.g. in an `Arc`) between the code under
/// test and a task that injects faults. They are not meant to race each other.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use jetshard_testkit::NatsServer;
///
/// let server = NatsServer::start().await?;
/// let client = server.connect().await?;
/// server.kill()?;
/// server.restart().await?; // same port, same store
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct NatsServer {
    binary: PathBuf,
    args: Vec<OsString>,
    name: Option<String>,
    port: u16,
    store_dir: PathBuf,
    log_path: PathBuf,
    ready_timeout: Duration,
    connect_options: ConnectOptions,
    /// `None` once the process has been reaped (stopped, killed, or found exited).
    child: Mutex<Option<Child>>,
    /// Holds the store, the log and the config. Removed after `Drop::drop` has reaped the
    /// process, as fields drop after it.
    _dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts a server with the defaults and waits until JetStream answers.
    ///
    /// # Errors
    ///
    /// As [`NatsServerBuilder::start`].
    pub async fn start() -> Result<NatsServer, Error> {
        NatsServer::builder().start().await
    }

    /// A builder for a server with a name, a configuration file, extra arguments, other
    /// client options or another readiness timeout.
    pub fn builder() -> NatsServerBuilder {
        NatsServerBuilder::default()
    }

    /// The client URL, `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr())
    }

    /// The client port; it stays the same across [`restart`](Self::restart).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The client address, e.g. for a [`TcpProxy`](crate::TcpProxy) in front of the server.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The server name given with [`NatsServerBuilder::name`] (cluster nodes are `s0`, `s1`...).
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The JetStream store directory (`-sd`); it survives [`restart`](Self::restart).
    pub fn store_dir(&self) -> &Path {
        &self.store_dir
    }

    /// The file that receives the server's stdout and stderr, across restarts.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last lines of the server's log, for a failing test to print.
    pub fn log_tail(&self) -> String {
        match std::fs::read(&self.log_path) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let lines: Vec<&str> = text.lines().collect();
                lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
            }
            Err(error) => format!("(could not read {}: {error})", self.log_path.display()),
        }
    }

    /// The process id, or `None` when the process is not running (stopped, killed, crashed).
    pub fn pid(&self) -> Option<u32> {
        // A process that exited by itself is reaped here, so its pid is never reused under us.
        match self.reap_if_exited() {
            Ok(Some(_)) => None,
            _ => self.lock_child().as_ref().map(Child::id),
        }
    }

    /// Connects a client with the server's [`connect_options`](NatsServerBuilder::connect_options).
    ///
    /// # Errors
    ///
    /// [`Error::Connect`] when the server does not accept the connection.
    pub async fn connect(&self) -> Result<async_nats::Client, Error> {
        let url = self.url();
        self.connect_options
            .clone()
            .connect(&url)
            .await
            .map_err(|source| Error::Connect { url, source })
    }

    /// Shuts the server down gracefully: SIGTERM, then SIGKILL if it has not exited within
    /// 10 s. A paused server is resumed so that it can act on the SIGTERM. Stopping a server
    /// that is not running does nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Signal`] or [`Error::Io`] when the process cannot be signalled or reaped.
    pub async fn stop(&self) -> Result<(), Error> {
        {
            let child = self.lock_child();
            let Some(child) = child.as_ref() else {
                return Ok(());
            };
            self.signal(child, Signal::Term)?;
            self.signal(child, Signal::Cont)?;
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if self.reap_if_exited()?.is_some() || self.lock_child().is_none() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                tracing::warn!(server = %self.describe(), "no exit within {STOP_TIMEOUT:?} of SIGTERM; sending SIGKILL");
                return self.kill();
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Kills the server with SIGKILL and reaps it: a crash, as far as the store and the
    /// clients can tell. Killing a server that is not running does nothing.
    ///
    /// Blocks until the process is reaped, which takes a moment after SIGKILL.
    ///
    /// # Errors
    ///
    /// [`Error::Signal`] or [`Error::Io`] when the process cannot be killed or reaped.
    pub fn kill(&self) -> Result<(), Error> {
        let mut slot = self.lock_child();
        let Some(child) = slot.as_mut() else {
            return Ok(());
        };
        child.kill().map_err(|source| Error::Signal {
            signal: "SIGKILL",
            server: self.describe(),
            source,
        })?;
        child
            .wait()
            .map_err(|source| Error::io(format!("reap {}", self.describe()), source))?;
        *slot = None;
        Ok(())
    }

    /// Freezes the process with SIGSTOP: connections stay open, nothing is answered, as with a
    /// stalled machine. Undo with [`resume`](Self::resume).
    ///
    /// # Errors
    ///
    /// [`Error::NotRunning`] or [`Error::Signal`].
    pub fn pause(&self) -> Result<(), Error> {
        self.signal_running(Signal::Stop)?;
        // SIGSTOP takes effect asynchronously, thread by thread: wait (bounded) until every
        // thread of the server shows as stopped, so that nothing answers once this returns.
        if let Some(pid) = self.pid() {
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline && !all_threads_stopped(pid) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(())
    }

    /// Lets a [`pause`](Self::pause)d process run again (SIGCONT).
    ///
    /// # Errors
    ///
    /// [`Error::NotRunning`] or [`Error::Signal`].
    pub fn resume(&self) -> Result<(), Error> {
        self.signal_running(Signal::Cont)
    }

    /// Stops the server if it still runs (as [`stop`](Self::stop)), starts it again with the
    /// same port, name, arguments and store, and waits until JetStream answers.
    ///
    /// For a cluster node, "answers" means it reaches the meta leader; its streams' replicas
    /// may still be catching up.
    ///
    /// # Errors
    ///
    /// As [`stop`](Self::stop), then [`Error::Exited`] or [`Error::NotReady`] (e.g. when
    /// another process took the port meanwhile).
    pub async fn restart(&self) -> Result<(), Error> {
        self.stop().await?;
        self.start_process()?;
        self.wait_ready().await
    }

    /// A name for messages: `nats-server s1 on 127.0.0.1:4222`.
    pub(crate) fn describe(&self) -> String {
        match &self.name {
            Some(name) => format!("nats-server {name} on {}", self.addr()),
            None => format!("nats-server on {}", self.addr()),
        }
    }

    /// Starts the process, its output appended to the log; does not wait for readiness.
    fn start_process(&self) -> Result<(), Error> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|source| Error::io(format!("open {}", self.log_path.display()), source))?;
        let log_error = |source| Error::io(format!("write {}", self.log_path.display()), source);
        let command_line = std::iter::once(self.binary.as_os_str())
            .chain(self.args.iter().map(OsString::as_os_str))
            .map(|arg| arg.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        writeln!(log, "---- jetshard-testkit: {command_line}").map_err(log_error)?;
        let stderr: File = log.try_clone().map_err(log_error)?;

        let mut command = Command::new(&self.binary);
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr));
        let child = process::spawn(command)
            .map_err(|source| Error::io(format!("start {}", self.binary.display()), source))?;
        tracing::debug!(server = %self.describe(), pid = child.id(), "started nats-server");
        if let Some(mut previous) = self.lock_child().replace(child) {
            // Only a racing restart gets here; never leave a process without an owner.
            let _ = previous.kill();
            let _ = previous.wait();
        }
        Ok(())
    }

    /// The log tail with a heading, as errors carry it.
    pub(crate) fn log_tail_for_error(&self) -> String {
        format!(
            "last lines of {}:\n{}",
            self.log_path.display(),
            self.log_tail()
        )
    }

    /// Reaps the process if it has exited, returning how it exited.
    fn reap_if_exited(&self) -> Result<Option<ExitStatus>, Error> {
        let mut slot = self.lock_child();
        let Some(child) = slot.as_mut() else {
            return Ok(None);
        };
        let status = child
            .try_wait()
            .map_err(|source| Error::io(format!("wait for {}", self.describe()), source))?;
        if status.is_some() {
            *slot = None;
        }
        Ok(status)
    }

    fn signal_running(&self, signal: Signal) -> Result<(), Error> {
        let child = self.lock_child();
        let Some(child) = child.as_ref() else {
            return Err(Error::NotRunning {
                server: self.describe(),
            });
        };
        self.signal(child, signal)
    }

    fn signal(&self, child: &Child, signal: Signal) -> Result<(), Error> {
        process::send(child, signal).map_err(|source| Error::Signal {
            signal: signal.name(),
            server: self.describe(),
            source,
        })
    }

    /// The process slot; a panic elsewhere while it was held leaves nothing half-done in it.
    fn lock_child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let child = self
            .child
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(mut child) = child {
            // Errors cannot be returned from drop; a failed kill of our own child is not
            // expected, and the process would still die with the test process (Linux).
            if let Err(error) = child.kill().and_then(|()| child.wait().map(drop)) {
                tracing::warn!(server = %self.describe(), %error, "could not kill nats-server");
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "---- {} (dropped during a panic); {}\n----",
                self.describe(),
                self.log_tail_for_error()
            );
        }
    }
}

/// Picks `count` distinct free loopback ports by binding them all at once, then closing them.
///
/// Another process can take a port before the server binds it; callers retry on
/// [`Error::is_address_in_use`].
pub(crate) fn free_ports(count: usize) -> Result<Vec<u16>, Error> {
    let action = "bind a free loopback port";
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<Result<_, _>>()
        .map_err(|source| Error::io(action, source))?;
    listeners
        .iter()
        .map(|listener| listener.local_addr().map(|addr| addr.port()))
        .collect::<Result<_, _>>()
        .map_err(|source| Error::io(action, source))
}

/// Whether every thread of process `pid` is stopped (state `T` in `/proc/<pid>/task/*/stat`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            // The command name (field 2) may hold spaces; the state follows its `)`.
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(['T', 't']))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The retry in `start` depends on recognising this failure from the server's log.
    #[tokio::test]
    async fn a_taken_port_is_recognised_as_address_in_use() {
        let holder = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let port = holder.local_addr().expect("addr").port();

        let server = NatsServer::builder().spawn(port).expect("spawn");
        let error = server.wait_ready().await.unwrap_err();

        assert!(error.is_address_in_use(), "{error:?}");
        assert!(matches!(error, Error::Exited { .. }), "{error:?}");
    }
}
