//! Batched loads: the new entities of a pull burst read the last record of each of their
//! subjects in one direct get, complete up to the partition's watermark, and each reads only
//! its records after its snapshot on its own. An entity loaded in a batch must hold what one
//! loaded alone holds: its events, its snapshot and the events after it, its armed timers (they
//! still fire, once) and its dead letters (their commands count as processed). On one server
//! and on a 3-server cluster, where any replica answers the batched read.

use std::time::Duration;

use jetshard::{Loads, ShardSystem};
use jetshard_testkit::wait_until;
use jetshard_tests::ledger::appended;
use jetshard_tests::model::{Op, check_effects, read_ledger};
use jetshard_tests::{Scenario, init_tracing};

const WITHIN: Duration = Duration::from_secs(60);

/// Entities of every kind of history, with what each holds after its history and one more
/// command: `Append { n }` is accepted only when `n` is the entity's length, so a load that
/// lost or doubled an event refuses it.
struct Histories {
    /// `(entity, its list once the burst's command is applied)`.
    expected: Vec<(String, Vec<u64>)>,
}

impl Histories {
    /// Writes the histories (the tests' ledgers snapshot every 3 events; the systems here
    /// write none on passivation, so that many entities end with events after their snapshot).
    async fn write(s: &mut Scenario) -> Histories {
        let mut expected = Vec::new();
        // 0 to 7 events: none, events only (1, 2), a snapshot last (3, 6), a snapshot and a
        // tail (4, 5, 7); some written in one command of several events.
        for i in 0..24u64 {
            let id = format!("e{i}");
            let events = i % 8;
            if events >= 4 {
                s.send(&id, Op::Many { from: 0, count: 2 }).await;
                for n in 2..events {
                    s.send(&id, Op::Append(n)).await;
                }
            } else {
                for n in 0..events {
                    s.send(&id, Op::Append(n)).await;
                }
            }
            expected.push((id, (0..=events).collect()));
        }
        // An armed timer: its `set` record is after the entity's last snapshot.
        for i in 0..6u64 {
            let id = format!("t{i}");
            for n in 0..4 {
                s.send(&id, Op::Append(n)).await;
            }
            let arm = Op::Arm {
                name: "due".into(),
                n: 100 + i,
                after_ms: 4_000,
            };
            s.send(&id, arm).await;
            expected.push((id, (0..=4).collect()));
        }
        // A dead letter last: its command counts as processed.
        for i in 0..6u64 {
            let id = format!("d{i}");
            for n in 0..(1 + i % 4) {
                s.send(&id, Op::Append(n)).await;
            }
            s.send_raw(&id, b"{not a command".to_vec(), Op::Garbage)
                .await;
            expected.push((id, (0..=(1 + i % 4)).collect()));
        }
        Histories { expected }
    }

    /// Sends each entity its next `Append`, the commands stored before any owner pulls them.
    async fn send_next(&self, s: &mut Scenario) {
        for (id, list) in &self.expected {
            let next = *list.last().expect("at least the next one");
            s.send(id, Op::Append(next)).await;
        }
    }

    /// Waits (bounded) until every entity holds its expected list, read from its owner.
    async fn wait_held(&self, s: &Scenario) {
        for (id, want) in &self.expected {
            let last = std::sync::Mutex::new(None);
            let reached = wait_until(WITHIN, &format!("{id} to hold {want:?}"), || async {
                let read = s.sender.get(id, Duration::from_secs(2)).await;
                // Its timer may have fired meanwhile: its appended numbers are compared.
                let read = read.map(|snapshot| appended(&snapshot.state).collect::<Vec<_>>());
                let done = read.as_ref().is_ok_and(|state| state == want);
                *last.lock().unwrap() = Some(read);
                done
            })
            .await;
            if let Err(e) = reached {
                panic!("{e}; last read: {:?}", last.lock().unwrap());
            }
        }
    }
}

/// The load counters of `system`, summed over its partitions, printed as `what`.
async fn loads(system: &ShardSystem, what: &str) -> Loads {
    let loads = Loads::of(&system.status().await.expect("status"));
    eprintln!("{what}: {loads}");
    loads
}

/// Writes the histories under one system, loads every entity in pull bursts under a second
/// (batched), then loads each alone (a state query, which is never batched) under a third and
/// has it serve again; the journal is checked against everything sent.
async fn batched_loads_equal_loads_alone(mut s: Scenario) {
    let quiet = |s: &Scenario, node: &str| s.config(node).snapshot_on_passivation(false);
    let writer = s.system_with(quiet(&s, "n1")).await;
    let histories = Histories::write(&mut s).await;
    jetshard_tests::wait_drained(&s.js, WITHIN)
        .await
        .expect("the histories written");
    writer.shutdown().await.expect("shut down the writer");

    // Every command waits for the next owner, which pulls them in bursts: batched loads.
    histories.send_next(&mut s).await;
    let batched = s.system_with(quiet(&s, "n2")).await;
    histories.wait_held(&s).await;
    let Loads {
        entities: loads_b,
        batched: batched_b,
        ..
    } = loads(&batched, "in pull bursts").await;
    assert!(
        loads_b >= histories.expected.len() as u64,
        "every entity loaded: {loads_b}"
    );
    assert!(batched_b > 0, "some entities loaded in a batch");
    batched
        .shutdown()
        .await
        .expect("shut down the batched system");

    // Each loaded alone, by its state query: the same lists.
    let alone = s.system_with(quiet(&s, "n3")).await;
    histories.wait_held(&s).await;
    let Loads {
        entities: loads_a,
        batched: batched_a,
        ..
    } = loads(&alone, "alone").await;
    assert_eq!(batched_a, 0, "queries load one entity at a time");
    assert!(
        loads_a >= histories.expected.len() as u64,
        "{loads_a} loads"
    );
    // And serves again after the takeover: each one more.
    let mut next = Histories {
        expected: histories.expected.clone(),
    };
    for (_, list) in &mut next.expected {
        list.push(list.len() as u64);
    }
    next.send_next(&mut s).await;
    next.wait_held(&s).await;
    // Every armed timer fires, once (a load that missed its `set` record would refuse it).
    let last = std::sync::Mutex::new(None);
    let fired = wait_until(WITHIN, "every timer fired", || async {
        let Ok(ledger) = read_ledger(&s.js, None).await else {
            return false;
        };
        let report = check_effects(&ledger, &[]);
        let done = report.pending.is_empty() && report.timers_fired == 6;
        *last.lock().unwrap() = Some(report);
        done
    })
    .await;
    if let Err(e) = fired {
        panic!("{e}: {:?}", last.lock().unwrap());
    }
    let effects = last.lock().unwrap().take().expect("read");
    assert!(effects.violations.is_empty(), "{effects:?}");
    // No command lost, doubled or decided twice.
    s.check().await;
    alone.shutdown().await.expect("shut down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entities_loaded_in_a_batch_hold_what_they_hold_loaded_alone() {
    init_tracing();
    batched_loads_equal_loads_alone(Scenario::single(2).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_entities_loaded_in_a_batch_from_any_replica_hold_what_they_hold_alone() {
    init_tracing();
    batched_loads_equal_loads_alone(Scenario::cluster(2).await).await;
}

/// An entity with one event in all, or one since its snapshot, written by jetshard, loads from
/// its share of the batched read and nothing else: that event is its command's only record and
/// names (`Jetshard-Previous`) a sequence every earlier record of the entity is at or below, so
/// the entity's last records are its whole tail. One with two events since its snapshot reads
/// the first of them by the sequence its last names, one read, not through the journal between
/// them; every entity holds what it should either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entity_with_one_event_since_its_snapshot_needs_no_read_of_its_own() {
    init_tracing();
    // One entity per partition, so that each partition's load counters are one entity's.
    const PARTITIONS: u32 = 3;
    let mut s = Scenario::single(PARTITIONS).await;
    let in_partition = |partition: u32, prefix: &str| {
        (0..)
            .map(|k| format!("{prefix}{k}"))
            .find(|id| jetshard::test_support::fnv1a_32(id.as_bytes()) % PARTITIONS == partition)
            .expect("an id in each partition")
    };
    // The ledger snapshots every 3 events: `one` has 1 event, `after` a snapshot and 1 event
    // after it, `two` a snapshot and 2 events after it; with the reads each load makes beside
    // its share of the batched read (`two`: its first event after the snapshot, read at the
    // sequence its last event names).
    let entities = [("one", 1, 0), ("after", 4, 0), ("two", 5, 1)]
        .into_iter()
        .enumerate()
        .map(|(p, (prefix, events, reads))| (in_partition(p as u32, prefix), events, reads))
        .collect::<Vec<(String, u64, u64)>>();
    let histories = Histories {
        expected: entities
            .iter()
            .map(|(id, events, _)| (id.clone(), (0..=*events).collect()))
            .collect(),
    };
    let quiet = |s: &Scenario, node: &str| s.config(node).snapshot_on_passivation(false);
    let writer = s.system_with(quiet(&s, "n1")).await;
    for (id, events, _) in &entities {
        for n in 0..*events {
            s.send(id, Op::Append(n)).await;
        }
    }
    jetshard_tests::wait_drained(&s.js, WITHIN)
        .await
        .expect("the histories written");
    writer.shutdown().await.expect("shut down the writer");

    // Their next commands wait for the next owner, which loads each from its pull burst; no
    // state query before they are done (a query loads alone).
    histories.send_next(&mut s).await;
    let next = s.system_with(quiet(&s, "n2")).await;
    jetshard_tests::wait_drained(&s.js, WITHIN)
        .await
        .expect("the next commands done");
    let status = next.status().await.expect("status");
    for (partition, (id, _, reads)) in entities.iter().enumerate() {
        let p = status
            .iter()
            .find(|p| p.partition == partition as u32)
            .expect("every partition owned");
        let what = format!(
            "{id}: {} loads, {} batched, {} reads",
            p.entity_loads, p.batched_loads, p.load_reads
        );
        eprintln!("{what}");
        assert_eq!((p.entity_loads, p.batched_loads), (1, 1), "{what}");
        assert_eq!(p.load_reads, 1 + reads, "{what}");
    }
    histories.wait_held(&s).await;
    s.check().await;
    next.shutdown().await.expect("shut down");
}
