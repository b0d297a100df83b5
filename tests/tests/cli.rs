//! The `jetshard` admin command against a running system: status shows owners and generations,
//! pause and resume take effect, dead letters are listed, and a newcomer's mistakes read as
//! words. Dead letters replayed and purged: `tests/tests/cli_dead_letters.rs`; servers that
//! require creds, TLS, a token or an nkey: `tests/tests/cli_connection.rs`. (The binary's own
//! exit statuses, help and version: `crates/jetshard-cli/tests/exit_status.rs`.)

use std::time::Duration;

use jetshard::{Codec, CommandSender, ShardConfig, ShardSystem};
use jetshard_testkit::wait_until;
use jetshard_tests::cli::{dead_letters, jetshard, jetshard_error, jetshard_json};
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::{init_tracing, ledger_config};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_command_shows_owners_pauses_resumes_and_lists_dead_letters() {
    init_tracing();
    let (server, client, _) = jetshard_tests::served().await;
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
    // An entity's state, from its owner.
    let state = jetshard(&url, &["--json", "get", "ledger", "e3"]).await;
    let state: Value = serde_json::from_str(&state).unwrap();
    assert_eq!(state["state"], serde_json::json!([0]), "{state}");
    assert_eq!(state["entity"], "e3", "{state}");
    let text = jetshard(&url, &["get", "ledger", "e3"]).await;
    assert!(text.starts_with("ledger e3 (partition "), "{text}");

    let status = jetshard(&url, &["status", "ledger"]).await;
    let rows: Vec<&str> = status.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{status}");
    assert!(
        rows.iter()
            .all(|r| r.contains("node-a") && r.contains("yes")),
        "{status}"
    );

    // The processes answer for themselves: node-a owns both partitions, nothing quarantined.
    let nodes = jetshard(&url, &["nodes", "ledger"]).await;
    assert!(
        nodes.contains("node-a: owns 0 (gen 1), 1 (gen 1)") && !nodes.contains("quarantined"),
        "{nodes}"
    );
    let nodes = jetshard(&url, &["nodes", "ledger", "--json"]).await;
    let nodes: serde_json::Value = serde_json::from_str(&nodes).unwrap();
    assert_eq!(nodes[0]["node"], "node-a", "{nodes}");
    assert_eq!(
        nodes[0]["partitions"][1]["quarantined"],
        serde_json::json!([])
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
    let (server, _, _) = jetshard_tests::served().await;
    let mut out = Vec::new();
    let argv = ["jetshard", "--nats-url", &server.url(), "status", "nothing"];
    let error = jetshard_cli::run(argv, &mut out).await.unwrap_err();
    assert!(format!("{error:#}").contains("NOTHING_CMD"), "{error:#}");
}

/// A newcomer's mistakes and empty answers read as words: an unknown entity type, a partition
/// out of range, no dead letters, no process running, an entity that never had a command, a
/// state the tool cannot decode; and dead letters are replayed by range and all at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_command_answers_mistakes_and_empty_lists_in_words() {
    init_tracing();
    let (server, client, _) = jetshard_tests::served().await;
    let url = server.url();

    for args in [
        &["status", "nosuchtype"][..],
        &["pause", "nosuchtype", "0"],
        &["dead-letters", "nosuchtype"],
    ] {
        let error = jetshard_error(&url, args).await;
        assert!(
            error.contains("unknown entity type \"nosuchtype\"")
                && error.contains("NOSUCHTYPE_CMD")
                && !error.contains("10059"),
            "{args:?}: {error}"
        );
    }

    let config = ledger_config(2, "node-a").max_deliver(1).build().unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), config.clone())
        .await
        .unwrap();
    let letters = jetshard(&url, &["dead-letters", "ledger"]).await;
    assert_eq!(letters.trim(), "no dead letters of ledger");
    for args in [
        &["pause", "ledger", "99"][..],
        &["resume", "ledger", "2"],
        &["unpin", "ledger", "7"],
        &["dead-letters", "purge", "ledger", "--partition", "5"],
    ] {
        let error = jetshard_error(&url, args).await;
        assert!(
            error.contains("is out of range: ledger has 2 partitions (0 to 1)"),
            "{args:?}: {error}"
        );
    }
    // An entity that never had a command: its initial state, said so. (Its partition is owned
    // once a command of another entity there has come.)
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    let nobody_partition = jetshard::partition_of(&jetshard::EntityId::new("nobody").unwrap(), 2);
    let neighbour = jetshard_tests::id_in("w", nobody_partition, 2);
    sender
        .request(
            &neighbour,
            &LedgerCmd::Append { n: 0 },
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let text = jetshard(&url, &["get", "ledger", "nobody"]).await;
    assert!(text.contains("no command has reached nobody yet"), "{text}");
    let json: Value =
        serde_json::from_str(&jetshard(&url, &["--json", "get", "ledger", "nobody"]).await)
            .unwrap();
    assert_eq!(json["new"], true, "{json}");
    assert_eq!(json["codec"], "json", "{json}");

    // Three dead letters (the ledger panics on `Panic`; max_deliver 1).
    for e in 0..3 {
        sender
            .send(&format!("bad{e}"), &LedgerCmd::Panic)
            .await
            .unwrap();
    }
    wait_until(Duration::from_secs(15), "three dead letters", || async {
        jetshard_tests::counts(&system).await.dead_lettered == 3
    })
    .await
    .unwrap();
    system.shutdown().await.unwrap();
    let status = jetshard(&url, &["status", "ledger"]).await;
    assert!(
        status.contains("no process of ledger is running"),
        "{status}"
    );

    // By range: the middle one only; then all: the other two, the middle one not again.
    let seqs: Vec<u64> = dead_letters(&url)
        .await
        .iter()
        .map(|l| l["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs.len(), 3);
    let middle = seqs[1].to_string();
    let one = jetshard_json(&[
        "--nats-url",
        &url,
        "dead-letters",
        "replay",
        "ledger",
        "--from",
        &middle,
        "--to",
        &middle,
    ])
    .await;
    assert_eq!(one.as_array().map(Vec::len), Some(1), "{one}");
    assert_eq!(one[0]["dead_letter_seq"], seqs[1], "{one}");
    let all = jetshard(&url, &["dead-letters", "replay", "ledger", "--all"]).await;
    assert!(
        all.contains("2 dead letters of ledger replayed, 1 not sent again"),
        "{all}"
    );
    let error = jetshard_error(&url, &["dead-letters", "replay", "ledger"]).await;
    assert!(error.contains("--all"), "{error}");

    // A bincode entity type: its state is shown as bytes, saying the codec and why.
    let binary = ShardConfig::builder("binledger")
        .partitions(1)
        .node_id("node-b")
        .codec(Codec::Bincode)
        .build()
        .unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), binary.clone())
        .await
        .unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &binary);
    sender
        .request("b1", &LedgerCmd::Append { n: 0 }, Duration::from_secs(10))
        .await
        .unwrap();
    let text = jetshard(&url, &["get", "binledger", "b1"]).await;
    assert!(
        text.contains("encoded with codec bincode, which this tool cannot decode"),
        "{text}"
    );
    let json: Value =
        serde_json::from_str(&jetshard(&url, &["--json", "get", "binledger", "b1"]).await).unwrap();
    assert_eq!(json["state"], Value::Null, "{json}");
    assert!(json["state_hex"].is_string(), "{json}");
    system.shutdown().await.unwrap();
}
