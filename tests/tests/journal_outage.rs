//! A journal that refuses writes for a while (here: full, with discard-new) makes commands wait
//! and retry in place; they are neither lost, nor dead-lettered, nor spend deliveries.

use std::time::Duration;

use async_nats::jetstream::stream::DiscardPolicy;
use jetshard_testkit::wait_until;
use jetshard_tests::{Scenario, counts, init_tracing};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_wait_out_a_journal_that_refuses_writes_and_are_applied_once() {
    init_tracing();
    let mut s = Scenario::single(2).await;
    // One delivery only: a command that was nak'd instead of retried in place would be lost.
    let system = s.system_with(s.config("n1").max_deliver(1)).await;
    let js = s.js.clone();
    let entities: Vec<String> = (0..5).map(|e| format!("e{e}")).collect();
    s.append_to_all(&entities, 0).await;
    let applied = |n: u64| {
        let system = &system;
        async move { counts(system).await.applied == n }
    };
    wait_until(Duration::from_secs(10), "warm-up applied", || applied(5))
        .await
        .unwrap();

    // The journal is full and refuses new messages.
    let mut journal = js.get_stream("LEDGER_JOURNAL").await.unwrap();
    let mut stream_config = journal.info().await.unwrap().config.clone();
    let held = journal.info().await.unwrap().state.messages;
    stream_config.max_messages = held as i64;
    stream_config.discard = DiscardPolicy::New;
    js.update_stream(stream_config.clone()).await.unwrap();

    for n in 1..4 {
        s.append_to_all(&entities, n).await;
    }
    // Every command in hand, and each partition's writes refused and retried more than once.
    let before = counts(&system).await.unconfirmed_writes;
    wait_until(
        Duration::from_secs(20),
        "all in hand, writes refused again and again",
        || async {
            let c = counts(&system).await;
            c.commands_in_hand == 15 && c.unconfirmed_writes >= before + 4
        },
    )
    .await
    .unwrap();
    let c = counts(&system).await;
    assert_eq!(c.applied, 5, "nothing can be applied: {c:?}");

    stream_config.max_messages = -1;
    js.update_stream(stream_config).await.unwrap();
    wait_until(
        Duration::from_secs(20),
        "all applied after the outage",
        || applied(20),
    )
    .await
    .unwrap();
    let c = counts(&system).await;
    assert_eq!(c.dead_lettered + c.rejected, 0, "{c:?}");
    system.shutdown().await.unwrap();
    // Every entity holds 0, 1, 2, 3, each once, in order.
    s.check().await;
}
