//! The states of a partition's entities that have no actor ("dormant"), within a budget.
//!
//! A passivated actor hands its state back to the owner, which keeps it here until the entity's
//! next command spawns a new actor with it. The states of all of this process's partitions
//! count against one budget (`ShardConfig::max_dormant_entities`): past it, an owner drops its
//! least recently used states. A dropped state costs nothing but a load from the journal (the
//! entity's snapshot and the records after it) on the entity's next command, exactly as after a
//! takeover, so memory follows the entities in use rather than every entity ever seen.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::entity::{Entity, EntityId};
use crate::runtime::entity_actor::Seed;

/// One partition's dormant states, counted in the process's total.
pub(super) struct Dormant<E: Entity> {
    states: HashMap<EntityId, (Seed<E>, u64)>,
    /// Stamps the states in the order they were kept (least recently used: lowest).
    clock: u64,
    /// Dormant states over all of this process's partitions.
    total: Arc<AtomicUsize>,
}

impl<E: Entity> Dormant<E> {
    pub(super) fn new(total: Arc<AtomicUsize>) -> Self {
        Self {
            states: HashMap::new(),
            clock: 0,
            total,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.states.len()
    }

    /// Keeps `entity`'s state (the most recently used one now).
    pub(super) fn keep(&mut self, entity: EntityId, seed: Seed<E>) {
        self.clock += 1;
        if self.states.insert(entity, (seed, self.clock)).is_none() {
            self.total.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Takes `entity`'s state out (for its new actor).
    pub(super) fn take(&mut self, entity: &EntityId) -> Option<Seed<E>> {
        let (seed, _) = self.states.remove(entity)?;
        self.total.fetch_sub(1, Ordering::Relaxed);
        Some(seed)
    }

    /// Drops `entity`'s state, if kept (it is not to be trusted any more).
    pub(super) fn forget(&mut self, entity: &EntityId) {
        drop(self.take(entity));
    }

    /// Keeps the process's total within `budget`: once over it, drops this partition's least
    /// recently used states until the total is down to 90 % of the budget (or this partition
    /// has none left), so that eviction runs in batches, not at every passivation. Returns how
    /// many went.
    pub(super) fn evict_over(&mut self, budget: usize) -> usize {
        let total = self.total.load(Ordering::Relaxed);
        if total <= budget {
            return 0;
        }
        let count = (total - budget * 9 / 10).min(self.states.len());
        if count == 0 {
            return 0;
        }
        let mut stamps: Vec<u64> = self.states.values().map(|(_, stamp)| *stamp).collect();
        let (_, nth, _) = stamps.select_nth_unstable(count - 1);
        let cutoff = *nth;
        // Stamps are unique: exactly `count` states are at or below the cutoff.
        self.states.retain(|_, (_, stamp)| *stamp > cutoff);
        self.total.fetch_sub(count, Ordering::Relaxed);
        count
    }
}

impl<E: Entity> Drop for Dormant<E> {
    fn drop(&mut self) {
        self.total.fetch_sub(self.states.len(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Counter;
    impl Entity for Counter {
        type Command = ();
        type Event = ();
        type State = u32;
        type Rejection = String;
        fn decide(_: &u32, _: ()) -> Result<Vec<()>, String> {
            Ok(vec![])
        }
        fn apply(_: &mut u32, _: &()) {}
    }

    fn id(n: u32) -> EntityId {
        EntityId::new(format!("e{n}")).unwrap()
    }

    fn seed(n: u32) -> Seed<Counter> {
        Seed {
            state: n,
            ..Default::default()
        }
    }

    #[test]
    fn the_least_recently_kept_states_go_first_down_to_ninety_percent() {
        let total = Arc::new(AtomicUsize::new(0));
        let mut dormant = Dormant::<Counter>::new(Arc::clone(&total));
        for n in 0..10 {
            dormant.keep(id(n), seed(n));
        }
        // e0 is used again: it is now the most recent.
        let e0 = dormant.take(&id(0)).unwrap();
        dormant.keep(id(0), e0);
        assert_eq!(dormant.evict_over(10), 0);
        dormant.keep(id(10), seed(10));
        // 11 kept, budget 10: down to 9.
        assert_eq!(dormant.evict_over(10), 2);
        assert_eq!(total.load(Ordering::Relaxed), 9);
        assert!(dormant.take(&id(1)).is_none() && dormant.take(&id(2)).is_none());
        assert_eq!(dormant.take(&id(0)).map(|s| s.state), Some(0));
        drop(dormant);
        assert_eq!(total.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_partition_drops_only_what_it_holds() {
        let total = Arc::new(AtomicUsize::new(50));
        let mut dormant = Dormant::<Counter>::new(Arc::clone(&total));
        dormant.keep(id(1), seed(1));
        assert_eq!(dormant.evict_over(10), 1);
        assert_eq!(dormant.len(), 0);
        assert_eq!(total.load(Ordering::Relaxed), 50);
    }
}
