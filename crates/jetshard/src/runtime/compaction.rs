//! Each owner's background compaction: every `compaction_interval`, a task of the owner plans
//! what its partition's journal no longer needs (`journal::compact::plan`, the rules
//! `Admin::compact` follows, plus dead letters past their retention) and purges it one request
//! at a time, paced ([`Pace`]): spread over [`SPREAD_PERCENT`] of the interval, at most `compaction_budget` per
//! [`TICK`], a pause of [`RELIEF`] times each purge's time after it, faster only when the sweep
//! would not otherwise be done within the interval, [`CATCH_UP`] at a time once past it. It
//! re-reads the partition's fence before the first purge and every [`FENCE_EVERY`] purges or
//! [`FENCE_AFTER`], ending once another generation holds it. One purge takes an entity's
//! events behind its latest snapshot, one the partition's timer records done with, so a
//! sweep's purges grow with the entities snapshotted in an interval, not with the records
//! written. Partitions sweep at their own
//! phases of the interval ([`phase`]), on a fixed schedule: a sweep that runs past its interval
//! delays the next, never doubles it.
//!
//! A sweep plans only the records written before its horizon, the journal's last sequence
//! [`keep`] before it (an interval, at most 2 s): each record stays at least that long, so
//! what copies or reads the journal (a mirror, a backup, a projection) has that long to see it,
//! and a record waits at most an interval and `keep` to be planned. The partition's outbox
//! purge, when there is one, goes first.
//!
//! Each sweep is logged (`compaction sweep`, debug; info when it ran past its interval: what it
//! read, planned, sent, removed, the server's time) and counted (`jetshard_compaction_*`).
//!
//! Off the command path: the task holds nothing the owner or its entity actors wait on, and
//! the pacing keeps the server's purge work spread thinly beside the commands' writes.
//!
//! A stale sweep (the fence moved between its check and a purge) is harmless: every rule is
//! monotone (a snapshot, a done record, a `fired` or `cancel` record, the ack floor and the
//! clock only ever allow more), so what a former owner planned stays unneeded for the next.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::stream::Stream;

use metrics::{Counter, Histogram, Label, counter, histogram};
use tokio::time::Instant;

use crate::error::Error;
use crate::journal::compact::{self, Rules};
use crate::journal::fence::{self, Fence};
use crate::telemetry;
use crate::wire::Names;

/// The target of the `purge sent` / `purge done` trace events around each purge request
/// (field `partition`): what a subscriber needs to tell when a purge was in flight.
#[cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
pub const PURGE_TARGET: &str = "jetshard::compaction::purge";

/// The unit of `compaction_budget` (purges per tick).
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

/// A partition's compaction metrics (`telemetry`), registered once per sweeper.
struct SweepMetrics {
    done: Counter,
    late: Counter,
    failed: Counter,
    purges: Counter,
    removed: Counter,
    purge_seconds: Histogram,
}

impl SweepMetrics {
    fn new(entity_type: &str, partition: u32) -> Self {
        let labels = vec![
            Label::new("entity_type", entity_type.to_owned()),
            Label::new("partition", partition.to_string()),
        ];
        let outcome = |value: &'static str| {
            let mut all = labels.clone();
            all.push(Label::from_static_parts("outcome", value));
            counter!(telemetry::COMPACTION_SWEEPS, all)
        };
        Self {
            done: outcome("done"),
            late: outcome("late"),
            failed: outcome("failed"),
            purges: counter!(telemetry::COMPACTION_PURGES, labels.clone()),
            removed: counter!(telemetry::COMPACTION_REMOVED, labels.clone()),
            purge_seconds: histogram!(telemetry::COMPACTION_PURGE_SECONDS, labels),
        }
    }
}

/// What one sweep did, logged (`jetshard::runtime::compaction` at debug, at info when the sweep
/// ran past its interval) and counted (`SweepMetrics`).
#[derive(Debug, Default)]
struct SweepLog {
    /// Snapshots read (written since the last sweep, up to the horizon).
    snapshots: u64,
    /// Purge requests planned and sent.
    planned: usize,
    sent: usize,
    /// Records they removed.
    removed: u64,
    /// The server's time for them, summed, and the slowest.
    server: Duration,
    slowest: Duration,
    /// Journal sequences written after the horizon when the sweep planned (all partitions'):
    /// left to the next sweep.
    above_horizon: u64,
}

impl SweepLog {
    /// Logs the sweep as `compaction sweep`, at info when it ran past its interval (`late`),
    /// else at debug: a tracing event's level is fixed where it is written, hence the macro
    /// written out at both levels. Called from this module, so that the event's target stays
    /// `jetshard::runtime::compaction`.
    fn emit(&self, partition: u32, generation: u64, took: Duration, late: bool) {
        let server_ms = self.server.as_secs_f64() * 1e3;
        let slowest_ms = self.slowest.as_secs_f64() * 1e3;
        let total_ms = took.as_secs_f64() * 1e3;
        let log = self;
        macro_rules! sweep_event {
            ($level:expr) => {
                tracing::event!(
                    $level,
                    partition,
                    generation,
                    snapshots = log.snapshots,
                    planned = log.planned,
                    sent = log.sent,
                    removed = log.removed,
                    server_ms,
                    slowest_ms,
                    total_ms,
                    above_horizon = log.above_horizon,
                    late,
                    "compaction sweep"
                )
            };
        }
        if late {
            sweep_event!(tracing::Level::INFO);
        } else {
            sweep_event!(tracing::Level::DEBUG);
        }
    }
}

impl Sweeper {
    /// Sweeps every interval (at the partition's phase, [`phase`]) until the partition is
    /// claimed by another generation (or the task is aborted by its owner). A sweep that fails
    /// is tried again at the next interval; one that runs past its interval delays the next
    /// (by [`keep`] after it ends), never two at once.
    pub(crate) async fn run(self) {
        let metrics = SweepMetrics::new(self.names.entity_type(), self.partition);
        let keep = keep(self.interval);
        let mut snapshots_from = 1;
        // Owners acquired together would sweep together, every interval, each sweep's plan and
        // purges landing on the server at once: each partition starts at its own phase.
        let mut next = Instant::now() + phase(self.partition, self.interval) + self.interval;
        loop {
            // Each sweep plans the records written `keep` before it (see `Rules::horizon`):
            // sweeps follow a fixed schedule, so a record waits at most an interval and `keep`
            // to be planned, whatever a sweep took.
            tokio::time::sleep_until(next - keep).await;
            let horizon = self.last_sequence().await;
            tokio::time::sleep_until(next).await;
            let mut log = SweepLog::default();
            let swept = match horizon {
                Some(horizon) => self.sweep(&mut snapshots_from, horizon, &mut log).await,
                None => Ok(Swept::Done),
            };
            let took = next.elapsed();
            let late = took >= self.interval;
            metrics.purges.increment(log.sent as u64);
            metrics.removed.increment(log.removed);
            match swept {
                Ok(Swept::Done) if late => metrics.late.increment(1),
                Ok(Swept::Done) => metrics.done.increment(1),
                Ok(Swept::Fenced) => return,
                Err(ref e) => {
                    metrics.failed.increment(1);
                    tracing::warn!(partition = self.partition, generation = self.fence.generation, error = %e, "compaction failed; trying again later");
                }
            }
            if log.sent > 0 {
                metrics
                    .purge_seconds
                    .record(log.server.as_secs_f64() / log.sent as f64);
            }
            log.emit(self.partition, self.fence.generation, took, late);
            next = (next + self.interval).max(Instant::now() + keep);
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

    async fn sweep(
        &self,
        snapshots_from: &mut u64,
        horizon: u64,
        log: &mut SweepLog,
    ) -> Result<Swept, Error> {
        let started = std::time::Instant::now();
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
            defer_timers_of_snapshotted: true,
        };
        let plan = compact::plan(&self.journal, &self.names, self.partition, &rules).await?;
        log.snapshots = plan.snapshots;
        log.planned = plan.purges.len();
        log.above_horizon = self
            .last_sequence()
            .await
            .map_or(0, |last| last.saturating_sub(horizon));
        let pace = Pace::new(self.interval, self.budget);
        let mut took = Duration::ZERO;
        let (mut checked, mut since_check) = (std::time::Instant::now(), 0);
        let mut index = 0;
        while index < plan.purges.len() {
            if index > 0 {
                let remaining = plan.purges.len() - index;
                tokio::time::sleep(pace.gap(started.elapsed(), remaining, took)).await;
                if since_check >= FENCE_EVERY || checked.elapsed() >= FENCE_AFTER {
                    if !self.holds().await? {
                        return Ok(Swept::Fenced);
                    }
                    (checked, since_check) = (std::time::Instant::now(), 0);
                }
            }
            // One at a time while on schedule: a server slow to purge (busy with commands)
            // slows the sweep, not the commands. A sweep past its interval is behind the
            // snapshots: [`CATCH_UP`] at a time, so that compaction's capacity is not one
            // purge per server round trip.
            let behind = started.elapsed() >= self.interval;
            let end = (index + if behind { CATCH_UP } else { 1 }).min(plan.purges.len());
            let one = std::time::Instant::now();
            // For a tool measuring what a purge costs the commands in one run (the bench's
            // in-run split): when each purge was in flight. Disabled by default filters.
            tracing::trace!(target: PURGE_TARGET, partition = self.partition, purges = end - index, "purge sent");
            let done = futures::future::try_join_all(
                plan.purges[index..end]
                    .iter()
                    .map(|purge| compact::purge(&self.journal, purge)),
            )
            .await?;
            took = one.elapsed();
            tracing::trace!(target: PURGE_TARGET, partition = self.partition, "purge done");
            log.removed += done.iter().sum::<u64>();
            log.sent += end - index;
            log.server += took;
            log.slowest = log.slowest.max(took);
            since_check += end - index;
            index = end;
        }
        // Only once every snapshot read was acted on: a sweep cut short reads them again.
        *snapshots_from = plan.snapshots_next;
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

/// Where a partition's sweeps start within the interval: spread over it by the partition
/// number (the golden ratio's fraction keeps any number of partitions apart).
fn phase(partition: u32, interval: Duration) -> Duration {
    interval.mul_f64((f64::from(partition) * 0.618_033_988_749_895).fract())
}

/// How long before a sweep its horizon is read: the records written in that time wait for the
/// next sweep, so that every record stays at least this long (what copies or reads the
/// journal, a mirror, a backup, a projection, has that long to see it). An interval, at most
/// [`KEEP_AT_MOST`].
fn keep(interval: Duration) -> Duration {
    interval.min(KEEP_AT_MOST)
}

/// The longest a record is kept from compaction once written (see [`keep`]).
const KEEP_AT_MOST: Duration = Duration::from_secs(2);

/// The fence is read again before the first purge, then after this many purges or this long.
const FENCE_EVERY: usize = 32;
const FENCE_AFTER: Duration = Duration::from_secs(1);

/// Purges in flight at once in a sweep that is past its interval (behind the snapshots).
const CATCH_UP: usize = 4;

/// How long the server is left to the commands after a purge, in multiples of the time that
/// purge took: a sweep's purges take at most about a fifth of the server's time while the
/// schedule allows (a busy server answers slowly, so the sweep slows down with it).
const RELIEF: u32 = 4;

/// A sweep's pacing: its purges spread evenly over [`SPREAD_PERCENT`] of the interval (not sent in bursts),
/// never faster than `budget` per [`TICK`] and after each purge a pause of [`RELIEF`] times
/// what it took, unless the sweep would then not be done within the interval: a backlog is
/// purged as fast as it needs to be, so that the journal stays bounded at any write rate (a
/// sweep's purges grow with the entities snapshotted in an interval, each purge taking all of
/// an entity's records behind its snapshot) and sweeps never queue behind each other.
/// The share of the interval a sweep's purges are spread over: the thinner, the fewer commands
/// meet a purge on the server (R3 at 300 cmd/s, one run each: command p99 1.22x compaction off
/// over 80%, 1.71x over half), with a fifth of the interval left for a slow server.
const SPREAD_PERCENT: u32 = 80;

#[derive(Debug, Clone, Copy)]
struct Pace {
    interval: Duration,
    /// The shortest gap the budget allows.
    floor: Duration,
}

impl Pace {
    fn new(interval: Duration, budget: u32) -> Self {
        Self {
            interval,
            floor: TICK / budget.max(1),
        }
    }

    /// The pause before the next purge, `elapsed` into the sweep, with `remaining` purges
    /// (this one included) left, the last one having taken `took`.
    fn gap(&self, elapsed: Duration, remaining: usize, took: Duration) -> Duration {
        let remaining = u32::try_from(remaining).unwrap_or(u32::MAX).max(1);
        let spread = (self.interval * SPREAD_PERCENT / 100).saturating_sub(elapsed) / remaining;
        let latest = self.interval.saturating_sub(elapsed) / remaining;
        spread
            .max(self.floor)
            .max(took.saturating_mul(RELIEF))
            .min(latest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_events::{Event, Recorder};

    #[test]
    fn a_sweep_is_logged_at_info_when_late_else_at_debug_with_its_figures() {
        let log = SweepLog {
            snapshots: 2,
            planned: 3,
            sent: 3,
            removed: 40,
            server: Duration::from_millis(500),
            slowest: Duration::from_millis(250),
            above_horizon: 5,
        };
        let recorder = Recorder::default();
        tracing::subscriber::with_default(recorder.clone(), || {
            log.emit(3, 7, Duration::from_millis(1_500), true);
            log.emit(3, 7, Duration::from_millis(1_500), false);
        });
        let fields = |late: &str| -> Vec<(String, String)> {
            [
                ("partition", "3"),
                ("generation", "7"),
                ("snapshots", "2"),
                ("planned", "3"),
                ("sent", "3"),
                ("removed", "40"),
                ("server_ms", "500.0"),
                ("slowest_ms", "250.0"),
                ("total_ms", "1500.0"),
                ("above_horizon", "5"),
                ("late", late),
            ]
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .to_vec()
        };
        let event = |level, late| Event {
            level,
            target: "jetshard::runtime::compaction".to_owned(),
            message: "compaction sweep".to_owned(),
            fields: fields(late),
        };
        assert_eq!(
            recorder.events(),
            vec![
                event(tracing::Level::INFO, "true"),
                event(tracing::Level::DEBUG, "false")
            ]
        );
    }

    #[test]
    fn purges_are_spread_over_most_of_the_interval_and_hurried_only_by_a_backlog() {
        let pace = Pace::new(Duration::from_secs(30), 8);
        let ms = Duration::from_millis;
        // 10 purges: one every 2.4 s (80% of the interval), not 8 per 100 ms.
        assert_eq!(pace.gap(ms(0), 10, ms(1)), ms(2_400));
        // Late in the sweep: what is left of the 24 s, spread.
        assert_eq!(pace.gap(ms(23_000), 10, ms(1)), ms(100));
        // Past the 24 s: the budget's rate (8 per 100 ms).
        assert_eq!(
            pace.gap(ms(25_000), 10, ms(1)),
            ms(12) + Duration::from_micros(500)
        );
        // A slow purge (a busy server): four times its time to the commands.
        assert_eq!(pace.gap(ms(25_000), 10, ms(50)), ms(200));
        // Unless the sweep would not end within the interval: a backlog goes as fast as it
        // needs.
        assert_eq!(pace.gap(ms(25_000), 1_000, ms(50)), ms(5));
        assert_eq!(
            pace.gap(ms(29_000), 100_000, ms(1)),
            ms(0) + Duration::from_micros(10)
        );
        assert_eq!(pace.gap(ms(31_000), 5, ms(50)), Duration::ZERO);
        // The budget's rate gives way to the end of the interval too.
        assert_eq!(
            Pace::new(ms(200), 1).gap(ms(0), 3, ms(1)),
            ms(66) + Duration::from_nanos(666_666)
        );
    }

    #[test]
    fn records_are_kept_an_interval_at_most_two_seconds() {
        assert_eq!(keep(Duration::from_millis(200)), Duration::from_millis(200));
        assert_eq!(keep(Duration::from_secs(30)), KEEP_AT_MOST);
    }

    #[test]
    fn partitions_sweep_at_phases_spread_over_the_interval() {
        let interval = Duration::from_secs(10);
        let mut phases: Vec<Duration> = (0..8).map(|p| phase(p, interval)).collect();
        assert_eq!(phases[0], Duration::ZERO);
        assert!(phases.iter().all(|p| *p < interval));
        phases.sort();
        // Eight partitions: no two within a twentieth of the interval.
        assert!(
            phases.windows(2).all(|w| w[1] - w[0] >= interval / 20),
            "{phases:?}"
        );
    }
}
