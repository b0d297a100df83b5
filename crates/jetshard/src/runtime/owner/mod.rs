//! The shard-owner actor of one partition in one process.
//!
//! Every process runs one owner per partition. All of them pull; the server pins one, and that
//! one owns the partition: it claims a new generation, recovers what earlier owners held, and
//! hands commands to one actor per entity, loading each entity on its first command.
//!
//! One `OwnerState`, its methods in one file per responsibility (the model is raft-rs's
//! `raft.rs` + `tracker/`):
//! - this file: the actor and its dispatch (`handle`, `on_delivery`, `route_delivery`), so that
//!   a delivery reads top to bottom until it reaches its entity's actor;
//! - [`state`]: the owner's messages and fields; [`shared`]: what all owners of a type share;
//! - [`phase`]: the owner's phases (a diagram) and what it holds in each;
//! - [`acquire`] (claim, recovery of the in-flight window) and [`takeover`] (the actor's side:
//!   fenced writer, timer scan, outbox recovery);
//! - [`slot`] and [`route`]: each entity's commands in hand, handed to its actor in order;
//! - [`settle`]: the failure policy, a pure function from an entity's verdict to steps (ack,
//!   nak, give up, retry, step down), unit-tested without a server; [`outcome`] carries them out;
//! - [`passivate`], [`upkeep`] (the tick, timers), [`release`] (release, hand-off, step-down),
//!   [`status`], [`ack`] (acks, unpin, replies), [`dormant`], [`isolate`], [`query`].
//!
//! Architecture Invariant: a partition's state lives in exactly one owner actor (and its entity
//! actors); the owner is the only place that acknowledges, naks or terminates its commands, and
//! it does so only while it holds the partition under the generation the outcome was produced
//! with.

mod ack;
mod acquire;
mod dormant;
mod isolate;
#[cfg(test)]
mod layout;
mod outcome;
mod passivate;
mod phase;
mod query;
mod release;
mod route;
mod settle;
mod shared;
#[cfg(test)]
mod sizes;
mod slot;
mod state;
mod status;
mod takeover;
mod upkeep;
mod warm;
mod window;

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::message::AckKind;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::time::Instant;

use crate::entity::{Entity, EntityId};
use crate::health::PartitionHealth;
use crate::journal::fence;
use crate::runtime::entity_actor::EntityReport;
use crate::runtime::pin::{self, Delivery, PinSignal, PullSettings};
use crate::runtime::timer::Timers;
use crate::telemetry::PartitionMetrics;
use crate::wire::Names;
use ack::acknowledge;
use isolate::{Isolation, Next};
use phase::{Counters, Phase};
use settle::{Policy, StepDown};
pub(crate) use shared::Shared;
use slot::Pending;
use state::OwnerState;
pub(crate) use state::{OwnerArgs, OwnerMsg};

pub(crate) struct OwnerActor<E>(PhantomData<fn() -> E>);

impl<E> OwnerActor<E> {
    pub(crate) fn new() -> Self {
        Self(PhantomData)
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
            args.shared.commands(args.partition).clone(),
            args.shared.names.command_stream(args.partition),
            &args.shared.names.consumer(args.partition),
            settings,
            args.shared.resumes.watch(args.partition),
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
            born: Instant::now(),
            metrics,
            last_pin: None,
            deliveries: 0,
            deliveries_at_tick: 0,
            pending_count: None,
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
            outbox_in_doubt: None,
            timer_scan: None,
            waking: None,
            compaction: None,
            timers: Timers::default(),
            phase: Phase::Standby,
            warm: None,
            handed_off: None,
            policy,
            counters: Counters::default(),
            commits: Arc::default(),
            load_stats: Arc::default(),
        })
    }

    async fn handle(
        &self,
        _: ActorRef<OwnerMsg>,
        message: OwnerMsg,
        state: &mut OwnerState<E>,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            OwnerMsg::Pin(PinSignal::Delivered(deliveries)) => {
                // The new entities of the burst load together (`route::plan_batch_loads`),
                // planned once the owner owns the partition (a burst may begin by taking it).
                let mut deliveries = std::collections::VecDeque::from(deliveries);
                let mut planned = false;
                while !deliveries.is_empty() {
                    if !planned && let Phase::Owning(o) = &mut state.phase {
                        let named = deliveries
                            .iter()
                            .filter(|d| !d.wake)
                            .filter_map(|d| Names::entity_of_subject(&d.subject));
                        route::plan_batch_loads(o, named);
                        planned = true;
                    }
                    let Some(delivery) = deliveries.pop_front() else {
                        break;
                    };
                    state.on_delivery(delivery).await;
                }
                // Entities of the burst not started (their commands wait) load on their own.
                if let Some(o) = state.phase.owning() {
                    o.batch_loads.clear();
                }
            }
            OwnerMsg::Pin(PinSignal::Lost { pin }) => {
                Box::pin(state.step_down_under(&pin, StepDown::PinLost)).await
            }
            // The lost delivery comes back only after the ack wait, behind later ones. Take the
            // partition afresh: a new generation and the recovery of every unacknowledged
            // command, in order, before anything newer.
            OwnerMsg::Pin(PinSignal::Gap { pin }) => {
                Box::pin(state.step_down_under(&pin, StepDown::DeliveriesLost)).await
            }
            // The same, with nothing delivered after the lost ones to show the pin: claim at
            // once under the pin the loop holds.
            OwnerMsg::Pin(PinSignal::TailLost { pin }) => {
                Box::pin(state.step_down_under(&pin, StepDown::DeliveriesLost)).await;
                if matches!(state.phase, Phase::Standby) && !state.holding {
                    Box::pin(state.acquire(pin, None)).await;
                }
            }
            OwnerMsg::Pin(PinSignal::Idle) => {
                if let Phase::Releasing(release, _) = &mut state.phase {
                    release.pulls_idle = true;
                }
                state.finish_release_if_drained().await;
            }
            OwnerMsg::Pin(PinSignal::Ended { reason }) => {
                let ended = Box::pin(state.on_pull_loop_ended(reason)).await;
                state.post_health();
                return ended;
            }
            OwnerMsg::Entity(EntityReport::Command(outcome)) => {
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
            OwnerMsg::Entity(EntityReport::OutboxUndelivered { generation }) => {
                state.recover_outbox_of(generation);
            }
            OwnerMsg::Entity(EntityReport::Superseded { generation }) => {
                if state
                    .phase
                    .owning_ref()
                    .is_some_and(|o| o.generation == generation)
                {
                    Box::pin(state.step_down(StepDown::Fenced)).await;
                    // The claim that superseded it may be one whose owner left at once (it
                    // claimed late, its pin gone): then this process still holds the pin,
                    // and once the pin lapses nobody is pinned until a command comes (a
                    // partition is owned only while it has one to deliver). A wake-up is that
                    // command: whoever owns the partition next answers its queries.
                    state.wake_beside();
                }
            }
            OwnerMsg::Tick => Box::pin(state.on_tick()).await,
            OwnerMsg::Release(reply) => Box::pin(state.start_release(Some(reply))).await,
            OwnerMsg::HandOff => {
                if matches!(state.phase, Phase::Owning(_)) {
                    Box::pin(state.start_release(None)).await;
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
                            shared.journal(partition),
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
            OwnerMsg::PendingCounted {
                generation,
                deliveries,
                pending,
            } => state.on_pending_counted(generation, deliveries, pending),
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
        let id = cell.get_id();
        let Some(o) = state.phase.owning() else {
            // An actor asked for its state at a step-down: none comes now.
            if let Some(warm) = &mut state.warm {
                warm.actor_failed(id);
            }
            return Ok(());
        };
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
        o.surrendering.remove(&entity);
        state.dispatch(&entity);
        Ok(())
    }
}

impl<E: Entity> OwnerState<E> {
    async fn on_delivery(&mut self, delivery: Delivery) {
        self.deliveries = self.deliveries.wrapping_add(1);
        if self.last_pin.as_ref() != Some(&delivery.pin) {
            if self.last_pin.is_some() {
                self.metrics.pin_changes.increment(1);
            }
            self.last_pin = Some(delivery.pin.clone());
        }
        let pending = delivery.pending as f64;
        if let Phase::Releasing(_, owning) = &self.phase
            && owning.as_ref().is_none_or(|o| o.pin != delivery.pin)
        {
            // A pull sent before the release was answered under a pin this process did not
            // own: the server pinned a process that is leaving. Give the pin back at once, or
            // the partition waits for the pin's TTL (nobody else unpins it: this process never
            // claimed it, so no crash watch finds its owner dead).
            return Box::pin(self.decline(delivery)).await;
        }
        if matches!(self.phase, Phase::Releasing(..) | Phase::CoolingDown(_)) {
            // Handing over: let the next owner have it soon.
            let nak = AckKind::Nak(Some(Duration::from_millis(100)));
            let client = &self.shared.client;
            Box::pin(acknowledge(client, self.partition, delivery.reply, nak)).await;
            return;
        }
        let moved = matches!(&self.phase, Phase::Owning(o) if o.pin != delivery.pin);
        if moved {
            Box::pin(self.step_down(StepDown::PinMoved)).await;
        }
        match &mut self.phase {
            Phase::Owning(_) => self.deliver(delivery).await,
            Phase::Refused(refused) if refused.pin == delivery.pin => {
                // Not ours to process; back to the server soon for whoever owns it.
                refused.last_delivery = Some(Instant::now());
                let nak = AckKind::Nak(Some(self.policy.retry_delay));
                let client = &self.shared.client;
                Box::pin(acknowledge(client, self.partition, delivery.reply, nak)).await;
            }
            Phase::Standby if self.holding => Box::pin(self.decline(delivery)).await,
            _ => Box::pin(self.acquire(delivery.pin.clone(), Some(delivery))).await,
        }
        if matches!(self.phase, Phase::Owning(_)) {
            self.metrics.pending.set(pending);
        }
    }

    /// Takes a delivery while owning: routed at once, or, in isolation, when its turn comes.
    ///
    /// The isolation's path is boxed apart: ractor moves the `handle` future twice per message,
    /// at the size of its largest path, and isolation is rare.
    async fn deliver(&mut self, delivery: Delivery) {
        let Some(o) = self.phase.owning() else { return };
        if o.isolation.is_none() {
            return self.route_delivery(delivery, None).await;
        }
        Box::pin(self.deliver_isolated(delivery)).await;
    }

    /// [`deliver`](Self::deliver) during an isolated acquisition.
    async fn deliver_isolated(&mut self, delivery: Delivery) {
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
            // Boxed apart, as the other rare paths of the `handle` future.
            let client = &self.shared.client;
            Box::pin(acknowledge(client, partition, delivery.reply, AckKind::Ack)).await;
            return;
        }
        // The subject is moved out, not cloned: a clone of a received subject allocates.
        let (mut pending, subject) = Pending::delivered(delivery);
        pending.give_up = give_up.map(Into::into);
        let Some(o) = self.phase.owning() else { return };
        pending.deliveries = pending
            .deliveries
            .max(u64::from(fence::claims_holding(&o.held, pending.seq)) + 1);
        let named = Names::entity_of_subject(&subject).unwrap_or_default();
        // An entity in hand already: its id, shared (no new allocation per command), and its
        // partition checked when it came.
        if let Some(entity) = o.entities.get_key_value(named).map(|(id, _)| id.clone()) {
            self.route(&entity, pending);
            return;
        }
        match EntityId::new(named) {
            Ok(entity) => match self.shared.names.misplaced(partition, &entity) {
                None => self.route(&entity, pending),
                Some(home) => {
                    tracing::warn!(partition, %subject, home, "command stored in a partition its entity id does not hash to; dead-lettered");
                    let reason = format!(
                        "the entity id hashes to partition {home}, not {partition}: its publisher named the wrong partition"
                    );
                    Box::pin(self.give_up_without_entity(named, pending, reason)).await;
                }
            },
            Err(invalid) => {
                tracing::warn!(partition, %subject, %invalid, "command subject holds no valid entity id; dead-lettered");
                let reason = format!("the subject holds no valid entity id: {invalid}");
                Box::pin(self.give_up_without_entity(named, pending, reason)).await;
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
}
