//! Fencing: a stalled owner whose pin moved resumes with buffered commands, and none of its
//! writes lands; per-entity order holds across the takeover.

use std::time::Duration;

use jetshard::CommandSender;
use jetshard_testkit::{NatsServer, wait_until};
use jetshard_tests::journal::{check_fencing, ledger_values, wait_for_events};
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::node::{Node, NodeSpec};
use jetshard_tests::{init_tracing, ledger_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_cannot_write_after_takeover_and_entity_order_survives() {
    init_tracing();
    let server = NatsServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    let spec = NodeSpec {
        partitions: 2,
        pin_ttl: Duration::from_millis(1000),
        ack_wait: Duration::from_millis(4000),
        env: vec![],
    };
    let config = ledger_config(spec.partitions, "test").build().unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    let entities = ["x0", "x1", "x2", "x3"];

    // `a` is slow (20 ms per decision), so it holds many delivered, unacknowledged commands.
    let slow = NodeSpec {
        env: vec![("LEDGER_DECIDE_DELAY_MS".into(), "20".into())],
        ..spec.clone()
    };
    let a = Node::start(&server.url(), "a", &slow).await;
    for e in entities {
        sender.send(e, &LedgerCmd::Append { n: 0 }).await.unwrap();
    }
    wait_until(
        Duration::from_secs(20),
        "a owns both partitions",
        || async { a.owned().len() == 2 },
    )
    .await
    .unwrap();
    let b = Node::start(&server.url(), "b", &spec).await;

    // A burst `a` receives, then `a` freezes with it in hand.
    for n in 1..10 {
        for e in entities {
            sender.send(e, &LedgerCmd::Append { n }).await.unwrap();
        }
    }
    a.pause();
    // Part of the fault, not a wait for a condition: the pull requests `a` left open at the
    // server expire (after a third of the pin TTL), so what follows is not delivered to `a`.
    tokio::time::sleep(spec.pin_ttl / 2).await;
    // More commands for the same entities while `a` is frozen: `b` takes over and gets these
    // at once, while `a`'s unacknowledged ones come back only after the ack wait.
    for n in 10..20 {
        for e in entities {
            sender.send(e, &LedgerCmd::Append { n }).await.unwrap();
        }
    }
    wait_until(
        Duration::from_secs(20),
        "b owns both partitions",
        || async { b.owned().len() == 2 },
    )
    .await
    .unwrap();

    // `a` thaws with commands in hand: its writes are fenced and it steps down.
    a.resume();
    wait_until(Duration::from_secs(20), "a stepped down", || async {
        a.owned().is_empty()
    })
    .await
    .unwrap();

    let js = async_nats::jetstream::new(client);
    let records =
        wait_for_events(&js, "ledger", entities.len() * 20, Duration::from_secs(60)).await;
    check_fencing(&records).unwrap();
    let values = ledger_values(&records);
    for e in entities {
        assert_eq!(values[e], (0..20).collect::<Vec<_>>(), "{e}");
    }
    let released: Vec<_> = a
        .lines()
        .into_iter()
        .filter(|l| l.what == "RELEASED")
        .collect();
    assert_eq!(released.len(), 2, "{released:?}");
}
