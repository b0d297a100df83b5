//! Scenario `loads`: what one entity's load costs as the journal grows with other entities'
//! records: does a load cost the entity's own records, or the journal's span between them?
//!
//! In partition 0 of 8, `--loads-targets` entities (enough that the server's loading of the
//! journal's blocks into its cache, once per block, is spread over many loads, as after a
//! takeover) each get `--loads-tail` events through
//! jetshard itself (snapshots off, so the load reads them all; each event links to the one
//! before it as jetshard writes it), one a round, with `others / tail` events of other
//! entities written straight into the journal before each round: the targets' records lie
//! spread over the whole journal, among those of other entities with ten records each. Then a new shard system takes the partition (woken by a
//! command to an entity without history), and each target gets one command, one after
//! another, each its first since the acquisition, so each loads alone: its last record, then
//! its records back link by link. Timed: publish -> outcome (p50, p99), and the server's CPU
//! over all of them, per load.
//!
//! Cases, each on fresh servers: `--loads-others` records of other entities (the baseline),
//! `--loads-factor` times as many, and as many written without links (as a journal written
//! before them), whose loads read the entity's subjects from its start through everything in
//! between. With `--loads-replicas 3` on a 3-server cluster, R3 streams.

use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use jetshard::{Codec, CommandOutcome, CommandSender, ShardConfig, ShardSystem};
use serde_json::json;
use tokio::time::Instant;

use crate::Options;
use crate::cpu::CpuMeter;
use crate::entity::{BenchCmd, BenchEvt};
use crate::load;
use crate::recovery::RecoveryEntity;
use crate::report::{Report, Row};
use crate::server::Servers;
use crate::stats::Summary;

const ENTITY_TYPE: &str = "loads";
const PARTITIONS: u32 = 8;
const PARTITION: u32 = 0;
const ASK: Duration = Duration::from_secs(30);
/// A load's cost at `--loads-factor` times the other records, against the baseline's.
const WITHIN: f64 = 1.2;

/// One case's journal.
#[derive(Debug, Clone, Copy)]
struct Case {
    others: usize,
    /// Whether the targets' events carry links (written by jetshard) or not.
    linked: bool,
}

/// What one case measured.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Measured {
    others: usize,
    linked: bool,
    latency: Summary,
    /// The servers' CPU over the loads, per load, microseconds.
    server_us_per_load: f64,
    /// The loads' requests of the server, per load (`PartitionStatus::load_reads`).
    reads_per_load: f64,
    journal_messages: u64,
}

/// Scenario `loads`.
pub async fn run(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    anyhow::ensure!(options.loads_tail > 0, "--loads-tail must be positive");
    anyhow::ensure!(
        options.loads_targets > 0,
        "--loads-targets must be positive"
    );
    let big = options.loads_others * options.loads_factor;
    let cases = [
        Case {
            others: options.loads_others,
            linked: true,
        },
        Case {
            others: big,
            linked: true,
        },
        Case {
            others: big,
            linked: false,
        },
    ];
    let mut measured = Vec::new();
    for case in cases {
        let m = measure(options, case).await?;
        eprintln!(
            "loads: {} other records, {}: p50 {:.2} p99 {:.2} ms, server {:.0} us and {:.1} reads a load, journal {}",
            m.others,
            if m.linked { "linked" } else { "unlinked" },
            m.latency.p50,
            m.latency.p99,
            m.server_us_per_load,
            m.reads_per_load,
            m.journal_messages
        );
        measured.push(m);
    }
    let (base, grown, unlinked) = (measured[0], measured[1], measured[2]);
    let replicas = options.loads_replicas;
    let tail = options.loads_tail;
    let case = |others: usize, how: &str| {
        format!(
            "R{replicas}, {tail} events after the start, {others} records of other entities, {how}"
        )
    };
    let at_big = case(big, "linked");
    report.rows.push(
        Row::new(
            "loads",
            format!("load p50, {at_big}"),
            grown.latency.p50,
            "ms",
        )
        .against(base.latency.p50)
        .target(
            format!("<= {WITHIN} x at {} others", base.others),
            grown.latency.p50 <= WITHIN * base.latency.p50,
        ),
    );
    report.rows.push(
        Row::new(
            "loads",
            format!("load p99, {at_big}"),
            grown.latency.p99,
            "ms",
        )
        .against(base.latency.p99),
    );
    report.rows.push(
        Row::new(
            "loads",
            format!("server CPU per load, {at_big}"),
            grown.server_us_per_load,
            "us",
        )
        .against(base.server_us_per_load)
        .target(
            format!("<= {WITHIN} x at {} others", base.others),
            grown.server_us_per_load <= WITHIN * base.server_us_per_load,
        ),
    );
    report.rows.push(
        Row::new(
            "loads",
            format!("load p50, {}", case(big, "written without links")),
            unlinked.latency.p50,
            "ms",
        )
        .against(grown.latency.p50),
    );
    report.rows.push(
        Row::new(
            "loads",
            format!(
                "server CPU per load, {}",
                case(big, "written without links")
            ),
            unlinked.server_us_per_load,
            "us",
        )
        .against(grown.server_us_per_load),
    );
    report
        .details
        .insert("loads".to_owned(), json!({ "cases": measured }));
    Ok(())
}

fn config(options: &Options, node: &str) -> jetshard::ShardConfigBuilder {
    ShardConfig::builder(ENTITY_TYPE)
        .partitions(PARTITIONS)
        .replicas(options.loads_replicas)
        .node_id(node)
        // Every event after the entity's start is read by its load.
        .snapshot_every(0)
        .snapshot_on_passivation(false)
}

async fn measure(options: &Options, case: Case) -> anyhow::Result<Measured> {
    // One server, or a 3-server cluster.
    let servers = Servers::start(options.loads_replicas > 1).await?;
    let control = servers.connect().await?;
    load::provision(control.clone(), config(options, "provision").build()?).await?;
    let targets = load::ids_in_partition("t", PARTITION, PARTITIONS, options.loads_targets);
    // Other entities with ten records each: the partition's blocks hold many subjects, as a
    // real journal's do.
    let others = load::ids_in_partition("o", PARTITION, PARTITIONS, (case.others / 10).max(1));
    let payload = Bytes::from(Codec::default().encode(&BenchEvt::Stamped { at_ns: 1 })?);
    let sender =
        CommandSender::<RecoveryEntity>::new(control.clone(), &config(options, "x").build()?);
    let writer = if case.linked {
        Some(
            ShardSystem::start::<RecoveryEntity>(
                control.clone(),
                config(options, "writer").build()?,
            )
            .await
            .context("start the writing system")?,
        )
    } else {
        None
    };
    let written = Instant::now();
    let per_round = case.others / options.loads_tail;
    for round in 0..options.loads_tail {
        let between = (0..per_round).map(|i| {
            let id = others[(round * per_round + i) % others.len()].clone();
            (PARTITION, id, payload.clone())
        });
        load::write_events(control.clone(), ENTITY_TYPE, between).await?;
        if writer.is_some() {
            for id in &targets {
                sender
                    .send(id, &BenchCmd::Stamp { at_ns: 2 })
                    .await
                    .context("send a target's command")?;
            }
            load::wait_drained(&control, ENTITY_TYPE, Duration::from_secs(120)).await?;
        } else {
            let events = targets
                .iter()
                .map(|id| (PARTITION, id.clone(), payload.clone()));
            load::write_events(control.clone(), ENTITY_TYPE, events).await?;
        }
    }
    if let Some(writer) = writer {
        writer.shutdown().await.context("stop the writing system")?;
    }
    let journal_messages = jetshard_journal_messages(&control).await?;
    eprintln!(
        "loads: journal of {journal_messages} messages written in {:.1} s",
        written.elapsed().as_secs_f64()
    );

    let reader =
        ShardSystem::start::<RecoveryEntity>(control.clone(), config(options, "reader").build()?)
            .await
            .context("start the reading system")?;
    // The partition taken by a command to an entity without history: no load of a target.
    let wake = load::ids_in_partition("w", PARTITION, PARTITIONS, 1).remove(0);
    applied(&sender, &wake).await?;
    // On R3 the replicas go on applying what was written for a while after it was
    // acknowledged: the loads are measured once the servers are idle.
    quiet(&servers.pids()).await;
    let reads_before = load_reads(&reader).await?;
    let meter = CpuMeter::start(&servers.pids());
    let mut samples = Vec::with_capacity(targets.len());
    for id in &targets {
        let started = Instant::now();
        applied(&sender, id).await?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let spent = meter.spent();
    let reads = load_reads(&reader).await? - reads_before;
    reader.shutdown().await.context("stop the reading system")?;
    let loads = targets.len() as f64;
    Ok(Measured {
        others: case.others,
        linked: case.linked,
        latency: Summary::of(&samples),
        server_us_per_load: spent.server_secs * 1e6 / loads,
        reads_per_load: reads as f64 / loads,
        journal_messages,
    })
}

/// Waits (at most a minute) until the servers together spend under 5% of a core over half a
/// second.
async fn quiet(pids: &[u32]) {
    const WINDOW: Duration = Duration::from_millis(500);
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let meter = CpuMeter::start(pids);
        tokio::time::sleep(WINDOW).await;
        if meter.spent().server_secs < 0.05 * WINDOW.as_secs_f64() {
            return;
        }
    }
    eprintln!("loads: the servers did not go quiet within a minute");
}

async fn applied(sender: &CommandSender<RecoveryEntity>, id: &str) -> anyhow::Result<()> {
    let outcome = sender
        .request_outcome(id, &BenchCmd::Stamp { at_ns: 3 }, ASK)
        .await?;
    anyhow::ensure!(
        matches!(outcome, CommandOutcome::Applied { .. }),
        "{id}: {outcome:?}"
    );
    Ok(())
}

async fn load_reads(system: &ShardSystem) -> anyhow::Result<u64> {
    Ok(system
        .status()
        .await?
        .iter()
        .find(|p| p.partition == PARTITION)
        .map_or(0, |p| p.load_reads))
}

async fn jetshard_journal_messages(client: &async_nats::Client) -> anyhow::Result<u64> {
    let js = async_nats::jetstream::new(client.clone());
    let mut stream = js
        .get_stream(jetshard::wire::Names::new(ENTITY_TYPE).journal_stream(0))
        .await?;
    Ok(stream.info().await?.state.messages)
}
