//! Routing: each entity's commands in hand, in order, handed to the entity's actor.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_nats::Subject;
use bytes::Bytes;
use ractor::{ActorCell, ActorId, ActorRef};
use tokio::time::Instant;

use super::phase::Owning;
use crate::entity::{Entity, EntityId};
use crate::entity_actor::{EntityActor, EntityMsg, Loaded, Work};
use crate::pin::Delivery;
use crate::timer::Firing;
use crate::trace::CommandTrace;

/// A live entity actor, counted in the system's resident count while it is held.
pub(super) struct Resident {
    pub(super) actor: ActorRef<EntityMsg>,
    count: Arc<AtomicUsize>,
}

impl Resident {
    fn new(actor: ActorRef<EntityMsg>, count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self {
            actor,
            count: Arc::clone(count),
        }
    }
}

impl Drop for Resident {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One entity's commands in hand, in the order they are applied.
pub(super) struct Slot {
    pub(super) actor: Option<Resident>,
    /// The passivated actor whose state is on its way back: no new actor until it arrives, so
    /// the entity never runs on a state older than its last command.
    pub(super) returning: Option<ActorId>,
    pub(super) queue: VecDeque<Pending>,
    /// Set after a failed command: nothing of this entity runs until that command is retried,
    /// so later commands cannot overtake it.
    pub(super) blocked: Option<Blocked>,
    pub(super) last_active: Instant,
}

impl Slot {
    fn new() -> Self {
        Self {
            actor: None,
            returning: None,
            queue: VecDeque::new(),
            blocked: None,
            last_active: Instant::now(),
        }
    }

    /// Nothing in hand, nothing pending: the entity may be passivated or forgotten.
    pub(super) fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.blocked.is_none() && self.returning.is_none()
    }
}

/// Why an entity waits, and for what.
#[derive(Clone, Copy, Debug)]
pub(super) enum Blocked {
    /// Its first command failed and was nak'd (or, recovered from the stream, was never ours to
    /// nak): wait for the server to deliver it again.
    Redelivery { seq: u64, since: Instant },
    /// Retry its first command here at `at`, without spending a delivery.
    Retry { at: Instant },
}

/// A command in hand.
pub(super) struct Pending {
    pub(super) seq: u64,
    pub(super) payload: Bytes,
    /// The delivery to acknowledge; `None` for a command recovered from the stream on
    /// acquisition (its delivery belongs to the previous owner) or after a nak.
    pub(super) reply: Option<Subject>,
    /// Deliveries so far, takeovers included.
    pub(super) deliveries: u64,
    /// Local retries after unconfirmed writes.
    pub(super) attempts: u32,
    pub(super) progress_at: Instant,
    /// Where the client wants the outcome.
    pub(super) respond_to: Option<Subject>,
    /// Set once the command is to be given up: its dead letter is written next, with this
    /// reason, instead of deciding it.
    pub(super) give_up: Option<Arc<str>>,
    /// Its trace context (`traceparent`), if it came with one.
    pub(super) trace: Option<Box<CommandTrace>>,
    /// Which timer fired, if it is a timer's command.
    pub(super) timer: Option<Firing>,
}

impl Pending {
    pub(super) fn delivered(delivery: Delivery) -> Self {
        Pending {
            seq: delivery.seq,
            payload: delivery.payload,
            reply: Some(delivery.reply),
            deliveries: delivery.deliveries,
            attempts: 0,
            progress_at: Instant::now(),
            respond_to: delivery.respond_to,
            give_up: None,
            trace: delivery.trace,
            timer: delivery.timer,
        }
    }

    /// A command read back from the stream on acquisition (its delivery count is set from the
    /// claim's count of it).
    pub(super) fn recovered(
        seq: u64,
        payload: Bytes,
        respond_to: Option<Subject>,
        trace: Option<Box<CommandTrace>>,
        timer: Option<Firing>,
    ) -> Self {
        Pending {
            seq,
            payload,
            reply: None,
            deliveries: 1,
            attempts: 0,
            progress_at: Instant::now(),
            respond_to,
            give_up: None,
            trace,
            timer,
        }
    }

    fn work(&self) -> Work {
        Work {
            seq: self.seq,
            payload: self.payload.clone(),
            deliveries: self.deliveries,
            give_up: self.give_up.clone(),
            trace: self.trace.clone(),
            detail: self.respond_to.is_some(),
            timer: self.timer.clone(),
        }
    }
}

/// Queues a command for its entity. Returns whether the entity should be dispatched.
pub(super) fn enqueue<E: Entity>(o: &mut Owning<E>, entity: &EntityId, pending: Pending) -> bool {
    let slot = o.entities.entry(entity.clone()).or_insert_with(Slot::new);
    slot.last_active = Instant::now();
    if let Some(held) = slot.queue.iter_mut().find(|p| p.seq == pending.seq) {
        // A redelivery of a command still in hand: keep the newest delivery to acknowledge.
        if pending.reply.is_some() {
            held.reply = pending.reply;
            held.deliveries = held.deliveries.max(pending.deliveries);
        }
        held.progress_at = Instant::now();
        if matches!(slot.blocked, Some(Blocked::Redelivery { seq, .. }) if seq == pending.seq) {
            slot.blocked = None;
            return true;
        }
        return false;
    }
    let (work, live) = (pending.work(), slot.blocked.is_none());
    slot.queue.push_back(pending);
    match &slot.actor {
        Some(resident) if live => {
            let _ = resident.actor.cast(EntityMsg::Work(work));
            false
        }
        _ => live,
    }
}

/// (Re)starts an entity's actor if needed and hands it every command in hand, in order.
/// Returns how many live actors there were beyond the resident cap, if any.
pub(super) fn dispatch<E: Entity>(
    o: &mut Owning<E>,
    entity: &EntityId,
    supervisor: &ActorCell,
    resident: &Arc<AtomicUsize>,
) {
    let Some(slot) = o.entities.get_mut(entity) else {
        return;
    };
    if slot.queue.is_empty() || slot.blocked.is_some() || slot.returning.is_some() {
        return;
    }
    if slot.actor.is_none() && !spawn(o, entity, supervisor, resident) {
        return;
    }
    let Some(slot) = o.entities.get_mut(entity) else {
        return;
    };
    if let Some(resident) = &slot.actor {
        for pending in &slot.queue {
            let _ = resident.actor.cast(EntityMsg::Work(pending.work()));
        }
    }
}

/// Starts the actor of `entity`, whose slot has none: with its dormant state if the owner
/// keeps one, else to load it from the journal on its first message. Returns whether it runs.
pub(super) fn spawn<E: Entity>(
    o: &mut Owning<E>,
    entity: &EntityId,
    supervisor: &ActorCell,
    resident: &Arc<AtomicUsize>,
) -> bool {
    let loaded = if let Some(q) = o.quarantined.get(entity) {
        Loaded::Quarantined(q.clone())
    } else if let Some(seed) = o.dormant.take(entity) {
        Loaded::Yes(seed)
    } else {
        // Never loaded under this generation, evicted, or lost with a failed actor: the
        // actor loads it from the journal on its first message.
        Loaded::No
    };
    let context = Arc::clone(&o.context);
    let slot = o.entities.entry(entity.clone()).or_insert_with(Slot::new);
    // Without waiting for the actor's start (its `pre_start` only stores its arguments, and
    // cannot fail): the owner goes on routing while the actor starts, and the messages sent
    // meanwhile wait in its mailbox.
    match ractor::ActorRuntime::spawn_linked_instant(
        None,
        EntityActor::<E>::new(),
        (entity.clone(), context, loaded),
        supervisor.clone(),
    ) {
        Ok((actor, _)) => {
            slot.actor = Some(Resident::new(actor, resident));
            true
        }
        Err(e) => {
            tracing::error!(partition = o.context.partition, %entity, error = %e, "cannot spawn entity actor");
            false
        }
    }
}

/// Asks an idle entity's actor to hand its state back and stop (the owner takes the state);
/// forgets an entity that has no actor.
pub(super) fn passivate<E: Entity>(o: &mut Owning<E>, entity: &EntityId) {
    let Some(slot) = o.entities.get_mut(entity) else {
        return;
    };
    match slot.actor.take() {
        Some(resident) => {
            slot.returning = Some(resident.actor.get_id());
            let _ = resident.actor.cast(EntityMsg::Passivate);
        }
        None if slot.returning.is_none() => {
            o.entities.remove(entity);
        }
        None => {}
    }
}

/// Hands the partition's entities over, for a release: whether every command in hand is done
/// and, with `snapshots`, every entity's state is back from its actor (each idle actor is
/// passivated, so it writes a snapshot of its events since its last one before it stops).
///
/// Without those snapshots, the next owner would load each entity from its latest snapshot and
/// every record after it, on its first command, while its commands wait: after a move, every
/// active entity of the partition at once.
pub(super) fn hand_over<E: Entity>(o: &mut Owning<E>, snapshots: bool) -> bool {
    if snapshots {
        let idle: Vec<EntityId> = o
            .entities
            .iter()
            .filter(|(_, s)| s.actor.is_some() && s.queue.is_empty() && s.blocked.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        for entity in idle {
            passivate(o, &entity);
        }
    }
    o.entities
        .values()
        .all(|s| s.queue.is_empty() && (!snapshots || s.returning.is_none()))
}

/// Passivates up to `count` of this partition's idle resident entities, least recently active
/// first: the resident cap is over.
pub(super) fn evict_idle<E: Entity>(o: &mut Owning<E>, count: usize) {
    let mut idle: Vec<(Instant, EntityId)> = o
        .entities
        .iter()
        .filter(|(_, s)| s.actor.is_some() && s.queue.is_empty() && s.blocked.is_none())
        .map(|(id, s)| (s.last_active, id.clone()))
        .collect();
    let count = count.min(idle.len());
    if count == 0 {
        return;
    }
    if count < idle.len() {
        idle.select_nth_unstable_by_key(count - 1, |(at, _)| *at);
    }
    for (_, entity) in idle.into_iter().take(count) {
        passivate(o, &entity);
    }
}
