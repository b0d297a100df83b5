//! Bounded recovery: entities load lazily from their latest snapshot and the records after it,
//! snapshots are fenced like events, dormant states are evicted and reloaded, and the journal
//! can be compacted below the snapshots. Every check compares a state against the fold of the
//! entity's events as the journal holds them (what a full replay gives).

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::Context;
use jetshard::admin::Admin;
use jetshard::wire::{
    HDR_COMMAND_SEQ, HDR_EXPECTED_SUBJECT, HDR_EXPECTED_SUBJECT_SEQ, HDR_GENERATION, HDR_ROLLUP,
    HDR_SNAPSHOT_UPTO, HDR_STATE_VERSION, Names,
};
use jetshard::{
    CommandOutcome, CommandSender, Entity, EntityId, ShardConfig, ShardSystem, Snapshots,
};
use jetshard_testkit::history::{Record, read_journal};
use jetshard_testkit::wait_until;
use jetshard_tests::{init_tracing, start_owning};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config as RunnerConfig, RngAlgorithm, TestRng, TestRunner};
use serde::{Deserialize, Serialize};

const ASK: Duration = Duration::from_secs(10);

/// A test entity whose state shows any lost, doubled or reordered event: sums per key, a count
/// and an order-sensitive trail of every event.
struct Tally;

#[derive(Debug, Clone, Serialize, Deserialize)]
enum TallyCmd {
    Add {
        key: u8,
        by: u32,
    },
    /// Several events, one atomic write.
    AddMany {
        by: Vec<u32>,
    },
    Refuse,
    /// Rejected with the state as JSON: the test's window on it.
    Get,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum TallyEvt {
    Added { key: u8, by: u32 },
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct TallyState {
    sums: BTreeMap<u8, u64>,
    events: u64,
    trail: u64,
}

impl Entity for Tally {
    type Command = TallyCmd;
    type Event = TallyEvt;
    type State = TallyState;
    type Rejection = String;

    fn decide(state: &TallyState, command: TallyCmd) -> Result<Vec<TallyEvt>, String> {
        match command {
            TallyCmd::Add { key, by } => Ok(vec![TallyEvt::Added { key, by }]),
            TallyCmd::AddMany { by } => Ok(by
                .into_iter()
                .enumerate()
                .map(|(i, by)| TallyEvt::Added { key: i as u8, by })
                .collect()),
            TallyCmd::Refuse => Err("refused".to_owned()),
            TallyCmd::Get => Err(serde_json::to_string(state).unwrap()),
        }
    }

    fn apply(state: &mut TallyState, event: &TallyEvt) {
        let TallyEvt::Added { key, by } = event;
        *state.sums.entry(*key).or_default() += u64::from(*by);
        state.events += 1;
        state.trail = state
            .trail
            .wrapping_mul(1_000_003)
            .wrapping_add(u64::from(*key) * 100_000 + u64::from(*by));
    }
    // No `snapshots()`: jetshard's default (on, `Snapshots::serde(1)`), which every test here
    // relies on.
}

/// `Tally` with snapshots opted out.
struct UnsnapshottedTally;

impl Entity for UnsnapshottedTally {
    type Command = TallyCmd;
    type Event = TallyEvt;
    type State = TallyState;
    type Rejection = String;

    fn decide(state: &TallyState, command: TallyCmd) -> Result<Vec<TallyEvt>, String> {
        Tally::decide(state, command)
    }

    fn apply(state: &mut TallyState, event: &TallyEvt) {
        Tally::apply(state, event);
    }

    fn snapshots() -> Option<Snapshots<TallyState>> {
        None
    }
}

/// How many of `ids` have a snapshot in `entity_type`'s journal.
async fn snapshots_of(js: &Context, entity_type: &str, partitions: u32, ids: &[String]) -> usize {
    let names = Names::new(entity_type);
    let journal = js.get_stream(names.journal_stream()).await.unwrap();
    let mut found = 0;
    for id in ids {
        let id = EntityId::new(id).unwrap();
        let subject = names.snapshot_subject(jetshard::partition_of(&id, partitions), &id);
        found += usize::from(
            journal
                .get_last_raw_message_by_subject(&subject)
                .await
                .is_ok(),
        );
    }
    found
}

/// Snapshots are on by default: an entity type that says nothing about them (`Tally`) leaves a
/// snapshot of every entity that wrote events when its owner stops (the release), with no
/// periodic ones configured; one that opts out leaves none, and both load the same states
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_on_by_default_and_an_opted_out_type_writes_none() {
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    let ids: Vec<String> = (0..6).map(|i| format!("e{i}")).collect();
    for (entity_type, default) in [("tally", true), ("plain", false)] {
        let config = config(entity_type, 2).snapshot_every(0).build().unwrap();
        let add = |i: usize| TallyCmd::Add {
            key: (i % 3) as u8,
            by: i as u32,
        };
        let system = if default {
            let sender = CommandSender::<Tally>::new(client.clone(), &config);
            let system = start(&client, &config).await;
            for (i, id) in ids.iter().enumerate() {
                let outcome = sender.request_outcome(id, &add(i), ASK).await.unwrap();
                assert!(
                    matches!(outcome, CommandOutcome::Applied { .. }),
                    "{outcome:?}"
                );
            }
            system
        } else {
            let sender = CommandSender::<UnsnapshottedTally>::new(client.clone(), &config);
            let system = ShardSystem::start::<UnsnapshottedTally>(client.clone(), config.clone())
                .await
                .unwrap();
            for (i, id) in ids.iter().enumerate() {
                let outcome = sender.request_outcome(id, &add(i), ASK).await.unwrap();
                assert!(
                    matches!(outcome, CommandOutcome::Applied { .. }),
                    "{outcome:?}"
                );
            }
            system
        };
        system.shutdown().await.unwrap();
        let found = snapshots_of(&js, entity_type, 2, &ids).await;
        let want = if default { ids.len() } else { 0 };
        assert_eq!(found, want, "{entity_type}: snapshots after the release");
    }
    // The default type's next owner loads from the snapshots the same states.
    let config = config("tally", 2).build().unwrap();
    let sender = CommandSender::<Tally>::new(client.clone(), &config);
    let want = replayed(&js, "tally").await;
    let system = start(&client, &config).await;
    for id in &ids {
        assert_eq!(state_of(&sender, id).await, want[id], "{id}");
    }
    system.shutdown().await.unwrap();
}

fn config(entity_type: &str, partitions: u32) -> jetshard::ShardConfigBuilder {
    jetshard_tests::config(entity_type, partitions, "n1")
        .codec(jetshard::Codec::Json)
        .retry_delay(Duration::from_millis(50))
}

/// The entity's state as its actor holds it (loaded however the owner loads it).
async fn state_of(sender: &CommandSender<Tally>, id: &str) -> TallyState {
    match sender
        .request_outcome(id, &TallyCmd::Get, ASK)
        .await
        .unwrap()
    {
        CommandOutcome::Rejected { reason, .. } => serde_json::from_str(&reason).unwrap(),
        other => panic!("Get of {id}: {other:?}"),
    }
}

/// Every entity's state as a full replay of the journal gives it: its events, in order.
async fn replayed(js: &Context, entity_type: &str) -> BTreeMap<String, TallyState> {
    let mut states: BTreeMap<String, TallyState> = BTreeMap::new();
    for record in read_journal(js, entity_type).await.unwrap() {
        if let Record::Event { entity, event, .. } = record {
            let event: TallyEvt = serde_json::from_slice(&event).unwrap();
            Tally::apply(states.entry(entity).or_default(), &event);
        }
    }
    states
}

async fn start(client: &async_nats::Client, config: &ShardConfig) -> ShardSystem {
    let sender = CommandSender::<Tally>::new(client.clone(), config);
    start_owning::<Tally>(client, config, async || {
        // A command wakes every partition's consumer: the pin is given with a delivery.
        for p in 0..config.partitions() {
            let id = jetshard_tests::id_in("wake", p, config.partitions());
            sender.send(&id, &TallyCmd::Refuse).await.unwrap();
        }
    })
    .await
}

/// One generated case: commands to a few entities, with restarts between them.
#[derive(Debug, Clone)]
struct Case {
    snapshot_every: u32,
    passivate_ms: u64,
    max_dormant: usize,
    steps: Vec<Step>,
}

#[derive(Debug, Clone)]
enum Step {
    Command(u8, TallyCmd),
    Restart,
}

fn case_strategy() -> impl Strategy<Value = Case> {
    use proptest::prelude::*;
    let command = prop_oneof![
        6 => (0u8..3, 1u32..50).prop_map(|(key, by)| TallyCmd::Add { key, by }),
        2 => proptest::collection::vec(1u32..9, 2..5).prop_map(|by| TallyCmd::AddMany { by }),
        1 => Just(TallyCmd::Refuse),
    ];
    let step = prop_oneof![
        12 => (0u8..4, command).prop_map(|(e, c)| Step::Command(e, c)),
        1 => Just(Step::Restart),
    ];
    (
        0u32..5,
        prop_oneof![Just(150u64), Just(30_000u64)],
        1usize..4,
        proptest::collection::vec(step, 15..40),
    )
        .prop_map(|(snapshot_every, passivate_ms, max_dormant, steps)| Case {
            snapshot_every,
            passivate_ms,
            max_dormant,
            steps,
        })
}

/// For random command sequences, with snapshots every 0 (none but on passivation) to 4
/// events, restarts (each one a takeover that loads entities from snapshot and tail) and
/// passivation with a small dormant budget (eviction), every entity's state equals the fold of
/// its whole journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_from_a_snapshot_and_its_tail_equals_the_full_replay() {
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    let seed = std::env::var("JETSHARD_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(12);
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        RunnerConfig::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    );
    let cases = 5;
    for n in 0..cases {
        let case = case_strategy().new_tree(&mut runner).unwrap().current();
        let entity_type = format!("tally-{n}");
        let config = config(&entity_type, 2)
            .snapshot_every(case.snapshot_every)
            .passivate_after(Duration::from_millis(case.passivate_ms))
            .max_dormant_entities(case.max_dormant)
            .build()
            .unwrap();
        let sender = CommandSender::<Tally>::new(client.clone(), &config);
        let mut system = start(&client, &config).await;
        for step in &case.steps {
            match step {
                Step::Restart => {
                    system.shutdown().await.unwrap();
                    system = start(&client, &config).await;
                }
                Step::Command(e, command) => {
                    let outcome = sender
                        .request_outcome(&format!("e{e}"), command, ASK)
                        .await
                        .unwrap();
                    assert!(
                        matches!(
                            outcome,
                            CommandOutcome::Applied { .. } | CommandOutcome::Rejected { .. }
                        ),
                        "seed {seed} case {n} ({case:?}): {outcome:?}"
                    );
                }
            }
        }
        // Live (or dormant, or evicted and reloaded) states, then loaded after a takeover.
        let want = replayed(&js, &entity_type).await;
        for round in ["live", "after a takeover"] {
            for (id, state) in &want {
                let got = state_of(&sender, id).await;
                assert_eq!(&got, state, "seed {seed} case {n} {round}, {id}: {case:?}");
            }
            system.shutdown().await.unwrap();
            system = start(&client, &config).await;
        }
        // Snapshots were written: by the interval, or when the entities were passivated.
        if case.snapshot_every > 0 || case.passivate_ms < 1000 {
            let journal = js
                .get_stream(Names::new(&entity_type).journal_stream())
                .await
                .unwrap();
            let names = Names::new(&entity_type);
            let mut found = 0;
            for id in want.keys() {
                let id = EntityId::new(id).unwrap();
                let p = jetshard::partition_of(&id, 2);
                let subject = names.snapshot_subject(p, &id);
                found += usize::from(
                    journal
                        .get_last_raw_message_by_subject(&subject)
                        .await
                        .is_ok(),
                );
            }
            let busy = want
                .values()
                .filter(|s| s.events >= u64::from(case.snapshot_every.max(1)))
                .count();
            assert!(
                found >= busy.min(1),
                "seed {seed} case {n}: {found} snapshots for {busy} entities"
            );
        }
        system.shutdown().await.unwrap();
    }
}

/// Publishes a snapshot as an owner of the fence record at `fence_seq` would.
async fn publish_snapshot(
    js: &Context,
    subject: &str,
    fence_subject: &str,
    fence_seq: u64,
    body: &str,
) -> Result<u64, async_nats::jetstream::context::PublishError> {
    let mut headers = HeaderMap::new();
    headers.insert(HDR_GENERATION, "1");
    headers.insert(HDR_COMMAND_SEQ, "1");
    headers.insert(HDR_SNAPSHOT_UPTO, "0");
    headers.insert(HDR_STATE_VERSION, "1");
    headers.insert(HDR_ROLLUP, "sub");
    headers.insert(HDR_EXPECTED_SUBJECT_SEQ, fence_seq.to_string());
    headers.insert(HDR_EXPECTED_SUBJECT, fence_subject);
    let ack = js
        .publish_with_headers(subject.to_owned(), headers, body.to_owned().into())
        .await?
        .await?;
    Ok(ack.sequence)
}

/// A snapshot is fenced as events are: once a newer fence record exists, the server refuses a
/// stale owner's snapshot (and it rolls nothing up). A current owner's snapshot rolls up the
/// entity's previous one, so each entity has one snapshot in the journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owners_snapshot_is_rejected_and_a_current_one_rolls_up_the_last() {
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    let config = config("tally", 1).build().unwrap();
    jetshard_tests::provision(client.clone(), &config).await;
    let names = config.names();
    let fence_subject = names.fence_subject(0);
    let snapshot = names.snapshot_subject(0, &EntityId::new("a").unwrap());
    let fence = |generation: u64| {
        let mut headers = HeaderMap::new();
        headers.insert(HDR_GENERATION, generation.to_string());
        let body = serde_json::to_vec(&jetshard::FenceRecord::new(0, generation, "n")).unwrap();
        (headers, body)
    };
    let (headers, body) = fence(1u64);
    let first = js
        .publish_with_headers(fence_subject.clone(), headers, body.into())
        .await
        .unwrap()
        .await
        .unwrap()
        .sequence;
    let one = publish_snapshot(&js, &snapshot, &fence_subject, first, "{}")
        .await
        .unwrap();
    let two = publish_snapshot(&js, &snapshot, &fence_subject, first, "{}")
        .await
        .unwrap();
    let journal = js.get_stream(names.journal_stream()).await.unwrap();
    // Rolled up: the first is gone.
    assert!(journal.get_raw_message(one).await.is_err());
    assert_eq!(
        journal
            .get_last_raw_message_by_subject(&snapshot)
            .await
            .unwrap()
            .sequence,
        two
    );

    // Generation 2 claims the partition: generation 1's snapshot is refused (10071).
    let (headers, body) = fence(2u64);
    js.publish_with_headers(fence_subject.clone(), headers, body.into())
        .await
        .unwrap()
        .await
        .unwrap();
    let stale = publish_snapshot(&js, &snapshot, &fence_subject, first, "{}").await;
    let error = stale.expect_err("a stale owner's snapshot must be refused");
    assert_eq!(
        error.kind(),
        async_nats::jetstream::context::PublishErrorKind::WrongLastSequence,
        "{error}"
    );
    // Nothing was rolled up by the refused write.
    assert_eq!(
        journal
            .get_last_raw_message_by_subject(&snapshot)
            .await
            .unwrap()
            .sequence,
        two
    );
}

/// A snapshot that does not read back (garbage, or another state version) is ignored: the
/// entity is loaded from its events, with the same state and the same command high-water mark,
/// and the partition, acquired by a new process, serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_snapshot_falls_back_to_the_events() {
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    let config = config("tally", 1).snapshot_every(2).build().unwrap();
    let sender = CommandSender::<Tally>::new(client.clone(), &config);
    let system = start(&client, &config).await;
    for by in 1..=5 {
        let outcome = sender
            .request_outcome("a", &TallyCmd::Add { key: 1, by }, ASK)
            .await
            .unwrap();
        assert!(
            matches!(outcome, CommandOutcome::Applied { .. }),
            "{outcome:?}"
        );
    }
    system.shutdown().await.unwrap();
    let want = replayed(&js, "tally").await["a"].clone();
    assert_eq!(want.events, 5);

    let names = config.names();
    let subject = names.snapshot_subject(0, &EntityId::new("a").unwrap());
    let bad: [(&str, &str); 3] = [
        // Not JSON of the state at all.
        ("1", "\u{0}\u{ff}garbage"),
        // Valid JSON, another shape.
        ("1", "[1,2,3]"),
        // A state of another version (as after a change of the state type).
        ("2", r#"{"sums":{},"events":0,"trail":0}"#),
    ];
    for (version, body) in bad {
        let mut headers = HeaderMap::new();
        headers.insert(HDR_GENERATION, "9");
        // Claims to cover far more than there is: trusted, it would hide every event.
        headers.insert(HDR_COMMAND_SEQ, "1000000");
        headers.insert(HDR_SNAPSHOT_UPTO, "1000000");
        headers.insert(HDR_STATE_VERSION, version);
        js.publish_with_headers(subject.clone(), headers, body.to_owned().into())
            .await
            .unwrap()
            .await
            .unwrap();
        // A new process takes the partition and loads "a" from its events.
        let system = start(&client, &config).await;
        assert_eq!(state_of(&sender, "a").await, want, "snapshot {body:?}");
        let outcome = sender
            .request_outcome("b", &TallyCmd::Add { key: 0, by: 1 }, ASK)
            .await
            .unwrap();
        assert!(
            matches!(outcome, CommandOutcome::Applied { .. }),
            "{outcome:?}"
        );
        system.shutdown().await.unwrap();
    }
    // "a" goes on from its true state, and its next snapshot is a good one again.
    let system = start(&client, &config).await;
    for by in [7, 8] {
        let outcome = sender
            .request_outcome("a", &TallyCmd::Add { key: 2, by }, ASK)
            .await
            .unwrap();
        assert!(
            matches!(outcome, CommandOutcome::Applied { .. }),
            "{outcome:?}"
        );
    }
    system.shutdown().await.unwrap();
    let want = replayed(&js, "tally").await["a"].clone();
    assert_eq!(want.events, 7);
    let system = start(&client, &config).await;
    assert_eq!(state_of(&sender, "a").await, want);
    system.shutdown().await.unwrap();
}

/// With a dormant budget of 3, passivated states beyond it are dropped and each entity's next
/// command reloads it from the journal, with the same state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_state_reloads_the_same() {
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    let config = config("tally", 1)
        .snapshot_every(0)
        .passivate_after(Duration::from_millis(200))
        .max_dormant_entities(3)
        .build()
        .unwrap();
    let sender = CommandSender::<Tally>::new(client.clone(), &config);
    let system = start(&client, &config).await;
    let ids: Vec<String> = (0..12).map(|i| format!("e{i}")).collect();
    for round in 0..3u32 {
        for (i, id) in ids.iter().enumerate() {
            let command = TallyCmd::Add {
                key: round as u8,
                by: i as u32 + round,
            };
            let outcome = sender.request_outcome(id, &command, ASK).await.unwrap();
            assert!(
                matches!(outcome, CommandOutcome::Applied { .. }),
                "{outcome:?}"
            );
        }
        // Every actor passivated; at most the budget kept.
        wait_until(Duration::from_secs(10), "all passivated", || async {
            let status = system.status().await.unwrap();
            status[0].resident_entities == 0
        })
        .await
        .unwrap();
        let status = system.status().await.unwrap();
        assert!(status[0].dormant_entities <= 3, "{status:?}");
    }
    let want = replayed(&js, "tally").await;
    for id in &ids {
        assert_eq!(state_of(&sender, id).await, want[id], "{id}");
    }
    system.shutdown().await.unwrap();
}

/// With a dormant budget of 1,024 bytes (and the default budget of 100,000 entities), the
/// passivated states beyond it in bytes (about 70 each, kept encoded) are dropped; each entity's next command
/// reloads it from the journal, with the same state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dormant_budget_in_bytes_evicts() {
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    const BUDGET: usize = 1024;
    let config = config("tally", 1)
        .passivate_after(Duration::from_millis(200))
        .max_dormant_bytes(BUDGET)
        .build()
        .unwrap();
    let sender = CommandSender::<Tally>::new(client.clone(), &config);
    let system = start(&client, &config).await;
    const ENTITIES: usize = 30;
    let ids: Vec<String> = (0..ENTITIES).map(|i| format!("e{i}")).collect();
    for round in 0..3u32 {
        for (i, id) in ids.iter().enumerate() {
            let command = TallyCmd::Add {
                key: round as u8,
                by: i as u32 + round,
            };
            let outcome = sender.request_outcome(id, &command, ASK).await.unwrap();
            assert!(
                matches!(outcome, CommandOutcome::Applied { .. }),
                "{outcome:?}"
            );
        }
        // No actor left, and a state back (the resident count drops when the passivation is
        // asked for; each state arrives after, and is kept within the budget as it does).
        wait_until(Duration::from_secs(10), "all passivated", || async {
            let status = system.status().await.unwrap();
            status[0].resident_entities == 0 && status[0].dormant_entities > 0
        })
        .await
        .unwrap();
        // Some kept, within the bytes; not all thirty (far under the entity budget).
        let status = system.status().await.unwrap();
        let partition = &status[0];
        assert!(partition.dormant_bytes <= BUDGET, "{partition:?}");
        assert!(
            (1..ENTITIES).contains(&partition.dormant_entities),
            "{partition:?}"
        );
        assert!(partition.dormant_bytes > 0, "{partition:?}");
    }
    let want = replayed(&js, "tally").await;
    for id in &ids {
        assert_eq!(state_of(&sender, id).await, want[id], "{id}");
    }
    system.shutdown().await.unwrap();
}

/// Compaction removes every event its entity's snapshot covers; a takeover after it loads the
/// same states (from the snapshots and what is left), remembers which commands are done, and
/// the entities go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_then_a_takeover_gives_the_same_state() {
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    let config = config("tally", 2).snapshot_every(4).build().unwrap();
    let sender = CommandSender::<Tally>::new(client.clone(), &config);
    let system = start(&client, &config).await;
    for i in 0..30u32 {
        let id = format!("e{}", i % 5);
        let command = if i % 7 == 3 {
            TallyCmd::AddMany { by: vec![i, i + 1] }
        } else {
            TallyCmd::Add {
                key: (i % 3) as u8,
                by: i,
            }
        };
        let outcome = sender.request_outcome(&id, &command, ASK).await.unwrap();
        assert!(
            matches!(outcome, CommandOutcome::Applied { .. }),
            "{outcome:?}"
        );
    }
    system.shutdown().await.unwrap();
    let want = replayed(&js, "tally").await;
    let events_before = read_journal(&js, "tally").await.unwrap().len();

    let compacted = Admin::new(client.clone(), "tally")
        .compact(None)
        .await
        .unwrap();
    assert!(compacted.snapshots >= 5, "{compacted:?}");
    assert!(compacted.purged > 0, "{compacted:?}");
    let events_after = read_journal(&js, "tally").await.unwrap().len();
    assert_eq!(events_before - events_after, compacted.purged as usize);

    let system = start(&client, &config).await;
    for (id, state) in &want {
        assert_eq!(&state_of(&sender, id).await, state, "{id}");
    }
    let outcome = sender
        .request_outcome("e0", &TallyCmd::Add { key: 0, by: 1 }, ASK)
        .await
        .unwrap();
    assert!(
        matches!(outcome, CommandOutcome::Applied { .. }),
        "{outcome:?}"
    );
    system.shutdown().await.unwrap();
}

/// What an entity's load leans on (`entity_actor/load.rs`): the last message on a wildcard
/// filter (`<t>.*.<p>.<id>`, every record kind of one entity) comes back whole, by direct get
/// (the filter is sent in the request's subject) and through the stream leader's API alike, and
/// "none" is told apart from a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_record_of_an_entity_of_any_kind_is_one_read_direct_or_through_the_api() {
    use async_nats::jetstream::stream::{Config, DirectGetErrorKind, LastRawMessageErrorKind};
    init_tracing();
    let server = jetshard_testkit::NatsServer::start()
        .await
        .expect("nats-server");
    let js = async_nats::jetstream::new(server.connect().await.expect("connect"));
    let stream = js
        .create_stream(Config {
            name: "FACT".into(),
            subjects: vec!["f.>".into()],
            allow_direct: true,
            ..Default::default()
        })
        .await
        .expect("stream");
    for subject in [
        "f.evt.1.a",
        "f.evt.1.b",
        "f.snap.1.a",
        "f.tmr.1.b",
        "f.evt.2.a",
    ] {
        js.publish(subject, subject.as_bytes().to_vec().into())
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    for (filter, subject, seq) in [("f.*.1.a", "f.snap.1.a", 3), ("f.*.1.b", "f.tmr.1.b", 4)] {
        let direct = stream
            .direct_get_last_for_subject(filter)
            .await
            .expect("a direct get on a wildcard");
        assert_eq!((direct.subject.as_str(), direct.sequence), (subject, seq));
        assert_eq!(direct.payload.as_ref(), subject.as_bytes());
        let api = stream
            .get_last_raw_message_by_subject(filter)
            .await
            .expect("an API get on a wildcard");
        assert_eq!((api.subject.as_str(), api.sequence), (subject, seq));
    }
    let none = stream.direct_get_last_for_subject("f.*.1.c").await;
    assert!(none.is_err_and(|e| e.kind() == DirectGetErrorKind::NotFound));
    let none = stream.get_last_raw_message_by_subject("f.*.1.c").await;
    assert!(none.is_err_and(|e| e.kind() == LastRawMessageErrorKind::NoMessageFound));
}
