//! Seeded fault schedules against a 3-node JetStream cluster with R3 streams: the server that
//! leads the journal, the one that leads the command stream (or a partition's consumer), and
//! the one the owner of a partition is connected to are SIGKILLed under load and restarted on
//! their stores. Leader elections take 5-7 s; owners' writes retry through them. At the end
//! every acknowledged command must have exactly one outcome and the history checker must find
//! no violation. The every-feature schedule adds faults of the nodes and of their connections
//! (each node behind TCP proxies of its own) and a compaction ([`faults::cluster_schedule`]).
//!
//! `JETSHARD_SEED=<s>` replays one seed, `JETSHARD_SEEDS=<n>` runs `n` per test.

#[allow(dead_code)] // shared with chaos.rs, which uses other parts
#[path = "faults/mod.rs"]
mod faults;

use std::time::{Duration, Instant};

use async_nats::jetstream;
use faults::{
    Load, Nodes, Rng, Run, Totals, Victim, World, cluster_schedule, kill_server, one_at_a_time,
    replay_hint, run_seeds, seeds, verify,
};
use jetshard_testkit::wait_until;
use jetshard_tests::{Scenario, init_tracing};

const PARTITIONS: u32 = 3;
const ENTITIES: usize = 9;
const LOAD_INTERVAL: Duration = Duration::from_millis(50);
/// Node faults per seed of the every-feature schedule, of distinct kinds (of 7).
const NODE_FAULTS_PER_SEED: usize = 3;

/// Server kills under load, nodes connected straight to the servers: `victims` draws which
/// server each of two kills hits.
async fn run(test: &str, base: u64, victims: &[Victim]) {
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
        let mut nodes = Nodes::start(urls, s.node_spec(&[]), s.node_options().args).await;
        let entities: Vec<String> = (0..ENTITIES).map(|e| format!("c{seed}-e{e}")).collect();
        let load = Load::start(
            client.clone(),
            PARTITIONS,
            &entities,
            LOAD_INTERVAL,
            Duration::from_secs(40),
        );
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
            injected.push(kill_server(js, cluster, &mut nodes, victim, partition, down).await);
        }
        // The schedule's own timing: a last stretch of load after the faults.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        nodes.recover().await;
        let retries = load.retries.load(std::sync::atomic::Ordering::Relaxed);
        let history = load.finish().await;
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
            None,
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
/// snapshots, background compaction) under every kind of fault on an R3 cluster: per seed a
/// leader kill and a second server kill (a leader or an owner's server), three node faults of
/// distinct kinds drawn from SIGKILL, SIGSTOP past the pin TTL, a cut, a short drop and a
/// stall at the node's proxies, a SIGTERM hand-off and a rolling restart, and an
/// `Admin::compact`, in a random order ([`faults::cluster_schedule`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_feature_under_leader_and_node_kills_keeps_every_promise() {
    let start = async |seed| {
        let plan = cluster_schedule(seed, NODE_FAULTS_PER_SEED, PARTITIONS);
        (plan, World::cluster(PARTITIONS, true).await)
    };
    run_seeds(
        "cluster",
        "every_feature_under_leader_and_node_kills_keeps_every_promise",
        (4000, 1),
        true,
        start,
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
        .get_stream(jetshard_tests::ledger_command_stream(&js, 0).await)
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
                s.js.send_publish(
                    jetshard_tests::ledger_command_subject(entity, BURST_PARTITIONS),
                    message,
                )
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
    let leader = jetshard_tests::stream_info(js, &jetshard_tests::ledger_journal_of(js, 0).await)
        .await
        .cluster
        .clone()
        .and_then(|c| c.leader)
        .expect("the journal has a leader");
    let server = cluster.node_by_name(&leader).expect("a cluster node");
    server.kill().expect("kill");
    let at_kill = applied().await;
    // Part of the fault, not a wait for a condition: the leader's server stays down this long
    // (the writes in flight meet the election), then comes back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.restart().await.expect("restart");
    wait_until(Duration::from_secs(60), "the cluster to heal", || {
        faults::healthy(js, BURST_PARTITIONS)
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

/// A keyed send rides through its command stream's leader frozen: the publish, forwarded to
/// the frozen leader, is never answered, and the sender makes it again under the same key until
/// the next leader stores it, instead of failing at the client's 5-s ack timeout. The command
/// is applied once. The system and the sender use another server, as clients of a healthy
/// server would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_send_rides_through_its_command_stream_leader_frozen() {
    use jetshard::{CommandSender, ShardSystem};
    use jetshard_tests::ledger::{Ledger, LedgerCmd};

    const ENTITY: &str = "rider";
    init_tracing();
    let _one = one_at_a_time().await;
    let s = Scenario::cluster(2).await;
    s.provision().await;
    let cluster = s.cluster_servers();
    let commands = jetshard_tests::ledger_command_stream_of(&s.js, ENTITY).await;
    let leader = jetshard_tests::stream_info(&s.js, &commands)
        .await
        .cluster
        .and_then(|c| c.leader)
        .expect("the command stream has a leader");
    let healthy = cluster
        .nodes()
        .iter()
        .find(|n| n.name() != Some(leader.as_str()))
        .expect("a server that does not lead the command stream");
    let client = healthy.connect().await.expect("connect");
    let system = ShardSystem::start::<Ledger>(client.clone(), s.config("a").build().unwrap())
        .await
        .expect("start the shard system");
    let sender = CommandSender::<Ledger>::new(client, &s.config("client").build().unwrap());
    sender
        .send_with_key(ENTITY, "first", &LedgerCmd::Push { n: 0 })
        .await
        .expect("the first send");
    let applied = |expected: Vec<u64>| {
        let sender = &sender;
        async move {
            sender
                .get(ENTITY, Duration::from_secs(2))
                .await
                .is_ok_and(|got| got.state == expected)
        }
    };
    wait_until(Duration::from_secs(30), "the first command applied", || {
        applied(vec![0])
    })
    .await
    .unwrap();

    let frozen = cluster.node_by_name(&leader).expect("a cluster node");
    frozen.pause().expect("SIGSTOP the command stream's leader");
    let started = Instant::now();
    let sent = sender
        .send_with_key(ENTITY, "second", &LedgerCmd::Push { n: 1 })
        .await;
    let took = started.elapsed();
    frozen.resume().expect("SIGCONT");
    let new_leader = jetshard_tests::stream_info(&s.js, &commands)
        .await
        .cluster
        .and_then(|c| c.leader);
    eprintln!(
        "keyed send through a frozen leader ({leader}; now {new_leader:?}): {sent:?} after {took:?}"
    );
    sent.unwrap_or_else(|e| panic!("the keyed send failed after {took:?}: {e}"));
    wait_until(
        Duration::from_secs(30),
        "the second command applied",
        || applied(vec![0, 1]),
    )
    .await
    .unwrap();
    // Once: the publishes made again were stored as one command, and nothing is left to apply.
    jetshard_tests::wait_drained(&s.js, Duration::from_secs(30))
        .await
        .unwrap();
    let stored = jetshard_tests::stream_info(&s.js, &commands)
        .await
        .state
        .last_sequence;
    assert_eq!(stored, 2, "two commands stored");
    let state = sender
        .get(ENTITY, Duration::from_secs(5))
        .await
        .unwrap()
        .state;
    assert_eq!(state, vec![0, 1], "applied once");
    system.shutdown().await.unwrap();
}
