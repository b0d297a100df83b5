//! Balancing: processes that join share the partitions evenly, under load, without losing or
//! reordering anything.

use std::time::Duration;

use jetshard::{OwnershipChange, ShardSystem};
use jetshard_testkit::wait_until;
use jetshard_tests::{Scenario, id_in, init_tracing};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_that_join_get_an_even_share_of_the_partitions() {
    init_tracing();
    let mut s = Scenario::single(6)
        .await
        .pin_ttl(Duration::from_millis(500));
    let entities: Vec<String> = (0..30).map(|e| format!("e{e}")).collect();

    let a = s.node("a").await;
    s.append_to_all(&entities, 0).await;
    s.wait_owns_all(&a).await;
    let b = s.node("b").await;
    let c = s.node("c").await;

    // Load goes on while the partitions move.
    let mut n = 1;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    loop {
        s.append_to_all(&entities, n).await;
        n += 1;
        let shares = [a.owned().len(), b.owned().len(), c.owned().len()];
        if shares == [2, 2, 2] && n > 5 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not balanced after 40 s: {shares:?}"
        );
        // Deliberate: the load's pace between rounds, not a wait for a condition.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every entity holds 0..n, each once, in order, under its partition's generation.
    s.check_within(Duration::from_secs(30)).await;
}

/// A partition handed off goes to the process that lacks partitions, not to another one that
/// has its share (which would hand it off again): a newcomer's share moves once per partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_gets_its_share_with_one_move_per_partition() {
    init_tracing();
    let mut s = Scenario::single(6)
        .await
        .pin_ttl(Duration::from_millis(500));
    let entities: Vec<String> = (0..6).map(|p| id_in("e", p, 6)).collect();
    let a = s.system("a").await;
    s.append_to_all(&entities, 0).await;
    wait_until(
        Duration::from_secs(20),
        "a to own every partition",
        || async { owned(&a).await == 6 },
    )
    .await
    .unwrap();
    let b = s.system("b").await;
    // A partition is pinned, and so owned, only once a command comes: load goes on.
    let mut n = 1;
    while [owned(&a).await, owned(&b).await] != [3, 3] {
        n = load_round(&mut s, &entities, n, "a and b to own 3 each").await;
    }

    let mut seen = vec![a.ownership_events(), b.ownership_events()];
    let c = s.system("c").await;
    seen.push(c.ownership_events());
    while [owned(&a).await, owned(&b).await, owned(&c).await] != [2, 2, 2] {
        n = load_round(&mut s, &entities, n, "a, b and c to own 2 each").await;
    }
    let mut acquired = [0u32; 6];
    for events in &mut seen {
        while let Ok(event) = events.try_recv() {
            if event.change == OwnershipChange::Acquired {
                acquired[event.partition as usize] += 1;
            }
        }
    }
    assert!(
        acquired.iter().all(|n| *n <= 1),
        "acquisitions per partition since c started: {acquired:?}"
    );
    assert_eq!(acquired.iter().sum::<u32>(), 2, "{acquired:?}");
    s.check_within(Duration::from_secs(30)).await;
}

/// Sends `Append(n)` to every entity and paces the load (100 ms); panics once `n` passes the
/// 30 s such rounds take at most, saying what did not happen. Returns the next `n`.
async fn load_round(s: &mut Scenario, entities: &[String], n: u64, what: &str) -> u64 {
    assert!(n < 300, "no {what} after 300 rounds of load");
    s.append_to_all(entities, n).await;
    // Deliberate: the load's pace between rounds, not a wait for a condition.
    tokio::time::sleep(Duration::from_millis(100)).await;
    n + 1
}

/// Partitions a shard system owns, by its own account.
async fn owned(system: &ShardSystem) -> usize {
    system.status().await.map_or(0, |partitions| {
        partitions.iter().filter(|p| p.generation.is_some()).count()
    })
}

/// A partition is owned only while it has a command to deliver: one handed off with none
/// waiting is woken (a wake-up command), so the newcomer takes it at once and answers queries
/// for its entities, with no load at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_partition_handed_off_is_taken_by_the_newcomer_without_load() {
    init_tracing();
    let mut s = Scenario::single(4)
        .await
        .pin_ttl(Duration::from_millis(500));
    let entities: Vec<String> = (0..12).map(|e| format!("e{e}")).collect();
    let a = s.node("a").await;
    s.append_to_all(&entities, 0).await;
    s.wait_owns_all(&a).await;
    s.check().await;
    // No command from here on.
    let b = s.node("b").await;
    wait_until(Duration::from_secs(30), "b to own its share", || async {
        b.owned().len() == 2 && a.owned().len() == 2
    })
    .await
    .unwrap();
    // Every entity is answered by its owner, whichever process that is.
    for entity in &entities {
        let state = s
            .sender
            .get(entity, Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("{entity} not answered: {e}"))
            .state;
        assert_eq!(state, [0], "{entity}");
    }
}
