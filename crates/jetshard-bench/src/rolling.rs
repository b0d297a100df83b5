//! The rolling deploy: three node processes share [`PARTITIONS`] partitions (balancing on)
//! under [`RATE`] commands/s; each node in turn is stopped with SIGTERM (a graceful stop:
//! it finishes and acknowledges what it holds and unpins) and replaced by a fresh process,
//! which the balancing hands its share to.
//!
//! Measured: commands that failed (a publish refused, a command with no event at the end, or
//! with two), how often each partition moved per node restart (`ACQUIRED` lines of every node
//! between the SIGTERM and the replacement owning its share), and the command latency (event
//! seen on a core subscription minus the command's *scheduled* send time) during the rollout
//! against the steady state before it.
//!
//! Targets: 0 failed commands; a partition moves at most twice per restart (once off
//! the stopping node, once onto its replacement); p99 during the rollout <= steady p99 + 50 ms.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use jetshard::Codec;
use serde_json::json;
use tokio::task::JoinHandle;

use crate::entity::BenchEvt;
use crate::load;
use crate::node::{NodeArgs, NodeProcess};
use crate::offered::{OfferedLoad, Stamp};
use crate::report::{Report, Row};
use crate::stats::{Summary, now_ns};

const ENTITY_TYPE: &str = "roll";
/// Partitions shared by the three nodes.
pub const PARTITIONS: u32 = 8;
/// Commands/s offered throughout.
pub const RATE: u64 = 2_000;
/// Entities the load goes to.
const ENTITIES: usize = 512;
/// Node processes.
const NODES: usize = 3;
/// Pin TTL of the nodes (the default).
const PIN_TTL_MS: u64 = 2_000;
/// The steady state measured before the rollout.
const STEADY: Duration = Duration::from_secs(10);
/// Time given after each replacement owns its share, before the next restart.
const SETTLE: Duration = Duration::from_secs(2);
/// Target: p99 during the rollout at most this much over the steady p99, ms.
const ADDED_P99_TARGET_MS: f64 = 50.0;

/// What the event watcher saw: per command sequence, how many events, and latencies with the
/// command's scheduled send time.
#[derive(Default)]
struct Seen {
    events: HashMap<u64, u32>,
    /// (scheduled send ns, latency ms)
    latencies: Vec<(u64, f64)>,
}

type Shared<T> = Arc<Mutex<T>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs the rolling deploy (the nodes' entity as jetshard's defaults leave it, snapshots on, or
/// opted out without `snapshots`); rows go to
/// `report`, the details are returned.
pub async fn run(report: &mut Report, snapshots: bool) -> anyhow::Result<serde_json::Value> {
    let server = crate::server::nats_server().await?;
    let node_args = |id: usize| NodeArgs {
        without_snapshots: !snapshots,
        ..NodeArgs::new(
            server.url(),
            ENTITY_TYPE,
            format!("r{id}"),
            PARTITIONS,
            PIN_TTL_MS,
        )
    };
    let mut nodes = Vec::new();
    for id in 0..NODES {
        nodes.push(NodeProcess::start(&node_args(id)).await?);
    }
    let seen: Shared<Seen> = Arc::default();
    let watcher = watch_events(server.connect().await?, seen.clone()).await?;
    // [`RATE`] commands/s round-robin over [`ENTITIES`] entities, each stamped with its
    // scheduled send time.
    let mut load = OfferedLoad::start(
        server.connect().await?,
        ENTITY_TYPE,
        ENTITIES,
        RATE,
        Stamp::Scheduled,
        "rolling load",
    );

    let result = async {
        let balanced = |nodes: &[NodeProcess]| {
            let share = PARTITIONS as usize / NODES;
            let total: usize = nodes.iter().map(|n| n.owned().len()).sum();
            total == PARTITIONS as usize && nodes.iter().all(|n| n.owned().len() >= share)
        };
        jetshard_testkit::wait_until(
            Duration::from_secs(60),
            "3 nodes to share the partitions",
            || async { balanced(&nodes) },
        )
        .await?;
        tokio::time::sleep(SETTLE).await;
        let steady_from = now_ns();
        let steady_unix_ms = crate::probe::unix_ms();
        tokio::time::sleep(STEADY).await;
        let rollout_from = now_ns();
        let mut restarts = Vec::new();
        let mut retired: Vec<crate::node::Acquired> = Vec::new();
        for k in 0..NODES {
            let started = crate::probe::unix_ms();
            let stopping = nodes.remove(0);
            let id = stopping.id().to_owned();
            retired.extend(stopping.acquisitions());
            stopping.terminate().await?;
            nodes.push(NodeProcess::start(&node_args(NODES + k)).await?);
            let what = format!("the replacement of {id} to get its share");
            jetshard_testkit::wait_until(Duration::from_secs(60), &what, || async {
                balanced(&nodes)
            })
            .await?;
            restarts.push((id, started, crate::probe::unix_ms()));
            tokio::time::sleep(SETTLE).await;
        }
        let rollout_to = now_ns();
        Ok::<_, anyhow::Error>((
            steady_from,
            steady_unix_ms,
            rollout_from,
            rollout_to,
            restarts,
            retired,
        ))
    }
    .await;
    // Stopped, not aborted: the acknowledgements of the last publishes are still on their way,
    // and an aborted publisher loses them (they showed as refused publishes, "broken pipe").
    load.stop(Duration::from_secs(10)).await;
    let (steady_from, steady_unix_ms, rollout_from, rollout_to, restarts, mut retired) =
        match result {
            Ok(r) => r,
            Err(e) => {
                watcher.abort();
                return Err(e);
            }
        };
    // Every command published must show one event.
    let acked_seqs = load.acked();
    let drained =
        jetshard_testkit::wait_until(Duration::from_secs(30), "every command's event", || async {
            let seen = lock(&seen);
            acked_seqs.iter().all(|s| seen.events.contains_key(s))
        })
        .await;
    watcher.abort();
    for node in &nodes {
        retired.extend(node.acquisitions());
    }
    let seen = lock(&seen);
    let lost = acked_seqs
        .iter()
        .filter(|s| !seen.events.contains_key(s))
        .count();
    let doubled = seen.events.values().filter(|n| **n > 1).count();
    let refused = load.refused();
    let failed = lost as u64 + doubled as u64 + refused;
    if drained.is_err() {
        eprintln!("rolling: {lost} commands without an event after 30 s");
    }
    let window = |from: u64, to: u64| -> Vec<f64> {
        seen.latencies
            .iter()
            .filter(|(at, _)| (from..to).contains(at))
            .map(|(_, ms)| *ms)
            .collect()
    };
    let steady = Summary::of(&window(steady_from, rollout_from));
    let rollout = Summary::of(&window(rollout_from, rollout_to));
    let mut moves_per_restart = Vec::new();
    for (id, from, to) in &restarts {
        let mut per_partition: HashMap<u32, u32> = HashMap::new();
        for a in retired
            .iter()
            .filter(|a| (*from..=*to).contains(&a.at_unix_ms))
        {
            *per_partition.entry(a.partition).or_default() += 1;
        }
        let max = per_partition.values().copied().max().unwrap_or(0);
        let total: u32 = per_partition.values().sum();
        moves_per_restart.push(
            json!({ "node": id, "ms": to - from, "max_moves_of_a_partition": max, "moves": total }),
        );
    }
    let max_moves = moves_per_restart
        .iter()
        .filter_map(|m| m["max_moves_of_a_partition"].as_u64())
        .max()
        .unwrap_or(0);
    let total_moves: u64 = moves_per_restart
        .iter()
        .filter_map(|m| m["moves"].as_u64())
        .sum();
    let case = |what: &str| format!("rolling deploy of 3 nodes at {RATE} cmd/s, {what}");
    report.rows.push(
        Row::new(
            "failover",
            case("failed commands"),
            failed as f64,
            "commands",
        )
        .target("0", failed == 0),
    );
    report.rows.push(
        Row::new(
            "failover",
            case("most moves of one partition per restart"),
            max_moves as f64,
            "moves",
        )
        .target("<= 2", max_moves <= 2),
    );
    report.rows.push(Row::new(
        "failover",
        case("partition moves per restart (mean)"),
        total_moves as f64 / NODES as f64,
        "moves",
    ));
    report
        .rows
        .push(Row::new("failover", case("steady p50"), steady.p50, "ms"));
    report
        .rows
        .push(Row::new("failover", case("steady p99"), steady.p99, "ms"));
    report
        .rows
        .push(Row::new("failover", case("rollout p50"), rollout.p50, "ms"));
    let bound = steady.p99 + ADDED_P99_TARGET_MS;
    report.rows.push(
        Row::new("failover", case("rollout p99"), rollout.p99, "ms").target(
            format!("<= steady p99 + {ADDED_P99_TARGET_MS:.0} ({bound:.1} ms)"),
            rollout.p99 <= bound,
        ),
    );
    report
        .rows
        .push(Row::new("failover", case("rollout max"), rollout.max, "ms"));
    // Per second of scheduled send time since the steady state began: p99 and max, ms.
    let mut per_second: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
    for (at, ms) in &seen.latencies {
        if *at >= steady_from {
            per_second
                .entry((at - steady_from) / 1_000_000_000)
                .or_default()
                .push(*ms);
        }
    }
    let per_second: Vec<serde_json::Value> = per_second
        .into_iter()
        .map(|(second, values)| {
            let s = Summary::of(&values);
            json!([second, s.p99.round(), s.max.round()])
        })
        .collect();
    // Each restart: the node, and its SIGTERM and end in seconds since the steady state began.
    let restarts_at: Vec<serde_json::Value> = restarts
        .iter()
        .map(|(id, from, to)| {
            let secs = |ms: &u64| ms.saturating_sub(steady_unix_ms) as f64 / 1000.0;
            json!([id, secs(from), secs(to)])
        })
        .collect();
    Ok(json!({
        "snapshots": snapshots,
        "restarts_s": restarts_at,
        "per_second_p99_max_ms": per_second,
        "commands": acked_seqs.len(),
        "lost": lost,
        "doubled": doubled,
        "refused": refused,
        "steady_ms": steady,
        "rollout_ms": rollout,
        "restarts": moves_per_restart,
    }))
}

/// Records every event of the journal: its command sequence and its latency.
async fn watch_events(
    client: async_nats::Client,
    seen: Shared<Seen>,
) -> anyhow::Result<JoinHandle<()>> {
    let mut events = load::subscribe_events(&client, ENTITY_TYPE).await?;
    Ok(tokio::spawn(async move {
        while let Some(message) = events.next().await {
            let received = now_ns();
            let seq = message
                .headers
                .as_ref()
                .and_then(|h| h.get(jetshard::wire::HDR_COMMAND_SEQ))
                .and_then(|v| v.as_str().parse::<u64>().ok());
            let Ok(BenchEvt::Stamped { at_ns }) = Codec::default().decode(&message.payload) else {
                continue;
            };
            let mut seen = lock(&seen);
            if let Some(seq) = seq {
                *seen.events.entry(seq).or_default() += 1;
            }
            let latency = received.saturating_sub(at_ns) as f64 / 1e6;
            seen.latencies.push((at_ns, latency));
        }
    }))
}
