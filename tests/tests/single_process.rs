//! One process owning every partition: commands applied once and in order per entity, state
//! rebuilt from the journal after a restart, rejections acknowledged, bad ids refused.

use std::time::Duration;

use std::sync::atomic::Ordering::Relaxed;

use jetshard::{CommandOutcome, Error, ShardSystem, Split};
use jetshard_testkit::wait_until;
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::model::Op;
use jetshard_tests::{Scenario, applied, counts, init_tracing};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_is_applied_once_in_order_and_state_survives_a_restart() {
    init_tracing();
    let mut s = Scenario::single(4).await;
    let system = s.system("n1").await;

    let entities: Vec<String> = (0..40).map(|e| format!("e{e}")).collect();
    let rounds = 5;
    for n in 0..rounds {
        s.append_to_all(&entities, n).await;
    }
    let total = entities.len() as u64 * rounds;
    wait_until(Duration::from_secs(30), "all commands applied", || async {
        applied(&system).await >= total
    })
    .await
    .unwrap();
    let c = counts(&system).await;
    assert_eq!(c.rejected, 0, "{c:?}");
    system.shutdown().await.unwrap();

    // A new process rebuilds every entity from the journal: the next Append must follow on.
    let system = s.system("n1").await;
    s.append_to_all(&entities, rounds).await;
    wait_until(
        Duration::from_secs(30),
        "commands after restart applied",
        || async { applied(&system).await >= entities.len() as u64 },
    )
    .await
    .unwrap();
    let c = counts(&system).await;
    assert_eq!(c.rejected, 0, "state was not rebuilt: {c:?}");
    system.shutdown().await.unwrap();

    // Each entity's commands applied once each, in command order, across the restart.
    let report = s.check().await;
    assert_eq!(report.summary().entities, entities.len());
    assert_eq!(
        report.summary().events,
        entities.len() * (rounds as usize + 1)
    );
}

/// The experiment's seam of stop 38 (`ShardSystem::start_split`): the journal's writes and the
/// acks on a second connection, the pulls on the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_and_acks_on_a_second_connection_apply_every_command_once_in_order() {
    init_tracing();
    let mut s = Scenario::single(4).await;
    let first = s.server().connect().await.unwrap();
    let second = s.server().connect().await.unwrap();
    let split = Split {
        writes: true,
        acks: true,
        pulls: false,
    };
    let config = s.config("n1").build().unwrap();
    let system = ShardSystem::start_split::<Ledger>(first, second.clone(), split, config)
        .await
        .unwrap();
    let sent_before = second.statistics().out_messages.load(Relaxed);

    let entities: Vec<String> = (0..20).map(|e| format!("e{e}")).collect();
    let rounds = 3;
    for n in 0..rounds {
        s.append_to_all(&entities, n).await;
    }
    let total = entities.len() as u64 * rounds;
    wait_until(Duration::from_secs(30), "all commands applied", || async {
        applied(&system).await >= total
    })
    .await
    .unwrap();
    // The second connection carried them: an event's publish and an ack per command at least.
    let sent = second.statistics().out_messages.load(Relaxed) - sent_before;
    assert!(
        sent >= 2 * total,
        "{sent} messages on the second connection"
    );
    system.shutdown().await.unwrap();

    let report = s.check().await;
    assert_eq!(report.summary().entities, entities.len());
    assert_eq!(report.summary().events, total as usize, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_commands_are_acknowledged_and_write_nothing() {
    init_tracing();
    let mut s = Scenario::single(2).await;
    let system = s.system("n1").await;
    s.send("a", Op::Refuse).await;
    s.send("a", Op::Misplaced(7)).await;
    s.send("a", Op::Append(0)).await;
    wait_until(Duration::from_secs(20), "three outcomes", || async {
        let c = counts(&system).await;
        c.applied + c.rejected >= 3
    })
    .await
    .unwrap();
    assert_eq!(counts(&system).await.rejected, 2);
    system.shutdown().await.unwrap();
    // Acknowledged (the check waits for an empty work queue), and the rejected two wrote
    // nothing.
    let report = s.check().await;
    assert_eq!(
        (report.summary().events, report.summary().silent),
        (1, 2),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_that_are_not_one_subject_token_are_refused_before_publishing() {
    let s = Scenario::single(2).await;
    for bad in ["", "a.b", "a b", "*", ">", &"x".repeat(300)] {
        let error = s
            .sender
            .send(bad, &LedgerCmd::Append { n: 0 })
            .await
            .unwrap_err();
        assert!(matches!(error, Error::InvalidId(_)), "{bad:?}: {error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_can_wait_for_the_outcome_of_its_command() {
    init_tracing();
    let s = Scenario::single(2).await;
    let system = s.system_with(s.config("n1").max_deliver(1)).await;
    let sender = &s.sender;
    let within = Duration::from_secs(10);

    let applied = sender
        .request_outcome("r", &LedgerCmd::AppendMany { from: 0, count: 3 }, within)
        .await
        .unwrap();
    assert!(
        matches!(applied, CommandOutcome::Applied { events: 3, .. }),
        "{applied:?}"
    );
    let rejected = sender
        .request_outcome("r", &LedgerCmd::Append { n: 9 }, within)
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
        .request_outcome("r", &LedgerCmd::Panic, within)
        .await
        .unwrap();
    assert!(
        matches!(&dead, CommandOutcome::DeadLettered { reason, .. } if reason.contains("panicked")),
        "{dead:?}"
    );
    system.shutdown().await.unwrap();

    // Nobody runs the entity type now: the command is stored, the outcome does not come.
    let error = sender
        .request_outcome("r", &LedgerCmd::Append { n: 3 }, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        matches!(error, Error::NoOutcome { command_seq: 4, .. }),
        "{error}"
    );
}
