//! The owner's load gauges hold the right *values*: `jetshard_entities{state}`,
//! `jetshard_pending_commands` and `jetshard_ack_pending_commands`, read from this process's
//! metrics as an exporter renders them (a `metrics-exporter-prometheus` recorder, as the example
//! node serves at `/metrics`), against what each test made happen.
//!
//! The recorder is the process's: each test runs its own entity type (its own
//! `entity_type` label) against its own server, so the tests of this file may run side by side.
//! The gauges follow the owner's upkeep tick (a quarter of the ack wait: 750 ms here), so every
//! check polls them with a deadline.

use std::sync::OnceLock;
use std::time::Duration;

use jetshard::{Codec, CommandOutcome, CommandSender, ShardConfig, ShardSystem};
use jetshard_testkit::wait_until;
use jetshard_tests::fragile::{self, FragileCmd};
use jetshard_tests::ledger::{Ledger, LedgerCmd, on_decide};
use jetshard_tests::{counts, id_in, init_tracing};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// How long a gauge may take to show what happened: a few upkeep ticks.
const WITHIN: Duration = Duration::from_secs(5);
/// How long a command's outcome may take.
const ASK: Duration = Duration::from_secs(10);

/// This process's recorder, installed at the first call (before any shard system starts: the
/// owners register their series when they start).
fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .expect("install the metrics recorder")
    })
}

/// The load gauges of one entity type in this process, summed over its partitions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Load {
    /// Partitions whose series were rendered.
    partitions: u32,
    owned: i64,
    resident: i64,
    dormant: i64,
    quarantined: i64,
    pending: i64,
    ack_pending: i64,
}

impl Load {
    /// What the recorder renders now for `entity_type`.
    fn now(entity_type: &str) -> Load {
        Load::of(&recorder().render(), entity_type)
    }

    /// The gauges of `entity_type` in the Prometheus text `metrics`.
    fn of(metrics: &str, entity_type: &str) -> Load {
        let mut load = Load::default();
        let mut partitions = std::collections::BTreeSet::new();
        for line in metrics.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, labels, value)) = split_sample(line) else {
                continue;
            };
            if label(labels, "entity_type") != Some(entity_type) {
                continue;
            }
            let slot = match (name, label(labels, "state")) {
                ("jetshard_partition_owned", _) => &mut load.owned,
                ("jetshard_entities", Some("resident")) => &mut load.resident,
                ("jetshard_entities", Some("dormant")) => &mut load.dormant,
                ("jetshard_entities", Some("quarantined")) => &mut load.quarantined,
                ("jetshard_pending_commands", _) => &mut load.pending,
                ("jetshard_ack_pending_commands", _) => &mut load.ack_pending,
                _ => continue,
            };
            let value: f64 = value
                .parse()
                .unwrap_or_else(|e| panic!("{e}: a gauge that does not read: {line}"));
            assert!(
                value.fract() == 0.0,
                "a gauge that counts, not whole: {line}"
            );
            *slot += value as i64;
            if name == "jetshard_partition_owned" {
                partitions.insert(label(labels, "partition").unwrap_or("").to_owned());
            }
        }
        load.partitions = partitions.len() as u32;
        load
    }
}

/// `name{labels} value` split in three.
fn split_sample(line: &str) -> Option<(&str, &str, &str)> {
    let (name, rest) = line.split_once('{')?;
    let (labels, value) = rest.rsplit_once('}')?;
    Some((name, labels, value.trim()))
}

/// The value of label `key` in `a="x",b="y"` (values here hold no quote or comma).
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split(',').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then(|| v.trim_matches('"'))
    })
}

/// Waits until `entity_type`'s gauges satisfy `holds`; panics with the last reading and the
/// system's status if they do not within [`WITHIN`].
async fn wait_gauges(
    entity_type: &str,
    system: &ShardSystem,
    what: &str,
    holds: impl Fn(&Load) -> bool,
) -> Load {
    let waited = wait_until(WITHIN, what, || async { holds(&Load::now(entity_type)) }).await;
    let load = Load::now(entity_type);
    if let Err(e) = waited {
        panic!(
            "{e}: the gauges read {load:?}; the status says {:?}",
            system.status().await
        );
    }
    load
}

/// The ledger on entity type `entity_type` (a test's own series), `partitions` partitions.
fn ledger(entity_type: &str, partitions: u32) -> jetshard::ShardConfigBuilder {
    jetshard_tests::config(entity_type, partitions, "a").codec(Codec::Json)
}

/// Starts the ledger with `config`, the recorder installed first.
async fn start(client: &async_nats::Client, config: &ShardConfig) -> ShardSystem {
    recorder();
    ShardSystem::start::<Ledger>(client.clone(), config.clone())
        .await
        .expect("start the shard system")
}

/// Sends `command` to `id` and waits for it to be applied.
async fn applied(sender: &CommandSender<Ledger>, id: &str, command: &LedgerCmd) {
    let outcome = sender.request_outcome(id, command, ASK).await;
    assert!(
        matches!(outcome, Ok(CommandOutcome::Applied { .. })),
        "{id}: {outcome:?}"
    );
}

/// Sends one command to each of `per_partition` entities in each of `partitions` partitions
/// (ids `<prefix><k>-...`) and waits for each to be applied; their ids.
async fn settle_spread(
    sender: &CommandSender<Ledger>,
    prefix: &str,
    partitions: u32,
    per_partition: u32,
) -> Vec<String> {
    let ids: Vec<String> = (0..partitions)
        .flat_map(|p| {
            (0..per_partition).map(move |k| id_in(&format!("{prefix}{k}-"), p, partitions))
        })
        .collect();
    for id in &ids {
        applied(sender, id, &LedgerCmd::Append { n: 0 }).await;
    }
    ids
}

/// N entities spread over the partitions, each sent one command that settled: N resident over
/// the partitions, nothing in hand, nothing pending, every partition owned; and all zeros once
/// the system shut down (a sum over processes must not count a gone owner).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_commands_leave_their_entities_resident_and_nothing_in_hand() {
    init_tracing();
    const PARTITIONS: u32 = 2;
    const PER_PARTITION: u32 = 6;
    let entity_type = "gauge_settled";
    let (_server, client, _js) = jetshard_tests::served().await;
    let config = ledger(entity_type, PARTITIONS).build().expect("config");
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    let system = start(&client, &config).await;

    let ids = settle_spread(&sender, "s", PARTITIONS, PER_PARTITION).await;
    let entities = ids.len() as i64;
    let want = Load {
        partitions: PARTITIONS,
        owned: i64::from(PARTITIONS),
        resident: entities,
        ..Load::default()
    };
    wait_gauges(entity_type, &system, "every entity resident", |l| {
        *l == want
    })
    .await;
    let status = counts(&system).await;
    assert_eq!(status.resident_entities as i64, entities, "{status:?}");
    assert_eq!(status.commands_in_hand, 0, "{status:?}");

    system.shutdown().await.expect("shut down");
    let after = Load::now(entity_type);
    assert_eq!(
        after,
        Load {
            partitions: PARTITIONS,
            ..Load::default()
        },
        "after the shutdown"
    );
}

/// An entity whose first command's `decide` is held (blocked in place, off the runtime's
/// workers) keeps its commands in hand: `ack_pending` counts each one delivered, up to
/// `max_ack_pending`; the commands stored behind them and not delivered show in `pending`;
/// once released, both come back to 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_held_by_a_busy_entity_are_counted_until_it_lets_them_go() {
    init_tracing();
    const IN_HAND: u32 = 5;
    const WAITING: u32 = 40;
    let entity_type = "gauge_held";
    let (_server, client, _js) = jetshard_tests::served().await;
    let config = ledger(entity_type, 1)
        .max_ack_pending(IN_HAND)
        .build()
        .expect("config");
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    let system = start(&client, &config).await;

    // The first command's decide tells the test it runs, then waits until released (bounded).
    let (deciding, decided) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    on_decide(0, move || {
        tokio::task::block_in_place(|| {
            let _ = deciding.send(());
            let _ = released.recv_timeout(Duration::from_secs(30));
        });
    });
    let held = "held";
    sender
        .send(held, &LedgerCmd::Slow { n: 0, ms: 0 })
        .await
        .expect("send");
    tokio::task::spawn_blocking(move || decided.recv_timeout(Duration::from_secs(10)))
        .await
        .expect("join")
        .expect("the first command is being decided");
    for n in 1..IN_HAND {
        sender
            .send(held, &LedgerCmd::Push { n: u64::from(n) })
            .await
            .expect("send");
    }
    let in_hand = wait_gauges(entity_type, &system, "the commands in hand", |l| {
        l.ack_pending == i64::from(IN_HAND)
    })
    .await;
    assert_eq!((in_hand.owned, in_hand.resident), (1, 1), "{in_hand:?}");
    assert_eq!(counts(&system).await.commands_in_hand, IN_HAND as usize);

    // max_ack_pending is reached: what comes next is stored and not delivered.
    for n in IN_HAND..IN_HAND + WAITING {
        sender
            .send(held, &LedgerCmd::Push { n: u64::from(n) })
            .await
            .expect("send");
    }
    wait_gauges(entity_type, &system, "the commands waiting", |l| {
        l.pending == i64::from(WAITING) && l.ack_pending == i64::from(IN_HAND)
    })
    .await;

    release.send(()).expect("release the first command");
    let total = u64::from(IN_HAND + WAITING);
    wait_until(ASK, "every command applied", || async {
        counts(&system).await.applied == total
    })
    .await
    .expect("applied");
    wait_gauges(entity_type, &system, "nothing in hand or waiting", |l| {
        (l.pending, l.ack_pending, l.resident) == (0, 0, 1)
    })
    .await;
    system.shutdown().await.expect("shut down");
}

/// Entities idle past `passivate_after` leave: `resident` falls to 0 and `dormant` rises to
/// the number passivated (their states kept: the default dormant budget is 100,000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passivated_entities_move_from_resident_to_dormant() {
    init_tracing();
    const PARTITIONS: u32 = 2;
    const PER_PARTITION: u32 = 5;
    let entity_type = "gauge_dormant";
    let (_server, client, _js) = jetshard_tests::served().await;
    let config = ledger(entity_type, PARTITIONS)
        .passivate_after(Duration::from_millis(300))
        .build()
        .expect("config");
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    let system = start(&client, &config).await;

    let ids = settle_spread(&sender, "d", PARTITIONS, PER_PARTITION).await;
    let entities = ids.len() as i64;
    let want = Load {
        partitions: PARTITIONS,
        owned: i64::from(PARTITIONS),
        dormant: entities,
        ..Load::default()
    };
    wait_gauges(entity_type, &system, "every entity dormant", |l| *l == want).await;
    let status = system.status().await.expect("status");
    let dormant: usize = status.iter().map(|p| p.dormant_entities).sum();
    assert_eq!(dormant as i64, entities, "{status:?}");

    // A command wakes one: resident again, one fewer dormant.
    applied(&sender, &ids[0], &LedgerCmd::Append { n: 1 }).await;
    wait_gauges(entity_type, &system, "the woken entity resident", |l| {
        (l.resident, l.dormant) == (1, entities - 1)
    })
    .await;
    system.shutdown().await.expect("shut down");
}

/// An entity whose `apply` panics on a durable event is quarantined: counted under
/// `quarantined` (and under `resident` too while an actor gives its commands up, as the status
/// counts it), then, once every actor passivated, quarantined only: not dormant (its state is
/// not to be trusted), beside the healthy entity's dormant state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantined_entity_is_counted_apart_from_the_resident_and_dormant_ones() {
    init_tracing();
    let (_server, client, _js) = jetshard_tests::served().await;
    let config = fragile::retrying(1, 3)
        .passivate_after(Duration::from_secs(2))
        .build()
        .expect("config");
    recorder();
    let (sender, system) = fragile::start(&client, &config).await;
    for entity in ["a", "b"] {
        let outcome = sender
            .request_outcome(entity, &FragileCmd::Add(1), ASK)
            .await;
        assert!(
            matches!(outcome, Ok(CommandOutcome::Applied { .. })),
            "{outcome:?}"
        );
    }
    sender
        .send("a", &FragileCmd::Poison)
        .await
        .expect("send the poison");
    let outcome = sender.request_outcome("a", &FragileCmd::Add(1), ASK).await;
    assert!(
        matches!(outcome, Ok(CommandOutcome::DeadLettered { .. })),
        "the quarantined entity's next command: {outcome:?}"
    );
    // "a"'s next command was given up by an actor of its own, alive until it passivates.
    // (Polled: a tick may fall between the poison's end, its actor stopped, and that command.)
    wait_gauges("fragile", &system, "one quarantined, two actors", |l| {
        (l.quarantined, l.resident, l.ack_pending) == (1, 2, 0)
    })
    .await;
    let status = system.status().await.expect("status");
    assert_eq!(status[0].quarantined.len(), 1, "{status:?}");
    assert_eq!(status[0].resident_entities, 2, "{status:?}");

    let want = Load {
        partitions: 1,
        owned: 1,
        dormant: 1,
        quarantined: 1,
        ..Load::default()
    };
    wait_gauges("fragile", &system, "every actor passivated", |l| *l == want).await;
    system.shutdown().await.expect("shut down");
}
