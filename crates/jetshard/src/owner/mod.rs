//! The shard-owner actor of one partition in one process.
//!
//! Every process runs one owner per partition. All of them pull; the server pins one, and that
//! one owns the partition: it claims a new generation, rebuilds the partition's state, recovers
//! what earlier owners held, and hands commands to one actor per entity.
//!
//! - [`phase`]: the owner's phases (a diagram) and what it holds in each;
//! - [`acquire`]: claim, rebuild (quarantining entities whose records cannot be read back),
//!   recovery of the in-flight window;
//! - [`route`]: each entity's commands in hand, handed to its actor in order;
//! - [`settle`]: the failure policy, a pure function from an entity's verdict to effects (ack,
//!   nak, give up, retry, step down), unit-tested without a server.
//!
//! This file is the actor: it receives the pull loop's signals and the entity actors' reports,
//! and carries out the effects [`settle`] decides.
//!
//! Architecture Invariant: a partition's state lives in exactly one owner actor (and its entity
//! actors); the owner is the only place that acknowledges, naks or terminates its commands, and
//! it does so only while it holds the partition under the generation the outcome was produced
//! with.

mod acquire;
mod dormant;
mod isolate;
mod phase;
mod query;
mod route;
mod settle;

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::Context;
use async_nats::jetstream::message::AckKind;
use async_nats::jetstream::stream::Stream;
use async_nats::{Client, Subject};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::command::CommandOutcome;
use crate::config::ShardConfig;
use crate::entity::{Entity, EntityId};
use crate::entity_actor::{
    EntityContext, EntityReport, Outcome, Passivated, Reporter, Seed, SnapshotPolicy,
};
use crate::fence;
use crate::group_commit::{CommitStats, Mode};
use crate::health::{HealthBoard, PartitionHealth};
use crate::journal::JournalWriter;
use crate::pin::{self, Delivery, PinSignal, PullLoop, PullSettings};
use crate::reply::{Detail, ReplyBody};
use crate::retry::RestartWindow;
use crate::status::{OwnershipChange, OwnershipEvent, PartitionStatus, QuarantinedEntity};
use crate::telemetry::{self, Load, PartitionMetrics};
use crate::timer::{self, Timers};
use crate::trace::TraceParent;
use crate::wire::{HDR_TRACEPARENT, Names, PRIORITY_GROUP};
use dormant::Dormant;
use isolate::{Isolation, Next};
use phase::{Counters, Owning, Phase, Refused, Release};
use route::{Blocked, Pending};
use settle::{Effect, Head, Policy, StepDown};

/// What one entity type's owners share.
pub(crate) struct Shared {
    pub(crate) js: Context,
    pub(crate) client: Client,
    pub(crate) names: Arc<Names>,
    pub(crate) config: ShardConfig,
    pub(crate) command_stream: Stream<()>,
    pub(crate) journal_stream: Stream<()>,
    pub(crate) events: broadcast::Sender<OwnershipEvent>,
    /// Live entity actors over all partitions of this system (for the resident cap).
    pub(crate) resident: Arc<AtomicUsize>,
    /// Dormant entity states over all partitions of this system (for their budget).
    pub(crate) dormant: Arc<AtomicUsize>,
    /// Entity loads in flight over all partitions of this system.
    pub(crate) loads: Arc<tokio::sync::Semaphore>,
    /// This process's run of the shard system: it answers on `<t>.alive.<incarnation>`, and its
    /// fence records name it.
    pub(crate) incarnation: String,
    /// Each owner's phase, for [`ShardSystem::health`](crate::ShardSystem::health).
    pub(crate) health: Arc<HealthBoard>,
    /// Other processes this one found dead (see [`crate::crash`]).
    pub(crate) deaths: Arc<crate::crash::Deaths>,
}

/// The owner's messages.
pub(crate) enum OwnerMsg {
    /// From the pull loop.
    Pin(PinSignal),
    /// From an entity actor.
    Entity(EntityReport),
    /// Periodic upkeep: in-progress extension, passivation, retries, release deadline.
    Tick,
    /// Graceful stop: finish in-flight commands, release the pin, reply, stop.
    Release(RpcReplyPort<()>),
    /// Balancing: hand the partition to another process (as a graceful stop does), then stay
    /// out of it for a while before pulling again.
    HandOff,
    /// Balancing, every pin TTL: whether this process owns enough while another owns too little,
    /// so that a standby here stops pulling (`true`) and the partitions handed off go to the
    /// process that lacks them, not back and forth between the others (see `balance.rs`).
    HoldBack(bool),
    /// A snapshot for status displays.
    Status(RpcReplyPort<PartitionStatus>),
    /// A state query for one of the partition's entities (`<t>.query.<p>.<id>`).
    Query(crate::query::Query),
    /// The partition's armed timers, read from the journal on acquisition (`find_timers`).
    TimersFound {
        generation: u64,
        found: Vec<(EntityId, Box<str>, timer::Armed)>,
    },
}

pub(crate) struct OwnerArgs {
    pub(crate) shared: Arc<Shared>,
    pub(crate) partition: u32,
}

pub(crate) struct OwnerActor<E>(PhantomData<fn() -> E>);

impl<E> OwnerActor<E> {
    pub(crate) fn new() -> Self {
        Self(PhantomData)
    }
}

pub(crate) struct OwnerState<E: Entity> {
    partition: u32,
    shared: Arc<Shared>,
    myself: ActorRef<OwnerMsg>,
    pull: PullLoop,
    ticker: JoinHandle<()>,
    /// Hands the partition's state queries to this owner.
    queries: JoinHandle<()>,
    /// Publishes the outbox messages earlier owners left unconfirmed (`outbox::recover`), from
    /// the last acquisition; stopped with the owner or at the next acquisition.
    outbox_recovery: Option<JoinHandle<()>>,
    /// Reads the partition's armed timers from the journal (`find_timers`), from the last
    /// acquisition; stopped with the owner or at the next acquisition.
    timer_scan: Option<JoinHandle<()>>,
    /// The armed timers of the partition while this owner holds it (`timer.rs`).
    timers: Timers,
    phase: Phase<E>,
    policy: Policy,
    counters: Counters,
    /// What the partition's group commits came to, over every generation.
    commits: Arc<CommitStats>,
    metrics: PartitionMetrics,
    /// The pin of the last delivery (for `jetshard_pin_changes_total`).
    last_pin: Option<Arc<str>>,
    /// The generation this owner handed off, while it cools down: queries get "moving" until
    /// a newer claim exists.
    handed_off: Option<u64>,
    /// The balancing's last word: standbys of this process hold back.
    hold_back: bool,
    /// Whether this owner's pulls are paused as a standby holding back.
    holding: bool,
    /// The last pin this standby was given while holding back, and gave back.
    declined: Option<Arc<str>>,
}

impl<E: Entity> Drop for OwnerState<E> {
    fn drop(&mut self) {
        self.ticker.abort();
        self.queries.abort();
        if let Some(recovery) = &self.outbox_recovery {
            recovery.abort();
        }
        if let Some(scan) = &self.timer_scan {
            scan.abort();
        }
    }
}

impl<E: Entity> Actor for OwnerActor<E> {
    type Msg = OwnerMsg;
    type State = OwnerState<E>;
    type Arguments = OwnerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<OwnerMsg>,
        args: OwnerArgs,
    ) -> Result<OwnerState<E>, ActorProcessingErr> {
        let config = &args.shared.config;
        let settings = PullSettings {
            batch: config.pull_batch,
            expires: config.pull_expires(),
        };
        // Subscribed first: a failure here leaves nothing running.
        let queries = {
            let myself = myself.clone();
            let subject = args.shared.names.partition_queries(args.partition);
            crate::query::listen(&args.shared.client, subject, move |query| {
                myself.cast(OwnerMsg::Query(query)).is_ok()
            })
            .await?
        };
        let sink = {
            let myself = myself.clone();
            move |signal| myself.cast(OwnerMsg::Pin(signal)).is_ok()
        };
        let pull = pin::start(
            args.shared.js.clone(),
            &args.shared.names.command_stream,
            &args.shared.names.consumer(args.partition),
            settings,
            sink,
        );
        let tick = (config.ack_wait / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
        let ticker = myself.send_interval(tick, || OwnerMsg::Tick);
        let policy = Policy {
            max_deliver: u64::from(config.max_deliver),
            retry_delay: config.retry_delay,
            ack_wait: config.ack_wait,
        };
        args.shared
            .health
            .set(args.partition, PartitionHealth::Standby);
        let metrics = PartitionMetrics::new(&config.entity_type, args.partition);
        metrics.set_load(None);
        Ok(OwnerState {
            metrics,
            last_pin: None,
            hold_back: false,
            holding: false,
            declined: None,
            partition: args.partition,
            shared: args.shared,
            myself,
            pull,
            ticker,
            queries,
            outbox_recovery: None,
            timer_scan: None,
            timers: Timers::default(),
            phase: Phase::Standby,
            handed_off: None,
            policy,
            counters: Counters::default(),
            commits: Arc::default(),
        })
    }

    async fn handle(
        &self,
        _: ActorRef<OwnerMsg>,
        message: OwnerMsg,
        state: &mut OwnerState<E>,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            OwnerMsg::Pin(PinSignal::Delivered(delivery)) => state.on_delivery(delivery).await,
            OwnerMsg::Pin(PinSignal::Lost { pin }) => {
                state.step_down_under(&pin, StepDown::PinLost).await
            }
            // The lost delivery comes back only after the ack wait, behind later ones. Take the
            // partition afresh: a new generation and the recovery of every unacknowledged
            // command, in order, before anything newer.
            OwnerMsg::Pin(PinSignal::Gap { pin }) => {
                state.step_down_under(&pin, StepDown::DeliveriesLost).await
            }
            OwnerMsg::Pin(PinSignal::Idle) => {
                if let Phase::Releasing(release, _) = &mut state.phase {
                    release.pulls_idle = true;
                }
                state.finish_release_if_drained().await;
            }
            OwnerMsg::Pin(PinSignal::Ended { reason }) => {
                let ended = state.on_pull_loop_ended(reason).await;
                state.post_health();
                return ended;
            }
            OwnerMsg::Entity(EntityReport::Outcome(outcome)) => {
                let settled = state.on_outcome(outcome).await;
                // The entity may be idle now: under a burst every resident entity can be busy
                // at each dispatch, and done at once (one group commit).
                state.keep_resident_cap();
                state.post_health();
                return settled;
            }
            OwnerMsg::Entity(EntityReport::Passivated(passivated)) => {
                state.on_passivated(passivated);
                // Releasing: the entity's snapshot is written; the release may be done.
                state.finish_release_if_drained().await;
            }
            OwnerMsg::Tick => state.on_tick().await,
            OwnerMsg::Release(reply) => state.start_release(Some(reply)).await,
            OwnerMsg::HandOff => {
                if matches!(state.phase, Phase::Owning(_)) {
                    state.start_release(None).await;
                }
            }
            OwnerMsg::HoldBack(hold_back) => {
                state.hold_back = hold_back;
                state.hold_standby();
            }
            OwnerMsg::Status(reply) => {
                let _ = reply.send(state.status());
            }
            OwnerMsg::Query(query) => {
                let shared = Arc::clone(&state.shared);
                let supervisor = state.myself.get_cell();
                // Not owning: stay silent (the owner answers), unless this owner handed the
                // partition off and nobody has claimed it since: then "moving, ask again".
                if let Some(o) = state.phase.owning() {
                    query::route(o, &shared.client, &supervisor, &shared.resident, query);
                } else if let (Phase::CoolingDown(_), Some(generation)) =
                    (&state.phase, state.handed_off)
                {
                    let partition = state.partition;
                    tokio::spawn(async move {
                        crate::query::moving(
                            &shared.client,
                            &shared.journal_stream,
                            &shared.names,
                            partition,
                            generation,
                            query,
                        )
                        .await;
                    });
                }
                state.keep_resident_cap();
            }
            OwnerMsg::TimersFound { generation, found } => {
                let current = state.phase.owning_ref().map(|o| o.generation);
                if current == Some(generation) {
                    tracing::debug!(
                        partition = state.partition,
                        armed = found.len(),
                        "armed timers read"
                    );
                    state.timers.found(found);
                }
            }
        }
        state.post_health();
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _: ActorRef<OwnerMsg>,
        event: SupervisionEvent,
        state: &mut OwnerState<E>,
    ) -> Result<(), ActorProcessingErr> {
        // Entity actors report every command's failure themselves, in order (their handling
        // runs under `catch_unwind`). An actor that dies otherwise takes its state with it and
        // blames no command: its commands in hand go to a new actor revived from the journal.
        let SupervisionEvent::ActorFailed(cell, error) = event else {
            return Ok(());
        };
        let partition = state.partition;
        let Some(o) = state.phase.owning() else {
            return Ok(());
        };
        let id = cell.get_id();
        let Some((entity, slot)) = o.entities.iter_mut().find(|(_, slot)| {
            slot.returning == Some(id)
                || slot.actor.as_ref().is_some_and(|r| r.actor.get_id() == id)
        }) else {
            return Ok(());
        };
        tracing::error!(partition, %entity, %error, "entity actor died; its state is revived from the journal");
        let entity = entity.clone();
        slot.returning = None;
        slot.actor = None;
        state.dispatch(&entity);
        Ok(())
    }
}

impl<E: Entity> OwnerState<E> {
    fn config(&self) -> &ShardConfig {
        &self.shared.config
    }

    /// Posts this owner's phase on the system's health board.
    fn post_health(&self) {
        let health = match &self.phase {
            Phase::Standby => PartitionHealth::Standby,
            Phase::Refused(_) => PartitionHealth::Refused,
            Phase::Owning(o) if o.isolation.is_some() => PartitionHealth::Isolating,
            Phase::Owning(_) => PartitionHealth::Serving,
            Phase::Releasing(..) => PartitionHealth::Releasing,
            Phase::CoolingDown(_) => PartitionHealth::CoolingDown,
        };
        self.shared.health.set(self.partition, health);
    }

    /// Sets the partition's gauges: entities and commands in hand.
    fn post_load(&self) {
        let load = self.phase.owning_ref().map(|o| Load {
            owned: true,
            resident: o.entities.values().filter(|s| s.actor.is_some()).count(),
            dormant: o.dormant.len(),
            quarantined: o.quarantined.len(),
            ack_pending: o.entities.values().map(|s| s.queue.len()).sum(),
        });
        self.metrics.set_load(load);
    }

    async fn on_delivery(&mut self, delivery: Delivery) {
        if self.last_pin.as_ref() != Some(&delivery.pin) {
            if self.last_pin.is_some() {
                self.metrics.pin_changes.increment(1);
            }
            self.last_pin = Some(delivery.pin.clone());
        }
        let pending = delivery.pending as f64;
        if matches!(self.phase, Phase::Releasing(..) | Phase::CoolingDown(_)) {
            // Handing over: let the next owner have it soon.
            acknowledge(
                &self.shared.client,
                self.partition,
                delivery.reply,
                AckKind::Nak(Some(Duration::from_millis(100))),
            )
            .await;
            return;
        }
        let moved = matches!(&self.phase, Phase::Owning(o) if o.pin != delivery.pin);
        if moved {
            self.step_down(StepDown::PinMoved).await;
        }
        match &mut self.phase {
            Phase::Owning(_) => self.deliver(delivery).await,
            Phase::Refused(refused) if refused.pin == delivery.pin => {
                // Not ours to process; back to the server soon for whoever owns it.
                refused.last_delivery = Some(Instant::now());
                let nak = AckKind::Nak(Some(self.policy.retry_delay));
                acknowledge(&self.shared.client, self.partition, delivery.reply, nak).await;
            }
            Phase::Standby if self.holding => self.decline(delivery).await,
            _ => self.acquire(delivery).await,
        }
        if matches!(self.phase, Phase::Owning(_)) {
            self.metrics.pending.set(pending);
        }
    }

    /// Takes a delivery while owning: routed at once, or, in isolation, when its turn comes.
    async fn deliver(&mut self, delivery: Delivery) {
        let Some(o) = self.phase.owning() else { return };
        let Some(isolation) = &mut o.isolation else {
            return self.route_delivery(delivery, None).await;
        };
        if let Some(now) = isolation.offer(delivery) {
            self.route_delivery(now, None).await;
        }
        self.step_isolation().await;
    }

    /// Runs the next command of an isolated acquisition once the one before is settled, and
    /// ends the isolation when all are.
    async fn step_isolation(&mut self) {
        loop {
            let Some(o) = self.phase.owning() else { return };
            if let Some(running) = o.isolation.as_ref().and_then(Isolation::running) {
                if o.entities
                    .values()
                    .any(|s| s.queue.iter().any(|p| p.seq == running))
                {
                    return;
                }
                if let Some(isolation) = &mut o.isolation {
                    isolation.settled(running);
                }
            }
            let Some(isolation) = &mut o.isolation else {
                return;
            };
            match isolation.next(Instant::now()) {
                Next::Wait => return,
                Next::Run(delivery) => {
                    let give_up = o
                        .suspect
                        .take_if(|(seq, _)| *seq == delivery.seq)
                        .map(|(_, reason)| reason);
                    self.route_delivery(delivery, give_up).await;
                }
                Next::Done(rest) => {
                    tracing::info!(partition = self.partition, "isolation over");
                    o.isolation = None;
                    for delivery in rest {
                        self.route_delivery(delivery, None).await;
                    }
                    return;
                }
            }
        }
    }

    /// Routes a delivered command to its entity (to be given up, with `give_up`); one whose
    /// subject holds no valid entity id is given up at once, with a dead-letter record naming
    /// what the subject held.
    async fn route_delivery(&mut self, delivery: Delivery, give_up: Option<String>) {
        let partition = self.partition;
        if delivery.wake {
            // It has done its work: this owner holds the partition and fires its due timers.
            acknowledge(&self.shared.client, partition, delivery.reply, AckKind::Ack).await;
            return;
        }
        let subject = delivery.subject.clone();
        let mut pending = Pending::delivered(delivery);
        pending.give_up = give_up.map(Into::into);
        let Some(o) = self.phase.owning() else { return };
        pending.deliveries = pending
            .deliveries
            .max(u64::from(fence::claims_holding(&o.held, pending.seq)) + 1);
        let named = Names::entity_of_subject(&subject).unwrap_or_default();
        match EntityId::new(named) {
            Ok(entity) => self.route(&entity, pending),
            Err(invalid) => {
                tracing::warn!(partition, %subject, %invalid, "command subject holds no valid entity id; dead-lettered");
                let reason = format!("the subject holds no valid entity id: {invalid}");
                self.give_up_without_entity(named, pending, reason).await;
            }
        }
    }

    /// Queues a command for its entity and hands it on unless the entity waits.
    fn route(&mut self, entity: &EntityId, mut pending: Pending) {
        let Some(o) = self.phase.owning() else { return };
        if let Some(q) = o.quarantined.get(entity) {
            pending
                .give_up
                .get_or_insert_with(|| q.dead_letter_reason().into());
        }
        if route::enqueue(o, entity, pending) {
            self.dispatch(entity);
        }
    }

    /// Hands an entity its commands in hand (starting its actor if needed), then keeps the
    /// resident cap.
    fn dispatch(&mut self, entity: &EntityId) {
        let supervisor = self.myself.get_cell();
        let resident = &self.shared.resident;
        let Some(o) = self.phase.owning() else { return };
        route::dispatch(o, entity, &supervisor, resident);
        self.keep_resident_cap();
    }

    /// Passivates idle entities, least recently active first, while more than the resident
    /// cap are live (down to 90% of it).
    fn keep_resident_cap(&mut self) {
        let Some(cap) = self.shared.config.max_resident_entities else {
            return;
        };
        let live = self.shared.resident.load(Ordering::Relaxed);
        if live > cap
            && let Some(o) = self.phase.owning()
        {
            route::evict_idle(o, live - cap * 9 / 10);
        }
    }

    /// Takes the partition: a new generation, the state rebuilt, the previous owners'
    /// unacknowledged commands recovered in order. `first` is the delivery that showed the pin.
    async fn acquire(&mut self, first: Delivery) {
        let started = Instant::now();
        let partition = self.partition;
        let node = self.config().node_id.clone();
        let pin = first.pin.clone();
        let first_new = (first.deliveries == 1).then_some(first.seq);
        self.shared
            .health
            .set(partition, PartitionHealth::Acquiring);
        let acquired = acquire::claim(&self.shared, partition, &pin, first_new).await;
        let acquired = match acquired {
            Ok(acquired) => acquired,
            Err(e) => {
                self.counters.failed_acquisitions += 1;
                self.metrics.acquisition_failed.increment(1);
                tracing::error!(partition, node = %node, error = %e, "cannot take the partition; releasing the pin");
                self.refuse(pin, true).await;
                return;
            }
        };
        let fence = acquired.claimed.fence;
        let journal = JournalWriter::new(
            self.shared.js.clone(),
            self.shared.names.clone(),
            partition,
            fence,
            Mode::for_replicas(self.shared.config.replicas),
            self.commits.clone(),
            self.metrics.commit.clone(),
        );
        let report: Reporter = {
            let owner = self.myself.clone();
            Arc::new(move |report| {
                // The owner is gone only when the partition is being dropped: nobody to tell.
                let _ = owner.cast(OwnerMsg::Entity(report));
            })
        };
        let context = Arc::new(EntityContext {
            partition,
            journal,
            journal_stream: self.shared.journal_stream.clone(),
            client: self.shared.client.clone(),
            names: self.shared.names.clone(),
            codec: self.shared.config.codec,
            report,
            snapshots: SnapshotPolicy {
                every: self.shared.config.snapshot_every,
                on_passivation: self.shared.config.snapshot_on_passivation,
            },
            loads: Arc::clone(&self.shared.loads),
            metrics: self.metrics.command.clone(),
        });
        let recovery = tokio::spawn(crate::outbox::recover(
            self.shared.js.clone(),
            self.shared.journal_stream.clone(),
            self.shared.names.clone(),
            partition,
            context.journal.clone(),
        ));
        if let Some(previous) = self.outbox_recovery.replace(recovery) {
            previous.abort();
        }
        let trial = acquired.claimed.trial;
        let isolation = trial.map(|_| {
            let held = acquired.recovered.iter().map(|(_, p)| p.seq);
            Isolation::new(held, Instant::now() + self.shared.config.ack_wait * 2)
        });
        let suspect = trial.and_then(|t| {
            let deliveries = acquired
                .recovered
                .iter()
                .find(|(_, p)| p.seq == t.seq)
                .map_or(0, |(_, p)| p.deliveries);
            settle::suspect(t.runs, deliveries, &self.policy).map(|reason| (t.seq, reason))
        });
        if let Some(t) = trial {
            tracing::warn!(
                partition,
                generation = fence.generation,
                first_in_hand = t.seq,
                runs = t.runs,
                suspect = suspect.is_some(),
                "commands were in hand at two takeovers in a row: running them one at a time"
            );
        }
        self.phase = Phase::Owning(Box::new(Owning {
            generation: fence.generation,
            pin,
            context,
            dormant: Dormant::new(Arc::clone(&self.shared.dormant)),
            quarantined: HashMap::new(),
            entities: HashMap::new(),
            crashes: RestartWindow::new(
                self.shared.config.max_entity_restarts,
                self.shared.config.restart_window,
            ),
            held: acquired.claimed.held,
            isolation,
            suspect,
        }));
        self.timers = Timers::default();
        self.find_timers(partition, fence.generation);
        self.counters.acquisitions += 1;
        self.metrics.acquired.increment(1);
        telemetry::record(&self.metrics.acquire_seconds, started.elapsed());
        self.post_load();
        tracing::info!(
            partition,
            generation = fence.generation,
            node = %node,
            // Nothing is replayed at acquisition any more (entities load on their first
            // command); the fields stay for the readers of this line (jetshard-bench).
            rebuilt_events = 0u64,
            recovered = acquired.recovered.len(),
            replay_ms = 0u64,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "acquired partition"
        );
        let _ = self.shared.events.send(OwnershipEvent {
            partition,
            generation: fence.generation,
            node,
            change: OwnershipChange::Acquired,
        });

        if trial.is_some() {
            // In isolation, the commands earlier owners held run as the server delivers them
            // again, one at a time.
            return self.deliver(first).await;
        }
        // The previous owners' unacknowledged commands, and the first delivery, in stream order.
        let first_seq = first.seq;
        let mut first = Some(first);
        for (entity, pending) in acquired.recovered {
            if let Some(f) = first.take_if(|f| f.seq <= pending.seq) {
                self.route_delivery(f, None).await;
            }
            if pending.seq != first_seq {
                self.route(&entity, pending);
            }
        }
        if let Some(f) = first {
            self.route_delivery(f, None).await;
        }
    }

    async fn on_outcome(&mut self, mut outcome: Outcome) -> Result<(), ActorProcessingErr> {
        let partition = self.partition;
        let policy = self.policy;
        let Some(o) = self.phase.owning() else {
            return Ok(());
        };
        if outcome.generation != o.generation {
            return Ok(());
        }
        self.timers
            .report(&outcome.entity, std::mem::take(&mut outcome.timers));
        let Some(o) = self.phase.owning() else {
            return Ok(());
        };
        let entity = outcome.entity;
        let Some(slot) = o.entities.get_mut(&entity) else {
            return Ok(());
        };
        let Some(head) = slot.queue.iter().find(|p| p.seq == outcome.seq) else {
            return Ok(());
        };
        slot.last_active = Instant::now();
        let head = Head {
            seq: head.seq,
            deliveries: head.deliveries,
            attempts: head.attempts,
            delivered: head.reply.is_some(),
        };
        let stopped = matches!(
            outcome.verdict,
            crate::entity_actor::Verdict::Fenced | crate::entity_actor::Verdict::Failed(_)
        ) || outcome.quarantine.is_some();
        if stopped {
            // The actor has stopped, and its state with it: its next actor loads the entity.
            slot.actor = None;
        }
        match &outcome.verdict {
            crate::entity_actor::Verdict::Applied { events } => {
                self.counters.applied += 1;
                self.counters.events_written += *events as u64;
                self.metrics.applied.increment(1);
                self.metrics.events_written.increment(*events as u64);
            }
            crate::entity_actor::Verdict::Duplicate { .. } => {
                self.counters.duplicates += 1;
                self.metrics.duplicate.increment(1);
            }
            crate::entity_actor::Verdict::Rejected(reason) => {
                self.counters.rejected += 1;
                self.metrics.rejected.increment(1);
                tracing::debug!(partition, %entity, cmd_seq = outcome.seq, %reason, "command rejected");
            }
            crate::entity_actor::Verdict::DeadLettered(reason) => {
                self.counters.dead_lettered += 1;
                self.metrics.dead_lettered.increment(1);
                tracing::warn!(partition, %entity, cmd_seq = outcome.seq, %reason, "command dead-lettered and terminated");
            }
            crate::entity_actor::Verdict::Failed(failure) => {
                if matches!(failure, crate::entity_actor::Failure::Unconfirmed(_)) {
                    self.counters.unconfirmed_writes += 1;
                    self.metrics.unconfirmed_writes.increment(1);
                }
                tracing::warn!(partition, %entity, cmd_seq = outcome.seq, deliveries = head.deliveries, ?failure, "command failed");
            }
            crate::entity_actor::Verdict::Fenced => {}
        }
        let mut effects = settle::settle(&head, outcome.verdict, &policy, Instant::now());
        if let Some(q) = outcome.quarantine {
            effects.insert(0, Effect::Quarantine(q));
        }
        self.carry_out(&entity, outcome.seq, effects, outcome.detail)
            .await?;
        // The actor stopped: commands queued behind the settled one (cast to it while it was
        // stopping) go to a new actor, unless the entity waits.
        let idle_actor = self
            .phase
            .owning()
            .and_then(|o| o.entities.get(&entity))
            .is_some_and(|slot| slot.actor.is_none());
        if stopped && idle_actor {
            self.dispatch(&entity);
        }
        Ok(())
    }

    /// Carries out what [`settle::settle`] decided for command `seq` of `entity`.
    async fn carry_out(
        &mut self,
        entity: &EntityId,
        seq: u64,
        effects: Vec<Effect>,
        detail: Option<Detail>,
    ) -> Result<(), ActorProcessingErr> {
        let partition = self.partition;
        for effect in effects {
            let Some(o) = self.phase.owning() else {
                break;
            };
            let Some(slot) = o.entities.get_mut(entity) else {
                break;
            };
            let position = slot.queue.iter().position(|p| p.seq == seq);
            match effect {
                Effect::Finish { terminate, answer } => {
                    let Some(done) = position.and_then(|at| slot.queue.remove(at)) else {
                        continue;
                    };
                    if let Some(reply) = done.reply {
                        let kind = if terminate {
                            AckKind::Term
                        } else {
                            AckKind::Ack
                        };
                        if o.isolation.is_some() {
                            // The next command runs only once this one is surely off the
                            // consumer's books: the next claim must find the one running first.
                            let timeout = self.shared.config.write_timeout;
                            acknowledge_confirmed(
                                &self.shared.client,
                                partition,
                                reply,
                                kind,
                                timeout,
                            )
                            .await;
                        } else {
                            acknowledge(&self.shared.client, partition, reply, kind).await;
                        }
                    }
                    if let Some(to) = done.respond_to {
                        let trace = done.trace.map(|t| t.span);
                        respond(&self.shared.client, to, answer, detail.as_ref(), trace).await;
                    }
                }
                Effect::GiveUp { reason } => {
                    if let Some(pending) = position.and_then(|at| slot.queue.get_mut(at)) {
                        pending.give_up = Some(reason.into());
                    }
                    slot.blocked = None;
                    self.dispatch(entity);
                }
                Effect::RetryAt(at) => {
                    if let Some(pending) = position.and_then(|at| slot.queue.get_mut(at)) {
                        pending.attempts += 1;
                    }
                    slot.blocked = Some(Blocked::Retry { at });
                }
                Effect::Nak(delay) => {
                    let reply = position
                        .and_then(|at| slot.queue.get_mut(at))
                        .and_then(|p| p.reply.take());
                    slot.blocked = Some(Blocked::Redelivery {
                        seq,
                        since: Instant::now(),
                    });
                    if let Some(reply) = reply {
                        acknowledge(
                            &self.shared.client,
                            self.partition,
                            reply,
                            AckKind::Nak(Some(delay)),
                        )
                        .await;
                    }
                }
                Effect::AwaitRedelivery => {
                    slot.blocked = Some(Blocked::Redelivery {
                        seq,
                        since: Instant::now(),
                    });
                }
                Effect::CountCrash => {
                    if o.crashes.exceeded(Instant::now()) {
                        let (generation, crashes) = (o.generation, o.crashes.count());
                        // Give the partition up at once: another process may fare better.
                        self.step_down(StepDown::CrashLoop).await;
                        return Err(format!("partition {partition} generation {generation}: {crashes} entity crashes within the restart window").into());
                    }
                }
                Effect::Quarantine(quarantine) => {
                    tracing::error!(partition, %entity, journal_seq = quarantine.journal_seq, reason = %quarantine.reason, "entity quarantined");
                    o.dormant.forget(entity);
                    o.quarantined.insert(entity.clone(), quarantine);
                }
                Effect::StepDown(reason) => self.step_down(reason).await,
            }
        }
        self.step_isolation().await;
        self.finish_release_if_drained().await;
        Ok(())
    }

    /// Gives up a command that belongs to no entity (its subject holds no valid id): a
    /// dead-letter record, then terminated. If the record cannot be written now, the command
    /// goes back to the server to be delivered again.
    async fn give_up_without_entity(&mut self, named: &str, pending: Pending, reason: String) {
        let Some(o) = self.phase.owning() else { return };
        let journal = o.context.journal.clone();
        let written = journal
            .dead_letter(
                named,
                pending.seq,
                pending.deliveries,
                &reason,
                pending.payload.clone(),
            )
            .await;
        match written {
            Ok(()) => {
                self.counters.dead_lettered += 1;
                self.metrics.dead_lettered.increment(1);
                if let Some(reply) = pending.reply {
                    acknowledge(&self.shared.client, self.partition, reply, AckKind::Term).await;
                }
                if let Some(to) = pending.respond_to {
                    let answer = CommandOutcome::DeadLettered {
                        command_seq: pending.seq,
                        reason,
                    };
                    let trace = pending.trace.as_ref().map(|t| t.span);
                    respond(&self.shared.client, to, answer, None, trace).await;
                }
            }
            Err(crate::journal::WriteError::Fenced { .. }) => {
                self.step_down(StepDown::Fenced).await;
            }
            Err(e) => {
                tracing::warn!(partition = self.partition, cmd_seq = pending.seq, error = %e, "dead-letter record not written; the command goes back to the server");
                if let Some(reply) = pending.reply {
                    let nak = AckKind::Nak(Some(self.policy.retry_delay));
                    acknowledge(&self.shared.client, self.partition, reply, nak).await;
                }
            }
        }
    }

    /// Takes a passivated actor's state into the dormant map, and gives the entity a new actor
    /// if commands came in meanwhile.
    fn on_passivated(&mut self, passivated: Passivated) {
        let Some(o) = self.phase.owning() else { return };
        let entity = passivated.entity;
        if passivated.generation != o.generation {
            return;
        }
        let Some(slot) = o.entities.get_mut(&entity) else {
            return;
        };
        if slot.returning.take().is_none() {
            return;
        }
        // Without a state it trusts, the actor hands back nothing: the next actor loads the
        // entity.
        if let Some(seed) = passivated
            .seed
            .and_then(|seed| seed.downcast::<Seed<E>>().ok())
        {
            o.dormant.keep(entity.clone(), *seed);
        }
        if slot.is_idle() {
            o.entities.remove(&entity);
        } else {
            self.dispatch(&entity);
        }
        if let (Some(budget), Some(o)) =
            (self.shared.config.max_dormant_entities, self.phase.owning())
        {
            let evicted = o.dormant.evict_over(budget);
            if evicted > 0 {
                tracing::debug!(
                    partition = self.partition,
                    generation = o.generation,
                    evicted,
                    "dormant states over the budget dropped"
                );
            }
        }
    }

    /// Reads the partition's armed timers from the journal in a task of its own (entities load
    /// lazily: the owner cannot learn them from loaded states), retried until it succeeds or
    /// the partition is acquired again or dropped; the owner arms them when they come back.
    fn find_timers(&mut self, partition: u32, generation: u64) {
        let (journal, names) = (
            self.shared.journal_stream.clone(),
            self.shared.names.clone(),
        );
        let owner = self.myself.clone();
        let scan = tokio::spawn(async move {
            let mut backoff = Duration::from_millis(200);
            loop {
                match timer::armed_in_partition(&journal, &names, partition).await {
                    Ok(found) => {
                        let _ = owner.cast(OwnerMsg::TimersFound { generation, found });
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(partition, error = %e, "armed timers not read; trying again");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                    }
                }
            }
        });
        if let Some(previous) = self.timer_scan.replace(scan) {
            previous.abort();
        }
    }

    /// Publishes the commands of the partition's due timers (their entities decide whether they
    /// still hold: `timer.rs`).
    async fn fire_timers(&mut self) {
        if self.phase.owning_ref().is_none() {
            return;
        }
        let now_ms = timer::unix_ms(std::time::SystemTime::now());
        for (entity, name, armed) in self.timers.due(now_ms, Instant::now()) {
            tracing::debug!(partition = self.partition, %entity, timer = %name, set_seq = armed.set_seq, "timer due");
            timer::fire(&self.shared.js, &self.shared.names, &entity, &name, &armed).await;
        }
    }

    async fn on_tick(&mut self) {
        let config = self.shared.config.clone();
        let now = Instant::now();
        match &mut self.phase {
            Phase::CoolingDown(until) if now >= *until => {
                self.phase = Phase::Standby;
                self.holding = self.hold_back;
                self.pull.pause(self.holding);
            }
            Phase::Releasing(release, _) if now >= release.deadline => {
                tracing::warn!(
                    partition = self.partition,
                    "release deadline passed with commands in flight; they will be redelivered"
                );
                self.finish_release().await;
                return;
            }
            Phase::Refused(refused) if refused.wants_unpin(config.pin_ttl) => {
                tracing::warn!(
                    partition = self.partition,
                    "still pinned under a pin this process stepped down from; releasing it"
                );
                refused.unpinned = unpin(&self.shared, self.partition).await;
            }
            _ => {}
        }
        self.step_isolation().await;
        self.post_load();
        self.fire_timers().await;
        let partition = self.partition;
        let Some(o) = self.phase.owning() else { return };
        let mut progress = Vec::new();
        let mut idle = Vec::new();
        let mut stuck = Vec::new();
        let mut due = Vec::new();
        for (entity, slot) in &mut o.entities {
            for pending in &mut slot.queue {
                if let Some(reply) = &pending.reply
                    && now.duration_since(pending.progress_at) >= config.ack_wait / 2
                {
                    // Still in hand (waiting its turn, or slow): not to be redelivered yet.
                    pending.progress_at = now;
                    progress.push(reply.clone());
                }
            }
            match slot.blocked {
                Some(Blocked::Redelivery { seq, since })
                    if now.duration_since(since) > config.ack_wait * 2 + Duration::from_secs(1) =>
                {
                    stuck.push((entity.clone(), seq));
                }
                Some(Blocked::Retry { at }) if now >= at => due.push(entity.clone()),
                _ => {}
            }
            if slot.is_idle() && now.duration_since(slot.last_active) >= config.passivate_after {
                idle.push(entity.clone());
            }
        }
        for entity in idle {
            route::passivate(o, &entity);
        }
        for reply in progress {
            acknowledge(
                &self.shared.client,
                self.partition,
                reply,
                AckKind::Progress,
            )
            .await;
        }
        for entity in due {
            if let Some(slot) = self
                .phase
                .owning()
                .and_then(|o| o.entities.get_mut(&entity))
            {
                slot.blocked = None;
            }
            self.dispatch(&entity);
        }
        for (entity, seq) in stuck {
            // The failed command was never delivered again: give it up so the entity can go on.
            tracing::warn!(partition, %entity, cmd_seq = seq, "a failed command was not redelivered; giving it up");
            let give_up = Effect::GiveUp {
                reason: "failed, and not redelivered".to_owned(),
            };
            let _ = self.carry_out(&entity, seq, vec![give_up], None).await;
        }
    }

    /// The pull loop ended: nothing more will be delivered to this owner. It stops owning, and
    /// fails, so that its supervisor (the shard system) starts a new owner with a new loop, or
    /// escalates if that keeps happening.
    async fn on_pull_loop_ended(&mut self, reason: String) -> Result<(), ActorProcessingErr> {
        if let Phase::Releasing(release, _) = &mut self.phase {
            release.pulls_idle = true;
            self.finish_release_if_drained().await;
            if !matches!(self.phase, Phase::Releasing(..)) {
                return Ok(());
            }
        }
        self.step_down(StepDown::PullLoopEnded).await;
        Err(format!(
            "partition {}: the pull loop ended: {reason}",
            self.partition
        )
        .into())
    }

    /// Begins handing the partition over: no new pulls, commands in hand finished and
    /// acknowledged, new deliveries sent back. `reply`: a graceful stop (the owner stops after);
    /// none: a hand-off (the owner cools down, then pulls again).
    async fn start_release(&mut self, reply: Option<RpcReplyPort<()>>) {
        self.pull.pause(true);
        let deadline = Instant::now() + self.shared.config.ack_wait;
        match &mut self.phase {
            Phase::Releasing(release, _) => {
                // A stop during a hand-off: the stop wins.
                if reply.is_some() {
                    release.reply = reply;
                }
            }
            _ => {
                let owning = self.phase.take_owning();
                let release = Release {
                    reply,
                    deadline,
                    pulls_idle: false,
                };
                self.phase = Phase::Releasing(release, owning);
            }
        }
        self.finish_release_if_drained().await;
    }

    async fn finish_release_if_drained(&mut self) {
        let snapshots = self.snapshots_on_release();
        // Unpinning while a pull of ours without the pin id is still open could pin this
        // process again: wait for the pull loop to be idle (the pulls carrying the pin id are
        // ended by the unpin) as well as for the commands in hand, and, with snapshots, for
        // every entity's snapshot (`route::hand_over`).
        let done = match &mut self.phase {
            Phase::Releasing(release, owning) => {
                let drained = owning
                    .as_deref_mut()
                    .is_none_or(|o| route::hand_over(o, snapshots));
                release.pulls_idle && drained
            }
            _ => false,
        };
        if done {
            self.finish_release().await;
        }
    }

    /// A standby pulls unless the balancing says this process holds back (then it pauses its
    /// pulls until told otherwise). Nothing else pauses a standby's pulls.
    fn hold_standby(&mut self) {
        if matches!(self.phase, Phase::Standby) && self.holding != self.hold_back {
            self.holding = self.hold_back;
            self.pull.pause(self.holding);
        }
    }

    /// Gives back a pin this standby got while holding back (from a pull it sent before): the
    /// delivery goes back to the server, and the pin to a process that lacks partitions, at once.
    /// Cheaper than taking the partition only to hand it off again.
    async fn decline(&mut self, delivery: Delivery) {
        let nak = AckKind::Nak(Some(Duration::from_millis(100)));
        acknowledge(&self.shared.client, self.partition, delivery.reply, nak).await;
        if self.declined.as_ref() == Some(&delivery.pin) {
            return;
        }
        tracing::debug!(
            partition = self.partition,
            "pinned while holding back; giving the pin back"
        );
        self.pull.forget_pin(delivery.pin.clone());
        self.declined = Some(delivery.pin);
        unpin(&self.shared, self.partition).await;
    }

    /// Whether a release passivates every entity first, so that each writes a snapshot of
    /// what it wrote since its last one: the next owner then loads it with one read instead of
    /// its records since that snapshot, while its commands wait.
    fn snapshots_on_release(&self) -> bool {
        E::snapshots().is_some() && self.shared.config.snapshot_on_passivation
    }

    async fn finish_release(&mut self) {
        let owned = self.phase.owning_ref().is_some();
        let handing_off =
            matches!(&self.phase, Phase::Releasing(release, _) if release.reply.is_none());
        if owned {
            unpin(&self.shared, self.partition).await;
            if handing_off || !self.timers.is_empty() {
                // A partition is owned only while it has a command to deliver: a partition
                // handed off with none would stay unowned (no queries answered, no timers
                // fired), and armed timers must not wait for the partition's next command. A
                // stopping process's idle partitions are woken by the others' crash watches
                // once it is gone.
                let partitions = self.shared.config.partitions;
                pin::wake(
                    &self.shared.js,
                    &self.shared.names,
                    self.partition,
                    partitions,
                )
                .await;
            }
        }
        let Phase::Releasing(release, owning) = std::mem::replace(&mut self.phase, Phase::Standby)
        else {
            return;
        };
        let stopping = release.reply.is_some();
        // The release began one ack wait before its deadline.
        let took = self
            .shared
            .config
            .ack_wait
            .saturating_sub(release.deadline.saturating_duration_since(Instant::now()));
        tracing::debug!(
            partition = self.partition,
            owned,
            took_ms = took.as_millis() as u64,
            "released"
        );
        self.handed_off = owning.as_ref().map(|o| o.generation);
        if let Some(o) = owning {
            self.left(
                &o,
                if stopping {
                    StepDown::Released
                } else {
                    StepDown::HandedOff
                },
            );
        }
        match release.reply {
            Some(reply) => {
                let _ = reply.send(());
                self.myself.stop(Some("released".to_owned()));
            }
            None => {
                self.phase = Phase::CoolingDown(Instant::now() + self.shared.config.pin_ttl * 2);
            }
        }
    }

    /// Steps down if this owner holds the partition under `pin`.
    async fn step_down_under(&mut self, pin: &Arc<str>, reason: StepDown) {
        if self.phase.owning_ref().is_some_and(|o| o.pin == *pin) {
            self.step_down(reason).await;
        }
    }

    /// Stops owning: entity actors stopped, state dropped, nothing acknowledged any more under
    /// this generation. Commands in hand stay unacknowledged for the next owner.
    async fn step_down(&mut self, reason: StepDown) {
        let releasing = matches!(self.phase, Phase::Releasing(..));
        let Some(o) = self.phase.take_owning() else {
            return;
        };
        self.left(&o, reason);
        if releasing {
            // The release goes on (pulls paused); there is nothing left to drain.
            self.finish_release_if_drained().await;
            return;
        }
        if reason.refuses_pin() {
            self.refuse(o.pin.clone(), reason == StepDown::CrashLoop)
                .await;
        } else {
            self.phase = Phase::Standby;
        }
    }

    /// Says that this owner left generation `o`, stopping its entity actors.
    fn left(&self, o: &Owning<E>, reason: StepDown) {
        self.myself.stop_children(Some(reason.to_string()));
        self.metrics.step_down(reason.label());
        self.metrics.set_load(None);
        let node = self.config().node_id.clone();
        tracing::info!(partition = self.partition, generation = o.generation, node = %node, %reason, "stepped down");
        let _ = self.shared.events.send(OwnershipEvent {
            partition: self.partition,
            generation: o.generation,
            node,
            change: OwnershipChange::Released {
                reason: reason.to_string(),
            },
        });
    }

    /// Refuses `pin`: the pull loop forgets it, so the server moves it after its TTL whatever
    /// else happens; with `unpin_now`, it is asked to move it at once.
    async fn refuse(&mut self, pin: Arc<str>, unpin_now: bool) {
        self.pull.forget_pin(pin.clone());
        let mut refused = Refused::new(pin);
        if unpin_now {
            refused.unpinned = unpin(&self.shared, self.partition).await;
        }
        self.phase = Phase::Refused(refused);
    }

    fn status(&self) -> PartitionStatus {
        let owning = self.phase.owning_ref();
        let mut quarantined: Vec<QuarantinedEntity> = owning
            .map(|o| {
                o.quarantined
                    .iter()
                    .map(|(entity, q)| QuarantinedEntity {
                        entity: entity.to_string(),
                        journal_seq: q.journal_seq,
                        reason: q.reason.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        quarantined.sort_by(|a, b| a.entity.cmp(&b.entity));
        PartitionStatus {
            partition: self.partition,
            generation: owning.map(|o| o.generation),
            dormant_entities: owning.map_or(0, |o| o.dormant.len()),
            resident_entities: owning.map_or(0, |o| {
                o.entities.values().filter(|s| s.actor.is_some()).count()
            }),
            commands_in_hand: owning
                .map_or(0, |o| o.entities.values().map(|s| s.queue.len()).sum()),
            applied: self.counters.applied,
            events_written: self.counters.events_written,
            rejected: self.counters.rejected,
            duplicates: self.counters.duplicates,
            dead_lettered: self.counters.dead_lettered,
            acquisitions: self.counters.acquisitions,
            failed_acquisitions: self.counters.failed_acquisitions,
            unconfirmed_writes: self.counters.unconfirmed_writes,
            journal_commits: self.commits.batches.load(Ordering::Relaxed),
            journal_records: self.commits.records.load(Ordering::Relaxed),
            write_conflicts: self.commits.conflicts.load(Ordering::Relaxed),
            quarantined,
        }
    }
}

/// Asks the server to move the pin at once instead of after the TTL; whether it did.
async fn unpin(shared: &Shared, partition: u32) -> bool {
    let consumer = shared.names.consumer(partition);
    match shared
        .command_stream
        .unpin_consumer(&consumer, PRIORITY_GROUP)
        .await
    {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(partition, error = %e, "unpin failed; the pin moves after its TTL");
            false
        }
    }
}

/// Acknowledges one delivery (any kind): a core publish to its reply subject.
async fn acknowledge(client: &Client, partition: u32, reply: Subject, kind: AckKind) {
    if let Err(e) = client.publish(reply, kind.into()).await {
        tracing::warn!(partition, error = %e, "acknowledgement not sent; the server will redeliver");
    }
}

/// Acknowledges one delivery and waits (bounded) for the server to confirm it.
async fn acknowledge_confirmed(
    client: &Client,
    partition: u32,
    reply: Subject,
    kind: AckKind,
    timeout: Duration,
) {
    let request = client.request(reply, kind.into());
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(partition, error = %e, "acknowledgement not confirmed"),
        Err(_) => tracing::warn!(partition, "acknowledgement not confirmed in time"),
    }
}

/// Tells a client the outcome of its command (best effort: the outcome is in the journal),
/// under the command's span if it was traced.
async fn respond(
    client: &Client,
    to: Subject,
    outcome: CommandOutcome,
    detail: Option<&Detail>,
    trace: Option<TraceParent>,
) {
    let Ok(body) = serde_json::to_vec(&ReplyBody::new(outcome, detail)) else {
        return;
    };
    let sent = match trace {
        Some(trace) => {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(HDR_TRACEPARENT, trace.to_string());
            client.publish_with_headers(to, headers, body.into()).await
        }
        None => client.publish(to, body.into()).await,
    };
    if let Err(e) = sent {
        tracing::debug!(error = %e, "outcome reply not sent");
    }
}
