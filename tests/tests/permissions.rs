//! Least permissions: a node holding only the permissions `docs/SECURITY.md` lists runs its
//! entity type and answers a client's request, an operator with only its own runs every admin
//! command, a node process with runtime permissions only runs streams an operator provisioned,
//! and a node of another entity type cannot touch the ledger's streams. Connecting (user and
//! password, token, nkey, creds, TLS) is in `tests/tests/security.rs`.

use std::time::Duration;

use async_nats::ConnectOptions;
use async_nats::jetstream::{self, consumer::pull};
use jetshard::{CommandSender, ShardSystem};
use jetshard_testkit::{NatsServer, TcpProxy, wait_until};
use jetshard_tests::init_tracing;
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::node::{Node, NodeOptions, NodeSpec};
use jetshard_tests::secure::{config, runs, server};

/// The permissions of a node of `entity_type`, as `docs/SECURITY.md` lists them, as a
/// `nats-server` configuration `permissions` block. `provision` adds what creating the
/// streams and consumers needs; `inbox` is the node's inbox prefix, `replies` its clients'
/// (where it publishes the outcomes `CommandSender::request` waits for).
fn node_permissions(entity_type: &str, provision: bool, inbox: &str, replies: &str) -> String {
    let t = entity_type;
    let upper = t.to_ascii_uppercase().replace('-', "_");
    let (cmd, journal) = (format!("{upper}_CMD"), format!("{upper}_JOURNAL"));
    let mut publish = vec![
        // Opening and validating the streams and the partition consumers.
        format!("$JS.API.STREAM.INFO.{cmd}"),
        format!("$JS.API.STREAM.INFO.{journal}"),
        format!("$JS.API.CONSUMER.INFO.{cmd}.*"),
        // Pulling, acknowledging and moving the pin of commands.
        format!("$JS.API.CONSUMER.MSG.NEXT.{cmd}.*"),
        format!("$JS.ACK.{cmd}.>"),
        format!("$JS.API.CONSUMER.UNPIN.{cmd}.*"),
        // Reading commands in flight after a takeover, and the latest fence record.
        format!("$JS.API.STREAM.MSG.GET.{cmd}"),
        format!("$JS.API.STREAM.MSG.GET.{journal}"),
        // Reading the commands in flight with batched direct gets (any replica).
        format!("$JS.API.DIRECT.GET.{cmd}"),
        // Loading entities from a single-replica journal with direct gets.
        format!("$JS.API.DIRECT.GET.{journal}"),
        format!("$JS.API.DIRECT.GET.{journal}.>"),
        // The owner's background compaction of its partition.
        format!("$JS.API.STREAM.PURGE.{journal}"),
        // Replaying the journal (ordered consumers).
        format!("$JS.API.CONSUMER.CREATE.{journal}"),
        format!("$JS.API.CONSUMER.CREATE.{journal}.>"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{journal}.*"),
        format!("$JS.API.CONSUMER.DELETE.{journal}.*"),
        // Writing the journal: events, fence records, dead letters, snapshots.
        format!("{t}.evt.>"),
        format!("{t}.fence.*"),
        format!("{t}.dlq.>"),
        format!("{t}.snap.>"),
        // The crash watch's record of the unpin it makes of a dead owner's partition.
        format!("{t}.unpin.*"),
        // Wake-ups of a partition whose owner died or was handed off.
        format!("{t}.cmd.*"),
        // Heartbeats between the entity type's processes (partition balance).
        format!("{t}.nodes"),
        // Asking whether an owner's process is still there (the crash watch, and a takeover),
        // and answering such asks of other nodes, in their inboxes.
        format!("{t}.alive.*"),
        format!("{inbox}.>"),
        // Outcomes of commands sent with `Jetshard-Reply-To` (`CommandSender::request`).
        format!("{replies}.>"),
        // Answers to operators' status requests (`jetshard status`, `jetshard nodes`), in the
        // operator's inbox (as `as_operator` connects).
        format!("_INBOX_{t}_operator.>"),
    ];
    if provision {
        publish.extend([
            format!("$JS.API.STREAM.CREATE.{cmd}"),
            format!("$JS.API.STREAM.CREATE.{journal}"),
            format!("$JS.API.CONSUMER.CREATE.{cmd}.>"),
        ]);
    }
    let quoted = |subjects: &[String]| {
        subjects
            .iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "{{ publish: {{ allow: [{}] }}, subscribe: {{ allow: [\"{inbox}.>\", \"{t}.nodes\", \"{t}.alive.*\", \"{t}.fence.*\", \"{t}.status\", \"{t}.query.*.*\", \"$JS.EVENT.ADVISORY.CONSUMER.PAUSE.{cmd}.*\"] }} }}",
        quoted(&publish)
    )
}

/// A client of `entity_type`: sends commands and hears the stream's acknowledgements.
fn client_permissions(entity_type: &str, inbox: &str) -> String {
    format!(
        "{{ publish: {{ allow: [\"{entity_type}.cmd.*\"] }}, subscribe: {{ allow: [\"{inbox}.>\"] }} }}"
    )
}

/// An operator of `entity_type` (`jetshard::admin`, the `jetshard` command: status, pause,
/// resume, unpin, dead letters listed, replayed and purged), as `docs/SECURITY.md` lists it.
fn operator_permissions(entity_type: &str, inbox: &str) -> String {
    let t = entity_type;
    let upper = t.to_ascii_uppercase().replace('-', "_");
    let (cmd, journal) = (format!("{upper}_CMD"), format!("{upper}_JOURNAL"));
    let publish = [
        format!("$JS.API.STREAM.INFO.{cmd}"),
        format!("$JS.API.STREAM.INFO.{journal}"),
        format!("$JS.API.CONSUMER.INFO.{cmd}.*"),
        format!("$JS.API.STREAM.MSG.GET.{journal}"),
        format!("$JS.API.CONSUMER.PAUSE.{cmd}.*"),
        format!("$JS.API.CONSUMER.UNPIN.{cmd}.*"),
        format!("$JS.API.CONSUMER.CREATE.{journal}"),
        format!("$JS.API.CONSUMER.CREATE.{journal}.>"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{journal}.*"),
        format!("$JS.API.CONSUMER.DELETE.{journal}.*"),
        format!("{t}.cmd.*"),
        format!("$JS.API.STREAM.PURGE.{journal}"),
        format!("{t}.status"),
    ]
    .map(|s| format!("\"{s}\""))
    .join(", ");
    format!("{{ publish: {{ allow: [{publish}] }}, subscribe: {{ allow: [\"{inbox}.>\"] }} }}")
}

/// One account with JetStream and the users of the permission tests.
fn permissions_config() -> String {
    format!(
        "accounts {{\n  APP {{\n    jetstream: enabled\n    users: [\n\
         {{ user: admin, password: admin }}\n\
         {{ user: ledger, password: ledger, permissions: {} }}\n\
         {{ user: ledger_runtime, password: ledger_runtime, permissions: {} }}\n\
         {{ user: ledger_client, password: ledger_client, permissions: {} }}\n\
         {{ user: parcel, password: parcel, permissions: {} }}\n\
         {{ user: parcel_client, password: parcel_client, permissions: {} }}\n\
         {{ user: ledger_operator, password: ledger_operator, permissions: {} }}\n\
         ]\n  }}\n}}\n",
        node_permissions("ledger", true, "_INBOX_ledger", "_INBOX_ledger_client"),
        node_permissions(
            "ledger",
            false,
            "_INBOX_ledger_runtime",
            "_INBOX_ledger_client"
        ),
        client_permissions("ledger", "_INBOX_ledger_client"),
        node_permissions("parcel", true, "_INBOX_parcel", "_INBOX_parcel_client"),
        client_permissions("parcel", "_INBOX_parcel_client"),
        operator_permissions("ledger", "_INBOX_ledger_operator"),
    )
}

/// A user of the permissions configuration, with its own inbox prefix.
fn user(name: &str) -> ConnectOptions {
    ConnectOptions::with_user_and_password(name.into(), name.into())
        .custom_inbox_prefix(format!("_INBOX_{name}"))
}

async fn permissions_server() -> NatsServer {
    server(permissions_config(), user("admin")).await
}

/// Every permission violation the server logged.
fn violations(server: &NatsServer) -> Vec<String> {
    std::fs::read_to_string(server.log_path())
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("Violation"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_with_only_the_documented_permissions_run_their_entity_types() {
    init_tracing();
    let server = permissions_server().await;
    let connect = |name: &'static str| {
        let url = server.url();
        async move { user(name).connect(url).await.unwrap() }
    };
    // Two entity types side by side, each node with only its own permissions; both provision
    // their streams on first start.
    let ledger = runs(
        "ledger",
        connect("ledger").await,
        connect("ledger_client").await,
    );
    let parcel = runs(
        "parcel",
        connect("parcel").await,
        connect("parcel_client").await,
    );
    futures::future::join(ledger, parcel).await;
    assert_eq!(violations(&server), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_only_the_documented_permissions_answers_a_request() {
    init_tracing();
    let server = permissions_server().await;
    let config = config("ledger");
    let node = user("ledger").connect(server.url()).await.unwrap();
    let system = ShardSystem::start::<Ledger>(node, config.clone())
        .await
        .unwrap();
    let client = user("ledger_client").connect(server.url()).await.unwrap();
    let sender = CommandSender::<Ledger>::new(client, &config);
    // The node publishes each outcome to the client's inbox (`Jetshard-Reply-To`).
    let timeout = Duration::from_secs(10);
    let applied = sender
        .request_outcome("r", &LedgerCmd::Append { n: 0 }, timeout)
        .await
        .unwrap();
    assert!(
        matches!(applied, jetshard::CommandOutcome::Applied { events: 1, .. }),
        "{applied:?}"
    );
    let rejected = sender
        .request_outcome("r", &LedgerCmd::Refuse, timeout)
        .await
        .unwrap();
    assert!(
        matches!(rejected, jetshard::CommandOutcome::Rejected { .. }),
        "{rejected:?}"
    );
    system.shutdown().await.unwrap();
    assert_eq!(violations(&server), Vec::<String>::new());
}

/// An owner that dies (here: its connection cut, so that its `<t>.alive.<incarnation>` has no
/// responders) is found dead by a standby holding only the documented permissions: the standby's
/// crash watch records the unpin in the journal and makes it, and owns the partition long before
/// the 30-s pin TTL, with no permission violation logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_watch_with_only_the_documented_permissions_moves_a_dead_owner_s_partition() {
    init_tracing();
    let server = permissions_server().await;
    let config = |node: &str| {
        jetshard_tests::config("ledger", 1, node)
            .codec(jetshard::Codec::Json)
            .pin_ttl(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let proxy = TcpProxy::start(server.addr()).await.unwrap();
    let a_client = user("ledger").connect(proxy.url()).await.unwrap();
    let a = ShardSystem::start::<Ledger>(a_client, config("a"))
        .await
        .unwrap();
    let client = user("ledger_client").connect(server.url()).await.unwrap();
    let sender = CommandSender::<Ledger>::new(client, &config("a"));
    let timeout = Duration::from_secs(10);
    sender
        .request_outcome("r", &LedgerCmd::Append { n: 0 }, timeout)
        .await
        .unwrap();
    let b_client = user("ledger").connect(server.url()).await.unwrap();
    let b = ShardSystem::start::<Ledger>(b_client, config("b"))
        .await
        .unwrap();

    proxy.cut();
    sender.send("r", &LedgerCmd::Append { n: 1 }).await.unwrap();
    wait_until(
        Duration::from_secs(10),
        "the standby owns the dead owner's partition",
        || async {
            b.status()
                .await
                .is_ok_and(|s| s.iter().all(|p| p.generation.is_some()))
        },
    )
    .await
    .unwrap();
    let applied = sender
        .request_outcome("r", &LedgerCmd::Append { n: 2 }, timeout)
        .await
        .unwrap();
    assert!(
        matches!(applied, jetshard::CommandOutcome::Applied { .. }),
        "{applied:?}"
    );
    assert_eq!(violations(&server), Vec::<String>::new());
    b.shutdown().await.unwrap();
    proxy.heal();
    let _ = a.shutdown().await;
}

/// Runs `jetshard --json <args>` as the user `ledger_operator`, and parses its output.
async fn as_operator(url: &str, args: &[&str]) -> serde_json::Value {
    let mut out = Vec::new();
    let argv = [
        "jetshard",
        "--nats-url",
        url,
        "--user",
        "ledger_operator",
        "--password",
        "ledger_operator",
        "--inbox-prefix",
        "_INBOX_ledger_operator",
        "--json",
    ]
    .into_iter()
    .chain(args.iter().copied());
    jetshard_cli::run(argv, &mut out)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e:#}"));
    serde_json::from_slice(&out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_with_only_the_documented_permissions_runs_every_admin_command() {
    init_tracing();
    let server = permissions_server().await;
    let url = server.url();
    let config = config("ledger");
    let node = user("ledger").connect(&url).await.unwrap();
    let system = ShardSystem::start::<Ledger>(node, config.clone())
        .await
        .unwrap();
    // A command, and a body that is no command: a dead letter.
    let client = user("ledger_client").connect(&url).await.unwrap();
    CommandSender::<Ledger>::new(client.clone(), &config)
        .send("a", &LedgerCmd::Append { n: 0 })
        .await
        .unwrap();
    let js = jetstream::new(client);
    js.publish("ledger.cmd.a", "no command".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let dead_lettered = || async {
        let status = system.status().await.unwrap();
        status.iter().map(|p| p.dead_lettered).sum::<u64>()
    };
    wait_until(Duration::from_secs(15), "a dead letter", || async {
        dead_lettered().await == 1
    })
    .await
    .unwrap();

    // The `jetshard` command as the operator, connected with the flags a secured server needs.
    let status = as_operator(&url, &["status", "ledger"]).await;
    assert_eq!(status.as_array().unwrap().len(), 2, "{status}");
    as_operator(&url, &["pause", "ledger", "0", "--for-secs", "60"]).await;
    as_operator(&url, &["resume", "ledger", "0"]).await;
    as_operator(&url, &["unpin", "ledger", "1"]).await;
    let letters = as_operator(&url, &["dead-letters", "ledger"]).await;
    let seq = letters[0]["seq"].as_u64().unwrap();
    // Replayed as it is, it is dead-lettered again.
    let seq = seq.to_string();
    let replayed = as_operator(&url, &["dead-letters", "replay", "ledger", &seq]).await;
    assert_eq!(replayed["duplicate"], false, "{replayed}");
    wait_until(
        Duration::from_secs(15),
        "the replay dead-lettered",
        || async { dead_lettered().await == 2 },
    )
    .await
    .unwrap();
    // Once the replay's termination has reached the server, both go.
    jetshard_tests::drained(&user("admin").connect(&url).await.unwrap(), "ledger").await;
    let purged = as_operator(&url, &["dead-letters", "purge", "ledger"]).await;
    assert_eq!(
        (&purged["purged"], &purged["kept"]),
        (&2.into(), &0.into()),
        "{purged}"
    );
    system.shutdown().await.unwrap();
    assert_eq!(violations(&server), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_process_with_runtime_permissions_only_runs_streams_an_operator_provisioned() {
    init_tracing();
    let server = permissions_server().await;
    // The operator provisions (here: a first start and stop as admin).
    let admin = user("admin").connect(server.url()).await.unwrap();
    jetshard_tests::provision(admin.clone(), &config("ledger")).await;

    // The node process holds only the runtime permissions.
    let spec = NodeSpec {
        partitions: 2,
        pin_ttl: Duration::from_secs(1),
        ack_wait: Duration::from_secs(3),
        env: vec![],
    };
    let options = NodeOptions {
        args: [
            "--user",
            "ledger_runtime",
            "--password",
            "ledger_runtime",
            "--inbox-prefix",
            "_INBOX_ledger_runtime",
        ]
        .map(String::from)
        .to_vec(),
        log_file: None,
    };
    let node = Node::start_with(&server.url(), "secure-node", &spec, &options).await;
    let client = user("ledger_client").connect(server.url()).await.unwrap();
    let sender = CommandSender::<Ledger>::new(client, &config("ledger"));
    for n in 0..10 {
        sender.send("x", &LedgerCmd::Append { n }).await.unwrap();
    }
    let js = jetstream::new(admin);
    wait_until(Duration::from_secs(20), "10 events written", || async {
        js.get_stream("LEDGER_JOURNAL")
            .await
            .unwrap()
            .info()
            .await
            .is_ok_and(|i| i.state.messages >= 11)
    })
    .await
    .unwrap();
    let partition = jetshard::partition_of(&jetshard::EntityId::new("x").unwrap(), 2);
    assert_eq!(node.owned(), vec![partition]);
    assert_eq!(violations(&server), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_another_entity_type_cannot_touch_the_ledger_streams() {
    init_tracing();
    let server = permissions_server().await;
    let ledger_node = user("ledger").connect(server.url()).await.unwrap();
    let ledger_client = user("ledger_client").connect(server.url()).await.unwrap();
    runs("ledger", ledger_node, ledger_client).await;
    let admin = jetstream::new(user("admin").connect(server.url()).await.unwrap());
    let journal_before = jetshard_tests::stream_info(&admin, "LEDGER_JOURNAL")
        .await
        .state
        .clone();

    let parcel = user("parcel").connect(server.url()).await.unwrap();
    // It cannot run the ledger...
    let started = ShardSystem::start::<Ledger>(parcel.clone(), config("ledger")).await;
    assert!(
        matches!(started, Err(jetshard::Error::JetStream { .. })),
        "{:?}",
        started.as_ref().err()
    );
    // Each refused request goes unanswered until this timeout.
    let js = jetstream::ContextBuilder::new()
        .timeout(Duration::from_secs(1))
        .build(parcel.clone());
    // ...read its streams...
    assert!(js.get_stream("LEDGER_JOURNAL").await.is_err());
    let journal = js.get_stream_no_info("LEDGER_JOURNAL").await.unwrap();
    assert!(
        journal
            .direct_get_last_for_subject("ledger.fence.0")
            .await
            .is_err()
    );
    assert!(
        journal
            .create_consumer(pull::OrderedConfig {
                filter_subject: "ledger.>".into(),
                ..Default::default()
            })
            .await
            .is_err()
    );
    // ...pull its commands...
    let commands = js.get_stream_no_info("LEDGER_CMD").await.unwrap();
    assert!(commands.consumer_info("ledger-p0").await.is_err());
    // ...write its journal (a forged fence record and event)...
    for subject in [
        "ledger.fence.0",
        "ledger.evt.0.a",
        "ledger.dlq.0",
        "ledger.dlq.0.a",
        "ledger.snap.0.a",
    ] {
        let ack = async { js.publish(subject, "forged".into()).await?.await }.await;
        assert!(ack.is_err(), "{subject} was written");
    }
    // ...or delete or purge anything.
    assert!(js.delete_stream("LEDGER_CMD").await.is_err());
    assert!(js.delete_stream("LEDGER_JOURNAL").await.is_err());
    assert!(commands.delete_consumer("ledger-p0").await.is_err());

    // The ledger's streams are as they were, and the server logged each refusal.
    let journal_after = jetshard_tests::stream_info(&admin, "LEDGER_JOURNAL")
        .await
        .state
        .clone();
    assert_eq!(journal_after.messages, journal_before.messages);
    assert_eq!(journal_after.last_sequence, journal_before.last_sequence);
    let consumers = admin
        .get_stream("LEDGER_CMD")
        .await
        .unwrap()
        .consumer_info("ledger-p0")
        .await;
    assert!(consumers.is_ok(), "the partition consumer was deleted");
    let refused = violations(&server);
    assert!(
        refused.iter().all(|l| l.contains("user:parcel\"")),
        "{refused:#?}"
    );
    assert!(refused.len() >= 8, "{refused:#?}");
}
