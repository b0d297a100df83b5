//! A journal that refuses writes for a while (here: full, with discard-new) makes commands wait
//! and retry in place; they are neither lost, nor dead-lettered, nor spend deliveries.

use std::time::Duration;

use async_nats::jetstream::stream::DiscardPolicy;
use jetshard::{CommandSender, ShardSystem};
use jetshard_testkit::{NatsServer, wait_until};
use jetshard_tests::journal::{check_fencing, ledger_values, read_journal};
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::{init_tracing, ledger_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_wait_out_a_journal_that_refuses_writes_and_are_applied_once() {
    init_tracing();
    let server = NatsServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    // One delivery only: a command that was nak'd instead of retried in place would be lost.
    let config = ledger_config(2, "n1").max_deliver(1).build().unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), config.clone())
        .await
        .unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    let js = async_nats::jetstream::new(client.clone());
    for e in 0..5 {
        sender
            .send(&format!("e{e}"), &LedgerCmd::Append { n: 0 })
            .await
            .unwrap();
    }
    let applied = |n: u64| {
        let system = &system;
        async move {
            system
                .status()
                .await
                .unwrap()
                .iter()
                .map(|p| p.applied)
                .sum::<u64>()
                == n
        }
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
        for e in 0..5 {
            sender
                .send(&format!("e{e}"), &LedgerCmd::Append { n })
                .await
                .unwrap();
        }
    }
    // Let several writes fail and be retried: this is the outage, not a wait for a condition.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let status = system.status().await.unwrap();
    assert_eq!(
        status.iter().map(|p| p.applied).sum::<u64>(),
        5,
        "nothing can be applied: {status:?}"
    );
    assert_eq!(
        status.iter().map(|p| p.commands_in_hand).sum::<usize>(),
        15,
        "{status:?}"
    );

    stream_config.max_messages = -1;
    js.update_stream(stream_config).await.unwrap();
    wait_until(
        Duration::from_secs(20),
        "all applied after the outage",
        || applied(20),
    )
    .await
    .unwrap();
    let status = system.status().await.unwrap();
    assert_eq!(
        status
            .iter()
            .map(|p| p.dead_lettered + p.rejected)
            .sum::<u64>(),
        0,
        "{status:?}"
    );
    system.shutdown().await.unwrap();

    let records = read_journal(&js, "ledger").await;
    check_fencing(&records).unwrap();
    for (entity, values) in ledger_values(&records) {
        assert_eq!(values, vec![0, 1, 2, 3], "{entity}");
    }
}
