//! Compaction: the events and timer records that snapshots cover, purged (see
//! [`Admin::compact`]).

use std::time::Duration;

use async_nats::jetstream::{self};
use futures::StreamExt;

use crate::error::Error;
use crate::wire::HDR_GENERATION;
use crate::wire::HDR_SNAPSHOT_UPTO;

use super::handle::Admin;

/// What [`Admin::compact`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Compacted {
    /// Snapshots read (one per entity that has one).
    pub snapshots: u64,
    /// Records removed (events, and timer records): each covered by its entity's snapshot.
    pub purged: u64,
}

impl Admin {
    /// Bounds the journal: removes every event that its entity's latest snapshot covers (each
    /// entity's events up to the snapshot's `Jetshard-Snapshot-Upto`), and the timer records it
    /// covers (no timer was armed when it was written), over all partitions or one. Entities without a snapshot, dead letters (see [`purge_dead_letters`]) and fence
    /// records are kept. Safe while owners run: an owner loads an entity from its latest
    /// snapshot and the records after it, never from records the snapshot covers.
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
    /// [`Error::JetStream`] if the journal cannot be read or the server refuses a purge.
    pub async fn compact(&self, partition: Option<u32>) -> Result<Compacted, Error> {
        let (_, journal) = self.streams().await?;
        let filter = match partition {
            Some(p) => self.names.partition_snapshots(p),
            None => self.names.all_snapshots(),
        };
        let consumer = journal
            .create_consumer(jetstream::consumer::pull::OrderedConfig {
                filter_subject: filter.clone(),
                headers_only: true,
                ..Default::default()
            })
            .await
            .map_err(|e| Error::jetstream(format!("read {filter}"), e))?;
        let mut done = Compacted::default();
        if consumer.cached_info().num_pending == 0 {
            return Ok(done);
        }
        let mut covered = Vec::new();
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| Error::jetstream(format!("read {filter}"), e))?;
        while let Ok(Some(next)) =
            tokio::time::timeout(Duration::from_secs(10), messages.next()).await
        {
            let message = next.map_err(|e| Error::jetstream(format!("read {filter}"), e))?;
            let pending = message
                .info()
                .map_err(|e| Error::jetstream(format!("read {filter}"), e.to_string()))?
                .pending;
            let headers = message.headers.clone().unwrap_or_default();
            let upto = crate::wire::header_u64(&headers, HDR_SNAPSHOT_UPTO);
            let written = crate::wire::header_u64(&headers, HDR_GENERATION).is_some();
            // `<t>.snap.<p>.<id>` -> `<t>.evt.<p>.<id>` and `<t>.tmr.<p>.<id>`.
            let subjects = self.names.covered_by_snapshot(&message.subject);
            if let (Some(upto), true, Some([events, timers])) = (upto, written, subjects) {
                done.snapshots += 1;
                covered.push((events, upto));
                // No snapshot is written while its entity has a timer armed: the timer records
                // it covers are of timers that fired or were cancelled.
                covered.push((timers, upto));
            }
            if pending == 0 {
                break;
            }
        }
        for (events, upto) in covered {
            let purged = journal
                .purge()
                .filter(events.clone())
                .sequence(upto + 1)
                .await
                .map_err(|e| Error::jetstream(format!("purge {events}"), e))?;
            done.purged += purged.purged;
        }
        Ok(done)
    }
}
