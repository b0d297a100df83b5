//! Scale out: each owning process is watched by a few others and each partition is
//! pulled by a few processes, chosen by rendezvous hashing over the membership; a crash still
//! moves in well under the pin TTL in a fleet of 16, and what the bounded sets miss (the watchers
//! or the standbys die with the owner) is still taken, later.

use std::time::Duration;

use jetshard_testkit::wait_until;
use jetshard_tests::node::{Node, now_ms};
use jetshard_tests::{Scenario, id_in, init_tracing};

/// Starts one node process per id, each with `env`.
async fn fleet(s: &Scenario, ids: &[String], env: &[(&str, &str)]) -> Vec<Node> {
    let mut nodes = Vec::with_capacity(ids.len());
    for id in ids {
        nodes.push(s.node_with(id, env).await);
    }
    nodes
}

/// One entity per partition, and a command to each: every partition has work.
async fn work_everywhere(s: &mut Scenario, partitions: u32, round: u64) -> Vec<String> {
    let entities: Vec<String> = (0..partitions)
        .map(|p| id_in("scale-", p, partitions))
        .collect();
    s.append_to_all(&entities, round).await;
    entities
}

/// Waits until the live nodes own every partition and none more than its fair share
/// (`ceil(partitions / nodes)`: what balancing aims at): every process has heard every other's
/// heartbeat, and the watches and standbys are the bounded ones.
async fn wait_even(nodes: &[&Node], partitions: u32) {
    let fair = partitions.div_ceil(nodes.len() as u32) as usize;
    wait_until(
        Duration::from_secs(90),
        "every partition owned, none over its fair share",
        || async {
            let owned: Vec<usize> = nodes.iter().map(|n| n.owned().len()).collect();
            owned.iter().sum::<usize>() == partitions as usize && owned.iter().all(|o| *o <= fair)
        },
    )
    .await
    .unwrap_or_else(|e| {
        let owned: Vec<(&str, Vec<u32>)> =
            nodes.iter().map(|n| (n.id.as_str(), n.owned())).collect();
        panic!("{e}: {owned:?}")
    });
}

fn owner_of(nodes: &[Node], partition: u32) -> &Node {
    nodes
        .iter()
        .find(|n| n.owned().contains(&partition))
        .expect("an owner")
}

/// Waits (bounded by `within`) until one of `survivors` has acquired `partition` after
/// `killed_at` (ms), and returns how many ms after `killed_at` the first one did.
async fn wait_taken(
    survivors: &[&Node],
    partition: u32,
    killed_at: u128,
    within: Duration,
) -> u128 {
    wait_until(
        within,
        &format!("a survivor to take partition {partition}"),
        || async {
            survivors
                .iter()
                .any(|n| n.acquired_after(partition, killed_at).is_some())
        },
    )
    .await
    .unwrap();
    let taken = survivors
        .iter()
        .filter_map(|n| n.acquired_after(partition, killed_at))
        .map(|l| l.at_ms)
        .min()
        .expect("taken");
    taken - killed_at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_among_16_processes_moves_in_well_under_the_pin_ttl() {
    init_tracing();
    let partitions = 16;
    let mut s = Scenario::single(partitions)
        .await
        .pin_ttl(Duration::from_secs(3));
    let ids: Vec<String> = (0..16).map(|i| format!("n{i:02}")).collect();
    let mut nodes = fleet(&s, &ids, &[]).await;
    let entities = work_everywhere(&mut s, partitions, 0).await;
    wait_even(&nodes.iter().collect::<Vec<_>>(), partitions).await;

    let victim = owner_of(&nodes, 0).id.clone();
    let lost = owner_of(&nodes, 0).owned();
    let index = nodes.iter().position(|n| n.id == victim).expect("victim");
    nodes[index].kill().await;
    let killed_at = now_ms();
    s.append_to_all(&entities, 1).await;
    let survivors: Vec<&Node> = nodes.iter().filter(|n| n.id != victim).collect();
    for &partition in &lost {
        let takeover_ms =
            wait_taken(&survivors, partition, killed_at, Duration::from_secs(10)).await;
        eprintln!(
            "partition {partition}: taken {takeover_ms} ms after SIGKILL (pin TTL 3 s, 16 processes, 3 watchers)"
        );
        assert!(takeover_ms < 1000, "takeover took {takeover_ms} ms");
    }
    s.check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_whose_watchers_die_with_it_is_still_replaced() {
    init_tracing();
    let partitions = 4;
    let pin_ttl = Duration::from_secs(2);
    let mut s = Scenario::single(partitions).await.pin_ttl(pin_ttl);
    let ids: Vec<String> = ["a", "b", "c", "d"].map(str::to_owned).to_vec();
    // One watcher per owner, so that it can die with the owner.
    let mut nodes = fleet(&s, &ids, &[("JETSHARD_CRASH_WATCHERS", "1")]).await;
    let entities = work_everywhere(&mut s, partitions, 0).await;
    wait_even(&nodes.iter().collect::<Vec<_>>(), partitions).await;

    let owner = owner_of(&nodes, 0).id.clone();
    let watchers =
        jetshard::test_support::crash_watchers(&owner, ids.iter().map(String::as_str), 1);
    assert_eq!(watchers.len(), 1);
    let doomed = [owner.clone(), watchers[0].to_owned()];
    let lost: Vec<u32> = nodes
        .iter()
        .filter(|n| doomed.contains(&n.id))
        .flat_map(Node::owned)
        .collect();
    for node in nodes.iter_mut().filter(|n| doomed.contains(&n.id)) {
        node.kill().await;
    }
    let killed_at = now_ms();
    s.append_to_all(&entities, 1).await;
    let survivors: Vec<&Node> = nodes.iter().filter(|n| !doomed.contains(&n.id)).collect();
    for &partition in &lost {
        let taken = wait_taken(&survivors, partition, killed_at, Duration::from_secs(20)).await;
        eprintln!(
            "partition {partition}: taken {taken} ms after {doomed:?} were killed (pin TTL 2 s)"
        );
    }
    s.check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_whose_owner_and_standbys_all_die_is_still_taken() {
    init_tracing();
    let partitions = 5;
    let pin_ttl = Duration::from_secs(2);
    let mut s = Scenario::single(partitions).await.pin_ttl(pin_ttl);
    let ids: Vec<String> = ["a", "b", "c", "d", "e"].map(str::to_owned).to_vec();
    // Two processes stand by for each partition.
    let mut nodes = fleet(&s, &ids, &[("JETSHARD_STANDBYS", "1")]).await;
    let entities = work_everywhere(&mut s, partitions, 0).await;
    wait_even(&nodes.iter().collect::<Vec<_>>(), partitions).await;

    let owner = owner_of(&nodes, 0).id.clone();
    let mut doomed: Vec<String> =
        jetshard::test_support::partition_standbys(0, ids.iter().map(String::as_str), 1)
            .into_iter()
            .map(str::to_owned)
            .collect();
    if !doomed.contains(&owner) {
        doomed.push(owner.clone());
    }
    assert!(doomed.len() <= 3, "two survivors at least: {doomed:?}");
    for node in nodes.iter_mut().filter(|n| doomed.contains(&n.id)) {
        node.kill().await;
    }
    let killed_at = now_ms();
    s.append_to_all(&entities, 1).await;
    let survivors: Vec<&Node> = nodes.iter().filter(|n| !doomed.contains(&n.id)).collect();
    // None of the survivors is a standby of partition 0.
    let taken = wait_taken(&survivors, 0, killed_at, Duration::from_secs(30)).await;
    eprintln!(
        "partition 0: taken {taken} ms after its owner and standbys {doomed:?} were killed (pin TTL 2 s)"
    );
    // Every partition is served again, by the survivors alone.
    wait_until(
        Duration::from_secs(30),
        "the survivors to own every partition",
        || async {
            survivors.iter().map(|n| n.owned().len()).sum::<usize>() == partitions as usize
        },
    )
    .await
    .unwrap();
    s.check().await;
}

/// Members come and go while commands flow, in a fleet larger than a partition's standbys (so
/// the bounded sets are in force and change with every join and leave): processes join, stop
/// gracefully and are killed, and the history checker finds nothing lost, doubled or
/// reordered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_coming_and_going_under_load_keep_every_promise() {
    init_tracing();
    let partitions = 8;
    let mut s = Scenario::single(partitions)
        .await
        .pin_ttl(Duration::from_secs(1));
    let ids: Vec<String> = (0..5).map(|i| format!("m{i}")).collect();
    let mut nodes = fleet(&s, &ids, &[("JETSHARD_STANDBYS", "1")]).await;
    let entities: Vec<String> = (0..24).map(|e| format!("churn-{e}")).collect();
    let mut round = 0;
    s.append_to_all(&entities, round).await;
    wait_even(&nodes.iter().collect::<Vec<_>>(), partitions).await;
    // Each step changes the membership, then sends a round to every entity.
    for step in 0..6 {
        match step % 3 {
            0 => nodes.push(
                s.node_with(&format!("j{step}"), &[("JETSHARD_STANDBYS", "1")])
                    .await,
            ),
            1 => {
                let mut leaving = nodes.remove(0);
                leaving.terminate().await;
            }
            _ => {
                let mut dead = nodes.remove(0);
                dead.kill().await;
            }
        }
        for _ in 0..3 {
            round += 1;
            s.append_to_all(&entities, round).await;
        }
    }
    wait_even(&nodes.iter().collect::<Vec<_>>(), partitions).await;
    s.check().await;
}

/// nats-server 2.15 limits a stream to 1,000 consumers by default; a partition is a consumer,
/// and jetshard takes up to 4,096 of them: the command stream says how many it needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_partitions_than_the_server_s_default_consumer_limit_start_and_serve() {
    init_tracing();
    let partitions = 1100;
    let mut s = Scenario::single(partitions).await;
    let system = s.system("big").await;
    let entity = id_in("big-", partitions - 1, partitions);
    s.send(&entity, jetshard_tests::model::Op::Append(0)).await;
    wait_until(
        Duration::from_secs(60),
        "the last partition owned",
        || async {
            system.status().await.is_ok_and(|st| {
                st.iter()
                    .any(|p| p.partition == partitions - 1 && p.generation.is_some())
            })
        },
    )
    .await
    .unwrap();
    s.check().await;
    system.shutdown().await.expect("shut down");
}
