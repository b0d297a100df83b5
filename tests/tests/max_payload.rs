//! Payloads over the server's `max_payload`: a command too large is a typed error at publish,
//! an event too large a dead letter at once; nothing else is lost, the connection stays up,
//! and after a restart the partition is acquired and serves. With `Note`, an entity whose
//! commands and events are as large as a test wants, on a server with a 64 KiB `max_payload`.

use std::time::Duration;

use jetshard::admin::Admin;
use jetshard::{CommandSender, Entity, Error, ShardConfig, ShardSystem};
use jetshard_testkit::{NatsServer, wait_until};
use jetshard_tests::{counts, init_tracing};
use serde::{Deserialize, Serialize};

/// A test entity whose commands and events can be as large as a test wants.
struct Note;

#[derive(Debug, Clone, Serialize, Deserialize)]
enum NoteCmd {
    /// Keep `text`; the event holds only its length.
    Write { text: String },
    /// Keep `text` twice: the event is twice the command.
    Echo { text: String },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
enum NoteEvt {
    Written { len: usize },
    Echoed { text: String },
}

impl Entity for Note {
    type Command = NoteCmd;
    type Event = NoteEvt;
    type State = usize;
    type Rejection = String;

    fn decide(_: &usize, command: NoteCmd) -> Result<Vec<NoteEvt>, String> {
        Ok(vec![match command {
            NoteCmd::Write { text } => NoteEvt::Written { len: text.len() },
            NoteCmd::Echo { text } => NoteEvt::Echoed {
                text: text.repeat(2),
            },
        }])
    }

    fn apply(state: &mut usize, _: &NoteEvt) {
        *state += 1;
    }
}

const MAX_PAYLOAD: usize = 64 * 1024;

async fn small_payload_server() -> NatsServer {
    NatsServer::builder()
        .config(format!("max_payload: {MAX_PAYLOAD}\n"))
        .start()
        .await
        .unwrap()
}

fn note_config() -> ShardConfig {
    ShardConfig::builder("note")
        .partitions(1)
        .node_id("n1")
        .codec(jetshard::Codec::Json)
        .pin_ttl(Duration::from_secs(1))
        .ack_wait(Duration::from_secs(3))
        .retry_delay(Duration::from_millis(50))
        .max_deliver(3)
        .build()
        .unwrap()
}

/// Commands applied and dead-lettered.
async fn applied(system: &ShardSystem) -> (u64, u64) {
    let c = counts(system).await;
    (c.applied, c.dead_lettered)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_over_max_payload_is_a_clear_error_at_publish_and_nothing_is_lost() {
    init_tracing();
    let server = small_payload_server().await;
    let client = server.connect().await.unwrap();
    assert_eq!(client.server_info().max_payload, MAX_PAYLOAD);
    let config = note_config();
    let system = ShardSystem::start::<Note>(client.clone(), config.clone())
        .await
        .unwrap();
    let sender = CommandSender::<Note>::new(client.clone(), &config);
    let small = NoteCmd::Write { text: "hi".into() };

    sender.send("n", &small).await.unwrap();
    let huge = NoteCmd::Write {
        text: "z".repeat(MAX_PAYLOAD + 1),
    };
    let error = sender.send("n", &huge).await.expect_err("over max_payload");
    match &error {
        Error::PayloadTooLarge { size, max } => {
            assert_eq!(*max, MAX_PAYLOAD);
            assert!(*size > MAX_PAYLOAD, "{size}");
        }
        other => panic!("not a payload error: {}", error_chain(other)),
    }
    assert!(error_chain(&error).contains("at most 65536"), "{error}");
    sender.send("n", &small).await.unwrap();

    wait_until(
        Duration::from_secs(10),
        "both small commands applied",
        || async { applied(&system).await == (2, 0) },
    )
    .await
    .unwrap();
    // The connection was never dropped for it.
    assert_eq!(
        client
            .statistics()
            .connects
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    note_restart_serves(&client, system).await;
}

/// Restarts the note node: the partition is acquired again and serves a command.
async fn note_restart_serves(client: &async_nats::Client, system: ShardSystem) {
    system.shutdown().await.unwrap();
    let config = note_config();
    let system = ShardSystem::start::<Note>(client.clone(), config.clone())
        .await
        .unwrap();
    let outcome = CommandSender::<Note>::new(client.clone(), &config)
        .request_outcome(
            "after-restart",
            &NoteCmd::Write { text: "ok".into() },
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert!(
        matches!(outcome, jetshard::CommandOutcome::Applied { .. }),
        "{outcome:?}"
    );
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_event_is_over_max_payload_is_dead_lettered_and_the_entity_goes_on() {
    init_tracing();
    let server = small_payload_server().await;
    let client = server.connect().await.unwrap();
    let config = note_config();
    let system = ShardSystem::start::<Note>(client.clone(), config.clone())
        .await
        .unwrap();
    let sender = CommandSender::<Note>::new(client.clone(), &config);

    let big = NoteCmd::Echo {
        text: "w".repeat(MAX_PAYLOAD * 2 / 3),
    };
    let bad_seq = sender.send("m", &big).await.unwrap();
    for _ in 0..3 {
        sender
            .send("m", &NoteCmd::Write { text: "ok".into() })
            .await
            .unwrap();
    }
    wait_until(
        Duration::from_secs(20),
        "the big one dead-lettered, the others applied",
        || async { applied(&system).await == (3, 1) },
    )
    .await
    .unwrap();
    let letters = Admin::new(client.clone(), "note")
        .dead_letters()
        .await
        .unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].command_seq, bad_seq);
    // A write that can never succeed is given up at once, spending no more deliveries.
    assert_eq!(letters[0].deliveries, 1);
    assert!(
        letters[0].reason.contains("can never be written"),
        "{letters:?}"
    );
    note_restart_serves(&client, system).await;
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
