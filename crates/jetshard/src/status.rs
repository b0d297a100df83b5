//! What a running shard system reports: ownership changes and per-partition status.

use std::fmt;

/// A partition changed hands in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnershipEvent {
    /// The partition.
    pub partition: u32,
    /// The generation acquired or left.
    pub generation: u64,
    /// This process's node id.
    pub node: String,
    /// What happened.
    pub change: OwnershipChange,
}

/// The kind of an [`OwnershipEvent`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OwnershipChange {
    /// This process took the partition: its generation is claimed, its state rebuilt.
    Acquired,
    /// This process stopped owning the partition.
    Released {
        /// Why: pin lost, fenced, released on shutdown, ...
        reason: String,
    },
}

/// A snapshot of one partition in this process.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct PartitionStatus {
    /// The partition.
    pub partition: u32,
    /// The generation this process owns it under, if it does.
    pub generation: Option<u64>,
    /// Entities with a live actor.
    pub resident_entities: usize,
    /// Entities whose state is kept without an actor (within
    /// [`max_dormant_entities`](crate::ShardConfigBuilder::max_dormant_entities)).
    #[serde(default)]
    pub dormant_entities: usize,
    /// Their bytes: their encoded states, ids and sequences, and their share of the owner's
    /// table (as [`max_dormant_bytes`](crate::ShardConfigBuilder::max_dormant_bytes) counts
    /// them).
    #[serde(default)]
    pub dormant_bytes: usize,
    /// Commands received and not yet acknowledged.
    pub commands_in_hand: usize,
    /// Commands applied (events durable) since this process started.
    pub applied: u64,
    /// Events written to the journal by those commands.
    pub events_written: u64,
    /// Commands the entity rejected.
    pub rejected: u64,
    /// Redelivered commands recognised as applied before.
    pub duplicates: u64,
    /// Commands given up: terminated with a dead-letter record.
    pub dead_lettered: u64,
    /// How often this process acquired the partition.
    pub acquisitions: u64,
    /// How often this process failed to acquire it (claim, rebuild or recovery failed).
    #[serde(default)]
    pub failed_acquisitions: u64,
    /// Journal writes the server did not confirm (timeouts, leader changes, a full stream):
    /// retried here without spending a delivery.
    #[serde(default)]
    pub unconfirmed_writes: u64,
    /// Group commits of the partition's journal writes (one atomic batch each, or one message
    /// when only one command was ready).
    #[serde(default)]
    pub journal_commits: u64,
    /// Records (events, dead letters) written by those commits.
    #[serde(default)]
    pub journal_records: u64,
    /// Group commits the server refused because a fenced write was already in flight on the
    /// partition's fence subject (error 10164 of a clustered stream): retried, not expected in
    /// steady state.
    #[serde(default)]
    pub write_conflicts: u64,
    /// Entities loaded from the journal (on their first command or query, with neither an
    /// actor nor a dormant state).
    #[serde(default)]
    pub entity_loads: u64,
    /// Of them, those whose last records were read in one request with other entities of a
    /// pull burst (then each reads only the records after its snapshot, if any).
    #[serde(default)]
    pub batched_loads: u64,
    /// Requests those loads made of the server: each batched read once, each single read.
    #[serde(default)]
    pub load_reads: u64,
    /// Entities of the partition whose journal cannot be read back, while this process owns it.
    #[serde(default)]
    pub quarantined: Vec<QuarantinedEntity>,
}

/// The entity loads of some partitions, summed: [`PartitionStatus::entity_loads`],
/// [`batched_loads`](PartitionStatus::batched_loads) and
/// [`load_reads`](PartitionStatus::load_reads). Shown as `N entity loads, B from batched reads,
/// R reads (R/N a load)`.
///
/// ```
/// # async fn example(system: &jetshard::ShardSystem) -> Result<(), jetshard::Error> {
/// let loads = jetshard::Loads::of(&system.status().await?);
/// println!("{loads}");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Loads {
    /// Entities loaded from the journal.
    pub entities: u64,
    /// Of them, those whose last records were read with other entities of a pull burst.
    pub batched: u64,
    /// Requests those loads made of the server.
    pub reads: u64,
}

impl Loads {
    /// The loads of `partitions` (a [`ShardSystem::status`](crate::ShardSystem::status)), summed.
    pub fn of<'a>(partitions: impl IntoIterator<Item = &'a PartitionStatus>) -> Self {
        partitions
            .into_iter()
            .fold(Loads::default(), |sum, p| Loads {
                entities: sum.entities + p.entity_loads,
                batched: sum.batched + p.batched_loads,
                reads: sum.reads + p.load_reads,
            })
    }

    /// Requests per load (the reads over at least one load).
    pub fn reads_per_load(&self) -> f64 {
        self.reads as f64 / self.entities.max(1) as f64
    }
}

impl fmt::Display for Loads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} entity loads, {} from batched reads, {} reads ({:.2} a load)",
            self.entities,
            self.batched,
            self.reads,
            self.reads_per_load()
        )
    }
}

/// What one process running an entity type says of itself when asked on `<t>.status`
/// ([`Admin::nodes`](crate::admin::Admin::nodes)).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct NodeStatus {
    /// Its node id.
    pub node: String,
    /// Each of its partitions' owners, owning or not.
    pub partitions: Vec<PartitionStatus>,
}

/// An entity whose journal records cannot be read back (an event that no longer decodes, an
/// `apply` that panics): its commands are dead-lettered, naming the record, until a process whose
/// code reads it owns the partition (docs/OPERATIONS.md, "Poison").
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuarantinedEntity {
    /// The entity id.
    pub entity: String,
    /// The journal record at fault.
    pub journal_seq: u64,
    /// What is wrong with it.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded(
        partition: u32,
        entity_loads: u64,
        batched_loads: u64,
        load_reads: u64,
    ) -> PartitionStatus {
        PartitionStatus {
            partition,
            generation: Some(1),
            resident_entities: 0,
            dormant_entities: 0,
            dormant_bytes: 0,
            commands_in_hand: 0,
            applied: 0,
            events_written: 0,
            rejected: 0,
            duplicates: 0,
            dead_lettered: 0,
            acquisitions: 1,
            failed_acquisitions: 0,
            unconfirmed_writes: 0,
            journal_commits: 0,
            journal_records: 0,
            write_conflicts: 0,
            entity_loads,
            batched_loads,
            load_reads,
            quarantined: Vec::new(),
        }
    }

    #[test]
    fn loads_sum_the_partitions_counters() {
        let status = [loaded(0, 64, 60, 5), loaded(1, 36, 0, 36)];
        let loads = Loads::of(&status);
        assert_eq!((loads.entities, loads.batched, loads.reads), (100, 60, 41));
        assert_eq!(
            loads.to_string(),
            "100 entity loads, 60 from batched reads, 41 reads (0.41 a load)"
        );
        assert_eq!(Loads::of(&[]).reads_per_load(), 0.0);
    }
}
