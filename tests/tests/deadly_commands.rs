//! Commands that kill their process (abort, stack overflow, OOM), and outcomes across a crash.
//! Nodes are `ledger-node` child processes, killed for real: a command in hand at two claims in
//! a row is run alone (isolation), and only the command that was running at the deaths is
//! given up (docs/ARCHITECTURE.md, "Poison").

use std::time::Duration;

use jetshard::admin::Admin;
use jetshard::{CommandOutcome, CommandSender};
use jetshard_testkit::history::{Record, read_journal};
use jetshard_testkit::wait_until;
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::node::{Node, NodeOptions, NodeSpec};
use jetshard_tests::{assert_applied, init_tracing, ledger_config};

/// A node of one partition with short timings, and `env` in its environment.
fn spec(env: Vec<(String, String)>) -> NodeSpec {
    NodeSpec {
        partitions: 1,
        pin_ttl: Duration::from_secs(1),
        ack_wait: Duration::from_secs(2),
        env,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_kills_every_process_that_runs_it_is_dead_lettered_after_max_deliver_runs() {
    init_tracing();
    let (server, client, js) = jetshard_tests::served().await;
    let config = ledger_config(1, "test").max_deliver(2).build().unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    let options = NodeOptions {
        args: vec!["--max-deliver".into(), "2".into()],
        log_file: None,
    };
    let url = server.url();
    let mut started = 0;
    let mut start = async || {
        started += 1;
        Node::start_with(&url, &format!("n{started}"), &spec(vec![]), &options).await
    };
    let mut nodes = vec![start().await, start().await];

    let mut pushes = Vec::new();
    for n in 0..5 {
        pushes.push(sender.send("x", &LedgerCmd::Push { n }).await.unwrap());
    }
    let killer = sender.send("k", &LedgerCmd::Abort).await.unwrap();
    for n in 5..10 {
        pushes.push(sender.send("x", &LedgerCmd::Push { n }).await.unwrap());
    }

    // Whoever runs it dies; a node that died is started again, as a supervisor would.
    let admin = Admin::new(client.clone(), "ledger");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut crashes = 0;
    loop {
        let letters = admin.dead_letters().await.unwrap();
        if let Some(letter) = letters.iter().find(|l| l.command_seq == killer) {
            assert!(
                letter.reason.contains("given up before decoding"),
                "{letter:?}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the killer was not given up; {crashes} crashes"
        );
        for node in &mut nodes {
            if !node.is_running() {
                crashes += 1;
                *node = start().await;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // It ran at most max_deliver times side by side with others, then twice more alone (in
    // isolation, which tells it from the commands around it; one isolated death could be a
    // kill from outside), and never again.
    assert!((1..=4).contains(&crashes), "{crashes} crashes");

    // Everything else was applied exactly once.
    let last = sender
        .request_outcome("x", &LedgerCmd::Push { n: 10 }, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(matches!(last, CommandOutcome::Applied { .. }), "{last:?}");
    let journal = read_journal(&js, "ledger").await.unwrap();
    for seq in &pushes {
        let events = journal
            .iter()
            .filter(|r| matches!(r, Record::Event { command_seq, .. } if command_seq == seq))
            .count();
        assert_eq!(events, 1, "command {seq}");
    }

    // A whole restart: the partition is acquired and serves.
    for node in &mut nodes {
        node.kill().await;
    }
    let _node = start().await;
    let outcome = sender
        .request_outcome("x", &LedgerCmd::Push { n: 11 }, Duration::from_secs(20))
        .await
        .unwrap();
    assert_applied(&outcome);
}

/// Whether the node's log says it runs the commands in hand one at a time (isolation).
fn isolating(log: &std::path::Path) -> bool {
    std::fs::read_to_string(log).is_ok_and(|text| text.contains("running them one at a time"))
}

/// A crash loop: a killer command, and before it in the stream an innocent one that takes a
/// while, so that it is in hand (past max_deliver) at each death before isolation. The
/// isolated owner runs the innocent one first, alone, and is killed from outside (SIGKILL)
/// meanwhile: one death of an isolated owner is not proof, so the innocent command is run
/// again and applied once; only the killer is given up, after two isolated owners in a row
/// died running it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_innocent_command_whose_isolated_owner_is_killed_from_outside_is_not_given_up() {
    init_tracing();
    let (server, client, js) = jetshard_tests::served().await;
    let config = ledger_config(1, "test").max_deliver(2).build().unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    let logs = tempfile::tempdir().expect("a log directory");
    let log_of = |id: &str| logs.path().join(format!("{id}.log"));
    let url = server.url();
    let mut started = 0;
    // Not waiting for it to be ready: the loop below must look at the nodes every 50 ms
    // while the isolated owner runs the innocent command, and a start waited for can take
    // longer than that on a loaded machine (it did in CI: the isolated owner was never seen).
    let mut spawn = || {
        started += 1;
        let id = format!("n{started}");
        let options = NodeOptions {
            args: vec!["--max-deliver".into(), "2".into()],
            log_file: Some(log_of(&id)),
        };
        Node::spawn(&url, &id, &spec(vec![]), &options)
    };
    let mut nodes = vec![spawn(), spawn()];
    for node in &nodes {
        jetshard_testkit::wait_until(Duration::from_secs(20), "node ready", || async {
            node.printed("READY")
        })
        .await
        .expect("node did not start");
    }

    let innocent = sender
        .send("i", &LedgerCmd::Slow { n: 0, ms: 3000 })
        .await
        .unwrap();
    let killer = sender.send("k", &LedgerCmd::Abort).await.unwrap();

    let admin = Admin::new(client.clone(), "ledger");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut crashes = 0;
    let mut killed_from_outside = None;
    let letter = loop {
        let letters = admin.dead_letters().await.unwrap();
        assert!(
            !letters.iter().any(|l| l.command_seq == innocent),
            "the innocent command was given up: {letters:?}"
        );
        if let Some(letter) = letters.into_iter().find(|l| l.command_seq == killer) {
            break letter;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the killer was not given up; {crashes} crashes"
        );
        if killed_from_outside.is_none()
            && let Some(node) = nodes
                .iter_mut()
                .find(|n| isolating(&log_of(&n.id)) && n.printed("DECIDING"))
        {
            // The isolated owner runs the innocent command alone: killed from outside.
            node.kill().await;
            killed_from_outside = Some(node.id.clone());
        }
        for node in &mut nodes {
            if !node.is_running() {
                crashes += 1;
                *node = spawn();
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let killed = killed_from_outside.unwrap_or_else(|| {
        panic!("no isolated owner was seen running the innocent command to be killed from outside; {crashes} deaths; {letter:?}")
    });
    eprintln!("{killed} killed from outside; {crashes} deaths in all; {letter:?}");
    assert!(
        letter.reason.contains("given up before decoding")
            && letter.reason.contains("2 owner(s) in a row died"),
        "{letter:?}"
    );
    // The innocent command was applied, once.
    wait_until(
        Duration::from_secs(30),
        "the innocent command applied",
        || async {
            read_journal(&js, "ledger").await.is_ok_and(|journal| {
                journal.iter().any(
                    |r| matches!(r, Record::Event { command_seq, .. } if *command_seq == innocent),
                )
            })
        },
    )
    .await
    .unwrap();
    let journal = read_journal(&js, "ledger").await.unwrap();
    let events = journal
        .iter()
        .filter(|r| matches!(r, Record::Event { command_seq, .. } if *command_seq == innocent))
        .count();
    assert_eq!(events, 1, "the innocent command's events");
    // The partition serves.
    let outcome = sender
        .request_outcome("i", &LedgerCmd::Push { n: 1 }, Duration::from_secs(30))
        .await
        .unwrap();
    assert_applied(&outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_command_outlived_a_crash_after_its_write_is_told_it_was_applied() {
    init_tracing();
    let (server, client, _) = jetshard_tests::served().await;
    let config = ledger_config(1, "test").build().unwrap();
    let sender = CommandSender::<Ledger>::new(client.clone(), &config);
    let url = server.url();
    // `a` dies between the durable write of `Appended { n: 5 }` and the acknowledgement.
    let abort = vec![("LEDGER_ABORT_ON_APPLY".to_owned(), "5".to_owned())];
    let a = Node::start(&url, "a", &spec(abort)).await;
    sender.send("w", &LedgerCmd::Push { n: 0 }).await.unwrap();
    wait_until(Duration::from_secs(20), "a owns the partition", || async {
        a.owned() == vec![0]
    })
    .await
    .unwrap();
    let _b = Node::start(&url, "b", &spec(vec![])).await;

    // The client asks for the outcome; `b` recovers the command, finds it applied, and
    // answers what happened the first time (the reply subject travels with the command).
    let outcome = sender
        .request_outcome("x", &LedgerCmd::Push { n: 5 }, Duration::from_secs(20))
        .await
        .unwrap();
    assert!(
        matches!(outcome, CommandOutcome::Applied { events: 1, .. }),
        "{outcome:?}"
    );
}
