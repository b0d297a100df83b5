//! Part (b) of the scenario: the acquisition's timer read after many timers ever set, three
//! journals side by side (each on its own server), read in alternated rounds.

use std::time::Duration;

use anyhow::Context as _;
use jetshard::{Codec, JournalReader, ShardSystem};
use jetshard_testkit::NatsServer;
use serde_json::json;

use crate::load::AckWindow;
use crate::report::{Report, Row};

use super::entity::{CompactionCmd, CompactionEntity, ENTITY_TYPE, JOURNAL, config};

/// (b)'s cases: what is set before the 1k armed timers, and whether it is compacted.
const TIMER_CASES: [(&str, bool, bool); 3] = [
    ("1k timers set, 1k armed", false, false),
    ("101k timers set, 1k armed, not compacted", true, false),
    ("101k timers set, 1k armed, compacted", true, true),
];

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
    let server = crate::server::nats_server().await?;
    let control = server.connect().await?;
    let js = async_nats::jetstream::new(control.clone());
    let system = ShardSystem::start::<CompactionEntity>(
        server.connect().await?,
        config(TIMER_PARTITIONS, 100, None, 1, 1)?,
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
/// the whole type (`<t>.tmr.>`, the read it replaced). Rows: the medians.
pub(super) async fn timer_reads(report: &mut Report) -> anyhow::Result<Vec<serde_json::Value>> {
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
