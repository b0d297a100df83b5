//! What the integration tests share: the `ledger` test entity, its model for the history
//! checker, node child processes, and the [`Scenario`] every test starts from.
//!
//! Each test file is its own binary and pulls these in as the `jetshard_tests` library.
//! Servers, clusters, proxies, `wait_until` and the history checker come from
//! `jetshard-testkit`.
//!
//! # Writing a test
//!
//! A test starts a [`Scenario`] (a real server, or a 3-server cluster, with a client, a
//! `CommandSender<Ledger>` and an empty history), starts the shard systems or `ledger-node`
//! processes it needs, sends commands with [`Scenario::send`] (which records each as a
//! [`model::Op`] in the history), applies its fault, and ends with [`Scenario::check`]: that
//! waits for the command stream to drain and judges the whole journal against the history with
//! `jetshard_testkit::history` and [`model::LedgerModel`] (nothing lost, doubled or reordered,
//! every outcome what the ledger does, no stale generation), panicking with the report and a
//! journal excerpt. What is left is the test's own fault and assertions:
//!
//! ```no_run
//! # async fn example() {
//! use jetshard_tests::{Scenario, model::Op};
//!
//! let mut s = Scenario::single(2).await; // pin TTL 1 s, ack wait 3 s; `.pin_ttl(..)` to change
//! let mut a = s.node("a").await; // a `ledger-node` child process
//! s.send("e1", Op::Append(0)).await;
//! s.wait_owns_all(&a).await;
//! let b = s.node("b").await;
//! a.kill().await; // SIGKILL
//! s.send("e1", Op::Append(1)).await;
//! s.check().await; // drained, and the journal holds exactly what the history says
//! # drop(b);
//! # }
//! ```
//!
//! In-process systems come from [`Scenario::system`] (or [`Scenario::system_with`] and
//! [`Scenario::config`] for more settings), and [`counts`] sums their status counters;
//! [`provision`] (or [`Scenario::provision`]) creates the streams without owning anything, so
//! that commands sent next wait for an owner. A command that is no `LedgerCmd` goes out with
//! [`Scenario::send_raw`]; a test that expects a rejection records [`model::Op::Refuse`] or
//! [`model::Op::Misplaced`] (a rejection writes nothing, and the check expects nothing).
//!
//! | module | what |
//! |---|---|
//! | [`cli`] | the `jetshard` admin command run in-process: its text, its JSON, its error |
//! | [`fence`] | fence records written as another process would (a claim that supersedes the owner) |
//! | [`fragile`] | the `Fragile` test entity: handlers that fail on purpose |
//! | [`ledger`] | the `Ledger` test entity: numbers appended in order, with injectable faults |
//! | [`model`] | `Op` (a command and what it must leave), `LedgerModel`, `check_journal` |
//! | [`node`] | `ledger-node` child processes: SIGKILL, SIGSTOP, SIGTERM, ownership lines |
//! | [`pin`] | `Scenario::pins` and `Scenario::wait_unpinned`: the consumers' pins |
//! | [`scenario`] | `Scenario`, `provision`, `wait_drained` |
//! | [`stock`] | the `Stock` entity: the saga's second entity type, answering ledgers' orders |
//! | [`tally`] | the `Tally` entity of the recovery, snapshot and dormant tests, and its full replay |

/// Sends `tracing` output to the test harness, which shows it for failing tests only.
///
/// The filter comes from `RUST_LOG` (e.g. `RUST_LOG=jetshard=debug`); without it only errors
/// are shown. Safe to call from every test: only the first call installs the subscriber.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

pub mod cli;
pub mod doubt;
pub mod fence;
pub mod fragile;
pub mod ledger;
pub mod model;
pub mod node;
pub mod pin;
pub mod scenario;
pub mod secure;
pub mod stock;
pub mod tally;

pub use scenario::{
    Scenario, copy_journal, copy_names, describe_consumers, provision, read_copy, wait_copied,
    wait_drained,
};

use std::time::Duration;

use jetshard::{ShardConfig, ShardSystem};

/// A config for the `ledger` test entity with short timings, JSON-encoded, writing a snapshot
/// every [`snapshot_every`] events (so every suite of the ledger, chaos and cluster included,
/// runs with snapshots and loads entities from them), its journal in
/// [`journal_streams`] streams.
pub fn ledger_config(partitions: u32, node: &str) -> jetshard::ShardConfigBuilder {
    config("ledger", partitions, node)
        .journal_streams(journal_streams(partitions))
        .codec(jetshard::Codec::Json)
        .retry_delay(Duration::from_millis(50))
        .snapshot_every(snapshot_every())
        .crash_watchers(env_or("JETSHARD_CRASH_WATCHERS", 3))
        .standbys(env_or("JETSHARD_STANDBYS", 2))
}

/// How many streams the ledger's journal is spread over: `JETSHARD_JOURNAL_STREAMS` (at most
/// `partitions`), default 1. The suites of the ledger run on either layout.
pub fn journal_streams(partitions: u32) -> u32 {
    (env_or("JETSHARD_JOURNAL_STREAMS", 1) as u32).clamp(1, partitions)
}

/// The ledger's names as its command streams record them: its layout (`LEDGER_CMD`, or
/// `LEDGER_CMD_0` ... of a spread one, `jetshard.journal_streams`) and, when spread, its
/// partition count; one stream where neither exists yet.
pub async fn ledger_names(js: &async_nats::jetstream::Context) -> jetshard::wire::Names {
    for name in ["LEDGER_CMD", "LEDGER_CMD_0"] {
        let Ok(mut stream) = js.get_stream(name).await else {
            continue;
        };
        let Ok(info) = stream.info().await else {
            continue;
        };
        let recorded = |key: &str| {
            info.config
                .metadata
                .get(key)
                .and_then(|n| n.parse::<u32>().ok())
        };
        let streams = recorded("jetshard.journal_streams").unwrap_or(1);
        let partitions = recorded("jetshard.partitions").unwrap_or(streams);
        return jetshard::wire::Names::spread("ledger", streams, partitions);
    }
    jetshard::wire::Names::new("ledger")
}

/// The streams of the ledger's journal, as its command streams record them
/// ([`ledger_names`]).
pub async fn ledger_journals(js: &async_nats::jetstream::Context) -> Vec<String> {
    ledger_names(js).await.journal_streams().to_vec()
}

/// The ledger's command streams, as they record themselves ([`ledger_names`]).
pub async fn ledger_command_streams(js: &async_nats::jetstream::Context) -> Vec<String> {
    ledger_names(js).await.command_streams().to_vec()
}

/// The command stream holding the ledger's partition `partition`'s commands.
pub async fn ledger_command_stream(js: &async_nats::jetstream::Context, partition: u32) -> String {
    ledger_names(js).await.command_stream(partition).to_owned()
}

/// The command stream holding ledger entity `entity`'s commands.
pub async fn ledger_command_stream_of(js: &async_nats::jetstream::Context, entity: &str) -> String {
    let names = ledger_names(js).await;
    let id = jetshard::EntityId::new(entity).expect("a valid entity id");
    let partition = jetshard::partition_of(&id, names.partitions().max(1));
    names.command_stream(partition).to_owned()
}

/// Where a client publishes a command for ledger entity `entity`, on a ledger of
/// `partitions` in the layout [`ledger_config`] gives it: `ledger.cmd.<id>`, or
/// `ledger.cmd.<p>.<id>` with its journal spread over several streams.
pub fn ledger_command_subject(entity: &str, partitions: u32) -> String {
    let id = jetshard::EntityId::new(entity).expect("a valid entity id");
    jetshard::wire::Names::spread("ledger", journal_streams(partitions), partitions)
        .command_subject(&id)
}

/// The journal stream holding `partition`'s ledger records.
pub async fn ledger_journal_of(js: &async_nats::jetstream::Context, partition: u32) -> String {
    let journals = ledger_journals(js).await;
    journals[partition as usize % journals.len()].clone()
}

/// The tests' background compaction interval: `JETSHARD_COMPACTION_MS`, default none (off):
/// the history checker and the tests that replay the journal read all of it, so only the tests
/// that ask for it (nodes started with the variable, systems with their own setting) compact.
pub fn compaction_interval() -> Option<Duration> {
    let ms = env_or("JETSHARD_COMPACTION_MS", 0);
    (ms > 0).then(|| Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

/// A number from the environment (the scale-out tests set the watchers and standbys of their
/// node processes), else `default`.
fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The settings every test's entity type starts from: `partitions`, node id `node`, pin TTL
/// 1 s, ack wait 3 s (short, so that failovers and redeliveries happen within a test), no
/// background compaction unless [`compaction_interval`] says so. The
/// ledger ([`ledger_config`]) and the tests' own entity types add theirs.
pub fn config(entity_type: &str, partitions: u32, node: &str) -> jetshard::ShardConfigBuilder {
    let config = ShardConfig::builder(entity_type)
        .partitions(partitions)
        .node_id(node)
        .pin_ttl(Duration::from_secs(1))
        .ack_wait(Duration::from_secs(3));
    match compaction_interval() {
        Some(interval) => config.compaction_interval(interval),
        None => config.compaction(false),
    }
}

/// The ledger's snapshot interval in events: `JETSHARD_SNAPSHOT_EVERY` (0: no periodic
/// snapshots, only on passivation), default 3: short, so that most loads start from a snapshot.
pub fn snapshot_every() -> u32 {
    std::env::var("JETSHARD_SNAPSHOT_EVERY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// How many commands this system has worked through as applied (duplicates included), over
/// all partitions; 0 while its status cannot be read.
pub async fn applied(system: &ShardSystem) -> u64 {
    system
        .status()
        .await
        .map(|s| s.iter().map(|p| p.applied + p.duplicates).sum())
        .unwrap_or(0)
}

/// A system's status counters, summed over its partitions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Commands applied.
    pub applied: u64,
    /// Commands the entity rejected.
    pub rejected: u64,
    /// Commands acknowledged as already applied.
    pub duplicates: u64,
    /// Commands given up with a dead letter.
    pub dead_lettered: u64,
    /// Entity actors alive.
    pub resident_entities: usize,
    /// Commands delivered and not yet acknowledged.
    pub commands_in_hand: usize,
    /// Journal writes the server did not confirm (then retried in place).
    pub unconfirmed_writes: u64,
}

/// What the server says of stream `name` now (its config, state and cluster).
pub async fn stream_info(
    js: &async_nats::jetstream::Context,
    name: &str,
) -> async_nats::jetstream::stream::Info {
    let mut stream = js
        .get_stream(name)
        .await
        .unwrap_or_else(|e| panic!("stream {name}: {e}"));
    stream
        .info()
        .await
        .unwrap_or_else(|e| panic!("stream {name}'s info: {e}"))
        .clone()
}

/// `system`'s counters summed over its partitions.
///
/// # Panics
/// If the system does not answer with its status.
pub async fn counts(system: &ShardSystem) -> Counts {
    let status = system.status().await.expect("the system's status");
    status.iter().fold(Counts::default(), |sum, p| Counts {
        applied: sum.applied + p.applied,
        rejected: sum.rejected + p.rejected,
        duplicates: sum.duplicates + p.duplicates,
        dead_lettered: sum.dead_lettered + p.dead_lettered,
        resident_entities: sum.resident_entities + p.resident_entities,
        commands_in_hand: sum.commands_in_hand + p.commands_in_hand,
        unconfirmed_writes: sum.unconfirmed_writes + p.unconfirmed_writes,
    })
}

/// Starts a shard system and waits until it owns all `config`'s partitions (each is acquired on
/// its first delivery: `wake` sends one command per partition first).
pub async fn start_owning<E: jetshard::Entity>(
    client: &async_nats::Client,
    config: &ShardConfig,
    wake: impl AsyncFnOnce(),
) -> ShardSystem {
    let system = ShardSystem::start::<E>(client.clone(), config.clone())
        .await
        .unwrap();
    wake().await;
    jetshard_testkit::wait_until(
        Duration::from_secs(20),
        "every partition acquired",
        || async {
            system
                .status()
                .await
                .is_ok_and(|status| status.iter().all(|p| p.generation.is_some()))
        },
    )
    .await
    .unwrap();
    system
}

/// An id of partition `partition` of `partitions`, with `prefix`.
pub fn id_in(prefix: &str, partition: u32, partitions: u32) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|id| {
            jetshard::partition_of(&jetshard::EntityId::new(id).unwrap(), partitions) == partition
        })
        .unwrap()
}

/// Panics unless a command's outcome says it was applied (its events are durable).
#[track_caller]
pub fn assert_applied(outcome: &jetshard::CommandOutcome) {
    assert!(
        matches!(outcome, jetshard::CommandOutcome::Applied { .. }),
        "not applied: {outcome:?}"
    );
}

/// Waits (30 s at most) until no command of `entity_type` is pending or unacknowledged: every
/// partition's ack floor is at its last delivery. A consumer that does not answer (its replicas
/// electing a leader after a server's kill) is asked again.
pub async fn drained(client: &async_nats::Client, entity_type: &str) {
    let admin = jetshard::admin::Admin::new(client.clone(), entity_type);
    jetshard_testkit::wait_until(
        Duration::from_secs(30),
        "every command acknowledged",
        || async {
            admin.overview().await.is_ok_and(|overview| {
                overview
                    .iter()
                    .all(|p| p.pending == 0 && p.ack_pending == 0)
            })
        },
    )
    .await
    .unwrap();
}

/// A fresh server, a client of it and its JetStream context: where a test that runs its own
/// entity types starts ([`Scenario`] is the ledger's start).
pub async fn served() -> (
    jetshard_testkit::NatsServer,
    async_nats::Client,
    async_nats::jetstream::Context,
) {
    let server = jetshard_testkit::NatsServer::start()
        .await
        .expect("start nats-server");
    let client = server.connect().await.expect("connect to nats-server");
    let js = async_nats::jetstream::new(client.clone());
    (server, client, js)
}
