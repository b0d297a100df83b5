//! Scenario `spread`: an entity type's commands and journal in one stream each against spread
//! over as many streams as the cluster has servers (`ShardConfig::journal_streams`), on a
//! 5-server cluster (`--spread-servers`, 3 to 5) with R3 streams, in the same run.
//!
//! Per layout, on a fresh cluster with one shard system in this process: the streams' leaders
//! (spread, the owner of partition 0 moves them until each server leads one journal stream and
//! one command stream), then an
//! offered load at a fixed rate (`--spread-rate` cmd/s for `--spread-secs`, every entity warm):
//! each server's CPU over the load (its share of a core), the busiest and the idlest against
//! the mean, the latency from the scheduled send to the event stored (as `latency` measures
//! it); then the maximum rate: `--spread-drain-commands` commands pre-loaded behind paused
//! consumers, and the time to drain them.
//!
//! With `--latency-stages`, the offered load's latency is split by stage per layout (as the
//! latency scenario splits it) and each server's time on a CPU and waiting for one is printed:
//! where the spread layout's commands wait longer.
//!
//! With `--spread-server-cores`, each server is capped at that many cores ([`CpuCaps`]): the
//! servers as on machines of their own, where the busiest one bounds the rate, instead of all
//! five sharing this machine's cores (where spreading the work cannot add any).

use std::time::Duration;

use anyhow::Context as _;
use jetshard::{Codec, ShardConfig, ShardSystem};
use jetshard_testkit::wait_until;
use serde::Serialize;
use serde_json::json;

use crate::Options;
use crate::cpu::cpu_time;
use crate::cpu_cap::CpuCaps;
use crate::entity::BenchEntity;
use crate::latency::{Stamps, offer_stamped};
use crate::load::{self, Gate};
use crate::report::{Report, Row, Worse};
use crate::runqueue::Sampled;
use crate::stages::{self, Step};
use crate::stats::Summary;

const ENTITY_TYPE: &str = "spread";

/// The most servers of the cluster (`--spread-servers`), and of the spread layout's streams.
const MAX_SERVERS: usize = 5;

/// How long the leaders may take to spread before the load starts anyway.
const SPREAD_WITHIN: Duration = Duration::from_secs(90);

/// Longer than a layout's run.
const KEEP_WARM: Duration = Duration::from_secs(600);

/// Load before the measured window.
const WARM_UP: Duration = Duration::from_secs(2);

/// One layout's run.
#[derive(Debug, Clone, Serialize)]
struct LayoutRun {
    streams: u32,
    /// Each journal stream's leader when the load started.
    leaders: Vec<String>,
    /// Each command stream's leader when the load started, and the servers holding replicas
    /// of any (the partitions' consumers are led among these).
    command_leaders: Vec<String>,
    command_peers: Vec<String>,
    /// The servers the shard system and the publisher are connected to: a write or a publish
    /// to a stream led elsewhere takes one more hop.
    system_server: String,
    publisher_server: String,
    /// Each server's CPU over the offered load, in cores, by server name.
    cpu: Vec<(String, f64)>,
    busiest_to_mean: f64,
    idlest_to_mean: f64,
    latency: Summary,
    /// Events stored per second over the offered load.
    completed_rate: f64,
    /// Commands/s drained from a pre-loaded backlog.
    drain_rate: f64,
    /// The latency split by stage (`--latency-stages`; empty without it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stages: Vec<Step>,
    /// Each process's time on a CPU and waiting for one over the offered load
    /// (`--latency-stages`; empty without it).
    #[serde(skip_serializing_if = "String::is_empty")]
    sched: String,
}

/// Names for the servers' scheduler times.
const SERVER_LABELS: [&str; MAX_SERVERS] =
    ["server 1", "server 2", "server 3", "server 4", "server 5"];

/// The scenario.
pub async fn run(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let servers = usize::from(options.spread_servers);
    let mut runs = Vec::new();
    for round in 0..options.spread_rounds {
        for streams in [1, servers as u32] {
            eprintln!(
                "spread round {}/{}: the journal in {streams} stream(s), {} cmd/s for {} s",
                round + 1,
                options.spread_rounds,
                options.spread_rate,
                options.spread_secs
            );
            runs.push(measure(options, servers, streams).await?);
        }
    }
    let capped = options.spread_server_cores.map_or(String::new(), |cores| {
        format!(", each capped at {cores} cores")
    });
    let shape = format!(
        "{servers} servers{capped}, R3, {} partitions, {} entities",
        options.spread_partitions, options.entities
    );
    let of = |streams: u32, figure: fn(&LayoutRun) -> f64| -> Vec<f64> {
        runs.iter()
            .filter(|r| r.streams == streams)
            .map(figure)
            .collect()
    };
    let rate = options.spread_rate;
    let mut baselines = Vec::new();
    for streams in [1, servers as u32] {
        let layout = if streams == 1 {
            "one stream each".to_owned()
        } else {
            format!("commands and journal spread over {streams} streams each")
        };
        let row = |what: &str, figure: fn(&LayoutRun) -> f64, unit: &'static str, worse: Worse| {
            Row::over_rounds(
                "spread",
                format!("{layout}: {what}, {shape}"),
                &of(streams, figure),
                unit,
                worse,
            )
        };
        let servers_leading = row(
            "servers leading a journal stream",
            servers_leading_journal,
            "servers",
            Worse::Lower,
        );
        let busiest = row(
            &format!("busiest server's CPU against the mean at {rate:.0} cmd/s"),
            |r| r.busiest_to_mean,
            "x",
            Worse::Higher,
        );
        let idlest = row(
            &format!("idlest server's CPU against the mean at {rate:.0} cmd/s"),
            |r| r.idlest_to_mean,
            "x",
            Worse::Lower,
        );
        let p99 = row(
            &format!("p99 latency at {rate:.0} cmd/s"),
            |r| r.latency.p99,
            "ms",
            Worse::Higher,
        );
        let drain = row(
            "maximum rate (a pre-loaded backlog drained)",
            |r| r.drain_rate,
            "cmd/s",
            Worse::Lower,
        );
        let completed = row(
            &format!("completed at {rate:.0} cmd/s offered"),
            |r| r.completed_rate,
            "cmd/s",
            Worse::Lower,
        );
        if streams == 1 {
            baselines = vec![p99.value, drain.value];
            report
                .rows
                .extend([servers_leading, busiest, idlest, completed, p99, drain]);
        } else {
            let (busiest_ok, idlest_ok) = (busiest.value <= 1.3, idlest.value >= 0.7);
            report.rows.extend([
                servers_leading.target(
                    format!("{servers} (every server)"),
                    of(streams, servers_leading_journal)
                        .iter()
                        .all(|n| *n as usize == servers),
                ),
                busiest.target("<= 1.3 x the mean", busiest_ok),
                idlest.target(">= 0.7 x the mean", idlest_ok),
                completed,
                p99.held_to(baselines[0], "<= one stream's", |r| r <= 1.0),
                drain.held_to(baselines[1], ">= one stream's", |r| r >= 1.0),
            ]);
        }
    }
    report
        .details
        .insert("spread".to_owned(), json!({ "runs": runs }));
    Ok(())
}

/// How many servers lead one of the run's journal streams.
fn servers_leading_journal(run: &LayoutRun) -> f64 {
    let mut leaders = run.leaders.clone();
    leaders.sort();
    leaders.dedup();
    leaders.len() as f64
}

/// One layout on a fresh cluster.
async fn measure(options: &Options, servers: usize, streams: u32) -> anyhow::Result<LayoutRun> {
    let cluster = crate::server::nats_cluster(servers).await?;
    let pids: Vec<(String, u32)> = cluster
        .nodes()
        .iter()
        .filter_map(|n| Some((n.name()?.to_owned(), n.pid()?)))
        .collect();
    let _caps = options
        .spread_server_cores
        .map(|cores| CpuCaps::apply(&pids.iter().map(|(_, pid)| *pid).collect::<Vec<_>>(), cores))
        .transpose()?;
    let control = cluster.connect().await?;
    let partitions = options.spread_partitions;
    let config = ShardConfig::builder(ENTITY_TYPE)
        .partitions(partitions)
        .replicas(3)
        .journal_streams(streams)
        // Every entity stays warm over the run: entities warmed together would otherwise be
        // passivated together `passivate_after` later, each writing a snapshot, a burst that
        // lands in the spread layout's measured window (it waits for its leaders to spread)
        // and not in the other's.
        .passivate_after(KEEP_WARM)
        .node_id("bench")
        .build()?;
    let names = config.names();
    let client = cluster.connect().await?;
    let system_server = client.server_info().server_name;
    let publisher_server = control.server_info().server_name;
    let system = ShardSystem::start::<BenchEntity>(client, config)
        .await
        .context("start the shard system")?;
    let js = async_nats::jetstream::new(control.clone());
    // Each stream's leader (`None` until every one has one) and the servers of its replicas.
    let placed = |streams: Vec<String>| {
        let js = js.clone();
        async move {
            let mut leaders = Vec::new();
            let mut peers = Vec::new();
            for name in streams {
                let mut stream = js.get_stream(&name).await.ok()?;
                let cluster = stream.info().await.ok()?.cluster.clone()?;
                peers.extend(cluster.replicas.iter().map(|r| r.name.clone()));
                leaders.push(cluster.leader?);
            }
            peers.extend(leaders.iter().cloned());
            peers.sort();
            peers.dedup();
            Some((leaders, peers))
        }
    };
    let spread_over = |leaders: &[String]| {
        let mut servers = leaders.to_vec();
        servers.sort();
        servers.dedup();
        servers.len()
    };
    let publisher = load::warm_entities(
        &control,
        ENTITY_TYPE,
        partitions,
        options.entities,
        options.command_bytes,
    )
    .await?;
    if streams > 1 {
        let spread = wait_until(SPREAD_WITHIN, "the stream leaders spread", || async {
            let wanted = servers.min(streams as usize);
            let journal = placed(names.journal_streams().to_vec()).await;
            let commands = placed(names.command_streams().to_vec()).await;
            journal.is_some_and(|(l, _)| spread_over(&l) == wanted)
                && commands.is_some_and(|(l, _)| spread_over(&l) == wanted)
        })
        .await;
        if let Err(e) = spread {
            eprintln!("spread: {e}; measuring as they are");
        }
    }
    let (leaders, _) = placed(names.journal_streams().to_vec())
        .await
        .unwrap_or_default();
    let (command_leaders, command_peers) = placed(names.command_streams().to_vec())
        .await
        .unwrap_or_default();

    // The offered load, every server's CPU over it.
    let stamps = Stamps::listen(&control, ENTITY_TYPE, Codec::default()).await?;
    let total =
        (options.spread_rate * (WARM_UP.as_secs_f64() + options.spread_secs as f64)) as usize;
    let before: Vec<Duration> = pids
        .iter()
        .map(|(_, pid)| cpu_time(*pid).unwrap_or_default())
        .collect();
    let sched = options.latency_stages.then(|| {
        stages::record(true);
        let mut processes = vec![("bench", std::process::id())];
        processes.extend(
            SERVER_LABELS
                .iter()
                .zip(&pids)
                .map(|(label, (_, pid))| (*label, *pid)),
        );
        Sampled::start(&processes)
    });
    let offered = offer_stamped(
        &publisher,
        options.spread_rate,
        total,
        options.command_bytes,
    )
    .await?;
    let sched = sched.map_or(String::new(), |sched| sched.report());
    stamps.wait_for(total, Duration::from_secs(30)).await;
    let elapsed = offered.secs;
    let cpu: Vec<(String, f64)> = pids
        .iter()
        .zip(&before)
        .map(|((name, pid), before)| {
            let spent = cpu_time(*pid).unwrap_or_default().saturating_sub(*before);
            (name.clone(), spent.as_secs_f64() / elapsed)
        })
        .collect();
    let mean = cpu.iter().map(|(_, c)| c).sum::<f64>() / cpu.len().max(1) as f64;
    let busiest = cpu.iter().map(|(_, c)| *c).fold(0.0, f64::max);
    let idlest = cpu.iter().map(|(_, c)| *c).fold(f64::MAX, f64::min);
    let warm_up_end = offered.started_ns + WARM_UP.as_nanos() as u64;
    let stages = if options.latency_stages {
        stages::split(&stamps.seen(), warm_up_end)
    } else {
        Vec::new()
    };
    let recorded = stamps.stop();
    let completed = recorded.len();
    let samples: Vec<f64> = recorded
        .iter()
        .filter(|(at, _)| *at >= warm_up_end)
        .map(|(_, latency)| *latency as f64 / 1e6)
        .collect();

    // The maximum: a backlog behind paused consumers, then the time to drain it.
    let gate = Gate::new(control.clone(), ENTITY_TYPE, partitions);
    gate.close().await?;
    publisher
        .preload(
            options.spread_drain_commands,
            &load::preload_command(options.command_bytes),
        )
        .await?;
    let opened = tokio::time::Instant::now();
    gate.open().await?;
    let drained = load::wait_drained(&control, ENTITY_TYPE, Duration::from_secs(300)).await?;
    let drain_rate = options.spread_drain_commands as f64 / (drained - opened).as_secs_f64();
    system.shutdown().await.context("shut the system down")?;
    let run = LayoutRun {
        streams,
        leaders,
        command_leaders,
        command_peers,
        system_server,
        publisher_server,
        cpu,
        busiest_to_mean: busiest / mean,
        idlest_to_mean: idlest / mean,
        latency: Summary::of(&samples),
        completed_rate: completed as f64 / elapsed,
        drain_rate,
        stages,
        sched,
    };
    eprintln!(
        "spread: {streams} stream(s): journal leaders {:?}, command leaders {:?} (replicas on {:?}), system on {}, publisher on {}, cpu {:?}, p99 {:.1} ms, drained {:.0} cmd/s",
        run.leaders,
        run.command_leaders,
        run.command_peers,
        run.system_server,
        run.publisher_server,
        run.cpu,
        run.latency.p99,
        run.drain_rate
    );
    if !run.sched.is_empty() {
        eprintln!("spread: {streams} stream(s): over the load: {}", run.sched);
    }
    for step in &run.stages {
        eprintln!("spread stages: {streams} stream(s): {}", step.describe());
    }
    Ok(run)
}
