//! A warm re-claim: the entity states an owner held when it stepped down, kept in case this
//! process claims the partition again next, so that its entities need no load then.
//!
//! Why keeping them is safe: a claim is a compare-and-set against the latest fence record, and
//! it claims that record's generation + 1. So a won claim of generation `g + 1` by the owner
//! that held `g` proves that the record it superseded was its own: nobody claimed in between,
//! and every journal write is fenced against the latest record, so no other process wrote to
//! the partition since this owner's states were true. What `g`'s own writes still in flight
//! may add is settled by then (they are fenced against `g`'s record, superseded by the claim):
//! such a write belongs to an actor that had not handed its state back yet (not kept), or to
//! one whose write was answered "not confirmed" (its entity is `doubted`, not kept). Any other
//! claimed generation drops everything, as a cold acquisition does.
//!
//! An actor hands its state back with [`EntityMsg::Surrender`] (nothing written), through the
//! same report as a passivation; the states wait encoded, within the process's dormant
//! budget, until the next claim, or until [`KEEP_FOR`] has passed. An actor that has not
//! handed its state back by the claim (the claim may follow the step-down in the same turn,
//! when a delivery shows the pin moved to this process) is awaited as a passivated one is:
//! its entity's slot is `returning`, so no new actor loads it before its state arrives.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use ractor::ActorId;

use super::dormant::Dormant;
use super::phase::Owning;
use super::slot::Slot;
use crate::entity::{Entity, EntityId};
use crate::runtime::entity_actor::{CommandReport, EntityMsg, Passivated, Seed, Verdict};

/// How long states are kept for a claim that does not come: past it, another process has most
/// likely taken the partition (a re-claim follows a lost pin within a pull or two).
pub(super) const KEEP_FOR: Duration = Duration::from_secs(60);

/// The states of a generation this owner stepped down from.
pub(super) struct Warm<E: Entity> {
    /// The generation they are true under.
    generation: u64,
    /// The states handed back (passivated before the step-down, or surrendered after it).
    dormant: Dormant<E>,
    /// Entities not to keep: a write of theirs under `generation` was not confirmed (it may be
    /// stored after their state was read), or their actor failed.
    doubted: HashSet<EntityId>,
    /// The actors asked for their states, not heard from yet.
    returning: HashMap<EntityId, ActorId>,
    /// Dropped past it.
    until: Instant,
}

impl<E: Entity> Warm<E> {
    /// The states of `o`, which this owner steps down from: the dormant ones as they are, and
    /// each live actor asked to hand its state back and stop.
    pub(super) fn keep(o: Box<Owning<E>>) -> Self {
        let Owning {
            generation,
            context,
            dormant,
            entities,
            doubted,
            quarantined,
            surrendering,
            ..
        } = *o;
        context
            .retired
            .store(true, std::sync::atomic::Ordering::Release);
        let mut returning = HashMap::new();
        for (entity, slot) in entities {
            // Still awaited from the generation before this one: its report will be of that
            // generation, which nothing takes any more; the entity loads.
            if surrendering.contains(&entity) {
                continue;
            }
            let actor = match (&slot.actor, slot.returning) {
                // An actor already stopping (after a failure) sends nothing back; one that does
                // not take the message (stopped meanwhile) neither: their entities load.
                (Some(resident), _) => resident
                    .actor
                    .cast(EntityMsg::Surrender)
                    .is_ok()
                    .then(|| resident.actor.get_id()),
                // Passivating: its state is on its way.
                (None, returning) => returning,
            };
            if let Some(actor) = actor {
                returning.insert(entity, actor);
            }
        }
        let mut doubted = doubted;
        doubted.extend(quarantined.into_keys());
        let mut warm = Warm {
            generation,
            dormant,
            doubted,
            returning,
            until: Instant::now() + KEEP_FOR,
        };
        for entity in &warm.doubted {
            warm.dormant.forget(entity.as_str());
        }
        warm
    }

    /// What a claim that won `generation` keeps: everything, if it is the next after the one
    /// the states are true under; else nothing.
    pub(super) fn reclaimed(self, generation: u64) -> Option<Kept<E>> {
        if self.generation.checked_add(1) != Some(generation) || self.until <= Instant::now() {
            return None;
        }
        Some(Kept {
            from: self.generation,
            dormant: self.dormant,
            doubted: self.doubted,
            returning: self.returning,
        })
    }

    /// An actor asked for its state died instead (a panic: no report comes): its entity loads.
    pub(super) fn actor_failed(&mut self, actor: ActorId) {
        self.returning.retain(|_, awaited| *awaited != actor);
    }

    /// Whether it is kept past [`KEEP_FOR`].
    pub(super) fn expired(&self) -> bool {
        self.until <= Instant::now()
    }

    /// An actor's state handed back under the kept generation.
    pub(super) fn passivated(&mut self, passivated: Passivated) {
        if passivated.generation != self.generation {
            return;
        }
        self.returning.remove(&passivated.entity);
        if self.doubted.contains(&passivated.entity) {
            return;
        }
        if let Some(seed) = passivated
            .seed
            .and_then(|seed| seed.downcast::<Seed<E>>().ok())
        {
            self.dormant.keep(&passivated.entity, &seed);
        }
    }

    /// A command's outcome under the kept generation: an actor that stopped on it keeps
    /// nothing, and a write it left in doubt rules its entity out.
    pub(super) fn outcome(&mut self, outcome: &CommandReport) {
        if outcome.generation == self.generation && stops(outcome) {
            self.dormant.forget(outcome.entity.as_str());
            // It stops without taking the surrender: nothing more comes from it.
            self.returning.remove(&outcome.entity);
            self.doubted.insert(outcome.entity.clone());
        }
    }
}

/// What a warm re-claim keeps of the generation before it.
pub(super) struct Kept<E: Entity> {
    /// That generation.
    pub(super) from: u64,
    pub(super) dormant: Dormant<E>,
    /// Its entities whose states are not kept (a state of theirs handed back later neither).
    pub(super) doubted: HashSet<EntityId>,
    /// Its actors whose states are still on their way.
    returning: HashMap<EntityId, ActorId>,
}

impl<E: Entity> Kept<E> {
    /// The entities whose states are still on their way, and their slots: marked returning,
    /// so that their commands wait for them (`route`), as for a passivated actor's.
    pub(super) fn returning_slots(&mut self) -> Vec<(EntityId, Slot)> {
        self.returning
            .drain()
            .map(|(entity, actor)| {
                let mut slot = Slot::new();
                slot.returning = Some(actor);
                (entity, slot)
            })
            .collect()
    }
}

/// Whether the actor stopped on this outcome (its state is gone, and with a failed write, what
/// the journal holds of its entity is not known).
pub(super) fn stops(outcome: &CommandReport) -> bool {
    matches!(outcome.verdict, Verdict::Fenced | Verdict::Failed(_)) || outcome.quarantine.is_some()
}
