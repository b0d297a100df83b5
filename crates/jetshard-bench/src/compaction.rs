//! Scenario `compaction`: a journal bounded by live state.
//!
//! (a) A long run compressed in time: `--compaction-commands` commands at
//! `--compaction-rate` cmd/s over `--entities` entities, each command writing an event and an
//! outbox message, every tenth arming a timer that fires 50 ms later (its command writes the
//! `fired` record); snapshots every `--compaction-snapshot-every` events. The journal's
//! messages and bytes are sampled every 2 s, and each command's latency (scheduled send ->
//! event stored, seen by a core subscription on `<t>.evt.>`, as in the latency scenario) is
//! recorded. Run twice on fresh servers: background compaction off (the baseline), then on.
//!
//! (b) The acquisition's timer read: 1,000 entities, one timer armed each, after (i) nothing
//! else, (ii) 100,000 timers set and cancelled before (compaction off), (iii) the same,
//! compacted; the three journals side by side, read in alternated rounds. Figures: the timer
//! records left and the time to read them with a new owner's filter (`<t>.tmr.<p>.*`, one
//! ordered consumer per partition, the 8 in turn) and with one consumer over `<t>.tmr.>`.
//!
//! (c) With `--compaction-purge-cost true`, what one purge costs the server ([`crate::purge`];
//! with `--compaction-replicas 3`, on a 3-server cluster and beside a writer:
//! [`crate::purge_r3`]).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use jetshard::{Codec, Effects, Entity, JournalReader, ShardConfig, ShardSystem, Snapshots};
use jetshard_testkit::{NatsCluster, NatsServer};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::Options;
use crate::entity::{BenchEvt, BenchState, entity_id};
use crate::latency::{Stamps, offer};
use crate::load::AckWindow;
use crate::report::{Report, Row, Worse};
use crate::stats::Summary;

const ENTITY_TYPE: &str = "cmp";
/// Its journal stream (`Names::journal_stream`).
const JOURNAL: &str = "CMP_JOURNAL";

/// How often the journal is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// The entity of this scenario: the bench entity with an outbox message per command and
/// timers.
pub struct CompactionEntity;

/// Its commands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum CompactionCmd {
    /// One event carrying `at_ns`, one outbox message; with `timer`, arms `t` 50 ms ahead.
    Work { at_ns: u64, timer: bool },
    /// A timer's command: no event.
    Fire,
    /// Cancels the timers `c0..c<cancel>` and sets `c0..c<set>` an hour ahead.
    Churn { cancel: u32, set: u32 },
    /// Cancels `c0..c<cancel>` and arms `keep` an hour ahead.
    Keep { cancel: u32 },
}

impl Entity for CompactionEntity {
    type Command = CompactionCmd;
    type Event = BenchEvt;
    type State = BenchState;
    type Rejection = String;

    fn decide(state: &BenchState, command: CompactionCmd) -> Result<Vec<BenchEvt>, String> {
        Self::decide_with_effects(state, command, &mut Effects::new(Codec::Json))
    }

    fn decide_with_effects(
        _: &BenchState,
        command: CompactionCmd,
        effects: &mut Effects,
    ) -> Result<Vec<BenchEvt>, String> {
        let hour = Duration::from_secs(3600);
        Ok(match command {
            CompactionCmd::Work { at_ns, timer } => {
                effects.publish(&format!("{ENTITY_TYPE}-sink"), at_ns.to_string());
                if timer {
                    effects.set_timer_after("t", Duration::from_millis(50), &CompactionCmd::Fire);
                }
                vec![BenchEvt::Stamped { at_ns }]
            }
            CompactionCmd::Fire => Vec::new(),
            CompactionCmd::Churn { cancel, set } => {
                for i in 0..cancel {
                    effects.cancel_timer(&format!("c{i}"));
                }
                for i in 0..set {
                    effects.set_timer_after(&format!("c{i}"), hour, &CompactionCmd::Fire);
                }
                Vec::new()
            }
            CompactionCmd::Keep { cancel } => {
                for i in 0..cancel {
                    effects.cancel_timer(&format!("c{i}"));
                }
                effects.set_timer_after("keep", hour, &CompactionCmd::Fire);
                Vec::new()
            }
        })
    }

    fn apply(state: &mut BenchState, event: &BenchEvt) {
        crate::entity::BenchEntity::apply(state, event);
    }

    fn snapshots() -> Option<Snapshots<BenchState>> {
        Some(Snapshots::serde(1))
    }
}

/// One sample of the journal.
#[derive(Debug, Clone, Copy, Serialize)]
struct Sample {
    secs: f64,
    messages: u64,
    bytes: u64,
}

/// What one side of (a) measured.
#[derive(Debug, Serialize)]
struct LongRun {
    compaction: bool,
    commands: usize,
    received: usize,
    offered_rate: f64,
    latency: Summary,
    samples: Vec<Sample>,
}

/// The scenario.
pub async fn run(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let mut details = serde_json::Map::new();
    if options.compaction_rounds > 0 {
        long_runs(options, report, &mut details).await?;
    }
    let reads = if options.compaction_timer_reads {
        timer_reads(report).await?
    } else {
        Vec::new()
    };
    details.insert("timer_reads".to_owned(), json!(reads));
    if options.compaction_purge_cost && options.compaction_replicas == 3 {
        let costs = crate::purge_r3::run(report).await?;
        details.insert("purge_cost".to_owned(), json!(costs));
    } else if options.compaction_purge_cost {
        let costs = crate::purge::run(report).await?;
        details.insert("purge_cost".to_owned(), json!(costs));
    }
    report
        .details
        .insert("compaction".to_owned(), serde_json::Value::Object(details));
    Ok(())
}

/// (b)'s cases: what is set before the 1k armed timers, and whether it is compacted.
const TIMER_CASES: [(&str, bool, bool); 3] = [
    ("1k timers set, 1k armed", false, false),
    ("101k timers set, 1k armed, not compacted", true, false),
    ("101k timers set, 1k armed, compacted", true, true),
];

/// (a), `--compaction-rounds` rounds of compaction off then on, each on a fresh server.
async fn long_runs(
    options: &Options,
    report: &mut Report,
    details: &mut serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        options.compaction_interval_secs > 0,
        "--compaction-interval-secs must be at least 1"
    );
    anyhow::ensure!(
        matches!(options.compaction_replicas, 1 | 3),
        "--compaction-replicas is 1 or 3, not {}",
        options.compaction_replicas
    );
    let mut runs = Vec::new();
    for round in 0..options.compaction_rounds {
        let sides: &[bool] = if options.compaction_baseline {
            &[false, true]
        } else {
            &[true]
        };
        for &compaction in sides {
            eprintln!(
                "compaction round {}/{}: long run, compaction {}, {} commands at {} cmd/s over {} entities, R{}",
                round + 1,
                options.compaction_rounds,
                if compaction { "on" } else { "off" },
                options.compaction_commands,
                options.compaction_rate,
                options.entities,
                options.compaction_replicas
            );
            runs.push(long_run(options, compaction).await?);
        }
    }
    let bound = options.entities as u64 * (u64::from(options.compaction_snapshot_every) + 2);
    let case = |what: &str| {
        format!(
            "{what}, {} commands at {} cmd/s over {} entities, snapshot every {}, sweep every {} s, R{}",
            options.compaction_commands,
            options.compaction_rate,
            options.entities,
            options.compaction_snapshot_every,
            options.compaction_interval_secs,
            options.compaction_replicas
        )
    };
    let side = |on: bool| runs.iter().filter(move |r| r.compaction == on);
    let last = |r: &LongRun| r.samples.last().map_or(0, |s| s.messages) as f64;
    // After warm-up: the second half of the run.
    let max_after_warm_up = |r: &LongRun| {
        let half = r.samples.len() / 2;
        r.samples[half..]
            .iter()
            .map(|s| s.messages)
            .max()
            .unwrap_or(0) as f64
    };
    let over_rounds = |what: &str, on: bool, f: &dyn Fn(&LongRun) -> f64| {
        let rounds: Vec<f64> = side(on).map(f).collect();
        Row::over_rounds("compaction", case(what), &rounds, "", Worse::Higher)
    };
    let at_end = over_rounds("journal messages at the end, compaction on", true, &last);
    let met = at_end.worst <= bound as f64;
    let at_end = Row {
        unit: "msgs",
        ..at_end
    };
    let at_end = match options.compaction_baseline {
        true => at_end.against(over_rounds("", false, &last).value),
        false => at_end,
    };
    report.rows.push(at_end.target(
        format!("<= entities x (snapshot every + 2) = {bound} + in flight"),
        met,
    ));
    let warm = over_rounds(
        "journal messages, max over the second half, compaction on",
        true,
        &max_after_warm_up,
    );
    report.rows.push(Row {
        unit: "msgs",
        ..warm
    });
    let p99 = over_rounds("command p99, compaction on", true, &|r| r.latency.p99);
    if !options.compaction_baseline {
        report.rows.push(Row { unit: "ms", ..p99 });
        details.insert("long_runs".to_owned(), serde_json::to_value(&runs)?);
        return Ok(());
    }
    let p99_off = over_rounds("", false, &|r| r.latency.p99).value;
    let met = p99.value <= p99_off * 1.1;
    report.rows.push(
        Row { unit: "ms", ..p99 }
            .against(p99_off)
            .target("<= +10% over compaction off (medians of the rounds)", met),
    );
    details.insert("long_runs".to_owned(), serde_json::to_value(&runs)?);
    Ok(())
}

/// The long runs' configuration; `compaction`: background compaction every `interval`, or off.
fn config(
    partitions: u32,
    snapshot_every: u32,
    compaction: Option<Duration>,
    replicas: usize,
) -> anyhow::Result<ShardConfig> {
    let builder = ShardConfig::builder(ENTITY_TYPE)
        .partitions(partitions)
        .replicas(replicas)
        .node_id("bench")
        .codec(Codec::Json)
        .snapshot_every(snapshot_every);
    let builder = match compaction {
        Some(interval) => builder.compaction_interval(interval),
        None => builder.compaction(false),
    };
    Ok(builder.build()?)
}

async fn journal_state(js: &async_nats::jetstream::Context) -> anyhow::Result<(u64, u64)> {
    let mut journal = js.get_stream(JOURNAL).await.context("open the journal")?;
    let info = journal.info().await.context("journal info")?;
    Ok((info.state.messages, info.state.bytes))
}

/// Where a long run writes: one server, or a 3-server cluster (`--compaction-replicas 3`).
enum Servers {
    One(Box<NatsServer>),
    Three(NatsCluster),
}

impl Servers {
    async fn start(replicas: usize) -> anyhow::Result<Self> {
        Ok(match replicas {
            1 => Self::One(Box::new(
                NatsServer::start().await.context("start nats-server")?,
            )),
            _ => Self::Three(
                NatsCluster::start(3)
                    .await
                    .context("start a 3-server cluster")?,
            ),
        })
    }

    async fn connect(&self) -> anyhow::Result<async_nats::Client> {
        Ok(match self {
            Self::One(server) => server.connect().await?,
            Self::Three(cluster) => cluster.connect().await?,
        })
    }
}

async fn long_run(options: &Options, compaction: bool) -> anyhow::Result<LongRun> {
    let server = Servers::start(options.compaction_replicas).await?;
    let control = server.connect().await?;
    let js = async_nats::jetstream::new(control.clone());
    let config = config(
        options.partitions,
        options.compaction_snapshot_every,
        compaction.then(|| Duration::from_secs(options.compaction_interval_secs)),
        options.compaction_replicas,
    )?;
    let journal_name = config.names().journal_stream().to_owned();
    let system = ShardSystem::start::<CompactionEntity>(server.connect().await?, config)
        .await
        .context("start the shard system")?;

    let stamps = Stamps::listen(&server.connect().await?, ENTITY_TYPE, Codec::Json).await?;
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let recorded = stamps.recorded();
        let samples = samples.clone();
        let js = js.clone();
        let journal_name = journal_name.clone();
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
                if let Ok(mut journal) = js.get_stream(&journal_name).await
                    && let Ok(info) = journal.info().await
                {
                    let sample = Sample {
                        secs: started.elapsed().as_secs_f64(),
                        messages: info.state.messages,
                        bytes: info.state.bytes,
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
    let total = options.compaction_commands;
    let started = tokio::time::Instant::now();
    let mut window = AckWindow::default();
    let offered = offer(options.compaction_rate, total, async |i, at_ns| {
        let entity = i % ids.len();
        // Every tenth command of an entity arms a timer.
        let timer = (i / ids.len()).is_multiple_of(10);
        let command = CompactionCmd::Work { at_ns, timer };
        let payload = Codec::Json.encode(&command).context("encode a command")?;
        let ack = js
            .publish(format!("{ENTITY_TYPE}.cmd.{}", ids[entity]), payload.into())
            .await
            .context("publish a command")?;
        window.push(ack).await
    })
    .await?;
    window.drain().await?;
    stamps.wait_for(total, Duration::from_secs(120)).await;
    // Two more sweeps after the load: the last samples show where the journal settles.
    tokio::time::sleep(SAMPLE_EVERY * 3).await;
    sampler.abort();
    let received = stamps.count();
    let recorded = stamps.stop();
    let (messages, bytes) = journal_state(&js).await?;
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
    let latencies: Vec<f64> = recorded.iter().map(|(_, ns)| *ns as f64 / 1e6).collect();
    let run = LongRun {
        compaction,
        commands: total,
        received,
        offered_rate: total as f64 / offered.secs,
        latency: Summary::of(&latencies),
        samples,
    };
    eprintln!(
        "compaction {}: p50 {:.1} ms, p99 {:.1} ms, {} of {} events, journal at the end {messages} msgs {bytes} bytes",
        if compaction { "on" } else { "off" },
        run.latency.p50,
        run.latency.p99,
        run.received,
        run.commands
    );
    Ok(run)
}

/// Timers of (b): entities, and timers each sets and cancels before its one armed timer.
const TIMER_ENTITIES: usize = 1_000;
const CHURN_PER_COMMAND: u32 = 50;
const CHURN_COMMANDS: u32 = 2;
/// Partitions of (b)'s journal.
const TIMER_PARTITIONS: u32 = 8;

/// (b)'s journal on a fresh server: the server (stopped when dropped) and the journal.
async fn timer_journal(
    churned: bool,
    compacted: bool,
) -> anyhow::Result<(NatsServer, async_nats::jetstream::stream::Stream<()>)> {
    let server = NatsServer::start().await.context("start nats-server")?;
    let control = server.connect().await?;
    let js = async_nats::jetstream::new(control.clone());
    let system = ShardSystem::start::<CompactionEntity>(
        server.connect().await?,
        config(TIMER_PARTITIONS, 100, None, 1)?,
    )
    .await
    .context("start the shard system")?;
    let ids: Vec<String> = (0..TIMER_ENTITIES).map(|i| format!("t{i}")).collect();
    let mut window = AckWindow::default();
    let mut send = async |id: &str, command: &CompactionCmd| -> anyhow::Result<()> {
        let payload = Codec::Json.encode(command).context("encode a command")?;
        let ack = js
            .publish(format!("{ENTITY_TYPE}.cmd.{id}"), payload.into())
            .await
            .context("publish a command")?;
        window.push(ack).await
    };
    let mut cancel = 0;
    if churned {
        // 100 timers set (and cancelled) per entity: 100,000 in all.
        for round in 0..CHURN_COMMANDS {
            for id in &ids {
                let churn = CompactionCmd::Churn {
                    cancel: if round == 0 { 0 } else { CHURN_PER_COMMAND },
                    set: CHURN_PER_COMMAND,
                };
                send(id, &churn).await?;
            }
        }
        cancel = CHURN_PER_COMMAND;
    }
    for id in &ids {
        send(id, &CompactionCmd::Keep { cancel }).await?;
    }
    window.drain().await?;
    crate::load::wait_drained(&control, ENTITY_TYPE, Duration::from_secs(300)).await?;
    system.shutdown().await.context("shut the system down")?;
    if compacted {
        let admin = jetshard::admin::Admin::new(control.clone(), ENTITY_TYPE);
        admin.compact(None).await.context("compact")?;
    }
    let journal = js
        .get_stream_no_info(JOURNAL)
        .await
        .context("open the journal")?;
    Ok((server, journal))
}

/// Rounds of (b)'s reads, alternated over the cases.
const TIMER_READ_ROUNDS: usize = 3;

/// (b): the cases' journals set up side by side (each on its own server), then read in
/// [`TIMER_READ_ROUNDS`] rounds alternated over the cases, two ways each: partition by
/// partition (`<t>.tmr.<p>.*`, one ordered consumer each, in turn: the filter of a new owner's
/// timer scan, `armed_in_partition`, summed over the 8 partitions) and with one consumer over
/// the whole type (`<t>.tmr.>`, the read stop 29 measured). Rows: the medians.
async fn timer_reads(report: &mut Report) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut cases = Vec::new();
    for &(case, churned, compacted) in &TIMER_CASES {
        eprintln!("compaction: timer read, {case}: setting up");
        let (server, journal) = timer_journal(churned, compacted).await?;
        // What the server's blocks hold on disk (interior deletes keep their bytes until the
        // server compacts the block).
        let disk: u64 = walk(server.store_dir())
            .iter()
            .filter(|path| path.extension().is_some_and(|e| e == "blk"))
            .map(|path| std::fs::metadata(path).map_or(0, |m| m.len()))
            .sum();
        cases.push((case, server, journal, disk));
    }
    let mut times = vec![[Vec::new(), Vec::new()]; cases.len()];
    let mut records = vec![[0; 2]; cases.len()];
    for round in 0..TIMER_READ_ROUNDS {
        for (c, (case, _, journal, _)) in cases.iter().enumerate() {
            let reader = JournalReader::new(journal.clone(), ENTITY_TYPE);
            let started = tokio::time::Instant::now();
            let mut found = 0;
            for partition in 0..TIMER_PARTITIONS {
                found += reader
                    .subject(&format!("{ENTITY_TYPE}.tmr.{partition}.*"))
                    .await
                    .context("read a partition's timer records")?
                    .len();
            }
            let by_partition = started.elapsed().as_secs_f64() * 1e3;
            records[c][0] = found;
            let started = tokio::time::Instant::now();
            records[c][1] = reader
                .subject(&format!("{ENTITY_TYPE}.tmr.>"))
                .await
                .context("read the timer records")?
                .len();
            let whole = started.elapsed().as_secs_f64() * 1e3;
            eprintln!(
                "compaction: timer read {round}, {case}: {found} records by partition \
                 {by_partition:.1} ms, {} over the type {whole:.1} ms",
                records[c][1]
            );
            times[c][0].push(by_partition);
            times[c][1].push(whole);
        }
    }
    let mut reads = Vec::new();
    for (c, (case, _, _, disk)) in cases.iter().enumerate() {
        let [by_partition, whole] = [0, 1].map(|w| {
            let mut t = times[c][w].clone();
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        });
        let [found, _] = records[c];
        eprintln!(
            "compaction: timer read, {case}: {found} records, {disk} bytes of blocks on disk; \
             medians: by partition {by_partition:.1} ms, over the type {whole:.1} ms"
        );
        report.rows.push(Row::new(
            "compaction",
            format!("the acquisition's timer read, 8 partitions in turn, {case}: {found} records"),
            by_partition,
            "ms",
        ));
        report.rows.push(Row::new(
            "compaction",
            format!("the timer read over the whole type (`<t>.tmr.>`), {case}"),
            whole,
            "ms",
        ));
        reads.push(json!({
            "case": case, "records": found, "block_bytes_on_disk": disk,
            "by_partition_ms": times[c][0], "whole_type_ms": times[c][1],
        }));
    }
    Ok(reads)
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path);
            }
        }
    }
    out
}
