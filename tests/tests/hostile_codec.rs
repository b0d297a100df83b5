//! Hostile commands against the default codec (bincode): crafted length prefixes, random bytes
//! and mutated valid encodings are dead-lettered (never an allocation that aborts the process),
//! valid commands around them are applied, and after a restart every partition is acquired and
//! serves; a dead letter of an id no entity can have never wedges its partition.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream;
use jetshard::admin::Admin;
use jetshard::{Codec, CommandOutcome, CommandSender, Entity, ShardConfig, ShardSystem};
use jetshard_testkit::history::{Record, read_journal};
use jetshard_testkit::wait_until;
use jetshard_tests::{assert_applied, id_in, init_tracing, start_owning};
use serde::{Deserialize, Serialize};

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
        // "Variant 0 (Rename), a name of 2^50 bytes": the ten bytes.
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
    let partition = jetshard::test_support::fnv1a_32(long.as_bytes()) % partitions;
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
