//! The `Jetshard-Previous` chain under failures: a record names a sequence every earlier record
//! of its entity is at or below, and a load whose last records chain down past the snapshot
//! reads nothing more (docs/ARCHITECTURE.md, "Invariants"). A write answered "not confirmed"
//! that lands anyway, and commands whose handler panics (the actor restarted each time), must
//! leave no false link: after them, a cold load through the batched path holds what a full
//! replay of the entity's records holds, and the journal holds what was sent.

use std::time::Duration;

use async_nats::jetstream::Context;
use jetshard::wire::{HDR_GENERATION, HDR_PREVIOUS};
use jetshard::{Loads, ShardSystem};
use jetshard_testkit::history::Ack;
use jetshard_tests::ledger::LedgerCmd;
use jetshard_tests::model::Op;
use jetshard_tests::{Scenario, init_tracing, wait_drained};

const WITHIN: Duration = Duration::from_secs(60);

/// One record of an entity as stored: its sequence, subject, generation and the previous
/// sequence it names, if any.
#[derive(Debug)]
struct Stored {
    seq: u64,
    subject: String,
    generation: Option<u64>,
    previous: Option<u64>,
}

/// Every record of `entity` in the ledger's journal but its snapshots, in journal order (read
/// one by one: a test's journal is small).
async fn records_of(js: &Context, entity: &str) -> Vec<Stored> {
    let mut stream = js.get_stream("LEDGER_JOURNAL").await.expect("the journal");
    let last = stream.info().await.expect("its info").state.last_sequence;
    let mut records = Vec::new();
    for seq in 1..=last {
        let Ok(message) = stream.get_raw_message(seq).await else {
            continue;
        };
        let subject = message.subject.to_string();
        if !subject.ends_with(&format!(".{entity}")) || subject.starts_with("ledger.snap.") {
            continue;
        }
        let number = |name: &str| {
            message
                .headers
                .get(name)
                .and_then(|v| v.as_str().parse::<u64>().ok())
        };
        records.push(Stored {
            seq,
            subject,
            generation: number(HDR_GENERATION),
            previous: number(HDR_PREVIOUS),
        });
    }
    records
}

/// Every record that names a previous one names a sequence below it, with no record of the
/// entity between the two: the rule itself, checked on the journal.
fn assert_links_true(records: &[Stored]) {
    for (at, record) in records.iter().enumerate() {
        let Some(previous) = record.previous else {
            continue;
        };
        let skipped: Vec<u64> = records[..at]
            .iter()
            .map(|r| r.seq)
            .filter(|seq| *seq > previous)
            .collect();
        assert!(
            previous < record.seq && skipped.is_empty(),
            "record {} ({}) names {previous}, but the entity has {skipped:?} between: {records:#?}",
            record.seq,
            record.subject
        );
    }
}

/// The next owner loads `entity` from its pull burst (its command stored before the owner
/// starts: a batched load), and it must accept `Append(next)`: a load that lost or doubled a
/// record refuses it. Then the entity holds `0..=next`, which is also what a full replay of its
/// records gives (`Scenario::check` replays the journal against everything sent).
async fn cold_load_holds_the_full_replay(s: &mut Scenario, entity: &str, next: u64) {
    s.send(entity, Op::Append(next)).await;
    let quiet = s.config("n2").snapshot_on_passivation(false);
    let system = s.system_with(quiet).await;
    wait_drained(&s.js, WITHIN).await.expect("the command done");
    let loads = Loads::of(&system.status().await.expect("status"));
    eprintln!("n2: {loads}");
    assert!(
        loads.batched >= 1,
        "loaded through the batched path: {loads}"
    );
    s.wait_holds(entity, &(0..=next).collect::<Vec<_>>()).await;
    s.check().await;
    system.shutdown().await.expect("shut down");
}

/// A write not confirmed in time (the server stopped past `write_timeout` while it was on its
/// way) is stored once the server runs again. Its entity's actor stops; the next one loads the
/// entity again, and may do so before that record is stored (a read is not ordered after a
/// publish whose answer never came). So from then on no record of the generation names a
/// previous one; the next generation, whose claim fences such records out, does again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_not_confirmed_that_lands_leaves_no_previous_in_its_generation() {
    init_tracing();
    // A long pin TTL: the generation outlives the pause.
    let mut s = Scenario::single(1).await.pin_ttl(Duration::from_secs(10));
    let entity = "late";
    let config = s.doubting_config("n1").snapshot_every(1);
    let system = s.system_with(config).await;
    // A snapshot after every event: every record of the entity would name its previous one.
    s.send(entity, Op::Append(0)).await;
    s.wait_holds(entity, &[0]).await;

    // Its next command's decide stops the server; its write then waits past the timeout.
    let command = LedgerCmd::Slow { n: 1, ms: 0 };
    s.send_unconfirmed(&system, entity, 1, command, Op::Append(1))
        .await;

    // More commands of the entity in the same generation: events (each followed by a
    // snapshot) and a dead letter.
    for n in 2..5 {
        s.send(entity, Op::Append(n)).await;
    }
    s.send_raw(entity, b"{not a command".to_vec(), Op::Garbage)
        .await;
    s.send(entity, Op::Append(5)).await;
    s.wait_holds(entity, &[0, 1, 2, 3, 4, 5]).await;
    wait_drained(&s.js, WITHIN).await.expect("drained");
    let records = records_of(&s.js, entity).await;
    let generation = records[0].generation;
    assert_eq!(
        records
            .iter()
            .filter(|r| r.generation == generation)
            .count(),
        records.len(),
        "one generation: {records:#?}"
    );
    // The first names one; none after the write in doubt does.
    assert_eq!(records[0].previous, Some(0), "{records:#?}");
    let after: Vec<&Stored> = records.iter().skip(2).collect();
    assert!(after.len() >= 4, "records after the doubt: {records:#?}");
    assert!(
        after.iter().all(|r| r.previous.is_none()),
        "a record after a write in doubt names a previous one: {records:#?}"
    );
    assert_links_true(&records);
    system.shutdown().await.expect("shut down");

    // The next generation loads it through the batched path, and writes headers again.
    cold_load_holds_the_full_replay(&mut s, entity, 6).await;
    assert_links_true(&records_of(&s.js, entity).await);
}

/// A command whose handler panics at every delivery: the entity's actor stops after each, the
/// next one loads the entity again (its tail read anew) and finally dead-letters it, naming
/// what it read. Around it, timers set by commands that write nothing else (a timer record
/// alone names its previous record, as a dead letter does). A restarted actor that named less
/// than it read would let the cold load below take a chain that skips the first timer's
/// record (hidden behind the second, the last of its subject): that timer would be lost, and
/// never fire. Each timer fires once, after a takeover and a cold load through the batched
/// path, and the journal holds what was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_handler_panics_and_restarts_a_cold_load_holds_every_record() {
    init_tracing();
    let mut s = Scenario::single(1).await;
    let entity = "panics";
    let config = s
        .config("n1")
        .snapshot_every(1)
        .snapshot_on_passivation(false)
        .retry_delay(Duration::from_millis(20));
    let system: ShardSystem = s.system_with(config).await;
    let remind = |name: &str, n: u64| LedgerCmd::Remind {
        name: name.to_owned(),
        n,
        after_ms: 8_000,
    };
    s.send(entity, Op::Append(0)).await;
    // Not in the history: a timer record is no outcome; the commands the timers send are.
    s.sender
        .send(entity, &remind("a", 100))
        .await
        .expect("send");
    s.send(entity, Op::Panic).await;
    s.sender
        .send(entity, &remind("b", 101))
        .await
        .expect("send");
    wait_drained(&s.js, WITHIN).await.expect("drained");
    let records = records_of(&s.js, entity).await;
    assert_links_true(&records);
    let kinds: Vec<&str> = records
        .iter()
        .map(|r| r.subject.split('.').nth(1).unwrap_or(""))
        .collect();
    assert_eq!(kinds, ["evt", "tmr", "dlq", "tmr"], "{records:#?}");
    assert!(
        records.iter().all(|r| r.previous.is_some()),
        "every record names its previous one: {records:#?}"
    );
    system.shutdown().await.expect("shut down");

    // The timers' commands, sent by jetshard once they are due.
    s.send(entity, Op::Append(1)).await;
    s.history.record(entity, Op::Push(100), Ack::Unknown);
    s.history.record(entity, Op::Push(101), Ack::Unknown);
    let quiet = s.config("n2").snapshot_on_passivation(false);
    let next = s.system_with(quiet).await;
    s.wait_holds(entity, &[0, 1, 100, 101]).await;
    let loads = Loads::of(&next.status().await.expect("status"));
    eprintln!("n2: {loads}");
    assert!(
        loads.batched >= 1,
        "loaded through the batched path: {loads}"
    );
    s.check().await;
    assert_links_true(&records_of(&s.js, entity).await);
    next.shutdown().await.expect("shut down");
}
