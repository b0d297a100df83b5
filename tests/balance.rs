//! Balancing: processes that join share the partitions evenly, under load, without losing or
//! reordering anything.

use std::time::Duration;

use jetshard_tests::{Scenario, init_tracing};

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
