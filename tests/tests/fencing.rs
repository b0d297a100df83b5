//! Fencing: a stalled owner whose pin moved resumes with buffered commands, and none of its
//! writes lands; per-entity order holds across the takeover.

use std::time::Duration;

use jetshard_testkit::wait_until;
use jetshard_tests::model::Op;
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
    let pins = s.pins().await;
    a.pause();
    // The server unpins `a` (no pull from it for the pin TTL), so what follows is not
    // delivered to `a`.
    s.wait_unpinned(&pins).await;
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
    // Its pull loop, asking the server under the old pin, usually learns first that the pin is
    // gone; its fenced writes are the guarantee, whichever comes first.
    for line in &released {
        assert!(
            STALE_OWNER_REASONS.iter().any(|r| line.text.ends_with(r)),
            "released for another reason than a stale owner's: {line:?}"
        );
    }
}

/// Why a stale owner steps down (`OwnershipChange::Released`'s reason, as the node prints it).
const STALE_OWNER_REASONS: [&str; 3] = [
    "pin lost",
    "pin moved",
    "fenced: a newer generation owns the partition",
];

/// A claim of the partition's next generation made elsewhere while the owner keeps its pin:
/// nothing tells the owner but the server, refusing its next write (the compare-and-set on the
/// partition's fence record). It steps down as fenced, claims the partition again above the
/// claim, and the command is applied once, under its new generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_whose_generation_was_claimed_elsewhere_is_fenced_on_its_next_write() {
    init_tracing();
    let mut s = Scenario::single(1).await;
    let a = s.node("a").await;
    s.send("x", Op::Push(0)).await;
    s.wait_owns_all(&a).await;
    s.wait_holds("x", &[0]).await;

    let names = s.config("a").build().unwrap().names();
    let (late, _) = jetshard_tests::fence::claim_elsewhere(&s.js, &names, 0).await;
    s.send("x", Op::Push(1)).await;
    s.wait_holds("x", &[0, 1]).await;

    let lines = a.lines();
    let released: Vec<_> = lines.iter().filter(|l| l.what == "RELEASED").collect();
    assert_eq!(released.len(), 1, "{released:?}");
    assert!(
        released[0].text.ends_with(STALE_OWNER_REASONS[2]),
        "not released as fenced: {released:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.what == "ACQUIRED" && l.generation > late),
        "not acquired again above the claim of generation {late}: {lines:?}"
    );
    s.check().await;
}
