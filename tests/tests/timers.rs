//! Durable timers: a timer fires as a command through the normal path, once; a cancelled one
//! never fires; armed timers survive a restart and a crash of their owner.

use std::time::Duration;

use jetshard_testkit::wait_until;
use jetshard_tests::ledger::{FIRED, LedgerCmd};
use jetshard_tests::model::Op;
use jetshard_tests::{Scenario, init_tracing};

const WITHIN: Duration = Duration::from_secs(30);

fn remind(name: &str, n: u64, after_ms: u64) -> LedgerCmd {
    LedgerCmd::Remind {
        name: name.into(),
        n,
        after_ms,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_fires_once_and_a_cancelled_one_never() {
    init_tracing();
    let s = Scenario::single(1).await;
    let system = s.system("n1").await;
    let send = |command: LedgerCmd| {
        let sender = s.sender.clone();
        async move { sender.send("t", &command).await.unwrap() }
    };
    send(remind("a", 1, 300)).await;
    send(remind("b", 2, 300)).await;
    send(LedgerCmd::Forget { name: "b".into() }).await;
    // Set again: only the latest setting fires.
    send(remind("c", 3, 60_000)).await;
    send(remind("c", 4, 600)).await;
    // A marker due after the others: once it fired, the others had their turn.
    send(remind("z", 9, 1_500)).await;
    wait_until(WITHIN, "the marker fired", || async {
        s.sender
            .get("t", Duration::from_secs(1))
            .await
            .is_ok_and(|snapshot| snapshot.state.contains(&9))
    })
    .await
    .unwrap();
    // Whatever was published with the marker is in the stream before this, and applied first.
    // Timers due together fire in no particular order.
    send(LedgerCmd::Push { n: 10 }).await;
    wait_until(WITHIN, "10 pushed", || async {
        s.sender
            .get("t", Duration::from_secs(1))
            .await
            .is_ok_and(|snapshot| snapshot.state.contains(&10))
    })
    .await
    .unwrap();
    let mut fired = s.sender.get("t", WITHIN).await.unwrap().state;
    fired.sort_unstable();
    assert_eq!(fired, [1, 4, 9, 10], "a and the last c once, b never");
    system.shutdown().await.unwrap();

    // Nothing is armed any more: a restart fires nothing again.
    let system = s.system("n1").await;
    send(LedgerCmd::Push { n: 11 }).await;
    let mut after = Vec::new();
    wait_until(WITHIN, "11 pushed", || async {
        s.sender
            .get("t", Duration::from_secs(1))
            .await
            .is_ok_and(|snapshot| snapshot.state.contains(&11))
    })
    .await
    .unwrap();
    after.extend(s.sender.get("t", WITHIN).await.unwrap().state);
    after.sort_unstable();
    assert_eq!(after, [1, 4, 9, 10, 11]);
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_armed_timer_survives_a_restart_and_fires_once() {
    init_tracing();
    let s = Scenario::single(1).await;
    let system = s.system("n1").await;
    s.sender.send("r", &remind("a", 5, 1_500)).await.unwrap();
    wait_until(WITHIN, "the timer armed", || async {
        s.sender
            .get("r", Duration::from_secs(1))
            .await
            .is_ok_and(|snapshot| snapshot.last_command_seq > 0)
    })
    .await
    .unwrap();
    system.shutdown().await.unwrap();

    let system = s.system("n2").await;
    // No command is sent: n1 let the partition go with a timer armed, so it woke it (a
    // partition is owned only while it has a command to deliver), and n2 takes it on start.
    s.wait_holds("r", &[5]).await;
    system.shutdown().await.unwrap();
    let system = s.system("n3").await;
    s.sender.send("r", &LedgerCmd::Push { n: 6 }).await.unwrap();
    s.wait_holds("r", &[5, 6]).await;
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_armed_before_its_owner_crashed_fires_once_at_the_next_owner() {
    init_tracing();
    let s = Scenario::single(1).await;
    let mut doomed = s.node("doomed").await;
    s.sender.send("f", &remind("a", 7, 2_000)).await.unwrap();
    s.wait_owns_all(&doomed).await;
    wait_until(WITHIN, "the timer armed", || async {
        s.sender
            .get("f", Duration::from_secs(1))
            .await
            .is_ok_and(|snapshot| snapshot.last_command_seq > 0)
    })
    .await
    .unwrap();
    doomed.kill().await;
    let heir = s.node("heir").await;
    // No command is sent: the heir's crash watch finds the owner dead, unpins its partition
    // and wakes it (a partition is owned only while it has a command to deliver).
    s.wait_owns_all(&heir).await;
    s.wait_holds("f", &[7]).await;
    // And not again: a later command sees one 7.
    s.sender.send("f", &LedgerCmd::Push { n: 8 }).await.unwrap();
    s.wait_holds("f", &[7, 8]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_decided_by_a_stale_owner_never_fires_and_each_timer_fires_once() {
    init_tracing();
    let s = Scenario::single(1)
        .await
        .ack_wait(Duration::from_millis(4000));
    // `a` is slow (50 ms per decision), so it holds many delivered, undecided commands.
    let a = s.node_with("a", &[("LEDGER_DECIDE_DELAY_MS", "50")]).await;
    s.sender
        .send("warm", &LedgerCmd::Push { n: 0 })
        .await
        .unwrap();
    s.wait_owns_all(&a).await;
    let b = s.node("b").await;
    for i in 0..10 {
        let command = remind(&format!("t{i}"), 100 + i, 1_500);
        s.sender.send("s", &command).await.unwrap();
    }
    // `a` freezes with them in hand; its decisions after the thaw are fenced.
    let pins = s.pins().await;
    a.pause();
    // The server unpins `a` first, so that the next command is not delivered to it.
    s.wait_unpinned(&pins).await;
    s.sender
        .send("warm", &LedgerCmd::Push { n: 1 })
        .await
        .unwrap();
    s.wait_owns_all(&b).await;
    a.resume();
    wait_until(WITHIN, "a stepped down", || async { a.owned().is_empty() })
        .await
        .unwrap();
    // A marker due after every other timer.
    s.sender.send("s", &remind("z", 999, 3_000)).await.unwrap();
    wait_until(WITHIN, "the marker fired", || async {
        s.sender
            .get("s", Duration::from_secs(1))
            .await
            .is_ok_and(|snapshot| snapshot.state.contains(&999))
    })
    .await
    .unwrap();
    let mut state = s.sender.get("s", WITHIN).await.unwrap().state;
    state.sort_unstable();
    let want: Vec<u64> = (100..110).chain([999]).collect();
    assert_eq!(state, want, "each timer fired once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_of_an_entity_nobody_loads_fires_after_a_takeover_though_it_has_a_snapshot() {
    init_tracing();
    let s = Scenario::single(1).await;
    let system = s.system("n1").await;
    // Events before the timer (a snapshot every 3 events), the timer, then events after it: no
    // snapshot may cover the timer's set while it is armed.
    for n in 0..4 {
        s.sender.send("s", &LedgerCmd::Push { n }).await.unwrap();
    }
    s.sender.send("s", &remind("a", 5, 4_000)).await.unwrap();
    for n in 6..9 {
        s.sender.send("s", &LedgerCmd::Push { n }).await.unwrap();
    }
    s.wait_holds("s", &[0, 1, 2, 3, 6, 7, 8]).await;
    system.shutdown().await.unwrap();
    // Compaction removes what the snapshot covers, never an armed timer's records.
    let compacted = jetshard::admin::Admin::new(s.client.clone(), "ledger")
        .compact(None)
        .await
        .unwrap();
    assert!(compacted.purged > 0, "{compacted:?}");

    // The new owner loads no entity on acquisition, and "s" gets no command: its timer is
    // known from the partition's timer records, fired, and "s" loads for its command.
    let system = s.system("n2").await;
    s.sender
        .send("other", &LedgerCmd::Push { n: 0 })
        .await
        .unwrap();
    s.wait_holds("s", &[0, 1, 2, 3, 6, 7, 8, 5]).await;
    system.shutdown().await.unwrap();

    // Fired once: a third owner fires nothing again.
    let system = s.system("n3").await;
    s.sender.send("s", &LedgerCmd::Push { n: 9 }).await.unwrap();
    s.wait_holds("s", &[0, 1, 2, 3, 6, 7, 8, 5, 9]).await;
    system.shutdown().await.unwrap();
}

/// A partition is owned only while it has a command to deliver: without a wake-up, a timer of
/// a crashed owner's partition would wait for the partition's next command (or a redelivery).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_owner_s_timer_fires_at_the_standby_with_no_command_sent() {
    init_tracing();
    let s = Scenario::single(2).await.pin_ttl(Duration::from_secs(30));
    let mut owner = s.node("owner").await;
    s.sender.send("q", &remind("a", 3, 1_500)).await.unwrap();
    wait_until(WITHIN, "the timer armed", || async {
        s.sender
            .get("q", Duration::from_secs(1))
            .await
            .is_ok_and(|snapshot| snapshot.last_command_seq > 0)
    })
    .await
    .unwrap();
    let standby = s.node("standby").await;
    owner.kill().await;
    let killed = std::time::Instant::now();
    s.wait_holds("q", &[3]).await;
    assert!(
        killed.elapsed() < Duration::from_secs(15),
        "fired {:?} after the kill: the wake-up, not the pin TTL (30 s)",
        killed.elapsed()
    );
    assert!(!standby.owned().is_empty());
    // Once: a later command sees one 3.
    s.sender.send("q", &LedgerCmd::Push { n: 4 }).await.unwrap();
    s.wait_holds("q", &[3, 4]).await;
}

/// A write answered "not confirmed" that lands anyway (the server stopped while it was on its
/// way): its command comes back a duplicate at its retry, so no outcome arms the timer it set.
/// The entity's next load tells its owner, and the timer fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_set_by_a_write_not_confirmed_that_landed_fires() {
    init_tracing();
    // A long pin TTL: the generation outlives the pause, so no takeover reads the timers.
    let mut s = Scenario::single(1).await.pin_ttl(Duration::from_secs(10));
    let system = s.system_with(s.doubting_config("n1")).await;
    let op = Op::Arm {
        name: "t".into(),
        n: 3,
        after_ms: 200,
    };
    let arm = op.command().expect("a command");
    s.send_unconfirmed(&system, "u", 3, arm, op).await;
    s.wait_holds("u", &[FIRED | 3]).await;
    s.check().await;
    system.shutdown().await.expect("shut down");
}
