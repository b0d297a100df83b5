//! Scenario `recovery`: what an acquisition costs with a long history, now that entities load
//! lazily (their latest snapshot and their own records after it), against the full replay of
//! the partition that acquisitions did before, measured in the same run.
//!
//! Partition 0 of 8 holds `recovery_events` events over `recovery_entities` entities, plus a
//! hot entity with [`HOT_EVENTS`] events of its own, written straight into the journal as
//! earlier owners would have. Then:
//! - **full replay**: an ordered read of `<t>.evt.0.*` that decodes and folds every event into a
//!   per-entity map: what an acquisition did before lazy loading (its replay alone);
//! - **acquisition -> first command served**: a shard system starts, and one request to the hot
//!   entity is timed from its publish to its outcome (the partition is acquired on that
//!   delivery: claim, in-flight window, then the hot entity loaded; its log line says how many
//!   events it replayed, which must be none). Round 1 loads the hot
//!   entity from its events; later rounds from the snapshot the first round wrote;
//! - **first command of a known entity after acquisition**: requests, one after another, to
//!   [`FIRST_TOUCHES`] entities with history, each its first since the acquisition (p50/p99),
//!   against the same requests to the same entities once loaded; round 1 from events, round 2
//!   (after a takeover) from snapshots;
//! - **memory**: [`MEMORY_ENTITIES`] known entities touched once each, with a dormant budget of
//!   [`DORMANT_BUDGET`], against no budget: dormant states held and RSS growth of this process;
//! - **snapshot cost**: commands/s draining a preloaded backlog with snapshots every 100 events
//!   against snapshots off (rounds off, on, on, off, twice; means).

mod entity;
mod memory;
mod snapshot_cost;

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::consumer::pull;
use async_nats::jetstream::{self, Context};
use bytes::Bytes;
use futures::StreamExt;
use jetshard::{Codec, CommandOutcome, CommandSender, Entity, ShardSystem};
use serde_json::json;
use tokio::time::Instant;

use crate::Options;
use crate::entity::{BenchCmd, BenchEvt};
use crate::load;
use crate::probe::AcquisitionLog;
use crate::report::{Report, Row};
use crate::stats::{Summary, median};

pub use crate::entity::{CountState as RecoveryState, RecoveryEntity};
use entity::{ENTITY_TYPE, PARTITIONS, config};
use memory::{DORMANT_BUDGET, MEMORY_ENTITIES, memory_passes};
use snapshot_cost::{COST_COMMANDS, COST_ENTITIES, snapshot_cost};

/// The partition with the long history.
const PARTITION: u32 = 0;
/// Events of the hot entity.
const HOT_EVENTS: usize = 1_000;
/// Entities given their first command after an acquisition, per round.
const FIRST_TOUCHES: usize = 300;
const ASK: Duration = Duration::from_secs(30);

/// Scenario `recovery`.
pub async fn run(
    options: &Options,
    acquisitions: &AcquisitionLog,
    report: &mut Report,
) -> anyhow::Result<()> {
    let server = crate::server::nats_server().await?;
    let control = server.connect().await?;
    let js = jetstream::new(control.clone());
    load::provision(control.clone(), config("provision").build()?).await?;
    let events = options.recovery_events;
    let ids = load::ids_in_partition("k", PARTITION, PARTITIONS, options.recovery_entities);
    let hot = load::ids_in_partition("hot", PARTITION, PARTITIONS, 1).remove(0);
    eprintln!(
        "recovery: writing {events} events over {} entities, and {HOT_EVENTS} of one hot entity, into partition {PARTITION}",
        ids.len()
    );
    let written = Instant::now();
    let codec = Codec::default();
    let payload = Bytes::from(codec.encode(&BenchEvt::Stamped { at_ns: 1 })?);
    let journal = (0..events)
        .map(|i| (PARTITION, ids[i % ids.len()].clone(), payload.clone()))
        .chain((0..HOT_EVENTS).map(|_| (PARTITION, hot.clone(), payload.clone())));
    load::write_events(control.clone(), ENTITY_TYPE, journal).await?;
    eprintln!(
        "recovery: journal written in {:.1} s",
        written.elapsed().as_secs_f64()
    );

    // Before lazy loading, an acquisition replayed the whole partition into state.
    let replay = full_replay(&js).await?;
    eprintln!(
        "recovery: full replay of the partition: {} events in {:.0} ms",
        replay.0,
        replay.1 * 1000.0
    );

    let sender = CommandSender::<RecoveryEntity>::new(control.clone(), &config("x").build()?);
    let stamp = BenchCmd::Stamp { at_ns: 2 };
    let mut to_first = Vec::new();
    let mut acquired_at: Vec<f64> = Vec::new();
    let mut replayed: Vec<u64> = Vec::new();
    let mut first_touch: Vec<Summary> = Vec::new();
    let mut warm_touch: Vec<Summary> = Vec::new();
    for round in 0..3usize {
        let system = ShardSystem::start::<RecoveryEntity>(
            control.clone(),
            config(&format!("n{round}")).build()?,
        )
        .await
        .context("start the shard system")?;
        let published = Instant::now();
        let outcome = sender.request_outcome(&hot, &stamp, ASK).await?;
        let served = published.elapsed();
        // The acquisition alone (in-hand read, claim, in-flight window): its log line.
        if let Some(line) = acquisitions.latest(PARTITION) {
            acquired_at.push(line.elapsed_ms as f64);
            replayed.push(line.rebuilt_events);
        }
        anyhow::ensure!(
            matches!(outcome, CommandOutcome::Applied { .. }),
            "hot entity: {outcome:?}"
        );
        to_first.push(served.as_secs_f64() * 1000.0);
        eprintln!(
            "recovery round {round}: acquisition -> hot entity's first command served in {:.1} ms (acquisition alone {:?} ms)",
            served.as_secs_f64() * 1000.0,
            acquired_at.last()
        );
        if round < 2 {
            // Each entity's first command since the acquisition, then a second one (loaded).
            let touched = &ids[round * FIRST_TOUCHES..(round + 1) * FIRST_TOUCHES];
            let first = timed_requests(&sender, touched, &stamp).await?;
            let warm = timed_requests(&sender, touched, &stamp).await?;
            eprintln!(
                "recovery round {round}: first command p50 {:.2} ms p99 {:.2} ms; loaded p50 {:.2} ms p99 {:.2} ms",
                first.p50, first.p99, warm.p50, warm.p99
            );
            first_touch.push(first);
            warm_touch.push(warm);
        }
        system.shutdown().await?;
    }
    // Round 2 takes over again and loads round 1's entities, now with snapshots.
    let system = ShardSystem::start::<RecoveryEntity>(control.clone(), config("n3").build()?)
        .await
        .context("start the shard system")?;
    let touched = &ids[FIRST_TOUCHES..2 * FIRST_TOUCHES];
    let from_snapshot = timed_requests(&sender, touched, &stamp).await?;
    eprintln!(
        "recovery: first command after a takeover, loaded from a snapshot: p50 {:.2} ms p99 {:.2} ms",
        from_snapshot.p50, from_snapshot.p99
    );
    system.shutdown().await?;

    let memory = memory_passes(&control, &ids, 2 * FIRST_TOUCHES).await?;
    let cost = snapshot_cost(&server, &control).await?;

    let shape = format!(
        "{events} events / {} entities in 1 of {PARTITIONS} partitions",
        ids.len()
    );
    let replay_ms = replay.1 * 1000.0;
    report.rows.push(Row::new(
        "recovery",
        format!(
            "full replay of the partition (decode + fold; what acquisition did before), {shape}"
        ),
        replay_ms,
        "ms",
    ));
    let first_served = to_first[0];
    report.rows.push(
        Row::new(
            "recovery",
            format!("acquisition -> hot entity's first command served, {HOT_EVENTS} events, no snapshot, {shape}"),
            first_served,
            "ms",
        )
        .against(replay_ms)
        .target("<= 1000 ms", first_served <= 1000.0),
    );
    let later = median(&to_first[1..]);
    report.rows.push(
        Row::new(
            "recovery",
            "acquisition -> hot entity's first command served, from its snapshot (median of 2)",
            later,
            "ms",
        )
        .against(replay_ms)
        .target("<= 1000 ms", later <= 1000.0),
    );
    if !acquired_at.is_empty() {
        let most = replayed.iter().copied().max().unwrap_or(0);
        report.rows.push(
            Row::new(
                "recovery",
                format!(
                    "events an acquisition replayed, most of {} rounds, {shape}",
                    replayed.len()
                ),
                most as f64,
                "events",
            )
            .target("0: entities load on demand", most == 0),
        );
        report.rows.push(
            Row::new(
                "recovery",
                "acquisition alone (in-hand read, claim, in-flight window; log line), median",
                median(&acquired_at),
                "ms",
            )
            .against(replay_ms),
        );
    }
    let warm_p99 = warm_touch.first().map_or(0.0, |s| s.p99);
    report.rows.push(
        Row::new(
            "recovery",
            format!(
                "first command of a known entity (~{} events, loaded from events) p99",
                events / ids.len().max(1)
            ),
            first_touch[0].p99,
            "ms",
        )
        .against(warm_p99),
    );
    report.rows.push(
        Row::new(
            "recovery",
            "first command of a known entity after a takeover, loaded from its snapshot, p99",
            from_snapshot.p99,
            "ms",
        )
        .against(warm_p99)
        .target("<= 5 ms", from_snapshot.p99 <= 5.0),
    );
    report.rows.push(Row::new(
        "recovery",
        "the same entities' next command (loaded), p99",
        warm_p99,
        "ms",
    ));
    report.rows.push(
        Row::new(
            "recovery",
            format!("dormant states after touching {MEMORY_ENTITIES} known entities, budget {DORMANT_BUDGET}"),
            memory.bounded_dormant as f64,
            "states",
        )
        .against(memory.unbounded_dormant as f64)
        .target(format!("<= {DORMANT_BUDGET}"), memory.bounded_dormant <= DORMANT_BUDGET),
    );
    let ratio_met = cost.on / cost.off.max(1e-9) >= 0.95;
    report.rows.push(
        Row::new(
            "recovery",
            format!("drain with snapshots every 100 events, {COST_COMMANDS} commands / {COST_ENTITIES} entities"),
            cost.on,
            "cmd/s",
        )
        .against(cost.off)
        .target(">= 0.95 x snapshots off", ratio_met),
    );
    report.details.insert(
        "recovery".to_owned(),
        json!({
            "events": events,
            "entities": ids.len(),
            "hot_events": HOT_EVENTS,
            "full_replay": {"events": replay.0, "ms": replay_ms},
            "to_first_served_ms": to_first,
            "acquisition_ms": acquired_at,
            "acquisition_replayed_events": replayed,
            "first_touch": first_touch,
            "warm_touch": warm_touch,
            "first_touch_from_snapshot": from_snapshot,
            "memory": {
                "bounded_dormant": memory.bounded_dormant,
                "unbounded_dormant": memory.unbounded_dormant,
                "bounded_rss_kb": memory.bounded_rss_kb,
                "unbounded_rss_kb": memory.unbounded_rss_kb,
            },
            "snapshot_cost": {"on": cost.on_rounds, "off": cost.off_rounds},
        }),
    );
    Ok(())
}

/// Requests `command` of each of `ids`, one after another; their latencies in ms.
async fn timed_requests(
    sender: &CommandSender<RecoveryEntity>,
    ids: &[String],
    command: &BenchCmd,
) -> anyhow::Result<Summary> {
    let mut samples = Vec::with_capacity(ids.len());
    for id in ids {
        let started = Instant::now();
        let outcome = sender.request_outcome(id, command, ASK).await?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            matches!(outcome, CommandOutcome::Applied { .. }),
            "{id}: {outcome:?}"
        );
    }
    Ok(Summary::of(&samples))
}

/// The partition's events read with an ordered consumer, decoded and folded into a map of
/// states: (events, seconds).
async fn full_replay(js: &Context) -> anyhow::Result<(u64, f64)> {
    let stream = js
        .get_stream(format!("{}_JOURNAL", ENTITY_TYPE.to_ascii_uppercase()))
        .await
        .context("open the journal")?;
    let filter = format!("{ENTITY_TYPE}.evt.{PARTITION}.*");
    let end = stream
        .get_last_raw_message_by_subject(&filter)
        .await
        .context("last event")?
        .sequence;
    let started = Instant::now();
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: filter,
            ..Default::default()
        })
        .await
        .context("open the replay")?;
    let mut messages = consumer.messages().await?;
    let mut states: HashMap<String, RecoveryState> = HashMap::new();
    let codec = Codec::default();
    let mut read = 0;
    while let Some(message) = messages.next().await {
        let message = message?;
        let seq = message
            .info()
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .stream_sequence;
        let event: BenchEvt = codec.decode(&message.payload)?;
        let id = message.subject.rsplit('.').next().unwrap_or_default();
        match states.get_mut(id) {
            Some(state) => RecoveryEntity::apply(state, &event),
            None => RecoveryEntity::apply(states.entry(id.to_owned()).or_default(), &event),
        }
        read += 1;
        if seq >= end {
            break;
        }
    }
    Ok((read, started.elapsed().as_secs_f64()))
}
