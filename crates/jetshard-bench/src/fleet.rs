//! Scenario `fleet` (formerly `scale`): what a fleet costs while it does nothing, as the fleet
//! grows, and a SIGKILL failover in a fleet.
//!
//! For each process count N and partition count P: a fresh server (with its monitoring port),
//! N shard systems in this process, each on its own connection (so the server sees N clients,
//! as it would N processes), P partitions. One command goes to an entity of every partition so
//! that every partition is owned; then the scenario waits until every partition has exactly one
//! owner and the spread is even (the most and the fewest owned differ by one at most), and
//! measures for `--fleet-idle-secs` with no load:
//! - messages the server received per second (`in_msgs` of its `/varz`), in all, per process
//!   and per partition;
//! - CPU of the server, and of this process divided by N (the shard systems' share: there is
//!   nothing else running);
//! - the time from the first system's start until every partition was owned, and until the
//!   spread was even.
//!
//! The target: idle messages per process at the largest N within 1.5x of the
//! smallest N at the same P; per partition independent of N. Measured, never asserted.
//!
//! Then a SIGKILL failover in a fleet of `--fleet-failover-nodes` node processes (balancing on,
//! so the crash watches and standbys are the bounded ones), 8 partitions, a load of 200
//! commands/s: each trial waits for an even spread, kills a process that owns partitions, and
//! measures per partition it owned the time to the first event written under a newer
//! generation; a fresh process replaces the victim. The same trials with 2 processes, in the same
//! run, are the baseline. Target: p99 <= 100 ms, as with 2 processes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use jetshard::{CommandSender, EntityId, ShardConfig, ShardSystem, partition_of};
use jetshard_testkit::NatsServer;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::Options;
use crate::cpu::cpu_time;
use crate::entity::{BenchCmd, BenchEntity};
use crate::failover;
use crate::node::{NodeArgs, NodeProcess};
use crate::report::{Report, Row};
use crate::stats::Summary;

const ENTITY_TYPE: &str = "scale";

/// The most partition owners (processes x partitions) one fleet runs in this process.
const MAX_OWNERS: usize = 16_384;

/// How long the fleet may take to own every partition evenly.
const SETTLE_TIME_BOX: Duration = Duration::from_secs(180);

/// Scenario `fleet`.
pub async fn run(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let mut details = serde_json::Map::new();
    let mut fleets: BTreeMap<(usize, u32), Idle> = BTreeMap::new();
    for &partitions in &options.fleet_partitions {
        for &nodes in &options.fleet_nodes {
            let case = format!("{nodes} processes, {partitions} partitions");
            if nodes * partitions as usize > MAX_OWNERS {
                eprintln!(
                    "fleet: {case} skipped: more than {MAX_OWNERS} partition owners in one process"
                );
                continue;
            }
            eprintln!("fleet: {case}");
            match idle_fleet(nodes, partitions, options.fleet_idle_secs).await {
                Ok(idle) => {
                    let per = |v: f64| v / nodes as f64;
                    let rows = [
                        (
                            "idle server in-msgs/s per process",
                            per(idle.in_msgs_per_sec),
                            "msg/s",
                        ),
                        (
                            "idle server out-msgs/s per process",
                            per(idle.out_msgs_per_sec),
                            "msg/s",
                        ),
                        (
                            "idle CPU per process",
                            per(idle.client_cpu_share) * 100.0,
                            "% core",
                        ),
                        ("idle server CPU", idle.server_cpu_share * 100.0, "% core"),
                        (
                            "start -> every partition owned",
                            idle.owned_after.as_secs_f64() * 1000.0,
                            "ms",
                        ),
                        (
                            "start -> spread evenly",
                            idle.even_after.as_secs_f64() * 1000.0,
                            "ms",
                        ),
                    ];
                    for (what, value, unit) in rows {
                        report
                            .rows
                            .push(Row::new("fleet", format!("{what}, {case}"), value, unit));
                    }
                    details.insert(
                        format!("n{nodes}_p{partitions}"),
                        serde_json::to_value(&idle)?,
                    );
                    fleets.insert((nodes, partitions), idle);
                }
                Err(e) => {
                    // One failed fleet does not cost the figures of the others.
                    eprintln!("fleet: {case} failed: {e:#}");
                    details.insert(
                        format!("n{nodes}_p{partitions}_error"),
                        json!(format!("{e:#}")),
                    );
                }
            }
        }
    }
    // Per process, at each P: the largest fleet against the smallest.
    let within = |value: f64, base: f64| value <= 1.5 * base;
    for &partitions in &options.fleet_partitions {
        let measured: Vec<(usize, f64)> = fleets
            .iter()
            .filter(|((_, p), _)| *p == partitions)
            .map(|((n, _), idle)| (*n, idle.in_msgs_per_sec / *n as f64))
            .collect();
        if let (Some(&(few, base)), Some(&(many, value))) = (measured.first(), measured.last())
            && few != many
            && base > 0.0
        {
            report.rows.push(
                Row::new(
                    "fleet",
                    format!("idle in-msgs/s per process, {many} against {few} processes, {partitions} partitions"),
                    value,
                    "msg/s",
                )
                .against(base)
                .target("<= 1.5x", within(value, base)),
            );
        }
    }
    // Per partition, at each N: what one more partition costs (the slope between the two
    // smallest partition counts measured), the largest fleet against the smallest.
    let mut slopes: Vec<(usize, f64)> = Vec::new();
    for &nodes in &options.fleet_nodes {
        let measured: Vec<(u32, f64)> = fleets
            .iter()
            .filter(|((n, _), _)| *n == nodes)
            .map(|((_, p), idle)| (*p, idle.in_msgs_per_sec))
            .collect();
        if let [(p1, m1), (p2, m2), ..] = measured[..] {
            let slope = (m2 - m1) / f64::from(p2 - p1);
            report.rows.push(Row::new(
                "fleet",
                format!(
                    "idle in-msgs/s per partition (slope {p1}..{p2} partitions), {nodes} processes"
                ),
                slope,
                "msg/s",
            ));
            slopes.push((nodes, slope));
        }
    }
    if let (Some(&(few, base)), Some(&(many, value))) = (slopes.first(), slopes.last())
        && few != many
        && base > 0.0
    {
        report.rows.push(
            Row::new(
                "fleet",
                format!("idle in-msgs/s per partition, {many} against {few} processes"),
                value,
                "msg/s",
            )
            .against(base)
            .target("<= 1.5x", within(value, base)),
        );
    }
    if options.fleet_failover_nodes > 2 && options.fleet_failover_trials > 0 {
        // The same trials with 2 processes, in the same run: the baseline.
        let mut p99 = Vec::new();
        for nodes in [2, options.fleet_failover_nodes] {
            eprintln!("fleet: SIGKILL failover among {nodes} processes");
            match failover_in_fleet(nodes, options.fleet_failover_trials).await {
                Ok(samples) => {
                    let summary = Summary::of(&samples);
                    let case = |what: &str| {
                        format!("SIGKILL -> first command of new owner, {nodes} processes, {what}")
                    };
                    let row = |what: &str, value: f64| {
                        Row::new("fleet", case(what), value, "ms")
                            .worst_of(summary.max, summary.count)
                    };
                    report.rows.push(row("p50", summary.p50));
                    let mut worst = row("p99", summary.p99).target(
                        format!("<= {:.0} ms", failover::KILL_TARGET_MS),
                        summary.p99 <= failover::KILL_TARGET_MS,
                    );
                    if let Some(&base) = p99.first() {
                        worst = worst.against(base);
                    }
                    report.rows.push(worst);
                    report.rows.push(row("max", summary.max));
                    p99.push(summary.p99);
                    details.insert(
                        format!("failover_n{nodes}"),
                        json!({ "summary_ms": summary, "samples_ms": samples }),
                    );
                }
                Err(e) => {
                    eprintln!("fleet: failover among {nodes} failed: {e:#}");
                    details.insert(format!("failover_n{nodes}_error"), json!(format!("{e:#}")));
                }
            }
        }
    }
    report.details.insert("fleet".to_owned(), details.into());
    Ok(())
}

/// Partitions of the fleet failover: as many as the `failover` scenario's, so that at its load
/// (200 commands/s) a command reaches each partition every 40 ms there and here: the time to
/// the new owner's first event includes the wait for the next command.
const FAILOVER_PARTITIONS: u32 = failover::PARTITIONS;
/// Pin TTL of the fleet failover: the crash watch, not the TTL, moves the partitions.
const FAILOVER_PIN_TTL_MS: u64 = 2_000;

/// SIGKILL trials in a fleet of `nodes` processes; per partition moved, milliseconds from the
/// signal to the first event of the new owner.
async fn failover_in_fleet(nodes: usize, trials: usize) -> anyhow::Result<Vec<f64>> {
    let server = crate::server::nats_server().await?;
    let node_args = |id: usize| {
        NodeArgs::new(
            server.url(),
            failover::ENTITY_TYPE,
            format!("s{id}"),
            FAILOVER_PARTITIONS,
            FAILOVER_PIN_TTL_MS,
        )
    };
    let mut fleet = Vec::with_capacity(nodes);
    for id in 0..nodes {
        fleet.push(NodeProcess::start(&node_args(id)).await?);
    }
    let seen: failover::FirstSeen = Default::default();
    let watcher = failover::watch_generations(server.connect().await?, seen.clone()).await?;
    let load = failover::offer_load(server.connect().await?);
    let js = async_nats::jetstream::new(server.connect().await?);
    let mut samples = Vec::new();
    let mut in_hand_at_last_kill: Vec<u64> = Vec::new();
    let result = async {
        for trial in 0..trials {
            jetshard_testkit::wait_until(
                SETTLE_TIME_BOX,
                &format!("trial {trial}: every partition owned, evenly"),
                || async {
                    let owned: Vec<usize> = fleet.iter().map(|n| n.owned().len()).collect();
                    let (most, fewest) = (
                        owned.iter().max().copied().unwrap_or(0),
                        owned.iter().min().copied().unwrap_or(0),
                    );
                    owned.iter().sum::<usize>() == FAILOVER_PARTITIONS as usize
                        && most - fewest <= 1
                        && failover::latest_generations(&seen).len() == FAILOVER_PARTITIONS as usize
                },
            )
            .await?;
            // A crash that finds in hand the commands the last takeover recovered isolates (see
            // the failover scenario): wait until they are acknowledged.
            failover::wait_recovered_acknowledged(&js, &in_hand_at_last_kill).await?;
            let before = failover::latest_generations(&seen);
            let victim = fleet
                .iter()
                .position(|n| !n.owned().is_empty())
                .context("a process that owns partitions")?;
            let lost = fleet[victim].owned();
            let signalled = tokio::time::Instant::now();
            fleet[victim].signal(libc::SIGKILL)?;
            jetshard_testkit::wait_until(
                Duration::from_secs(30),
                &format!("trial {trial}: the victim's partitions written under a new generation"),
                || async {
                    let taken = failover::taken_over(&seen, &before);
                    lost.iter().all(|p| taken.contains_key(p))
                },
            )
            .await?;
            let taken = failover::taken_over(&seen, &before);
            for partition in &lost {
                if let Some(first) = taken.get(partition) {
                    samples.push(first.at.duration_since(signalled).as_secs_f64() * 1000.0);
                }
            }
            in_hand_at_last_kill = failover::delivered(&js).await?;
            let dead = fleet.remove(victim);
            dead.kill().await?;
            fleet.push(NodeProcess::start(&node_args(nodes + trial)).await?);
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    load.abort();
    watcher.abort();
    for node in fleet {
        let _ = node.kill().await;
    }
    result.map(|()| samples)
}

/// What one idle fleet cost.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Idle {
    /// Messages the server received per second while idle.
    pub in_msgs_per_sec: f64,
    /// Messages the server sent per second while idle.
    pub out_msgs_per_sec: f64,
    /// CPU of this process (all N systems) over the idle window, in cores.
    pub client_cpu_share: f64,
    /// CPU of the server over the idle window, in cores.
    pub server_cpu_share: f64,
    /// From the first system's start until every partition had one owner.
    #[serde(with = "millis")]
    pub owned_after: Duration,
    /// ... and the most and fewest owned differed by one at most.
    #[serde(with = "millis")]
    pub even_after: Duration,
    /// Partitions owned per process at the end of the idle window.
    pub spread: Vec<usize>,
}

mod millis {
    pub(super) fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64() * 1000.0)
    }
}

/// Starts `nodes` shard systems over `partitions`, waits for an even spread, measures idle.
pub async fn idle_fleet(nodes: usize, partitions: u32, idle_secs: u64) -> anyhow::Result<Idle> {
    let monitor = free_port().context("a free port for the monitoring endpoint")?;
    let server = NatsServer::builder()
        .arg("-m")
        .arg(monitor.to_string())
        .start()
        .await
        .context("start the server")?;
    let server_pid = server.pid().context("the server's pid")?;
    let started = Instant::now();
    let mut systems = Vec::with_capacity(nodes);
    for node in 0..nodes {
        let config = ShardConfig::builder(ENTITY_TYPE)
            .partitions(partitions)
            .node_id(format!("n{node}"))
            .build()?;
        let client = server.connect().await?;
        systems.push(
            ShardSystem::start::<BenchEntity>(client, config)
                .await
                .with_context(|| format!("start shard system {node}"))?,
        );
    }
    // One command to an entity of every partition: a partition is owned once it has work.
    let config = ShardConfig::builder(ENTITY_TYPE)
        .partitions(partitions)
        .build()?;
    let sender = CommandSender::<BenchEntity>::new(server.connect().await?, &config);
    for id in ids_covering(partitions)? {
        sender
            .send(&id, &BenchCmd::Stamp { at_ns: 0 })
            .await
            .with_context(|| format!("send to {id}"))?;
    }
    let mut owned_after = None;
    let even_after = loop {
        let spread = spread(&systems).await;
        let total: usize = spread.iter().sum();
        if total == partitions as usize {
            owned_after.get_or_insert(started.elapsed());
            let (most, fewest) = (
                spread.iter().max().copied().unwrap_or(0),
                spread.iter().min().copied().unwrap_or(0),
            );
            if most - fewest <= 1 {
                break started.elapsed();
            }
        }
        anyhow::ensure!(
            started.elapsed() < SETTLE_TIME_BOX,
            "not owned evenly after {SETTLE_TIME_BOX:?}: {spread:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let owned_after = owned_after.unwrap_or(even_after);
    // The idle window.
    let before = varz(monitor).await?;
    let (client_before, server_before) = (cpu_time(std::process::id()), cpu_time(server_pid));
    let window_start = Instant::now();
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let window = window_start.elapsed().as_secs_f64();
    let after = varz(monitor).await?;
    let (client_after, server_after) = (cpu_time(std::process::id()), cpu_time(server_pid));
    let share = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
        (Some(a), Some(b)) => b.saturating_sub(a).as_secs_f64() / window,
        _ => f64::NAN,
    };
    let spread = spread(&systems).await;
    let idle = Idle {
        in_msgs_per_sec: (after.in_msgs - before.in_msgs) as f64 / window,
        out_msgs_per_sec: (after.out_msgs - before.out_msgs) as f64 / window,
        client_cpu_share: share(client_before, client_after),
        server_cpu_share: share(server_before, server_after),
        owned_after,
        even_after,
        spread,
    };
    eprintln!("fleet: {nodes} x {partitions}: {idle:?}");
    futures::future::join_all(systems.into_iter().map(ShardSystem::shutdown)).await;
    drop(server);
    Ok(idle)
}

/// Partitions owned per system.
async fn spread(systems: &[ShardSystem]) -> Vec<usize> {
    let mut spread = Vec::with_capacity(systems.len());
    for system in systems {
        let owned = system
            .status()
            .await
            .map(|s| s.iter().filter(|p| p.generation.is_some()).count())
            .unwrap_or(0);
        spread.push(owned);
    }
    spread
}

/// One entity id per partition.
fn ids_covering(partitions: u32) -> anyhow::Result<Vec<String>> {
    let mut ids: Vec<Option<String>> = vec![None; partitions as usize];
    let mut missing = partitions as usize;
    for i in 0.. {
        if missing == 0 {
            break;
        }
        let id = format!("e-{i}");
        let partition = partition_of(&EntityId::new(id.clone())?, partitions) as usize;
        if ids[partition].is_none() {
            ids[partition] = Some(id);
            missing -= 1;
        }
    }
    Ok(ids.into_iter().flatten().collect())
}

/// The server's message counters.
struct Varz {
    in_msgs: u64,
    out_msgs: u64,
}

/// Reads `/varz` from the server's monitoring port.
async fn varz(port: u16) -> anyhow::Result<Varz> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .context("connect to the monitoring port")?;
    stream
        .write_all(b"GET /varz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body)
        .context("no body in the /varz answer")?;
    let value: serde_json::Value = serde_json::from_str(body).context("parse /varz")?;
    let field = |name: &str| {
        value
            .get(name)
            .and_then(serde_json::Value::as_u64)
            .with_context(|| format!("/varz has no {name}"))
    };
    Ok(Varz {
        in_msgs: field("in_msgs")?,
        out_msgs: field("out_msgs")?,
    })
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
