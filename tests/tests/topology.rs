//! Streams and partitions: placement agrees with the server, and a stream created with another
//! partition count (or replica count) is a clear error at start, never a silent change.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::consumer::pull;
use futures::StreamExt;
use jetshard::{EntityId, Error, ShardConfig, ShardSystem, partition_of};
use jetshard_tests::ledger::Ledger;
use jetshard_tests::{init_tracing, ledger_config, provision};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_placement_matches_the_server_for_2000_ids() {
    init_tracing();
    let (_server, client, _) = jetshard_tests::served().await;
    let partitions = 13;
    // Streams exactly as the shard system creates them.
    let config = ledger_config(partitions, "n1")
        .command_retention(jetshard::CommandRetention::Limits)
        .build()
        .unwrap();
    provision(client.clone(), &config).await;
    let js = async_nats::jetstream::new(client);
    let mut ids = Vec::new();
    for i in 0..2000 {
        let id = match i % 4 {
            0 => format!("o-{i}"),
            1 => format!("customer_{}", i * 7919),
            2 => format!("Ünïcødé-{i}"),
            _ => format!("{:x}", i * 2654435761u64),
        };
        js.publish(format!("ledger.cmd.{id}"), "{}".into())
            .await
            .unwrap();
        ids.push(id);
    }
    js.publish("ledger.cmd.end", "{}".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let stream = js.get_stream("LEDGER_CMD").await.unwrap();
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: "ledger.cmd.*.*".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap().take(ids.len() + 1);
    let mut stored: HashMap<String, u32> = HashMap::new();
    while let Some(message) = tokio::time::timeout(Duration::from_secs(10), messages.next())
        .await
        .unwrap()
    {
        let message = message.unwrap();
        let tokens: Vec<&str> = message.subject.split('.').collect();
        stored.insert(tokens[3].to_owned(), tokens[2].parse().unwrap());
    }
    let mut checked = 0;
    for id in &ids {
        let ours = partition_of(&EntityId::new(id).unwrap(), partitions);
        assert_eq!(stored[id], ours, "{id}");
        checked += 1;
    }
    assert_eq!(checked, 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_count_mismatch_with_existing_streams_is_a_clear_error() {
    init_tracing();
    let (_server, client, _) = jetshard_tests::served().await;
    provision(client.clone(), &ledger_config(8, "n1").build().unwrap()).await;
    let error = match ShardSystem::start::<Ledger>(
        client.clone(),
        ledger_config(16, "n1").build().unwrap(),
    )
    .await
    {
        Ok(_) => panic!("started with 16 partitions over streams made for 8"),
        Err(error) => error,
    };
    match &error {
        Error::PartitionMismatch {
            existing,
            configured,
            ..
        } => {
            assert_eq!(existing, "8");
            assert_eq!(*configured, 16);
        }
        other => panic!("unexpected error: {other}"),
    }
    assert!(error.to_string().contains("8 partitions but 16"), "{error}");
    // The streams are untouched: the old count still starts.
    provision(client, &ledger_config(8, "n1").build().unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_with_other_settings_is_a_clear_error() {
    init_tracing();
    let (_server, client, _) = jetshard_tests::served().await;
    provision(client.clone(), &ledger_config(2, "n1").build().unwrap()).await;
    let other = ledger_config(2, "n1")
        .ack_wait(Duration::from_secs(9))
        .build()
        .unwrap();
    let error = ShardSystem::start::<Ledger>(client, other)
        .await
        .err()
        .expect("must refuse");
    assert!(matches!(error, Error::Incompatible { .. }), "{error}");
    assert!(error.to_string().contains("ack_wait"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_count_mismatch_with_existing_streams_is_a_clear_error() {
    init_tracing();
    let (_server, client, _) = jetshard_tests::served().await;
    provision(client.clone(), &ledger_config(2, "n1").build().unwrap()).await;
    let replicated = ledger_config(2, "n1").replicas(3).build().unwrap();
    let error = ShardSystem::start::<Ledger>(client.clone(), replicated)
        .await
        .err()
        .expect("started for 3 replicas over streams of 1");
    assert!(matches!(error, Error::Incompatible { .. }), "{error}");
    assert!(
        error.to_string().contains("1 replicas, configured 3"),
        "{error}"
    );
    // The streams are untouched: the old count still starts.
    provision(client, &ledger_config(2, "n1").build().unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_down_at_start_is_a_jetstream_error() {
    // This test's own client (retrying its first connection) meets the server's kill.
    let (server, _, _) = jetshard_tests::served().await;
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(server.url())
        .await
        .unwrap();
    server.kill().unwrap();
    let config = ShardConfig::builder("ledger")
        .write_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let started = tokio::time::timeout(
        Duration::from_secs(30),
        ShardSystem::start::<Ledger>(client, config),
    )
    .await
    .expect("start must not hang");
    assert!(
        matches!(started, Err(Error::JetStream { .. })),
        "{:?}",
        started.err()
    );
}

/// Why jetshard's consumers have no `max_deliver` of their own: once a message's deliveries are
/// used, the server never delivers it again, though it was never acknowledged, and the ack
/// floor moves past it with the next acknowledgement. Takeovers alone could use a command's
/// deliveries up; the next owner, reading the in-flight window from the ack floor, would never
/// see it: lost without a trace. jetshard gives commands up itself, with a dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_stops_delivering_past_max_deliver_so_jetshard_sets_none() {
    use async_nats::jetstream::{consumer, stream};

    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    let work = js
        .create_stream(stream::Config {
            name: "WORK".to_owned(),
            subjects: vec!["work.>".to_owned()],
            retention: stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .unwrap();
    let ack_wait = Duration::from_millis(500);
    let consumer = work
        .create_consumer(pull::Config {
            durable_name: Some("w".to_owned()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait,
            max_deliver: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    js.publish("work.1", "job".into())
        .await
        .unwrap()
        .await
        .unwrap();
    // Two deliveries, neither acknowledged (owners that died or stalled with it in hand), and
    // then none, for many ack waits.
    for (delivery, wait) in [(Some(1), 3), (Some(2), 3), (None, 6)] {
        let mut batch = consumer
            .fetch()
            .max_messages(1)
            .expires(ack_wait * wait)
            .messages()
            .await
            .unwrap();
        let got = batch
            .next()
            .await
            .map(|m| m.unwrap().info().unwrap().delivered);
        assert_eq!(got, delivery);
    }
    let mut consumer = consumer;
    let info = consumer.info().await.unwrap();
    assert_eq!(
        (info.num_ack_pending, info.num_pending),
        (0, 0),
        "pending for nobody"
    );
    // The next message is delivered and acknowledged: the ack floor moves past the first one,
    // which stays in the stream. A recovery that reads from the ack floor never sees it again.
    js.publish("work.2", "next".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let mut batch = consumer
        .fetch()
        .max_messages(1)
        .expires(ack_wait * 3)
        .messages()
        .await
        .unwrap();
    let next = batch.next().await.expect("the next message").unwrap();
    assert_eq!(next.info().unwrap().stream_sequence, 2);
    next.double_ack().await.unwrap();
    let info = consumer.info().await.unwrap();
    assert_eq!(info.ack_floor.stream_sequence, 2);
    let mut work = js.get_stream("WORK").await.unwrap();
    assert_eq!(
        work.info().await.unwrap().state.messages,
        1,
        "never acknowledged"
    );

    // jetshard's consumers never give up at the server.
    provision(client.clone(), &ledger_config(2, "n1").build().unwrap()).await;
    let ledger = js.get_stream("LEDGER_CMD").await.unwrap();
    let mut consumers = ledger.consumers();
    let mut seen = 0;
    while let Some(info) = consumers.next().await {
        assert_eq!(info.unwrap().config.max_deliver, -1);
        seen += 1;
    }
    assert_eq!(seen, 2);
}

/// A journal stream created by a jetshard before snapshots (no per-entity dead-letter or
/// snapshot subjects, no roll-ups) is upgraded in place, additively, and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_stream_of_an_earlier_version_gains_the_new_subjects_and_roll_ups() {
    use async_nats::jetstream::stream;

    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    js.create_stream(stream::Config {
        name: "LEDGER_JOURNAL".to_owned(),
        subjects: vec![
            "ledger.evt.*.*".to_owned(),
            "ledger.fence.*".to_owned(),
            "ledger.dlq.*".to_owned(),
        ],
        allow_atomic_publish: true,
        allow_direct: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let config = ledger_config(1, "n1").build().unwrap();
    provision(client.clone(), &config).await;
    let info = jetshard_tests::stream_info(&js, "LEDGER_JOURNAL")
        .await
        .config
        .clone();
    for subject in ["ledger.dlq.*.*", "ledger.snap.*.*", "ledger.evt.*.*"] {
        assert!(info.subjects.iter().any(|s| s == subject), "{info:?}");
    }
    assert!(info.allow_rollup, "{info:?}");
}

/// The codec's name recorded with a stream (`jetshard.codec` in its metadata), if any.
async fn recorded_codec(js: &async_nats::jetstream::Context, stream: &str) -> Option<String> {
    let mut stream = js.get_stream(stream).await.unwrap();
    let info = stream.info().await.unwrap();
    info.config.metadata.get("jetshard.codec").cloned()
}

/// Both of the ledger's streams record the JSON codec.
async fn both_record_json(js: &async_nats::jetstream::Context) {
    for stream in ["LEDGER_CMD", "LEDGER_JOURNAL"] {
        assert_eq!(recorded_codec(js, stream).await.as_deref(), Some("json"));
    }
}

/// A node configured for bincode over the ledger's streams, written as JSON, is refused at
/// start: the error names the setting and both codecs.
async fn a_bincode_node_is_refused(client: &async_nats::Client) {
    let bincode = ledger_config(2, "n2")
        .codec(jetshard::Codec::Bincode)
        .build()
        .unwrap();
    let error = ShardSystem::start::<Ledger>(client.clone(), bincode)
        .await
        .err()
        .expect("started with bincode over streams written as JSON");
    match &error {
        Error::StoredSettingMismatch {
            setting,
            stored,
            configured,
            ..
        } => {
            assert_eq!(*setting, "codec");
            assert_eq!(stored, "json");
            assert_eq!(configured, "bincode");
        }
        other => panic!("unexpected error: {other}"),
    }
    let text = error.to_string();
    assert!(
        text.contains("codec json, but bincode is configured"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codec_mismatch_with_existing_streams_is_refused_at_start() {
    init_tracing();
    let (_server, client, _) = jetshard_tests::served().await;
    // The ledger's test config is JSON-encoded; a node configured for bincode must not start.
    provision(client.clone(), &ledger_config(2, "n1").build().unwrap()).await;
    let js = async_nats::jetstream::new(client.clone());
    both_record_json(&js).await;
    a_bincode_node_is_refused(&client).await;
    // The streams are untouched: the recorded codec still starts.
    provision(client, &ledger_config(2, "n1").build().unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_from_before_the_codec_record_get_it_at_first_start_and_are_then_checked() {
    init_tracing();
    let (_server, client, _) = jetshard_tests::served().await;
    provision(client.clone(), &ledger_config(2, "n1").build().unwrap()).await;
    let js = async_nats::jetstream::new(client.clone());
    // Streams as an earlier jetshard left them: no codec recorded.
    for stream in ["LEDGER_CMD", "LEDGER_JOURNAL"] {
        let mut handle = js.get_stream(stream).await.unwrap();
        let mut config = handle.info().await.unwrap().config.clone();
        config.metadata.remove("jetshard.codec");
        js.update_stream(config).await.unwrap();
        assert_eq!(recorded_codec(&js, stream).await, None);
    }
    // The first start of this version records its codec...
    let system =
        ShardSystem::start::<Ledger>(client.clone(), ledger_config(2, "n1").build().unwrap())
            .await
            .unwrap();
    both_record_json(&js).await;
    // ... and a node with another codec is refused from then on, while the first one runs.
    a_bincode_node_is_refused(&client).await;
    system.shutdown().await.unwrap();
}

/// A command sent before any stream takes its subject ("no responders": nothing stored) is
/// published again until one does: a sender may start before the system that creates the
/// streams, or meet a new stream whose interest has not reached its server yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_sent_before_the_streams_exist_is_stored_once_they_do() {
    init_tracing();
    let (server, client, _) = jetshard_tests::served().await;
    let config = ledger_config(2, "n1").build().unwrap();
    let sender_client = server.connect().await.unwrap();
    let sender = jetshard::CommandSender::<Ledger>::new(sender_client.clone(), &config);
    let send = tokio::spawn(async move {
        sender
            .send("a-1", &jetshard_tests::ledger::LedgerCmd::Append { n: 0 })
            .await
    });
    // Two publishes out and the send still running: the first was answered "no responders".
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while sender_client
        .statistics()
        .out_messages
        .load(std::sync::atomic::Ordering::Relaxed)
        < 2
    {
        assert!(
            !send.is_finished(),
            "the send ended after one publish: {:?}",
            send.await
        );
        assert!(tokio::time::Instant::now() < deadline, "no second publish");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    provision(client.clone(), &config).await;
    let seq = tokio::time::timeout(Duration::from_secs(10), send)
        .await
        .expect("the send must end")
        .unwrap()
        .expect("stored once the streams exist");
    let js = async_nats::jetstream::new(client);
    // The provisioning system may have taken the command already: the last sequence counts.
    let stream = js.get_stream("LEDGER_CMD").await.unwrap();
    let last = stream.cached_info().state.last_sequence;
    assert_eq!((seq, last), (1, 1), "stored once, as the first command");
}

/// With no stream at all, a send ends in a typed error after [`jetshard::test_support::NO_STREAM_WAIT`], and
/// nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_no_stream_takes_is_a_typed_error() {
    init_tracing();
    let (_server, client, _) = jetshard_tests::served().await;
    let config = ledger_config(2, "n1").build().unwrap();
    let sender = jetshard::CommandSender::<Ledger>::new(client.clone(), &config);
    let error = tokio::time::timeout(
        jetshard::test_support::NO_STREAM_WAIT * 5,
        sender.send("a-1", &jetshard_tests::ledger::LedgerCmd::Append { n: 0 }),
    )
    .await
    .expect("the send must end")
    .expect_err("no stream takes the command");
    match &error {
        Error::NoCommandStream { subject, waited } => {
            assert_eq!(subject, "ledger.cmd.a-1");
            assert!(
                *waited >= jetshard::test_support::NO_STREAM_WAIT,
                "{waited:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(error.to_string().contains("nothing was stored"), "{error}");
    let js = async_nats::jetstream::new(client);
    assert!(
        js.get_stream("LEDGER_CMD").await.is_err(),
        "no stream was made"
    );
}
