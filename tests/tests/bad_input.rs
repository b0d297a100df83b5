//! Bad input: payloads that do not decode (hostile ones against the default codec among them),
//! ids that are not one token, payloads over the server's `max_payload`, handlers that always
//! panic, and fuzzed framework records. Each shows the clear error (or the dead letter), that
//! nothing else was lost or held up, and, after a restart of the node, that every partition is
//! acquired again and serves: the worst failures appear only at the next takeover. Bad records
//! and handlers that kill processes: `tests/tests/poison.rs`.
//!
//! Covered elsewhere, not repeated here: a partition-count mismatch with existing streams and a
//! server that is down at start (`tests/tests/topology.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream;
use jetshard::admin::Admin;
use jetshard::{
    Codec, CommandOutcome, CommandSender, Entity, Error, InvalidId, ShardConfig, ShardSystem,
};
use jetshard_testkit::history::{Record, read_journal};
use jetshard_testkit::{NatsServer, wait_until};
use jetshard_tests::ledger::LedgerCmd;
use jetshard_tests::model::Op;
use jetshard_tests::{Scenario, assert_applied, counts, id_in, init_tracing, start_owning};
use serde::{Deserialize, Serialize};

/// A command as JSON, the ledger's codec, as a foreign client would publish it.
fn encode(command: &LedgerCmd) -> Vec<u8> {
    serde_json::to_vec(command).expect("encode")
}

async fn stream_messages(js: &jetstream::Context, stream: &str) -> u64 {
    js.get_stream(stream)
        .await
        .expect("stream")
        .info()
        .await
        .expect("info")
        .state
        .messages
}

/// Payloads that are no ledger command, each a different way of being wrong.
fn garbage() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("empty", Vec::new()),
        ("binary", vec![0xff, 0xfe, 0x00, 0x01, 0x80]),
        ("truncated json", b"{\"Push\":{\"n\":".to_vec()),
        ("wrong field type", b"{\"Push\":{\"n\":\"seven\"}}".to_vec()),
        ("unknown variant", b"{\"Explode\":{}}".to_vec()),
        ("json null", b"null".to_vec()),
        ("trailing bytes", b"{\"Push\":{\"n\":1}} {}".to_vec()),
        (
            "invalid utf-8 in a string",
            b"{\"Push\":{\"n\":\"\xc3\x28\"}}".to_vec(),
        ),
        // Far deeper than serde_json's recursion limit: an error, not a stack overflow.
        (
            "deep nesting",
            [vec![b'['; 20_000], vec![b']'; 20_000]].concat(),
        ),
        (
            "number overflow",
            b"{\"Push\":{\"n\":18446744073709551616}}".to_vec(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_payloads_are_terminated_counted_and_never_block_their_partition() {
    init_tracing();
    let mut s = Scenario::single(2).await;
    // The streams exist; the commands wait for an owner, so it gets them in one batch.
    s.provision().await;

    // Every entity gets good commands with garbage between them, in both partitions.
    let entities = ["g0", "g1", "g2", "g3"];
    let garbage = garbage();
    let mut n = 0;
    for (_, payload) in &garbage {
        for entity in entities {
            s.send_raw(entity, encode(&LedgerCmd::Push { n }), Op::Push(n))
                .await;
            s.send_raw(entity, payload.clone(), Op::Garbage).await;
        }
        n += 1;
    }
    for entity in entities {
        s.send_raw(entity, encode(&LedgerCmd::Push { n }), Op::Push(n))
            .await;
    }
    let system = s.system("n1").await;

    let report = s.check_within(Duration::from_secs(30)).await;
    let bad = (garbage.len() * entities.len()) as u64;
    assert_eq!(report.summary().dead_letters as u64, bad, "{report}");

    // Counted by the owners, and visible to an operator with the payload and the reason.
    let c = counts(&system).await;
    assert_eq!(c.dead_lettered, bad, "{c:?}");
    assert_eq!(c.applied, (n + 1) * entities.len() as u64, "{c:?}");
    let letters = Admin::new(s.client.clone(), "ledger")
        .dead_letters()
        .await
        .unwrap();
    assert_eq!(letters.len() as u64, bad);
    for letter in &letters {
        assert_eq!(letter.deliveries, 1, "terminated at once: {letter:?}");
        assert!(letter.reason.starts_with("malformed"), "{letter:?}");
        assert!(
            garbage.iter().any(|(_, g)| g[..] == letter.payload[..]),
            "the dead letter keeps the payload as published"
        );
    }
    let system = s.restart_serves(system, "n2").await;
    s.check().await;
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_that_are_not_one_token_are_a_typed_error_at_publish_and_nothing_is_stored() {
    init_tracing();
    let s = Scenario::single(2).await;
    let system = s.system("n1").await;
    let (js, sender) = (&s.js, &s.sender);
    let command = LedgerCmd::Push { n: 0 };

    let too_long = "x".repeat(jetshard::MAX_ID_LEN + 1);
    for id in [
        "",
        "a.b",
        "a*",
        ">",
        "a b",
        "tab\there",
        "line\nbreak",
        "\u{7}",
        ".",
        "a.>",
        &too_long,
    ] {
        let error = sender.send(id, &command).await.expect_err(id);
        match &error {
            Error::InvalidId(InvalidId::Empty) => assert_eq!(id, ""),
            Error::InvalidId(InvalidId::TooLong { len, max }) => {
                assert_eq!((*len, *max), (too_long.len(), jetshard::MAX_ID_LEN));
            }
            Error::InvalidId(InvalidId::ForbiddenChar { id: bad, .. }) => assert_eq!(bad, id),
            other => panic!("{id:?}: not an id error: {other:?}"),
        }
        assert!(error.to_string().contains("entity id"), "{error}");
    }
    // A foreign client publishing an id of two tokens reaches no stream at all.
    let refused = js.publish("ledger.cmd.a.b", "{}".into()).await;
    let refused = match refused {
        Ok(ack) => ack.await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(refused.is_err(), "a two-token id was stored");

    assert_eq!(stream_messages(js, "LEDGER_CMD").await, 0);
    assert_eq!(stream_messages(js, "LEDGER_JOURNAL").await, 0);
    // The sender still works for a good id.
    let mut s = s;
    s.send("ok", Op::Push(0)).await;
    let system = s.restart_serves(system, "n2").await;
    s.check().await;
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_command_for_an_over_long_id_is_terminated_and_reported_as_a_dead_letter() {
    init_tracing();
    let mut s = Scenario::single(1).await;
    let system = s.system("n1").await;

    // One subject token to the server, but longer than an entity id may be.
    let long = "y".repeat(jetshard::MAX_ID_LEN + 44);
    let push = encode(&LedgerCmd::Push { n: 0 });
    s.send_raw("before", push.clone(), Op::Push(0)).await;
    // Not a command the entity can take: the checker expects it dead-lettered.
    let bad = s.send_raw(&long, push.clone(), Op::Garbage).await;
    s.send_raw("after", push, Op::Push(0)).await;

    // The partition moves on: every command worked through, and the over-long one has its
    // dead letter (the check panics with the report otherwise).
    let report = s.check_within(Duration::from_secs(10)).await;
    let letters = Admin::new(s.client.clone(), "ledger")
        .dead_letters()
        .await
        .unwrap();
    let counted = counts(&system).await.dead_lettered;
    // Its dead letter names an id no entity can have: the next acquisition skips it.
    let system = s.restart_serves(system, "n2").await;
    s.check().await;
    system.shutdown().await.unwrap();
    // An operator can see what was thrown away, as for any other command given up.
    assert!(
        report.is_ok() && counted == 1,
        "the command {bad:?} for a {}-byte id was terminated without a dead-letter record \
         (counted as dead-lettered: {counted}; dead letters: {letters:?})\n{report}",
        long.len()
    );
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_always_panics_is_dead_lettered_after_max_deliver_and_its_partition_moves_on()
 {
    init_tracing();
    let mut s = Scenario::single(2).await;
    let system = s.system_with(s.config("n1").max_deliver(3)).await;

    let entities = ["p0", "p1", "p2", "p3", "p4", "p5"];
    for entity in entities {
        for op in [Op::Push(0), Op::Panic, Op::Push(1)] {
            let command = op.command().unwrap();
            s.send_raw(entity, encode(&command), op).await;
        }
    }
    // Bystanders in the same partitions keep going while the panics are retried.
    for n in 0..20 {
        for entity in ["q0", "q1"] {
            s.send_raw(entity, encode(&LedgerCmd::Push { n }), Op::Push(n))
                .await;
        }
    }

    s.check_within(Duration::from_secs(60)).await;
    let letters = Admin::new(s.client.clone(), "ledger")
        .dead_letters()
        .await
        .unwrap();
    assert_eq!(letters.len(), entities.len(), "{letters:?}");
    for letter in &letters {
        assert_eq!(letter.deliveries, 3, "{letter:?}");
        assert!(letter.reason.contains("panicked"), "{letter:?}");
    }
    let system = s.restart_serves(system, "n2").await;
    s.check().await;
    system.shutdown().await.unwrap();
}

/// The settings of the default-codec tests: everything default but the timings.
fn profile_config(partitions: u32) -> ShardConfig {
    ShardConfig::builder("profile")
        .partitions(partitions)
        .node_id("n1")
        .pin_ttl(Duration::from_secs(1))
        .ack_wait(Duration::from_secs(3))
        .retry_delay(Duration::from_millis(50))
        .build()
        .unwrap()
}

async fn publish_raw(js: &jetstream::Context, subject: String, payload: Vec<u8>) -> u64 {
    js.publish(subject, payload.into())
        .await
        .expect("publish")
        .await
        .expect("stored")
        .sequence
}

const ASK: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Hostile commands against the default codec.

struct Profile;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum ProfileCmd {
    Rename {
        name: String,
    },
    Tag {
        tags: Vec<String>,
    },
    Set {
        fields: BTreeMap<String, u64>,
        note: Option<String>,
    },
    Pick(Choice),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Choice {
    Plain,
    Number(u32),
    Pair { x: i64, label: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum ProfileEvt {
    Renamed(String),
    Tagged(Vec<String>),
    FieldsSet(BTreeMap<String, u64>),
    Picked(Choice),
}

#[derive(Default, Serialize, Deserialize)]
struct ProfileState {
    name: String,
    tags: Vec<String>,
    fields: BTreeMap<String, u64>,
    picks: u32,
}

impl Entity for Profile {
    type Command = ProfileCmd;
    type Event = ProfileEvt;
    type State = ProfileState;
    type Rejection = String;

    fn decide(_: &ProfileState, command: ProfileCmd) -> Result<Vec<ProfileEvt>, String> {
        Ok(vec![match command {
            ProfileCmd::Rename { name } if name.is_empty() => return Err("empty name".into()),
            ProfileCmd::Rename { name } => ProfileEvt::Renamed(name),
            ProfileCmd::Tag { tags } => ProfileEvt::Tagged(tags),
            ProfileCmd::Set { fields, .. } => ProfileEvt::FieldsSet(fields),
            ProfileCmd::Pick(choice) => ProfileEvt::Picked(choice),
        }])
    }

    fn apply(state: &mut ProfileState, event: &ProfileEvt) {
        match event {
            ProfileEvt::Renamed(name) => state.name.clone_from(name),
            ProfileEvt::Tagged(tags) => state.tags.extend(tags.iter().cloned()),
            ProfileEvt::FieldsSet(fields) => state.fields.extend(fields.clone()),
            ProfileEvt::Picked(_) => state.picks += 1,
        }
    }
}

/// A small deterministic generator (splitmix64): the same payloads at every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn valid_command(rng: &mut Rng) -> ProfileCmd {
    let word = |rng: &mut Rng| format!("w{}", rng.below(1000));
    match rng.below(4) {
        0 => ProfileCmd::Rename { name: word(rng) },
        1 => ProfileCmd::Tag {
            tags: (0..rng.below(4)).map(|_| word(rng)).collect(),
        },
        2 => ProfileCmd::Set {
            fields: (0..rng.below(4)).map(|i| (word(rng), i)).collect(),
            note: (rng.below(2) == 0).then(|| word(rng)),
        },
        _ => ProfileCmd::Pick(match rng.below(3) {
            0 => Choice::Plain,
            1 => Choice::Number(rng.below(100) as u32),
            _ => Choice::Pair {
                x: -(rng.below(100) as i64),
                label: word(rng),
            },
        }),
    }
}

/// Payloads no well-behaved client sends: crafted length prefixes that announce far more than
/// the message holds (each would make an unbounded decoder allocate it first, and abort the
/// process), random bytes, and valid encodings with bytes flipped, cut or added.
fn hostile_payloads() -> Vec<Vec<u8>> {
    let huge = [0xFD, 0, 0, 0, 0, 0, 0, 0x04, 0x00];
    let max = [0xFD, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF];
    let mut payloads = vec![
        // "Variant 0 (Rename), a name of 2^50 bytes": the issue's ten bytes.
        [&[0x00][..], &huge].concat(),
        // A tag list of 2^64-1 strings; a map of 2^50 fields; a label of 2^50 bytes inside
        // `Pick(Pair { x: 0, .. })`.
        [&[0x01][..], &max].concat(),
        [&[0x02][..], &huge].concat(),
        [&[0x03, 0x02, 0x00][..], &huge].concat(),
        // One real tag, then a second announcing 2^50 bytes.
        [&[0x01, 0x02, 0x01, b'x'][..], &huge].concat(),
    ];
    let mut rng = Rng(0x5eed);
    for _ in 0..60 {
        let len = rng.below(48) as usize;
        payloads.push((0..len).map(|_| rng.next() as u8).collect());
    }
    for _ in 0..100 {
        let mut bytes = Codec::Bincode.encode(&valid_command(&mut rng)).unwrap();
        match rng.below(3) {
            0 if !bytes.is_empty() => {
                let at = rng.below(bytes.len() as u64) as usize;
                bytes[at] = rng.next() as u8;
            }
            1 => bytes.truncate(rng.below(bytes.len() as u64 + 1) as usize),
            _ => {
                let at = rng.below(bytes.len() as u64 + 1) as usize;
                bytes.insert(at, 0xFD);
            }
        }
        payloads.push(bytes);
    }
    payloads
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_payloads_to_the_default_codec_are_dead_lettered_and_the_partitions_serve_after_a_restart()
 {
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    let config = profile_config(2);
    assert_eq!(config.codec(), Codec::Bincode, "the default codec");
    let sender = CommandSender::<Profile>::new(client.clone(), &config);
    let system = ShardSystem::start::<Profile>(client.clone(), config.clone())
        .await
        .unwrap();

    // Each hostile payload between two valid commands of the same entity.
    let mut rng = Rng(7);
    let mut bad = Vec::new();
    let mut good = Vec::new();
    let mut fine = 0;
    for (i, payload) in hostile_payloads().into_iter().enumerate() {
        let entity = format!("p{}", i % 8);
        let command = valid_command(&mut rng);
        good.push(sender.send(&entity, &command).await.unwrap());
        // The same decoder, in this process: a hostile payload is an error here too, never an
        // abort. Some mutations are still valid commands.
        let decodes = Codec::Bincode.decode::<ProfileCmd>(&payload).is_ok();
        let seq = publish_raw(&js, format!("profile.cmd.{entity}"), payload).await;
        if decodes {
            fine += 1;
        } else {
            bad.push(seq);
        }
    }
    let last = sender
        .request_outcome("p0", &valid_command(&mut rng), Duration::from_secs(30))
        .await
        .unwrap();
    assert!(matches!(last, CommandOutcome::Applied { .. }), "{last:?}");
    let total = (good.len() + bad.len() + fine + 1) as u64;
    wait_until(Duration::from_secs(30), "every command done", || async {
        system.status().await.is_ok_and(|s| {
            s.iter()
                .map(|p| p.applied + p.rejected + p.dead_lettered)
                .sum::<u64>()
                == total
        })
    })
    .await
    .unwrap();

    // Every payload that does not decode is dead-lettered, with its reason, and nothing else is.
    let letters = Admin::new(client.clone(), "profile")
        .dead_letters()
        .await
        .unwrap();
    let mut lettered: Vec<u64> = letters.iter().map(|l| l.command_seq).collect();
    lettered.sort_unstable();
    assert_eq!(lettered, bad, "{letters:?}");
    for letter in &letters {
        assert!(letter.reason.starts_with("malformed"), "{letter:?}");
        assert_eq!(letter.deliveries, 1, "{letter:?}");
    }
    let journal = read_journal(&js, "profile").await.unwrap();
    for seq in &good {
        assert!(
            journal
                .iter()
                .any(|r| matches!(r, Record::Event { command_seq, .. } if command_seq == seq)),
            "valid command {seq} applied"
        );
    }
    system.shutdown().await.unwrap();

    // The node restarts: every partition is acquired again (rebuilding over the dead letters)
    // and serves.
    let ids: Vec<String> = (0..2).map(|p| id_in("after", p, 2)).collect();
    let system = start_owning::<Profile>(&client, &config, async || {
        for id in &ids {
            sender
                .send(id, &ProfileCmd::Pick(Choice::Plain))
                .await
                .unwrap();
        }
    })
    .await;
    for id in &ids {
        let outcome = sender
            .request_outcome(id, &ProfileCmd::Pick(Choice::Number(1)), ASK)
            .await
            .unwrap();
        assert_applied(&outcome);
    }
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_of_an_over_long_id_never_wedges_its_partition_at_the_next_takeover() {
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    let partitions = 8;
    let config = profile_config(partitions);
    let sender = CommandSender::<Profile>::new(client.clone(), &config);
    let system = ShardSystem::start::<Profile>(client.clone(), config.clone())
        .await
        .unwrap();

    // Any client allowed to publish commands can publish this valid command for an id of 300
    // bytes, which no `EntityId` accepts.
    let long = "x".repeat(300);
    let payload = Codec::Bincode
        .encode(&ProfileCmd::Rename { name: "n".into() })
        .unwrap();
    let seq = publish_raw(&js, format!("profile.cmd.{long}"), payload).await;
    let admin = Admin::new(client.clone(), "profile");
    wait_until(
        Duration::from_secs(20),
        "the command dead-lettered",
        || async {
            admin
                .dead_letters()
                .await
                .is_ok_and(|l| l.iter().any(|l| l.command_seq == seq))
        },
    )
    .await
    .unwrap();
    system.shutdown().await.unwrap();

    // Its partition is the one the server computes from the 300 bytes.
    let partition = jetshard::fnv1a_32(long.as_bytes()) % partitions;
    let id = id_in("same", partition, partitions);
    let system = ShardSystem::start::<Profile>(client.clone(), config.clone())
        .await
        .unwrap();
    let outcome = sender
        .request_outcome(&id, &ProfileCmd::Rename { name: "m".into() }, ASK)
        .await
        .unwrap_or_else(|e| panic!("partition {partition} serves after the restart: {e}"));
    assert_applied(&outcome);
    let status = system.status().await.unwrap();
    assert_eq!(
        status[partition as usize].failed_acquisitions, 0,
        "{status:?}"
    );
    system.shutdown().await.unwrap();
}

mod fuzz {
    //! The framework's own records and decoders, fed arbitrary input: a typed error or a
    //! value, never a panic.

    use std::str::FromStr;

    use async_nats::HeaderMap;
    use async_nats::header::{HeaderName, HeaderValue};
    use jetshard::{Codec, EntityId, FenceRecord, FenceRecordError, MAX_ID_LEN};
    use jetshard_testkit::history::Record;
    use jetshard_tests::ledger::LedgerCmd;
    use proptest::prelude::*;

    /// Headers as a server could deliver them: arbitrary names (valid ones kept) and values,
    /// often with a `Jetshard-Generation` among them.
    fn headers() -> impl Strategy<Value = HeaderMap> {
        let pairs = prop::collection::vec(("[ -~]{0,24}", ".{0,40}"), 0..6);
        let generation = prop::option::of(prop_oneof![
            any::<u64>().prop_map(|g| g.to_string()),
            "[0-9 +-]{0,25}",
            ".{0,10}",
        ]);
        (pairs, generation).prop_map(|(pairs, generation)| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                if let (Ok(name), Ok(value)) =
                    (HeaderName::from_str(&name), HeaderValue::from_str(&value))
                {
                    headers.insert(name, value);
                }
            }
            if let Some(generation) = generation.and_then(|g| HeaderValue::from_str(&g).ok()) {
                headers.insert("Jetshard-Generation", generation);
            }
            headers
        })
    }

    /// Bodies: arbitrary bytes, JSON-ish text, and fence records with arbitrary fields.
    fn bodies() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..200),
            ".{0,120}".prop_map(String::into_bytes),
            (
                any::<u32>(),
                any::<u64>(),
                ".{0,20}",
                prop::option::of(".{0,20}")
            )
                .prop_map(|(partition, generation, node, extra)| {
                    let mut value = serde_json::json!({
                        "partition": partition, "generation": generation, "node": node,
                    });
                    if let Some(extra) = extra {
                        value["extra"] = serde_json::Value::String(extra);
                    }
                    serde_json::to_vec(&value).unwrap()
                }),
            (any::<i64>(), any::<f64>(), any::<bool>()).prop_map(|(a, b, c)| {
                format!(r#"{{"partition":{a},"generation":{b},"node":{c}}}"#).into_bytes()
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn fence_record_decoding_never_panics_and_accepts_only_agreeing_records(
            headers in headers(),
            body in bodies(),
        ) {
            match FenceRecord::decode(&headers, &body) {
                Ok(record) => {
                    let header = headers.get("Jetshard-Generation").unwrap();
                    prop_assert_eq!(header.as_str().trim().parse::<u64>().ok(), Some(record.generation));
                    let again: FenceRecord = serde_json::from_slice(&body).unwrap();
                    prop_assert_eq!(again, record);
                }
                Err(FenceRecordError::Mismatch { header, body: in_body }) => {
                    prop_assert_ne!(header, in_body);
                }
                Err(_) => {}
            }
        }

        #[test]
        fn a_fence_record_round_trips_through_its_wire_form(
            partition in any::<u32>(),
            generation in any::<u64>(),
            node in ".{0,64}",
        ) {
            let record = FenceRecord::new(partition, generation, node);
            let mut headers = HeaderMap::new();
            headers.insert("Jetshard-Generation", generation.to_string().as_str());
            let body = serde_json::to_vec(&record).unwrap();
            prop_assert_eq!(FenceRecord::decode(&headers, &body), Ok(record));
        }

        #[test]
        fn entity_ids_are_accepted_exactly_when_they_are_one_valid_token(id in ".{0,300}") {
            let valid = !id.is_empty()
                && id.len() <= MAX_ID_LEN
                && !id.chars().any(|c| matches!(c, '.' | '*' | '>') || c.is_whitespace() || c.is_control());
            prop_assert_eq!(EntityId::new(&id).is_ok(), valid, "{:?}", id);
        }

        #[test]
        fn command_decoding_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            for codec in [Codec::Json, Codec::Bincode] {
                let _ = codec.decode::<LedgerCmd>(&bytes);
            }
        }

        #[test]
        fn journal_record_parsing_never_panics(
            subject in prop_oneof!["[a-z0-9.]{0,40}", "ledger\\.(evt|fence|dlq|cmd)(\\.[a-z0-9-]{0,6}){0,3}"],
            headers in prop::option::of(headers()),
            body in bodies(),
        ) {
            let _ = Record::parse("ledger", 1, &subject, headers.as_ref(), body);
        }
    }
}
