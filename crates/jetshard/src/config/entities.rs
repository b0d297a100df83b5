//! Builder settings of entities in memory (passivation, the resident cap, the dormant budgets)
//! and of their snapshots.

use std::time::Duration;

use super::{DEFAULT_MAX_DORMANT_ENTITIES, ShardConfigBuilder, switched};

impl ShardConfigBuilder {
    /// An entity with no command for this long is passivated (default 30 s): its actor stops
    /// and hands its state back to the partition's owner, which keeps it in a compact map
    /// (tens of bytes beyond the state, against kilobytes for a live actor) until the entity's
    /// next command starts a new actor with it.
    ///
    /// Passivation frees the actor only, never the state: every entity of a partition this
    /// process owns stays in memory, passivated or not (unlike Akka, where a passivated entity
    /// leaves memory). Memory is bounded by the entities owned, not by the active ones.
    pub fn passivate_after(mut self, idle: Duration) -> Self {
        self.config.passivate_after = idle;
        self
    }

    /// A cap on live entity actors in this process, over all its partitions (default none).
    /// Past it, the least recently active idle entities are passivated (down to 90 % of the
    /// cap); an entity with commands in hand is never passivated, so the cap can be exceeded by
    /// the entities busy at once.
    pub fn max_resident_entities(mut self, cap: usize) -> Self {
        self.config.max_resident_entities = Some(cap);
        self
    }

    /// A budget of entity states kept in memory without an actor (passivated, "dormant"), in
    /// this process over all its partitions (default 100 000). Past it, each owner drops its
    /// least recently used dormant states (down to 90 % of the budget); a dropped entity is
    /// loaded again from the journal (its latest snapshot and the records after it) on its next
    /// command. So memory is set by the entities in use, not by every entity the partitions have
    /// seen. [`dormant_entity_budget(false)`](Self::dormant_entity_budget): keep them all.
    pub fn max_dormant_entities(mut self, budget: usize) -> Self {
        self.config.max_dormant_entities = Some(budget);
        self
    }

    /// A budget of dormant states in bytes, in this process over all its partitions (default
    /// none: only [`max_dormant_entities`](Self::max_dormant_entities) bounds them). A dormant
    /// state is kept encoded (the entity type's codec) and decoded when the entity's next actor
    /// starts, so what it holds is known: one allocation of its encoding, its id and about 8
    /// bytes of sequences, plus its share of the owner's hash set, counted at 39 bytes (the
    /// table right after it grew; [`PartitionStatus::dormant_bytes`](crate::PartitionStatus::dormant_bytes)
    /// shows the sum). Both budgets apply, and past either one each owner drops its least
    /// recently used states (down to 90 % of it). At least 1024 bytes.
    pub fn max_dormant_bytes(mut self, bytes: usize) -> Self {
        self.config.max_dormant_bytes = Some(bytes);
        self
    }

    /// Whether [`max_dormant_entities`](Self::max_dormant_entities) bounds the dormant states
    /// (default on). Off: every dormant state is kept in memory (only
    /// [`max_dormant_bytes`](Self::max_dormant_bytes), if set, bounds them).
    pub fn dormant_entity_budget(mut self, on: bool) -> Self {
        self.config.max_dormant_entities = switched(
            self.config.max_dormant_entities,
            on,
            DEFAULT_MAX_DORMANT_ENTITIES,
        );
        self
    }

    /// Writes a snapshot of an entity's state after every `events` events it wrote since its
    /// last one (default 100), unless the entity type opted out ([`Entity::snapshots`]); 0: no
    /// periodic snapshots. Each snapshot is one more fenced journal write, of the whole state.
    ///
    /// [`Entity::snapshots`]: crate::Entity::snapshots
    pub fn snapshot_every(mut self, events: u32) -> Self {
        self.config.snapshot_every = (events > 0).then_some(events);
        self
    }

    /// Whether an entity writes a snapshot of its state when it is passivated and when its
    /// partition is released or handed off, if it wrote events since its last one (default on;
    /// not for entity types that opted out, [`Entity::snapshots`]).
    ///
    /// [`Entity::snapshots`]: crate::Entity::snapshots
    pub fn snapshot_on_passivation(mut self, on: bool) -> Self {
        self.config.snapshot_on_passivation = on;
        self
    }
}
