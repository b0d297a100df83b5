//! Failover between node processes: a killed owner is replaced within the pin TTL plus the
//! rebuild, and nothing acknowledged is lost or applied twice.

use std::time::Duration;

use jetshard_testkit::wait_until;
use jetshard_tests::model::Op;
use jetshard_tests::node::now_ms;
use jetshard_tests::{Scenario, init_tracing};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owner_is_replaced_and_nothing_acknowledged_is_lost() {
    init_tracing();
    let mut s = Scenario::single(2).await;
    let entities: Vec<String> = (0..20).map(|e| format!("e{e}")).collect();

    let mut a = s.node("a").await;
    s.append_to_all(&entities, 0).await;
    s.wait_owns_all(&a).await;
    let b = s.node("b").await;

    let rounds = 30;
    let mut killed_at = 0;
    let mut a_owned = Vec::new();
    for n in 1..rounds {
        if n == rounds / 2 {
            // Balancing may already have moved a partition to b.
            a_owned = a.owned();
            a.kill().await;
            killed_at = now_ms();
        }
        s.append_to_all(&entities, n).await;
    }
    // Every entity holds 0..rounds, each once, in order, under its partition's generation.
    s.check().await;
    assert!(!a_owned.is_empty());
    for partition in a_owned {
        let taken = b.acquired_after(partition, killed_at).expect("b took over");
        let takeover_ms = taken.at_ms - killed_at;
        eprintln!(
            "partition {partition}: taken over {takeover_ms} ms after the kill (pin TTL 1000 ms)"
        );
        assert!(takeover_ms < 1000 + 3000, "takeover took {takeover_ms} ms");
    }
}

/// `a` dies in the gap between the durable write of `Appended { n: 5 }` and the ack, holding
/// command 5 and whatever came after it. `b` takes over and recovers them from the stream: it
/// finds command 5 applied and does not apply it again, and acknowledges each recovered command
/// once done, on an ack subject built from its stream sequence, so the consumer is rid of them
/// at once, not one ack wait later when the server would deliver them again (and, at
/// `max_ack_pending`, deliver nothing else until then): with a 20-s ack wait, the command
/// stream drains within 10 s of the takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_written_before_its_owner_crashed_is_not_applied_again_nor_waited_for() {
    init_tracing();
    let mut s = Scenario::single(1).await.ack_wait(Duration::from_secs(20));
    let a = s.node_with("a", &[("LEDGER_ABORT_ON_APPLY", "5")]).await;
    s.send("warmup", Op::Push(100)).await;
    s.wait_owns_all(&a).await;
    let b = s.node("b").await;
    for n in 0..10 {
        s.send("x", Op::Push(n)).await;
    }
    wait_until(Duration::from_secs(30), "b took over", || async {
        b.owned() == vec![0]
    })
    .await
    .unwrap();
    // Push is not idempotent: a second application of command 5 would leave a second 5. The
    // check waits until the command stream is empty: nothing can arrive after that.
    let report = s.check_within(Duration::from_secs(10)).await;
    assert_eq!(report.summary().events, 11, "{report}");
}

/// A previous owner dead-lettered command `S` and died before terminating it: the next owner
/// loads the entity from its dead letters as well as its events, so `S`, recovered from the
/// stream, is a duplicate and is never applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_dead_lettered_before_its_owner_crashed_is_not_applied_by_the_next() {
    use async_nats::HeaderMap;
    use jetshard::FenceRecord;
    use jetshard::wire::{HDR_COMMAND_SEQ, HDR_ENTITY, HDR_GENERATION, Names};

    init_tracing();
    let mut s = Scenario::single(1).await;
    // The streams exist; nobody owns the partition yet.
    s.provision().await;
    let seq = s.send("x", Op::GivenUp(1)).await;
    // What the crashed owner of generation 1 left: its fence record, and the dead letter of
    // that command.
    let names = Names::new("ledger");
    let mut headers = HeaderMap::new();
    headers.insert(HDR_GENERATION, "1");
    let fence = FenceRecord::new(0, 1, "crashed");
    s.js.publish_with_headers(
        names.fence_subject(0),
        headers.clone(),
        serde_json::to_vec(&fence).unwrap().into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    headers.insert(HDR_COMMAND_SEQ, seq.to_string());
    headers.insert(HDR_ENTITY, "x");
    s.js.publish_with_headers(names.dead_letter_subject(0, "x"), headers, "poison".into())
        .await
        .unwrap()
        .await
        .unwrap();
    // A later command of the same entity shows when the partition has been worked through.
    s.send("x", Op::Push(2)).await;

    let system = s.system("n1").await;
    // `applied` counts duplicates too.
    wait_until(
        Duration::from_secs(20),
        "both commands worked through",
        || async { jetshard_tests::applied(&system).await == 2 },
    )
    .await
    .unwrap();
    let status = system.status().await.unwrap();
    assert_eq!(status[0].duplicates, 1, "{status:?}");
    system.shutdown().await.unwrap();
    // x holds only the event of command 2; command 1 has its dead letter and nothing else.
    let report = s.check().await;
    assert_eq!(
        (report.summary().events, report.summary().dead_letters),
        (1, 1)
    );
}
