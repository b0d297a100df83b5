//! Fencing: a stalled owner whose pin moved resumes with buffered commands, and none of its
//! writes lands; per-entity order holds across the takeover.

use std::time::Duration;

use jetshard_testkit::wait_until;
use jetshard_tests::{Scenario, init_tracing};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_cannot_write_after_takeover_and_entity_order_survives() {
    init_tracing();
    let mut s = Scenario::single(2)
        .await
        .ack_wait(Duration::from_millis(4000));
    let entities: Vec<String> = (0..4).map(|e| format!("x{e}")).collect();

    // `a` is slow (20 ms per decision), so it holds many delivered, unacknowledged commands.
    let a = s.node_with("a", &[("LEDGER_DECIDE_DELAY_MS", "20")]).await;
    s.append_to_all(&entities, 0).await;
    s.wait_owns_all(&a).await;
    let b = s.node("b").await;

    // A burst `a` receives, then `a` freezes with it in hand.
    for n in 1..10 {
        s.append_to_all(&entities, n).await;
    }
    a.pause();
    // Part of the fault, not a wait for a condition: the pull requests `a` left open at the
    // server expire (after a third of the pin TTL), so what follows is not delivered to `a`.
    tokio::time::sleep(s.node_spec(&[]).pin_ttl / 2).await;
    // More commands for the same entities while `a` is frozen: `b` takes over and gets these
    // at once, while `a`'s unacknowledged ones come back only after the ack wait.
    for n in 10..20 {
        s.append_to_all(&entities, n).await;
    }
    s.wait_owns_all(&b).await;

    // `a` thaws with commands in hand: its writes are fenced and it steps down.
    a.resume();
    wait_until(Duration::from_secs(20), "a stepped down", || async {
        a.owned().is_empty()
    })
    .await
    .unwrap();

    // Every entity holds 0..20, each once, in order; no write of a stale generation landed.
    s.check().await;
    let released: Vec<_> = a
        .lines()
        .into_iter()
        .filter(|l| l.what == "RELEASED")
        .collect();
    assert_eq!(released.len(), 2, "{released:?}");
}
