//! Compaction on an operator's word: what the journal shows no live state needs, purged (see
//! [`Admin::compact`]). The owners do the same in the background (`runtime/compaction.rs`),
//! through the same plan (`journal/compact/`).

use async_nats::jetstream::context::ConsumerInfoErrorKind;

use crate::error::Error;
use crate::journal::compact::{self, Rules};

use super::handle::Admin;

/// What [`Admin::compact`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Compacted {
    /// Snapshots read (one per entity that has one).
    pub snapshots: u64,
    /// Records removed (events and timer records covered by snapshots, outbox records of
    /// confirmed messages, timer records of timers no longer armed).
    pub purged: u64,
}

impl Admin {
    /// Bounds the journal, over all partitions or one, by the rules each owner's background
    /// compaction follows (`ShardConfigBuilder::compaction_interval`), dead letters aside:
    /// - every event that its entity's latest snapshot covers (each entity's events up to the
    ///   snapshot's `Jetshard-Snapshot-Upto`), and the timer records it covers (no timer was
    ///   armed when it was written);
    /// - the outbox records of commands whose messages were all confirmed (with their done
    ///   records, in one purge: none is published again);
    /// - the timer records of timers no longer armed (fired, cancelled or set again), of
    ///   commands below the partition's ack floor.
    ///
    /// Entities without a snapshot keep their events; dead letters (see
    /// [`purge_dead_letters`]) and fence records are kept. Safe while owners run: an owner
    /// loads an entity from its latest snapshot and the records after it, never from records
    /// the snapshot covers, and every rule is monotone (docs/ARCHITECTURE.md, "Compaction").
    ///
    /// After it, a snapshot is the only record of the history it covers, so
    /// - the entity type's code must keep reading its snapshots: a change of the state's
    ///   encoding (a new [`Snapshots`](crate::Snapshots) version) would load such entities from
    ///   the events left, without the history before;
    /// - readers of the journal (projections, audits) must have read the events before they
    ///   go, or start from the snapshots. docs/OPERATIONS.md, "Bounding the journal".
    ///
    /// [`purge_dead_letters`]: Self::purge_dead_letters
    ///
    /// # Errors
    /// [`Error::JetStream`] if the journal or a consumer cannot be read or the server refuses
    /// a purge.
    pub async fn compact(&self, partition: Option<u32>) -> Result<Compacted, Error> {
        let (commands, journals, names) = self.streams().await?;
        let mut done = Compacted::default();
        let partitions = match partition {
            Some(p) => p..p + 1,
            None => 0..u32::MAX,
        };
        for partition in partitions {
            let consumer = self.names.consumer(partition);
            let ack_floor = match commands.of(partition).consumer_info(&consumer).await {
                Ok(info) => info.ack_floor.stream_sequence,
                // Past the last partition.
                Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => break,
                Err(e) => return Err(Error::jetstream(format!("read consumer {consumer}"), e)),
            };
            let rules = Rules {
                ack_floor,
                snapshots_from: 1,
                dead_letters_before: None,
                horizon: u64::MAX,
                defer_timers_of_snapshotted: false,
            };
            let journal = journals.of(partition);
            let plan = compact::plan(journal, &names, partition, &rules).await?;
            done.snapshots += plan.snapshots;
            for purge in &plan.purges {
                done.purged += compact::purge(journal, purge).await?;
            }
        }
        Ok(done)
    }
}
