//! The one error type of the testkit.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// Everything that can go wrong while finding, starting, signalling or waiting for servers.
///
/// Messages are written for a person reading a failed test: a server that did not come up
/// carries the last lines of its log, and a missing binary names the script that installs
/// one. `Debug` prints the same text followed by the source chain, so `.expect(..)` and a
/// test returning `Result` both show something readable.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No `nats-server` was found at `NATS_SERVER_BIN`, in the repository's `.tools/venv`, or
    /// on `PATH`.
    #[error(
        "no nats-server binary found (looked at: {searched}); run scripts/install-nats-server \
         and set NATS_SERVER_BIN to the path it prints"
    )]
    BinaryNotFound {
        /// The places that were looked at, in order.
        searched: String,
    },

    /// A `nats-server` was found, but it is older than 2.11.
    #[error(
        "{} is nats-server {version}, older than the required 2.11; run \
         scripts/install-nats-server and set NATS_SERVER_BIN to the path it prints",
        path.display()
    )]
    BinaryTooOld {
        /// The binary that was found.
        path: PathBuf,
        /// The version it reported.
        version: String,
    },

    /// `<binary> --version` could not be run or printed no version.
    #[error(
        "`{} --version` did not report a version (output: {output:?}); run \
         scripts/install-nats-server and set NATS_SERVER_BIN to the path it prints",
        path.display()
    )]
    BinaryUnusable {
        /// The binary that was tried.
        path: PathBuf,
        /// What it printed, if it ran at all.
        output: String,
        /// Why it could not be run, if it could not.
        #[source]
        source: Option<io::Error>,
    },

    /// A file-system or socket operation failed.
    #[error("could not {action}")]
    Io {
        /// What was being done, e.g. "create a temporary directory".
        action: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The server process exited before it became ready (a bad argument, a taken port...).
    #[error("{server} exited ({status}) before it became ready; {log_tail}")]
    Exited {
        /// Which server.
        server: String,
        /// How it exited.
        status: ExitStatus,
        /// The last lines of its log.
        log_tail: String,
    },

    /// The server (or cluster) kept running but did not answer in time.
    #[error("{server} was not ready after {after:?}; {log_tail}")]
    NotReady {
        /// Which server or cluster.
        server: String,
        /// How long it was given.
        after: Duration,
        /// The last lines of its log (for a cluster: of every node).
        log_tail: String,
        /// The last failed readiness probe.
        #[source]
        last_error: Option<Box<dyn std::error::Error + Send + Sync>>,
    },

    /// The operation needs a running server process, and there is none.
    #[error("{server} is not running")]
    NotRunning {
        /// Which server.
        server: String,
    },

    /// Sending a signal to the server process failed.
    #[error("could not send {signal} to {server}")]
    Signal {
        /// The signal's name, e.g. `SIGSTOP`.
        signal: &'static str,
        /// Which server.
        server: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// A NATS client could not connect.
    #[error("could not connect a NATS client to {url}")]
    Connect {
        /// The address(es) it tried.
        url: String,
        /// The client's error.
        #[source]
        source: async_nats::ConnectError,
    },

    /// A cluster was asked for with no nodes.
    #[error("a cluster needs at least one node")]
    EmptyCluster,

    /// A condition given to [`wait_until`](crate::wait_until) did not hold in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was waited for, as the caller described it.
        what: String,
        /// How long was waited.
        after: Duration,
    },

    /// A JetStream request (creating a stream or a consumer) failed.
    #[error("could not {action}")]
    JetStream {
        /// What was being done, e.g. "create the stream PIN".
        action: String,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// [`wait_stream_writable`](crate::wait_stream_writable)'s probe, which names another
    /// stream, was stored instead of refused.
    #[error("a probe publish to {subject} naming another stream was stored")]
    ProbeStored {
        /// The subject probed.
        subject: String,
    },
}

impl Error {
    /// `true` when a server failed to start because its port was taken meanwhile: the
    /// accepted race of picking a free port, closing it and handing it to the server.
    pub(crate) fn is_address_in_use(&self) -> bool {
        match self {
            Error::Exited { log_tail, .. } => log_tail.contains("address already in use"),
            _ => false,
        }
    }

    pub(crate) fn io(action: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            action: action.into(),
            source,
        }
    }
}

impl fmt::Debug for Error {
    /// The message followed by its causes, one a line: what a failed test should print.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")?;
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            write!(f, "\n  caused by: {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}
