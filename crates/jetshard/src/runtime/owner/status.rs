//! What an owner tells about itself: its phase on the health board, its load, its status.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::phase::Phase;
use super::state::{OwnerMsg, OwnerState};
use crate::entity::Entity;
use crate::health::PartitionHealth;
use crate::status::{PartitionStatus, QuarantinedEntity};
use crate::telemetry::Load;

/// How long [`OwnerState::count_pending`] waits for the consumer's info.
const PENDING_ASK_WITHIN: Duration = Duration::from_secs(5);

impl<E: Entity> OwnerState<E> {
    /// Posts this owner's phase on the system's health board.
    pub(super) fn post_health(&self) {
        let health = match &self.phase {
            Phase::Standby => PartitionHealth::Standby,
            Phase::Refused(_) => PartitionHealth::Refused,
            Phase::Owning(o) if o.isolation.is_some() => PartitionHealth::Isolating,
            Phase::Owning(_) => PartitionHealth::Serving,
            Phase::Releasing(..) => PartitionHealth::Releasing,
            Phase::CoolingDown(_) => PartitionHealth::CoolingDown,
        };
        self.shared.health.set(self.partition, health);
    }

    /// Sets the partition's gauges: entities and commands in hand. Returns the commands in
    /// hand (0 when not owning).
    ///
    /// One walk of the entities' slots for both counts: each walk of 10,000 slots misses the
    /// cache on nearly every one (docs/PERFORMANCE.md, "Where a warm command's client CPU goes").
    pub(super) fn post_load(&self) -> usize {
        let load = self.phase.owning_ref().map(|o| {
            let (resident, ack_pending) =
                o.entities.values().fold((0, 0), |(resident, pending), s| {
                    (
                        resident + usize::from(s.actor.is_some()),
                        pending + s.queue.len(),
                    )
                });
            Load {
                owned: true,
                resident,
                dormant: o.dormant.len(),
                quarantined: o.quarantined.len(),
                ack_pending,
            }
        });
        self.metrics.set_load(load);
        load.map_or(0, |l| l.ack_pending)
    }

    /// Counts the commands stored and not delivered yet from the consumer's info, in a task
    /// of its own, when `in_hand` commands are in hand and nothing was delivered since the
    /// last tick (one count at a time; the answer comes back as
    /// [`OwnerMsg::PendingCounted`]).
    ///
    /// `jetshard_pending_commands` is set from each delivery's own count, which costs no
    /// request but stops with the deliveries: an owner that does not keep up (`max_ack_pending`
    /// commands in hand) is delivered nothing more, and the gauge would keep its last value
    /// (0 after the last of a burst) while the commands behind pile up. Only then is the
    /// server asked; an idle owner asks nothing.
    pub(super) fn count_pending(&mut self, in_hand: usize) {
        let delivered = self.deliveries != self.deliveries_at_tick;
        self.deliveries_at_tick = self.deliveries;
        let Phase::Owning(o) = &self.phase else {
            return;
        };
        let counting = self
            .pending_count
            .as_ref()
            .is_some_and(|c| !c.is_finished());
        if delivered || in_hand == 0 || counting {
            return;
        }
        let (generation, deliveries, partition) = (o.generation, self.deliveries, self.partition);
        let stream = self.shared.commands(self.partition).clone();
        let consumer = self.shared.names.consumer(partition);
        let owner = self.myself.clone();
        self.pending_count = Some(tokio::spawn(async move {
            match tokio::time::timeout(PENDING_ASK_WITHIN, stream.consumer_info(consumer)).await {
                Ok(Ok(info)) => {
                    let _ = owner.cast(OwnerMsg::PendingCounted {
                        generation,
                        deliveries,
                        pending: info.num_pending,
                    });
                }
                Ok(Err(e)) => {
                    tracing::debug!(partition, error = %e, "pending commands not counted");
                }
                Err(_) => tracing::debug!(partition, "pending commands not counted in time"),
            }
        }));
    }

    /// Sets `jetshard_pending_commands` from [`count_pending`](Self::count_pending)'s answer,
    /// unless the generation changed or a delivery (with a newer count) came since the ask.
    pub(super) fn on_pending_counted(&self, generation: u64, deliveries: u64, pending: u64) {
        if let Phase::Owning(o) = &self.phase
            && o.generation == generation
            && self.deliveries == deliveries
        {
            self.metrics.pending.set(pending as f64);
        }
    }

    pub(super) fn status(&self) -> PartitionStatus {
        let owning = self.phase.owning_ref();
        let mut quarantined: Vec<QuarantinedEntity> = owning
            .map(|o| {
                o.quarantined
                    .iter()
                    .map(|(entity, q)| QuarantinedEntity {
                        entity: entity.to_string(),
                        journal_seq: q.journal_seq,
                        reason: q.reason.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        quarantined.sort_by(|a, b| a.entity.cmp(&b.entity));
        PartitionStatus {
            partition: self.partition,
            generation: owning.map(|o| o.generation),
            dormant_entities: owning.map_or(0, |o| o.dormant.len()),
            dormant_bytes: owning.map_or(0, |o| o.dormant.bytes()),
            resident_entities: owning.map_or(0, |o| {
                o.entities.values().filter(|s| s.actor.is_some()).count()
            }),
            commands_in_hand: owning
                .map_or(0, |o| o.entities.values().map(|s| s.queue.len()).sum()),
            applied: self.counters.applied,
            events_written: self.counters.events_written,
            rejected: self.counters.rejected,
            duplicates: self.counters.duplicates,
            dead_lettered: self.counters.dead_lettered,
            acquisitions: self.counters.acquisitions,
            failed_acquisitions: self.counters.failed_acquisitions,
            unconfirmed_writes: self.counters.unconfirmed_writes,
            journal_commits: self.commits.batches.load(Ordering::Relaxed),
            journal_records: self.commits.records.load(Ordering::Relaxed),
            write_conflicts: self.commits.conflicts.load(Ordering::Relaxed),
            entity_loads: self.load_stats.loads.load(Ordering::Relaxed),
            batched_loads: self.load_stats.batched.load(Ordering::Relaxed),
            load_reads: self.load_stats.reads.load(Ordering::Relaxed),
            quarantined,
        }
    }
}
