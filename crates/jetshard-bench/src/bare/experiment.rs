//! Experiments on the bare loop (`jetshard-bench throughput --bare-knob <knobs>
//! [--bare-knob-base <knobs>]`): rounds alternate the loop without and with a set of
//! [`Knob`]s, in one run, so that what each costs is measured against the same machine load.

use anyhow::Context as _;
use serde_json::json;

use super::{BareSettings, Knob, drain_bare_with};
use crate::Options;
use crate::drain::{DrainRun, DrainSpec, Figure, PassRows};
use crate::report::Report;

/// An experiment on the bare loop: rounds alternate it without and with `knobs` (the order
/// swapped every other round), in one run, both sides with `base` switched on; reports each
/// side's rate and CPU per command, and the ratio with / without.
pub async fn knob_experiment(
    options: &Options,
    spec: DrainSpec,
    base: &[Knob],
    knobs: &[Knob],
    report: &mut Report,
) -> anyhow::Result<()> {
    let knob = format!("{knobs:?}");
    let with_knobs: Vec<Knob> = base.iter().chain(knobs).copied().collect();
    let mut runs: [Vec<DrainRun>; 2] = [Vec::new(), Vec::new()];
    for round in 0..options.rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let settings = BareSettings::with(if side == 1 { &with_knobs } else { base });
            eprintln!(
                "bare-loop experiment {knob} (base {base:?}), round {}/{}: knob {}",
                round + 1,
                options.rounds,
                if side == 1 { "on" } else { "off" }
            );
            let run = drain_bare_with(spec, settings).await.context("bare loop")?;
            for (pass, p) in run.passes.iter().enumerate() {
                eprintln!(
                    "  pass {pass}: {:.0} cmd/s, server {:.1} us/cmd, client {:.1} us/cmd, {:.1} allocs/cmd",
                    p.rate,
                    p.server_us_per_command(spec.commands),
                    p.client_us_per_command(spec.commands),
                    p.allocs_per_command(spec.commands)
                );
            }
            runs[side].push(run);
        }
    }
    for (pass, name) in [(0, "cold"), (1, "warm")] {
        let off = PassRows::new("bare-knob", &runs[0], pass, spec.commands);
        let on = PassRows::new("bare-knob", &runs[1], pass, spec.commands);
        for (what, figure) in [
            ("rate", Figure::Rate),
            ("server CPU per command", Figure::ServerCpu),
            ("client CPU per command", Figure::ClientCpu),
        ] {
            let without = off.row(format!("bare loop, {name} pass, {what}"), figure);
            let base = without.value;
            report.rows.push(without);
            report.rows.push(
                on.row(
                    format!("bare loop with {knob}, {name} pass, {what}"),
                    figure,
                )
                .against(base),
            );
        }
    }
    report.details.insert(
        "bare_knob".to_owned(),
        json!({ "spec": spec, "base": base, "knobs": knobs, "off": runs[0], "on": runs[1] }),
    );
    Ok(())
}
