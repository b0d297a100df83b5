//! The shard system: one entity type's partitions in this process, under one supervisor.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream;
use futures::StreamExt;
use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::ShardConfig;
use crate::entity::Entity;
use crate::error::Error;
use crate::health::{Health, HealthBoard, PartitionHealth};
use crate::retry::RestartWindow;
use crate::runtime::balance::{Heartbeat, Membership};
use crate::runtime::owner::{OwnerActor, OwnerArgs, OwnerMsg, Shared};
use crate::runtime::topology;
use crate::status::{NodeStatus, OwnershipEvent, PartitionStatus};
use crate::wire::Names;

const RESPAWN_DELAY: Duration = Duration::from_secs(1);

/// A running shard system: this process's part in running one entity type.
///
/// Start one per entity type in every process; the processes share the partitions between them
/// through the server's pinning, and take over each other's when one dies or stalls.
///
/// ```no_run
/// # use jetshard::{Entity, ShardConfig, ShardSystem};
/// # async fn run<Order: Entity>(client: async_nats::Client) -> Result<(), jetshard::Error> {
/// let config = ShardConfig::builder("order").partitions(8).build()?;
/// let system = ShardSystem::start::<Order>(client, config).await?;
/// // ... until the process is asked to stop:
/// system.shutdown().await?;
/// # Ok(()) }
/// ```
pub struct ShardSystem {
    actor: ActorRef<SystemMsg>,
    join: JoinHandle<()>,
    events: broadcast::Sender<OwnershipEvent>,
    config: ShardConfig,
    health: Arc<HealthBoard>,
    /// The connection the system runs on, for [`health`](Self::health).
    client: Client,
}

impl ShardSystem {
    /// Creates or validates the entity type's streams and consumers, then starts an owner for
    /// every partition. Standalone: nothing supervises the system.
    ///
    /// # Errors
    /// [`Error::PartitionMismatch`] or [`Error::Incompatible`] if the streams exist with other
    /// settings; [`Error::JetStream`] if the server cannot be reached; [`Error::Spawn`].
    pub async fn start<E: Entity>(client: Client, config: ShardConfig) -> Result<Self, Error> {
        Self::spawn::<E>(client, config, None).await
    }

    /// Like [`start`](Self::start), but linked under `supervisor` in the application's actor
    /// tree: if the system fails (its owners fail too often), the supervisor receives
    /// `SupervisionEvent::ActorFailed` for [`actor`](Self::actor).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn start_linked<E: Entity>(
        client: Client,
        config: ShardConfig,
        supervisor: ActorCell,
    ) -> Result<Self, Error> {
        Self::spawn::<E>(client, config, Some(supervisor)).await
    }

    async fn spawn<E: Entity>(
        client: Client,
        config: ShardConfig,
        supervisor: Option<ActorCell>,
    ) -> Result<Self, Error> {
        // Every command in hand may have a journal write in flight (one per entity): the
        // client's own limit on acknowledgements in flight (5,000 by default, over which a
        // publish fails) must not be lower, and reaching it waits rather than fails.
        let in_flight = (config.partitions as usize)
            .saturating_mul(config.max_ack_pending as usize)
            .max(5_000);
        let js = jetstream::ContextBuilder::new()
            .timeout(config.write_timeout)
            .max_ack_inflight(in_flight)
            .backpressure_on_inflight(true)
            .build(client);
        let names = Arc::new(Names::new(&config.entity_type));
        topology::provision(&js, &names, &config).await?;
        let command_stream = js
            .get_stream_no_info(&names.command_stream)
            .await
            .map_err(|e| Error::jetstream(format!("open stream {}", names.command_stream), e))?;
        let journal_stream = js
            .get_stream_no_info(&names.journal_stream)
            .await
            .map_err(|e| Error::jetstream(format!("open stream {}", names.journal_stream), e))?;
        let (events, _) = broadcast::channel(1024);
        let health = Arc::new(HealthBoard::new(config.partitions));
        let client = js.client();
        let shared = Arc::new(Shared {
            client: client.clone(),
            js,
            names,
            config: config.clone(),
            command_stream,
            journal_stream,
            events: events.clone(),
            resident: Arc::default(),
            dormant: Arc::default(),
            loads: Arc::new(tokio::sync::Semaphore::new(
                crate::runtime::entity_actor::MAX_LOADS,
            )),
            incarnation: crate::wire::unique_token(),
            health: health.clone(),
            deaths: Arc::default(),
        });
        let actor = SystemActor::<E>(std::marker::PhantomData);
        let spawned = match supervisor {
            Some(supervisor) => Actor::spawn_linked(None, actor, shared, supervisor).await,
            None => Actor::spawn(None, actor, shared).await,
        };
        let (actor, join) = spawned.map_err(|e| Error::Spawn {
            what: "shard system",
            source: Box::new(e),
        })?;
        Ok(Self {
            actor,
            join,
            events,
            config,
            health,
            client,
        })
    }

    /// The system's actor, for linking and monitoring in an application's supervision tree.
    pub fn actor(&self) -> ActorCell {
        self.actor.get_cell()
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &ShardConfig {
        &self.config
    }

    /// Ownership changes in this process from now on.
    pub fn ownership_events(&self) -> broadcast::Receiver<OwnershipEvent> {
        self.events.subscribe()
    }

    /// A snapshot of every partition in this process.
    ///
    /// # Errors
    /// [`Error::Stopped`] if the system is no longer running.
    pub async fn status(&self) -> Result<Vec<PartitionStatus>, Error> {
        match self
            .actor
            .call(SystemMsg::Status, Some(Duration::from_secs(10)))
            .await
        {
            Ok(ractor::rpc::CallResult::Success(status)) => Ok(status),
            _ => Err(Error::Stopped),
        }
    }

    /// Whether this process serves its partitions: [`Health::Ready`] once every partition it
    /// owns is serving (the others it pulls as a standby); [`Health::Degraded`] names each
    /// partition whose owner is starting, acquiring, refused, isolating, releasing or
    /// restarting; [`Health::Disconnected`] while its connection to the server is down (even
    /// if it owns nothing); [`Health::Stopped`] once the system has stopped. It reads the
    /// client's connection state and what each owner last posted, and never waits on one (an
    /// acquisition runs for as long as its replay).
    pub fn health(&self) -> Health {
        let stopping = matches!(
            self.actor.get_status(),
            ractor::ActorStatus::Draining
                | ractor::ActorStatus::Stopping
                | ractor::ActorStatus::Stopped
        );
        if stopping || self.join.is_finished() {
            return Health::Stopped;
        }
        let connected = self.client.connection_state() == async_nats::connection::State::Connected;
        Health::judge(connected, &self.health.phases())
    }

    /// Stops gracefully: every owner finishes and acknowledges the commands in hand (within the
    /// ack wait), releases its pin so a standby takes over at once, and stops.
    ///
    /// # Errors
    /// [`Error::Stopped`] if the system had already stopped.
    pub async fn shutdown(self) -> Result<(), Error> {
        let timeout = self.config.ack_wait + Duration::from_secs(5);
        let result = self.actor.call(SystemMsg::Shutdown, Some(timeout)).await;
        let _ = self.join.await;
        match result {
            Ok(ractor::rpc::CallResult::Success(())) => Ok(()),
            _ => Err(Error::Stopped),
        }
    }
}

pub(crate) enum SystemMsg {
    Status(RpcReplyPort<Vec<PartitionStatus>>),
    Shutdown(RpcReplyPort<()>),
    Respawn(u32),
    /// Another process's heartbeat.
    Heard(Heartbeat),
    /// Time to say how many partitions this process owns, and to hand one off if it owns too
    /// many.
    Balance,
    /// A status request on `<t>.status`: answer it there.
    Report(async_nats::Subject),
}

struct SystemActor<E>(std::marker::PhantomData<fn() -> E>);

struct SystemState {
    shared: Arc<Shared>,
    owners: Vec<Option<ActorRef<OwnerMsg>>>,
    partition_of: HashMap<ActorId, u32>,
    /// Owner failures, against the system's restart window.
    failures: RestartWindow,
    stopping: bool,
    membership: Membership,
    /// The live members as last told to the crash watch (`None`: no membership, balancing off).
    members: tokio::sync::watch::Sender<Option<std::collections::BTreeSet<String>>>,
    /// The other live members' incarnations (and nodes), as last told to the crash watch.
    peers: tokio::sync::watch::Sender<std::collections::BTreeMap<String, String>>,
    /// Partitions this process owned at the last balancing round.
    owned: u32,
    /// Per partition: whether its standby pauses its pulls (it holds back, or it is not one of
    /// the partition's standbys), as last told to its owner.
    holding: Vec<bool>,
    /// Per partition: whether this process is one of its standbys, for the members in
    /// `members` (computed again only when they change).
    standing_by: Vec<bool>,
    last_hand_off: Option<Instant>,
    /// The heartbeat listener and the balance timer; stopped with the system.
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for SystemState {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
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
        for partition in 0..partitions {
            spawn_owner::<E>(&myself, &mut state, partition).await?;
        }
        if let Some(interval) = state.shared.config.crash_probe_interval {
            let shared = &state.shared;
            let watch = crate::runtime::crash::watch(crate::runtime::crash::WatchArgs {
                client: shared.client.clone(),
                js: shared.js.clone(),
                names: shared.names.clone(),
                journal: shared.journal_stream.clone(),
                commands: shared.command_stream.clone(),
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

/// Says how many partitions this process owns, and hands partitions off if it owns more than
/// its share while others own less (see `balance.rs`).
async fn balance(state: &mut SystemState) {
    if state.stopping {
        return;
    }
    let mut owned = Vec::new();
    for owner in state.owners.iter().flatten() {
        if let Ok(ractor::rpc::CallResult::Success(status)) = owner
            .call(OwnerMsg::Status, Some(Duration::from_secs(1)))
            .await
            && status.generation.is_some()
        {
            owned.push((status.partition, owner.clone()));
        }
    }
    let shared = Arc::clone(&state.shared);
    let config = &shared.config;
    let heartbeat = Heartbeat {
        node: config.node_id.clone(),
        owned: owned.len() as u32,
        leaving: false,
        incarnation: Some(shared.incarnation.clone()),
    };
    publish_heartbeat(&state.shared, &heartbeat).await;
    let now = Instant::now();
    // Time for the last hand-offs to land and show in the heartbeats before the next ones.
    let settled = state
        .last_hand_off
        .is_none_or(|at| now.duration_since(at) >= config.pin_ttl * 2);
    let shed = state
        .membership
        .shed_count(owned.len() as u32, config.partitions, now) as usize;
    state.owned = owned.len() as u32;
    tell_members(state, now);
    // Every round, for owners restarted since.
    tell_holding(state, now, true);
    if settled && shed > 0 {
        for (partition, owner) in owned.iter().rev().take(shed) {
            tracing::info!(partition, node = %config.node_id, owned = owned.len(), "handing a partition off to balance the processes");
            let _ = owner.cast(OwnerMsg::HandOff);
        }
        state.last_hand_off = Some(now);
    }
}

/// Tells the crash watch who is live, and chooses the partitions this process stands by for
/// again, when the members changed.
fn tell_members(state: &mut SystemState, now: Instant) {
    let incarnations = state.membership.incarnations(now);
    state.peers.send_if_modified(|peers| {
        let changed = *peers != incarnations;
        if changed {
            *peers = incarnations;
        }
        changed
    });
    let live = state.membership.live(now);
    let changed = state.members.send_if_modified(|members| {
        let changed = members.as_ref() != Some(&live);
        if changed {
            *members = Some(live.clone());
        }
        changed
    });
    if changed {
        let config = &state.shared.config;
        state.standing_by = crate::runtime::balance::standing_by(
            &config.node_id,
            &live,
            config.partitions,
            config.standbys,
        );
    }
}

/// Tells each owner whether its standby pauses its pulls: when this process holds back (another
/// owns two fewer partitions), or when it is not one of the partition's standbys and is not
/// under its share while another process is over (then it pulls everything, to take what is
/// handed off). `all`: every owner, else only those whose answer changed.
fn tell_holding(state: &mut SystemState, now: Instant, all: bool) {
    let partitions = state.shared.config.partitions;
    let hold_back = state.membership.holds_back(state.owned, now);
    let every = state
        .membership
        .pulls_every_partition(state.owned, partitions, now);
    let mut paused = 0;
    for (partition, owner) in state.owners.iter().enumerate() {
        let hold = hold_back || !(every || state.standing_by[partition]);
        paused += usize::from(hold);
        if (all || hold != state.holding[partition])
            && let Some(owner) = owner
        {
            let _ = owner.cast(OwnerMsg::HoldBack(hold));
        }
        state.holding[partition] = hold;
    }
    tracing::trace!(node = %state.shared.config.node_id, hold_back, every, paused, owned = state.owned, "standbys told whether to pull");
}

/// Writes out what the client still buffers, for at most a second (best effort: a stop does not
/// wait on a server that is gone).
async fn flush(shared: &Shared) {
    let _ = tokio::time::timeout(Duration::from_secs(1), shared.client.flush()).await;
}

/// Says `heartbeat` on `<t>.nodes` (core NATS, best effort: the next one follows a pin TTL
/// later).
async fn publish_heartbeat(shared: &Shared, heartbeat: &Heartbeat) {
    heartbeat.publish(&shared.client, &shared.names).await;
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
