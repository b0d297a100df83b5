//! The system actor: it starts the tasks it owns (the liveness answerer, the crash watch, the
//! status, heartbeat and consumer-resume listeners), spawns an owner per partition, restarts a failed owner as a
//! standby (failing itself past its restart window), answers status requests, and stops.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::time::Instant;

use super::balance::{balance, publish_heartbeat, tell_holding, tell_members};
use super::state::{SystemMsg, SystemState};
use crate::entity::Entity;
use crate::health::PartitionHealth;
use crate::retry::RestartWindow;
use crate::runtime::balance::{Heartbeat, Membership};
use crate::runtime::owner::{OwnerActor, OwnerArgs, OwnerMsg, Shared};
use crate::status::{NodeStatus, PartitionStatus};

const RESPAWN_DELAY: Duration = Duration::from_secs(1);

/// The system actor of entity type `E` (its state is [`SystemState`]).
pub(super) struct SystemActor<E>(std::marker::PhantomData<fn() -> E>);

impl<E> SystemActor<E> {
    pub(super) fn new() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<E: Entity> Actor for SystemActor<E> {
    type Msg = SystemMsg;
    type State = SystemState;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        myself: ActorRef<SystemMsg>,
        shared: Arc<Shared>,
    ) -> Result<SystemState, ActorProcessingErr> {
        let partitions = shared.config.partitions;
        let pin_ttl = shared.config.pin_ttl;
        let failures = RestartWindow::new(
            shared.config.max_owner_restarts,
            shared.config.owner_restart_window,
        );
        let mut state = SystemState {
            membership: Membership::new(&shared.config.node_id, pin_ttl * 3, pin_ttl),
            members: tokio::sync::watch::Sender::new(None),
            peers: tokio::sync::watch::Sender::new(Default::default()),
            owned: 0,
            said: None,
            holding: vec![false; partitions as usize],
            standing_by: vec![true; partitions as usize],
            shared,
            owners: vec![None; partitions as usize],
            partition_of: HashMap::new(),
            failures,
            stopping: false,
            last_hand_off: None,
            tasks: Vec::new(),
        };
        // Answers liveness probes (runtime/crash/) for as long as this system runs: subscribed before any
        // owner can claim, so that no fence record names this process before it answers.
        let alive = state.shared.names.alive_subject(&state.shared.incarnation);
        let mut probes = state.shared.client.subscribe(alive).await?;
        let client = state.shared.client.clone();
        state.tasks.push(tokio::spawn(async move {
            while let Some(probe) = probes.next().await {
                if let Some(reply) = probe.reply {
                    let _ = client.publish(reply, Default::default()).await;
                }
            }
        }));
        // Tells each owner's pull loop when its consumer is resumed (before the owners start:
        // a resume as they start is not missed).
        let shared = &state.shared;
        let resumes = crate::runtime::pin::resumed::listen(
            &shared.client,
            shared.names.clone(),
            shared.resumes.clone(),
        )
        .await?;
        state.tasks.push(resumes);
        // A journal stream's new leader, told to the partitions' writers: what the one that
        // handed over had in flight may never be answered (subscribed before any owner writes).
        let names = state.shared.names.journal_streams();
        for (name, elections) in names.iter().zip(&state.shared.leader_elections) {
            let subject = crate::wire::stream_leader_elected(name);
            let mut advisories = state.shared.client.subscribe(subject).await?;
            let elections = elections.clone();
            state.tasks.push(tokio::spawn(async move {
                while advisories.next().await.is_some() {
                    elections.send_replace(Some(tokio::time::Instant::now()));
                }
            }));
        }
        for partition in 0..partitions {
            spawn_owner::<E>(&myself, &mut state, partition).await?;
        }
        if let Some(interval) = state.shared.config.crash_probe_interval {
            let shared = &state.shared;
            let watch = crate::runtime::crash::watch(crate::runtime::crash::WatchArgs {
                client: shared.client.clone(),
                js: shared.js.clone(),
                names: shared.names.clone(),
                journals: shared.journals.clone(),
                commands: shared.command_streams.clone(),
                partitions,
                incarnation: shared.incarnation.clone(),
                node: shared.config.node_id.clone(),
                interval,
                deaths: shared.deaths.clone(),
                watchers: shared.config.crash_watchers,
                members: state.members.subscribe(),
                peers: state.peers.subscribe(),
            })
            .await?;
            state.tasks.push(watch);
        }
        let config = &state.shared.config;
        if config.spread_leaders && config.replicas > 1 && config.journal_streams > 1 {
            state
                .tasks
                .push(tokio::spawn(crate::runtime::leaders::keep_spread(
                    state.shared.js.clone(),
                    state.shared.names.clone(),
                    state.shared.health.clone(),
                )));
        }
        let mut requests = state
            .shared
            .client
            .subscribe(state.shared.names.status_subject())
            .await?;
        let listener = myself.clone();
        state.tasks.push(tokio::spawn(async move {
            while let Some(request) = requests.next().await {
                if let Some(reply) = request.reply
                    && listener.cast(SystemMsg::Report(reply)).is_err()
                {
                    return;
                }
            }
        }));
        if state.shared.config.balance {
            let subject = state.shared.names.membership_subject();
            let mut heartbeats = state.shared.client.subscribe(subject).await?;
            let listener = myself.clone();
            state.tasks.push(tokio::spawn(async move {
                while let Some(message) = heartbeats.next().await {
                    if let Ok(heartbeat) = serde_json::from_slice::<Heartbeat>(&message.payload)
                        && listener.cast(SystemMsg::Heard(heartbeat)).is_err()
                    {
                        return;
                    }
                }
            }));
            state
                .tasks
                .push(myself.send_interval(pin_ttl, || SystemMsg::Balance));
        }
        tracing::info!(
            entity_type = %state.shared.config.entity_type,
            partitions,
            node = %state.shared.config.node_id,
            "shard system started"
        );
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<SystemMsg>,
        message: SystemMsg,
        state: &mut SystemState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SystemMsg::Status(reply) => {
                let _ = reply.send(statuses(state).await);
            }
            SystemMsg::Report(to) => {
                let node = NodeStatus {
                    node: state.shared.config.node_id.clone(),
                    partitions: statuses(state).await,
                };
                if let Ok(body) = serde_json::to_vec(&node) {
                    let _ = state.shared.client.publish(to, body.into()).await;
                }
            }
            SystemMsg::Shutdown(reply) => {
                state.stopping = true;
                if state.shared.config.balance {
                    // Before the releases: the others take this process's partitions at a fair
                    // share counted without it.
                    let leaving = Heartbeat {
                        node: state.shared.config.node_id.clone(),
                        owned: 0,
                        leaving: true,
                        incarnation: Some(state.shared.incarnation.clone()),
                        every_ms: None,
                    };
                    publish_heartbeat(&state.shared, &leaving).await;
                    // On the wire before the releases: a client dropped right after a publish
                    // loses what it had not written yet (async-nats closes on the last handle).
                    flush(&state.shared).await;
                }
                let timeout = Some(state.shared.config.ack_wait + Duration::from_secs(1));
                let releases = state
                    .owners
                    .iter()
                    .flatten()
                    .map(|owner| owner.call(OwnerMsg::Release, timeout));
                futures::future::join_all(releases).await;
                // The releases' last acks and naks, before the client may be dropped.
                flush(&state.shared).await;
                tracing::info!(entity_type = %state.shared.config.entity_type, node = %state.shared.config.node_id, "shard system stopped");
                let _ = reply.send(());
                myself.stop(Some("shutdown".to_owned()));
            }
            SystemMsg::Heard(heartbeat) => {
                let now = Instant::now();
                state.membership.heard(heartbeat, now);
                // At once, not at the next round: another process may hand a partition off on
                // hearing the same heartbeat.
                tell_members(state, now);
                tell_holding(state, now, false);
            }
            SystemMsg::Balance => balance(state).await,
            SystemMsg::Respawn(partition) => {
                if !state.stopping && state.owners[partition as usize].is_none() {
                    spawn_owner::<E>(&myself, state, partition).await?;
                }
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<SystemMsg>,
        state: &mut SystemState,
    ) -> Result<(), ActorProcessingErr> {
        state.stopping = true;
        myself.stop_children(Some("shard system stopped".to_owned()));
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SystemMsg>,
        event: SupervisionEvent,
        state: &mut SystemState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, failure) = match event {
            SupervisionEvent::ActorFailed(cell, error) => (cell, Some(error.to_string())),
            SupervisionEvent::ActorTerminated(cell, _, reason) => (
                cell,
                reason
                    .filter(|r| r != "released")
                    .map(|r| format!("stopped: {r}")),
            ),
            _ => return Ok(()),
        };
        let Some(partition) = state.partition_of.remove(&cell.get_id()) else {
            return Ok(());
        };
        state.owners[partition as usize] = None;
        if state.stopping {
            return Ok(());
        }
        state
            .shared
            .health
            .set(partition, PartitionHealth::Restarting);
        let reason = failure.unwrap_or_else(|| "stopped".to_owned());
        tracing::error!(partition, %reason, "partition owner ended; restarting it as a standby");
        let window = state.shared.config.owner_restart_window;
        if state.failures.exceeded(Instant::now()) {
            // ractor does not stop the children of a failed actor: stop the owners here, so
            // the partitions' pins lapse and other processes take them.
            state.stopping = true;
            myself.stop_children(Some("shard system failed".to_owned()));
            return Err(format!("{} partition owners failed within {window:?}; last: partition {partition}: {reason}", state.failures.count()).into());
        }
        myself.send_after(RESPAWN_DELAY, move || SystemMsg::Respawn(partition));
        Ok(())
    }
}

/// Every owner's status.
async fn statuses(state: &SystemState) -> Vec<PartitionStatus> {
    let mut all = Vec::with_capacity(state.owners.len());
    for owner in state.owners.iter().flatten() {
        if let Ok(ractor::rpc::CallResult::Success(status)) = owner
            .call(OwnerMsg::Status, Some(Duration::from_secs(5)))
            .await
        {
            all.push(status);
        }
    }
    all
}

/// Writes out what the client still buffers, for at most a second (best effort: a stop does not
/// wait on a server that is gone).
async fn flush(shared: &Shared) {
    let _ = tokio::time::timeout(Duration::from_secs(1), shared.client.flush()).await;
}

async fn spawn_owner<E: Entity>(
    myself: &ActorRef<SystemMsg>,
    state: &mut SystemState,
    partition: u32,
) -> Result<(), ActorProcessingErr> {
    let args = OwnerArgs {
        shared: state.shared.clone(),
        partition,
    };
    let (owner, _) =
        Actor::spawn_linked(None, OwnerActor::<E>::new(), args, myself.get_cell()).await?;
    state.partition_of.insert(owner.get_id(), partition);
    state.owners[partition as usize] = Some(owner);
    Ok(())
}
