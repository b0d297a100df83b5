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
//! compacted. Figures: the timer records left on `<t>.tmr.>` and the time to read them as a new
//! owner's timer scan does (one ordered consumer over the filter).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use jetshard::{Codec, Effects, Entity, JournalReader, ShardConfig, ShardSystem, Snapshots};
use jetshard_testkit::{NatsServer, wait_until};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::Options;
use crate::entity::{BenchEvt, BenchState, entity_id};
use crate::load::AckWindow;
use crate::report::{Report, Row};
use crate::stats::{Summary, now_ns};

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
    let mut runs = Vec::new();
    for compaction in [false, true] {
        eprintln!(
            "compaction: long run, compaction {}, {} commands at {} cmd/s over {} entities",
            if compaction { "on" } else { "off" },
            options.compaction_commands,
            options.compaction_rate,
            options.entities
        );
        runs.push(long_run(options, compaction).await?);
    }
    let bound = options.entities as u64 * (u64::from(options.compaction_snapshot_every) + 2);
    let case = |what: &str| {
        format!(
            "{what}, {} commands over {} entities, snapshot every {}",
            options.compaction_commands, options.entities, options.compaction_snapshot_every
        )
    };
    let (off, on) = (&runs[0], &runs[1]);
    let last = |r: &LongRun| r.samples.last().map_or(0, |s| s.messages);
    // After warm-up: the second half of the run.
    let max_after_warm_up = |r: &LongRun| {
        let half = r.samples.len() / 2;
        r.samples[half..]
            .iter()
            .map(|s| s.messages)
            .max()
            .unwrap_or(0)
    };
    report.rows.push(
        Row::new(
            "compaction",
            case("journal messages at the end, compaction on"),
            last(on) as f64,
            "msgs",
        )
        .against(last(off) as f64)
        .target(
            format!("<= entities x (snapshot every + 2) = {bound} + in flight"),
            last(on) <= bound,
        ),
    );
    report.rows.push(Row::new(
        "compaction",
        case("journal messages, max over the second half, compaction on"),
        max_after_warm_up(on) as f64,
        "msgs",
    ));
    report.rows.push(
        Row::new(
            "compaction",
            case("command p99, compaction on"),
            on.latency.p99,
            "ms",
        )
        .against(off.latency.p99)
        .target(
            "<= +10% over compaction off",
            on.latency.p99 <= off.latency.p99 * 1.1,
        ),
    );
    details.insert("long_runs".to_owned(), serde_json::to_value(&runs)?);

    let mut reads = Vec::new();
    for (case, churned, compacted) in [
        ("1k timers set, 1k armed", false, false),
        ("101k timers set, 1k armed, not compacted", true, false),
        ("101k timers set, 1k armed, compacted", true, true),
    ] {
        eprintln!("compaction: timer read, {case}");
        let (records, ms) = timer_read(churned, compacted).await?;
        report.rows.push(Row::new(
            "compaction",
            format!("the acquisition's timer read, {case}: {records} records"),
            ms,
            "ms",
        ));
        reads.push(json!({"case": case, "records": records, "read_ms": ms}));
    }
    details.insert("timer_reads".to_owned(), json!(reads));
    report
        .details
        .insert("compaction".to_owned(), serde_json::Value::Object(details));
    Ok(())
}

fn config(partitions: u32, snapshot_every: u32, compaction: bool) -> anyhow::Result<ShardConfig> {
    let builder = ShardConfig::builder(ENTITY_TYPE)
        .partitions(partitions)
        .node_id("bench")
        .codec(Codec::Json)
        .snapshot_every(snapshot_every);
    let builder = match compaction {
        true => builder.compaction_interval(Duration::from_secs(2)),
        false => builder.compaction(false),
    };
    Ok(builder.build()?)
}

async fn journal_state(js: &async_nats::jetstream::Context) -> anyhow::Result<(u64, u64)> {
    let mut journal = js.get_stream(JOURNAL).await.context("open the journal")?;
    let info = journal.info().await.context("journal info")?;
    Ok((info.state.messages, info.state.bytes))
}

async fn long_run(options: &Options, compaction: bool) -> anyhow::Result<LongRun> {
    let server = NatsServer::start().await.context("start nats-server")?;
    let control = server.connect().await?;
    let js = async_nats::jetstream::new(control.clone());
    let config = config(
        options.partitions,
        options.compaction_snapshot_every,
        compaction,
    )?;
    let journal_name = config.names().journal_stream().to_owned();
    let system = ShardSystem::start::<CompactionEntity>(server.connect().await?, config)
        .await
        .context("start the shard system")?;

    let recorded = Arc::new(Mutex::new(Vec::new()));
    let listener = server.connect().await?;
    let mut events = listener
        .subscribe(format!("{ENTITY_TYPE}.evt.>"))
        .await
        .context("subscribe to the journal's events")?;
    let sink = recorded.clone();
    let collector = tokio::spawn(async move {
        while let Some(message) = events.next().await {
            let received = now_ns();
            if let Ok(BenchEvt::Stamped { at_ns }) = Codec::Json.decode(&message.payload) {
                sink.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(received.saturating_sub(at_ns));
            }
        }
    });
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let samples = samples.clone();
        let js = js.clone();
        let journal_name = journal_name.clone();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            loop {
                if let Ok(mut journal) = js.get_stream(&journal_name).await
                    && let Ok(info) = journal.info().await
                {
                    samples
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(Sample {
                            secs: started.elapsed().as_secs_f64(),
                            messages: info.state.messages,
                            bytes: info.state.bytes,
                        });
                }
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
        })
    };

    let ids: Vec<String> = (0..options.entities).map(entity_id).collect();
    let total = options.compaction_commands;
    let rate = options.compaction_rate.max(1.0);
    let started_ns = now_ns();
    let started = tokio::time::Instant::now();
    let interval_ns = 1e9 / rate;
    let mut window = AckWindow::default();
    for i in 0..total {
        let offset = Duration::from_nanos((i as f64 * interval_ns) as u64);
        let due = started + offset;
        if due > tokio::time::Instant::now() {
            tokio::time::sleep_until(due).await;
        }
        let at_ns = started_ns + offset.as_nanos() as u64;
        let entity = i % ids.len();
        // Every tenth command of an entity arms a timer.
        let timer = (i / ids.len()).is_multiple_of(10);
        let command = CompactionCmd::Work { at_ns, timer };
        let payload = Codec::Json.encode(&command).context("encode a command")?;
        let ack = js
            .publish(format!("{ENTITY_TYPE}.cmd.{}", ids[entity]), payload.into())
            .await
            .context("publish a command")?;
        window.push(ack).await?;
    }
    let offered_secs = started.elapsed().as_secs_f64();
    window.drain().await?;
    let count = || {
        recorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    };
    let _ = wait_until(
        Duration::from_secs(120),
        "every event to arrive",
        || async { count() >= total },
    )
    .await;
    // Two more sweeps after the load: the last samples show where the journal settles.
    tokio::time::sleep(SAMPLE_EVERY * 3).await;
    sampler.abort();
    collector.abort();
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
    let latencies: Vec<f64> = recorded
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|ns| *ns as f64 / 1e6)
        .collect();
    let run = LongRun {
        compaction,
        commands: total,
        received: count(),
        offered_rate: total as f64 / offered_secs,
        latency: Summary::of(&latencies),
        samples,
    };
    eprintln!(
        "compaction {}: p99 {:.1} ms, journal {:?}",
        if compaction { "on" } else { "off" },
        run.latency.p99,
        run.samples
            .iter()
            .map(|s| (s.secs.round() as u64, s.messages, s.bytes))
            .collect::<Vec<_>>()
    );
    Ok(run)
}

/// Timers of (b): entities, and timers each sets and cancels before its one armed timer.
const TIMER_ENTITIES: usize = 1_000;
const CHURN_PER_COMMAND: u32 = 50;
const CHURN_COMMANDS: u32 = 2;

/// Sets up (b)'s journal and reads its timer records as a new owner's timer scan does: the
/// records read and the time taken, ms.
async fn timer_read(churned: bool, compacted: bool) -> anyhow::Result<(usize, f64)> {
    let server = NatsServer::start().await.context("start nats-server")?;
    let control = server.connect().await?;
    let js = async_nats::jetstream::new(control.clone());
    let system =
        ShardSystem::start::<CompactionEntity>(server.connect().await?, config(8, 100, false)?)
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
    let reader = JournalReader::new(journal, ENTITY_TYPE);
    let started = tokio::time::Instant::now();
    let records = reader
        .subject(&format!("{ENTITY_TYPE}.tmr.>"))
        .await
        .context("read the timer records")?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    Ok((records.len(), ms))
}
