//! Background compaction: each owner keeps its partition's journal to what live state needs
//! (events and timer records behind snapshots, confirmed outbox records, timers no longer
//! armed), while commands run and partitions move, and loses nothing.

use std::time::Duration;

use futures::StreamExt;
use jetshard_testkit::wait_until;
use jetshard_tests::ledger::LedgerCmd;
use jetshard_tests::{Scenario, init_tracing, snapshot_every};

const WITHIN: Duration = Duration::from_secs(30);
/// The nodes' compaction interval: short, so that every few commands meet a sweep.
const COMPACTION: [(&str, &str); 1] = [("JETSHARD_COMPACTION_MS", "200")];

/// How many records of the ledger's journal lie on `filter` (the server's count per subject:
/// no consumer is made).
async fn records_on(s: &Scenario, filter: &str) -> usize {
    let mut total = 0;
    for name in jetshard_tests::ledger_journals(&s.js).await {
        let journal = s.js.get_stream(name).await.unwrap();
        let mut subjects = journal.info_with_subjects(filter).await.unwrap();
        while let Some(subject) = subjects.next().await {
            total += subject.unwrap().1;
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_during_load_and_takeovers_loses_nothing() {
    init_tracing();
    let mut s = Scenario::single(4).await;
    s.mirror_journal().await;
    let entities: Vec<String> = (0..12).map(|i| format!("e{i}")).collect();
    let mut a = s.node_with("a", &COMPACTION).await;
    for n in 0..10 {
        s.append_to_all(&entities, n).await;
    }
    s.wait_owns_all(&a).await;
    let mut b = s.node_with("b", &COMPACTION).await;
    for n in 10..20 {
        s.append_to_all(&entities, n).await;
    }
    // A takeover while commands are in flight and the owner may be mid-sweep.
    a.kill().await;
    for n in 20..30 {
        s.append_to_all(&entities, n).await;
    }
    let mut c = s.node_with("c", &COMPACTION).await;
    b.kill().await;
    for n in 30..40 {
        s.append_to_all(&entities, n).await;
    }
    // Every command applied exactly once, in order, as the ledger does (an entity loaded from
    // a journal compacted wrongly would refuse the next `Append`), under the right generation.
    s.check_mirrored().await;
    // The journal holds about a snapshot interval of events per entity, not the 480 written.
    let bound = entities.len() * (snapshot_every() as usize + 2);
    let compacted = wait_until(WITHIN, "the events compacted to live state", || async {
        records_on(&s, "ledger.evt.>").await <= bound
    })
    .await;
    let events = records_on(&s, "ledger.evt.>").await;
    assert!(compacted.is_ok(), "{compacted:?}: {events} events");
    // An entity loaded from the compacted journal (by a new owner) equals its full history.
    let d = s.node_with("d", &COMPACTION).await;
    c.kill().await;
    let expected: Vec<u64> = (0..40).collect();
    for entity in &entities {
        wait_until(WITHIN, "the entity loaded by d", || async {
            s.sender
                .get(entity, Duration::from_secs(2))
                .await
                .is_ok_and(|got| got.state == expected)
        })
        .await
        .unwrap_or_else(|e| {
            panic!("{e}: {entity} is not 0..40");
        });
    }
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_far_above_the_budget_leaves_the_journal_within_the_bound_after_it() {
    init_tracing();
    let mut s = Scenario::single(2).await;
    s.mirror_journal().await;
    // A budget of one purge per 100 ms, a sweep every 200 ms: 100 entities snapshotted 10
    // times each in the burst ask for far more than the budget allows.
    let config = s
        .config("a")
        .compaction_interval(Duration::from_millis(200))
        .compaction_budget(1);
    let system = s.system_with(config).await;
    let entities: Vec<String> = (0..100).map(|i| format!("burst{i}")).collect();
    for n in 0..30 {
        s.append_to_all(&entities, n).await;
    }
    s.check_mirrored().await;
    // Per entity at most a snapshot interval of events, its latest snapshot and one more
    // (written since the last sweep): the entities' records (`ledger.*.<p>.<id>`).
    let bound = entities.len() * (snapshot_every() as usize + 2);
    let bounded = wait_until(WITHIN, "the journal within the bound", || async {
        records_on(&s, "ledger.*.*.*").await <= bound
            && records_on(&s, "ledger.snap.>").await <= 2 * entities.len()
    })
    .await;
    let (records, snapshots) = (
        records_on(&s, "ledger.*.*.*").await,
        records_on(&s, "ledger.snap.>").await,
    );
    assert!(
        bounded.is_ok(),
        "{bounded:?}: {records} records (bound {bound}), {snapshots} snapshots"
    );
    // Loaded anew from what is left, each entity equals its history.
    system.shutdown().await.unwrap();
    let system = s.system_with(s.config("b")).await;
    let expected: Vec<u64> = (0..30).collect();
    for entity in &entities {
        wait_until(WITHIN, "the entity loaded by b", || async {
            s.sender
                .get(entity, Duration::from_secs(2))
                .await
                .is_ok_and(|got| got.state == expected)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}: {entity} is not 0..30"));
    }
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_no_longer_armed_leave_the_journal_and_armed_ones_fire_once_after_a_takeover() {
    init_tracing();
    let s = Scenario::single(2).await;
    let config = |node: &str| {
        s.config(node)
            .compaction_interval(Duration::from_millis(200))
    };
    let system = s.system_with(config("a")).await;
    let entities: Vec<String> = (0..20).map(|i| format!("t{i}")).collect();
    for entity in &entities {
        // Fires at once.
        let fire = LedgerCmd::Remind {
            name: "now".into(),
            n: 0,
            after_ms: 1,
        };
        s.sender.send(entity, &fire).await.unwrap();
        // Set, then cancelled.
        let set = LedgerCmd::Remind {
            name: "never".into(),
            n: 9,
            after_ms: 3_600_000,
        };
        s.sender.send(entity, &set).await.unwrap();
        let cancel = LedgerCmd::Forget {
            name: "never".into(),
        };
        s.sender.send(entity, &cancel).await.unwrap();
    }
    // Five stay armed, due in 10 s (after the checks below).
    let armed = &entities[..5];
    for entity in armed {
        let later = LedgerCmd::Remind {
            name: "later".into(),
            n: 1,
            after_ms: 10_000,
        };
        s.sender.send(entity, &later).await.unwrap();
    }
    for entity in &entities {
        wait_until(WITHIN, "the first timer fired", || async {
            s.sender
                .get(entity, Duration::from_secs(2))
                .await
                .is_ok_and(|got| got.state == vec![0])
        })
        .await
        .unwrap();
    }
    // What a takeover reads of the timers: of 100 records written (40 sets, 20 cancels, 20
    // fired records), only the armed timers' `set` records and what their entities wrote
    // after them (at most their first timer's `fired` record); none of the others' entities.
    let compacted = wait_until(WITHIN, "only armed timers' records left", || async {
        let mut others = 0;
        for entity in &entities[armed.len()..] {
            others += records_on(&s, &format!("ledger.tmr.*.{entity}")).await;
        }
        others == 0 && records_on(&s, "ledger.tmr.>").await <= 2 * armed.len()
    })
    .await;
    let left = records_on(&s, "ledger.tmr.>").await;
    assert!(compacted.is_ok(), "{compacted:?}: {left} timer records");
    // A takeover: the next owner reads the partition's timer records on acquisition.
    system.shutdown().await.unwrap();
    let system = s.system_with(config("b")).await;
    for entity in armed {
        wait_until(
            WITHIN,
            "the armed timer fired after the takeover",
            || async {
                s.sender
                    .get(entity, Duration::from_secs(2))
                    .await
                    .is_ok_and(|got| got.state == vec![0, 1])
            },
        )
        .await
        .unwrap();
    }
    // Once: no second firing by a timer read back from a purged record.
    wait_until(WITHIN, "the fired timers' records purged", || async {
        records_on(&s, "ledger.tmr.>").await == 0
    })
    .await
    .unwrap();
    for entity in &entities {
        let got = s.sender.get(entity, Duration::from_secs(2)).await.unwrap();
        let want = if armed.contains(entity) {
            vec![0, 1]
        } else {
            vec![0]
        };
        assert_eq!(got.state, want, "{entity}");
    }
    system.shutdown().await.unwrap();
}

/// What the sink stream holds of the ledger's messages (`sink.<n>`), by subject.
async fn sunk(s: &Scenario) -> usize {
    let sink = s.js.get_stream("SINK").await.unwrap();
    let mut subjects = sink.info_with_subjects("sink.*").await.unwrap();
    let mut total = 0;
    while let Some(subject) = subjects.next().await {
        let (subject, count) = subject.unwrap();
        if subject != "sink.probe" {
            total += count;
        }
    }
    total
}

/// Publishes the probe message with msg id `probe`; whether the sink stored it (its duplicate
/// window had passed since the last one stored).
async fn probe_stored(s: &Scenario) -> bool {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", "probe");
    let ack =
        s.js.publish_with_headers("sink.probe", headers, "probe".into())
            .await
            .unwrap()
            .await
            .unwrap();
    !ack.duplicate
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_message_confirmed_before_a_sigkill_is_not_sent_again_after_the_purge() {
    init_tracing();
    let s = Scenario::single(2).await;
    // A sink whose de-duplication forgets after a second: a message sent again later is
    // stored again, so the count shows every repeat.
    s.js.create_stream(async_nats::jetstream::stream::Config {
        name: "SINK".into(),
        subjects: vec!["sink.>".into()],
        duplicate_window: Duration::from_secs(1),
        ..Default::default()
    })
    .await
    .unwrap();
    // Owner a does not compact: its confirmed messages' records stay until b purges them.
    let mut a = s.node("a").await;
    for n in 0..20 {
        let forward = LedgerCmd::Forward {
            n,
            to: "dst".into(),
        };
        s.sender.send("src", &forward).await.unwrap();
    }
    // Every message confirmed and recorded done: 40 outbox records (a message to dst and one
    // to the sink each) and 20 done records.
    let confirmed = wait_until(WITHIN, "20 messages sent and recorded done", || async {
        sunk(&s).await == 20 && records_on(&s, "ledger.out.>").await == 60
    })
    .await;
    let (sent, records) = (sunk(&s).await, records_on(&s, "ledger.out.>").await);
    assert!(
        confirmed.is_ok(),
        "{confirmed:?}: {sent} sent, {records} outbox records"
    );
    assert!(probe_stored(&s).await);
    a.kill().await;
    // The sink's duplicate window has passed for everything a published.
    wait_until(WITHIN, "the sink's duplicate window passed", || {
        probe_stored(&s)
    })
    .await
    .unwrap();
    let b = s.node_with("b", &COMPACTION).await;
    s.wait_owns_all(&b).await;
    // b purges the confirmed records (and their done records, in the same purge).
    wait_until(WITHIN, "the outbox purged", || async {
        records_on(&s, "ledger.out.>").await == 0
    })
    .await
    .unwrap();
    // A last message through b: once it is confirmed and purged, b's outbox recovery (which
    // starts at its acquisition) is done, and nothing of a's was published again.
    let last = LedgerCmd::Forward {
        n: 100,
        to: "dst".into(),
    };
    s.sender.send("src", &last).await.unwrap();
    wait_until(WITHIN, "the last message sent and purged", || async {
        sunk(&s).await >= 21 && records_on(&s, "ledger.out.>").await == 0
    })
    .await
    .unwrap();
    assert_eq!(sunk(&s).await, 21);
    drop(b);
}
