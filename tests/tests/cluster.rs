//! Seeded fault schedules against a 3-node JetStream cluster with R3 streams: the server that
//! leads the journal, the one that leads the command stream (or a partition's consumer), and
//! the one the owner of a partition is connected to are SIGKILLed under load and restarted on
//! their stores. Leader elections take 5-7 s; owners' writes retry through them. At the end
//! every acknowledged command must have exactly one outcome and the history checker must find
//! no violation.
//!
//! `JETSHARD_SEED=<s>` replays one seed, `JETSHARD_SEEDS=<n>` runs `n` per test.

#[allow(dead_code)] // shared with chaos.rs, which uses other parts
#[path = "faults/mod.rs"]
mod faults;

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, Context};
use faults::{Load, Nodes, Rng, Run, Totals, one_at_a_time, replay_hint, seeds, verify};
use jetshard_testkit::wait_until;
use jetshard_tests::{Scenario, init_tracing};

const PARTITIONS: u32 = 3;
const ENTITIES: usize = 9;
const LOAD_INTERVAL: Duration = Duration::from_millis(50);

/// Which server a fault kills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Victim {
    /// The leader of `LEDGER_JOURNAL`.
    JournalLeader,
    /// The leader of `LEDGER_CMD`.
    CommandLeader,
    /// The leader of a partition's consumer.
    ConsumerLeader,
    /// The server the owner of a partition is connected to.
    OwnersServer,
}

/// The name of the server to kill, e.g. `s1`.
async fn victim_server(
    js: &Context,
    nodes: &mut Nodes,
    victim: Victim,
    partition: u32,
) -> Option<String> {
    match victim {
        Victim::JournalLeader | Victim::CommandLeader => {
            let name = if victim == Victim::JournalLeader {
                "LEDGER_JOURNAL"
            } else {
                "LEDGER_CMD"
            };
            js.get_stream(name)
                .await
                .ok()?
                .info()
                .await
                .ok()?
                .cluster
                .clone()?
                .leader
        }
        Victim::ConsumerLeader => {
            let stream = js.get_stream_no_info("LEDGER_CMD").await.ok()?;
            let info = stream
                .consumer_info(format!("ledger-p{partition}"))
                .await
                .ok()?;
            info.cluster.clone()?.leader
        }
        Victim::OwnersServer => {
            let slot = nodes.owner_of(partition)?;
            nodes.slots[slot].node.as_ref()?.server()
        }
    }
}

/// Whether both streams and every partition consumer have a leader and all replicas current.
async fn healthy(js: &Context) -> bool {
    healthy_with(js, PARTITIONS).await
}

/// [`healthy`] with `partitions` partition consumers.
async fn healthy_with(js: &Context, partitions: u32) -> bool {
    let current = |cluster: Option<async_nats::jetstream::stream::ClusterInfo>| {
        cluster.is_some_and(|c| {
            c.leader.is_some()
                && c.replicas.len() == 2
                && c.replicas.iter().all(|r| r.current && !r.offline)
        })
    };
    for name in ["LEDGER_CMD", "LEDGER_JOURNAL"] {
        let Ok(mut stream) = js.get_stream(name).await else {
            return false;
        };
        let Ok(info) = stream.info().await else {
            return false;
        };
        if !current(info.cluster.clone()) {
            return false;
        }
    }
    let Ok(stream) = js.get_stream_no_info("LEDGER_CMD").await else {
        return false;
    };
    for partition in 0..partitions {
        let Ok(info) = stream.consumer_info(format!("ledger-p{partition}")).await else {
            return false;
        };
        if !current(info.cluster.clone()) {
            return false;
        }
    }
    true
}

async fn run(test: &str, base: u64, victims: &[Victim]) {
    run_with(test, base, victims, false).await;
}

/// [`run`]; with `features`, every feature runs beside the load ([`faults::Features`]: timers,
/// the saga to the `stock` entity type, keyed requests, queries), a node is SIGKILLed and one
/// SIGTERMed (a hand-off) between the server kills, and the checks include theirs.
async fn run_with(test: &str, base: u64, victims: &[Victim], features: bool) {
    init_tracing();
    let _one = one_at_a_time().await;
    let mut totals = Totals::default();
    for seed in seeds(base, 1) {
        eprintln!(
            "{test}: seed {seed} ({})",
            replay_hint("cluster", test, seed)
        );
        let started = Instant::now();
        let mut rng = Rng::new(seed);
        let s = Scenario::cluster(PARTITIONS)
            .await
            .pin_ttl(Duration::from_millis(1500))
            .ack_wait(Duration::from_millis(5000));
        let (cluster, client, js) = (s.cluster_servers(), &s.client, &s.js);
        // Each node lists every server, its own first: node i starts on server i.
        let urls = (0..3).map(|i| s.urls_from(i)).collect();
        let mut args = s.node_options().args;
        if features {
            args.extend(["--stock".to_owned(), "on".to_owned()]);
        }
        let mut nodes = Nodes::start(urls, s.node_spec(&[]), args).await;
        if features {
            faults::start_journal_copy(js, 3).await;
        }
        let count = if features { ENTITIES / 2 } else { ENTITIES };
        let entities: Vec<String> = (0..count).map(|e| format!("c{seed}-e{e}")).collect();
        let load = Load::start(
            client.clone(),
            &entities,
            LOAD_INTERVAL,
            Duration::from_secs(40),
        );
        let traffic =
            features.then(|| faults::Features::start(client.clone(), seed, PARTITIONS, &entities));
        nodes
            .wait_all_owned(PARTITIONS, Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", nodes.describe()));

        let mut injected = Vec::new();
        for _ in 0..2 {
            // The schedule's own timing: load runs undisturbed for this long.
            tokio::time::sleep(rng.millis(500, 2500)).await;
            let victim = rng.pick(victims);
            let partition = rng.below(u64::from(PARTITIONS)) as u32;
            let down = rng.millis(500, 4000);
            let Some(name) = victim_server(js, &mut nodes, victim, partition).await else {
                injected.push(format!("{victim:?}: no such server now, skipped"));
                continue;
            };
            let server = cluster.node_by_name(&name).expect("a cluster node");
            server.kill().expect("kill");
            let killed = Instant::now();
            // Part of the fault: the server stays down this long.
            tokio::time::sleep(down).await;
            server.restart().await.expect("restart");
            let restarted = killed.elapsed();
            let healed = wait_until(Duration::from_secs(60), "the cluster to heal", || {
                healthy(js)
            })
            .await;
            injected.push(format!(
                "server-kill {victim:?} {name} (p{partition}), down {down:?}, back after {restarted:.1?}, healed after {:.1?}: {}",
                killed.elapsed(),
                healed.is_ok()
            ));
            healed.unwrap_or_else(|e| panic!("{e}: {injected:#?}"));
            if features {
                // A node fault after each server kill: SIGKILL, then SIGTERM (a hand-off).
                let slot = rng.below(nodes.slots.len() as u64) as usize;
                let started = Instant::now();
                let what = if injected.len() == 1 {
                    nodes.kill(slot).await;
                    "kill"
                } else {
                    nodes.terminate(slot).await;
                    "terminate"
                };
                let took = started.elapsed();
                // Part of the fault: the slot stays empty this long.
                tokio::time::sleep(rng.millis(200, 1500)).await;
                nodes.restart(slot).await;
                injected.push(format!("node-{what} slot {slot}, exited in {took:.1?}"));
            }
        }
        // The schedule's own timing: a last stretch of load after the faults.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        nodes.recover().await;
        let mut retries = load.retries.load(std::sync::atomic::Ordering::Relaxed);
        let history = load.finish().await;
        let feature_run = match traffic {
            Some(traffic) => {
                retries += traffic.retries.load(std::sync::atomic::Ordering::Relaxed);
                Some(traffic.finish().await)
            }
            None => None,
        };
        let run = Run {
            file: "cluster",
            test,
            seed,
        };
        let (figures, left) = verify(
            js,
            &nodes,
            run,
            &history,
            &injected,
            retries,
            Duration::from_secs(120),
            feature_run,
        )
        .await;
        eprintln!(
            "{test}: seed {seed} passed in {:.1?}: {figures:?}; acknowledged commands the R3 work-queue stream still holds: {left}",
            started.elapsed(),
        );
        eprintln!(
            "{}",
            faults::soak_line(run, started.elapsed(), &figures, &injected, PARTITIONS)
        );
        totals.add(&figures, &injected);
    }
    eprintln!("{}", totals.line(test));
}

/// Every feature at once (timers, the saga through the outbox, keyed requests, queries,
/// snapshots) while the R3 cluster loses the leaders of its streams and consumers and the
/// servers the owners are connected to, and nodes are SIGKILLed and SIGTERMed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_feature_under_leader_and_node_kills_keeps_every_promise() {
    run_with(
        "every_feature_under_leader_and_node_kills_keeps_every_promise",
        4000,
        &[
            Victim::JournalLeader,
            Victim::CommandLeader,
            Victim::ConsumerLeader,
            Victim::OwnersServer,
        ],
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_journal_leader_loses_nothing() {
    run(
        "killing_the_journal_leader_loses_nothing",
        1000,
        &[Victim::JournalLeader],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_command_stream_or_consumer_leader_loses_nothing() {
    run(
        "killing_the_command_stream_or_consumer_leader_loses_nothing",
        2000,
        &[Victim::CommandLeader, Victim::ConsumerLeader],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_server_an_owner_is_connected_to_loses_nothing() {
    run(
        "killing_the_server_an_owner_is_connected_to_loses_nothing",
        3000,
        &[Victim::OwnersServer],
    )
    .await;
}

/// Three processes starting at the same moment on a fresh cluster race to create the R3
/// streams and consumers while the cluster is still placing them: every one of them starts,
/// and they end up with one set of streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_starting_at_once_on_a_fresh_cluster_all_start() {
    use jetshard::ShardSystem;
    use jetshard_tests::ledger::Ledger;

    init_tracing();
    let _one = one_at_a_time().await;
    let s = Scenario::cluster(PARTITIONS).await;
    let cluster = s.cluster_servers();
    let mut clients = Vec::new();
    for i in 0..3 {
        clients.push(
            async_nats::connect(cluster.node(i).url())
                .await
                .expect("client"),
        );
    }
    let start = |i: usize| {
        let client = clients[i].clone();
        let config = s.config(&format!("n{i}")).build().unwrap();
        ShardSystem::start::<Ledger>(client, config)
    };
    let (a, b, c) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(start(0), start(1), start(2))
    })
    .await
    .expect("starts must not hang");
    let systems = [a, b, c]
        .into_iter()
        .enumerate()
        .map(|(i, started)| started.unwrap_or_else(|e| panic!("n{i} did not start: {e}")))
        .collect::<Vec<_>>();
    let js = jetstream::new(clients[0].clone());
    let stream = js
        .get_stream("LEDGER_CMD")
        .await
        .expect("the command stream");
    assert_eq!(stream.cached_info().config.num_replicas, 3);
    for system in systems {
        system.shutdown().await.unwrap();
    }
}

/// A claim while the previous owner's writes are in flight on a clustered journal: the server
/// answers 10164 ("wrong last sequence", another write naming the fence subject is in flight),
/// which the claim retries rather than failing the acquisition. Two processes, one partition,
/// the pin moved by an operator's unpin again and again while commands stream in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_racing_writes_in_flight_on_a_clustered_journal_all_succeed() {
    use jetshard::admin::Admin;
    use jetshard_tests::counts;
    use jetshard_tests::model::Op;

    init_tracing();
    let _one = one_at_a_time().await;
    let mut s = Scenario::cluster(1).await;
    let a = s.system("a").await;
    let b = s.system("b").await;
    let admin = Admin::new(s.client.clone(), "ledger");
    let entities: Vec<String> = (0..20).map(|e| format!("race-{e}")).collect();
    let mut unpins = 0;
    for n in 0..30 {
        for entity in &entities {
            s.send(entity, Op::Push(n)).await;
        }
        if n % 5 == 4 {
            // Moves the pin while this round's writes are in flight.
            if admin.unpin(0).await.is_ok() {
                unpins += 1;
            }
        }
    }
    s.check_within(Duration::from_secs(120)).await;
    let mut acquisitions = 0;
    for system in [&a, &b] {
        let status = system.status().await.unwrap();
        assert_eq!(
            status[0].failed_acquisitions, 0,
            "every claim succeeded: {status:?}"
        );
        acquisitions += status[0].acquisitions;
    }
    assert!(unpins >= 3, "{unpins} unpins");
    assert!(
        acquisitions >= 2,
        "the pin moved: {acquisitions} acquisitions"
    );
    let c = counts(&a).await;
    eprintln!("acquisitions {acquisitions}, unpins {unpins}, a: {c:?}");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Group commit on a clustered journal: a burst of 16,000 commands (8 partitions x 100 entities
/// x 20 commands, published pipelined before any is processed) with the journal's leader
/// SIGKILLed a quarter of the way through and restarted. Nothing may be lost, doubled or
/// reordered; the test prints how often the server refused a write with 10164 (a fenced write
/// already in flight on the partition's fence subject), which one batch in flight per
/// partition should make rare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_through_a_journal_leader_kill_loses_nothing() {
    use std::collections::VecDeque;

    use async_nats::jetstream::message::PublishMessage;
    use jetshard::PartitionStatus;
    use jetshard_testkit::history::Ack;
    use jetshard_tests::id_in;
    use jetshard_tests::ledger::LedgerCmd;
    use jetshard_tests::model::Op;

    const BURST_PARTITIONS: u32 = 8;
    const PER_PARTITION: u32 = 100;
    const COMMANDS: u64 = 20;

    init_tracing();
    let _one = one_at_a_time().await;
    let mut s = Scenario::cluster(BURST_PARTITIONS)
        .await
        .pin_ttl(Duration::from_millis(1500))
        .ack_wait(Duration::from_secs(5));
    s.provision().await;
    let entities: Vec<String> = (0..BURST_PARTITIONS)
        .flat_map(|p| {
            (0..PER_PARTITION).map(move |e| id_in(&format!("burst{e}x"), p, BURST_PARTITIONS))
        })
        .collect();
    let total = entities.len() as u64 * COMMANDS;

    // Pipelined: each publish is sent before the last one's acknowledgement, in order.
    let started = Instant::now();
    let mut in_flight = VecDeque::new();
    let mut acked = Vec::new();
    for n in 0..COMMANDS {
        for entity in &entities {
            let message = PublishMessage::build()
                .payload(faults::encode(&LedgerCmd::Push { n }).into())
                .message_id(format!("{entity}:{n}"));
            let ack =
                s.js.send_publish(format!("ledger.cmd.{entity}"), message)
                    .await
                    .expect("publish");
            in_flight.push_back((entity.clone(), n, ack));
            if in_flight.len() >= 1024 {
                let (entity, n, ack) = in_flight.pop_front().expect("one in flight");
                acked.push((entity, n, ack.await.expect("stored").sequence));
            }
        }
    }
    for (entity, n, ack) in in_flight {
        acked.push((entity, n, ack.await.expect("stored").sequence));
    }
    for (entity, n, seq) in acked {
        s.history.record(entity, Op::Push(n), Ack::Acked(seq));
    }
    eprintln!("published {total} commands in {:.1?}", started.elapsed());

    let started = Instant::now();
    let a = s.system("a").await;
    let b = s.system("b").await;
    let applied = || async {
        let mut sum = 0;
        for system in [&a, &b] {
            sum += system
                .status()
                .await
                .map_or(0, |st| st.iter().map(|p| p.applied).sum::<u64>());
        }
        sum
    };
    wait_until(
        Duration::from_secs(60),
        "a quarter of the burst applied",
        || async { applied().await >= total / 4 },
    )
    .await
    .unwrap();
    let (js, cluster) = (&s.js, s.cluster_servers());
    let leader = js
        .get_stream("LEDGER_JOURNAL")
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .cluster
        .clone()
        .and_then(|c| c.leader)
        .expect("the journal has a leader");
    let server = cluster.node_by_name(&leader).expect("a cluster node");
    server.kill().expect("kill");
    let at_kill = applied().await;
    // Part of the fault: the leader stays down this long.
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.restart().await.expect("restart");
    wait_until(Duration::from_secs(60), "the cluster to heal", || {
        healthy_with(js, BURST_PARTITIONS)
    })
    .await
    .unwrap();
    s.check_within(Duration::from_secs(180)).await;
    let elapsed = started.elapsed();
    let mut statuses: Vec<PartitionStatus> = a.status().await.unwrap();
    statuses.extend(b.status().await.unwrap());
    let sum = |f: fn(&PartitionStatus) -> u64| statuses.iter().map(f).sum::<u64>();
    let (conflicts, unconfirmed) = (sum(|p| p.write_conflicts), sum(|p| p.unconfirmed_writes));
    let (commits, records) = (sum(|p| p.journal_commits), sum(|p| p.journal_records));
    eprintln!(
        "burst of {total} commands through a kill of journal leader {leader} (at {at_kill} applied): \
         drained and checked in {elapsed:.1?}; {conflicts} write conflicts (10164), \
         {unconfirmed} unconfirmed writes, {commits} group commits of {records} records \
         ({:.1} records per commit)",
        records as f64 / commits.max(1) as f64
    );
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}
