//! One process owning every partition: commands applied once and in order per entity, state
//! rebuilt from the journal after a restart, rejections acknowledged, bad ids refused.

use std::time::Duration;

use jetshard::{CommandOutcome, CommandSender, Error, ShardSystem};
use jetshard_testkit::{NatsServer, wait_until};
use jetshard_tests::journal::{check_fencing, commands_by_entity, read_journal};
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::{applied, init_tracing, ledger_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_is_applied_once_in_order_and_state_survives_a_restart() {
    init_tracing();
    let server = NatsServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    let config = ledger_config(4, "n1").build().unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), config.clone())
        .await
        .unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);

    let entities = 40;
    let rounds = 5;
    for n in 0..rounds {
        for e in 0..entities {
            sender
                .send(&format!("e{e}"), &LedgerCmd::Append { n })
                .await
                .unwrap();
        }
    }
    let total = entities * rounds;
    wait_until(Duration::from_secs(30), "all commands applied", || async {
        applied(&system).await >= total
    })
    .await
    .unwrap();
    let status = system.status().await.unwrap();
    assert_eq!(
        status.iter().map(|p| p.rejected).sum::<u64>(),
        0,
        "{status:?}"
    );
    system.shutdown().await.unwrap();

    // A new process rebuilds every entity from the journal: the next Append must follow on.
    let system = ShardSystem::start::<Ledger>(client.clone(), config.clone())
        .await
        .unwrap();
    for e in 0..entities {
        sender
            .send(&format!("e{e}"), &LedgerCmd::Append { n: rounds })
            .await
            .unwrap();
    }
    wait_until(
        Duration::from_secs(30),
        "commands after restart applied",
        || async { applied(&system).await >= entities },
    )
    .await
    .unwrap();
    let status = system.status().await.unwrap();
    assert_eq!(
        status.iter().map(|p| p.rejected).sum::<u64>(),
        0,
        "state was not rebuilt: {status:?}"
    );
    system.shutdown().await.unwrap();

    let js = async_nats::jetstream::new(client);
    let records = read_journal(&js, "ledger").await;
    check_fencing(&records).unwrap();
    let by_entity = commands_by_entity(&records);
    assert_eq!(by_entity.len(), entities as usize);
    for (entity, seqs) in by_entity {
        assert_eq!(seqs.len() as u64, rounds + 1, "{entity}: {seqs:?}");
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "{entity} out of command order: {seqs:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_commands_are_acknowledged_and_write_nothing() {
    init_tracing();
    let server = NatsServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    let config = ledger_config(2, "n1").build().unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), config.clone())
        .await
        .unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    sender.send("a", &LedgerCmd::Refuse).await.unwrap();
    sender.send("a", &LedgerCmd::Append { n: 7 }).await.unwrap();
    sender.send("a", &LedgerCmd::Append { n: 0 }).await.unwrap();
    wait_until(Duration::from_secs(20), "three outcomes", || async {
        let s = system.status().await.unwrap();
        s.iter().map(|p| p.applied + p.rejected).sum::<u64>() >= 3
    })
    .await
    .unwrap();
    let status = system.status().await.unwrap();
    assert_eq!(status.iter().map(|p| p.rejected).sum::<u64>(), 2);
    system.shutdown().await.unwrap();
    let js = async_nats::jetstream::new(client);
    let events: Vec<_> = read_journal(&js, "ledger")
        .await
        .into_iter()
        .filter(|r| r.kind == "evt")
        .collect();
    assert_eq!(events.len(), 1);
    // Acknowledged: nothing left in the work queue.
    let mut stream = js.get_stream("LEDGER_CMD").await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_that_are_not_one_subject_token_are_refused_before_publishing() {
    let server = NatsServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    let config = ledger_config(2, "n1").build().unwrap();
    let sender = CommandSender::<Ledger>::new(client, &config);
    for bad in ["", "a.b", "a b", "*", ">", &"x".repeat(300)] {
        let error = sender
            .send(bad, &LedgerCmd::Append { n: 0 })
            .await
            .unwrap_err();
        assert!(matches!(error, Error::InvalidId(_)), "{bad:?}: {error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_can_wait_for_the_outcome_of_its_command() {
    init_tracing();
    let server = NatsServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    let config = ledger_config(2, "n1").max_deliver(1).build().unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), config.clone())
        .await
        .unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    let within = Duration::from_secs(10);

    let applied = sender
        .request("r", &LedgerCmd::AppendMany { from: 0, count: 3 }, within)
        .await
        .unwrap();
    assert!(
        matches!(applied, CommandOutcome::Applied { events: 3, .. }),
        "{applied:?}"
    );
    let rejected = sender
        .request("r", &LedgerCmd::Append { n: 9 }, within)
        .await
        .unwrap();
    assert_eq!(
        rejected,
        CommandOutcome::Rejected {
            command_seq: 2,
            reason: "expected 3, got 9".into()
        }
    );
    let dead = sender
        .request("r", &LedgerCmd::Panic, within)
        .await
        .unwrap();
    assert!(
        matches!(&dead, CommandOutcome::DeadLettered { reason, .. } if reason.contains("panicked")),
        "{dead:?}"
    );
    system.shutdown().await.unwrap();

    // Nobody runs the entity type now: the command is stored, the outcome does not come.
    let error = sender
        .request("r", &LedgerCmd::Append { n: 3 }, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        matches!(error, Error::NoOutcome { command_seq: 4, .. }),
        "{error}"
    );
}
