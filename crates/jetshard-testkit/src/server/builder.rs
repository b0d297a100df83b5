//! [`NatsServerBuilder`]: a server's name, configuration, arguments and client options, and
//! its start on a free port.

use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::ConnectOptions;

use super::{DEFAULT_READY_TIMEOUT, NatsServer, START_ATTEMPTS, free_ports};
use crate::{Error, binary};

/// Builds a [`NatsServer`] with more than the defaults; see [`NatsServer::builder`].
#[derive(Clone, Debug)]
pub struct NatsServerBuilder {
    name: Option<String>,
    config: Option<String>,
    args: Vec<OsString>,
    ready_timeout: Duration,
    connect_options: ConnectOptions,
}

impl Default for NatsServerBuilder {
    fn default() -> Self {
        NatsServerBuilder {
            name: None,
            config: None,
            args: Vec::new(),
            ready_timeout: DEFAULT_READY_TIMEOUT,
            connect_options: ConnectOptions::new(),
        }
    }
}

impl NatsServerBuilder {
    /// Sets the server name (`-n`), which JetStream reports e.g. as a stream's leader.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Starts the server with this configuration file content (written next to the store and
    /// passed with `-c`). The testkit's own flags (`-js`, `-sd`, `-a`, `-p`) take precedence.
    ///
    /// A configuration that requires authentication also needs
    /// [`connect_options`](Self::connect_options) with credentials, or the readiness probe
    /// cannot get in.
    pub fn config(mut self, contents: impl Into<String>) -> Self {
        self.config = Some(contents.into());
        self
    }

    /// Appends one command-line argument for `nats-server`.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// How long [`start`](Self::start) and [`NatsServer::restart`] wait for the server to
    /// answer (default 10 s).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// The client options the readiness probe and [`NatsServer::connect`] use (default:
    /// `ConnectOptions::new()`).
    pub fn connect_options(mut self, options: ConnectOptions) -> Self {
        self.connect_options = options;
        self
    }

    /// Starts the server on a free loopback port and waits until JetStream answers.
    ///
    /// # Errors
    ///
    /// No suitable binary ([`Error::BinaryNotFound`] and friends), a process that exits
    /// ([`Error::Exited`]) or does not answer in time ([`Error::NotReady`]); both carry the
    /// tail of the server's log. A port taken between picking and binding it is retried.
    pub async fn start(self) -> Result<NatsServer, Error> {
        let mut attempt = 1;
        loop {
            let port = free_ports(1)?[0];
            let server = self.spawn(port)?;
            match server.wait_ready().await {
                Ok(()) => return Ok(server),
                Err(error) if error.is_address_in_use() && attempt < START_ATTEMPTS => {
                    tracing::debug!(port, "port taken before nats-server bound it; retrying");
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Creates the server's directory and starts its process on `port`, without waiting.
    pub(crate) fn spawn(&self, port: u16) -> Result<NatsServer, Error> {
        let binary = binary::nats_server_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("jetshard-nats-")
            .tempdir()
            .map_err(|source| Error::io("create a temporary directory", source))?;
        let store_dir = dir.path().join("store");
        let log_path = dir.path().join("nats-server.log");

        let mut args: Vec<OsString> = Vec::new();
        if let Some(config) = &self.config {
            let config_path = dir.path().join("nats-server.conf");
            std::fs::write(&config_path, config)
                .map_err(|source| Error::io(format!("write {}", config_path.display()), source))?;
            args.extend(["-c".into(), config_path.into_os_string()]);
        }
        if let Some(name) = &self.name {
            args.extend(["-n".into(), name.into()]);
        }
        args.extend([
            "-js".into(),
            "-sd".into(),
            store_dir.clone().into_os_string(),
            "-a".into(),
            Ipv4Addr::LOCALHOST.to_string().into(),
            "-p".into(),
            port.to_string().into(),
        ]);
        args.extend(self.args.iter().cloned());

        let server = NatsServer {
            binary,
            args,
            name: self.name.clone(),
            port,
            store_dir,
            log_path,
            ready_timeout: self.ready_timeout,
            connect_options: self.connect_options.clone(),
            child: Mutex::new(None),
            _dir: dir,
        };
        server.start_process()?;
        Ok(server)
    }
}
