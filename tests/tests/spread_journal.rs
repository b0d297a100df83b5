//! A journal spread over several streams (`ShardConfig::journal_streams`): each partition's
//! records in its own stream, through a takeover, dead letters, timers and a restart; a journal
//! of one layout refused with the other, whichever came first.

use std::time::Duration;

use jetshard::admin::{Admin, DeadLetterPurge};
use jetshard::{Error, JournalReader};
use jetshard_testkit::wait_until;
use jetshard_tests::model::Op;
use jetshard_tests::{Scenario, id_in, init_tracing};

const PARTITIONS: u32 = 8;
const STREAMS: u32 = 3;

/// The names of the spread journal's streams.
fn spread_streams() -> Vec<String> {
    (0..STREAMS)
        .map(|k| format!("LEDGER_JOURNAL_{k}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spread_journal_keeps_each_partition_in_its_stream_through_a_takeover() {
    init_tracing();
    let mut s = Scenario::single(PARTITIONS).await.journal_streams(STREAMS);
    let a = s.system("a").await;
    // Every partition: entities with history, a timer, and a payload that is no command (a
    // dead letter).
    let entities: Vec<String> = (0..PARTITIONS)
        .flat_map(|p| (0..3).map(move |k| id_in(&format!("e{k}-"), p, PARTITIONS)))
        .collect();
    for n in 0..4 {
        s.append_to_all(&entities, n).await;
    }
    for p in 0..PARTITIONS {
        let entity = id_in("timed-", p, PARTITIONS);
        let arm = Op::Arm {
            name: "t".into(),
            n: 1,
            // Armed through the test: the takeover finds it in the partition's stream.
            after_ms: 600_000,
        };
        s.send(&entity, arm).await;
        s.send_raw(
            &id_in("bad-", p, PARTITIONS),
            b"no command".to_vec(),
            Op::Garbage,
        )
        .await;
    }
    jetshard_tests::drained(&s.client, "ledger").await;

    // Each stream exists and holds exactly its partitions' records; the one-stream name does
    // not exist.
    assert!(s.js.get_stream("LEDGER_JOURNAL").await.is_err());
    let mut held = 0;
    for (k, name) in spread_streams().iter().enumerate() {
        let stream =
            s.js.get_stream_no_info(name)
                .await
                .expect("a journal stream");
        let records = JournalReader::new(stream, "ledger")
            .all()
            .await
            .expect("read");
        assert!(!records.is_empty(), "{name} holds nothing");
        for record in &records {
            let partition = record.partition.expect("a partition");
            assert_eq!(
                partition % STREAMS,
                k as u32,
                "{} in {name}",
                record.subject
            );
        }
        held += records.len();
    }
    let all = JournalReader::open(&s.js, "ledger")
        .await
        .expect("open")
        .all()
        .await
        .expect("read");
    assert_eq!(
        all.len(),
        held,
        "the reader of the whole journal reads every stream"
    );

    // The dead letters, listed over the streams and purged per partition.
    let admin = Admin::new(s.client.clone(), "ledger");
    let letters = admin.dead_letters().await.expect("dead letters");
    assert_eq!(letters.len(), PARTITIONS as usize, "{letters:?}");
    let mut partitions: Vec<u32> = letters.iter().map(|l| l.partition).collect();
    partitions.sort_unstable();
    assert_eq!(partitions, (0..PARTITIONS).collect::<Vec<_>>());
    let overview = admin.overview().await.expect("overview");
    assert!(overview.iter().all(|p| p.generation == 1), "{overview:?}");

    // A takeover: b starts, a stops; b serves every partition from the spread journal.
    let b = s.system("b").await;
    a.shutdown().await.expect("stop a");
    for n in 4..6 {
        s.append_to_all(&entities, n).await;
    }
    s.check().await;

    // And again after a restart: every partition acquired and serving.
    let b = s.restart_serves(b, "b").await;
    s.check().await;
    b.shutdown().await.expect("stop b");

    // The admin command replays a dead letter named by its sequence, asking for its partition
    // where the sequence names dead letters in several streams.
    let url = s.server().url();
    let letter = &letters[0];
    let seq = letter.seq.to_string();
    let twins = letters.iter().filter(|l| l.seq == letter.seq).count();
    let replay = ["dead-letters", "replay", "ledger", seq.as_str()];
    if twins > 1 {
        let error = jetshard_tests::cli::jetshard_error(&url, &replay).await;
        assert!(error.contains("--partition"), "{error}");
    } else {
        let replayed = jetshard_tests::cli::jetshard_json(
            &[&["--nats-url", url.as_str()][..], &replay].concat(),
        )
        .await;
        assert_eq!(replayed["partition"], letter.partition, "{replayed}");
    }
    let partition = letter.partition.to_string();
    let named = [&replay[..], &["--partition", partition.as_str()]].concat();
    let replayed =
        jetshard_tests::cli::jetshard_json(&[&["--nats-url", url.as_str()][..], &named].concat())
            .await;
    assert_eq!(replayed["dead_letter_seq"], letter.seq, "{replayed}");
    assert_eq!(replayed["partition"], letter.partition, "{replayed}");
    // Purged last: the history's check counts on the dead letters.
    let purged = admin
        .purge_dead_letters(DeadLetterPurge::all())
        .await
        .expect("purge");
    // Every dead letter goes (the replayed commands wait in the stream: no system runs).
    assert_eq!(purged.purged, u64::from(PARTITIONS), "{purged:?}");
    assert!(admin.dead_letters().await.expect("dead letters").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_is_opened_only_with_the_layout_it_was_written_with() {
    init_tracing();
    let mut s = Scenario::single(4).await.journal_streams(1);
    let system = s.system("a").await;
    s.send(&id_in("x-", 0, 4), Op::Append(0)).await;
    jetshard_tests::drained(&s.client, "ledger").await;
    system.shutdown().await.expect("stop");

    // A one-stream journal is not opened spread, nor is a spread one made beside it.
    match &refused_with(&s, 2).await {
        Error::StoredSettingMismatch {
            setting: "journal_streams",
            stored,
            configured,
            ..
        } => assert_eq!((stored.as_str(), configured.as_str()), ("1", "2")),
        other => panic!("not the layout's refusal: {other}"),
    }
    assert!(s.js.get_stream("LEDGER_JOURNAL_0").await.is_err());

    // A command stream written before the layout was recorded (no record): one stream, so
    // still refused spread, and opened as one stream, which records it.
    let mut config = jetshard_tests::stream_info(&s.js, "LEDGER_CMD")
        .await
        .config;
    config.metadata.remove("jetshard.journal_streams");
    s.js.update_stream(config).await.expect("drop the record");
    let refused = refused_with(&s, 2).await;
    assert!(
        matches!(&refused, Error::StoredSettingMismatch { stored, .. } if stored == "1"),
        "{refused}"
    );
    let system = s.system("a").await;
    let recorded = jetshard_tests::stream_info(&s.js, "LEDGER_CMD")
        .await
        .config;
    assert_eq!(
        recorded
            .metadata
            .get("jetshard.journal_streams")
            .map(String::as_str),
        Some("1")
    );
    let system = s.restart_serves(system, "a").await;
    s.check().await;
    system.shutdown().await.expect("stop");

    // The other way round: a spread journal is not opened as one stream.
    let other = Scenario::single(4).await.journal_streams(2);
    let system = other.system("a").await;
    system.shutdown().await.expect("stop");
    let refused = refused_with(&other, 1).await;
    assert!(
        matches!(
            &refused,
            Error::StoredSettingMismatch {
                setting: "journal_streams",
                ..
            }
        ),
        "{refused}"
    );
    assert!(other.js.get_stream("LEDGER_JOURNAL").await.is_err());

    // With no record to go by (the command stream deleted), the server's own refusal of a
    // second stream on the same subjects stops it, in words.
    for stream in ["LEDGER_CMD_0", "LEDGER_CMD_1"] {
        other.js.delete_stream(stream).await.expect("delete");
    }
    let refused = refused_with(&other, 1).await;
    assert!(
        matches!(&refused, Error::Incompatible { detail, .. } if detail.contains("holds its subjects")),
        "{refused}"
    );
    assert!(other.js.get_stream("LEDGER_JOURNAL").await.is_err());
    assert!(other.js.get_stream("LEDGER_CMD").await.is_err());
}

/// Why a ledger system of `s` with its journal in `streams` streams is refused at start.
async fn refused_with(s: &Scenario, streams: u32) -> Error {
    let config = s
        .config("a")
        .journal_streams(streams)
        .build()
        .expect("config");
    jetshard::ShardSystem::start::<jetshard_tests::ledger::Ledger>(s.client.clone(), config)
        .await
        .err()
        .expect("refused")
}

/// Which server leads each of `streams`' journal streams now (`None` while one has no leader).
async fn journal_leaders(s: &Scenario, streams: u32) -> Option<Vec<String>> {
    leaders_of(s, "LEDGER_JOURNAL", streams).await
}

/// Which server leads each of the streams `<prefix>_0` ... (`None` while one has no leader).
async fn leaders_of(s: &Scenario, prefix: &str, streams: u32) -> Option<Vec<String>> {
    let mut leaders = Vec::new();
    for k in 0..streams {
        let mut stream = s.js.get_stream(format!("{prefix}_{k}")).await.ok()?;
        let info = stream.info().await.ok()?;
        leaders.push(info.cluster.clone()?.leader?);
    }
    Some(leaders)
}

/// Whether each of the cluster's servers leads exactly one of its five journal streams and one
/// of its five command streams.
async fn one_leader_each(s: &Scenario) -> bool {
    for prefix in ["LEDGER_JOURNAL", "LEDGER_CMD"] {
        let Some(mut leaders) = leaders_of(s, prefix, 5).await else {
            return false;
        };
        leaders.sort();
        leaders.dedup();
        if leaders.len() != 5 {
            return false;
        }
    }
    true
}

/// Each set of leaders, for a failure message.
async fn all_leaders(s: &Scenario) -> [Option<Vec<String>>; 2] {
    [
        leaders_of(s, "LEDGER_JOURNAL", 5).await,
        leaders_of(s, "LEDGER_CMD", 5).await,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_five_servers_each_leads_a_command_and_a_journal_stream_again_after_a_restart_under_load()
 {
    init_tracing();
    const P: u32 = 10;
    let mut s = Scenario::cluster_of(5, P).await.journal_streams(5);
    let a = s.system("a").await;
    let b = s.system("b").await;
    let entities: Vec<String> = (0..P).map(|p| id_in("five-", p, P)).collect();
    s.append_to_all(&entities, 0).await;
    // Each stream on three of the five servers, every server holding replicas; the owner of
    // partition 0 moves leaders until each server leads one.
    for k in 0..5 {
        for prefix in ["LEDGER_JOURNAL", "LEDGER_CMD"] {
            let info = jetshard_tests::stream_info(&s.js, &format!("{prefix}_{k}")).await;
            assert_eq!(info.config.num_replicas, 3);
        }
    }
    let spread = wait_until(
        Duration::from_secs(90),
        "every server leading a journal stream and a command stream",
        || one_leader_each(&s),
    )
    .await;
    if let Err(e) = spread {
        panic!("{e}: {:?}", all_leaders(&s).await);
    }

    // The leader of stream 0's server killed under load and started again: nothing lost,
    // and its leadership comes back to it.
    let leaders = journal_leaders(&s, 5).await.expect("leaders");
    let victim = &leaders[0];
    s.cluster_servers()
        .node_by_name(victim)
        .expect("a server")
        .kill()
        .expect("kill");
    // Keyed: a command stream the victim led is without a leader until the election.
    for n in 1..4 {
        s.append_to_all_keyed(&entities, n).await;
    }
    // Down until another server leads its stream (and the commands were served meanwhile).
    wait_until(
        Duration::from_secs(30),
        "a new leader of stream 0",
        || async {
            journal_leaders(&s, 1)
                .await
                .is_some_and(|leaders| leaders[0] != *victim)
        },
    )
    .await
    .unwrap();
    jetshard_tests::drained(&s.client, "ledger").await;
    s.cluster_servers()
        .node_by_name(victim)
        .expect("a server")
        .restart()
        .await
        .expect("restart");
    // Keyed: the leaders are moved back meanwhile, each move an election.
    for n in 4..6 {
        s.append_to_all_keyed(&entities, n).await;
    }
    let spread = wait_until(
        Duration::from_secs(120),
        "every server leading a journal stream and a command stream after the restart",
        || one_leader_each(&s),
    )
    .await;
    if let Err(e) = spread {
        panic!("{e}: {:?}", all_leaders(&s).await);
    }
    s.check().await;
    a.shutdown().await.expect("stop a");
    b.shutdown().await.expect("stop b");
}

/// A journal stream's leader moved under load (a step-down in favour of a replica, as the spread
/// of a journal's leaders makes) may answer none of the writes it had in flight; the writers
/// learn of the new leader from the server's advisory and send them again at once, so the
/// commands wait for the election, not for the writers' timeout (30 s here), and nothing is
/// lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_leader_moved_under_load_holds_commands_for_the_election_only() {
    init_tracing();
    const P: u32 = 6;
    let mut s = Scenario::cluster(P).await.journal_streams(3);
    let config = s.config("a").write_timeout(Duration::from_secs(30));
    let system = s.system_with(config).await;
    let entities: Vec<String> = (0..12)
        .map(|k| id_in(&format!("sd{k}-"), k % P, P))
        .collect();
    s.append_to_all(&entities, 0).await;
    jetshard_tests::drained(&s.client, "ledger").await;

    // The fault: five times, 1 s apart under a steady load, the journal stream led by the
    // server this process is connected to (its writes go to that leader directly) steps down
    // in favour of one of its replicas (as the spread of a journal's leaders moves one).
    let connected = s.client.server_info().server_name;
    let mut journal = jetshard_tests::ledger_journal_of(&s.js, 0).await;
    for name in jetshard_tests::ledger_journals(&s.js).await {
        let info = jetshard_tests::stream_info(&s.js, &name).await;
        if info.cluster.and_then(|c| c.leader).as_deref() == Some(connected.as_str()) {
            journal = name;
        }
    }
    let js = s.js.clone();
    let step_down = tokio::spawn(async move {
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let replica = jetshard_tests::stream_info(&js, &journal)
                .await
                .cluster
                .clone()
                .expect("a clustered stream")
                .replicas[0]
                .name
                .clone();
            let request = serde_json::json!({ "placement": { "preferred": replica } });
            let answer: serde_json::Value = js
                .request(format!("STREAM.LEADER.STEPDOWN.{journal}"), &request)
                .await
                .expect("step down");
            assert_eq!(answer["success"], true, "{answer}");
        }
        std::time::Instant::now()
    });
    let mut n = 1;
    while !step_down.is_finished() || n < 40 {
        s.append_to_all(&entities, n).await;
        n += 1;
    }
    let stepped_down = step_down.await.expect("the step-down");
    jetshard_tests::wait_drained(&s.js, Duration::from_secs(60))
        .await
        .expect("drained");
    let after = stepped_down.elapsed();
    assert!(
        after < Duration::from_secs(12),
        "the commands took {after:?} after the last step-down (write timeout 30 s)"
    );
    s.check().await;
    system.shutdown().await.expect("stop");
}

/// A spread layout's publishers name the partition themselves. A command published to a
/// partition its id does not hash to would otherwise be applied by that partition's owner,
/// beside the entity's own owner, and neither's fence would hold the other off: it is
/// dead-lettered, with the partition it belongs to in the reason, and nothing is applied. The
/// entity's own commands are served; after a restart every partition is acquired and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_published_to_a_partition_its_id_does_not_hash_to_is_dead_lettered() {
    use jetshard_tests::ledger::LedgerCmd;
    init_tracing();
    let mut s = Scenario::single(4).await.journal_streams(2);
    let system = s.system("a").await;
    let entity = id_in("stray-", 1, 4);
    let payload = serde_json::to_vec(&LedgerCmd::Push { n: 7 }).expect("encode");
    // Partition 2's subject: stored by stream 0, delivered to partition 2's owner.
    // Not in the history: its stream numbers it apart from the entity's own commands, and the
    // history knows an entity's commands by sequence (checked here instead).
    s.js.publish(format!("ledger.cmd.2.{entity}"), payload.into())
        .await
        .expect("publish")
        .await
        .expect("stored");
    let admin = Admin::new(s.client.clone(), "ledger");
    let letter = wait_until(
        Duration::from_secs(20),
        "the stray command dead-lettered",
        || async {
            admin
                .dead_letters()
                .await
                .is_ok_and(|letters| !letters.is_empty())
        },
    )
    .await;
    letter.unwrap();
    let letters = admin.dead_letters().await.expect("dead letters");
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(
        (letters[0].partition, letters[0].entity.as_str()),
        (2, entity.as_str())
    );
    assert!(
        letters[0].reason.contains("hashes to partition 1, not 2"),
        "{}",
        letters[0].reason
    );
    // The entity's own partition serves it, from nothing: the stray command was not applied
    // (an `Append` is accepted only at the list's length).
    s.send(&entity, Op::Append(0)).await;
    jetshard_tests::drained(&s.client, "ledger").await;
    let state = s
        .sender
        .get(&entity, Duration::from_secs(5))
        .await
        .expect("its state");
    assert_eq!(state.state, vec![0]);
    let system = s.restart_serves(system, "a").await;
    s.send(&entity, Op::Append(1)).await;
    jetshard_tests::drained(&s.client, "ledger").await;
    let state = s.sender.get(&entity, Duration::from_secs(5)).await;
    assert_eq!(state.expect("its state").state, vec![0, 1]);
    assert_eq!(admin.dead_letters().await.expect("dead letters").len(), 1);
    system.shutdown().await.expect("stop");
}
