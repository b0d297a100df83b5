//! The `jetshard` admin command's dead letters: one replayed once as a new command, ranges and
//! all replayed, and purges, which keep a dead letter whose command could still come back.

use std::time::Duration;

use async_nats::jetstream;
use jetshard::{Codec, CommandRetention, CommandSender, ShardSystem};
use jetshard_testkit::wait_until;
use jetshard_tests::cli::{dead_letters, jetshard_json};
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::{applied, init_tracing, ledger_config};
use serde_json::Value;

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
        jetshard_tests::counts(&system).await.dead_lettered == 2
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
        jetshard_tests::counts(&system).await.dead_lettered == 1
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
