//! Balancing: processes that join share the partitions evenly, under load, without losing or
//! reordering anything.

use std::time::Duration;

use jetshard::CommandSender;
use jetshard_testkit::{NatsServer, wait_until};
use jetshard_tests::journal::{check_fencing, ledger_values, wait_for_events};
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::node::{Node, NodeSpec};
use jetshard_tests::{init_tracing, ledger_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_that_join_get_an_even_share_of_the_partitions() {
    init_tracing();
    let server = NatsServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    let spec = NodeSpec {
        partitions: 6,
        pin_ttl: Duration::from_millis(500),
        ack_wait: Duration::from_secs(3),
        env: vec![],
    };
    let config = ledger_config(spec.partitions, "test").build().unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    let entities = 30;

    let a = Node::start(&server.url(), "a", &spec).await;
    for e in 0..entities {
        sender
            .send(&format!("e{e}"), &LedgerCmd::Append { n: 0 })
            .await
            .unwrap();
    }
    wait_until(
        Duration::from_secs(20),
        "a owns every partition",
        || async { a.owned().len() == 6 },
    )
    .await
    .unwrap();
    let b = Node::start(&server.url(), "b", &spec).await;
    let c = Node::start(&server.url(), "c", &spec).await;

    // Load goes on while the partitions move.
    let mut n = 1;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    loop {
        for e in 0..entities {
            sender
                .send(&format!("e{e}"), &LedgerCmd::Append { n })
                .await
                .unwrap();
        }
        n += 1;
        let shares = [a.owned().len(), b.owned().len(), c.owned().len()];
        if shares == [2, 2, 2] && n > 5 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not balanced after 40 s: {shares:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let js = async_nats::jetstream::new(client);
    let records = wait_for_events(
        &js,
        "ledger",
        (entities * n) as usize,
        Duration::from_secs(30),
    )
    .await;
    check_fencing(&records).unwrap();
    for (entity, values) in ledger_values(&records) {
        assert_eq!(values, (0..n).collect::<Vec<_>>(), "{entity}");
    }
}
