//! The wait until a started server answers: probes until JetStream does, or the process exits.

use std::time::{Duration, Instant};

use super::{NatsServer, POLL_INTERVAL};
use crate::Error;

/// How long one readiness probe (connect + JetStream account info) may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

impl NatsServer {
    /// Waits until the client port accepts and JetStream answers an account info request,
    /// for at most the ready timeout. A process that exits meanwhile ends the wait at once,
    /// even while a probe hangs (e.g. on a port another process holds).
    pub(crate) async fn wait_ready(&self) -> Result<(), Error> {
        let started = Instant::now();
        loop {
            let probe = tokio::time::timeout(PROBE_TIMEOUT, self.probe());
            let last_error = tokio::select! {
                probed = probe => match probed {
                    Ok(Ok(())) => return Ok(()),
                    Ok(Err(error)) => error,
                    Err(elapsed) => elapsed.into(),
                },
                exited = self.exit() => return Err(exited),
            };
            if started.elapsed() >= self.ready_timeout {
                return Err(Error::NotReady {
                    server: self.describe(),
                    after: self.ready_timeout,
                    log_tail: self.log_tail_for_error(),
                    last_error: Some(last_error),
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Resolves once the process is gone (or cannot be watched), with the error that says so.
    async fn exit(&self) -> Error {
        loop {
            match self.reap_if_exited() {
                Err(error) => return error,
                Ok(Some(status)) => {
                    return Error::Exited {
                        server: self.describe(),
                        status,
                        log_tail: self.log_tail_for_error(),
                    };
                }
                Ok(None) => {}
            }
            if self.lock_child().is_none() {
                return Error::NotRunning {
                    server: self.describe(),
                };
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// One readiness probe: a TCP connect (cheap, fails fast while the port is closed), then
    /// a NATS client and a JetStream account info request.
    async fn probe(&self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        tokio::net::TcpStream::connect(self.addr()).await?;
        let client = self
            .connect_options
            .clone()
            .connection_timeout(PROBE_TIMEOUT)
            .connect(self.url())
            .await?;
        async_nats::jetstream::new(client).query_account().await?;
        Ok(())
    }
}
