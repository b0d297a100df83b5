//! The node's reporter: the ownership changes of the order's shard system, forwarded from its
//! broadcast as they are seen, logged and said on stdout ([`NodeLine`]); and every few seconds
//! the node's status in the log.

use std::collections::BTreeSet;
use std::time::Duration;

use jetshard::{OwnershipChange, OwnershipEvent, PartitionStatus, ShardConfig, ShardSystem};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{RootMsg, say};
use crate::nodes::{NodeLine, unix_ms};

/// Forwards the system's ownership events to the reporter, stamped with the time they were
/// seen. Dropping it ends the task after it has passed on what was already sent.
pub(super) struct Forwarder {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Forwarder {
    pub(super) fn start(system: &ShardSystem, reporter: ActorRef<ReporterMsg>) -> Forwarder {
        let mut events = system.ownership_events();
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let forward = |event| {
                reporter
                    .cast(ReporterMsg::Ownership(event, unix_ms()))
                    .is_ok()
            };
            loop {
                tokio::select! {
                    biased;
                    received = events.recv() => match received {
                        Ok(event) => {
                            if !forward(event) {
                                return;
                            }
                        }
                        Err(RecvError::Lagged(missed)) => {
                            tracing::warn!(missed, "ownership events missed");
                        }
                        Err(RecvError::Closed) => return,
                    },
                    // Stopped, or the handle dropped: pass on what is queued, then end.
                    _ = &mut stopped => {
                        loop {
                            match events.try_recv() {
                                Ok(event) => {
                                    if !forward(event) {
                                        return;
                                    }
                                }
                                Err(TryRecvError::Lagged(_)) => {}
                                Err(_) => return,
                            }
                        }
                    }
                }
            }
        });
        Forwarder {
            stop: Some(stop),
            task,
        }
    }

    /// Passes on every event sent so far, then ends.
    pub(super) async fn finish(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = &mut self.task;
        if tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .is_err()
        {
            tracing::warn!("ownership events not passed on within 2 s");
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        // Dropping `stop` ends the task once it has passed on what is queued; it needs no
        // abort, and must not be left running past its system.
        if self.task.is_finished() {
            return;
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Starts the reporter, linked to the root, logging the status every `every`.
pub(super) async fn spawn_reporter(
    root: &ActorRef<RootMsg>,
    config: &ShardConfig,
    every: Duration,
) -> Result<ActorRef<ReporterMsg>, ActorProcessingErr> {
    let args = ReporterArgs {
        root: root.clone(),
        node: config.node_id().to_owned(),
        every,
    };
    let (reporter, _) = Actor::spawn_linked(None, Reporter, args, root.get_cell()).await?;
    Ok(reporter)
}

/// Logs ownership changes as they happen, and the node's status every few seconds.
struct Reporter;

struct ReporterArgs {
    root: ActorRef<RootMsg>,
    node: String,
    every: Duration,
}

pub(super) enum ReporterMsg {
    /// An ownership change, stamped with the unix time it was seen.
    Ownership(OwnershipEvent, u128),
    /// Time to log the status.
    Tick,
    /// Replies once every message queued before it is handled.
    Flush(RpcReplyPort<()>),
}

struct ReporterState {
    root: ActorRef<RootMsg>,
    node: String,
    owned: BTreeSet<u32>,
    ticker: JoinHandle<()>,
}

impl Actor for Reporter {
    type Msg = ReporterMsg;
    type State = ReporterState;
    type Arguments = ReporterArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ReporterMsg>,
        args: ReporterArgs,
    ) -> Result<ReporterState, ActorProcessingErr> {
        let ticker = myself.send_interval(args.every, || ReporterMsg::Tick);
        Ok(ReporterState {
            root: args.root,
            node: args.node,
            owned: BTreeSet::new(),
            ticker,
        })
    }

    async fn handle(
        &self,
        _: ActorRef<ReporterMsg>,
        message: ReporterMsg,
        state: &mut ReporterState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ReporterMsg::Ownership(event, at_ms) => {
                let (partition, generation, node) =
                    (event.partition, event.generation, event.node.clone());
                let line = match event.change {
                    OwnershipChange::Acquired => {
                        state.owned.insert(partition);
                        tracing::info!(partition, generation, node = %node, "ACQUIRED");
                        NodeLine::Acquired {
                            partition,
                            generation,
                            at_ms,
                            node,
                        }
                    }
                    OwnershipChange::Released { reason } => {
                        state.owned.remove(&partition);
                        tracing::info!(partition, generation, node = %node, %reason, "RELEASED");
                        NodeLine::Released {
                            partition,
                            generation,
                            at_ms,
                            node,
                            reason,
                        }
                    }
                    other => {
                        tracing::info!(partition, generation, node = %node, change = ?other, "ownership changed");
                        return Ok(());
                    }
                };
                say(&line);
            }
            ReporterMsg::Flush(reply) => {
                let _ = reply.send(());
            }
            ReporterMsg::Tick => {
                let status = state
                    .root
                    .call(RootMsg::Status, Some(Duration::from_secs(15)))
                    .await;
                let Ok(ractor::rpc::CallResult::Success(status)) = status else {
                    tracing::warn!(node = %state.node, "no status from the shard system");
                    return Ok(());
                };
                let sum = |f: fn(&PartitionStatus) -> u64| status.iter().map(f).sum::<u64>();
                tracing::info!(
                    node = %state.node,
                    owned = ?state.owned,
                    resident_entities = status.iter().map(|p| p.resident_entities).sum::<usize>(),
                    in_hand = status.iter().map(|p| p.commands_in_hand).sum::<usize>(),
                    applied = sum(|p| p.applied),
                    events = sum(|p| p.events_written),
                    duplicates = sum(|p| p.duplicates),
                    dead_lettered = sum(|p| p.dead_lettered),
                    "status"
                );
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<ReporterMsg>,
        state: &mut ReporterState,
    ) -> Result<(), ActorProcessingErr> {
        state.ticker.abort();
        Ok(())
    }
}
