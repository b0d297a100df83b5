//! Graceful shutdown: a stopping node finishes and acknowledges what it holds and releases its
//! pins, so a standby takes over at once rather than after the pin TTL.

use std::time::Duration;

use jetshard::CommandSender;
use jetshard_testkit::{NatsServer, wait_until};
use jetshard_tests::journal::{check_fencing, ledger_values, wait_for_events};
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::node::{Node, NodeSpec, now_ms};
use jetshard_tests::{init_tracing, ledger_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_node_hands_its_partitions_over_well_before_the_pin_ttl() {
    init_tracing();
    let server = NatsServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    // A long pin TTL: a takeover that waited for it would take 5 s.
    let spec = NodeSpec {
        partitions: 2,
        pin_ttl: Duration::from_secs(5),
        ack_wait: Duration::from_secs(5),
        env: vec![],
    };
    let config = ledger_config(spec.partitions, "test").build().unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    let entities = 10;

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

    let rounds = 20;
    let mut stopped_at = 0;
    let mut a_owned = Vec::new();
    for n in 1..rounds {
        if n == rounds / 2 {
            // Balancing may already have moved a partition to b.
            a_owned = a.owned();
            stopped_at = now_ms();
            a.terminate().await;
        }
        for e in 0..entities {
            sender
                .send(&format!("e{e}"), &LedgerCmd::Append { n })
                .await
                .unwrap();
        }
    }
    assert!(
        a.lines().iter().any(|l| l.what == "STOPPED"),
        "a did not stop gracefully"
    );
    let js = async_nats::jetstream::new(client);
    let records = wait_for_events(
        &js,
        "ledger",
        (entities * rounds) as usize,
        Duration::from_secs(30),
    )
    .await;
    check_fencing(&records).unwrap();
    for (entity, values) in ledger_values(&records) {
        assert_eq!(values, (0..rounds).collect::<Vec<_>>(), "{entity}");
    }
    assert!(!a_owned.is_empty());
    for partition in a_owned {
        let taken = b
            .acquired_after(partition, stopped_at)
            .expect("b took over");
        let handover_ms = taken.at_ms - stopped_at;
        eprintln!(
            "partition {partition}: handed over {handover_ms} ms after SIGTERM (pin TTL 5000 ms)"
        );
        assert!(
            handover_ms < 2500,
            "handover took {handover_ms} ms: the pin was not released"
        );
    }
}
