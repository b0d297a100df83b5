//! Passivation: idle entities stop, and the resident cap is kept.

use std::sync::atomic::Ordering;

use super::route;
use super::state::OwnerState;
use crate::entity::Entity;
use crate::runtime::entity_actor::{Passivated, Seed};

impl<E: Entity> OwnerState<E> {
    /// Passivates idle entities, least recently active first, while more than the resident
    /// cap are live (down to 90% of it).
    pub(super) fn keep_resident_cap(&mut self) {
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

    /// Takes a passivated actor's state into the dormant map, and gives the entity a new actor
    /// if commands came in meanwhile.
    pub(super) fn on_passivated(&mut self, passivated: Passivated) {
        let Some(o) = self.phase.owning() else {
            if let Some(warm) = &mut self.warm {
                warm.passivated(passivated);
            }
            return;
        };
        let entity = passivated.entity;
        // Of the generation before, after a warm re-claim: a state asked for at the step-down.
        let kept = Some(passivated.generation) == o.warm_from;
        if passivated.generation != o.generation && !kept {
            return;
        }
        if kept {
            o.surrendering.remove(&entity);
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
            .filter(|_| !(kept && o.doubted.contains(&entity)))
            .and_then(|seed| seed.downcast::<Seed<E>>().ok())
        {
            o.dormant.keep(&entity, &seed);
        }
        if slot.is_idle() {
            o.entities.remove(&entity);
        } else {
            self.dispatch(&entity);
        }
        let budget = super::dormant::Budget {
            entities: self.shared.config.max_dormant_entities,
            bytes: self.shared.config.max_dormant_bytes,
        };
        if let Some(o) = self.phase.owning() {
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
}
