//! A partition paused and resumed (`jetshard::admin::Admin`, or the JetStream API as `nats
//! consumer resume` sends it): the commands stored during the pause are delivered at once after
//! the resume, not at the owner's next pull. The server serves no pull request that was already
//! waiting when a consumer is resumed by API (`nats_facts.rs`,
//! `an_open_pull_is_not_served_after_an_api_resume_only_a_new_pull_is`), so each process listens
//! to its command stream's pause advisories and its owners pull again on a resume
//! (`runtime/pin/resumed.rs`). The pause itself is checked in `cli.rs`.

use std::time::Duration;

use jetshard::admin::Admin;
use jetshard::{CommandSender, ShardSystem};
use jetshard_testkit::wait_until;
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::{applied, init_tracing, ledger_config};
use tokio::time::Instant;

/// The pin TTL here: the pull loop's requests are open a third of it (10 s), so a command that
/// waited for the next pull after a resume would take seconds, well past [`PROMPTLY`].
const PIN_TTL: Duration = Duration::from_secs(30);

/// How soon after a resume the command stored during the pause must be applied.
const PROMPTLY: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_stored_during_a_pause_are_delivered_at_once_after_the_resume() {
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    let config = ledger_config(1, "node-a").pin_ttl(PIN_TTL).build().unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), config.clone())
        .await
        .unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    // Owned, and its pull loop's requests open (the first sent when it started).
    sender
        .request("e0", &LedgerCmd::Append { n: 0 }, Duration::from_secs(20))
        .await
        .expect("the first command's outcome");
    let admin = Admin::new(client.clone(), "ledger");
    let commands = js.get_stream("LEDGER_CMD").await.expect("command stream");
    let consumer = config.entity_type().to_owned() + "-p0";
    for (round, by_admin) in [(1, true), (2, false)] {
        admin
            .pause(0, Duration::from_secs(600))
            .await
            .expect("pause");
        sender
            .send(&format!("e{round}"), &LedgerCmd::Append { n: 0 })
            .await
            .expect("stored while paused");
        let resumed = Instant::now();
        if by_admin {
            admin.resume(0).await.expect("resume");
        } else {
            commands
                .resume_consumer(&consumer)
                .await
                .expect("resume by the API");
        }
        let system = &system;
        wait_until(
            PIN_TTL,
            "the command stored during the pause applied",
            || async move { applied(system).await == 1 + round },
        )
        .await
        .unwrap();
        let took = resumed.elapsed();
        eprintln!(
            "round {round} (resumed by admin: {by_admin}): applied {took:?} after the resume"
        );
        assert!(
            took < PROMPTLY,
            "round {round}: applied {took:?} after the resume (pulls open for {:?})",
            PIN_TTL / 3
        );
    }
    system.shutdown().await.unwrap();
}
