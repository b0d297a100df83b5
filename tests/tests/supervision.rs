//! Embedding: the shard system under an application's own ractor supervisor. A system whose
//! owners keep failing fails itself, and the application's supervisor is told.

use std::time::Duration;

use jetshard::{CommandSender, ShardSystem};
use jetshard_testkit::wait_until;
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::{init_tracing, ledger_config};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::mpsc;

/// An application's root supervisor: reports what happens to its children.
struct Root;

impl Actor for Root {
    type Msg = ();
    type State = mpsc::UnboundedSender<String>;
    type Arguments = mpsc::UnboundedSender<String>;

    async fn pre_start(
        &self,
        _: ActorRef<()>,
        report: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(report)
    }

    async fn handle_supervisor_evt(
        &self,
        _: ActorRef<()>,
        event: SupervisionEvent,
        report: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let line = match event {
            SupervisionEvent::ActorFailed(cell, error) => {
                format!("failed {} {error}", cell.get_id())
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                format!("terminated {} {reason:?}", cell.get_id())
            }
            _ => return Ok(()),
        };
        let _ = report.send(line);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linked_system_runs_under_the_application_supervisor_and_stops_cleanly() {
    init_tracing();
    let (_server, client, _) = jetshard_tests::served().await;
    let (report, mut reports) = mpsc::unbounded_channel();
    let (root, root_handle) = Actor::spawn(None, Root, report).await.unwrap();
    let config = ledger_config(2, "n1").build().unwrap();
    let system =
        ShardSystem::start_linked::<Ledger>(client.clone(), config.clone(), root.get_cell())
            .await
            .unwrap();
    let system_id = system.actor().get_id();
    assert!(root.get_children().iter().any(|c| c.get_id() == system_id));

    CommandSender::<Ledger>::new(client, &config)
        .send("a", &LedgerCmd::Append { n: 0 })
        .await
        .unwrap();
    wait_until(Duration::from_secs(10), "applied", || async {
        jetshard_tests::counts(&system).await.applied == 1
    })
    .await
    .unwrap();
    system.shutdown().await.unwrap();
    let line = tokio::time::timeout(Duration::from_secs(5), reports.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        line.starts_with(&format!("terminated {system_id}")),
        "{line}"
    );
    root.stop(None);
    root_handle.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_that_keep_failing_escalate_to_the_application_supervisor() {
    init_tracing();
    let (_server, client, _) = jetshard_tests::served().await;
    let (report, mut reports) = mpsc::unbounded_channel();
    let (root, root_handle) = Actor::spawn(None, Root, report).await.unwrap();
    // Any entity crash makes the owner give its partition up; a second owner failure fails
    // the system.
    let config = ledger_config(1, "n1")
        .max_deliver(50)
        .max_entity_restarts(0, Duration::from_secs(60))
        .max_owner_restarts(1, Duration::from_secs(60))
        .build()
        .unwrap();
    let system =
        ShardSystem::start_linked::<Ledger>(client.clone(), config.clone(), root.get_cell())
            .await
            .unwrap();
    let system_id = system.actor().get_id();
    let mut ownership = system.ownership_events();
    CommandSender::<Ledger>::new(client, &config)
        .send("boom", &LedgerCmd::Panic)
        .await
        .unwrap();

    let line = tokio::time::timeout(Duration::from_secs(30), reports.recv())
        .await
        .expect("no supervision event")
        .unwrap();
    assert!(line.starts_with(&format!("failed {system_id}")), "{line}");
    assert!(line.contains("partition owners failed"), "{line}");
    // Each owner gave the partition up before failing.
    let mut released = Vec::new();
    while let Ok(event) = ownership.try_recv() {
        if let jetshard::OwnershipChange::Released { reason } = event.change {
            released.push(reason);
        }
    }
    assert!(
        released.len() >= 2 && released.iter().all(|r| r.contains("crash too often")),
        "{released:?}"
    );
    wait_until(
        Duration::from_secs(5),
        "the system's owners stopped",
        || async { system.status().await.is_err() },
    )
    .await
    .unwrap();
    root.stop(None);
    root_handle.await.unwrap();
}
