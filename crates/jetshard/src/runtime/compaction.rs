//! Each owner's background compaction: every `compaction_interval`, a task of the owner plans
//! what its partition's journal no longer needs (`journal::compact::plan`, the rules
//! `Admin::compact` follows, plus dead letters past their retention) and purges it, in batches
//! one [`TICK`] apart (`compaction_budget` purges each, more when the backlog needs it to be
//! done within half an interval: [`batch_size`]), re-reading the partition's fence before each
//! batch and ending once another generation holds it. One purge takes all of an entity's
//! records behind its latest snapshot, so a sweep's purges grow with the entities snapshotted
//! in an interval, not with the records written.
//!
//! A sweep plans only the records written before the previous sweep (the journal's last
//! sequence one interval before): each record stays at least one interval, so what copies or
//! reads the journal (a mirror, a backup, a projection) has that long to see it.
//!
//! Off the command path: the task holds nothing the owner or its entity actors wait on, and
//! the batches keep the server's purge work spread beside the commands' writes.
//!
//! A stale sweep (the fence moved between its check and a purge) is harmless: every rule is
//! monotone (a snapshot, a done record, a `fired` or `cancel` record, the ack floor and the
//! clock only ever allow more), so what a former owner planned stays unneeded for the next.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::stream::Stream;

use crate::error::Error;
use crate::journal::compact::{self, Rules};
use crate::journal::fence::{self, Fence};
use crate::wire::Names;

/// The period of a sweep's purge batches.
pub(crate) const TICK: Duration = Duration::from_millis(100);

/// What one owner's compaction needs.
pub(crate) struct Sweeper {
    pub(crate) journal: Stream<()>,
    pub(crate) commands: Stream<()>,
    pub(crate) names: Arc<Names>,
    pub(crate) partition: u32,
    /// The generation it compacts under: it stops once the partition's fence is another.
    pub(crate) fence: Fence,
    pub(crate) interval: Duration,
    pub(crate) budget: u32,
    pub(crate) dead_letter_retention: Option<Duration>,
}

/// How a sweep ended.
#[derive(Debug, PartialEq, Eq)]
enum Swept {
    /// Everything planned was purged (or tried): sweep again after the interval.
    Done,
    /// The partition has another generation: stop.
    Fenced,
}

impl Sweeper {
    /// Sweeps every interval until the partition is claimed by another generation (or the
    /// task is aborted by its owner). A sweep that fails is tried again at the next interval.
    pub(crate) async fn run(self) {
        let mut snapshots_from = 1;
        // Each sweep plans the records written before the previous one (or before the task
        // started): every record stays at least one interval (see `Rules::horizon`).
        let mut horizon = self.last_sequence().await;
        loop {
            tokio::time::sleep(self.interval).await;
            let next_horizon = self.last_sequence().await;
            let swept = match horizon {
                Some(horizon) => self.sweep(&mut snapshots_from, horizon).await,
                None => Ok(Swept::Done),
            };
            horizon = next_horizon;
            match swept {
                Ok(Swept::Done) => {}
                Ok(Swept::Fenced) => return,
                Err(e) => {
                    tracing::warn!(partition = self.partition, generation = self.fence.generation, error = %e, "compaction failed; trying again later");
                }
            }
        }
    }

    /// The journal's last sequence, `None` if it cannot be read now (that sweep is skipped).
    async fn last_sequence(&self) -> Option<u64> {
        match self.journal.get_info().await {
            Ok(info) => Some(info.state.last_sequence),
            Err(e) => {
                tracing::debug!(partition = self.partition, error = %e, "journal info not read; compaction waits");
                None
            }
        }
    }

    async fn sweep(&self, snapshots_from: &mut u64, horizon: u64) -> Result<Swept, Error> {
        if !self.holds().await? {
            return Ok(Swept::Fenced);
        }
        let consumer = self.names.consumer(self.partition);
        let ack_floor = self
            .commands
            .consumer_info(&consumer)
            .await
            .map_err(|e| Error::jetstream(format!("read consumer {consumer}"), e))?
            .ack_floor
            .stream_sequence;
        let rules = Rules {
            ack_floor,
            snapshots_from: *snapshots_from,
            dead_letters_before: self
                .dead_letter_retention
                .and_then(|r| SystemTime::now().checked_sub(r)),
            horizon,
        };
        let plan = compact::plan(&self.journal, &self.names, self.partition, &rules).await?;
        let mut purged = 0;
        let budget = batch_size(self.budget, plan.purges.len(), self.interval);
        for (index, batch) in plan.purges.chunks(budget).enumerate() {
            if index > 0 {
                tokio::time::sleep(TICK).await;
                if !self.holds().await? {
                    return Ok(Swept::Fenced);
                }
            }
            // One at a time: a server slow to purge (busy with commands) slows the sweep, not
            // the commands (with a batch sent side by side, p99 was 1.09-2.4x compaction off on
            // a saturated machine: docs/PERFORMANCE.md "compaction").
            for purge in batch {
                purged += compact::purge(&self.journal, purge).await?;
            }
        }
        // Only once every snapshot read was acted on: a sweep cut short reads them again.
        *snapshots_from = plan.snapshots_next;
        tracing::debug!(
            partition = self.partition,
            generation = self.fence.generation,
            purges = plan.purges.len(),
            purged,
            "compacted"
        );
        Ok(Swept::Done)
    }

    /// Whether the partition's latest fence record is still this owner's.
    async fn holds(&self) -> Result<bool, Error> {
        let latest = fence::latest(&self.journal, &self.names, self.partition)
            .await
            .map_err(|e| {
                Error::jetstream(
                    format!("read the fence of partition {}", self.partition),
                    e.to_string(),
                )
            })?;
        Ok(latest.is_some_and(|(seq, _)| seq == self.fence.seq))
    }
}

/// Purges per [`TICK`] for a sweep of `purges`: the configured `budget`, or more when the
/// backlog needs it to be done within half the `interval`, so that compaction keeps up with
/// whatever rate the partition is written at (a sweep's purges grow with the entities
/// snapshotted in an interval, each purge taking all of an entity's records behind its
/// snapshot) and sweeps never queue behind each other.
fn batch_size(budget: u32, purges: usize, interval: Duration) -> usize {
    let budget = usize::try_from(budget).unwrap_or(usize::MAX).max(1);
    let ticks = usize::try_from((interval / 2).as_millis() / TICK.as_millis().max(1))
        .unwrap_or(usize::MAX)
        .max(1);
    budget.max(purges.div_ceil(ticks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_grows_with_the_backlog_to_finish_within_half_the_interval() {
        let interval = Duration::from_secs(30);
        // 150 ticks in half an interval.
        assert_eq!(batch_size(8, 0, interval), 8);
        assert_eq!(batch_size(8, 1_200, interval), 8);
        assert_eq!(batch_size(8, 1_201, interval), 9);
        assert_eq!(batch_size(8, 15_000, interval), 100);
        // An interval shorter than two ticks: everything at once.
        assert_eq!(batch_size(8, 500, Duration::from_millis(150)), 500);
        assert_eq!(batch_size(0, 0, interval), 1);
    }
}
