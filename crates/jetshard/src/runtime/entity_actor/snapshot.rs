//! Snapshots written: an entity's state stored so that its next load replays only what follows.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::outcome_header::LastOutcome;
use super::protocol::{EntityContext, EntityReport, panic_message};
use super::replay::Seed;
use crate::entity::{Entity, EntityId};
use crate::journal::{SnapshotRecord, WriteError};
use crate::telemetry::{self};

/// Writes a snapshot of `seed` (if the entity type writes them), fenced like its events.
/// Best effort: a snapshot is a cache of the events, so a failed one is logged and the entity
/// goes on; a fenced one tells the owner, which steps down.
///
/// Not while a timer is armed: loading reads the timer records after the latest snapshot
/// only, so a snapshot must not cover the `set` of a timer still armed. The snapshot waits
/// until the entity's timers have fired or been cancelled.
pub(super) async fn write_snapshot<E: Entity>(
    id: &EntityId,
    context: &EntityContext,
    seed: &mut Seed<E>,
) {
    let Some(snapshots) = E::snapshots() else {
        return;
    };
    if !seed.timers.is_empty() {
        tracing::trace!(partition = context.partition, entity = %id, armed = seed.timers.len(), "timers armed; no snapshot yet");
        return;
    }
    let encoded = catch_unwind(AssertUnwindSafe(|| {
        snapshots.encode(&seed.state, context.codec)
    }));
    let state = match encoded {
        Ok(Ok(state)) => state,
        Ok(Err(e)) => {
            tracing::warn!(partition = context.partition, entity = %id, error = %e, "state not encoded; no snapshot");
            return;
        }
        Err(panic) => {
            tracing::warn!(partition = context.partition, entity = %id, panic = %panic_message(&*panic), "encoding the state panicked; no snapshot");
            return;
        }
    };
    let record = SnapshotRecord {
        state: state.into(),
        version: snapshots.version(),
        command_seq: seed.last_command_seq,
        upto: seed.journal_seq,
        last_outcome: seed.last_outcome.as_ref().map(LastOutcome::to_header),
        origins: seed.origins.to_header(),
    };
    let upto = record.upto;
    let writing = std::time::Instant::now();
    match context.journal.snapshot(id, record).await {
        Ok(journal_seq) => {
            telemetry::record(&context.metrics.snapshot_seconds, writing.elapsed());
            tracing::debug!(
                partition = context.partition,
                entity = %id,
                generation = context.journal.generation(),
                cmd_seq = seed.last_command_seq,
                journal_seq,
                "snapshot written"
            );
            seed.unsnapshotted = 0;
            // Its next records name none of the commands the snapshot covers.
            if let Some(tail) = &mut seed.tail {
                tail.covered(upto);
            }
        }
        Err(e) => {
            macro_rules! not_written {
                ($level:expr) => {
                    tracing::event!(
                        $level,
                        partition = context.partition,
                        entity = %id,
                        generation = context.journal.generation(),
                        cmd_seq = seed.last_command_seq,
                        error = %e,
                        "snapshot not written"
                    )
                };
            }
            match e {
                // Not confirmed (a clustered stream refuses concurrent fenced writes, a leader
                // change): tried again after the entity's next command.
                WriteError::Unconfirmed(_) => not_written!(tracing::Level::DEBUG),
                // A newer generation owns the partition: the owner steps down now, not at a
                // next command that may never come.
                WriteError::Fenced { .. } => {
                    not_written!(tracing::Level::INFO);
                    (context.report)(EntityReport::Superseded {
                        generation: context.journal.generation(),
                    });
                }
                _ => not_written!(tracing::Level::WARN),
            }
        }
    }
}
