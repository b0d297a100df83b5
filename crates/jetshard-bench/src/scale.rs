//! Scenario `scale`: what a fleet costs while it does nothing, as the fleet grows.
//!
//! For each process count N and partition count P: a fresh server (with its monitoring port),
//! N shard systems in this process, each on its own connection (so the server sees N clients,
//! as it would N processes), P partitions. One command goes to an entity of every partition so
//! that every partition is owned; then the scenario waits until every partition has exactly one
//! owner and the spread is even (the most and the fewest owned differ by one at most), and
//! measures for `--scale-idle-secs` with no load:
//! - messages the server received per second (`in_msgs` of its `/varz`), in all, per process
//!   and per partition;
//! - CPU of the server, and of this process divided by N (the shard systems' share: there is
//!   nothing else running);
//! - the time from the first system's start until every partition was owned, and until the
//!   spread was even.
//!
//! The target (issue 21): idle messages per process at the largest N within 1.5x of the
//! smallest N at the same P; per partition independent of N. Measured, never asserted.

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
use crate::report::{Report, Row};

const ENTITY_TYPE: &str = "scale";

/// How long the fleet may take to own every partition evenly.
const SETTLE_TIME_BOX: Duration = Duration::from_secs(180);

/// Scenario `scale`.
pub async fn run(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let mut details = serde_json::Map::new();
    // Per P: (N, idle msgs/s per process) for the target row.
    let mut per_process: BTreeMap<u32, Vec<(usize, f64)>> = BTreeMap::new();
    for &partitions in &options.scale_partitions {
        for &nodes in &options.scale_nodes {
            eprintln!("scale: {nodes} processes, {partitions} partitions");
            match idle_fleet(nodes, partitions, options.scale_idle_secs).await {
                Ok(idle) => {
                    let case = format!("{nodes} processes, {partitions} partitions");
                    report.rows.push(Row::new(
                        "scale",
                        format!("idle server in-msgs/s per process, {case}"),
                        idle.in_msgs_per_sec / nodes as f64,
                        "msg/s",
                    ));
                    report.rows.push(Row::new(
                        "scale",
                        format!("idle server in-msgs/s per partition, {case}"),
                        idle.in_msgs_per_sec / f64::from(partitions),
                        "msg/s",
                    ));
                    report.rows.push(Row::new(
                        "scale",
                        format!("idle CPU per process, {case}"),
                        idle.client_cpu_share / nodes as f64 * 100.0,
                        "% core",
                    ));
                    report.rows.push(Row::new(
                        "scale",
                        format!("idle server CPU, {case}"),
                        idle.server_cpu_share * 100.0,
                        "% core",
                    ));
                    report.rows.push(Row::new(
                        "scale",
                        format!("start -> every partition owned, evenly, {case}"),
                        idle.even_after.as_secs_f64() * 1000.0,
                        "ms",
                    ));
                    per_process
                        .entry(partitions)
                        .or_default()
                        .push((nodes, idle.in_msgs_per_sec / nodes as f64));
                    details.insert(
                        format!("n{nodes}_p{partitions}"),
                        serde_json::to_value(&idle)?,
                    );
                }
                Err(e) => {
                    // One failed fleet does not cost the figures of the others.
                    eprintln!("scale: {nodes} x {partitions} failed: {e:#}");
                    details.insert(
                        format!("n{nodes}_p{partitions}_error"),
                        json!(format!("{e:#}")),
                    );
                }
            }
        }
    }
    for (partitions, rows) in per_process {
        let (Some(&(few, base)), Some(&(many, value))) = (rows.first(), rows.last()) else {
            continue;
        };
        if few == many || base <= 0.0 {
            continue;
        }
        let mut row = Row::new(
            "scale",
            format!(
                "idle msgs/s per process, {many} against {few} processes, {partitions} partitions"
            ),
            value,
            "msg/s",
        )
        .against(base);
        row.target = Some("<= 1.5x".to_owned());
        row.met = row.ratio.map(|r| r <= 1.5);
        report.rows.push(row);
    }
    report.details.insert("scale".to_owned(), details.into());
    Ok(())
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
    eprintln!("scale: {nodes} x {partitions}: {idle:?}");
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
