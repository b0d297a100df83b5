//! Bounded recovery: entities load lazily from their latest snapshot and the records after it,
//! and the journal can be compacted below the snapshots: for generated command sequences with
//! takeovers, passivation and eviction, and after a compaction, every entity's state equals the
//! fold of its events as the journal holds them (what a full replay gives). Snapshots
//! themselves: `snapshots.rs`; dormant states evicted and reloaded: `dormant.rs`.

use std::time::Duration;

use jetshard::CommandOutcome;
use jetshard::CommandSender;
use jetshard::admin::Admin;
use jetshard_testkit::history::read_journal;
use jetshard_tests::init_tracing;
use jetshard_tests::tally::{
    ASK, Tally, TallyCmd, applied, config, replayed, snapshots_of, start, state_of,
};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config as RunnerConfig, RngAlgorithm, TestRng, TestRunner};

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
            let ids: Vec<String> = want.keys().cloned().collect();
            let found = snapshots_of(&js, &entity_type, 2, &ids).await;
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
        applied(&sender, &id, &command).await;
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
    applied(&sender, "e0", &TallyCmd::Add { key: 0, by: 1 }).await;
    system.shutdown().await.unwrap();
}
