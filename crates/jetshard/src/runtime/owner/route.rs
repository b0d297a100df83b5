//! Routing: each entity's commands in hand, in order, handed to the entity's actor.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use futures::FutureExt;
use ractor::ActorCell;
use tokio::time::Instant;

use super::phase::Owning;
use super::slot::{Blocked, Pending, Resident, Slot};
use crate::entity::{Entity, EntityId};
use crate::runtime::entity_actor::{
    BatchLoad, EntityActor, EntityMsg, InBatch, Loaded, MAX_BATCH_LOAD,
};

/// Queues a command for its entity. Returns whether the entity should be dispatched.
pub(super) fn enqueue<E: Entity>(o: &mut Owning<E>, entity: &EntityId, pending: Pending) -> bool {
    tracing::trace!(target: crate::telemetry::STAGE_TARGET, seq = pending.seq, "routed");
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

/// Plans the batched loads of the commands about to be routed, for the entities `named`
/// (a pull burst's, or those recovered at a takeover): each that has neither an actor nor a
/// dormant state (nor is quarantined) is to load from one batched read with up to
/// [`MAX_BATCH_LOAD`] others ([`BatchLoad`]), which its actor is given when [`spawn`] starts it.
/// Not while commands run one at a time (isolation): they load one by one.
pub(super) fn plan_batch_loads<'a, E: Entity>(
    o: &mut Owning<E>,
    named: impl Iterator<Item = &'a str>,
) {
    if o.isolation.is_some() {
        return;
    }
    let mut new = Vec::new();
    let mut seen = HashSet::new();
    for named in named {
        let in_hand = o
            .entities
            .get(named)
            .is_some_and(|s| s.actor.is_some() || s.returning.is_some());
        if in_hand || o.dormant.contains(named) || o.batch_loads.contains_key(named) {
            continue;
        }
        let Ok(entity) = EntityId::new(named) else {
            continue;
        };
        if o.quarantined.contains_key(&entity) || !seen.insert(entity.clone()) {
            continue;
        }
        new.push(entity);
    }
    for chunk in new.chunks(MAX_BATCH_LOAD) {
        let batch = BatchLoad::new(&o.context, chunk);
        for (place, entity) in chunk.iter().enumerate() {
            let share = InBatch::new(Arc::clone(&batch), place);
            o.batch_loads.insert(entity.clone(), share);
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
    let batch = o.batch_loads.remove(entity);
    let loaded = if let Some(q) = o.quarantined.get(entity) {
        Loaded::Quarantined(q.clone())
    } else if let Some(seed) = o.dormant.take(entity.as_str()) {
        Loaded::Yes(seed)
    } else {
        // Never loaded under this generation, evicted, or lost with a failed actor: the
        // actor loads it from the journal on its first message (from `batch`'s read if it
        // came with others in a pull burst).
        Loaded::No
    };
    let context = Arc::clone(&o.context);
    let slot = o.entities.entry(entity.clone()).or_insert_with(Slot::new);
    // Started here, at once: its `pre_start` only stores its arguments (no await, cannot
    // fail), so ractor's start (the pre-start, the supervision link, the spawn of the actor's
    // processing task) completes on its first poll, in the owner's turn, and the owner goes on
    // routing; the messages sent meanwhile wait in its mailbox. One task per actor: ractor's
    // `spawn_linked_instant` would spawn a second one just to run that start.
    let started = at_once(ractor::ActorRuntime::spawn_linked(
        None,
        EntityActor::<E>::new(),
        (entity.clone(), context, loaded, batch),
        supervisor.clone(),
    ));
    match started {
        Some(Ok((actor, _))) => {
            slot.actor = Some(Resident::new(actor, resident));
            true
        }
        Some(Err(e)) => {
            tracing::error!(partition = o.context.partition, %entity, error = %e, "cannot spawn entity actor");
            false
        }
        None => {
            // Not reached: nothing in the start waits, and it runs outside the budget. Were it
            // to, the actor would be dropped unstarted and its commands stay in hand, as for a
            // failed spawn, until the owner's next tick starts it again (`upkeep`).
            debug_assert!(false, "an entity actor's start waited");
            tracing::error!(partition = o.context.partition, %entity, "an entity actor's start did not complete at once");
            false
        }
    }
}

/// Polls `start` once, outside the task's cooperative budget: its output, or `None` if it
/// waits. ractor runs an actor's pre-start in a `tokio::select!`, which answers `Pending`
/// once the task has spent its budget (128 operations a turn: an owner's mailbox receives and
/// acknowledgements count), whatever its branches would say. Polled within the budget, the
/// starts of the new entities of a burst that an owner took late in a busy turn did not
/// complete, and their commands waited in hand (found by the bench's latency and memory runs).
fn at_once<F: Future>(start: F) -> Option<F::Output> {
    tokio::task::unconstrained(start).now_or_never()
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

#[cfg(test)]
mod tests {
    use futures::FutureExt;
    use ractor::{Actor, ActorProcessingErr, ActorRef};

    use super::at_once;

    struct Idle;

    impl Actor for Idle {
        type Msg = ();
        type State = ();
        type Arguments = ();

        async fn pre_start(&self, _: ActorRef<()>, (): ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
    }

    /// Spends this task's cooperative budget without yielding: receives from a full channel
    /// until a receive answers `Pending` with messages still in it.
    fn spend_budget() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..1_000 {
            tx.send(i).expect("open");
        }
        let mut received = 0;
        while let Some(Some(_)) = rx.recv().now_or_never() {
            received += 1;
            assert!(received < 1_000, "the budget was never spent");
        }
    }

    /// What the owner leans on: an actor whose pre-start waits for nothing starts on the first
    /// poll even when the owner's turn has spent its budget, where a plain poll does not.
    #[tokio::test]
    async fn an_actor_starts_at_once_even_when_the_task_has_spent_its_budget() {
        let supervisor = Actor::spawn(None, Idle, ()).await.expect("supervisor").0;

        spend_budget();
        let plain = ractor::ActorRuntime::spawn_linked(None, Idle, (), supervisor.get_cell())
            .now_or_never();
        assert!(
            plain.is_none(),
            "tokio's select! waits once the budget is spent"
        );

        spend_budget();
        let (actor, _) = at_once(ractor::ActorRuntime::spawn_linked(
            None,
            Idle,
            (),
            supervisor.get_cell(),
        ))
        .expect("started on the first poll")
        .expect("spawned");
        actor.stop(None);
        supervisor.stop(None);
    }
}
