//! Seeded fault schedules against node processes and one real server: owners SIGKILLed,
//! frozen past the pin TTL, stopped gracefully, killed right after its claim; the server
//! restarted on its store; a node's connection cut or stalled at its own TCP proxy. Load runs
//! all the while; at the end every acknowledged command must have exactly one outcome and the
//! history checker must find no violation.
//!
//! Each test runs a few seeds (the CI slice). `JETSHARD_SEED=<s>` replays one seed,
//! `JETSHARD_SEEDS=<n>` runs `n` seeds per test (a soak; `JETSHARD_SEED_BASE` moves the first):
//!
//! ```text
//! JETSHARD_SEEDS=200 cargo test -p jetshard-tests --test chaos mixed -- --nocapture
//! ```

#[allow(dead_code)] // shared with cluster.rs, which uses other parts
#[path = "faults/mod.rs"]
mod faults;

use std::time::{Duration, Instant};

use async_nats::jetstream::Context;
use faults::{
    Kind, Load, MIXED, Nodes, Rng, Totals, World, encode, one_at_a_time, publish, replay_hint,
    run_seeds, schedule, seeds,
};
use jetshard::{EntityId, FenceRecord, partition_of};
use jetshard_testkit::history::{Ack, History};
use jetshard_testkit::{TcpProxy, wait_until};
use jetshard_tests::model::{Op, check_journal, journal_excerpt};
use jetshard_tests::{Scenario, init_tracing, wait_drained};

/// One-server schedules run on 4 partitions.
const PARTITIONS: u32 = 4;
const ENTITIES: usize = 12;
/// One command per entity every 40 ms: about 300 commands a second in all.
const LOAD_INTERVAL: Duration = Duration::from_millis(40);

/// Runs the seeds of one scenario: each its own world, load, faults drawn from `kinds`.
async fn run_scenario(test: &str, base: u64, default_seeds: u64, kinds: &[Kind], faults: u64) {
    run_schedules(test, base, default_seeds, kinds, faults, false).await;
}

/// [`run_scenario`]; with `features`, every feature runs beside the load ([`faults::Features`])
/// and the checks include theirs.
async fn run_schedules(
    test: &str,
    base: u64,
    default_seeds: u64,
    kinds: &[Kind],
    faults: u64,
    features: bool,
) {
    let start = async |seed| {
        let plan = schedule(seed, kinds, faults, PARTITIONS);
        (plan, World::single(PARTITIONS, features).await)
    };
    run_seeds("chaos", test, (base, default_seeds), features, start).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_owners_lose_no_acknowledged_command() {
    run_scenario(
        "sigkilled_owners_lose_no_acknowledged_command",
        100,
        2,
        &[Kind::Kill],
        3,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_frozen_past_the_pin_ttl_write_nothing_when_they_thaw() {
    run_scenario(
        "owners_frozen_past_the_pin_ttl_write_nothing_when_they_thaw",
        200,
        2,
        &[Kind::Freeze],
        3,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restarts_on_the_same_store_lose_nothing() {
    run_scenario(
        "server_restarts_on_the_same_store_lose_nothing",
        300,
        2,
        &[Kind::ServerRestart],
        2,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_and_stalled_connections_lose_nothing() {
    run_scenario(
        "cut_and_stalled_connections_lose_nothing",
        400,
        2,
        &[Kind::Cut, Kind::Stall],
        3,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_connection_drops_that_keep_the_pin_lose_nothing() {
    run_scenario(
        "short_connection_drops_that_keep_the_pin_lose_nothing",
        803,
        2,
        &[Kind::Blip],
        10,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stops_during_load_hand_over_without_loss() {
    run_scenario(
        "graceful_stops_during_load_hand_over_without_loss",
        500,
        2,
        &[Kind::Terminate],
        3,
    )
    .await;
}

/// Every feature at once under every fault at once: snapshots every few events, durable timers
/// armed, cancelled and firing through takeovers, a saga through the outbox to a second entity
/// type and back, keyed requests retried under their key, state queries; and SIGKILL, SIGSTOP
/// past the TTL, SIGTERM hand-offs and rolling restarts, server restarts, connections cut,
/// dropped and stalled at the proxies, a compaction during load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_feature_under_every_fault_keeps_every_promise() {
    run_schedules(
        "every_feature_under_every_fault_keeps_every_promise",
        900,
        1,
        &[MIXED, &[Kind::Compact, Kind::RollingRestart]].concat(),
        4,
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_fault_schedules_keep_every_promise() {
    run_scenario("mixed_fault_schedules_keep_every_promise", 600, 1, MIXED, 4).await;
}

/// Commands of `count` events each for one bulk entity per partition, so that loading it (its
/// snapshot and the events after it, or, killed before a snapshot, all of them) takes a while.
const BULK_COMMANDS: u64 = 30;
const BULK_EVENTS: u64 = 1000;

/// An id of `partition` of `partitions`.
fn id_in(partition: u32, partitions: u32, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|id| partition_of(&EntityId::new(id).unwrap(), partitions) == partition)
        .unwrap()
}

/// The latest fence record of `partition`: generation and node.
async fn latest_fence(js: &Context, partition: u32) -> Option<(u64, String)> {
    let stream = js
        .get_stream_no_info(jetshard_tests::ledger_journal_of(js, partition).await)
        .await
        .ok()?;
    let message = stream
        .get_last_raw_message_by_subject(&format!("ledger.fence.{partition}"))
        .await
        .ok()?;
    let record = FenceRecord::decode(&message.headers, &message.payload).ok()?;
    Some((record.generation, record.node))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_right_after_its_claim_is_replaced_and_loses_nothing() {
    let test = "a_node_killed_right_after_its_claim_is_replaced_and_loses_nothing";
    init_tracing();
    let _one = one_at_a_time().await;
    let mut totals = Totals::default();
    let (mut hits, mut caught) = (0, 0);
    let seeds = seeds(700, 2);
    for &seed in &seeds {
        eprintln!("{test}: seed {seed} ({})", replay_hint("chaos", test, seed));
        let started = Instant::now();
        let mut rng = Rng::new(seed);
        let partitions = 2;
        let mut world = World::single(partitions, false).await;

        // A large journal: the bulk entity of each partition has a long history to load.
        let mut history = History::new();
        let retries = std::sync::atomic::AtomicU64::new(0);
        for partition in 0..partitions {
            let bulk = id_in(partition, partitions, &format!("bulk{seed}"));
            for i in 0..BULK_COMMANDS {
                let op = Op::Many {
                    from: i * BULK_EVENTS,
                    count: BULK_EVENTS,
                };
                let payload = encode(&op.command().unwrap());
                let ack = publish(
                    &world.s.js,
                    &jetshard_tests::ledger_command_subject(&bulk, partitions),
                    payload,
                    &format!("{bulk}:{i}"),
                    Duration::from_secs(20),
                    &retries,
                )
                .await;
                assert!(matches!(ack, Ack::Acked(_)), "bulk command not stored");
                history.record(bulk.clone(), op, ack);
            }
        }
        wait_drained(&world.s.js, Duration::from_secs(60))
            .await
            .expect("bulk commands applied");

        let entities: Vec<String> = (0..ENTITIES).map(|e| format!("r{seed}-e{e}")).collect();
        let load = Load::start(
            world.s.client.clone(),
            partitions,
            &entities,
            LOAD_INTERVAL,
            Duration::from_secs(20),
        );
        world
            .nodes
            .wait_all_owned(partitions, Duration::from_secs(20))
            .await
            .expect("owned");
        let mut injected = Vec::new();
        for _ in 0..2 {
            // The schedule's own timing: load runs undisturbed for this long.
            tokio::time::sleep(rng.millis(300, 1500)).await;
            let partition = rng.below(u64::from(partitions)) as u32;
            // The previous fault's takeover may still be in progress.
            world
                .nodes
                .wait_all_owned(partitions, Duration::from_secs(30))
                .await
                .expect("owned");
            let Some(owner) = world.nodes.owner_of(partition) else {
                continue;
            };
            let (generation, _) = latest_fence(&world.s.js, partition)
                .await
                .unwrap_or_default();
            world.nodes.kill(owner).await;
            // Kill the next claimant as soon as it has won its generation: before it reports the
            // partition acquired if it is caught that early (acquisition reads no history, so
            // rarely), else while it recovers the in-flight window or loads its entities.
            let mut victim = None;
            let deadline = Instant::now() + Duration::from_secs(15);
            while victim.is_none() && Instant::now() < deadline {
                if let Some((claimed, node)) = latest_fence(&world.s.js, partition).await
                    && claimed > generation
                {
                    let slot = world
                        .nodes
                        .slots
                        .iter()
                        .position(|s| s.node.as_ref().is_some_and(|n| n.id == node));
                    if let Some(slot) = slot {
                        let acquired_before = world.nodes.slots[slot]
                            .node
                            .as_ref()
                            .is_some_and(|n| n.acquired(partition, claimed));
                        world.nodes.kill(slot).await;
                        let acquired_after = world.nodes.slots[slot]
                            .node
                            .as_ref()
                            .is_some_and(|n| n.acquired(partition, claimed));
                        victim = Some((slot, node, claimed, !acquired_before && !acquired_after));
                    } else {
                        break;
                    }
                }
                // Polling the fence subject, as fast as a claim must be caught.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let description = match &victim {
                Some((slot, node, claimed, mid)) => {
                    caught += 1;
                    if *mid {
                        hits += 1;
                    }
                    format!(
                        "kill owner slot {owner} of p{partition}, then claimant {node} (slot {slot}) of generation {claimed}, before acquired: {mid}"
                    )
                }
                None => format!("kill owner slot {owner} of p{partition}; no claimant caught"),
            };
            injected.push(description);
            // Part of the fault: the killed slots stay empty this long.
            tokio::time::sleep(rng.millis(200, 1000)).await;
            world.recover().await;
        }
        // The schedule's own timing: a last stretch of load after the faults.
        tokio::time::sleep(Duration::from_millis(500)).await;
        world.recover().await;
        let retries =
            retries.into_inner() + load.retries.load(std::sync::atomic::Ordering::Relaxed);
        history.extend(load.finish().await);
        let figures = world
            .verify(test, seed, &history, &injected, retries, None)
            .await;
        eprintln!(
            "{test}: seed {seed} passed in {:.1?}: {figures:?}",
            started.elapsed()
        );
        totals.add(&figures, &injected);
    }
    eprintln!("{}", totals.line(test));
    eprintln!(
        "{test}: {caught} claimants killed right after their claim, {hits} of them before they acquired"
    );
    assert!(caught > 0, "no claimant was caught right after its claim");
}

/// One node behind a proxy owning the single partition of its scenario, and the commands sent
/// to its entity `x` (`Push { n }`), for the tests of a delivery dropped with its connection.
struct DroppedDelivery {
    s: Scenario,
    proxy: TcpProxy,
    nodes: Nodes,
    history: History<Op>,
    retries: std::sync::atomic::AtomicU64,
}

impl DroppedDelivery {
    /// Starts the node on `s` and sends command 0, once the node owns the partition.
    async fn start(s: Scenario) -> DroppedDelivery {
        let proxy = TcpProxy::start(s.server().addr()).await.expect("proxy");
        let spec = s.node_spec(&[("RUST_LOG", "jetshard=debug")]);
        let nodes = Nodes::start(vec![proxy.url()], spec, vec![]).await;
        let mut this = DroppedDelivery {
            s,
            proxy,
            nodes,
            history: History::new(),
            retries: std::sync::atomic::AtomicU64::new(0),
        };
        this.send(0).await;
        this.nodes
            .wait_all_owned(1, Duration::from_secs(10))
            .await
            .expect("owned");
        this
    }

    async fn send(&mut self, n: u64) {
        let ack = publish(
            &self.s.js,
            &jetshard_tests::ledger_command_subject("x", 1),
            encode(&Op::Push(n).command().unwrap()),
            &format!("x:{n}"),
            Duration::from_secs(10),
            &self.retries,
        )
        .await;
        self.history.record("x", Op::Push(n), ack);
    }

    /// The server delivers command `n` into the stalled connection, which is then dropped with
    /// the delivery in it; the node reconnects. Stalled towards the node only, so that its pull
    /// requests, made again as each expires, still reach the server and the delivery comes.
    async fn drop_the_delivery_of(&mut self, n: u64) {
        self.proxy.stall_to_clients();
        self.send(n).await;
        // The delivery (of the one partition's stored subject) reaches the proxy and is held.
        let delivered = b"ledger.cmd.0.x ";
        wait_until(
            Duration::from_secs(10),
            "the delivery held at the proxy",
            || async {
                self.proxy
                    .held_for_clients()
                    .windows(delivered.len())
                    .any(|w| w == delivered)
            },
        )
        .await
        .expect("the delivery of the command reaches the stalled proxy");
        self.proxy.cut();
        // The relay closes the connection, dropping what it held, before the node may reconnect.
        wait_until(Duration::from_secs(10), "the connection closed", || async {
            self.proxy.open_connections() == 0
        })
        .await
        .expect("the cut closes the node's connection");
        self.proxy.heal();
    }

    /// How many times the node acquired the partition.
    fn acquisitions(&self) -> usize {
        let owner = self.nodes.slots[0].node.as_ref().expect("node");
        owner
            .lines()
            .iter()
            .filter(|l| l.what == "ACQUIRED")
            .count()
    }
}

/// The owner's connection drops while the server is delivering the partition's last command to
/// it: the delivery is lost with the connection, the owner reconnects within the pin TTL and
/// keeps its pin, and nothing is delivered after it (so no jump of the consumer sequence shows
/// the loss). The owner asks the consumer after its reconnect and recovers the command within
/// seconds, not after the ack wait (60 s here, longer than the test waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_delivery_lost_with_a_dropped_connection_is_applied_long_before_its_ack_wait() {
    init_tracing();
    let _one = one_at_a_time().await;
    let s = Scenario::single(1)
        .await
        .pin_ttl(Duration::from_secs(15))
        .ack_wait(Duration::from_secs(60));
    let mut t = DroppedDelivery::start(s).await;
    wait_drained(&t.s.js, Duration::from_secs(10))
        .await
        .expect("the first command applied");
    t.drop_the_delivery_of(1).await;
    let healed = Instant::now();
    let drained = wait_drained(&t.s.js, Duration::from_secs(12)).await;
    let took = healed.elapsed();
    let acquired = t.acquisitions();
    assert!(
        drained.is_ok(),
        "the lost command was not applied within 12 s of the reconnect ({drained:?}); ACQUIRED {acquired} times; the owner's lines about it:\n{}",
        t.nodes.grep_logs("deliveries", 10)
    );
    let report = check_journal(&t.s.js, &t.history).await;
    assert!(report.is_ok(), "{report}");
    eprintln!("the lost command applied {took:?} after the reconnect; ACQUIRED {acquired} times");
}

/// The owner's connection drops while the server is delivering a command to it: the delivery
/// is lost with the connection, the owner reconnects within the pin TTL and keeps its pin, and
/// the entity's next command arrives before the lost one is redelivered. The lost one must
/// still be applied, before the next one, and not taken for a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_lost_with_a_dropped_connection_is_not_overtaken_by_the_next_command() {
    init_tracing();
    let _one = one_at_a_time().await;
    // A pin TTL long enough that the owner keeps its pin through the drop.
    let s = Scenario::single(1).await.pin_ttl(Duration::from_secs(6));
    let mut t = DroppedDelivery::start(s).await;
    t.drop_the_delivery_of(1).await;
    // Command 2 is delivered over the new connection, long before command 1 comes back.
    t.send(2).await;
    let js = &t.s.js;
    wait_drained(js, Duration::from_secs(30))
        .await
        .expect("drained");
    let report = check_journal(js, &t.history).await;
    let kept_pin = t.acquisitions() == 1;
    assert!(
        report.is_ok(),
        "{report}\n{}\nthe owner kept its pin: {kept_pin}\nthe owner's 'already applied' lines:\n{}",
        journal_excerpt(js, &report, 1).await,
        t.nodes.grep_logs("already applied", 10)
    );
}
