//! Retries, pins and pull loops: a command sent twice with one idempotency key, a pull loop
//! that ends, a pin that cannot be unpinned, a dead letter that cannot be written yet. Each
//! shows the partition moving on. With the `Fragile` entity (`tests/support/fragile.rs`).

use std::time::Duration;

use async_nats::jetstream;
use jetshard::CommandSender;
use jetshard::admin::Admin;
use jetshard_testkit::{NatsServer, wait_until};
use jetshard_tests::fragile::{self, Fragile, FragileCmd};
use jetshard_tests::{assert_applied, id_in, init_tracing, start_owning};

const ASK: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_sent_twice_with_one_idempotency_key_is_one_command() {
    init_tracing();
    let (_server, client, _) = jetshard_tests::served().await;
    let config = fragile::retrying(1, 3).build().unwrap();
    let (sender, system) = fragile::start(&client, &config).await;
    // A client that timed out and sends again.
    let first = sender
        .send_with_key("a", "deposit-1", &FragileCmd::Add(5))
        .await
        .unwrap();
    let again = sender
        .send_with_key("a", "deposit-1", &FragileCmd::Add(5))
        .await
        .unwrap();
    assert_eq!(first, again, "the retry is the first command");
    // The same key for another entity is another command.
    sender
        .send_with_key("b", "deposit-1", &FragileCmd::Add(5))
        .await
        .unwrap();
    let outcome = sender
        .request_outcome("a", &FragileCmd::Check(5), ASK)
        .await
        .unwrap();
    assert_applied(&outcome);
    for key in ["", "has space", &"k".repeat(jetshard::MAX_KEY_LEN + 1)] {
        assert!(
            matches!(
                sender.send_with_key("a", key, &FragileCmd::Add(1)).await,
                Err(jetshard::Error::InvalidKey { .. })
            ),
            "{key:?}"
        );
    }
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_loop_that_ends_releases_its_partition_and_escalates() {
    init_tracing();
    let (server, client, _) = jetshard_tests::served().await;
    let node = server.connect().await.unwrap();
    let config = fragile::config(2)
        .max_owner_restarts(2, Duration::from_secs(60))
        .build()
        .unwrap();
    let sender = CommandSender::<Fragile>::new(client.clone(), &config);
    let ids: Vec<String> = (0..2).map(|p| id_in("e", p, 2)).collect();
    let system = start_owning::<Fragile>(&node, &config, async || {
        for id in &ids {
            sender.send(id, &FragileCmd::Add(1)).await.unwrap();
        }
    })
    .await;
    let mut events = system.ownership_events();

    // The node's connection is drained and closed: its pull loops end.
    node.drain().await.unwrap();
    let mut released = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        while released.len() < 2 {
            if let Ok(event) = events.recv().await
                && let jetshard::OwnershipChange::Released { reason } = event.change
            {
                assert_eq!(reason, "pull loop ended");
                released.push(event.partition);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("partitions released: {released:?}"));
    // Owners restarted on a closed client fail again: the system gives up, and its supervisor
    // is told.
    wait_until(Duration::from_secs(20), "the system failed", || async {
        system.status().await.is_err()
    })
    .await
    .unwrap();
}

/// A server where the node may do everything but unpin.
async fn server_without_unpin() -> NatsServer {
    let config = r#"
accounts {
  APP {
    jetstream: enabled
    users: [
      { user: admin, password: admin }
      { user: node, password: node, permissions: {
          publish: { allow: [">"], deny: ["$JS.API.CONSUMER.UNPIN.>"] }
          subscribe: { allow: [">"] } } }
    ]
  }
}
"#;
    NatsServer::builder()
        .config(config)
        .connect_options(async_nats::ConnectOptions::with_user_and_password(
            "admin".into(),
            "admin".into(),
        ))
        .start()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_pin_moves_even_when_it_cannot_be_unpinned() {
    init_tracing();
    let server = server_without_unpin().await;
    let admin = server.connect().await.unwrap();
    let node = async_nats::ConnectOptions::with_user_and_password("node".into(), "node".into())
        .connect(server.url())
        .await
        .unwrap();
    let config = fragile::config(1)
        .write_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let sender = CommandSender::<Fragile>::new(admin.clone(), &config);
    let system = start_owning::<Fragile>(&node, &config, async || {
        sender.send("a", &FragileCmd::Add(1)).await.unwrap();
    })
    .await;
    let generation = system.status().await.unwrap()[0].generation.unwrap();

    // Another claimant takes a generation without being pinned (a stalled process waking up
    // with buffered commands): the node's next write is fenced, and it refuses its pin.
    let js = jetstream::new(admin.clone());
    let journal = js.get_stream("FRAGILE_JOURNAL").await.unwrap();
    let last = journal
        .get_last_raw_message_by_subject("fragile.fence.0")
        .await
        .unwrap();
    let record = jetshard::FenceRecord::new(0, generation + 1, "rogue");
    js.send_publish(
        "fragile.fence.0",
        async_nats::jetstream::message::PublishMessage::build()
            .payload(serde_json::to_vec(&record).unwrap().into())
            .header("Jetshard-Generation", (generation + 1).to_string())
            .expected_last_subject_sequence(last.sequence),
    )
    .await
    .unwrap()
    .await
    .unwrap();

    // The node cannot unpin itself; the pin lapses all the same, and it is pinned afresh and
    // takes a new generation.
    let outcome = sender
        .request_outcome("a", &FragileCmd::Add(1), Duration::from_secs(20))
        .await
        .unwrap();
    assert_applied(&outcome);
    let status = system.status().await.unwrap();
    assert!(
        status[0].generation.is_some_and(|g| g > generation + 1),
        "{status:?}"
    );
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_given_up_while_its_dead_letter_cannot_be_written_waits_until_it_can() {
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    let config = fragile::retrying(1, 1).build().unwrap();
    let (sender, system) = fragile::start(&client, &config).await;
    let outcome = sender
        .request_outcome("a", &FragileCmd::Add(1), ASK)
        .await
        .unwrap();
    assert_applied(&outcome);

    // The journal takes no more records (a full stream refuses them).
    let mut journal = js.get_stream("FRAGILE_JOURNAL").await.unwrap();
    let open = journal.info().await.unwrap().config.clone();
    let full = async_nats::jetstream::stream::Config {
        max_messages: journal.info().await.unwrap().state.messages as i64,
        discard: async_nats::jetstream::stream::DiscardPolicy::New,
        ..open.clone()
    };
    js.update_stream(full).await.unwrap();

    // It fails at its only delivery: given up, but its dead letter cannot be written.
    let bad = sender.send("a", &FragileCmd::BadEncode).await.unwrap();
    sender.send("a", &FragileCmd::Add(1)).await.unwrap();
    wait_until(
        Duration::from_secs(20),
        "dead-letter writes refused",
        || async {
            system
                .status()
                .await
                .is_ok_and(|s| s[0].unconfirmed_writes >= 3 && s[0].commands_in_hand == 2)
        },
    )
    .await
    .unwrap();

    // Once the journal takes records again, the dead letter is written, the command
    // terminated, and the entity goes on after it, in order.
    js.update_stream(open).await.unwrap();
    let outcome = sender
        .request_outcome("a", &FragileCmd::Check(2), Duration::from_secs(20))
        .await
        .unwrap();
    assert_applied(&outcome);
    let letters = Admin::new(client.clone(), "fragile")
        .dead_letters()
        .await
        .unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].command_seq, bad);
    assert!(
        letters[0].reason.contains("cannot be encoded"),
        "{letters:?}"
    );
    wait_until(
        Duration::from_secs(10),
        "the command stream drained",
        || async {
            let mut commands = js.get_stream("FRAGILE_CMD").await.unwrap();
            commands.info().await.is_ok_and(|i| i.state.messages == 0)
        },
    )
    .await
    .unwrap();
    system.shutdown().await.unwrap();
}
