//! The throughput scenario's report rows: each side's rate and CPU per command per pass, the
//! worst round against the median, jetshard against the bench's bare loop and both against the
//! independent `bareloop` (the throughput targets), and the never-seen entities.

use crate::drain::{DrainRun, DrainSpec, Figure, PassRows};
use crate::report::{Report, Row, Worse};

use super::FreshRun;

/// Each pass's rows for both sides; returns jetshard's warm median rate.
pub(super) fn passes(
    report: &mut Report,
    spec: DrainSpec,
    bare_runs: &[DrainRun],
    jetshard_runs: &[DrainRun],
) -> f64 {
    let shape = format!(
        "{} partitions, {} entities, {} cmds",
        spec.partitions, spec.entities, spec.commands
    );
    let mut jetshard_warm = 0.0;
    for (pass, name) in [(0, "cold"), (1, "warm")] {
        let bare = PassRows::new("throughput", bare_runs, pass, spec.commands);
        let jetshard = PassRows::new("throughput", jetshard_runs, pass, spec.commands);
        let bare_row = bare.row(format!("bare loop, {name} pass, {shape}"), Figure::Rate);
        let bare_median = bare_row.value;
        report.rows.push(bare_row);
        let row = jetshard
            .row(format!("jetshard, {name} pass, {shape}"), Figure::Rate)
            .against(bare_median);
        report.rows.push(if pass == 1 {
            jetshard_warm = row.value;
            row.held_to(bare_median, ">= 0.9 x bare", |r| r >= 0.9)
        } else {
            row
        });
        for (side, rows) in [("bare loop", &bare), ("jetshard", &jetshard)] {
            // A round that stalls (a partition served far below the others) shows here
            // long before it moves a median: one stalled warm pass took 7x its median.
            let rates = rows.rounds(Figure::Rate);
            if rates.len() > 1 {
                let median = crate::stats::median(&rates);
                let worst = rates.iter().copied().fold(f64::INFINITY, f64::min);
                report.rows.push(
                    Row::new(
                        "throughput",
                        format!("{side}, {name} pass: worst round against the median"),
                        worst / median,
                        "x",
                    )
                    .worst_of(worst / median, rates.len())
                    .target(">= 0.5 (no stalled round)", worst >= median * 0.5),
                );
            }
            for (what, figure) in [
                ("client CPU per command", Figure::ClientCpu),
                ("server CPU per command", Figure::ServerCpu),
                ("client allocations per command", Figure::Allocs),
                ("client bytes allocated per command", Figure::AllocBytes),
            ] {
                report
                    .rows
                    .push(rows.row(format!("{side}, {name} pass: {what}"), figure));
            }
            // Counted only where the kernel gives hardware counters (or under callgrind).
            for (what, figure) in [
                (
                    "client user-space instructions per command",
                    Figure::Instructions,
                ),
                ("client user-space cycles per command", Figure::Cycles),
            ] {
                let rounds = rows.rounds(figure);
                if !rounds.is_empty() && rounds.iter().all(|v| v.is_finite()) {
                    report
                        .rows
                        .push(rows.row(format!("{side}, {name} pass: {what}"), figure));
                }
            }
        }
    }
    jetshard_warm
}

/// The rows that set the bench's bare loop and jetshard against the independent `bareloop`
/// run in the same rounds, with the throughput targets: the bench's loop within 10% of it (rate
/// and server CPU per command); jetshard warm >= 0.8 x its rate, cold >= 0.7 x, server CPU
/// per command <= 1.2 x its, client CPU per command <= 2 x its.
pub(super) fn against_bareloop(
    report: &mut Report,
    bareloop: &[crate::bareloop::Figure],
    bare_runs: &[DrainRun],
    jetshard_runs: &[DrainRun],
    commands: usize,
) {
    let figures =
        |f: &dyn Fn(&crate::bareloop::Figure) -> f64| bareloop.iter().map(f).collect::<Vec<_>>();
    let rate = Row::over_rounds(
        "throughput",
        "bareloop (independent), B-loop-pinned",
        &figures(&|f| f.rate),
        "cmd/s",
        Worse::Lower,
    );
    let server = Row::over_rounds(
        "throughput",
        "bareloop (independent): server CPU per command",
        &figures(&|f| f.server_us),
        "us",
        Worse::Higher,
    );
    let client = Row::over_rounds(
        "throughput",
        "bareloop (independent): client CPU per command",
        &figures(&|f| f.client_us),
        "us",
        Worse::Higher,
    );
    let (rate_base, server_base, client_base) = (rate.value, server.value, client.value);
    report.rows.extend([rate, server, client]);
    let within_10 = |r: f64| (0.9..=1.1).contains(&r);
    if !bare_runs.is_empty() {
        let warm = PassRows::new("throughput", bare_runs, 1, commands);
        report.rows.extend([
            warm.row("bench bare loop, warm, against bareloop", Figure::Rate)
                .held_to(rate_base, "within 10% of bareloop", within_10),
            warm.row(
                "bench bare loop, warm: server CPU per command against bareloop's",
                Figure::ServerCpu,
            )
            .held_to(server_base, "within 10% of bareloop", within_10),
        ]);
    }
    if !jetshard_runs.is_empty() {
        for (pass, name, target) in [(1, "warm", 0.8), (0, "cold", 0.7)] {
            let rows = PassRows::new("throughput", jetshard_runs, pass, commands);
            report.rows.push(
                rows.row(format!("jetshard, {name}, against bareloop"), Figure::Rate)
                    .held_to(rate_base, format!(">= {target} x bareloop"), |r| {
                        r >= target
                    }),
            );
        }
        let warm = PassRows::new("throughput", jetshard_runs, 1, commands);
        report.rows.extend([
            warm.row(
                "jetshard, warm: server CPU per command against bareloop's",
                Figure::ServerCpu,
            )
            .held_to(server_base, "<= 1.2 x bareloop", |r| r <= 1.2),
            warm.row(
                "jetshard, warm: client CPU per command against bareloop's",
                Figure::ClientCpu,
            )
            .held_to(client_base, "<= 2 x bareloop", |r| r <= 2.0),
        ]);
    }
}

/// The rows of the never-seen entities' run.
pub(super) fn fresh(report: &mut Report, fresh: &FreshRun) {
    let case = |what: &str| {
        format!(
            "jetshard, never-seen entities: {what}, {} entities",
            fresh.entities
        )
    };
    report.rows.push(Row::new(
        "throughput",
        case(if fresh.drained {
            "drained in"
        } else {
            "not drained after"
        }),
        fresh.secs,
        "s",
    ));
    report.rows.push(
        Row::new(
            "throughput",
            case("commands applied"),
            fresh.applied as f64,
            "cmds",
        )
        .target("all", fresh.applied == fresh.entities as u64),
    );
    report.rows.push(Row::new(
        "throughput",
        case("commands dead-lettered"),
        fresh.dead_lettered as f64,
        "cmds",
    ));
}
