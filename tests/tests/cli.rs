//! The `jetshard` admin command against a running system: status shows owners and generations,
//! pause and resume take effect, dead letters are listed, replayed and purged, and it reaches a
//! server that requires a creds file and TLS (first) with a client certificate. (The binary's own exit
//! statuses, help and version: `crates/jetshard-cli/tests/exit_status.rs`.)

use std::time::Duration;

use async_nats::ConnectOptions;
use async_nats::jetstream;
use jetshard::{Codec, CommandRetention, CommandSender, ShardConfig, ShardSystem};
use jetshard_testkit::{NatsServer, wait_until};
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::secure::{certificates, operator_setup, tls_config};
use jetshard_tests::{applied, init_tracing, ledger_config};
use serde_json::Value;

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

/// Runs `jetshard <args> --json` and parses its output.
async fn jetshard_json(args: &[&str]) -> Value {
    let mut out = Vec::new();
    let argv = ["jetshard"]
        .into_iter()
        .chain(args.iter().copied())
        .chain(["--json"]);
    jetshard_cli::run(argv, &mut out)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e:#}"));
    serde_json::from_slice(&out)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out)))
}

/// The dead letters of the ledger, as `dead-letters --json` lists them.
async fn dead_letters(url: &str) -> Vec<Value> {
    let letters = jetshard_json(&["--nats-url", url, "dead-letters", "ledger"]).await;
    letters.as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_replayed_once_as_a_new_command_and_dead_letters_are_purged() {
    init_tracing();
    let (server, client, js) = jetshard_tests::served().await;
    let url = server.url();
    // A node deployed with the wrong codec: the clients send JSON, it expects bincode, and
    // dead-letters every command as malformed. (Limits retention keeps the commands, so the
    // replayed one can be read back.)
    let wrong = ledger_config(2, "node-wrong")
        .codec(Codec::Bincode)
        .command_retention(CommandRetention::Limits)
        .build()
        .unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), wrong)
        .await
        .unwrap();
    // One in each partition (the purge below takes one partition's).
    let entities = ["late-0", "late-1"];
    let partition = |id| jetshard::partition_of(&jetshard::EntityId::new(id).unwrap(), 2);
    assert_ne!(partition(entities[0]), partition(entities[1]));
    for entity in entities {
        js.publish(
            format!("ledger.cmd.{entity}"),
            br#"{"Append":{"n":0}}"#.to_vec().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    wait_until(Duration::from_secs(15), "two dead letters", || async {
        let status = system.status().await.unwrap();
        status.iter().map(|p| p.dead_lettered).sum::<u64>() == 2
    })
    .await
    .unwrap();
    system.shutdown().await.unwrap();

    let letters = dead_letters(&url).await;
    assert_eq!(letters.len(), 2, "{letters:#?}");
    let letter = |entity: &str| {
        letters
            .iter()
            .find(|l| l["entity"] == entity)
            .unwrap_or_else(|| panic!("no dead letter of {entity}: {letters:#?}"))
            .clone()
    };
    let first = letter("late-0");
    assert_eq!(first["payload"], r#"{"Append":{"n":0}}"#, "{first}");
    assert!(
        first["reason"].as_str().unwrap().starts_with("malformed"),
        "{first}"
    );
    let first_seq = first["seq"].as_u64().unwrap();

    // The wrong node created the streams, so bincode is recorded with them and a JSON node is
    // refused. It wrote no event (every command was dead-lettered undecoded), so the operator
    // corrects the record (docs/OPERATIONS.md, "Codec") before deploying the fixed node.
    for stream in ["LEDGER_CMD", "LEDGER_JOURNAL"] {
        let mut handle = js.get_stream(stream).await.unwrap();
        let mut config = handle.info().await.unwrap().config.clone();
        assert_eq!(config.metadata["jetshard.codec"], "bincode");
        config
            .metadata
            .insert("jetshard.codec".to_owned(), "json".to_owned());
        js.update_stream(config).await.unwrap();
    }
    // The fixed node runs; the operator replays the first dead letter, twice by mistake.
    let fixed = ledger_config(2, "node-fixed")
        .command_retention(CommandRetention::Limits)
        .build()
        .unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), fixed)
        .await
        .unwrap();
    let seq = first_seq.to_string();
    let replay = ["--nats-url", &url, "dead-letters", "replay", "ledger", &seq];
    let replayed = jetshard_json(&replay).await;
    assert_eq!(replayed["entity"], "late-0", "{replayed}");
    assert_eq!(replayed["duplicate"], false, "{replayed}");
    let again = jetshard_json(&replay).await;
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["command_seq"], replayed["command_seq"], "{again}");

    // Applied once, as a new command that says where it came from.
    wait_until(Duration::from_secs(15), "the replay applied", || async {
        applied(&system).await == 1
    })
    .await
    .unwrap();
    let command_seq = replayed["command_seq"].as_u64().unwrap();
    let command = js
        .get_stream("LEDGER_CMD")
        .await
        .unwrap()
        .get_raw_message(command_seq)
        .await
        .unwrap();
    let header = |name: &str| command.headers.get(name).map(|v| v.as_str().to_owned());
    assert_eq!(
        header(jetshard::wire::HDR_REPLAY_OF).as_deref(),
        Some(seq.as_str())
    );
    assert_eq!(
        header(jetshard::wire::HDR_MSG_ID),
        Some(format!("ledger:replay:{first_seq}"))
    );
    assert!(command.subject.ends_with(".late-0"), "{}", command.subject);
    let status = system.status().await.unwrap();
    assert_eq!(status.iter().map(|p| p.dead_lettered).sum::<u64>(), 0);
    system.shutdown().await.unwrap();

    // A record that is not a dead letter (the first fence record) is not replayed.
    let mut out = Vec::new();
    let error = jetshard_cli::run(
        [
            "jetshard",
            "--nats-url",
            &url,
            "dead-letters",
            "replay",
            "ledger",
            "1",
        ],
        &mut out,
    )
    .await
    .unwrap_err();
    assert!(
        format!("{error:#}").contains("not a dead letter"),
        "{error:#}"
    );

    // Purge: one partition up to a sequence, then everything. (Every command is acknowledged
    // by now; a dead letter whose command is not stays: the next test.)
    jetshard_tests::drained(&client, "ledger").await;
    let second = letter("late-1");
    let (partition, second_seq) = (second["partition"].to_string(), second["seq"].to_string());
    let purge = [
        "--nats-url",
        &url,
        "dead-letters",
        "purge",
        "ledger",
        "--partition",
        &partition,
        "--upto",
        &second_seq,
    ];
    let purged = jetshard_json(&purge).await;
    assert_eq!(
        (&purged["purged"], &purged["kept"]),
        (&1.into(), &0.into()),
        "{purged}"
    );
    let left = dead_letters(&url).await;
    assert_eq!(left.len(), 1, "{left:#?}");
    assert_eq!(left[0]["entity"], "late-0");
    let purged = jetshard_json(&["--nats-url", &url, "dead-letters", "purge", "ledger"]).await;
    assert_eq!(purged["purged"], 1, "{purged}");
    assert_eq!(dead_letters(&url).await, Vec::<Value>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_command_reaches_a_server_that_requires_creds_and_tls() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let path = |name: &str| dir.path().join(name).display().to_string();
    let (operator_config, creds) = operator_setup();
    std::fs::write(dir.path().join("admin.creds"), &creds).unwrap();
    let options = || {
        ConnectOptions::with_credentials(&creds)
            .unwrap()
            .require_tls(true)
            .add_root_certificates(path("ca.pem").into())
            .add_client_certificate(path("client.pem").into(), path("client-key.pem").into())
            .tls_first()
    };
    // TLS first, too: the server expects the handshake before it says anything.
    let server = NatsServer::builder()
        .config(format!("{operator_config}{}", tls_config(dir.path(), true)))
        .connect_options(options())
        .start()
        .await
        .unwrap();
    let url = server.url();
    let client = options().connect(&url).await.unwrap();
    let config = ledger_config(2, "node-a").build().unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), config.clone())
        .await
        .unwrap();
    CommandSender::<Ledger>::new(client, &config)
        .send("e", &LedgerCmd::Append { n: 0 })
        .await
        .unwrap();
    wait_until(Duration::from_secs(10), "applied", || async {
        applied(&system).await == 1
    })
    .await
    .unwrap();

    // With flags.
    let (creds_path, ca, cert, key) = (
        path("admin.creds"),
        path("ca.pem"),
        path("client.pem"),
        path("client-key.pem"),
    );
    let status = jetshard_json(&[
        "--nats-url",
        &url,
        "--creds",
        &creds_path,
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-first",
        "status",
        "ledger",
    ])
    .await;
    let partitions = status.as_array().unwrap();
    assert_eq!(partitions.len(), 2, "{status:#}");
    let owned = partitions.iter().find(|p| p["owner"] == "node-a");
    let owned = owned.unwrap_or_else(|| panic!("no partition owned: {status:#}"));
    for column in [
        "partition",
        "generation",
        "pinned",
        "pending",
        "ack_pending",
        "redelivered",
        "waiting",
        "paused",
        "pause_remaining_secs",
    ] {
        assert!(owned.get(column).is_some(), "{column} missing: {owned}");
    }
    assert_eq!(owned["generation"], 1, "{owned}");

    // With a context file, as the `nats` CLI saves one.
    let context = dir.path().join("secure.json");
    let settings = serde_json::json!({
        "description": "the test server", "url": url, "creds": creds_path, "ca": ca,
        "cert": cert, "key": key, "nkey": "", "token": "", "user": "", "password": "",
        "jetstream_domain": "", "inbox_prefix": "", "tls_first": true,
    });
    std::fs::write(&context, settings.to_string()).unwrap();
    let context = context.display().to_string();
    let from_context = jetshard_json(&["--context", &context, "status", "ledger"]).await;
    assert_eq!(
        from_context.as_array().unwrap().len(),
        2,
        "{from_context:#}"
    );

    // Without --tls-first, the server does not answer (it waits for a TLS handshake).
    let mut out = Vec::new();
    let not_first = jetshard_cli::run(
        [
            "jetshard",
            "--nats-url",
            &url,
            "--creds",
            &creds_path,
            "--tls-ca",
            &ca,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "status",
            "ledger",
        ],
        &mut out,
    )
    .await;
    assert!(not_first.is_err(), "connected without TLS first");

    // Without the creds, the server refuses.
    let mut out = Vec::new();
    let refused = jetshard_cli::run(
        [
            "jetshard",
            "--nats-url",
            &url,
            "--tls-ca",
            &ca,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tls-first",
            "status",
            "ledger",
        ],
        &mut out,
    )
    .await;
    assert!(refused.is_err(), "connected without creds");
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_keeps_a_dead_letter_whose_command_could_still_come_back() {
    init_tracing();
    let (server, client, _) = jetshard_tests::served().await;
    let url = server.url();
    // One partition. A command that panics at every delivery is retried for a long while (50
    // deliveries here), and holds the partition's ack floor below it meanwhile.
    let patient = ledger_config(1, "node-a").max_deliver(50).build().unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), patient)
        .await
        .unwrap();
    let config = system.config().clone();
    CommandSender::<Ledger>::new(client.clone(), &config)
        .send("stuck", &LedgerCmd::Panic)
        .await
        .unwrap();
    // A body that is no command, after it: dead-lettered and terminated at once, but above
    // the floor. A new owner would read it back from the stream with the rest of the window,
    // and only its dead letter says it is done.
    jetstream::new(client.clone())
        .publish("ledger.cmd.bad", "no command".into())
        .await
        .unwrap()
        .await
        .unwrap();
    wait_until(Duration::from_secs(15), "a dead letter", || async {
        let status = system.status().await.unwrap();
        status.iter().map(|p| p.dead_lettered).sum::<u64>() == 1
    })
    .await
    .unwrap();
    let purge = ["--nats-url", &url, "dead-letters", "purge", "ledger"];
    let purged = jetshard_json(&purge).await;
    assert_eq!(
        (&purged["purged"], &purged["kept"]),
        (&0.into(), &1.into()),
        "{purged}"
    );
    assert_eq!(dead_letters(&url).await.len(), 1);
    system.shutdown().await.unwrap();

    // A node that gives up at the first failure (max_deliver is each process's own): the
    // stuck command is dead-lettered too, the floor passes both, and both dead letters go.
    let hasty = ledger_config(1, "node-b").max_deliver(1).build().unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), hasty)
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(15),
        "the stuck command given up",
        || async {
            let status = system.status().await.unwrap();
            status.iter().map(|p| p.dead_lettered).sum::<u64>() == 1
        },
    )
    .await
    .unwrap();
    jetshard_tests::drained(&client, "ledger").await;
    let purged = jetshard_json(&purge).await;
    assert_eq!(
        (&purged["purged"], &purged["kept"]),
        (&2.into(), &0.into()),
        "{purged}"
    );
    assert_eq!(dead_letters(&url).await, Vec::<Value>::new());
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_command_connects_with_a_token_or_an_nkey_seed_file() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let seed_file = dir.path().join("user.nk");
    std::fs::write(&seed_file, format!("{seed}\n")).unwrap();
    let seed_file = seed_file.display().to_string();
    let cases = [
        (
            "authorization { token: \"t0k3n\" }\n".to_owned(),
            ConnectOptions::with_token("t0k3n".into()),
            ["--token", "t0k3n"],
        ),
        (
            format!(
                "authorization {{ users: [ {{ nkey: {} }} ] }}\n",
                user.public_key()
            ),
            ConnectOptions::with_nkey(seed.clone()),
            ["--nkey", seed_file.as_str()],
        ),
    ];
    for (server_config, options, flags) in cases {
        let server = NatsServer::builder()
            .config(server_config)
            .connect_options(options.clone())
            .start()
            .await
            .unwrap();
        let url = server.url();
        // The streams exist: a system started and stopped.
        let client = options.connect(&url).await.unwrap();
        let config = ledger_config(2, "node-a").build().unwrap();
        ShardSystem::start::<Ledger>(client, config)
            .await
            .unwrap()
            .shutdown()
            .await
            .unwrap();
        let args = [
            "--nats-url",
            url.as_str(),
            flags[0],
            flags[1],
            "status",
            "ledger",
        ];
        let status = jetshard_json(&args).await;
        assert_eq!(status.as_array().unwrap().len(), 2, "{flags:?}: {status}");
        // Without the flags, the server refuses.
        let mut out = Vec::new();
        let anonymous = ["jetshard", "--nats-url", url.as_str(), "status", "ledger"];
        let refused = jetshard_cli::run(anonymous, &mut out).await;
        assert!(refused.is_err(), "{flags:?}: an anonymous client got in");
    }
}

/// Runs `jetshard --nats-url <url> <args>` expecting it to fail; returns the error's text.
async fn jetshard_error(url: &str, args: &[&str]) -> String {
    let mut out = Vec::new();
    let argv = ["jetshard", "--nats-url", url]
        .into_iter()
        .chain(args.iter().copied());
    match jetshard_cli::run(argv, &mut out).await {
        Ok(()) => panic!("{args:?} succeeded: {}", String::from_utf8_lossy(&out)),
        Err(error) => format!("{error:#}"),
    }
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
