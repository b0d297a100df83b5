//! Poison: hostile or evolving data never crashes a process or wedges a partition. Each test
//! feeds one kind of bad input or bad record, checks what becomes of it (a dead letter with its
//! reason, or a quarantined entity), that everything else goes on, and then restarts the node
//! and shows that the partition is acquired and serves again: the worst failures are the ones
//! that appear only at the next takeover.
//!
//! Entities here use the default codec (bincode) unless a test says otherwise. Hostile input
//! (payloads, ids) is in `tests/tests/bad_input.rs`, `max_payload.rs`, `hostile_codec.rs` and
//! `fuzz.rs`; commands that kill their process in `tests/tests/deadly_commands.rs`; retries,
//! pins and pull loops in `tests/tests/retries_and_pins.rs`.

use std::time::Duration;

use async_nats::jetstream;
use jetshard::admin::Admin;
use jetshard::{
    Codec, CodecError, CommandOutcome, CommandSender, Entity, ShardConfig, ShardSystem, Snapshots,
};
use jetshard_testkit::history::{Record, read_journal};
use jetshard_tests::fragile::{self, Fragile, FragileCmd};
use jetshard_tests::{assert_applied, init_tracing, start_owning};
use serde::{Deserialize, Serialize};

const ASK: Duration = Duration::from_secs(10);

/// The notes' settings: one node, a quick retry, given up at the third delivery.
fn config() -> ShardConfig {
    jetshard_tests::config("note", 1, "n1")
        .retry_delay(Duration::from_millis(50))
        .max_deliver(3)
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Evolving data: an event type that changed.

/// Version 1 of a note-taking entity: a note is its text.
struct NoteV1;

#[derive(Debug, Clone, Serialize, Deserialize)]
enum NoteCmd {
    Write {
        text: String,
    },
    /// Rejected unless the entity holds `count` notes: a test's window on the state.
    Check {
        count: u32,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
enum NoteEvtV1 {
    Written { text: String },
}

impl Entity for NoteV1 {
    type Command = NoteCmd;
    type Event = NoteEvtV1;
    type State = Vec<String>;
    type Rejection = String;

    fn decide(state: &Vec<String>, command: NoteCmd) -> Result<Vec<NoteEvtV1>, String> {
        match command {
            NoteCmd::Write { text } => Ok(vec![NoteEvtV1::Written { text }]),
            NoteCmd::Check { count } if count as usize == state.len() => Ok(vec![]),
            NoteCmd::Check { .. } => Err(format!("holds {}: {state:?}", state.len())),
        }
    }

    fn apply(state: &mut Vec<String>, event: &NoteEvtV1) {
        let NoteEvtV1::Written { text } = event;
        state.push(text.clone());
    }

    /// No snapshots: the test is about reading old events, which a snapshot written at the
    /// release would cover.
    fn snapshots() -> Option<Snapshots<Vec<String>>> {
        None
    }
}

/// Version 2: a note also counts its words. The encoding changed, so the version is raised;
/// `UPCAST` says whether this build reads version 1 (the fix) or not (the mistake).
struct NoteV2<const UPCAST: bool>;

#[derive(Debug, Clone, Serialize, Deserialize)]
enum NoteEvtV2 {
    Written { text: String, words: u32 },
}

impl<const UPCAST: bool> Entity for NoteV2<UPCAST> {
    type Command = NoteCmd;
    type Event = NoteEvtV2;
    type State = Vec<String>;
    type Rejection = String;

    const EVENT_VERSION: u32 = 2;

    fn decide(state: &Vec<String>, command: NoteCmd) -> Result<Vec<NoteEvtV2>, String> {
        match command {
            NoteCmd::Write { text } => Ok(vec![NoteEvtV2::Written {
                words: text.split_whitespace().count() as u32,
                text,
            }]),
            NoteCmd::Check { count } if count as usize == state.len() => Ok(vec![]),
            NoteCmd::Check { .. } => Err(format!("holds {}: {state:?}", state.len())),
        }
    }

    fn apply(state: &mut Vec<String>, event: &NoteEvtV2) {
        let NoteEvtV2::Written { text, words } = event;
        state.push(format!("{text} ({words})"));
    }

    fn upcast(version: u32, payload: &[u8], codec: Codec) -> Result<NoteEvtV2, CodecError> {
        match version {
            1 if UPCAST => {
                let NoteEvtV1::Written { text } = codec.decode(payload)?;
                let words = text.split_whitespace().count() as u32;
                Ok(NoteEvtV2::Written { text, words })
            }
            _ => codec.decode(payload),
        }
    }

    fn snapshots() -> Option<Snapshots<Vec<String>>> {
        None
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_type_changed_without_an_upcast_quarantines_its_entities_only_and_an_upcast_heals_them()
 {
    init_tracing();
    let (_server, client, _) = jetshard_tests::served().await;
    let config = config();
    let write = |text: &str| NoteCmd::Write { text: text.into() };

    // Version 1 writes the history of "a".
    let v1 = CommandSender::<NoteV1>::new(client.clone(), &config);
    let system = ShardSystem::start::<NoteV1>(client.clone(), config.clone())
        .await
        .unwrap();
    for text in ["one", "two words"] {
        let outcome = v1.request_outcome("a", &write(text), ASK).await.unwrap();
        assert_applied(&outcome);
    }
    system.shutdown().await.unwrap();

    // Version 2, deployed without reading version 1: "a" is quarantined, naming its first
    // record; the partition is acquired and serves "b".
    let v2 = CommandSender::<NoteV2<false>>::new(client.clone(), &config);
    let system = start_owning::<NoteV2<false>>(&client, &config, async || {
        v2.send("b", &write("b first")).await.unwrap();
    })
    .await;
    let outcome = v2
        .request_outcome("b", &write("b second"), ASK)
        .await
        .unwrap();
    assert_applied(&outcome);
    let outcome = v2.request_outcome("a", &write("three"), ASK).await.unwrap();
    let CommandOutcome::DeadLettered { reason, .. } = &outcome else {
        panic!("a quarantined entity's command is dead-lettered: {outcome:?}");
    };
    assert!(
        reason.contains("quarantined")
            && reason.contains("journal seq")
            && reason.contains("version 1"),
        "{reason}"
    );
    let status = system.status().await.unwrap();
    let quarantined: Vec<&str> = status[0]
        .quarantined
        .iter()
        .map(|q| q.entity.as_str())
        .collect();
    assert_eq!(quarantined, ["a"], "{status:?}");
    system.shutdown().await.unwrap();

    // The fix: version 2 reads version 1. The quarantine is gone, "a" holds its two notes of
    // version 1 (its command given up meanwhile is not among them), and both versions rebuild.
    let fixed = CommandSender::<NoteV2<true>>::new(client.clone(), &config);
    let system = start_owning::<NoteV2<true>>(&client, &config, async || {
        fixed.send("b", &NoteCmd::Check { count: 2 }).await.unwrap();
    })
    .await;
    assert!(system.status().await.unwrap()[0].quarantined.is_empty());
    let outcome = fixed
        .request_outcome("a", &NoteCmd::Check { count: 2 }, ASK)
        .await
        .unwrap();
    assert_applied(&outcome);
    let outcome = fixed
        .request_outcome("a", &write("three"), ASK)
        .await
        .unwrap();
    assert_applied(&outcome);
    system.shutdown().await.unwrap();

    let system = start_owning::<NoteV2<true>>(&client, &config, async || {
        fixed.send("b", &NoteCmd::Check { count: 2 }).await.unwrap();
    })
    .await;
    let outcome = fixed
        .request_outcome("a", &NoteCmd::Check { count: 3 }, ASK)
        .await
        .unwrap();
    assert!(
        matches!(outcome, CommandOutcome::Applied { .. }),
        "versions 1 and 2 rebuild: {outcome:?}"
    );
    system.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Handlers that fail: an `apply` that panics on durable events, an event that cannot be encoded
// (the `Fragile` entity, `tests/support/fragile.rs`).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_that_panics_on_durable_events_quarantines_its_entity_not_the_partition() {
    init_tracing();
    let (_server, client, _) = jetshard_tests::served().await;
    let config = fragile::retrying(1, 3).build().unwrap();
    let (sender, system) = fragile::start(&client, &config).await;
    for entity in ["a", "b"] {
        sender.send(entity, &FragileCmd::Add(1)).await.unwrap();
    }
    // The event is durable before `apply` runs: the command is done, the entity is not to be
    // trusted any more. The next command is on its way already.
    let poison = sender.send("a", &FragileCmd::Poison).await.unwrap();
    let outcome = sender
        .request_outcome("a", &FragileCmd::Add(1), ASK)
        .await
        .unwrap();
    let CommandOutcome::DeadLettered { reason, .. } = &outcome else {
        panic!("the quarantined entity's next command is dead-lettered: {outcome:?}");
    };
    assert!(
        reason.contains("quarantined") && reason.contains("apply panicked"),
        "{reason}"
    );
    let journal = read_journal(&jetstream::new(client.clone()), "fragile")
        .await
        .unwrap();
    assert!(
        journal
            .iter()
            .any(|r| matches!(r, Record::Event { command_seq, .. } if *command_seq == poison)),
        "the poison's event is durable"
    );
    // The partition goes on for everyone else, at once.
    for _ in 0..20 {
        sender.send("b", &FragileCmd::Add(1)).await.unwrap();
    }
    let outcome = sender
        .request_outcome("b", &FragileCmd::Check(21), ASK)
        .await
        .unwrap();
    assert_applied(&outcome);
    system.shutdown().await.unwrap();

    // At the next takeover the partition serves "b"; "a" is loaded on its first command, when
    // `apply` panics on the same event: "a" is quarantined again, naming the journal record.
    let system = start_owning::<Fragile>(&client, &config, async || {
        sender.send("b", &FragileCmd::Add(1)).await.unwrap();
    })
    .await;
    let outcome = sender
        .request_outcome("b", &FragileCmd::Check(22), ASK)
        .await
        .unwrap();
    assert_applied(&outcome);
    let outcome = sender
        .request_outcome("a", &FragileCmd::Add(1), ASK)
        .await
        .unwrap();
    assert!(
        matches!(outcome, CommandOutcome::DeadLettered { .. }),
        "{outcome:?}"
    );
    let status = system.status().await.unwrap();
    assert_eq!(status[0].quarantined.len(), 1, "{status:?}");
    assert_eq!(status[0].quarantined[0].entity, "a");
    assert!(status[0].quarantined[0].journal_seq > 0);
    // An operator sees it from anywhere (what `jetshard quarantined` prints).
    let nodes = Admin::new(client.clone(), "fragile")
        .nodes(Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0].partitions[0].quarantined, status[0].quarantined);
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_outside_decide_and_apply_is_blamed_on_its_own_command() {
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    let config = fragile::retrying(1, 3).build().unwrap();
    let sender = CommandSender::<Fragile>::new(client.clone(), &config);
    // The commands wait for an owner, so they reach the entity's actor back to back, and the
    // owner is busy with thirty other entities' commands: the panic comes while the verdicts of
    // the commands before it wait in the owner's mailbox (a supervision event would overtake
    // them).
    ShardSystem::start::<Fragile>(client.clone(), config.clone())
        .await
        .unwrap()
        .shutdown()
        .await
        .unwrap();
    // One command of "a", then the one that panics, then a crowd: when "a"'s first verdict is
    // sent, the owner is still routing the crowd's deliveries.
    let mut adds = vec![sender.send("a", &FragileCmd::Add(1)).await.unwrap()];
    let bad = sender.send("a", &FragileCmd::BadEncode).await.unwrap();
    for round in 0..10 {
        for b in 0..30 {
            let bystander = format!("b{b}");
            adds.push(sender.send(&bystander, &FragileCmd::Add(1)).await.unwrap());
        }
        if round == 9 {
            adds.push(sender.send("a", &FragileCmd::Add(1)).await.unwrap());
        }
    }
    let (_, system) = fragile::start(&client, &config).await;
    let outcome = sender
        .request_outcome("a", &FragileCmd::Check(2), Duration::from_secs(30))
        .await
        .unwrap();
    assert_applied(&outcome);

    // Exactly one dead letter, for the command that panicked, after its deliveries.
    let letters = Admin::new(client.clone(), "fragile")
        .dead_letters()
        .await
        .unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].command_seq, bad, "{letters:?}");
    assert!(
        letters[0].reason.contains("cannot be encoded"),
        "{letters:?}"
    );
    assert_eq!(letters[0].deliveries, 3, "{letters:?}");
    // Every other command applied exactly once.
    let journal = read_journal(&js, "fragile").await.unwrap();
    for seq in &adds {
        let events = journal
            .iter()
            .filter(|r| matches!(r, Record::Event { command_seq, .. } if command_seq == seq))
            .count();
        assert_eq!(events, 1, "command {seq}");
    }
    system.shutdown().await.unwrap();
}
