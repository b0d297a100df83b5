//! `ShardSystem::health` in one process against a real server: ready with nothing served while
//! every partition waits as a standby, ready and serving each partition once acquired, stopped
//! once the system has stopped. (The degraded phases: `health.rs`'s unit tests.)

use std::time::Duration;

use jetshard::Health;
use jetshard_testkit::wait_until;
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
