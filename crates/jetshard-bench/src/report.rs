//! The results of a run: one row per figure, printed as a table and written as JSON.

use std::io::Write;
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

/// One measured figure.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The scenario's name, e.g. `throughput`.
    pub scenario: &'static str,
    /// What was measured, e.g. `jetshard warm, 8 partitions`.
    pub case: String,
    /// The figure: the median over the rounds measured (or the one measurement).
    pub value: f64,
    /// The worst round: the lowest of a rate, the highest of a time or a latency; the value
    /// itself for a single measurement.
    pub worst: f64,
    /// Rounds (or trials) the figure is the median of; 1 for a single measurement.
    pub rounds: usize,
    /// Its unit, e.g. `cmd/s`.
    pub unit: &'static str,
    /// The same run's baseline figure, where there is one.
    pub baseline: Option<f64>,
    /// `value / baseline`.
    pub ratio: Option<f64>,
    /// The target, in words, where the issue sets one.
    pub target: Option<String>,
    /// Whether the target is met.
    pub met: Option<bool>,
}

/// Which way a figure gets worse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Worse {
    /// A rate: the worst round is the lowest.
    Lower,
    /// A time or a latency: the worst round is the highest.
    Higher,
}

impl Row {
    /// A single measurement (its own worst round).
    pub fn new(
        scenario: &'static str,
        case: impl Into<String>,
        value: f64,
        unit: &'static str,
    ) -> Self {
        Row {
            scenario,
            case: case.into(),
            value,
            worst: value,
            rounds: 1,
            unit,
            baseline: None,
            ratio: None,
            target: None,
            met: None,
        }
    }

    /// The median of one figure's `rounds`, with the worst of them beside it (0 for none).
    pub fn over_rounds(
        scenario: &'static str,
        case: impl Into<String>,
        rounds: &[f64],
        unit: &'static str,
        worse: Worse,
    ) -> Self {
        let mut row = Row::new(scenario, case, crate::stats::median(rounds), unit);
        row.rounds = rounds.len();
        row.worst = match worse {
            Worse::Lower => rounds.iter().copied().reduce(f64::min),
            Worse::Higher => rounds.iter().copied().reduce(f64::max),
        }
        .unwrap_or(0.0);
        row
    }

    /// Sets the worst of `rounds` rounds (for a median computed elsewhere).
    pub fn worst_of(mut self, worst: f64, rounds: usize) -> Self {
        self.worst = worst;
        self.rounds = rounds;
        self
    }

    /// Adds the baseline and the ratio to it (nothing for a baseline that was not measured).
    pub fn against(mut self, baseline: f64) -> Self {
        if baseline > 0.0 {
            self.baseline = Some(baseline);
            self.ratio = Some(self.value / baseline);
        }
        self
    }

    /// Adds a target and whether it is met.
    pub fn target(mut self, target: impl Into<String>, met: bool) -> Self {
        self.target = Some(target.into());
        self.met = Some(met);
        self
    }

    /// Sets the row against `baseline` and holds its ratio to `target`: met where `holds` says
    /// so of the ratio (never without a baseline).
    pub fn held_to(
        self,
        baseline: f64,
        target: impl Into<String>,
        holds: impl FnOnce(f64) -> bool,
    ) -> Self {
        let row = self.against(baseline);
        let met = row.ratio.is_some_and(holds);
        row.target(target, met)
    }
}

/// Everything one invocation measured.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Where and with what it ran.
    pub meta: Meta,
    /// The figures, in the order they were measured.
    pub rows: Vec<Row>,
    /// Per-scenario details (raw samples, distributions, settings).
    pub details: serde_json::Map<String, serde_json::Value>,
}

/// The circumstances of a run.
#[derive(Debug, Serialize)]
pub struct Meta {
    /// Unix seconds at the start.
    pub started_unix: u64,
    /// Seconds the whole run took.
    pub elapsed_secs: f64,
    /// Logical CPUs.
    pub cpus: usize,
    /// `nats-server` version.
    pub server_version: String,
    /// `git describe` of the working tree, if available.
    pub git: Option<String>,
    /// The command line.
    pub args: Vec<String>,
}

impl Report {
    /// Prints the table of figures.
    pub fn print_table(&self, out: &mut impl Write) -> std::io::Result<()> {
        let header = [
            "scenario", "case", "value", "worst", "n", "unit", "baseline", "ratio", "target", "met",
        ];
        let cells: Vec<[String; 10]> = self
            .rows
            .iter()
            .map(|r| {
                [
                    r.scenario.to_owned(),
                    r.case.clone(),
                    format_value(r.value),
                    format_value(r.worst),
                    r.rounds.to_string(),
                    r.unit.to_owned(),
                    r.baseline.map(format_value).unwrap_or_default(),
                    r.ratio.map(|x| format!("{x:.3}")).unwrap_or_default(),
                    r.target.clone().unwrap_or_default(),
                    match r.met {
                        Some(true) => "yes".to_owned(),
                        Some(false) => "NO".to_owned(),
                        None => String::new(),
                    },
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &cells {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.len());
            }
        }
        let line = |out: &mut dyn Write, row: &[&str]| -> std::io::Result<()> {
            let mut text = String::from("|");
            for (cell, width) in row.iter().zip(widths) {
                text.push_str(&format!(" {cell:<width$} |"));
            }
            writeln!(out, "{text}")
        };
        line(out, &header)?;
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        line(out, &rule.iter().map(String::as_str).collect::<Vec<_>>())?;
        for row in &cells {
            line(out, &row.iter().map(String::as_str).collect::<Vec<_>>())?;
        }
        Ok(())
    }

    /// Writes the report as pretty JSON to `path`, creating its directory.
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        let json = serde_json::to_vec_pretty(self).context("encode the report")?;
        std::fs::write(path, json).with_context(|| format!("write {}", path.display()))
    }
}

/// Large figures without decimals, small ones with a few.
fn format_value(value: f64) -> String {
    if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else if value.abs() >= 1.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_over_rounds_keeps_its_worst_round_beside_the_median() {
        let rate = Row::over_rounds("t", "rate", &[9.0, 3.0, 10.0], "cmd/s", Worse::Lower);
        assert_eq!((rate.value, rate.worst, rate.rounds), (9.0, 3.0, 3));
        let latency = Row::over_rounds("t", "p99", &[2.0, 7.0], "ms", Worse::Higher);
        assert_eq!(
            (latency.value, latency.worst, latency.rounds),
            (4.5, 7.0, 2)
        );
        let single = Row::new("t", "one", 5.0, "s");
        assert_eq!((single.worst, single.rounds), (5.0, 1));
    }
}
