//! What a purge costs on a 3-server cluster (R3), and how it delays the writes beside it: part
//! (c) of the compaction scenario with `--compaction-purge-cost true --compaction-replicas 3`.
//!
//! One cluster, a fresh R3 stream per case (file storage, server defaults) holding `records`
//! messages written round-robin over `entities` entities on subjects of the journal's shape:
//! round `r` of entity `i` is at sequence `1 + i + r * entities`, on `pc.tmr.0.e<i>` every
//! tenth round (a timer record) and `pc.evt.0.e<i>` otherwise, so that each entity's records
//! span the whole stream, as an entity's records between two snapshots span everything the
//! journal took meanwhile. Each entity's records below its round three quarters along go
//! (as a snapshot's purge takes the records it covers), in one of the [`Form`]s, for up to
//! [`ENTITIES`] of the even entities, one entity every [`PACE`]. The journal's state: fresh,
//! or compacted (the odd entities purged the same way first, unmeasured: the span of each
//! measured entity then holds interior deletes, as in a journal that compaction keeps flat).
//!
//! Figures: the servers' CPU (the three processes' `/proc` times over the purges, less what
//! the probe's writes cost them at the same rate before the purges) per entity, per request
//! and per record removed; each request's round trip; and a probe writer's latency (a fenced
//! write, `Nats-Expected-Last-Subject-Sequence` on its own subject, every [`PROBE_EVERY`], one
//! in flight) while the purges run against the same probe alone just before.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use jetshard_testkit::NatsCluster;
use serde::Serialize;

use crate::cpu::CpuMeter;
use crate::load::AckWindow;
use crate::report::Report;
use crate::stats::Summary;

/// Each record's payload, about an event's.
const PAYLOAD: usize = 120;
/// The entities measured per case, at most.
const ENTITIES: u64 = 250;
/// One entity's requests every this long (the library paces its purges too).
const PACE: Duration = Duration::from_millis(20);
/// The probe writer's period.
const PROBE_EVERY: Duration = Duration::from_millis(5);
/// How long the probe runs alone before the purges (its baseline).
const BASELINE: Duration = Duration::from_secs(3);
/// Attempts of a probe write refused with 10164 before the case fails.
const MAX_ATTEMPTS: u32 = 100;
/// The longest a request may take before the case fails.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How a case's entities are purged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Form {
    /// `pc.*.0.e<i>` below the entity's cut: every record kind, one request (compaction's
    /// request before the split; still its form for an entity with timer records the
    /// partition's request leaves).
    Entity,
    /// `pc.evt.0.e<i>` below the cut, and at the end one `pc.tmr.0.*` below the partition's
    /// cut (the timer records of every entity): compaction's requests since the split.
    Split,
    /// `pc.evt.0.e<i>` keeping its events from the cut on (`keep`), and the timer records as
    /// in `Split`.
    Keep,
    /// Each record below the cut deleted by its sequence (`STREAM.MSG.DELETE`, `no_erase`).
    Delete,
    /// One `pc.*.0.*` below the partition's cut: every entity's records in one request.
    Partition,
}

/// One case: the stream's shape, its state and the form.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Case {
    /// Messages in the stream.
    pub records: u64,
    /// Entities they are spread over, round-robin.
    pub entities: u64,
    /// Whether the odd entities were purged first (interior deletes in every span).
    pub compacted: bool,
    /// How the measured entities are purged.
    pub form: Form,
}

/// What a case's purges cost.
#[derive(Debug, Clone, Serialize)]
pub struct Cost {
    /// The case.
    pub case: Case,
    /// Entities whose records went.
    pub entities: u64,
    /// Requests sent.
    pub requests: u64,
    /// Messages they removed.
    pub purged: u64,
    /// Wall time of the purge phase.
    pub secs: f64,
    /// The three servers' CPU over the purge phase, seconds, less the probe's own share.
    pub server_secs: f64,
    /// The same before the probe's share is taken off.
    pub server_secs_gross: f64,
    /// Each request's round trip, ms.
    pub round_trip: Summary,
    /// The probe's write latency alone, ms.
    pub probe_alone: Summary,
    /// The probe's write latency while the purges ran, ms.
    pub probe_purging: Summary,
}

impl Cost {
    /// The servers' CPU per entity whose records went, microseconds.
    pub fn server_us_per_entity(&self) -> f64 {
        self.server_secs * 1e6 / self.entities.max(1) as f64
    }

    /// The servers' CPU per request, microseconds.
    pub fn server_us_per_request(&self) -> f64 {
        self.server_secs * 1e6 / self.requests.max(1) as f64
    }

    /// The servers' CPU per record removed, microseconds.
    pub fn server_us_per_record(&self) -> f64 {
        self.server_secs * 1e6 / self.purged.max(1) as f64
    }
}

/// The cases: each form, on a fresh and on a compacted journal, at the span of the R3
/// compaction run's entities (1,000 entities, ~30 records each between two snapshots).
pub fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for compacted in [false, true] {
        for form in [
            Form::Entity,
            Form::Split,
            Form::Keep,
            Form::Delete,
            Form::Partition,
        ] {
            cases.push(Case {
                records: 30_000,
                entities: 1_000,
                compacted,
                form,
            });
        }
    }
    cases
}

/// One request.
pub enum Request {
    /// Purge `filter` below `below` (or keeping its last `keep`).
    Purge {
        filter: String,
        below: u64,
        keep: u64,
    },
    /// Delete the message at this sequence (`no_erase`).
    Delete { seq: u64 },
}

impl Request {
    /// Purge `filter` below the sequence `below`.
    pub fn purge(filter: String, below: u64) -> Self {
        Self::Purge {
            filter,
            below,
            keep: 0,
        }
    }
}

/// The stream's layout (see the module's docs).
#[derive(Debug, Clone, Copy)]
struct Layout {
    entities: u64,
    rounds: u64,
    /// The first round that stays.
    cut: u64,
}

impl Layout {
    fn of(case: &Case) -> Self {
        let rounds = case.records / case.entities;
        Self {
            entities: case.entities,
            rounds,
            cut: rounds * 3 / 4,
        }
    }

    fn seq(&self, entity: u64, round: u64) -> u64 {
        1 + entity + round * self.entities
    }

    fn is_timer(round: u64) -> bool {
        round % 10 == 9
    }

    fn subject(&self, entity: u64, round: u64) -> String {
        let kind = if Self::is_timer(round) { "tmr" } else { "evt" };
        format!("pc.{kind}.0.e{entity}")
    }

    /// Below this sequence, every round before the cut.
    fn partition_cut(&self) -> u64 {
        self.seq(0, self.cut)
    }

    /// One entity's requests in `form` (the partition's own request aside).
    fn requests(&self, entity: u64, form: Form) -> Vec<Request> {
        let below = self.seq(entity, self.cut);
        match form {
            Form::Entity => vec![Request::purge(format!("pc.*.0.e{entity}"), below)],
            Form::Split => vec![Request::purge(format!("pc.evt.0.e{entity}"), below)],
            Form::Keep => vec![Request::Purge {
                filter: format!("pc.evt.0.e{entity}"),
                below: 0,
                keep: (self.cut..self.rounds)
                    .filter(|r| !Self::is_timer(*r))
                    .count() as u64,
            }],
            Form::Delete => (0..self.cut)
                .map(|round| Request::Delete {
                    seq: self.seq(entity, round),
                })
                .collect(),
            Form::Partition => Vec::new(),
        }
    }
}

/// The probe writer: a fenced write every [`PROBE_EVERY`], one in flight, its latencies in
/// ms, split at the moment `purging` turned true.
struct Probe {
    stop: Arc<AtomicBool>,
    purging: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<(Vec<f64>, Vec<f64>)>>,
}

impl Probe {
    fn start(js: jetstream::Context) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let purging = Arc::new(AtomicBool::new(false));
        let (stop_flag, purging_flag) = (stop.clone(), purging.clone());
        let task = tokio::spawn(async move {
            let (mut alone, mut during) = (Vec::new(), Vec::new());
            let mut last = 0;
            let mut tick = tokio::time::interval(PROBE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !stop_flag.load(Ordering::Relaxed) {
                tick.tick().await;
                let phase = purging_flag.load(Ordering::Relaxed);
                let sent = Instant::now();
                // A write refused with 10164 (the leader still counts the previous one in
                // flight on this subject: nats-facts.md) is sent again, as the library does;
                // its latency runs from the first attempt.
                let mut attempts = 0;
                let ack = loop {
                    let publish = PublishMessage::build()
                        .payload(Bytes::from_static(b"probe"))
                        .expected_last_subject_sequence(last);
                    let result = tokio::time::timeout(REQUEST_TIMEOUT, async {
                        js.send_publish("pc.probe", publish).await?.await
                    })
                    .await
                    .context("probe write timed out")?;
                    match result {
                        Ok(ack) => break ack,
                        Err(e) if e.to_string().contains("10164") && attempts < MAX_ATTEMPTS => {
                            attempts += 1;
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        Err(e) => return Err(e).context("probe write"),
                    }
                };
                last = ack.sequence;
                let ms = sent.elapsed().as_secs_f64() * 1e3;
                let samples = if phase { &mut during } else { &mut alone };
                samples.push(ms);
            }
            Ok((alone, during))
        });
        Self {
            stop,
            purging,
            task,
        }
    }

    async fn finish(self) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.context("probe task")?
    }
}

/// Sends one request; the messages it removed.
pub async fn send(js: &jetstream::Context, stream: &str, request: &Request) -> anyhow::Result<u64> {
    let answer: serde_json::Value = match request {
        Request::Purge {
            filter,
            below,
            keep,
        } => {
            let mut body = serde_json::json!({ "filter": filter });
            if *keep > 0 {
                body["keep"] = (*keep).into();
            } else {
                body["seq"] = (*below).into();
            }
            tokio::time::timeout(
                REQUEST_TIMEOUT,
                js.request(format!("STREAM.PURGE.{stream}"), &body),
            )
            .await
            .context("purge timed out")?
            .with_context(|| format!("purge {body}"))?
        }
        Request::Delete { seq } => tokio::time::timeout(
            REQUEST_TIMEOUT,
            js.request(
                format!("STREAM.MSG.DELETE.{stream}"),
                &serde_json::json!({ "seq": seq, "no_erase": true }),
            ),
        )
        .await
        .context("delete timed out")?
        .with_context(|| format!("delete {seq}"))?,
    };
    anyhow::ensure!(answer["success"] == true, "{answer}");
    Ok(match request {
        Request::Purge { .. } => answer["purged"].as_u64().unwrap_or(0),
        Request::Delete { .. } => 1,
    })
}

/// Runs one case on `cluster`, in a stream of its own (`name`), deleted after.
pub async fn measure(cluster: &NatsCluster, name: &str, case: Case) -> anyhow::Result<Cost> {
    let js = jetstream::new(cluster.connect().await?);
    let stream = js
        .create_stream(stream::Config {
            name: name.to_owned(),
            subjects: vec!["pc.>".to_owned()],
            num_replicas: 3,
            ..Default::default()
        })
        .await
        .context("create the stream")?;
    let layout = Layout::of(&case);
    let payload = Bytes::from(vec![b'x'; PAYLOAD]);
    let mut window = AckWindow::default();
    for round in 0..layout.rounds {
        for entity in 0..layout.entities {
            window
                .push(
                    js.publish(layout.subject(entity, round), payload.clone())
                        .await?,
                )
                .await?;
        }
    }
    window.drain().await?;
    if case.compacted {
        for entity in (1..layout.entities).step_by(2) {
            for request in layout.requests(entity, Form::Entity) {
                send(&js, name, &request).await?;
            }
        }
    }
    // The even entities, spread over the stream.
    let halves = layout.entities / 2;
    let count = halves.min(ENTITIES);
    let measured: Vec<u64> = (0..count).map(|n| 2 * (n * halves / count)).collect();
    let pids = crate::server::cluster_pids(cluster);
    anyhow::ensure!(pids.len() == 3, "the cluster's pids: {pids:?}");

    let probe = Probe::start(js.clone());
    let alone_meter = CpuMeter::start(&pids);
    let alone_started = Instant::now();
    tokio::time::sleep(BASELINE).await;
    let alone_rate = alone_meter.spent().server_secs / alone_started.elapsed().as_secs_f64();

    probe.purging.store(true, Ordering::Relaxed);
    let meter = CpuMeter::start(&pids);
    let started = Instant::now();
    let (mut requests, mut purged, mut round_trips) = (0, 0, Vec::new());
    let mut next = tokio::time::Instant::now();
    let mut all: Vec<Vec<Request>> = match case.form {
        Form::Partition => vec![vec![Request::purge(
            "pc.*.0.*".to_owned(),
            layout.partition_cut(),
        )]],
        form => measured.iter().map(|e| layout.requests(*e, form)).collect(),
    };
    if matches!(case.form, Form::Split | Form::Keep) {
        all.push(vec![Request::purge(
            "pc.tmr.0.*".to_owned(),
            layout.partition_cut(),
        )]);
    }
    for entity_requests in &all {
        tokio::time::sleep_until(next).await;
        next += PACE;
        for request in entity_requests {
            let sent = Instant::now();
            purged += send(&js, name, request).await?;
            round_trips.push(sent.elapsed().as_secs_f64() * 1e3);
            requests += 1;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let gross = meter.spent().server_secs;
    let (alone, during) = probe.finish().await?;
    stream_delete(&js, name).await?;
    drop(stream);
    let entities = match case.form {
        Form::Partition if case.compacted => halves,
        Form::Partition => layout.entities,
        _ => count,
    };
    Ok(Cost {
        case,
        entities,
        requests,
        purged,
        secs,
        server_secs: (gross - alone_rate * secs).max(0.0),
        server_secs_gross: gross,
        round_trip: Summary::of(&round_trips),
        probe_alone: Summary::of(&alone),
        probe_purging: Summary::of(&during),
    })
}

async fn stream_delete(js: &jetstream::Context, name: &str) -> anyhow::Result<()> {
    js.delete_stream(name)
        .await
        .with_context(|| format!("delete stream {name}"))?;
    Ok(())
}

/// Runs every case on one 3-server cluster; adds their rows to `report`.
pub async fn run(report: &mut Report) -> anyhow::Result<Vec<Cost>> {
    let cluster = crate::server::nats_cluster(3).await?;
    let mut costs = Vec::new();
    for (index, case) in cases().into_iter().enumerate() {
        eprintln!(
            "compaction: R3 purge cost, {} records over {} entities, {}, {:?}",
            case.records,
            case.entities,
            if case.compacted { "compacted" } else { "fresh" },
            case.form
        );
        let cost = measure(&cluster, &format!("PURGER3_{index}"), case).await?;
        eprintln!(
            "  {} requests for {} entities removed {} records in {:.2} s: servers {:.0} us per entity ({:.0} gross), {:.0} us per request, {:.1} us per record; round trip p50 {:.2} / p99 {:.2} ms; probe p50 {:.2} -> {:.2} ms, p99 {:.2} -> {:.2} ms",
            cost.requests,
            cost.entities,
            cost.purged,
            cost.secs,
            cost.server_us_per_entity(),
            cost.server_secs_gross * 1e6 / cost.entities.max(1) as f64,
            cost.server_us_per_request(),
            cost.server_us_per_record(),
            cost.round_trip.p50,
            cost.round_trip.p99,
            cost.probe_alone.p50,
            cost.probe_purging.p50,
            cost.probe_alone.p99,
            cost.probe_purging.p99,
        );
        let shape = format!(
            "R3, {} records over {} entities, {}, {:?}",
            case.records,
            case.entities,
            if case.compacted { "compacted" } else { "fresh" },
            case.form
        );
        crate::purge::push_rows(
            report,
            &shape,
            [
                ("servers' CPU per entity", cost.server_us_per_entity(), "us"),
                (
                    "servers' CPU per request",
                    cost.server_us_per_request(),
                    "us",
                ),
                ("request round trip p99", cost.round_trip.p99, "ms"),
                ("probe write p99 alone", cost.probe_alone.p99, "ms"),
                (
                    "probe write p99 while purging",
                    cost.probe_purging.p99,
                    "ms",
                ),
            ],
        );
        costs.push(cost);
    }
    Ok(costs)
}
