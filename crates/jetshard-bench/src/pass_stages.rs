//! Where a drain pass's commands wait (`--pass-stages`): the stage marks of [`crate::stages`]
//! recorded over one pass, split by stage for the commands that loaded their entity and for the
//! others, with what no single command shows: how many commands each partition held at once
//! (pulled, not yet acknowledged) against its `max_ack_pending`, the pull requests, the batched
//! loads' reads (entities per read, permit wait, read time, reads at once) and loads at once.
//!
//! Recording costs CPU per event (a lock and a few small allocations): the figures of a pass
//! recorded this way are for the split, not for its rate.

use std::collections::HashMap;

use crate::stages::{self, Mark, Others, STAGES, Stage, UNKNOWN};
use crate::stats::{Summary, now_ns};

/// The steps printed, in order (`from`, `to`).
const STEPS: [(Stage, Stage); 8] = [
    (Stage::Pulled, Stage::Routed),
    (Stage::Routed, Stage::Started),
    (Stage::Started, Stage::Loading),
    (Stage::Loading, Stage::Loaded),
    (Stage::Started, Stage::Writing),
    (Stage::Writing, Stage::Written),
    (Stage::Written, Stage::Acking),
    (Stage::Pulled, Stage::Acking),
];

/// A pass being recorded: started before the pass opens.
pub struct PassStages {
    opened: u64,
}

impl PassStages {
    /// Starts recording (dropping whatever was recorded before).
    pub fn start() -> Self {
        stages::record(true);
        Self { opened: now_ns() }
    }

    /// Stops recording and prints the split of pass `pass` (named so in each line);
    /// `budget` is each partition's `max_ack_pending`.
    pub fn finish(self, pass: usize, budget: u32) {
        let ended = now_ns();
        let (marks, others) = stages::take();
        for line in split(&marks, &others, self.opened, ended, budget) {
            eprintln!("  pass {pass} stages: {line}");
        }
    }
}

/// Each command's first mark of each stage, and its partition (from the first mark that has one).
type ByCommand = HashMap<u64, ([Option<u64>; STAGES], u32)>;

fn by_command(marks: &[Mark]) -> ByCommand {
    let mut by: ByCommand = HashMap::new();
    for &(at, seq, stage, partition) in marks {
        if stage == Stage::Stored {
            continue;
        }
        let (stages, p) = by.entry(seq).or_insert(([None; STAGES], UNKNOWN));
        stages[stage.index()].get_or_insert(at);
        if partition != UNKNOWN && *p == UNKNOWN {
            *p = partition;
        }
    }
    by
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn summary_line(name: &str, samples: &[f64]) -> String {
    if samples.is_empty() {
        return format!("{name}: none");
    }
    let s = Summary::of(samples);
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    format!(
        "{name}: p50 {:.2} p99 {:.2} max {:.2} mean {:.2} ms (n {})",
        s.p50,
        s.p99,
        s.max,
        mean,
        samples.len()
    )
}

/// A level over time: `changes` (`now_ns`, +1/-1) folded from `from` to `to`: its time-weighted
/// mean, its maximum, and the share of the time it was at or above `at_least`.
fn level(changes: &mut [(u64, i64)], from: u64, to: u64, at_least: i64) -> (f64, i64, f64) {
    changes.sort_unstable();
    let (mut now, mut current, mut max) = (from, 0i64, 0i64);
    let (mut weighted, mut full) = (0f64, 0u64);
    for &(at, change) in changes.iter() {
        let at = at.clamp(from, to);
        let span = at - now;
        weighted += current as f64 * span as f64;
        if current >= at_least {
            full += span;
        }
        now = at;
        current += change;
        max = max.max(current);
    }
    let span = to.saturating_sub(now);
    weighted += current as f64 * span as f64;
    if current >= at_least {
        full += span;
    }
    let whole = (to - from).max(1) as f64;
    (weighted / whole, max, full as f64 / whole)
}

/// Tenths of the pass: commands pulled, acknowledged, and loads begun in each.
fn timeline(commands: &ByCommand, opened: u64, ended: u64) -> Vec<String> {
    let tenth = ((ended - opened) / 10).max(1);
    let mut counts = [[0u32; 10]; 3];
    for (stages, _) in commands.values() {
        for (row, stage) in [Stage::Pulled, Stage::Acking, Stage::Loading]
            .into_iter()
            .enumerate()
        {
            if let Some(at) = stages[stage.index()] {
                let bucket = (at.saturating_sub(opened) / tenth).min(9) as usize;
                counts[row][bucket] += 1;
            }
        }
    }
    let row = |name: &str, counts: &[u32; 10]| {
        let cells: Vec<String> = counts.iter().map(u32::to_string).collect();
        format!("  {name:<8} {}", cells.join(" "))
    };
    vec![
        format!("per tenth of the pass ({:.0} ms each):", ms(tenth)),
        row("pulled", &counts[0]),
        row("acked", &counts[1]),
        row("loads", &counts[2]),
    ]
}

/// The pass's first second by partition, in tenths of it: commands pulled and acknowledged, and
/// the pull requests sent (a slow start shows here: which of the two stopped).
fn start_by_partition(commands: &ByCommand, others: &Others, opened: u64) -> Vec<String> {
    const BIN: u64 = 100_000_000;
    let bin = |at: u64| at.checked_sub(opened).map(|d| d / BIN).filter(|b| *b < 10);
    let mut by: std::collections::BTreeMap<u32, [[u32; 10]; 3]> = Default::default();
    for (stages, partition) in commands.values() {
        let counts = by.entry(*partition).or_default();
        for (row, stage) in [Stage::Pulled, Stage::Acking].into_iter().enumerate() {
            if let Some(b) = stages[stage.index()].and_then(bin) {
                counts[row][b as usize] += 1;
            }
        }
    }
    for (at, partition) in &others.pulls {
        if let Some(b) = bin(*at) {
            by.entry(*partition).or_default()[2][b as usize] += 1;
        }
    }
    let mut lines = vec![
        "the first second by partition, per 100 ms: pulled / acked / pull requests".to_owned(),
    ];
    for (partition, counts) in by {
        let row = |r: usize| {
            counts[r]
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        };
        lines.push(format!(
            "  p{partition}: {} / {} / {}",
            row(0),
            row(1),
            row(2)
        ));
    }
    lines
}

/// The lines of one pass's split.
fn split(marks: &[Mark], others: &Others, opened: u64, ended: u64, budget: u32) -> Vec<String> {
    let commands = by_command(marks);
    let mut lines = Vec::new();
    let loads = |stages: &[Option<u64>; STAGES]| stages[Stage::Loading.index()].is_some();
    for (class, wanted) in [("loaded their entity", true), ("the others", false)] {
        let of_class: Vec<&[Option<u64>; STAGES]> = commands
            .values()
            .map(|(stages, _)| stages)
            .filter(|stages| loads(stages) == wanted)
            .collect();
        lines.push(format!("commands that {class}: {}", of_class.len()));
        for (from, to) in STEPS {
            let samples: Vec<f64> = of_class
                .iter()
                .filter_map(|s| Some(ms(s[to.index()]?.checked_sub(s[from.index()]?)?)))
                .collect();
            if !samples.is_empty() {
                lines.push(format!(
                    "  {}",
                    summary_line(&format!("{from:?} -> {to:?}"), &samples)
                ));
            }
        }
    }
    // Commands in hand per partition: pulled, not yet acknowledged.
    let mut per_partition: HashMap<u32, Vec<(u64, i64)>> = HashMap::new();
    let mut first_pulled: HashMap<u32, u64> = HashMap::new();
    for (stages, partition) in commands.values() {
        let changes = per_partition.entry(*partition).or_default();
        if let Some(pulled) = stages[Stage::Pulled.index()] {
            changes.push((pulled, 1));
            let first = first_pulled.entry(*partition).or_insert(pulled);
            *first = (*first).min(pulled);
        }
        if let (Some(_), Some(acking)) =
            (stages[Stage::Pulled.index()], stages[Stage::Acking.index()])
        {
            changes.push((acking, -1));
        }
    }
    lines.extend(timeline(&commands, opened, ended));
    // The first time any command of partition `p` reached `stage`.
    let first_at = |p: u32, stage: Stage| {
        commands
            .values()
            .filter(|(_, q)| *q == p)
            .filter_map(|(s, _)| s[stage.index()])
            .min()
    };
    let mut partitions: Vec<_> = per_partition.into_iter().collect();
    partitions.sort_by_key(|(p, _)| *p);
    let mut in_hand = Vec::new();
    for (partition, mut changes) in partitions {
        let first = first_pulled.get(&partition).copied().unwrap_or(opened);
        // Until its last acknowledgement: a partition drained early sits idle by design.
        let last = changes.iter().map(|(at, _)| *at).max().unwrap_or(ended);
        let (mean, max, full) = level(&mut changes, first, last, i64::from(budget));
        let since = |at: Option<u64>| at.map_or(f64::NAN, |at| ms(at.saturating_sub(opened)));
        in_hand.push(format!(
            "p{partition} first pulled at {:.0} ms, routed at {:.0}, acked at {:.0}, done at {:.0} ms, mean {mean:.0} max {max}, at the budget {:.0}%",
            ms(first.saturating_sub(opened)),
            since(first_at(partition, Stage::Routed)),
            since(first_at(partition, Stage::Acking)),
            ms(last.saturating_sub(opened)),
            full * 100.0
        ));
    }
    lines.push(format!(
        "commands in hand per partition (pulled, not acked; budget {budget}), from its first pull to its last ack:"
    ));
    lines.extend(in_hand.into_iter().map(|l| format!("  {l}")));
    lines.extend(start_by_partition(&commands, others, opened));
    // Loads at once, over the pass.
    let mut load_changes: Vec<(u64, i64)> = commands
        .values()
        .filter_map(|(s, _)| {
            Some([
                (s[Stage::Loading.index()]?, 1),
                (s[Stage::Loaded.index()]?, -1),
            ])
        })
        .flatten()
        .collect();
    let (mean, max, _) = level(&mut load_changes, opened, ended, i64::MAX);
    lines.push(format!(
        "loads at once: mean {mean:.1}, max {max} (over the pass, {:.0} ms)",
        ms(ended - opened)
    ));
    // Pull requests.
    let pulls = others.pulls.len();
    let mut pulls_by: HashMap<u32, usize> = HashMap::new();
    for (_, p) in &others.pulls {
        *pulls_by.entry(*p).or_default() += 1;
    }
    let (least, most) = (
        pulls_by.values().min().copied().unwrap_or(0),
        pulls_by.values().max().copied().unwrap_or(0),
    );
    lines.push(format!(
        "pull requests: {pulls} ({least}-{most} per partition)"
    ));
    // Batched reads.
    let reads = &others.reads;
    if !reads.is_empty() {
        let entities: u64 = reads.iter().map(|r| r.entities).sum();
        let records: u64 = reads.iter().map(|r| r.records).sum();
        lines.push(format!(
            "batched reads: {} for {entities} entities ({:.1} each), {records} records",
            reads.len(),
            entities as f64 / reads.len() as f64
        ));
        let permit: Vec<f64> = reads.iter().map(|r| ms(r.permit_ns)).collect();
        let read: Vec<f64> = reads.iter().map(|r| ms(r.read_ns)).collect();
        lines.push(format!("  {}", summary_line("permit wait", &permit)));
        lines.push(format!("  {}", summary_line("read", &read)));
        let mut at_once: Vec<(u64, i64)> = reads
            .iter()
            .flat_map(|r| [(r.at.saturating_sub(r.read_ns), 1), (r.at, -1)])
            .collect();
        let (mean, max, _) = level(&mut at_once, opened, ended, i64::MAX);
        lines.push(format!("  reads at once: mean {mean:.2}, max {max}"));
        let mut per_partition: HashMap<u32, Vec<(u64, i64)>> = HashMap::new();
        for r in reads {
            per_partition
                .entry(r.partition)
                .or_default()
                .extend([(r.at.saturating_sub(r.read_ns), 1), (r.at, -1)]);
        }
        let most = per_partition
            .values_mut()
            .map(|changes| level(changes, opened, ended, i64::MAX).1)
            .max()
            .unwrap_or(0);
        lines.push(format!("  reads at once in one partition: max {most}"));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A level's mean weighs each value by how long it held; its share at or above a bound is
    /// of the whole span.
    #[test]
    fn a_level_is_weighed_by_time() {
        let mut changes = vec![(10, 1), (30, 1), (40, -1), (60, -1)];
        let (mean, max, full) = level(&mut changes, 0, 100, 2);
        // 0 for 10, 1 for 20, 2 for 10, 1 for 20, 0 for 40: (20 + 20 + 20) / 100.
        assert!((mean - 0.6).abs() < 1e-9, "{mean}");
        assert_eq!(max, 2);
        assert!((full - 0.1).abs() < 1e-9, "{full}");
    }

    /// The first second is binned by 100 ms from the opening, per partition: pulled and acked
    /// from each command's marks, pull requests from theirs; later marks left out.
    #[test]
    fn the_first_second_is_binned_by_partition() {
        let ms = 1_000_000;
        let opened = 1_000 * ms;
        let marks = [
            (opened + 50 * ms, 1, Stage::Pulled, 3),
            (opened + 250 * ms, 1, Stage::Acking, UNKNOWN),
            (opened + 60 * ms, 2, Stage::Pulled, 3),
            (opened + 1_500 * ms, 2, Stage::Acking, UNKNOWN),
        ];
        let others = Others {
            reads: Vec::new(),
            pulls: vec![
                (opened + 10 * ms, 3),
                (opened + 999 * ms, 3),
                (opened - ms, 3),
            ],
        };
        let lines = start_by_partition(&by_command(&marks), &others, opened);
        assert_eq!(
            lines[1],
            "  p3: 2 0 0 0 0 0 0 0 0 0 / 0 0 1 0 0 0 0 0 0 0 / 1 0 0 0 0 0 0 0 0 1"
        );
    }

    /// Each command's marks are gathered, first mark of a stage kept, its partition from its
    /// `pulled` mark.
    #[test]
    fn marks_are_gathered_by_command() {
        let marks = [
            (5, 7, Stage::Pulled, 2),
            (6, 7, Stage::Routed, UNKNOWN),
            (9, 7, Stage::Pulled, 2),
            (4, 7, Stage::Stored, UNKNOWN),
        ];
        let by = by_command(&marks);
        let (stages, partition) = by[&7];
        assert_eq!(partition, 2);
        assert_eq!(stages[Stage::Pulled.index()], Some(5));
        assert_eq!(stages[Stage::Routed.index()], Some(6));
        assert_eq!(stages[Stage::Stored.index()], None);
    }
}
