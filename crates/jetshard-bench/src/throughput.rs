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
//! worst round is also set against its median: a round that stalls (issue 11: one partition
//! served at a few hundred commands/s, a warm pass 7x its median) fails that row's target long
//! before it moves a median. The bare loop drains consumers provisioned with its own
//! `max_ack_pending` ([`crate::bare::MAX_ACK_PENDING`]); jetshard runs with its defaults unless
//! `--pull-batch` / `--max-ack-pending` say otherwise.

use std::time::Duration;

use anyhow::Context as _;
use jetshard::{ShardConfig, ShardSystem};
use jetshard_testkit::NatsServer;
use serde::Serialize;
use serde_json::json;
use tokio::time::Instant;

use crate::Options;
use crate::allocs::{self, Allocated};
use crate::bare::{BareLoop, BareSettings, Knob};
use crate::cpu::{CpuMeter, CpuSpent};
use crate::entity::BenchEntity;
use crate::load::{self, CommandPublisher, Gate};
use crate::report::{Report, Row, Worse};

/// The entity type the throughput runs use.
const ENTITY_TYPE: &str = "bench";

/// What one drain run is given.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DrainSpec {
    /// Partitions.
    pub partitions: u32,
    /// Distinct entities the commands go to.
    pub entities: usize,
    /// Commands per pass.
    pub commands: usize,
    /// Passes (the first is cold).
    pub passes: usize,
    /// The longest a pass may take; a pass cut short reports the rate of what it drained.
    pub time_box: Duration,
    /// jetshard's `pull_batch` (default: jetshard's default).
    pub pull_batch: Option<u32>,
    /// jetshard's `max_ack_pending` (default: jetshard's default).
    pub max_ack_pending: Option<u32>,
}

/// One timed drain.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Pass {
    /// Commands acknowledged per second.
    pub rate: f64,
    /// Seconds from resume to empty (or to the end of the time box).
    pub secs: f64,
    /// Whether every command was acknowledged within the time box.
    pub complete: bool,
    /// Deliveries beyond one per command (the consumers' delivery counters): commands the
    /// server delivered again because an acknowledgement did not come within the ack wait
    /// (or a nak). Zero on a healthy run.
    pub redeliveries: u64,
    /// CPU spent meanwhile.
    pub cpu: CpuSpent,
    /// Heap allocations of this process (the client side) meanwhile.
    pub allocated: Allocated,
}

impl Pass {
    /// Client CPU microseconds per command.
    pub fn client_us_per_command(&self, commands: usize) -> f64 {
        self.cpu.client_secs * 1e6 / commands as f64
    }

    /// Client heap allocations per command.
    pub fn allocs_per_command(&self, commands: usize) -> f64 {
        self.allocated.allocs as f64 / commands as f64
    }

    /// Client bytes allocated per command.
    pub fn alloc_bytes_per_command(&self, commands: usize) -> f64 {
        self.allocated.bytes as f64 / commands as f64
    }

    /// Server CPU microseconds per command.
    pub fn server_us_per_command(&self, commands: usize) -> f64 {
        self.cpu.server_secs * 1e6 / commands as f64
    }
}

/// The passes of one run, and how often partitions were acquired during it.
#[derive(Debug, Clone, Serialize)]
pub struct DrainRun {
    /// The passes in order (fewer than asked for if a backlog never cleared).
    pub passes: Vec<Pass>,
    /// Acquisitions (jetshard only): more than `partitions` means ownership moved mid-run.
    pub acquisitions: Option<u64>,
}

/// Drains through a jetshard system in this process.
pub async fn drain_jetshard(spec: DrainSpec) -> anyhow::Result<DrainRun> {
    let server = NatsServer::start().await.context("start nats-server")?;
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
    let config = config.build()?;
    let system = ShardSystem::start::<BenchEntity>(server.connect().await?, config)
        .await
        .context("start the shard system")?;
    load::seed_entities(control.clone(), ENTITY_TYPE, spec.partitions, spec.entities).await?;
    let pids: Vec<u32> = server.pid().into_iter().collect();
    let passes = timed_passes(&pids, &control, spec, || Ok(())).await;
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

/// Drains through the bare loop in this process, as a user writing it by hand would run it
/// ([`BareSettings::careful`]).
pub async fn drain_bare(spec: DrainSpec) -> anyhow::Result<DrainRun> {
    drain_bare_with(spec, BareSettings::careful()).await
}

/// [`drain_bare`] with an experiment's settings.
pub async fn drain_bare_with(spec: DrainSpec, settings: BareSettings) -> anyhow::Result<DrainRun> {
    let server = NatsServer::start().await.context("start nats-server")?;
    let control = server.connect().await?;
    let mut config = ShardConfig::builder(ENTITY_TYPE)
        .partitions(spec.partitions)
        .node_id("provision")
        .max_ack_pending(crate::bare::MAX_ACK_PENDING);
    if settings.has(Knob::DefaultDuplicateWindow) {
        config = config.duplicate_window(Duration::from_secs(120));
    }
    if settings.has(Knob::OwnStreams) {
        crate::bare::provision_own(&control, ENTITY_TYPE, spec.partitions).await?;
    } else {
        load::provision(server.connect().await?, config.build()?).await?;
    }
    if !settings.has(Knob::NoSeed) {
        load::seed_entities(control.clone(), ENTITY_TYPE, spec.partitions, spec.entities).await?;
    }
    let bare = BareLoop::start_with_settings(
        server.connect().await?,
        ENTITY_TYPE,
        spec.partitions,
        settings,
    )
    .await?;
    let pids: Vec<u32> = server.pid().into_iter().collect();
    let poll = settings
        .has(Knob::SlowDrainPoll)
        .then_some(Duration::from_millis(500));
    let hold = settings.has(Knob::NoPause).then_some(&bare);
    let passes = timed_passes_with(&pids, &control, spec, poll, hold, || bare.check()).await;
    bare.stop().await?;
    Ok(DrainRun {
        passes: passes?,
        acquisitions: None,
    })
}

/// Runs the passes of the protocol against whatever consumes `ENTITY_TYPE`'s partitions.
pub async fn timed_passes(
    server_pids: &[u32],
    control: &async_nats::Client,
    spec: DrainSpec,
    check: impl Fn() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Pass>> {
    timed_passes_polling(server_pids, control, spec, None, check).await
}

/// [`timed_passes`] with the drain polled every `poll` (`None`: [`load::drain`]'s).
pub async fn timed_passes_polling(
    server_pids: &[u32],
    control: &async_nats::Client,
    spec: DrainSpec,
    poll: Option<Duration>,
    check: impl Fn() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Pass>> {
    timed_passes_with(server_pids, control, spec, poll, None, check).await
}

/// [`timed_passes_polling`]; with `hold`, the bare loop is held ([`BareLoop::hold`]) instead of
/// the consumers paused while the commands are pre-loaded.
async fn timed_passes_with(
    server_pids: &[u32],
    control: &async_nats::Client,
    spec: DrainSpec,
    poll: Option<Duration>,
    hold: Option<&BareLoop>,
    check: impl Fn() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Pass>> {
    let gate = Gate::new(control.clone(), ENTITY_TYPE, spec.partitions);
    let publisher = CommandPublisher::new(control.clone(), ENTITY_TYPE, spec.entities);
    let mut passes = Vec::new();
    for pass in 0..spec.passes {
        match hold {
            Some(bare) => bare.hold(false).await?,
            None => gate.close().await?,
        }
        publisher
            .preload(spec.commands, &load::preload_command())
            .await?;
        check()?;
        let delivered_before = deliveries(control, spec.partitions).await?;
        let cpu = CpuMeter::start(server_pids);
        let allocated = allocs::now();
        let started = Instant::now();
        match hold {
            Some(bare) => bare.hold(true).await?,
            None => gate.open().await?,
        }
        if std::env::var_os("BENCH_DRAIN_DEBUG").is_some() {
            eprintln!("pass {pass} opened at {:?}", std::time::SystemTime::now());
        }
        let drained = load::drain_polling(control, ENTITY_TYPE, spec.time_box, poll).await?;
        let secs = drained.at.duration_since(started).as_secs_f64();
        if std::env::var_os("BENCH_DRAIN_DEBUG").is_some() {
            eprintln!(
                "pass {pass} drained at {:?} after {secs:.2}s",
                std::time::SystemTime::now()
            );
        }
        let acknowledged = (spec.commands as u64).saturating_sub(drained.remaining);
        let cpu = cpu.spent();
        let allocated = allocs::now().since(allocated);
        let delivered = deliveries(control, spec.partitions)
            .await?
            .saturating_sub(delivered_before);
        let redeliveries = delivered.saturating_sub(spec.commands as u64);
        if redeliveries > 0 {
            eprintln!("  pass {pass}: {redeliveries} commands were delivered more than once");
        }
        let done = Pass {
            rate: acknowledged as f64 / secs,
            secs,
            complete: drained.remaining == 0,
            redeliveries,
            cpu,
            allocated,
        };
        let per_command = |n: u64| n as f64 / spec.commands as f64;
        eprintln!(
            "  pass {pass}: {:.0} cmd/s, server {:.1} us/cmd, client {:.1} us/cmd, {:.1} allocs / {:.0} B per cmd (by size <64 B, <256, <1K, <4K, <16K, more: {})",
            done.rate,
            done.server_us_per_command(spec.commands),
            done.client_us_per_command(spec.commands),
            done.allocs_per_command(spec.commands),
            done.alloc_bytes_per_command(spec.commands),
            allocated
                .sizes
                .map(|n| format!("{:.1}", per_command(n)))
                .join(" / ")
        );
        passes.push(done);
        if drained.remaining > 0 {
            eprintln!(
                "  pass {pass} did not drain within {:?}: {} commands left",
                spec.time_box, drained.remaining
            );
            if pass + 1 < spec.passes {
                // The next pass starts from an empty stream; if the backlog does not clear
                // within another time box, the remaining passes are not run.
                let rest = load::drain(control, ENTITY_TYPE, spec.time_box).await?;
                if rest.remaining > 0 {
                    eprintln!(
                        "  the backlog did not clear ({} commands left); skipping the remaining passes",
                        rest.remaining
                    );
                    break;
                }
            }
        }
        check()?;
    }
    Ok(passes)
}

/// What became of the first commands of never-seen entities.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FreshRun {
    /// Entities (one command each).
    pub entities: usize,
    /// Seconds until every command was acknowledged or given up, or the timeout.
    pub secs: f64,
    /// Whether the stream drained within the timeout.
    pub drained: bool,
    /// Commands applied.
    pub applied: u64,
    /// Commands given up (dead-lettered) after failing at every delivery.
    pub dead_lettered: u64,
}

/// One command to each of `entities` entities that have no event yet: each first command
/// makes jetshard replay the entity's empty history from the journal.
pub async fn fresh_entities(partitions: u32, entities: usize) -> anyhow::Result<FreshRun> {
    const TIMEOUT: Duration = Duration::from_secs(90);
    let server = NatsServer::start().await.context("start nats-server")?;
    let control = server.connect().await?;
    let config = ShardConfig::builder(ENTITY_TYPE)
        .partitions(partitions)
        .node_id("bench")
        .build()?;
    let system = ShardSystem::start::<BenchEntity>(server.connect().await?, config)
        .await
        .context("start the shard system")?;
    let gate = Gate::new(control.clone(), ENTITY_TYPE, partitions);
    gate.close().await?;
    let ids = (0..entities).map(|i| format!("fresh{i}")).collect();
    CommandPublisher::for_ids(control.clone(), ENTITY_TYPE, ids)
        .preload(entities, &load::preload_command())
        .await?;
    let started = Instant::now();
    gate.open().await?;
    let drained = load::wait_drained(&control, ENTITY_TYPE, TIMEOUT).await;
    let secs = started.elapsed().as_secs_f64();
    let status = system.status().await.unwrap_or_default();
    report_loads("never-seen entities", &status);
    system.shutdown().await.context("shut the system down")?;
    Ok(FreshRun {
        entities,
        secs,
        drained: drained.is_ok(),
        applied: status.iter().map(|p| p.applied).sum(),
        dead_lettered: status.iter().map(|p| p.dead_lettered).sum(),
    })
}

/// Prints what a system's entity loads came to: loads, those read in batches, and the reads
/// they made of the server (each batched read once).
pub fn report_loads(what: &str, status: &[jetshard::PartitionStatus]) {
    let sum = |f: fn(&jetshard::PartitionStatus) -> u64| status.iter().map(f).sum::<u64>();
    let (loads, batched, reads) = (
        sum(|p| p.entity_loads),
        sum(|p| p.batched_loads),
        sum(|p| p.load_reads),
    );
    eprintln!(
        "  {what}: {loads} entity loads, {batched} from batched reads, {reads} reads ({:.2} a load)",
        reads as f64 / loads.max(1) as f64
    );
}

/// Deliveries so far over every partition's consumer (their consumer sequences).
async fn deliveries(control: &async_nats::Client, partitions: u32) -> anyhow::Result<u64> {
    let names = jetshard::wire::Names::new(ENTITY_TYPE);
    let js = async_nats::jetstream::new(control.clone());
    let stream = js
        .get_stream_no_info(names.command_stream())
        .await
        .context("open the command stream")?;
    let mut total = 0;
    for partition in 0..partitions {
        let info = stream
            .consumer_info(names.consumer(partition))
            .await
            .with_context(|| format!("read the consumer of partition {partition}"))?;
        total += info.delivered.consumer_sequence;
    }
    Ok(total)
}

/// The rows that set the bench's bare loop and jetshard against the independent `bareloop`
/// run in the same rounds, with issue 22's targets: the bench's loop within 10% of it (rate
/// and server CPU per command); jetshard warm >= 0.8 x its rate, cold >= 0.7 x, server CPU
/// per command <= 1.2 x its, client CPU per command <= 2 x its.
fn against_bareloop(
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
    let pass_rounds = |runs: &[DrainRun], pass: usize, f: &dyn Fn(&Pass) -> f64| {
        runs.iter()
            .filter_map(|r| r.passes.get(pass).map(f))
            .collect::<Vec<_>>()
    };
    let rate_of = |p: &Pass| p.rate;
    let server_of = |p: &Pass| p.server_us_per_command(commands);
    let client_of = |p: &Pass| p.client_us_per_command(commands);
    if !bare_runs.is_empty() {
        let row = Row::over_rounds(
            "throughput",
            "bench bare loop, warm, against bareloop",
            &pass_rounds(bare_runs, 1, &rate_of),
            "cmd/s",
            Worse::Lower,
        )
        .against(rate_base);
        let met = row.ratio.is_some_and(|r| (0.9..=1.1).contains(&r));
        report.rows.push(row.target("within 10% of bareloop", met));
        let row = Row::over_rounds(
            "throughput",
            "bench bare loop, warm: server CPU per command against bareloop's",
            &pass_rounds(bare_runs, 1, &server_of),
            "us",
            Worse::Higher,
        )
        .against(server_base);
        let met = row.ratio.is_some_and(|r| (0.9..=1.1).contains(&r));
        report.rows.push(row.target("within 10% of bareloop", met));
    }
    if !jetshard_runs.is_empty() {
        for (pass, name, target) in [(1, "warm", 0.8), (0, "cold", 0.7)] {
            let row = Row::over_rounds(
                "throughput",
                format!("jetshard, {name}, against bareloop"),
                &pass_rounds(jetshard_runs, pass, &rate_of),
                "cmd/s",
                Worse::Lower,
            )
            .against(rate_base);
            let met = row.ratio.is_some_and(|r| r >= target);
            report
                .rows
                .push(row.target(format!(">= {target} x bareloop"), met));
        }
        let row = Row::over_rounds(
            "throughput",
            "jetshard, warm: server CPU per command against bareloop's",
            &pass_rounds(jetshard_runs, 1, &server_of),
            "us",
            Worse::Higher,
        )
        .against(server_base);
        let met = row.ratio.is_some_and(|r| r <= 1.2);
        report.rows.push(row.target("<= 1.2 x bareloop", met));
        let row = Row::over_rounds(
            "throughput",
            "jetshard, warm: client CPU per command against bareloop's",
            &pass_rounds(jetshard_runs, 1, &client_of),
            "us",
            Worse::Higher,
        )
        .against(client_base);
        let met = row.ratio.is_some_and(|r| r <= 2.0);
        report.rows.push(row.target("<= 2 x bareloop", met));
    }
}

/// The figures later scenarios build on.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    /// jetshard's warm drain rate, commands/s.
    pub jetshard_warm: f64,
}

/// A figure of a pass: its name, how it is read, its unit and which way it gets worse.
type Figure<'a> = (&'static str, &'a dyn Fn(&Pass) -> f64, &'static str, Worse);

/// An experiment on the bare loop: rounds alternate it without and with `knobs` (the order
/// swapped every other round), in one run, both sides with `base` switched on; reports each
/// side's rate and CPU per command, and the ratio with / without.
async fn knob_experiment(
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
    let commands = spec.commands;
    let pass_rounds = |runs: &[DrainRun], pass: usize, f: &dyn Fn(&Pass) -> f64| {
        runs.iter()
            .filter_map(|r| r.passes.get(pass).map(f))
            .collect::<Vec<_>>()
    };
    for (pass, name) in [(0, "cold"), (1, "warm")] {
        let figures: [Figure<'_>; 3] = [
            ("rate", &|p: &Pass| p.rate, "cmd/s", Worse::Lower),
            (
                "server CPU per command",
                &|p: &Pass| p.server_us_per_command(commands),
                "us",
                Worse::Higher,
            ),
            (
                "client CPU per command",
                &|p: &Pass| p.client_us_per_command(commands),
                "us",
                Worse::Higher,
            ),
        ];
        for (what, f, unit, worse) in figures {
            let off = Row::over_rounds(
                "bare-knob",
                format!("bare loop, {name} pass, {what}"),
                &pass_rounds(&runs[0], pass, f),
                unit,
                worse,
            );
            let base = off.value;
            report.rows.push(off);
            report.rows.push(
                Row::over_rounds(
                    "bare-knob",
                    format!("bare loop with {knob}, {name} pass, {what}"),
                    &pass_rounds(&runs[1], pass, f),
                    unit,
                    worse,
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

/// Scenario 1.
pub async fn run(options: &Options, report: &mut Report) -> anyhow::Result<Measured> {
    let spec = DrainSpec {
        partitions: options.partitions,
        entities: options.entities,
        commands: options.commands,
        passes: 2,
        time_box: Duration::from_secs(120),
        pull_batch: options.pull_batch,
        max_ack_pending: options.max_ack_pending,
    };
    if !options.bare_knob.is_empty() {
        knob_experiment(
            options,
            spec,
            &options.bare_knob_base,
            &options.bare_knob,
            report,
        )
        .await?;
        return Ok(Measured { jetshard_warm: 0.0 });
    }
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
    let pass_rounds = |runs: &[DrainRun], pass: usize, f: &dyn Fn(&Pass) -> f64| {
        runs.iter()
            .filter_map(|r| r.passes.get(pass).map(f))
            .collect::<Vec<_>>()
    };
    let commands = spec.commands;
    let rate = |p: &Pass| p.rate;
    let client_us = |p: &Pass| p.client_us_per_command(commands);
    let server_us = |p: &Pass| p.server_us_per_command(commands);
    let shape = format!(
        "{} partitions, {} entities, {} cmds",
        spec.partitions, spec.entities, spec.commands
    );
    let mut jetshard_warm = 0.0;
    for (pass, name) in [(0, "cold"), (1, "warm")] {
        let bare = Row::over_rounds(
            "throughput",
            format!("bare loop, {name} pass, {shape}"),
            &pass_rounds(&bare_runs, pass, &rate),
            "cmd/s",
            Worse::Lower,
        );
        let bare_median = bare.value;
        report.rows.push(bare);
        let row = Row::over_rounds(
            "throughput",
            format!("jetshard, {name} pass, {shape}"),
            &pass_rounds(&jetshard_runs, pass, &rate),
            "cmd/s",
            Worse::Lower,
        )
        .against(bare_median);
        let met = row.ratio.is_some_and(|r| r >= 0.9);
        report.rows.push(if pass == 1 {
            jetshard_warm = row.value;
            row.target(">= 0.9 x bare", met)
        } else {
            row
        });
        for (side, runs) in [("bare loop", &bare_runs), ("jetshard", &jetshard_runs)] {
            // A round that stalls (a partition served far below the others) shows here
            // long before it moves a median: the warm pass of issue 11 took 7x its median.
            let rates = pass_rounds(runs, pass, &rate);
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
            report.rows.push(Row::over_rounds(
                "throughput",
                format!("{side}, {name} pass: client CPU per command"),
                &pass_rounds(runs, pass, &client_us),
                "us",
                Worse::Higher,
            ));
            report.rows.push(Row::over_rounds(
                "throughput",
                format!("{side}, {name} pass: server CPU per command"),
                &pass_rounds(runs, pass, &server_us),
                "us",
                Worse::Higher,
            ));
            report.rows.push(Row::over_rounds(
                "throughput",
                format!("{side}, {name} pass: client allocations per command"),
                &pass_rounds(runs, pass, &|p: &Pass| p.allocs_per_command(commands)),
                "allocs",
                Worse::Higher,
            ));
            report.rows.push(Row::over_rounds(
                "throughput",
                format!("{side}, {name} pass: client bytes allocated per command"),
                &pass_rounds(runs, pass, &|p: &Pass| p.alloc_bytes_per_command(commands)),
                "bytes",
                Worse::Higher,
            ));
        }
    }
    if bareloop_runs.is_empty() {
        eprintln!(
            "throughput: bareloop not run (--bareloop <path> or BARELOOP_BIN): issue 22's targets against it (bench bare loop within 10%; jetshard warm >= 0.8x, cold >= 0.7x, server CPU <= 1.2x, client CPU <= 2x) are not checked"
        );
    } else {
        against_bareloop(report, &bareloop_runs, &bare_runs, &jetshard_runs, commands);
    }
    let fresh = if options.fresh_entities > 0 && !options.jetshard_only && !options.bare_only {
        eprintln!(
            "throughput: first commands of {} never-seen entities",
            options.fresh_entities
        );
        let fresh = fresh_entities(spec.partitions, options.fresh_entities).await?;
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
