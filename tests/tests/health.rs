//! `ShardSystem::health` in one process against a real server: ready with nothing served while
//! every partition waits as a standby, ready and serving each partition once acquired, stopped
//! once the system has stopped; not ready while its connection is cut, even owning nothing.
//! (The degraded phases: `health.rs`'s unit tests.)

use std::time::{Duration, Instant};

use jetshard::{Health, ShardSystem};
use jetshard_testkit::{TcpProxy, wait_until};
use jetshard_tests::ledger::Ledger;
use jetshard_tests::model::Op;
use jetshard_tests::{Scenario, id_in, init_tracing};

const PARTITIONS: u32 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_system_is_ready_once_it_serves_what_it_owns_and_stopped_after() {
    init_tracing();
    let mut s = Scenario::single(PARTITIONS).await;
    let system = s.system("n1").await;
    // Every owner has started (and posted) before `start` returns; no command, no pin.
    assert_eq!(system.health(), Health::Ready { serving: vec![] });

    for partition in 0..PARTITIONS {
        s.send(&id_in("h", partition, PARTITIONS), Op::Append(0))
            .await;
    }
    let serving = Health::Ready {
        serving: (0..PARTITIONS).collect(),
    };
    wait_until(
        Duration::from_secs(20),
        "every partition served",
        || async { system.health() == serving },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}", system.health()));

    system.actor().stop(Some("test".to_owned()));
    wait_until(Duration::from_secs(20), "stopped", || async {
        system.health() == Health::Stopped
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}", system.health()));
    s.check().await;
}

/// A process that owns nothing (a node process owns every partition) is ready while it can reach
/// the server; cut from it (a TCP proxy between them), it says `Disconnected`, not ready; once
/// the connection is back it is ready again, owning nothing still. The owner serves throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_owning_nothing_is_not_ready_while_it_cannot_reach_its_server() {
    init_tracing();
    let mut s = Scenario::single(PARTITIONS).await;
    let owner = s.node("owner").await;
    let entities: Vec<String> = (0..PARTITIONS)
        .map(|p| id_in("cut", p, PARTITIONS))
        .collect();
    s.append_to_all(&entities, 0).await;
    s.wait_owns_all(&owner).await;

    let proxy = TcpProxy::start(s.server().addr()).await.expect("proxy");
    let client = async_nats::ConnectOptions::new()
        .reconnect_delay_callback(|_| Duration::from_millis(100))
        .connect(proxy.url())
        .await
        .expect("connect through the proxy");
    // No balancing: the owner never hears of it, and hands it nothing.
    let config = s
        .config("behind-proxy")
        .balance(false)
        .build()
        .expect("config");
    let system = ShardSystem::start::<Ledger>(client, config)
        .await
        .expect("start");
    let idle = Health::Ready { serving: vec![] };
    wait_until(Duration::from_secs(20), "ready, owning nothing", || async {
        system.health() == idle
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}", system.health()));

    let cut = Instant::now();
    proxy.cut();
    wait_until(Duration::from_secs(10), "not ready once cut", || async {
        system.health() == Health::Disconnected
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}", system.health()));
    eprintln!("not ready {} ms after the cut", cut.elapsed().as_millis());
    // Still cut: the owner serves, this process stays not ready.
    s.append_to_all(&entities, 1).await;
    jetshard_tests::wait_drained(&s.js, Duration::from_secs(20))
        .await
        .expect("the owner drains its partitions");
    assert!(!system.health().is_ready(), "{:?}", system.health());

    let healed = Instant::now();
    proxy.heal();
    wait_until(
        Duration::from_secs(20),
        "ready again once healed",
        || async { system.health() == idle },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}", system.health()));
    eprintln!(
        "ready again {} ms after the heal",
        healed.elapsed().as_millis()
    );
    assert_eq!(
        owner.owned().len(),
        PARTITIONS as usize,
        "the owner kept its partitions"
    );
    s.append_to_all(&entities, 2).await;
    system.shutdown().await.expect("shut down");
    s.check().await;
}
