//! The node's HTTP listener (`node --metrics-addr HOST:PORT`): the Prometheus scrape endpoint
//! and the health probes, on one port.
//!
//! - `GET /metrics`: every jetshard series (docs/OPERATIONS.md, "Metrics") in the Prometheus
//!   text format, from the `metrics-exporter-prometheus` recorder the node installs before it
//!   starts its shard system;
//! - `GET /healthz`: `200 ok` while the process answers (liveness);
//! - `GET /readyz`: `200 ready` once every partition this node owns is serving
//!   ([`jetshard::ShardSystem::health`]), else `503` naming each partition at fault and its
//!   phase (readiness).
//!
//! A hand-written HTTP/1.x server on tokio (one request per connection, `Connection: close`):
//! three fixed GET routes need no framework.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use jetshard::Health;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// Buckets of the `_seconds` histograms: 10 us to 30 s.
const SECONDS_BUCKETS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Buckets of `jetshard_journal_batch_events`.
const EVENTS_BUCKETS: &[f64] = &[0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];
/// The longest request head read.
const MAX_REQUEST: usize = 8 * 1024;
/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Installs the Prometheus recorder as the process's global one. Call it before the shard
/// system starts: jetshard registers its series when its owners start.
///
/// # Errors
/// If a recorder is installed already.
pub fn install_recorder() -> anyhow::Result<PrometheusHandle> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), SECONDS_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full("jetshard_journal_batch_events".to_owned()),
            EVENTS_BUCKETS,
        )?
        .install_recorder()
        .context("install the metrics recorder")
}

/// A running listener; dropping it stops it and the connections it serves.
pub struct Probe {
    /// The address it listens on.
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds `addr` and serves `/metrics` from `metrics`, and `/readyz` from what `health` says
/// (`None`: no shard system running, e.g. between a failure and its restart).
///
/// # Errors
/// If `addr` cannot be bound.
pub async fn serve<H, F>(addr: &str, metrics: PrometheusHandle, health: H) -> anyhow::Result<Probe>
where
    H: Fn() -> F + Send + Sync + 'static,
    F: Future<Output = Option<Health>> + Send + 'static,
{
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("bind {addr}"))?;
    let addr = listener.local_addr()?;
    let health = std::sync::Arc::new(health);
    let task = tokio::spawn(async move {
        let mut connections = JoinSet::new();
        let mut upkeep = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let metrics = metrics.clone();
                    let health = health.clone();
                    connections.spawn(async move {
                        if let Err(e) = answer(stream, &metrics, &*health).await {
                            tracing::debug!(error = %e, "probe request");
                        }
                    });
                }
                // Histograms keep their samples until upkeep folds them in.
                _ = upkeep.tick() => metrics.run_upkeep(),
                Some(_) = connections.join_next() => {}
            }
        }
    });
    Ok(Probe { addr, task })
}

async fn answer<H, F>(
    mut stream: TcpStream,
    metrics: &PrometheusHandle,
    health: &H,
) -> anyhow::Result<()>
where
    H: Fn() -> F,
    F: Future<Output = Option<Health>>,
{
    let head = tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream))
        .await
        .context("request not read in time")??;
    let (status, content_type, body) = match route(&head) {
        Route::Metrics => (
            "200 OK",
            "text/plain; version=0.0.4",
            metrics.render().into_bytes(),
        ),
        Route::Healthz => ("200 OK", "text/plain", b"ok\n".to_vec()),
        Route::Readyz => {
            let (ready, text) = readiness(health().await);
            let status = if ready {
                "200 OK"
            } else {
                "503 Service Unavailable"
            };
            (status, "text/plain", text.into_bytes())
        }
        Route::NotFound => ("404 Not Found", "text/plain", b"not found\n".to_vec()),
        Route::BadMethod => (
            "405 Method Not Allowed",
            "text/plain",
            b"GET only\n".to_vec(),
        ),
    };
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(header.as_bytes()).await?;
    stream.write_all(&body).await?;
    stream.shutdown().await?;
    Ok(())
}

/// Reads up to the end of the request head (the blank line), at most [`MAX_REQUEST`] bytes.
async fn read_head(stream: &mut TcpStream) -> anyhow::Result<String> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        anyhow::ensure!(head.len() <= MAX_REQUEST, "request head too long");
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics,
    Healthz,
    Readyz,
    NotFound,
    BadMethod,
}

/// The route of a request head: its first line, `GET <path>[?query] HTTP/1.x`.
fn route(head: &str) -> Route {
    let mut words = head.lines().next().unwrap_or_default().split_whitespace();
    let (Some(method), Some(target)) = (words.next(), words.next()) else {
        return Route::NotFound;
    };
    if method != "GET" {
        return Route::BadMethod;
    }
    match target.split('?').next().unwrap_or_default() {
        "/metrics" => Route::Metrics,
        "/healthz" => Route::Healthz,
        "/readyz" => Route::Readyz,
        _ => Route::NotFound,
    }
}

/// Whether the node is ready, and the body saying so: `ready` and the partitions served, or
/// each partition at fault with its phase, one a line.
fn readiness(health: Option<Health>) -> (bool, String) {
    match health {
        Some(Health::Ready { serving }) => {
            let serving: Vec<String> = serving.iter().map(u32::to_string).collect();
            (true, format!("ready\nserving {}\n", serving.join(",")))
        }
        Some(Health::Degraded { partitions }) => {
            let mut text = String::from("degraded\n");
            for (partition, phase) in partitions {
                text.push_str(&format!("partition {partition} {phase}\n"));
            }
            (false, text)
        }
        Some(Health::Disconnected) => (false, "disconnected from the server\n".to_owned()),
        Some(Health::Stopped) => (false, "stopped\n".to_owned()),
        Some(_) => (false, "unknown\n".to_owned()),
        None => (false, "no shard system running\n".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jetshard::PartitionHealth;

    #[test]
    fn requests_are_routed_by_method_and_path() {
        assert_eq!(route("GET /metrics HTTP/1.0\r\n\r\n"), Route::Metrics);
        assert_eq!(
            route("GET /readyz?verbose HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Readyz
        );
        assert_eq!(route("GET /healthz HTTP/1.1\r\n\r\n"), Route::Healthz);
        assert_eq!(route("POST /metrics HTTP/1.1\r\n\r\n"), Route::BadMethod);
        assert_eq!(route("GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route(""), Route::NotFound);
    }

    #[test]
    fn readiness_names_the_partitions_at_fault() {
        let ready = Health::Ready {
            serving: vec![0, 2],
        };
        assert_eq!(
            readiness(Some(ready)),
            (true, "ready\nserving 0,2\n".to_owned())
        );
        let degraded = Health::Degraded {
            partitions: vec![(1, PartitionHealth::Acquiring)],
        };
        assert_eq!(
            readiness(Some(degraded)),
            (false, "degraded\npartition 1 acquiring\n".to_owned())
        );
        assert_eq!(
            readiness(Some(Health::Disconnected)),
            (false, "disconnected from the server\n".to_owned())
        );
        assert!(!readiness(None).0);
    }
}
