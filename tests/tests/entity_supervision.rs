//! Entity actors under their owner: a panicking handler is retried, then dead-lettered, without
//! holding up other entities; a payload that does not decode is terminated at once; idle
//! entities are passivated and revived from the journal; a command's several events are
//! written all together.

use std::time::Duration;

use jetshard::admin::Admin;
use jetshard_testkit::wait_until;
use jetshard_tests::model::Op;
use jetshard_tests::{Scenario, counts, init_tracing};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_is_retried_then_dead_lettered_while_other_entities_go_on() {
    init_tracing();
    let mut s = Scenario::single(1).await;
    let system = s.system_with(s.config("n1").max_deliver(3)).await;

    s.send("bad", Op::Panic).await;
    // Held back behind the failing command, then applied once it is given up.
    s.send("bad", Op::Append(0)).await;
    for n in 0..20 {
        s.send("good", Op::Append(n)).await;
    }
    wait_until(
        Duration::from_secs(10),
        "good applied while bad retries",
        || async { counts(&system).await.applied >= 20 },
    )
    .await
    .unwrap();
    wait_until(
        Duration::from_secs(20),
        "bad dead-lettered and its next command applied",
        || async {
            let c = counts(&system).await;
            c.applied == 21 && c.dead_lettered == 1
        },
    )
    .await
    .unwrap();
    assert_eq!(
        counts(&system).await.rejected,
        0,
        "no command rejected: order kept behind the retried one"
    );

    let letters = Admin::new(s.client.clone(), "ledger")
        .dead_letters()
        .await
        .unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].entity, "bad");
    assert_eq!(letters[0].deliveries, 3);
    assert!(
        letters[0].reason.contains("panicked"),
        "{}",
        letters[0].reason
    );
    // `bad`: the panic dead-lettered, then `Appended { n: 0 }`; `good`: 0..20.
    s.check().await;
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_payload_is_terminated_and_does_not_block_its_entity() {
    init_tracing();
    let mut s = Scenario::single(2).await;
    let system = s.system("n1").await;

    s.send_raw("p", b"{not a command".to_vec(), Op::Garbage)
        .await;
    s.send("p", Op::Append(0)).await;
    wait_until(
        Duration::from_secs(10),
        "poison terminated, next applied",
        || async {
            let c = counts(&system).await;
            c.applied == 1 && c.dead_lettered == 1
        },
    )
    .await
    .unwrap();
    let letters = Admin::new(s.client.clone(), "ledger")
        .dead_letters()
        .await
        .unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        letters[0].deliveries, 1,
        "terminated at its first delivery, not retried"
    );
    assert_eq!(&letters[0].payload[..], b"{not a command");
    assert!(
        letters[0].reason.starts_with("malformed"),
        "{}",
        letters[0].reason
    );
    // Nothing is left in the work queue: the poison is terminated, not parked.
    s.check_within(Duration::from_secs(5)).await;
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_entities_are_passivated_and_come_back_with_their_state() {
    init_tracing();
    let mut s = Scenario::single(2).await;
    let system = s
        .system_with(s.config("n1").passivate_after(Duration::from_millis(300)))
        .await;
    let entities: Vec<String> = (0..10).map(|e| format!("e{e}")).collect();
    for e in &entities {
        s.send(e, Op::Many { from: 0, count: 3 }).await;
    }
    wait_until(Duration::from_secs(10), "applied", || async {
        counts(&system).await.applied == 10
    })
    .await
    .unwrap();
    wait_until(Duration::from_secs(10), "all passivated", || async {
        counts(&system).await.resident_entities == 0
    })
    .await
    .unwrap();
    // Back from the owner's dormant map: the next index must follow on from the three events.
    s.append_to_all(&entities, 3).await;
    wait_until(Duration::from_secs(10), "applied after revival", || async {
        counts(&system).await.applied == 20
    })
    .await
    .unwrap();
    assert_eq!(
        counts(&system).await.rejected,
        0,
        "a revived entity lost its state"
    );
    system.shutdown().await.unwrap();
    // Every entity holds 0, 1, 2 (one command) and then 3.
    s.check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resident_entity_cap_holds_and_evicted_entities_come_back_whole() {
    init_tracing();
    let mut s = Scenario::single(2).await;
    let cap = 3;
    let system = s
        .system_with(s.config("n1").max_resident_entities(cap))
        .await;
    let entities: Vec<String> = (0..40).map(|e| format!("e{e}")).collect();
    let rounds = 4;
    // All rounds back to back: an entity's next command often arrives while its evicted
    // actor is still handing its state back, and must wait for that state.
    for round in 0..rounds {
        s.append_to_all(&entities, round).await;
    }
    wait_until(Duration::from_secs(30), "applied", || async {
        counts(&system).await.applied == entities.len() as u64 * rounds
    })
    .await
    .unwrap();
    let resident = counts(&system).await.resident_entities;
    assert!(
        resident <= cap,
        "{resident} entities resident over a cap of {cap}"
    );
    assert_eq!(
        counts(&system).await.rejected,
        0,
        "an evicted entity lost its state"
    );
    system.shutdown().await.unwrap();
    // Every entity holds 0..rounds, each once, in order.
    s.check().await;
}
