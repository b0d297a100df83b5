//! Balancing: processes that join share the partitions evenly, under load, without losing or
//! reordering anything.

use std::time::Duration;

use jetshard::{OwnershipChange, ShardSystem};
use jetshard_testkit::wait_until;
use jetshard_tests::node::{Node, NodeOptions, now_ms};
use jetshard_tests::{Scenario, id_in, init_tracing};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_that_join_get_an_even_share_of_the_partitions() {
    init_tracing();
    let mut s = Scenario::single(6)
        .await
        .pin_ttl(Duration::from_millis(500));
    let entities: Vec<String> = (0..30).map(|e| format!("e{e}")).collect();

    let a = s.node("a").await;
    s.append_to_all(&entities, 0).await;
    s.wait_owns_all(&a).await;
    let b = s.node("b").await;
    let c = s.node("c").await;

    // Load goes on while the partitions move.
    let mut n = 1;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    loop {
        s.append_to_all(&entities, n).await;
        n += 1;
        let shares = [a.owned().len(), b.owned().len(), c.owned().len()];
        if shares == [2, 2, 2] && n > 5 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not balanced after 40 s: {shares:?}"
        );
        // Deliberate: the load's pace between rounds, not a wait for a condition.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every entity holds 0..n, each once, in order, under its partition's generation.
    s.check_within(Duration::from_secs(30)).await;
}

/// A partition handed off goes to the process that lacks partitions, not to another one that
/// has its share (which would hand it off again): a newcomer's share moves once per partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_gets_its_share_with_one_move_per_partition() {
    init_tracing();
    let mut s = Scenario::single(6)
        .await
        .pin_ttl(Duration::from_millis(500));
    let entities: Vec<String> = (0..6).map(|p| id_in("e", p, 6)).collect();
    let a = s.system("a").await;
    s.append_to_all(&entities, 0).await;
    wait_until(
        Duration::from_secs(20),
        "a to own every partition",
        || async { owned(&a).await == 6 },
    )
    .await
    .unwrap();
    let b = s.system("b").await;
    // A partition is pinned, and so owned, only once a command comes: load goes on.
    let mut n = 1;
    while [owned(&a).await, owned(&b).await] != [3, 3] {
        n = load_round(&mut s, &entities, n, "a and b to own 3 each").await;
    }

    let mut seen = vec![a.ownership_events(), b.ownership_events()];
    let c = s.system("c").await;
    seen.push(c.ownership_events());
    while [owned(&a).await, owned(&b).await, owned(&c).await] != [2, 2, 2] {
        n = load_round(&mut s, &entities, n, "a, b and c to own 2 each").await;
    }
    let mut acquired = [0u32; 6];
    for events in &mut seen {
        while let Ok(event) = events.try_recv() {
            if event.change == OwnershipChange::Acquired {
                acquired[event.partition as usize] += 1;
            }
        }
    }
    assert!(
        acquired.iter().all(|n| *n <= 1),
        "acquisitions per partition since c started: {acquired:?}"
    );
    assert_eq!(acquired.iter().sum::<u32>(), 2, "{acquired:?}");
    s.check_within(Duration::from_secs(30)).await;
}

/// Sends `Append(n)` to every entity and paces the load (100 ms); panics once `n` passes the
/// 30 s such rounds take at most, saying what did not happen. Returns the next `n`.
async fn load_round(s: &mut Scenario, entities: &[String], n: u64, what: &str) -> u64 {
    assert!(n < 300, "no {what} after 300 rounds of load");
    s.append_to_all(entities, n).await;
    // Deliberate: the load's pace between rounds, not a wait for a condition.
    tokio::time::sleep(Duration::from_millis(100)).await;
    n + 1
}

/// Partitions a shard system owns, by its own account.
async fn owned(system: &ShardSystem) -> usize {
    system.status().await.map_or(0, |partitions| {
        partitions.iter().filter(|p| p.generation.is_some()).count()
    })
}

/// A partition is owned only while it has a command to deliver: one handed off with none
/// waiting is woken (a wake-up command), so the newcomer takes it at once and answers queries
/// for its entities, with no load at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_partition_handed_off_is_taken_by_the_newcomer_without_load() {
    init_tracing();
    let mut s = Scenario::single(4)
        .await
        .pin_ttl(Duration::from_millis(500));
    let entities: Vec<String> = (0..12).map(|e| format!("e{e}")).collect();
    let a = s.node("a").await;
    s.append_to_all(&entities, 0).await;
    s.wait_owns_all(&a).await;
    s.check().await;
    // No command from here on.
    let b = s.node("b").await;
    wait_until(Duration::from_secs(30), "b to own its share", || async {
        b.owned().len() == 2 && a.owned().len() == 2
    })
    .await
    .unwrap();
    // Every entity is answered by its owner, whichever process that is.
    for entity in &entities {
        let state = s
            .sender
            .get(entity, Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("{entity} not answered: {e}"))
            .state;
        assert_eq!(state, [0], "{entity}");
    }
}

/// Whether `log` (a node's stderr), past its first `from` bytes, says that the node holds its
/// standbys back.
fn holds_back(log: &std::path::Path, from: usize) -> bool {
    std::fs::read(log).is_ok_and(|text| {
        String::from_utf8_lossy(text.get(from..).unwrap_or_default())
            .lines()
            .any(|l| l.contains("standbys told whether to pull") && l.contains("hold_back=true"))
    })
}

/// How long `log` is now, in bytes.
fn log_len(log: &std::path::Path) -> usize {
    std::fs::metadata(log).map_or(0, |m| m.len() as usize)
}

/// The partitions `node` handed off at or after `since_ms`.
fn handed_off_since(node: &Node, since_ms: u128) -> Vec<u32> {
    node.lines()
        .into_iter()
        .filter(|l| l.what == "RELEASED" && l.at_ms >= since_ms && l.text.contains("handed off"))
        .map(|l| l.partition)
        .collect()
}

/// The process that owns fewest is the one the others hand partitions to and the only one that
/// pulls them (the others hold their standbys back): if it dies before it takes a partition
/// handed off to it, nobody else pulls that partition until they count the dead process out.
/// Its crash watchers find it gone (it owns nothing, but it is a member) and say so: the
/// partition is taken within the pin TTL (the dead process may have been pinned) and a margin,
/// not after the membership expiry (three pin TTLs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_handed_off_to_a_process_that_dies_before_taking_it_is_taken_within_the_pin_ttl()
 {
    init_tracing();
    let partitions = 8;
    let pin_ttl = Duration::from_secs(2);
    let mut s = Scenario::single(partitions).await.pin_ttl(pin_ttl);
    let entities: Vec<String> = (0..partitions).map(|p| id_in("h", p, partitions)).collect();
    let logs = tempfile::tempdir().expect("a log directory");
    let spec = s.node_spec(&[("RUST_LOG", "jetshard=info,jetshard::system=trace")]);
    let mut nodes = Vec::new();
    for id in ["a", "b"] {
        let options = NodeOptions {
            log_file: Some(logs.path().join(format!("{id}.log"))),
            ..s.node_options()
        };
        nodes.push(Node::start_with(&s.urls_from(0), id, &spec, &options).await);
    }
    s.append_to_all(&entities, 0).await;
    wait_until(Duration::from_secs(60), "a and b own 4 each", || async {
        nodes.iter().all(|n| n.owned().len() == 4)
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}: {:?}",
            nodes.iter().map(Node::owned).collect::<Vec<_>>()
        )
    });

    // c joins; once a and b have heard it (they hold their standbys back for it: said in their
    // logs after c started), it freezes: a and b hand it a partition each a balancing round
    // later, which nobody takes.
    let log_of = |id: &str| logs.path().join(format!("{id}.log"));
    let before_c = [log_len(&log_of("a")), log_len(&log_of("b"))];
    let mut c = s.node("c").await;
    wait_until(Duration::from_secs(20), "a and b to hear c", || async {
        holds_back(&log_of("a"), before_c[0]) && holds_back(&log_of("b"), before_c[1])
    })
    .await
    .expect("c heard");
    let frozen_at = now_ms();
    c.pause();
    wait_until(
        Duration::from_secs(20),
        "a or b to hand a partition off",
        || async {
            nodes
                .iter()
                .any(|n| !handed_off_since(n, frozen_at).is_empty())
        },
    )
    .await
    .expect("a hand-off");
    c.kill().await;
    let killed_at = now_ms();
    s.append_to_all(&entities, 1).await;
    let handed: Vec<u32> = nodes
        .iter()
        .flat_map(|n| handed_off_since(n, frozen_at))
        .collect();
    for &partition in &handed {
        wait_until(
            Duration::from_secs(30),
            "a or b to take the partition handed off to c",
            || async {
                nodes
                    .iter()
                    .any(|n| n.acquired_after(partition, killed_at).is_some())
            },
        )
        .await
        .unwrap();
        let taken = nodes
            .iter()
            .filter_map(|n| n.acquired_after(partition, killed_at))
            .map(|l| l.at_ms)
            .min()
            .expect("taken");
        let unowned_ms = taken - killed_at;
        eprintln!(
            "partition {partition}: handed off to c, c killed, taken {unowned_ms} ms later (pin TTL 2 s)"
        );
        assert!(
            unowned_ms < (pin_ttl + Duration::from_millis(1000)).as_millis(),
            "partition {partition} unowned for {unowned_ms} ms after c died"
        );
    }
    s.check().await;
}

/// A process's heartbeats on `<t>.nodes` within `window`: how many, and whether each said how
/// long until its next (`every_ms`), and what.
async fn heartbeats_of(
    heard: &mut async_nats::Subscriber,
    node: &str,
    window: Duration,
) -> (usize, Vec<Option<u64>>) {
    use futures::{FutureExt, StreamExt};
    // What was said before the window is not counted.
    while let Some(Some(_)) = heard.next().now_or_never() {}
    let end = tokio::time::Instant::now() + window;
    let mut every = Vec::new();
    while let Ok(Some(message)) = tokio::time::timeout_at(end, heard.next()).await {
        let beat: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
        if beat["node"] == node {
            every.push(beat["every_ms"].as_u64());
        }
    }
    (every.len(), every)
}

/// Past 32 processes each says its heartbeat less often, so that what one process hears does
/// not grow with the fleet: beside 40 others (said from a client on `<t>.nodes`, each twice a
/// pin TTL), a process says its own every two pin TTLs, and says so (`every_ms`: the others count
/// it out after three of those); once the others fall silent and expire, every pin TTL again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_32_processes_a_process_says_its_heartbeat_less_often() {
    init_tracing();
    let ttl = Duration::from_millis(500);
    let s = Scenario::single(2).await.pin_ttl(ttl);
    let names = s.config("n1").build().unwrap().names();
    let mut heard = s
        .client
        .subscribe(names.membership_subject())
        .await
        .unwrap();
    let system = s.system("n1").await;

    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let (client, subject) = (s.client.clone(), names.membership_subject());
    let others = tokio::spawn(async move {
        // Bounded: stopped by the test, or after 30 s.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !*stopped.borrow_and_update() && tokio::time::Instant::now() < deadline {
            for k in 0..40 {
                let beat = serde_json::json!({ "node": format!("other-{k}"), "owned": 0 });
                let body = serde_json::to_vec(&beat).unwrap();
                if client.publish(subject.clone(), body.into()).await.is_err() {
                    return;
                }
            }
            // Twice a pin TTL: a late round under load must not let them expire.
            let _ = tokio::time::timeout(ttl / 2, stopped.changed()).await;
        }
    });

    // Heard for a round first, then counted: 41 members, a period of two pin TTLs.
    tokio::time::sleep(ttl * 3).await;
    let (crowded, every) = heartbeats_of(&mut heard, "n1", ttl * 10).await;
    // A round delayed by a loaded machine only lowers the counts.
    assert!(
        (1..=6).contains(&crowded),
        "{crowded} heartbeats in 10 pin TTLs beside 40 others (one every 2 expected)"
    );
    assert!(
        every.iter().all(|e| *e == Some(1_500)),
        "each says its next comes within 3 pin TTLs: {every:?}"
    );

    stop.send(true).unwrap();
    others.await.unwrap();
    // The others expire after three pin TTLs; then one heartbeat per pin TTL again.
    tokio::time::sleep(ttl * 5).await;
    let (alone, every) = heartbeats_of(&mut heard, "n1", ttl * 10).await;
    eprintln!("in 10 pin TTLs: {crowded} heartbeats beside 40 others, {alone} alone");
    assert!(
        (7..=12).contains(&alone) && alone >= crowded + 3,
        "{alone} heartbeats in 10 pin TTLs alone (one every pin TTL expected), {crowded} beside 40 others"
    );
    assert!(every.iter().all(Option::is_none), "{every:?}");
    system.shutdown().await.unwrap();
}
