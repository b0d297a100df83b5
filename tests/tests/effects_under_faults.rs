//! The fault suite's timer and outbox traffic: durable timers and outbox messages in flight
//! while their owners are SIGKILLed one after another. Every armed timer fires exactly once
//! (at whichever owner holds its partition when it is due, with no other command sent there),
//! a cancelled one never, and every outbox message reaches its target exactly once.

use std::collections::BTreeSet;
use std::time::Duration;

use jetshard_testkit::{owned_by, wait_until};
use jetshard_tests::ledger::LedgerCmd;
use jetshard_tests::node::Node;
use jetshard_tests::{Scenario, init_tracing};

const PARTITIONS: u32 = 4;
const ENTITIES: u64 = 12;
const WITHIN: Duration = Duration::from_secs(60);

/// The ledgers' states, read from their owners: `None` for one not read.
async fn states(s: &Scenario, ids: &[String]) -> Vec<Option<Vec<u64>>> {
    let reads = ids
        .iter()
        .map(|id| async move { s.sender.get(id, Duration::from_secs(2)).await.ok() });
    futures::future::join_all(reads)
        .await
        .into_iter()
        .map(|read| read.map(|snapshot| snapshot.state))
        .collect()
}

/// Kills the node owning the most partitions and waits until the others own them all.
async fn kill_busiest(nodes: &mut Vec<Node>) -> String {
    let victim = (0..nodes.len())
        .max_by_key(|i| nodes[*i].owned().len())
        .expect("a node");
    let mut node = nodes.remove(victim);
    let id = node.id.clone();
    node.kill().await;
    let all: BTreeSet<u32> = (0..PARTITIONS).collect();
    wait_until(WITHIN, "the others own every partition", || async {
        owned_by(nodes.iter().map(Node::process)) == all
    })
    .await
    .unwrap();
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_and_outbox_messages_survive_their_owners_being_killed() {
    init_tracing();
    let s = Scenario::single(PARTITIONS)
        .await
        .pin_ttl(Duration::from_secs(1));
    let mut nodes = vec![s.node("a").await, s.node("b").await];
    let send = |id: String, command: LedgerCmd| {
        let sender = s.sender.clone();
        async move { sender.send(&id, &command).await.unwrap() }
    };
    // Timers due over the next 3 s, one per ledger; some cancelled before they are due.
    for k in 0..ENTITIES {
        let remind = LedgerCmd::Remind {
            name: "due".into(),
            n: 1000 + k,
            after_ms: 600 + 200 * k,
        };
        send(format!("t{k}"), remind).await;
        let remind = LedgerCmd::Remind {
            name: "off".into(),
            n: 3000 + k,
            after_ms: 1500,
        };
        send(format!("c{k}"), remind).await;
        send(format!("c{k}"), LedgerCmd::Forget { name: "off".into() }).await;
    }
    // Outbox messages, half before the first kill, half between the kills.
    for k in 0..ENTITIES / 2 {
        let to = format!("f{k}");
        send(format!("s{k}"), LedgerCmd::Forward { n: 2000 + k, to }).await;
    }
    let all: BTreeSet<u32> = (0..PARTITIONS).collect();
    wait_until(WITHIN, "every partition owned", || async {
        owned_by(nodes.iter().map(Node::process)) == all
    })
    .await
    .unwrap();
    nodes.push(s.node("c").await);
    let first = kill_busiest(&mut nodes).await;
    for k in ENTITIES / 2..ENTITIES {
        let to = format!("f{k}");
        send(format!("s{k}"), LedgerCmd::Forward { n: 2000 + k, to }).await;
    }
    nodes.push(s.node("d").await);
    let second = kill_busiest(&mut nodes).await;
    // A marker due after every cancelled timer: once it fired, they had their time.
    let marker = LedgerCmd::Remind {
        name: "marker".into(),
        n: 9,
        after_ms: 2_000,
    };
    send("marker".into(), marker).await;

    let timers: Vec<String> = (0..ENTITIES).map(|k| format!("t{k}")).collect();
    let sources: Vec<String> = (0..ENTITIES).map(|k| format!("s{k}")).collect();
    let targets: Vec<String> = (0..ENTITIES).map(|k| format!("f{k}")).collect();
    let cancelled: Vec<String> = (0..ENTITIES).map(|k| format!("c{k}")).collect();
    let expect = |base: u64| -> Vec<Option<Vec<u64>>> {
        (0..ENTITIES).map(|k| Some(vec![base + k])).collect()
    };
    let last = std::sync::Mutex::new(String::new());
    let settled = wait_until(
        WITHIN,
        "every timer fired and every message arrived",
        || async {
            let seen = (
                states(&s, &timers).await,
                states(&s, &sources).await,
                states(&s, &targets).await,
                states(&s, &["marker".to_owned()]).await,
            );
            let done = seen.0 == expect(1000)
                && seen.1 == expect(2000)
                && seen.2 == expect(2000)
                && seen.3 == [Some(vec![9])];
            *last.lock().unwrap() = format!("{seen:?}");
            done
        },
    )
    .await;
    if let Err(e) = settled {
        panic!(
            "{e} (killed {first}, then {second}); last read (timers, sources, targets, marker): {}",
            last.lock().unwrap()
        );
    }
    // Cancelled timers never fired: each cancelled ledger is empty (never written).
    for state in states(&s, &cancelled).await {
        assert!(
            state.as_ref().is_none_or(Vec::is_empty),
            "a cancelled timer fired: {state:?}"
        );
    }
    // And nothing fires twice later: a last command to each timer ledger sees one number.
    for k in 0..ENTITIES {
        send(format!("t{k}"), LedgerCmd::Push { n: 5000 + k }).await;
    }
    let want: Vec<Option<Vec<u64>>> = (0..ENTITIES)
        .map(|k| Some(vec![1000 + k, 5000 + k]))
        .collect();
    wait_until(WITHIN, "the last pushes", || async {
        states(&s, &timers).await == want
    })
    .await
    .unwrap();
}
