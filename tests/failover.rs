//! Failover between node processes: a killed owner is replaced within the pin TTL plus the
//! rebuild, and nothing acknowledged is lost or applied twice.

use std::time::Duration;

use jetshard::CommandSender;
use jetshard_testkit::{NatsServer, wait_until};
use jetshard_tests::journal::{check_fencing, ledger_values, wait_for_events};
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::node::{Node, NodeSpec, now_ms};
use jetshard_tests::{init_tracing, ledger_config};

fn spec(partitions: u32) -> NodeSpec {
    NodeSpec {
        partitions,
        pin_ttl: Duration::from_millis(1000),
        ack_wait: Duration::from_millis(3000),
        env: vec![],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owner_is_replaced_and_nothing_acknowledged_is_lost() {
    init_tracing();
    let server = NatsServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    let spec = spec(2);
    let config = ledger_config(spec.partitions, "test").build().unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    let entities = 20;

    let mut a = Node::start(&server.url(), "a", &spec).await;
    for e in 0..entities {
        sender
            .send(&format!("e{e}"), &LedgerCmd::Append { n: 0 })
            .await
            .unwrap();
    }
    wait_until(
        Duration::from_secs(20),
        "a owns both partitions",
        || async { a.owned().len() == 2 },
    )
    .await
    .unwrap();
    let b = Node::start(&server.url(), "b", &spec).await;

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
        for e in 0..entities {
            sender
                .send(&format!("e{e}"), &LedgerCmd::Append { n })
                .await
                .unwrap();
        }
    }
    let js = async_nats::jetstream::new(client);
    let records = wait_for_events(
        &js,
        "ledger",
        (entities * rounds) as usize,
        Duration::from_secs(60),
    )
    .await;
    check_fencing(&records).unwrap();
    for (entity, values) in ledger_values(&records) {
        assert_eq!(values, (0..rounds).collect::<Vec<_>>(), "{entity}");
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_written_before_its_owner_crashed_is_not_applied_again() {
    init_tracing();
    let server = NatsServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    let spec = spec(1);
    let config = ledger_config(1, "test").build().unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);

    // `a` dies in the gap between the durable write of `Appended { n: 5 }` and the ack.
    let a_spec = NodeSpec {
        env: vec![("LEDGER_ABORT_ON_APPLY".into(), "5".into())],
        ..spec.clone()
    };
    let a = Node::start(&server.url(), "a", &a_spec).await;
    sender
        .send("warmup", &LedgerCmd::Push { n: 100 })
        .await
        .unwrap();
    wait_until(Duration::from_secs(20), "a owns the partition", || async {
        a.owned() == vec![0]
    })
    .await
    .unwrap();
    let b = Node::start(&server.url(), "b", &spec).await;

    for n in 0..10 {
        sender.send("x", &LedgerCmd::Push { n }).await.unwrap();
    }
    let js = async_nats::jetstream::new(client);
    let records = wait_for_events(&js, "ledger", 11, Duration::from_secs(30)).await;
    wait_until(Duration::from_secs(10), "b took over", || async {
        b.owned() == vec![0]
    })
    .await
    .unwrap();
    check_fencing(&records).unwrap();
    // Push is not idempotent: a second application of command 5 would leave a second 5.
    assert_eq!(ledger_values(&records)["x"], (0..10).collect::<Vec<_>>());
    // And nothing more arrives once the redelivery of command 5 has come and gone.
    tokio::time::sleep(spec.ack_wait + Duration::from_secs(1)).await;
    let records = jetshard_tests::journal::read_journal(&js, "ledger").await;
    assert_eq!(ledger_values(&records)["x"], (0..10).collect::<Vec<_>>());
}

/// A previous owner dead-lettered command `S` and died before terminating it: the next owner's
/// rebuild reads the dead letters as well as the events, so `S`, recovered from the stream, is
/// a duplicate and is never applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_dead_lettered_before_its_owner_crashed_is_not_applied_by_the_next() {
    use async_nats::HeaderMap;
    use jetshard::ShardSystem;
    use jetshard::wire::{HDR_COMMAND_SEQ, HDR_ENTITY, HDR_GENERATION, Names};

    init_tracing();
    let server = NatsServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    let js = async_nats::jetstream::new(client.clone());
    let config = ledger_config(1, "n1").build().unwrap();
    // The streams exist; nobody owns the partition yet.
    ShardSystem::start::<Ledger>(client.clone(), config.clone())
        .await
        .unwrap()
        .shutdown()
        .await
        .unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    let seq = sender.send("x", &LedgerCmd::Push { n: 1 }).await.unwrap();
    // What the crashed owner of generation 1 left: the dead letter of that command.
    let names = Names::new("ledger");
    let mut headers = HeaderMap::new();
    headers.insert(HDR_GENERATION, "1");
    headers.insert(HDR_COMMAND_SEQ, seq.to_string());
    headers.insert(HDR_ENTITY, "x");
    js.publish_with_headers(names.dead_letter_subject(0), headers, "poison".into())
        .await
        .unwrap()
        .await
        .unwrap();
    // A later command of the same entity shows when the partition has been worked through.
    sender.send("x", &LedgerCmd::Push { n: 2 }).await.unwrap();

    let system = ShardSystem::start::<Ledger>(client.clone(), config)
        .await
        .unwrap();
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
    let records = jetshard_tests::journal::read_journal(&js, "ledger").await;
    assert_eq!(ledger_values(&records)["x"], vec![2]);
}
