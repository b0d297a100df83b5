//! A load offered at a fixed rate ([`OfferedLoad`]), for the scenarios that watch a system
//! while something happens to it (a failover, a rolling deploy): commands go out on a schedule,
//! not as fast as the system takes them, so that a stall shows as latency and a backlog rather
//! than as a slower producer. It records what such a scenario checks at the end: the
//! command-stream sequence of every command stored (a command with no event, or with two) and
//! how many publishes were refused.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::context::PublishAckFuture;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::entity::BenchCmd;
use crate::load::CommandPublisher;

/// What a command of an [`OfferedLoad`] carries as its `at_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamp {
    /// Its scheduled send time (latency counted from it, a late send included).
    Scheduled,
    /// The time it was sent.
    Sent,
}

/// A load offered at a fixed rate until stopped: `Stamp` commands round-robin over the bench
/// entities `e0..e<entities>`, the `i`-th due `i / rate` seconds after the start (a late one goes
/// at once); every acknowledgement is awaited by a collector, in publish order, which records the
/// sequences stored and counts the publishes refused.
pub struct OfferedLoad {
    task: JoinHandle<()>,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<u64>>>,
    refused: Arc<AtomicU64>,
}

impl OfferedLoad {
    /// Starts offering `rate` commands/s to `entities` entities of `entity_type`; `label` names
    /// the load in warnings.
    pub fn start(
        client: async_nats::Client,
        entity_type: &str,
        entities: usize,
        rate: u64,
        stamp: Stamp,
        label: &'static str,
    ) -> Self {
        let acked: Arc<Mutex<Vec<u64>>> = Arc::default();
        let refused = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let publisher = CommandPublisher::new(client, entity_type, entities);
        let task = tokio::spawn(offer(
            publisher,
            rate,
            stamp,
            label,
            acked.clone(),
            refused.clone(),
            stop.clone(),
        ));
        Self {
            task,
            stop,
            acked,
            refused,
        }
    }

    /// Stops publishing and waits (up to `within`) until every publish is acknowledged or
    /// refused; aborted after that. Stopped, not aborted: the acknowledgements of the last
    /// publishes are still on their way, and an aborted publisher loses them.
    pub async fn stop(&mut self, within: Duration) {
        self.stop.store(true, Ordering::Relaxed);
        if tokio::time::timeout(within, &mut self.task).await.is_err() {
            self.task.abort();
        }
    }

    /// Ends it at once, acknowledgements in flight unawaited.
    pub fn abort(&self) {
        self.task.abort();
    }

    /// The command-stream sequences of the commands stored so far.
    pub fn acked(&self) -> Vec<u64> {
        self.acked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Publishes refused (or not made) so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// [`OfferedLoad`]'s task.
async fn offer(
    publisher: CommandPublisher,
    rate: u64,
    stamp: Stamp,
    label: &'static str,
    acked: Arc<Mutex<Vec<u64>>>,
    refused: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) {
    let period = Duration::from_nanos(1_000_000_000 / rate);
    let started = Instant::now();
    let started_ns = crate::stats::now_ns();
    let (acks, mut pending) = tokio::sync::mpsc::channel::<PublishAckFuture>(8192);
    let collector = {
        let refused = refused.clone();
        tokio::spawn(async move {
            while let Some(ack) = pending.recv().await {
                match ack.await {
                    Ok(ack) => acked
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(ack.sequence),
                    Err(e) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(error = %e, kind = ?e.kind(), "{label}: a command's publish was not acknowledged");
                    }
                }
            }
        })
    };
    let mut collector = AbortOnDrop(collector);
    for i in 0u32.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let offset = period * i;
        tokio::time::sleep_until(started + offset).await;
        let at_ns = match stamp {
            Stamp::Scheduled => started_ns + offset.as_nanos() as u64,
            Stamp::Sent => crate::stats::now_ns(),
        };
        match publisher
            .send_to(i as usize, &BenchCmd::Stamp { at_ns })
            .await
        {
            Ok(ack) => {
                if acks.send(ack).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "{label}: a command was not published");
            }
        }
    }
    // The collector ends once it has every acknowledgement still on its way.
    drop(acks);
    let _ = (&mut collector.0).await;
}

/// Aborts a task when dropped (the load is aborted as a whole).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
