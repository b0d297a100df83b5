//! Poison: hostile or evolving data never crashes a process or wedges a partition. Each test
//! feeds one kind of bad input or bad record, checks what becomes of it (a dead letter with its
//! reason, or a quarantined entity), that everything else goes on, and then restarts the node
//! and shows that the partition is acquired and serves again: the worst failures are the ones
//! that appear only at the next takeover.
//!
//! Entities here use the default codec (bincode) unless a test says otherwise. Hostile input
//! (payloads, ids) is in `tests/tests/bad_input.rs`.

use std::time::Duration;

use async_nats::jetstream;
use jetshard::admin::Admin;
use jetshard::{
    Codec, CodecError, CommandOutcome, CommandSender, Entity, ShardConfig, ShardSystem, Snapshots,
};
use jetshard_testkit::history::{Record, read_journal};
use jetshard_testkit::{NatsServer, wait_until};
use jetshard_tests::{assert_applied, id_in, init_tracing, start_owning};
use serde::{Deserialize, Serialize};

const ASK: Duration = Duration::from_secs(10);

fn config(entity_type: &str, partitions: u32) -> ShardConfig {
    jetshard_tests::config(entity_type, partitions, "n1")
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
    let config = config("note", 1);
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
// Handlers that fail: an `apply` that panics on durable events, an event that cannot be encoded.

struct Fragile;

#[derive(Debug, Clone, Serialize, Deserialize)]
enum FragileCmd {
    Add(u32),
    /// Decides `Poison`, on which `apply` panics.
    Poison,
    /// Decides `Unencodable`, whose serialization panics.
    BadEncode,
    /// Rejected unless the entity's sum is this.
    Check(u32),
}

#[derive(Debug, Clone, Deserialize)]
enum FragileEvt {
    Added(u32),
    Poison,
    Unencodable,
}

impl Serialize for FragileEvt {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            FragileEvt::Added(n) => {
                serializer.serialize_newtype_variant("FragileEvt", 0, "Added", n)
            }
            FragileEvt::Poison => serializer.serialize_unit_variant("FragileEvt", 1, "Poison"),
            FragileEvt::Unencodable => panic!("this event cannot be encoded"),
        }
    }
}

impl Entity for Fragile {
    type Command = FragileCmd;
    type Event = FragileEvt;
    type State = u32;
    type Rejection = String;

    fn decide(sum: &u32, command: FragileCmd) -> Result<Vec<FragileEvt>, String> {
        match command {
            FragileCmd::Add(n) => Ok(vec![FragileEvt::Added(n)]),
            FragileCmd::Poison => Ok(vec![FragileEvt::Poison]),
            FragileCmd::BadEncode => Ok(vec![FragileEvt::Unencodable]),
            FragileCmd::Check(n) if n == *sum => Ok(vec![]),
            FragileCmd::Check(_) => Err(format!("the sum is {sum}")),
        }
    }

    fn apply(sum: &mut u32, event: &FragileEvt) {
        match event {
            FragileEvt::Added(n) => *sum += n,
            FragileEvt::Poison => panic!("apply cannot take Poison"),
            FragileEvt::Unencodable => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_that_panics_on_durable_events_quarantines_its_entity_not_the_partition() {
    init_tracing();
    let (_server, client, _) = jetshard_tests::served().await;
    let config = config("fragile", 1);
    let sender = CommandSender::<Fragile>::new(client.clone(), &config);
    let system = ShardSystem::start::<Fragile>(client.clone(), config.clone())
        .await
        .unwrap();
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
    let config = config("fragile", 1);
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
    let system = ShardSystem::start::<Fragile>(client.clone(), config.clone())
        .await
        .unwrap();
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

// ---------------------------------------------------------------------------------------------
// Commands that kill their process; outcomes across a crash. Nodes are child processes.

mod nodes {
    use super::*;
    use jetshard_tests::ledger::{Ledger, LedgerCmd};
    use jetshard_tests::ledger_config;
    use jetshard_tests::node::{Node, NodeOptions, NodeSpec};

    fn spec(env: Vec<(String, String)>) -> NodeSpec {
        NodeSpec {
            partitions: 1,
            pin_ttl: Duration::from_secs(1),
            ack_wait: Duration::from_secs(2),
            env,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_command_that_kills_every_process_that_runs_it_is_dead_lettered_after_max_deliver_runs()
     {
        init_tracing();
        let (server, client, js) = jetshard_tests::served().await;
        let config = ledger_config(1, "test").max_deliver(2).build().unwrap();
        let sender = CommandSender::<Ledger>::new(client.clone(), &config);
        let options = NodeOptions {
            args: vec!["--max-deliver".into(), "2".into()],
            log_file: None,
        };
        let url = server.url();
        let mut started = 0;
        let mut start = async || {
            started += 1;
            Node::start_with(&url, &format!("n{started}"), &spec(vec![]), &options).await
        };
        let mut nodes = vec![start().await, start().await];

        let mut pushes = Vec::new();
        for n in 0..5 {
            pushes.push(sender.send("x", &LedgerCmd::Push { n }).await.unwrap());
        }
        let killer = sender.send("k", &LedgerCmd::Abort).await.unwrap();
        for n in 5..10 {
            pushes.push(sender.send("x", &LedgerCmd::Push { n }).await.unwrap());
        }

        // Whoever runs it dies; a node that died is started again, as a supervisor would.
        let admin = Admin::new(client.clone(), "ledger");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut crashes = 0;
        loop {
            let letters = admin.dead_letters().await.unwrap();
            if let Some(letter) = letters.iter().find(|l| l.command_seq == killer) {
                assert!(
                    letter.reason.contains("given up before decoding"),
                    "{letter:?}"
                );
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the killer was not given up; {crashes} crashes"
            );
            for node in &mut nodes {
                if !node.is_running() {
                    crashes += 1;
                    *node = start().await;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // It ran at most max_deliver times side by side with others, then twice more alone (in
        // isolation, which tells it from the commands around it; one isolated death could be a
        // kill from outside), and never again.
        assert!((1..=4).contains(&crashes), "{crashes} crashes");

        // Everything else was applied exactly once.
        let last = sender
            .request_outcome("x", &LedgerCmd::Push { n: 10 }, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(matches!(last, CommandOutcome::Applied { .. }), "{last:?}");
        let journal = read_journal(&js, "ledger").await.unwrap();
        for seq in &pushes {
            let events = journal
                .iter()
                .filter(|r| matches!(r, Record::Event { command_seq, .. } if command_seq == seq))
                .count();
            assert_eq!(events, 1, "command {seq}");
        }

        // A whole restart: the partition is acquired and serves.
        for node in &mut nodes {
            node.kill().await;
        }
        let _node = start().await;
        let outcome = sender
            .request_outcome("x", &LedgerCmd::Push { n: 11 }, Duration::from_secs(20))
            .await
            .unwrap();
        assert_applied(&outcome);
    }

    /// Whether the node's log says it runs the commands in hand one at a time (isolation).
    fn isolating(log: &std::path::Path) -> bool {
        std::fs::read_to_string(log).is_ok_and(|text| text.contains("running them one at a time"))
    }

    /// A crash loop: a killer command, and before it in the stream an innocent one that takes a
    /// while, so that it is in hand (past max_deliver) at each death before isolation. The
    /// isolated owner runs the innocent one first, alone, and is killed from outside (SIGKILL)
    /// meanwhile: one death of an isolated owner is not proof, so the innocent command is run
    /// again and applied once; only the killer is given up, after two isolated owners in a row
    /// died running it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_innocent_command_whose_isolated_owner_is_killed_from_outside_is_not_given_up() {
        init_tracing();
        let (server, client, js) = jetshard_tests::served().await;
        let config = ledger_config(1, "test").max_deliver(2).build().unwrap();
        let sender = CommandSender::<Ledger>::new(client.clone(), &config);
        let logs = tempfile::tempdir().expect("a log directory");
        let log_of = |id: &str| logs.path().join(format!("{id}.log"));
        let url = server.url();
        let mut started = 0;
        // Not waiting for it to be ready: the loop below must look at the nodes every 50 ms
        // while the isolated owner runs the innocent command, and a start waited for can take
        // longer than that on a loaded machine (it did in CI: the isolated owner was never seen).
        let mut spawn = || {
            started += 1;
            let id = format!("n{started}");
            let options = NodeOptions {
                args: vec!["--max-deliver".into(), "2".into()],
                log_file: Some(log_of(&id)),
            };
            Node::spawn(&url, &id, &spec(vec![]), &options)
        };
        let mut nodes = vec![spawn(), spawn()];
        for node in &nodes {
            jetshard_testkit::wait_until(Duration::from_secs(20), "node ready", || async {
                node.printed("READY")
            })
            .await
            .expect("node did not start");
        }

        let innocent = sender
            .send("i", &LedgerCmd::Slow { n: 0, ms: 3000 })
            .await
            .unwrap();
        let killer = sender.send("k", &LedgerCmd::Abort).await.unwrap();

        let admin = Admin::new(client.clone(), "ledger");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        let mut crashes = 0;
        let mut killed_from_outside = None;
        let letter = loop {
            let letters = admin.dead_letters().await.unwrap();
            assert!(
                !letters.iter().any(|l| l.command_seq == innocent),
                "the innocent command was given up: {letters:?}"
            );
            if let Some(letter) = letters.into_iter().find(|l| l.command_seq == killer) {
                break letter;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the killer was not given up; {crashes} crashes"
            );
            if killed_from_outside.is_none()
                && let Some(node) = nodes
                    .iter_mut()
                    .find(|n| isolating(&log_of(&n.id)) && n.printed("DECIDING"))
            {
                // The isolated owner runs the innocent command alone: killed from outside.
                node.kill().await;
                killed_from_outside = Some(node.id.clone());
            }
            for node in &mut nodes {
                if !node.is_running() {
                    crashes += 1;
                    *node = spawn();
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let killed = killed_from_outside.unwrap_or_else(|| {
            panic!("no isolated owner was seen running the innocent command to be killed from outside; {crashes} deaths; {letter:?}")
        });
        eprintln!("{killed} killed from outside; {crashes} deaths in all; {letter:?}");
        assert!(
            letter.reason.contains("given up before decoding")
                && letter.reason.contains("2 owner(s) in a row died"),
            "{letter:?}"
        );
        // The innocent command was applied, once.
        wait_until(
            Duration::from_secs(30),
            "the innocent command applied",
            || async {
                read_journal(&js, "ledger").await.is_ok_and(|journal| {
                    journal.iter().any(|r| {
                    matches!(r, Record::Event { command_seq, .. } if *command_seq == innocent)
                })
                })
            },
        )
        .await
        .unwrap();
        let journal = read_journal(&js, "ledger").await.unwrap();
        let events = journal
            .iter()
            .filter(|r| matches!(r, Record::Event { command_seq, .. } if *command_seq == innocent))
            .count();
        assert_eq!(events, 1, "the innocent command's events");
        // The partition serves.
        let outcome = sender
            .request_outcome("i", &LedgerCmd::Push { n: 1 }, Duration::from_secs(30))
            .await
            .unwrap();
        assert_applied(&outcome);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_whose_command_outlived_a_crash_after_its_write_is_told_it_was_applied() {
        init_tracing();
        let (server, client, _) = jetshard_tests::served().await;
        let config = ledger_config(1, "test").build().unwrap();
        let sender = CommandSender::<Ledger>::new(client.clone(), &config);
        let url = server.url();
        // `a` dies between the durable write of `Appended { n: 5 }` and the acknowledgement.
        let abort = vec![("LEDGER_ABORT_ON_APPLY".to_owned(), "5".to_owned())];
        let a = Node::start(&url, "a", &spec(abort)).await;
        sender.send("w", &LedgerCmd::Push { n: 0 }).await.unwrap();
        wait_until(Duration::from_secs(20), "a owns the partition", || async {
            a.owned() == vec![0]
        })
        .await
        .unwrap();
        let _b = Node::start(&url, "b", &spec(vec![])).await;

        // The client asks for the outcome; `b` recovers the command, finds it applied, and
        // answers what happened the first time (the reply subject travels with the command).
        let outcome = sender
            .request_outcome("x", &LedgerCmd::Push { n: 5 }, Duration::from_secs(20))
            .await
            .unwrap();
        assert!(
            matches!(outcome, CommandOutcome::Applied { events: 1, .. }),
            "{outcome:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Retries, pins and pull loops.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_sent_twice_with_one_idempotency_key_is_one_command() {
    init_tracing();
    let (_server, client, _) = jetshard_tests::served().await;
    let config = config("fragile", 1);
    let sender = CommandSender::<Fragile>::new(client.clone(), &config);
    let system = ShardSystem::start::<Fragile>(client.clone(), config.clone())
        .await
        .unwrap();
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
    let config = ShardConfig::builder("fragile")
        .partitions(2)
        .node_id("n1")
        .pin_ttl(Duration::from_secs(1))
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
    let config = ShardConfig::builder("fragile")
        .partitions(1)
        .node_id("n1")
        .pin_ttl(Duration::from_secs(1))
        .ack_wait(Duration::from_secs(3))
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
    let config = ShardConfig::builder("fragile")
        .partitions(1)
        .node_id("n1")
        .pin_ttl(Duration::from_secs(1))
        .ack_wait(Duration::from_secs(3))
        .retry_delay(Duration::from_millis(50))
        .max_deliver(1)
        .build()
        .unwrap();
    let sender = CommandSender::<Fragile>::new(client.clone(), &config);
    let system = ShardSystem::start::<Fragile>(client.clone(), config.clone())
        .await
        .unwrap();
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
