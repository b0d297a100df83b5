//! Scenario 1, throughput: commands/s end to end through jetshard against the bare loop, each
//! draining the same pre-loaded backlog on a fresh server.
//!
//! Protocol, the same for both sides: start the consumer side (a shard system, or the bare
//! loop), pause every partition's consumer, pre-load `commands` commands round-robin over the
//! entities, resume every partition and time until the work-queue command stream is empty
//! (every command acknowledged). Two passes: **cold** (jetshard spawns an actor for each
//! entity on its first command) and **warm** (the same entities, now resident).
//!
//! Every entity has one event in the journal before the run (on both sides), so an acquiring
//! owner rebuilds it; the cold pass then measures actor spawns, not journal reads. What the
//! first command of a never-seen entity costs is measured apart ([`fresh_entities`]).
//!
//! Every figure is the median of the rounds with the worst round beside it, and each side's
//! worst round is also set against its median: a round that stalls (one partition
//! served at a few hundred commands/s, a warm pass 7x its median) fails that row's target long
//! before it moves a median. The bare loop drains consumers provisioned with its own
//! `max_ack_pending` ([`crate::bare::MAX_ACK_PENDING`]); jetshard runs with its defaults unless
//! `--pull-batch` / `--max-ack-pending` say otherwise.
//!
//! The protocol is [`crate::drain`]'s; the bare side is [`crate::bare`]'s ([`drain_bare`]); the
//! report's rows are `rows.rs`'s; the first commands of never-seen entities, `fresh.rs`'s.

mod fresh;
mod rows;

pub use fresh::{FreshRun, fresh_entities};

use std::time::Duration;

use anyhow::Context as _;
use jetshard::{ShardConfig, ShardSystem};
use serde_json::json;

use crate::Options;
use crate::bare::drain_bare;
use crate::drain::{DrainRun, DrainSpec, ENTITY_TYPE, timed_passes};
use crate::entity::BenchEntity;
use crate::load;
use crate::report::Report;

/// Drains through a jetshard system in this process.
pub async fn drain_jetshard(spec: DrainSpec) -> anyhow::Result<DrainRun> {
    let server = crate::server::nats_server().await?;
    let control = server.connect().await?;
    let mut config = ShardConfig::builder(ENTITY_TYPE)
        .partitions(spec.partitions)
        .node_id("bench");
    if let Some(batch) = spec.pull_batch {
        config = config.pull_batch(batch);
    }
    if let Some(max_ack_pending) = spec.max_ack_pending {
        config = config.max_ack_pending(max_ack_pending);
    }
    if let Some(idle) = spec.passivate_after {
        config = config.passivate_after(idle);
    }
    if let Some(ttl) = spec.pin_ttl {
        config = config.pin_ttl(ttl);
    }
    let config = config.build()?;
    let client = server.connect().await?;
    crate::messages::watch(&client);
    let system = ShardSystem::start::<BenchEntity>(client, config)
        .await
        .context("start the shard system")?;
    load::seed_entities(control.clone(), ENTITY_TYPE, spec.partitions, spec.entities).await?;
    let pids: Vec<u32> = server.pid().into_iter().collect();
    let passes = timed_passes(&pids, &control, spec, || Ok(())).await;
    crate::messages::unwatch();
    let status = system.status().await;
    if let Ok(status) = &status {
        report_loads("jetshard passes", status);
    }
    let acquisitions = status.map(|s| s.iter().map(|p| p.acquisitions).sum()).ok();
    system.shutdown().await.context("shut the system down")?;
    Ok(DrainRun {
        passes: passes?,
        acquisitions,
    })
}

/// The figures later scenarios build on.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    /// jetshard's warm drain rate, commands/s.
    pub jetshard_warm: f64,
}

/// Scenario 1.
pub async fn run(options: &Options, report: &mut Report) -> anyhow::Result<Measured> {
    let spec = DrainSpec {
        pull_batch: options.pull_batch,
        max_ack_pending: options.max_ack_pending,
        passivate_after: options.passivate_after_secs.map(Duration::from_secs),
        pin_ttl: options.pin_ttl_secs.map(Duration::from_secs),
        stages: options.pass_stages,
        ..DrainSpec::new(
            options,
            options.partitions,
            options.commands,
            Duration::from_secs(options.time_box_secs),
        )
    };
    let mut bare_runs = Vec::new();
    let mut jetshard_runs = Vec::new();
    let mut bareloop_runs = Vec::new();
    for round in 0..options.rounds {
        if let Some(binary) = options.bareloop.clone() {
            eprintln!(
                "throughput round {}/{}: bareloop B-loop-pinned, {} commands",
                round + 1,
                options.rounds,
                spec.commands
            );
            let commands = spec.commands;
            let figure =
                tokio::task::spawn_blocking(move || crate::bareloop::run_pinned(&binary, commands))
                    .await
                    .context("the bareloop task")?;
            // On a loaded machine `bareloop` can stop on a missed pull heartbeat: that round
            // has no `bareloop` figure, and the other rounds' still count.
            match figure {
                Ok(figure) => {
                    eprintln!(
                        "  bareloop: {:.0} cmd/s, server {:.1} us/cmd, client {:.1} us/cmd",
                        figure.rate, figure.server_us, figure.client_us
                    );
                    bareloop_runs.push(figure);
                }
                Err(e) => eprintln!("  bareloop failed, no figure this round: {e:#}"),
            }
        }
        eprintln!(
            "throughput round {}/{}: bare loop, {} commands",
            round + 1,
            options.rounds,
            spec.commands
        );
        if !options.jetshard_only {
            bare_runs.push(drain_bare(spec).await.context("bare loop")?);
        }
        if options.bare_only {
            continue;
        }
        eprintln!(
            "throughput round {}/{}: jetshard",
            round + 1,
            options.rounds
        );
        jetshard_runs.push(drain_jetshard(spec).await.context("jetshard")?);
    }
    let jetshard_warm = rows::passes(report, spec, &bare_runs, &jetshard_runs);
    if bareloop_runs.is_empty() {
        eprintln!(
            "throughput: bareloop not run (--bareloop <path> or BARELOOP_BIN): the throughput targets against it (bench bare loop within 10%; jetshard warm >= 0.8x, cold >= 0.7x, server CPU <= 1.2x, client CPU <= 2x) are not checked"
        );
    } else {
        rows::against_bareloop(
            report,
            &bareloop_runs,
            &bare_runs,
            &jetshard_runs,
            spec.commands,
        );
    }
    let fresh = if options.fresh_entities > 0 && !options.jetshard_only && !options.bare_only {
        eprintln!(
            "throughput: first commands of {} never-seen entities",
            options.fresh_entities
        );
        let fresh =
            fresh_entities(spec.partitions, options.fresh_entities, spec.command_bytes).await?;
        rows::fresh(report, &fresh);
        Some(fresh)
    } else {
        None
    };
    report.details.insert(
        "throughput".to_owned(),
        json!({ "spec": spec, "bare": bare_runs, "jetshard": jetshard_runs, "bareloop": bareloop_runs, "fresh_entities": fresh }),
    );
    Ok(Measured { jetshard_warm })
}

/// Prints what a system's entity loads came to: loads, those read in batches, and the reads
/// they made of the server (each batched read once).
pub fn report_loads(what: &str, status: &[jetshard::PartitionStatus]) {
    eprintln!("  {what}: {}", jetshard::Loads::of(status));
}
