//! Part (a) of the scenario: one long run, compaction off or on, on a fresh server (or a
//! 3-server cluster), its journal sampled every [`SAMPLE_EVERY`] and each command's latency
//! recorded.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use jetshard::{Codec, ShardSystem};
use serde::Serialize;

use crate::Options;
use crate::cpu::cpu_time;
use crate::entity::entity_id;
use crate::latency::{Stamps, offer};
use crate::load::AckWindow;
use crate::server::Servers;
use crate::stats::Summary;

use super::entity::{CompactionEntity, ENTITY_TYPE, config, work};
use super::split::{Split, split};

/// How often the journal is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// One sample of the journal.
#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct Sample {
    pub(super) secs: f64,
    pub(super) messages: u64,
    pub(super) bytes: u64,
}

/// What one side of (a) measured.
#[derive(Debug, Serialize)]
pub(super) struct LongRun {
    pub(super) compaction: bool,
    pub(super) commands: usize,
    pub(super) received: usize,
    pub(super) offered_rate: f64,
    pub(super) latency: Summary,
    pub(super) samples: Vec<Sample>,
    /// CPU per command while the commands were offered and served (offer start to the last
    /// event seen): the servers' (summed over the cluster) and this process's (the library
    /// and the bench's load), in microseconds. What compaction costs the machine, beside what
    /// it costs the command latency.
    pub(super) server_cpu_us: f64,
    pub(super) client_cpu_us: f64,
    /// The commands split by whether a purge was in flight during them (compaction on).
    pub(super) split: Split,
}

/// The journal's messages and bytes now, over its streams.
async fn journal_state(
    js: &async_nats::jetstream::Context,
    journals: &[String],
) -> anyhow::Result<(u64, u64)> {
    let (mut messages, mut bytes) = (0, 0);
    for name in journals {
        let mut journal = js.get_stream(name).await.context("open the journal")?;
        let info = journal.info().await.context("journal info")?;
        messages += info.state.messages;
        bytes += info.state.bytes;
    }
    Ok((messages, bytes))
}

pub(super) async fn long_run(options: &Options, compaction: bool) -> anyhow::Result<LongRun> {
    // One server, or a 3-server cluster (`--compaction-replicas 3`).
    let server = Servers::start(options.compaction_replicas != 1).await?;
    let control = server.connect().await?;
    let js = async_nats::jetstream::new(control.clone());
    let config = config(
        options.partitions,
        options.compaction_snapshot_every,
        compaction.then(|| Duration::from_secs(options.compaction_interval_secs)),
        options.compaction_replicas,
        options.journal_streams,
    )?;
    let names = config.names();
    let journals = names.journal_streams().to_vec();
    let system = ShardSystem::start::<CompactionEntity>(server.connect().await?, config)
        .await
        .context("start the shard system")?;

    let stamps = Stamps::listen(&server.connect().await?, ENTITY_TYPE, Codec::Json).await?;
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let recorded = stamps.recorded();
        let samples = samples.clone();
        let js = js.clone();
        let journals = journals.clone();
        let label = if compaction { "on" } else { "off" };
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let mut seen = 0;
            loop {
                // The commands whose events came since the last sample: where the tail is.
                let window: Vec<f64> = {
                    let recorded = recorded.lock().unwrap_or_else(PoisonError::into_inner);
                    let from = seen.min(recorded.len());
                    seen = recorded.len();
                    recorded[from..]
                        .iter()
                        .map(|(_, ns)| *ns as f64 / 1e6)
                        .collect()
                };
                let window = Summary::of(&window);
                if let Ok((messages, bytes)) = journal_state(&js, &journals).await {
                    let sample = Sample {
                        secs: started.elapsed().as_secs_f64(),
                        messages,
                        bytes,
                    };
                    eprintln!(
                        "compaction {label}: {:>6.0} s  journal {:>9} msgs {:>12} bytes  commands {:>6} p50 {:>6.1} p99 {:>6.1} max {:>6.1} ms",
                        sample.secs,
                        sample.messages,
                        sample.bytes,
                        window.count,
                        window.p50,
                        window.p99,
                        window.max
                    );
                    samples
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(sample);
                }
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
        })
    };

    let ids: Vec<String> = (0..options.entities).map(entity_id).collect();
    // The purges traced before this run (an earlier run's) are not this run's.
    let _ = crate::probe::take_purge_marks();
    let total = options.compaction_commands;
    let started = tokio::time::Instant::now();
    let pids = server.pids();
    let cpu = || {
        let servers: Option<Duration> = pids.iter().map(|&pid| cpu_time(pid)).sum();
        (servers, cpu_time(std::process::id()))
    };
    let cpu_before = cpu();
    let mut window = AckWindow::default();
    let offered = offer(options.compaction_rate, total, async |i, at_ns| {
        let (subject, payload) = work(&names, &ids, i, at_ns)?;
        window.publish(&js, subject.into(), payload).await
    })
    .await?;
    window.drain().await?;
    stamps.wait_for(total, Duration::from_secs(120)).await;
    let cpu_after = cpu();
    let per_command = |before: Option<Duration>, after: Option<Duration>| match (before, after) {
        (Some(before), Some(after)) => {
            after.saturating_sub(before).as_secs_f64() * 1e6 / total.max(1) as f64
        }
        _ => f64::NAN,
    };
    let server_cpu_us = per_command(cpu_before.0, cpu_after.0);
    let client_cpu_us = per_command(cpu_before.1, cpu_after.1);
    // Two more sweeps after the load: the last samples show where the journal settles.
    tokio::time::sleep(SAMPLE_EVERY * 3).await;
    sampler.abort();
    let received = stamps.count();
    let recorded = stamps.stop();
    let (messages, bytes) = journal_state(&js, &journals).await?;
    system.shutdown().await.context("shut the system down")?;
    let mut samples = samples
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    samples.push(Sample {
        secs: started.elapsed().as_secs_f64(),
        messages,
        bytes,
    });
    let split = split(&crate::probe::take_purge_marks(), &recorded);
    let latencies: Vec<f64> = recorded.iter().map(|(_, ns)| *ns as f64 / 1e6).collect();
    let run = LongRun {
        compaction,
        commands: total,
        received,
        offered_rate: total as f64 / offered.secs,
        latency: Summary::of(&latencies),
        samples,
        server_cpu_us,
        client_cpu_us,
        split,
    };
    eprintln!(
        "compaction {}: p50 {:.1} ms, p99 {:.1} ms, CPU per command: servers {:.1} us, client {:.1} us, {} of {} events, journal at the end {messages} msgs {bytes} bytes",
        if compaction { "on" } else { "off" },
        run.latency.p50,
        run.latency.p99,
        run.server_cpu_us,
        run.client_cpu_us,
        run.received,
        run.commands
    );
    if compaction {
        let (d, o) = (&run.split.during, &run.split.outside);
        eprintln!(
            "compaction on, split in this run: {} purges, {:.0} ms in flight, a purge in flight {:.1}% of the time; commands during a purge {} p50 {:.1} p99 {:.1} max {:.1} ms; outside {} p50 {:.1} p99 {:.1} max {:.1} ms",
            run.split.purges,
            run.split.purge_ms,
            run.split.busy_share * 100.0,
            d.count,
            d.p50,
            d.p99,
            d.max,
            o.count,
            o.p50,
            o.p99,
            o.max
        );
        let (d, o) = (&run.split.sent_during, &run.split.sent_outside);
        eprintln!(
            "compaction on, split by the publish instant: sent during a purge {} p50 {:.1} p99 {:.1} max {:.1} ms; outside {} p50 {:.1} p99 {:.1} max {:.1} ms",
            d.count, d.p50, d.p99, d.max, o.count, o.p50, o.p99, o.max
        );
    }
    Ok(run)
}
