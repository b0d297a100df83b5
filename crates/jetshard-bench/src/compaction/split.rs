//! What a purge costs the commands, split within one run: each command (scheduled send ->
//! event stored) either overlapped a purge request in flight (of any partition: the journal
//! stream's partitions share one raft group) or did not, and the two sets' latencies are
//! compared. Robust to a loaded machine: both sets ran under the same load, at the same time.
//!
//! The purge intervals come from jetshard's `purge sent` / `purge done` trace events
//! ([`crate::probe::take_purge_marks`]), timed on the bench's clock (`stats::now_ns`).

use serde::Serialize;

use crate::probe::PurgeMark;
use crate::stats::Summary;

/// The commands of one run, split by whether a purge was in flight during them.
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub(super) struct Split {
    /// Purge requests seen (start and end both traced).
    pub(super) purges: usize,
    /// Their time in flight, summed, and the share of the run's span a purge was in flight.
    pub(super) purge_ms: f64,
    pub(super) busy_share: f64,
    /// Latencies (ms) of the commands that overlapped a purge and of the others.
    pub(super) during: Summary,
    pub(super) outside: Summary,
    /// The same split by the publish instant alone (a purge in flight when the command was
    /// sent): free of the overlap split's lean (a slow command spans more time, so meets a
    /// purge more often).
    pub(super) sent_during: Summary,
    pub(super) sent_outside: Summary,
}

/// The purges' intervals `[start, end]` (ns), merged over all partitions, in order. A start
/// without its end (the run ended with the purge in flight) is dropped.
fn intervals(marks: &[PurgeMark]) -> (usize, u64, Vec<(u64, u64)>) {
    let mut open: std::collections::HashMap<u32, u64> = std::collections::HashMap::new();
    let mut each = Vec::new();
    for &(at, partition, start) in marks {
        if start {
            open.insert(partition, at);
        } else if let Some(from) = open.remove(&partition) {
            each.push((from, at.max(from)));
        }
    }
    let count = each.len();
    let total = each.iter().map(|(a, b)| b - a).sum();
    each.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(each.len());
    for (a, b) in each {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    (count, total, merged)
}

/// Whether `[from, to]` meets any of the merged, ordered `intervals`.
fn overlaps(intervals: &[(u64, u64)], from: u64, to: u64) -> bool {
    // The first interval ending at or after `from`.
    let first = intervals.partition_point(|&(_, end)| end < from);
    intervals.get(first).is_some_and(|&(start, _)| start <= to)
}

/// Splits `recorded` (scheduled send ns, latency ns) by the purges in `marks`.
pub(super) fn split(marks: &[PurgeMark], recorded: &[(u64, u64)]) -> Split {
    let (purges, total, merged) = intervals(marks);
    let (mut during, mut outside) = (Vec::new(), Vec::new());
    let (mut sent_during, mut sent_outside) = (Vec::new(), Vec::new());
    for &(at, latency) in recorded {
        let ms = latency as f64 / 1e6;
        match overlaps(&merged, at, at.saturating_add(latency)) {
            true => during.push(ms),
            false => outside.push(ms),
        }
        match overlaps(&merged, at, at) {
            true => sent_during.push(ms),
            false => sent_outside.push(ms),
        }
    }
    let span = match (
        recorded.iter().map(|r| r.0).min(),
        recorded.iter().map(|r| r.0 + r.1).max(),
    ) {
        (Some(a), Some(b)) if b > a => (b - a) as f64,
        _ => f64::NAN,
    };
    let busy: u64 = merged.iter().map(|(a, b)| b - a).sum();
    Split {
        purges,
        purge_ms: total as f64 / 1e6,
        busy_share: busy as f64 / span,
        during: Summary::of(&during),
        outside: Summary::of(&outside),
        sent_during: Summary::of(&sent_during),
        sent_outside: Summary::of(&sent_outside),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_is_during_a_purge_only_if_their_spans_meet_whatever_the_partition() {
        // Partition 0: purge [100, 200]; partition 1: [150, 300] (merged: [100, 300]);
        // partition 0 again: [1000, 1100]; partition 2 started at 2000 and never ended.
        let marks = [
            (100, 0, true),
            (150, 1, true),
            (200, 0, false),
            (300, 1, false),
            (1000, 0, true),
            (1100, 0, false),
            (2000, 2, true),
        ];
        let recorded = [
            (10, 50),    // [10, 60]: before
            (50, 50),    // [50, 100]: touches the start
            (250, 10),   // inside the merged span (partition 1 only)
            (301, 600),  // [301, 901]: between
            (900, 2000), // around the second purge
            (2001, 10),  // after the unfinished start: not a purge
        ];
        let split = split(&marks, &recorded);
        assert_eq!(split.purges, 3);
        assert!((split.purge_ms - 350.0 / 1e6).abs() < 1e-12);
        assert_eq!(split.during.count, 3);
        assert_eq!(split.outside.count, 3);
        assert!((split.during.max - 2000.0 / 1e6).abs() < 1e-12);
        assert!((split.outside.max - 600.0 / 1e6).abs() < 1e-12);
        // Sent while a purge was in flight: only the one at 250.
        assert_eq!(split.sent_during.count, 1);
        assert_eq!(split.sent_outside.count, 5);
        assert!((split.sent_during.max - 10.0 / 1e6).abs() < 1e-12);
    }
}
