//! The `jetshard` admin command against a running system: status shows owners and generations,
//! pause and resume take effect, dead letters are listed.

use std::time::Duration;

use jetshard::{CommandSender, ShardSystem};
use jetshard_testkit::{NatsServer, wait_until};
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::{init_tracing, ledger_config};

/// Runs `jetshard --nats-url <url> <args>` (the binary's own entry point) and returns its output.
async fn jetshard(url: &str, args: &[&str]) -> String {
    let mut out = Vec::new();
    let argv = ["jetshard", "--nats-url", url]
        .into_iter()
        .chain(args.iter().copied());
    jetshard_cli::run(argv, &mut out)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e:#}"));
    String::from_utf8(out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_command_shows_owners_pauses_resumes_and_lists_dead_letters() {
    init_tracing();
    let server = NatsServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    let config = ledger_config(2, "node-a").max_deliver(1).build().unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), config.clone())
        .await
        .unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    for e in 0..10 {
        sender
            .send(&format!("e{e}"), &LedgerCmd::Append { n: 0 })
            .await
            .unwrap();
    }
    sender.send("bad", &LedgerCmd::Panic).await.unwrap();
    wait_until(Duration::from_secs(10), "applied", || async {
        let c = jetshard_tests::counts(&system).await;
        c.applied + c.dead_lettered == 11
    })
    .await
    .unwrap();

    let url = server.url();
    let status = jetshard(&url, &["status", "ledger"]).await;
    let rows: Vec<&str> = status.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{status}");
    assert!(
        rows.iter()
            .all(|r| r.contains("node-a") && r.contains("yes")),
        "{status}"
    );

    jetshard(&url, &["pause", "ledger", "0", "--for-secs", "60"]).await;
    let status = jetshard(&url, &["status", "ledger"]).await;
    assert!(
        status.lines().nth(1).unwrap().trim_end().ends_with('s'),
        "partition 0 not paused: {status}"
    );
    jetshard(&url, &["resume", "ledger", "0"]).await;
    let status = jetshard(&url, &["status", "ledger"]).await;
    assert!(
        status.lines().nth(1).unwrap().trim_end().ends_with("no"),
        "partition 0 still paused: {status}"
    );

    let letters = jetshard(&url, &["dead-letters", "ledger"]).await;
    assert_eq!(letters.lines().count(), 1, "{letters}");
    assert!(
        letters.contains("entity bad") && letters.contains("panicked"),
        "{letters}"
    );
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_an_entity_type_that_was_never_started_is_an_error() {
    let server = NatsServer::start().await.unwrap();
    let mut out = Vec::new();
    let argv = ["jetshard", "--nats-url", &server.url(), "status", "nothing"];
    let error = jetshard_cli::run(argv, &mut out).await.unwrap_err();
    assert!(format!("{error:#}").contains("NOTHING_CMD"), "{error:#}");
}
