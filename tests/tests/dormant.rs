//! Dormant states: past the dormant budget (in entities, or in bytes), passivated states are
//! dropped, and each entity's next command reloads it from the journal with the same state.

use std::time::Duration;

use jetshard::CommandSender;
use jetshard_testkit::wait_until;
use jetshard_tests::init_tracing;
use jetshard_tests::tally::{Tally, TallyCmd, applied, config, replayed, start, state_of};

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
        add_to_each(&sender, &ids, round).await;
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
        add_to_each(&sender, &ids, round).await;
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

/// Round `round` of commands: one `Add` to each of `ids`, each applied.
async fn add_to_each(sender: &CommandSender<Tally>, ids: &[String], round: u32) {
    for (i, id) in ids.iter().enumerate() {
        let command = TallyCmd::Add {
            key: round as u8,
            by: i as u32 + round,
        };
        applied(sender, id, &command).await;
    }
}
