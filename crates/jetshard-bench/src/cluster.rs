//! Scenario `cluster`: throughput on a clustered JetStream, 3 servers and R3 streams, the
//! engine users move to when they outgrow one server.
//!
//! A clustered stream refuses a fenced write while another write naming the same fence subject
//! is in flight (10164), so the naive loop that never collides writes one event at a time per
//! partition: the **serialized** bare loop ([`BareLoop::start_with`] with one write in flight),
//! the baseline. Beside it the **pipelined** bare loop, as fast as it is on one server (1024
//! writes in flight per partition), whose refused writes are sent again: its 10164 count is the
//! figure. jetshard group-commits (one atomic batch of every ready write per partition in
//! flight). The protocol is the throughput scenario's ([`crate::drain::timed_passes_with`]): pause
//! jetshard's consumers (hold the bare loops), pre-load, resume (release), time the drain; cold
//! pass, then warm pass; each side on a fresh cluster.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use jetshard::{PartitionStatus, ShardConfig, ShardSystem};
use jetshard_testkit::NatsCluster;
use serde::Serialize;
use serde_json::json;

use crate::Options;
use crate::bare::{BareLoop, BareSettings, IN_FLIGHT, MAX_ACK_PENDING};
use crate::drain::{DrainRun, DrainSpec, Figure, PassRows, timed_passes, timed_passes_with};
use crate::entity::BenchEntity;
use crate::load;
use crate::report::{Report, Row, Worse};
use crate::stats::Summary;

/// The entity type of the runs.
const ENTITY_TYPE: &str = "bench";

/// Stream replicas.
const REPLICAS: usize = 3;

/// How often the journal's commits are sampled while jetshard drains.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// What jetshard's partitions reported after a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WriteFigures {
    /// Group commits.
    pub commits: u64,
    /// Records they wrote.
    pub records: u64,
    /// Commits refused with 10164 (and sent again).
    pub conflicts: u64,
    /// Writes not confirmed (retried).
    pub unconfirmed: u64,
    /// Records per commit, the mean of each sampling window with commits in it.
    pub window_means: Vec<f64>,
}

/// One side's run on a cluster.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterRun {
    /// The timed passes.
    pub drain: DrainRun,
    /// Event writes the bare loop had refused with 10164 or 10158 (bare loops only).
    pub refused: Option<u64>,
    /// jetshard's write figures (jetshard only).
    pub writes: Option<WriteFigures>,
}

impl AsRef<DrainRun> for ClusterRun {
    fn as_ref(&self) -> &DrainRun {
        &self.drain
    }
}

async fn start_cluster() -> anyhow::Result<(NatsCluster, async_nats::Client, Vec<u32>)> {
    let cluster = crate::server::nats_cluster(3).await?;
    let control = cluster.connect().await?;
    let pids = crate::server::cluster_pids(&cluster);
    Ok((cluster, control, pids))
}

/// Drains through the bare loop with `in_flight` writes in flight per partition.
pub async fn drain_bare(spec: DrainSpec, in_flight: usize) -> anyhow::Result<ClusterRun> {
    let (cluster, control, pids) = start_cluster().await?;
    let config = ShardConfig::builder(ENTITY_TYPE)
        .partitions(spec.partitions)
        .replicas(REPLICAS)
        .node_id("provision")
        .max_ack_pending(MAX_ACK_PENDING)
        .build()?;
    load::provision(cluster.connect().await?, config).await?;
    load::seed_entities(control.clone(), ENTITY_TYPE, spec.partitions, spec.entities).await?;
    // Held, not paused, while the commands are pre-loaded, as the throughput scenario's loop:
    // a pull left open across a consumer's pause is not served when the consumer is resumed
    // by API (`tests/tests/nats_facts.rs`), so behind the gate each partition's loop would
    // start only when its pull expired.
    let settings = BareSettings {
        in_flight,
        held: true,
        ..BareSettings::default()
    };
    let bare = BareLoop::start_with_settings(
        cluster.connect().await?,
        ENTITY_TYPE,
        spec.partitions,
        settings,
    )
    .await?;
    let passes = timed_passes_with(&pids, &control, spec, None, Some(&bare), || bare.check()).await;
    let refused = bare.refused();
    bare.stop().await?;
    Ok(ClusterRun {
        drain: DrainRun {
            passes: passes?,
            acquisitions: None,
        },
        refused: Some(refused),
        writes: None,
    })
}

/// Drains through a jetshard system in this process.
pub async fn drain_jetshard(spec: DrainSpec) -> anyhow::Result<ClusterRun> {
    let (cluster, control, pids) = start_cluster().await?;
    let config = ShardConfig::builder(ENTITY_TYPE)
        .partitions(spec.partitions)
        .replicas(REPLICAS)
        .node_id("bench")
        .build()?;
    let client = cluster.connect().await?;
    crate::messages::watch(&client);
    let system = Arc::new(
        ShardSystem::start::<BenchEntity>(client, config)
            .await
            .context("start the shard system")?,
    );
    load::seed_entities(control.clone(), ENTITY_TYPE, spec.partitions, spec.entities).await?;
    // Samples the commits while the passes run.
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (system, done) = (system.clone(), done.clone());
        tokio::spawn(async move {
            let mut means = Vec::new();
            let mut last = (0, 0);
            while !done.load(Ordering::Relaxed) {
                tokio::time::sleep(SAMPLE_EVERY).await;
                let Ok(status) = system.status().await else {
                    continue;
                };
                let now = commits_of(&status);
                let (commits, records) = (now.0 - last.0, now.1 - last.1);
                if commits > 0 {
                    means.push(records as f64 / commits as f64);
                }
                last = now;
            }
            means
        })
    };
    let passes = timed_passes(&pids, &control, spec, || Ok(())).await;
    crate::messages::unwatch();
    done.store(true, Ordering::Relaxed);
    let window_means = sampler.await.unwrap_or_default();
    let status = system.status().await.unwrap_or_default();
    crate::throughput::report_loads("jetshard passes", &status);
    let (commits, records) = commits_of(&status);
    let writes = WriteFigures {
        commits,
        records,
        conflicts: status.iter().map(|p| p.write_conflicts).sum(),
        unconfirmed: status.iter().map(|p| p.unconfirmed_writes).sum(),
        window_means,
    };
    let acquisitions = Some(status.iter().map(|p| p.acquisitions).sum());
    match Arc::try_unwrap(system) {
        Ok(system) => system.shutdown().await.context("shut the system down")?,
        Err(_) => anyhow::bail!("the commit sampler still holds the system"),
    }
    drop(cluster);
    Ok(ClusterRun {
        drain: DrainRun {
            passes: passes?,
            acquisitions,
        },
        refused: None,
        writes: Some(writes),
    })
}

/// Group commits and their records, over every partition.
fn commits_of(status: &[PartitionStatus]) -> (u64, u64) {
    status.iter().fold((0, 0), |(c, r), p| {
        (c + p.journal_commits, r + p.journal_records)
    })
}

/// The scenario.
pub async fn run(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let spec = DrainSpec {
        stages: options.pass_stages,
        ..DrainSpec::new(
            options,
            options.partitions,
            options.cluster_commands,
            Duration::from_secs(120),
        )
    };
    let (mut serialized, mut pipelined, mut jetshard) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..options.cluster_rounds {
        let of = options.cluster_rounds;
        eprintln!("cluster round {}/{of}: bare loop, serialized", round + 1);
        serialized.push(drain_bare(spec, 1).await.context("serialized bare loop")?);
        eprintln!("cluster round {}/{of}: bare loop, pipelined", round + 1);
        pipelined.push(
            drain_bare(spec, IN_FLIGHT)
                .await
                .context("pipelined bare loop")?,
        );
        eprintln!("cluster round {}/{of}: jetshard", round + 1);
        jetshard.push(drain_jetshard(spec).await.context("jetshard")?);
    }
    let shape = format!(
        "R3, 3 servers, {} partitions, {} entities, {} cmds",
        spec.partitions, spec.entities, spec.commands
    );
    let commands = spec.commands;
    for (pass, name) in [(0, "cold"), (1, "warm")] {
        let base = PassRows::new("cluster", &serialized, pass, commands).row(
            format!(
                "bare loop, serialized (1 write in flight per partition), {name} pass, {shape}"
            ),
            Figure::Rate,
        );
        let baseline = base.value;
        report.rows.push(base);
        let piped = PassRows::new("cluster", &pipelined, pass, commands).row(
            format!(
                "bare loop, pipelined ({IN_FLIGHT} writes in flight per partition), {name} pass"
            ),
            Figure::Rate,
        );
        report.rows.push(piped.against(baseline));
        // Warm and cold alike (a cold pass waits for each entity's first load).
        let ours = PassRows::new("cluster", &jetshard, pass, commands)
            .row(
                format!("jetshard (group commit), {name} pass"),
                Figure::Rate,
            )
            .held_to(baseline, ">= 5 x serialized bare", |r| r >= 5.0);
        report.rows.push(ours);
    }
    let commands_per_run = (spec.commands * spec.passes) as f64;
    let refused: Vec<f64> = pipelined
        .iter()
        .filter_map(|r| r.refused)
        .map(|n| n as f64 / commands_per_run)
        .collect();
    report.rows.push(Row::over_rounds(
        "cluster",
        "bare loop, pipelined: writes refused with 10164 per command (sent again)",
        &refused,
        "per cmd",
        Worse::Higher,
    ));
    let writes: Vec<&WriteFigures> = jetshard.iter().filter_map(|r| r.writes.as_ref()).collect();
    let conflicts: Vec<f64> = writes.iter().map(|w| w.conflicts as f64).collect();
    let worst_conflicts = conflicts.iter().copied().fold(0.0, f64::max);
    report.rows.push(
        Row::over_rounds(
            "cluster",
            "jetshard: group commits refused with 10164 (sent again), per run",
            &conflicts,
            "commits",
            Worse::Higher,
        )
        .target("0", worst_conflicts == 0.0),
    );
    report.rows.push(Row::over_rounds(
        "cluster",
        "jetshard: journal writes not confirmed (retried), per run",
        &writes
            .iter()
            .map(|w| w.unconfirmed as f64)
            .collect::<Vec<_>>(),
        "writes",
        Worse::Higher,
    ));
    let means: Vec<f64> = writes
        .iter()
        .map(|w| w.records as f64 / w.commits.max(1) as f64)
        .collect();
    report.rows.push(Row::over_rounds(
        "cluster",
        "jetshard: records per group commit, mean",
        &means,
        "records",
        Worse::Lower,
    ));
    let windows: Vec<f64> = writes.iter().flat_map(|w| w.window_means.clone()).collect();
    let summary = Summary::of(&windows);
    for (what, value) in [("p50", summary.p50), ("p99", summary.p99)] {
        report.rows.push(Row::new(
            "cluster",
            format!(
                "jetshard: records per group commit, {what} of the {} ms windows' means",
                SAMPLE_EVERY.as_millis()
            ),
            value,
            "records",
        ));
    }
    let serialized_cpu = crate::stats::median(
        &PassRows::new("cluster", &serialized, 1, commands).rounds(Figure::TotalCpu),
    );
    for (side, runs) in [
        ("bare loop, serialized", &serialized),
        ("bare loop, pipelined", &pipelined),
        ("jetshard", &jetshard),
    ] {
        let warm = PassRows::new("cluster", runs, 1, commands);
        report.rows.extend([
            warm.row(
                format!("{side}, warm pass: server CPU per command (3 servers)"),
                Figure::ServerCpu,
            ),
            warm.row(
                format!("{side}, warm pass: client CPU per command"),
                Figure::ClientCpu,
            ),
            // Where both loops keep the machine's cores busy, their rates stand in the inverse
            // ratio of these: the R3 target is then a target on CPU per command.
            warm.row(
                format!("{side}, warm pass: CPU per command, servers and client, against the serialized loop's"),
                Figure::TotalCpu,
            )
            .against(serialized_cpu),
            warm.row(
                format!("{side}, warm pass: cores busy (servers and client)"),
                Figure::CoresBusy,
            ),
        ]);
    }
    report.details.insert(
        "cluster".to_owned(),
        json!({ "spec": spec, "serialized": serialized, "pipelined": pipelined, "jetshard": jetshard }),
    );
    Ok(())
}
