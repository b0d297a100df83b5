//! Entity actors under their owner: a panicking handler is retried, then dead-lettered, without
//! holding up other entities; a payload that does not decode is terminated at once; idle
//! entities are passivated and revived from the journal; a command's several events are
//! written all together.

use std::time::Duration;

use jetshard::admin::Admin;
use jetshard::{CommandSender, ShardSystem};
use jetshard_testkit::{NatsServer, wait_until};
use jetshard_tests::journal::{check_fencing, ledger_values, read_journal};
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::{init_tracing, ledger_config};

async fn totals(system: &ShardSystem) -> (u64, u64, u64, usize) {
    let status = system.status().await.unwrap();
    (
        status.iter().map(|p| p.applied).sum(),
        status.iter().map(|p| p.dead_lettered).sum(),
        status.iter().map(|p| p.rejected).sum(),
        status.iter().map(|p| p.resident_entities).sum(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_is_retried_then_dead_lettered_while_other_entities_go_on() {
    init_tracing();
    let server = NatsServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    let config = ledger_config(1, "n1").max_deliver(3).build().unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), config.clone())
        .await
        .unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);

    sender.send("bad", &LedgerCmd::Panic).await.unwrap();
    // Held back behind the failing command, then applied once it is given up.
    sender
        .send("bad", &LedgerCmd::Append { n: 0 })
        .await
        .unwrap();
    for n in 0..20 {
        sender.send("good", &LedgerCmd::Append { n }).await.unwrap();
    }
    wait_until(
        Duration::from_secs(10),
        "good applied while bad retries",
        || async { totals(&system).await.0 >= 20 },
    )
    .await
    .unwrap();
    wait_until(
        Duration::from_secs(20),
        "bad dead-lettered and its next command applied",
        || async {
            let (applied, dead, _, _) = totals(&system).await;
            applied == 21 && dead == 1
        },
    )
    .await
    .unwrap();
    assert_eq!(
        totals(&system).await.2,
        0,
        "no command rejected: order kept behind the retried one"
    );

    let letters = Admin::new(client.clone(), "ledger")
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
    let js = async_nats::jetstream::new(client);
    let records = read_journal(&js, "ledger").await;
    check_fencing(&records).unwrap();
    assert_eq!(ledger_values(&records)["bad"], vec![0]);
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_payload_is_terminated_and_does_not_block_its_entity() {
    init_tracing();
    let server = NatsServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    let config = ledger_config(2, "n1").build().unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), config.clone())
        .await
        .unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    let js = async_nats::jetstream::new(client.clone());

    js.publish("ledger.cmd.p", "{not a command".into())
        .await
        .unwrap()
        .await
        .unwrap();
    sender.send("p", &LedgerCmd::Append { n: 0 }).await.unwrap();
    wait_until(
        Duration::from_secs(10),
        "poison terminated, next applied",
        || async {
            let (applied, dead, _, _) = totals(&system).await;
            applied == 1 && dead == 1
        },
    )
    .await
    .unwrap();
    let letters = Admin::new(client.clone(), "ledger")
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
    wait_until(Duration::from_secs(5), "queue drained", || async {
        js.get_stream("LEDGER_CMD")
            .await
            .unwrap()
            .info()
            .await
            .unwrap()
            .state
            .messages
            == 0
    })
    .await
    .unwrap();
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_entities_are_passivated_and_come_back_with_their_state() {
    init_tracing();
    let server = NatsServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    let config = ledger_config(2, "n1")
        .passivate_after(Duration::from_millis(300))
        .build()
        .unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), config.clone())
        .await
        .unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    for e in 0..10 {
        sender
            .send(
                &format!("e{e}"),
                &LedgerCmd::AppendMany { from: 0, count: 3 },
            )
            .await
            .unwrap();
    }
    wait_until(Duration::from_secs(10), "applied", || async {
        totals(&system).await.0 == 10
    })
    .await
    .unwrap();
    wait_until(Duration::from_secs(10), "all passivated", || async {
        totals(&system).await.3 == 0
    })
    .await
    .unwrap();
    // Back from the owner's dormant map: the next index must follow on from the three events.
    for e in 0..10 {
        sender
            .send(&format!("e{e}"), &LedgerCmd::Append { n: 3 })
            .await
            .unwrap();
    }
    wait_until(Duration::from_secs(10), "applied after revival", || async {
        totals(&system).await.0 == 20
    })
    .await
    .unwrap();
    assert_eq!(
        totals(&system).await.2,
        0,
        "a revived entity lost its state"
    );
    system.shutdown().await.unwrap();
    let js = async_nats::jetstream::new(client);
    let records = read_journal(&js, "ledger").await;
    for (entity, values) in ledger_values(&records) {
        assert_eq!(values, vec![0, 1, 2, 3], "{entity}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resident_entity_cap_holds_and_evicted_entities_come_back_whole() {
    init_tracing();
    let server = NatsServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    let cap = 3;
    let config = ledger_config(2, "n1")
        .max_resident_entities(cap)
        .build()
        .unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), config.clone())
        .await
        .unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    let (entities, rounds) = (40, 4);
    // All rounds back to back: an entity's next command often arrives while its evicted
    // actor is still handing its state back, and must wait for that state.
    for round in 0..rounds {
        for e in 0..entities {
            sender
                .send(&format!("e{e}"), &LedgerCmd::Append { n: round })
                .await
                .unwrap();
        }
    }
    wait_until(Duration::from_secs(30), "applied", || async {
        totals(&system).await.0 == entities * rounds
    })
    .await
    .unwrap();
    let resident = totals(&system).await.3;
    assert!(
        resident <= cap,
        "{resident} entities resident over a cap of {cap}"
    );
    assert_eq!(
        totals(&system).await.2,
        0,
        "an evicted entity lost its state"
    );
    system.shutdown().await.unwrap();
    let js = async_nats::jetstream::new(client);
    let records = read_journal(&js, "ledger").await;
    let expected: Vec<u64> = (0..rounds).collect();
    for (entity, values) in ledger_values(&records) {
        assert_eq!(values, expected, "{entity}");
    }
}
