//! Scenario 3, rebuild: how fast an acquisition replays a partition's journal into state,
//! against a bare ordered-consumer read of the same events in the same run.
//!
//! One partition of 8 holds `rebuild_events` events over `rebuild_entities` entities, the other
//! seven a tenth as many between them, interleaved (all written straight into the journal, as
//! previous owners would have). Each round, jetshard goes first: a shard system starts and one
//! command to the partition makes it acquire (claim a generation, which appends a fence
//! record, then replay). jetshard's figure comes from its `acquired partition` log line
//! (`rebuilt_events`, `replay_ms`: the replay alone, and `elapsed_ms`: claim + replay +
//! in-flight recovery). Then, on the journal
//! as the replay saw it, the baselines read the partition with an ordered consumer filtered to
//! `<t>.evt.<p>.*`: `raw` only counts the events, `fold` also decodes each one and applies it to
//! a per-entity state map, as a hand-written rebuild would. A third reading takes the whole
//! journal unfiltered and keeps the partition's events, to show what the filter costs; a fourth
//! uses three filters in one consumer (`<t>.evt.<p>.*`, `<t>.dlq.<p>`, `<t>.fence.<p>`), as
//! jetshard's replay once did: the server serves that at a few hundred events/s, which is why
//! the replay now reads one filter at a time.
//!
//! Every reading is time-boxed ([`TIME_BOX`]): a reading that does not finish reports the rate
//! of what it read, so a slow server path shows as a low figure instead of an endless run.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::{self, Context};
use bytes::Bytes;
use futures::StreamExt;
use jetshard::{Codec, Entity, OwnershipChange, ShardConfig, ShardSystem};
use serde::Serialize;
use serde_json::json;
use tokio::time::Instant;

use crate::Options;
use crate::entity::{BenchEntity, BenchEvt, BenchState};
use crate::load::{self, CommandPublisher};
use crate::probe::AcquisitionLog;
use crate::report::{Report, Row, Worse};
use crate::stats::median;

const ENTITY_TYPE: &str = "rebuild";
const PARTITIONS: u32 = 8;
/// The partition that is rebuilt.
const PARTITION: u32 = 0;
/// Rounds of (jetshard, baselines); medians are reported. The three-filter reading, slow by
/// orders of magnitude, runs in the first round only.
const ROUNDS: usize = 3;
/// The longest a reading may take before its partial rate is reported.
const TIME_BOX: Duration = Duration::from_secs(20);

/// One reading of the partition's events.
#[derive(Debug, Clone, Copy, Serialize)]
struct Reading {
    /// Events of the partition read.
    events: u64,
    /// Seconds.
    secs: f64,
    /// Whether it reached the end of the journal within the time box.
    complete: bool,
}

impl Reading {
    fn rate(&self) -> f64 {
        self.events as f64 / self.secs.max(1e-9)
    }

    /// How a progress line ends: a note if the time box cut the reading short.
    fn note(&self) -> &'static str {
        if self.complete {
            ""
        } else {
            " (time box reached)"
        }
    }
}

/// What a baseline reading does.
#[derive(Debug, Clone, Copy)]
enum Fold {
    /// Counts the partition's events.
    Count,
    /// Decodes each and applies it to its entity's state.
    Apply,
    /// Reads the whole journal unfiltered, counting the partition's events.
    Unfiltered,
    /// Reads with three filters in one consumer (the partition's events, dead letters and
    /// fence records), counting the events.
    JetshardFilters,
}

/// Scenario 3.
pub async fn run(
    options: &Options,
    acquisitions: &AcquisitionLog,
    report: &mut Report,
) -> anyhow::Result<()> {
    let server = crate::server::nats_server().await?;
    let control = server.connect().await?;
    let config = |node: &str| {
        ShardConfig::builder(ENTITY_TYPE)
            .partitions(PARTITIONS)
            .node_id(node)
            .build()
    };
    load::provision(server.connect().await?, config("provision")?).await?;
    let ids = load::ids_in_partition("r", PARTITION, PARTITIONS, options.rebuild_entities);
    let events = options.rebuild_events;
    eprintln!(
        "rebuild: writing {events} events over {} entities into partition {PARTITION}, {} into the others",
        ids.len(),
        events / 10
    );
    write_journal(&control, &ids, events).await?;

    let js = jetstream::new(control.clone());
    let publisher = CommandPublisher::for_ids(control.clone(), ENTITY_TYPE, ids.clone());
    let mut jetshard = Vec::new();
    let mut acquisition = Vec::new();
    let mut to_acquired = Vec::new();
    let mut raw = Vec::new();
    let mut fold = Vec::new();
    let mut unfiltered = Vec::new();
    let mut multi = Vec::new();
    let mut log_lines = Vec::new();
    for round in 0..ROUNDS {
        let system = ShardSystem::start::<BenchEntity>(
            server.connect().await?,
            config(&format!("rebuild-{round}"))?,
        )
        .await
        .context("start the shard system")?;
        let mut ownership = system.ownership_events();
        let published = Instant::now();
        publisher
            .send_to(round, &load::preload_command(0))
            .await?
            .await
            .context("publish the triggering command")?;
        let acquired = tokio::time::timeout(TIME_BOX, async {
            while let Ok(event) = ownership.recv().await {
                if event.partition == PARTITION && event.change == OwnershipChange::Acquired {
                    return Some(Instant::now());
                }
            }
            None
        })
        .await;
        let reading = match (acquired, acquisitions.latest(PARTITION)) {
            (Ok(Some(at)), Some(line)) => {
                to_acquired.push(at.duration_since(published).as_secs_f64() * 1000.0);
                log_lines.push(format!("{line:?}"));
                acquisition.push(Reading {
                    events: line.rebuilt_events,
                    secs: line.elapsed_ms.max(1) as f64 / 1000.0,
                    complete: true,
                });
                Reading {
                    events: line.rebuilt_events,
                    secs: line.replay_ms.max(1) as f64 / 1000.0,
                    complete: true,
                }
            }
            _ => {
                // Still replaying: take the rate from the replay consumer's progress.
                let delivered = replay_progress(&js).await.unwrap_or(0);
                Reading {
                    events: delivered,
                    secs: published.elapsed().as_secs_f64(),
                    complete: false,
                }
            }
        };
        eprintln!(
            "rebuild round {round}: jetshard {:.0} events/s{}",
            reading.rate(),
            reading.note()
        );
        jetshard.push(reading);
        // A system still replaying does not answer within the shutdown timeout; it ends with
        // the server at the end of the scenario.
        let _ = system.shutdown().await;

        for (fold_kind, readings) in [
            (Fold::Count, &mut raw),
            (Fold::Apply, &mut fold),
            (Fold::Unfiltered, &mut unfiltered),
            (Fold::JetshardFilters, &mut multi),
        ] {
            if round > 0 && matches!(fold_kind, Fold::JetshardFilters) {
                continue;
            }
            let reading = read_partition(&js, fold_kind).await?;
            eprintln!(
                "rebuild round {round}: bare {fold_kind:?} {:.0} events/s{}",
                reading.rate(),
                reading.note()
            );
            readings.push(reading);
        }
    }

    let rates = |readings: &[Reading]| readings.iter().map(Reading::rate).collect::<Vec<_>>();
    let rate = |readings: &[Reading]| median(&rates(readings));
    let row = |case: String, readings: &[Reading]| {
        Row::over_rounds("rebuild", case, &rates(readings), "events/s", Worse::Lower)
    };
    let boxed = |readings: &[Reading]| {
        if readings.iter().all(|r| r.complete) {
            ""
        } else {
            " (time-boxed)"
        }
    };
    let raw_rate = rate(&raw);
    let shape = format!(
        "{events} events / {} entities in 1 of {PARTITIONS} partitions",
        ids.len()
    );
    report.rows.push(row(
        format!(
            "bare ordered read, filtered, count only{}, {shape}",
            boxed(&raw)
        ),
        &raw,
    ));
    report.rows.push(
        row(
            format!(
                "bare ordered read, filtered, decode + fold{}, {shape}",
                boxed(&fold)
            ),
            &fold,
        )
        .against(raw_rate),
    );
    report.rows.push(
        row(
            format!(
                "bare ordered read of the whole journal, unfiltered (partition's events/s){}",
                boxed(&unfiltered)
            ),
            &unfiltered,
        )
        .against(raw_rate),
    );
    report.rows.push(
        row(
            format!(
                "bare ordered read, one consumer with three filters (evt, dlq, fence){}",
                boxed(&multi)
            ),
            &multi,
        )
        .against(raw_rate),
    );
    let replay = row(
        format!("jetshard acquisition replay{}, {shape}", boxed(&jetshard)),
        &jetshard,
    )
    .against(raw_rate);
    // Since lazy loading an acquisition reads no history: a replay of nothing
    // meets the target, which holds any replay there is to the raw read.
    let replayed_nothing = jetshard.iter().all(|r| r.complete && r.events == 0);
    let met = replayed_nothing || replay.ratio.is_some_and(|r| r >= 0.9);
    report
        .rows
        .push(replay.target("none (lazy loading), or >= 0.9 x filtered raw read", met));
    report.rows.push(
        row(
            "jetshard whole acquisition (claim + replay + in-flight recovery)".to_owned(),
            &acquisition,
        )
        .against(raw_rate),
    );
    if !to_acquired.is_empty() {
        report.rows.push(Row::over_rounds(
            "rebuild",
            "jetshard: command publish -> Acquired event",
            &to_acquired,
            "ms",
            Worse::Higher,
        ));
    }
    report.details.insert(
        "rebuild".to_owned(),
        json!({
            "events": events,
            "entities": ids.len(),
            "time_box_secs": TIME_BOX.as_secs(),
            "jetshard": jetshard,
            "jetshard_acquisition": acquisition,
            "raw": raw,
            "fold": fold,
            "unfiltered": unfiltered,
            "jetshard_filters": multi,
            "publish_to_acquired_ms": to_acquired,
            "acquisition_log_lines": log_lines,
        }),
    );
    Ok(())
}

/// Writes `events` events of `ids` into the partition and a tenth as many into the other
/// partitions, interleaved (one background event after every ten).
async fn write_journal(
    control: &async_nats::Client,
    ids: &[String],
    events: usize,
) -> anyhow::Result<()> {
    let background: Vec<(u32, Vec<String>)> = (1..PARTITIONS)
        .map(|p| {
            let count = (ids.len() / 10).max(1);
            (p, load::ids_in_partition("r", p, PARTITIONS, count))
        })
        .collect();
    let codec = Codec::default();
    let mut written_background = 0;
    let journal = (0..events).flat_map(|i| {
        let mut batch = Vec::with_capacity(2);
        let event = BenchEvt::Stamped { at_ns: i as u64 };
        let payload = codec.encode(&event).map(Bytes::from).unwrap_or_default();
        batch.push((PARTITION, ids[i % ids.len()].clone(), payload.clone()));
        if i % 10 == 9 {
            let k = written_background;
            written_background += 1;
            let (partition, others) = &background[k % background.len()];
            let id = others[(k / background.len()) % others.len()].clone();
            batch.push((*partition, id, payload));
        }
        batch
    });
    load::write_events(control.clone(), ENTITY_TYPE, journal).await?;
    Ok(())
}

/// How many events the (single) replay consumer on the journal has delivered so far.
async fn replay_progress(js: &Context) -> anyhow::Result<u64> {
    let stream = js
        .get_stream_no_info(journal_name())
        .await
        .context("open the journal")?;
    let mut consumers = stream.consumers();
    let mut delivered = 0;
    while let Some(info) = consumers.next().await {
        let info = info.map_err(|e| anyhow::anyhow!("list the journal's consumers: {e}"))?;
        delivered = delivered.max(info.delivered.consumer_sequence);
    }
    Ok(delivered)
}

fn journal_name() -> String {
    format!("{}_JOURNAL", ENTITY_TYPE.to_ascii_uppercase())
}

/// Reads the partition's events with an ordered consumer until the end of the journal, or
/// until the time box is over.
async fn read_partition(js: &Context, fold: Fold) -> anyhow::Result<Reading> {
    let started = Instant::now();
    let stream = js
        .get_stream_no_info(journal_name())
        .await
        .context("open the journal")?;
    let names = jetshard::wire::Names::new(ENTITY_TYPE);
    let filters = match fold {
        Fold::Unfiltered => Vec::new(),
        Fold::Count | Fold::Apply => vec![names.partition_events(PARTITION)],
        Fold::JetshardFilters => vec![
            names.partition_events(PARTITION),
            names.partition_dead_letters(PARTITION),
            names.fence_subject(PARTITION),
        ],
    };
    // One filter goes as `filter_subject`, as the baselines of a single-filter replay would.
    let config = match &filters[..] {
        [one] => pull::OrderedConfig {
            filter_subject: one.clone(),
            ..Default::default()
        },
        _ => pull::OrderedConfig {
            filter_subjects: filters.clone(),
            ..Default::default()
        },
    };
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            deliver_policy: DeliverPolicy::All,
            ..config
        })
        .await
        .with_context(|| format!("open an ordered consumer on {filters:?}"))?;
    let mut messages = consumer.messages().await.context("read the journal")?;
    let codec = Codec::default();
    let prefix = format!("{ENTITY_TYPE}.evt.{PARTITION}.");
    let mut states: HashMap<String, BenchState> = HashMap::new();
    let mut events = 0;
    let deadline = started + TIME_BOX;
    loop {
        let next = tokio::time::timeout_at(deadline, messages.next()).await;
        let Ok(next) = next else {
            return Ok(Reading {
                events,
                secs: started.elapsed().as_secs_f64(),
                complete: false,
            });
        };
        let message = next
            .context("the read ended early")?
            .context("read an event")?;
        let pending = message
            .info()
            .map_err(|e| anyhow::anyhow!("read an event's info: {e}"))?
            .pending;
        match fold {
            Fold::Count => events += 1,
            Fold::Unfiltered | Fold::JetshardFilters => {
                if message.subject.starts_with(prefix.as_str()) {
                    events += 1;
                }
            }
            Fold::Apply => {
                let id = message.subject.rsplit('.').next().unwrap_or_default();
                let event: BenchEvt = codec.decode(&message.payload).context("decode an event")?;
                let state = match states.get_mut(id) {
                    Some(state) => state,
                    None => states.entry(id.to_owned()).or_default(),
                };
                BenchEntity::apply(state, &event);
                events += 1;
            }
        }
        if pending == 0 {
            return Ok(Reading {
                events,
                secs: started.elapsed().as_secs_f64(),
                complete: true,
            });
        }
    }
}
