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

use crate::codec::Codec;
use crate::entity::{Entity, EntityId};
use crate::runtime::entity_actor::Seed;

/// The dormant states of all of this process's partitions: how many, and their estimated bytes.
#[derive(Debug, Default)]
pub(crate) struct DormantTotals {
    entities: AtomicUsize,
    bytes: AtomicUsize,
}

/// What the dormant states of the process may hold (`ShardConfig::max_dormant_entities`,
/// `max_dormant_bytes`); `None`: no bound of that kind.
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    pub(super) entities: Option<usize>,
    pub(super) bytes: Option<usize>,
}

/// One dormant state: the seed, its stamp (least recently used: lowest) and its estimated
/// bytes.
type Kept<E> = (Seed<E>, u64, usize);

/// The estimated bytes a dormant state holds: its map entry (the seed's fixed part, the key,
/// the stamp), its id, and its state's encoding (a stand-in for the state's heap, counted
/// without building it; a state that does not encode counts as its fixed part alone), the
/// text of its last outcome, and the outbox origins it remembers.
pub(super) fn estimate<E: Entity>(entity: &EntityId, seed: &Seed<E>, codec: Codec) -> usize {
    let outcome = match &seed.last_outcome {
        Some(
            crate::runtime::entity_actor::outcome_header::LastOutcome::Rejected(text)
            | crate::runtime::entity_actor::outcome_header::LastOutcome::DeadLettered(text),
        ) => text.len(),
        _ => 0,
    };
    std::mem::size_of::<(EntityId, Kept<E>)>()
        + entity.as_str().len()
        + codec.encoded_len(&seed.state).unwrap_or(0)
        + outcome
        + seed.origins.heap_bytes()
}

/// One partition's dormant states, counted in the process's totals.
pub(super) struct Dormant<E: Entity> {
    states: HashMap<EntityId, Kept<E>>,
    /// Stamps the states in the order they were kept (least recently used: lowest).
    clock: u64,
    /// This partition's estimated bytes (part of `totals`).
    bytes: usize,
    /// Dormant states over all of this process's partitions.
    totals: Arc<DormantTotals>,
}

impl<E: Entity> Dormant<E> {
    pub(super) fn new(totals: Arc<DormantTotals>) -> Self {
        Self {
            states: HashMap::new(),
            clock: 0,
            bytes: 0,
            totals,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.states.len()
    }

    /// This partition's dormant states' estimated bytes ([`estimate`]).
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Keeps `entity`'s state (the most recently used one now), estimated at `bytes`.
    pub(super) fn keep(&mut self, entity: EntityId, seed: Seed<E>, bytes: usize) {
        self.clock += 1;
        match self.states.insert(entity, (seed, self.clock, bytes)) {
            Some((_, _, old)) => self.uncount(0, old),
            None => {
                self.totals.entities.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.bytes += bytes;
        self.totals.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn uncount(&mut self, entities: usize, bytes: usize) {
        self.bytes -= bytes;
        self.totals.entities.fetch_sub(entities, Ordering::Relaxed);
        self.totals.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Takes `entity`'s state out (for its new actor).
    pub(super) fn take(&mut self, entity: &EntityId) -> Option<Seed<E>> {
        let (seed, _, bytes) = self.states.remove(entity)?;
        self.uncount(1, bytes);
        Some(seed)
    }

    /// Drops `entity`'s state, if kept (it is not to be trusted any more).
    pub(super) fn forget(&mut self, entity: &EntityId) {
        drop(self.take(entity));
    }

    /// Keeps the process's totals within `budget`: once over either bound, drops this
    /// partition's least recently used states until the totals are down to 90 % of both (or
    /// this partition has none left), so that eviction runs in batches, not at every
    /// passivation. Returns how many went.
    pub(super) fn evict_over(&mut self, budget: Budget) -> usize {
        let entities = self.totals.entities.load(Ordering::Relaxed);
        let bytes = self.totals.bytes.load(Ordering::Relaxed);
        let over_entities = budget.entities.is_some_and(|b| entities > b);
        let over_bytes = budget.bytes.is_some_and(|b| bytes > b);
        if !over_entities && !over_bytes {
            return 0;
        }
        let entities_to_drop = budget
            .entities
            .map_or(0, |b| entities.saturating_sub(b * 9 / 10));
        let bytes_to_drop = budget.bytes.map_or(0, |b| bytes.saturating_sub(b * 9 / 10));
        let mut kept: Vec<(u64, usize)> = self
            .states
            .values()
            .map(|(_, stamp, bytes)| (*stamp, *bytes))
            .collect();
        kept.sort_unstable();
        let (mut count, mut dropped_bytes, mut cutoff) = (0, 0, None);
        for (stamp, bytes) in kept {
            if count >= entities_to_drop && dropped_bytes >= bytes_to_drop {
                break;
            }
            count += 1;
            dropped_bytes += bytes;
            cutoff = Some(stamp);
        }
        let Some(cutoff) = cutoff else {
            return 0;
        };
        // Stamps are unique: exactly `count` states are at or below the cutoff.
        self.states.retain(|_, (_, stamp, _)| *stamp > cutoff);
        self.uncount(count, dropped_bytes);
        count
    }
}

impl<E: Entity> Drop for Dormant<E> {
    fn drop(&mut self) {
        let (entities, bytes) = (self.states.len(), self.bytes);
        self.uncount(entities, bytes);
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

    fn entities(budget: usize) -> Budget {
        Budget {
            entities: Some(budget),
            bytes: None,
        }
    }

    fn totals(totals: &DormantTotals) -> (usize, usize) {
        (
            totals.entities.load(Ordering::Relaxed),
            totals.bytes.load(Ordering::Relaxed),
        )
    }

    #[test]
    fn the_least_recently_kept_states_go_first_down_to_ninety_percent() {
        let total = Arc::new(DormantTotals::default());
        let mut dormant = Dormant::<Counter>::new(Arc::clone(&total));
        for n in 0..10 {
            dormant.keep(id(n), seed(n), 1);
        }
        // e0 is used again: it is now the most recent.
        let e0 = dormant.take(&id(0)).unwrap();
        dormant.keep(id(0), e0, 1);
        assert_eq!(dormant.evict_over(entities(10)), 0);
        dormant.keep(id(10), seed(10), 1);
        // 11 kept, budget 10: down to 9.
        assert_eq!(dormant.evict_over(entities(10)), 2);
        assert_eq!(totals(&total), (9, 9));
        assert!(dormant.take(&id(1)).is_none() && dormant.take(&id(2)).is_none());
        assert_eq!(dormant.take(&id(0)).map(|s| s.state), Some(0));
        drop(dormant);
        assert_eq!(totals(&total), (0, 0));
    }

    #[test]
    fn a_partition_drops_only_what_it_holds() {
        let total = Arc::new(DormantTotals::default());
        total.entities.store(50, Ordering::Relaxed);
        let mut dormant = Dormant::<Counter>::new(Arc::clone(&total));
        dormant.keep(id(1), seed(1), 7);
        assert_eq!(dormant.evict_over(entities(10)), 1);
        assert_eq!(dormant.len(), 0);
        assert_eq!(totals(&total), (50, 0));
    }

    #[test]
    fn the_byte_budget_drops_the_oldest_until_ninety_percent() {
        let total = Arc::new(DormantTotals::default());
        let mut dormant = Dormant::<Counter>::new(Arc::clone(&total));
        // Ten states of 100 bytes, one of 500 (the most recent): 1,500 bytes.
        for n in 0..10 {
            dormant.keep(id(n), seed(n), 100);
        }
        dormant.keep(id(10), seed(10), 500);
        let budget = Budget {
            entities: Some(100),
            bytes: Some(1_400),
        };
        // Down to 1,260 bytes: the three oldest go (1,200 left).
        assert_eq!(dormant.evict_over(budget), 3);
        assert_eq!(totals(&total), (8, 1_200));
        assert_eq!(dormant.bytes(), 1_200);
        assert!(dormant.take(&id(2)).is_none() && dormant.take(&id(3)).is_some());
        assert_eq!(dormant.evict_over(budget), 0);
    }

    #[test]
    fn a_state_is_estimated_at_its_encoding_and_its_entry() {
        let small = estimate(&id(1), &seed(1), Codec::Bincode);
        let large = estimate(&id(1), &seed(u32::MAX), Codec::Bincode);
        // bincode's varint: 1 byte for 1, 5 for u32::MAX.
        assert_eq!(large - small, 4);
        assert!(small > std::mem::size_of::<Seed<Counter>>(), "{small}");
    }
}

#[cfg(test)]
mod layout {
    use super::*;
    use crate::runtime::entity_actor::outcome_header::LastOutcome;

    /// A state laid out like the bench entity's: two counters and a byte vector (40 bytes).
    #[derive(Default, serde::Serialize, serde::Deserialize)]
    struct Small {
        count: u64,
        last: u64,
        blob: Vec<u8>,
    }

    struct Bench;
    impl Entity for Bench {
        type Command = ();
        type Event = ();
        type State = Small;
        type Rejection = String;
        fn decide(_: &Small, _: ()) -> Result<Vec<()>, String> {
            Ok(vec![])
        }
        fn apply(_: &mut Small, _: &()) {}
    }

    /// What 10,000 dormant states of the bench-like entity hold on the heap (counting
    /// allocator, `test_alloc`): the map's table and the ids' allocations, per entity, against
    /// the target of issue 24 (2 x the encoded state + 100 bytes), printed with the split.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn what_a_dormant_state_costs_on_the_heap() {
        const N: usize = 10_000;
        let ids: Vec<EntityId> = {
            let before = crate::test_alloc::held_by_this_thread();
            let ids: Vec<EntityId> = (0..N)
                .map(|n| EntityId::new(format!("e{n}")).unwrap())
                .collect();
            let held = crate::test_alloc::held_by_this_thread() - before;
            let vec = (N * std::mem::size_of::<EntityId>()) as isize;
            eprintln!(
                "DORMANT ids: {} bytes per id allocation",
                (held - vec) / N as isize
            );
            ids
        };
        let before = crate::test_alloc::held_by_this_thread();
        let mut dormant = Dormant::<Bench>::new(Arc::new(DormantTotals::default()));
        for id in &ids {
            dormant.keep(id.clone(), Seed::default(), 0);
        }
        let table = (crate::test_alloc::held_by_this_thread() - before) as usize;
        let entry = std::mem::size_of::<(EntityId, Kept<Bench>)>();
        let state = std::mem::size_of::<Small>();
        let encoded = Codec::Bincode.encoded_len(&Small::default()).unwrap();
        eprintln!(
            "DORMANT table: {} bytes per entity for {N} ({entry}-byte entries, {state} of them the state, \
             capacity {}); encoded state {encoded} bytes; target 2 x {encoded} + 100 = {}",
            table / N,
            dormant.states.capacity(),
            2 * encoded + 100
        );
        // The table is the entries and a control byte each, with spare capacity (at most a
        // doubling, hashbrown's growth).
        assert!(table / N >= entry, "{table}");
        assert!(table / N <= 2 * (entry + 1) + 16, "{table}");
    }

    /// Where a dormant entry's bytes go, beside its state (x86_64): the id (an `Arc<str>`, 16,
    /// plus its own allocation), the last outcome (24), the armed timers (an empty `BTreeMap`,
    /// 24), the command and journal sequences (16), the events since the snapshot (4, padded to
    /// 8), the remembered outbox origins (a pointer, null until the first: 8), the LRU stamp (8)
    /// and the byte estimate (8): 112 bytes of jetshard's own, plus the hash map's control byte
    /// and spare capacity. A guard against it growing unnoticed.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_dormant_entry_holds_at_most_112_bytes_beside_its_state() {
        let state = std::mem::size_of::<Small>();
        let entry = std::mem::size_of::<(EntityId, Kept<Bench>)>();
        assert_eq!(state, 40);
        assert_eq!(std::mem::size_of::<Option<LastOutcome>>(), 24);
        assert!(
            entry - state <= 112,
            "{entry} bytes for a {state}-byte state"
        );
    }
}
