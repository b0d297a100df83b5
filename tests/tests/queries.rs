//! State queries: an entity's state read from its owner without a command, after the commands
//! acknowledged before the query, and only from the owner of the current generation (also
//! while the partition changes hands).

use std::time::Duration;

use jetshard::admin::Admin;
use jetshard::{Error, Reply, ShardSystem, partition_of};
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::{Scenario, id_in, init_tracing};

const WITHIN: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_returns_the_state_after_the_acknowledged_commands() {
    init_tracing();
    let s = Scenario::single(2).await;
    let system = s.system("n1").await;
    let sender = &s.sender;

    let reply = sender
        .request("r", &LedgerCmd::AppendMany { from: 0, count: 3 }, WITHIN)
        .await
        .unwrap();
    assert!(
        matches!(reply, Reply::<Ledger>::Applied { .. }),
        "{reply:?}"
    );
    let current = sender.get("r", WITHIN).await.unwrap();
    assert_eq!(current.state, vec![0, 1, 2]);
    assert_eq!(current.last_command_seq, reply.command_seq());
    assert!(current.generation >= 1);

    // An entity without history reads as the default state (in an owned partition: a
    // partition that never had a command has no owner to answer).
    let r = jetshard::EntityId::new("r").unwrap();
    let nobody = id_in("nobody", partition_of(&r, 2), 2);
    let empty = sender.get(&nobody, WITHIN).await.unwrap();
    assert_eq!((empty.state, empty.last_command_seq), (vec![], 0));

    // The untyped read of tools and the CLI.
    let answer = Admin::new(s.client.clone(), "ledger")
        .get("r", WITHIN)
        .await
        .unwrap();
    assert_eq!(answer.state, b"[0,1,2]");
    assert_eq!(answer.entity, "r");

    system.shutdown().await.unwrap();

    // A new owner loads entities lazily: a query of one it has not loaded loads it (the
    // journal, not the default state). Another entity's command makes the partition owned.
    let system = s.system("n2").await;
    let neighbour = id_in("neighbour", partition_of(&r, 2), 2);
    sender
        .request(&neighbour, &LedgerCmd::Push { n: 0 }, WITHIN)
        .await
        .unwrap();
    let current = sender.get("r", WITHIN).await.unwrap();
    assert_eq!(current.state, vec![0, 1, 2]);
    assert_eq!(current.last_command_seq, reply.command_seq());
    system.shutdown().await.unwrap();
    // Nobody owns the partition: no answer.
    let error = sender
        .get("r", Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::NoAnswer { .. }), "{error}");
}

/// A hand-off about to happen: `(s, first, second, before)`, where `first` owns the one
/// partition, entity "h" holds one number under generation `before`, and `second` stands by.
async fn hand_off() -> (Scenario, ShardSystem, ShardSystem, u64) {
    let s = Scenario::single(1).await;
    let first = s.system("n1").await;
    s.sender
        .request("h", &LedgerCmd::Append { n: 0 }, WITHIN)
        .await
        .unwrap();
    let before = s.sender.get("h", WITHIN).await.unwrap().generation;
    let second = s.system("n2").await;
    (s, first, second, before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_during_a_hand_off_never_see_a_stale_state() {
    init_tracing();
    // n1 owns the partition.
    let (s, first, second, before) = hand_off().await;
    let sender = s.sender.clone();

    // Hand the partition over while commands and queries go on.
    let handing_off = tokio::spawn(async move { first.shutdown().await });
    let mut generations = vec![before];
    for n in 1..30u64 {
        let reply = sender
            .request("h", &LedgerCmd::Append { n }, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(matches!(reply, Reply::Applied { .. }), "{n}: {reply:?}");
        // Every answer holds every acknowledged command: a stale owner never answers.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let current = loop {
            match sender.get("h", Duration::from_millis(500)).await {
                Ok(current) => break current,
                // Nobody answers while the partition changes hands; a refusal asks again.
                Err(Error::NoAnswer { .. } | Error::QueryRefused { .. })
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("no answer after command {n}: {e}"),
            }
        };
        assert_eq!(current.state, (0..=n).collect::<Vec<_>>(), "after {n}");
        assert_eq!(current.last_command_seq, reply.command_seq());
        assert!(current.generation >= *generations.last().unwrap());
        generations.push(current.generation);
    }
    handing_off.await.unwrap().unwrap();
    assert!(
        generations.last() > generations.first(),
        "the partition changed hands: {generations:?}"
    );
    second.shutdown().await.unwrap();
}

/// Queries sent without pause while the owner hands the partition over (a graceful stop) are
/// each answered (by the old owner while it still owns the partition, by the new one once it
/// has the entity) or told the partition is moving: none ends unanswered (`NoAnswer`), though
/// some reach the partition while nobody owns it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_during_a_hand_off_is_answered_or_told_the_partition_is_moving() {
    init_tracing();
    let (s, first, second, before) = hand_off().await;
    let sender = s.sender.clone();

    let stop = tokio::sync::watch::channel(false);
    let (stopped, mut stopping) = stop;
    let querying = tokio::spawn(async move {
        let (mut answered, mut moving, mut generations) = (0u32, 0u32, Vec::new());
        // Bounded: the test ends it once the hand-off is over, or the deadline does.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !*stopping.borrow_and_update() && tokio::time::Instant::now() < deadline {
            match sender.get("h", Duration::from_secs(10)).await {
                Ok(current) => {
                    assert_eq!(current.state, vec![0]);
                    generations.push(current.generation);
                    answered += 1;
                }
                Err(Error::Moving { .. }) => moving += 1,
                Err(e) => panic!("a query during the hand-off: {e}"),
            }
        }
        (answered, moving, generations)
    });
    first.shutdown().await.unwrap();
    // Until the new owner has answered a query of its own.
    let probe = s.sender.clone();
    jetshard_testkit::wait_until(WITHIN, "the new owner answers", || async {
        probe
            .get("h", Duration::from_secs(1))
            .await
            .is_ok_and(|current| current.generation > before)
    })
    .await
    .unwrap();
    stopped.send(true).unwrap();
    let (answered, moving, generations) = querying.await.unwrap();
    eprintln!(
        "{answered} answered, {moving} told moving, generations from {:?} to {:?}",
        generations.first(),
        generations.last()
    );
    assert!(answered > 0);
    second.shutdown().await.unwrap();
}

/// A claim that supersedes the owner, made by a process that never serves the partition (a
/// takeover that claimed late, after its pin had moved on, and stepped down at once), leaves
/// the owner pinned under a generation the fence no longer names. No command comes to show it
/// the fence: the first query's fence check does, the owner steps down, and the partition is
/// claimed afresh and answers, within the query's wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_reaching_an_owner_superseded_by_a_late_claim_brings_the_partition_back() {
    init_tracing();
    let s = Scenario::single(1).await;
    let system = s.system("n1").await;
    s.sender
        .request("h", &LedgerCmd::Append { n: 0 }, WITHIN)
        .await
        .unwrap();
    let before = s.sender.get("h", WITHIN).await.unwrap().generation;
    let names = s.config("n1").build().unwrap().names();
    let (late, _) = jetshard_tests::fence::claim_elsewhere(&s.js, &names, 0).await;
    assert_eq!(late, before + 1);

    let current = s.sender.get("h", Duration::from_secs(20)).await.unwrap();
    assert_eq!(current.state, vec![0]);
    assert!(
        current.generation > late,
        "answered under generation {} after the late claim of {late}",
        current.generation
    );
    // And it serves commands again.
    let reply = s
        .sender
        .request("h", &LedgerCmd::Append { n: 1 }, WITHIN)
        .await
        .unwrap();
    assert!(matches!(reply, Reply::Applied { .. }), "{reply:?}");
    assert_eq!(s.sender.get("h", WITHIN).await.unwrap().state, vec![0, 1]);
    system.shutdown().await.unwrap();
}

/// The same with nobody asking: no query, no command, and the owner's compaction sweep is the
/// first to read the fence. It steps down and wakes the partition, which is claimed afresh by
/// itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_owner_superseded_by_a_late_claim_is_found_by_its_compaction_sweep() {
    init_tracing();
    let s = Scenario::single(1).await;
    let config = s
        .config("n1")
        .compaction_interval(Duration::from_millis(500));
    let system = s.system_with(config).await;
    s.sender
        .request("h", &LedgerCmd::Append { n: 0 }, WITHIN)
        .await
        .unwrap();
    let names = system.config().names();
    let (late, _) = jetshard_tests::fence::claim_elsewhere(&s.js, &names, 0).await;

    jetshard_testkit::wait_until(WITHIN, "claimed again after the late claim", || async {
        system
            .status()
            .await
            .unwrap()
            .iter()
            .any(|p| p.generation.is_some_and(|g| g > late))
    })
    .await
    .unwrap();
    assert_eq!(s.sender.get("h", WITHIN).await.unwrap().state, vec![0]);
    system.shutdown().await.unwrap();
}
