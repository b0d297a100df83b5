//! The group commit against a real server: batches, pipelining, the server's refusals.

use async_nats::HeaderMap;
use async_nats::jetstream::stream;
use bytes::Bytes;
use jetshard_testkit::NatsServer;
use metrics::{Counter, Histogram};

use super::*;
use crate::test_alloc::{SMALL_ALLOCATION, future_size};
use crate::wire::{HDR_EXPECTED_SUBJECT, HDR_EXPECTED_SUBJECT_SEQ, HDR_MSG_ID};

const FENCE: &str = "t.fence.0";

/// A journal stream as jetshard's (atomic batches allowed) and a fence record; its sequence.
async fn journal(js: &Context) -> u64 {
    js.create_stream(stream::Config {
        name: "T".to_owned(),
        subjects: vec!["t.>".to_owned()],
        allow_atomic_publish: true,
        ..Default::default()
    })
    .await
    .expect("create the stream");
    jetshard_testkit::wait_stream_writable(js, FENCE, Duration::from_secs(30))
        .await
        .expect("the stream takes writes");
    fence(js).await
}

async fn fence(js: &Context) -> u64 {
    js.publish(FENCE, "fence".into())
        .await
        .expect("publish a fence record")
        .await
        .expect("store it")
        .sequence
}

fn record(entity: &str, msg_id: &str, fence: u64) -> Outgoing {
    let mut headers = HeaderMap::new();
    headers.insert(HDR_MSG_ID, msg_id);
    headers.insert(HDR_EXPECTED_SUBJECT_SEQ, fence.to_string());
    headers.insert(HDR_EXPECTED_SUBJECT, FENCE);
    Outgoing {
        subject: format!("t.evt.0.{entity}").into(),
        headers,
        payload: Bytes::from_static(b"event"),
    }
}

fn start(js: &Context, stats: &Arc<CommitStats>) -> GroupCommit {
    start_in(js, stats, Mode::Batched)
}

fn start_in(js: &Context, stats: &Arc<CommitStats>, mode: Mode) -> GroupCommit {
    let metrics = CommitMetrics {
        records: Histogram::noop(),
        conflicts: Counter::noop(),
    };
    let settings = Settings {
        mode,
        stats: stats.clone(),
        metrics,
        write_timeout: Duration::from_secs(5),
        leader_elections: None,
    };
    GroupCommit::start(js.clone(), 0, 1, settings)
}

/// Writes one record for each of `commands` at once, each expecting `fence`: every one must be
/// refused as fenced (generation 1), alone or in a batch.
async fn assert_all_fenced(commit: &GroupCommit, commands: std::ops::Range<u32>, fence: u64) {
    let late =
        commands.map(|i| commit.write(vec![record(&format!("e{i}"), &format!("t:{i}:0"), fence)]));
    for answer in futures::future::join_all(late).await {
        assert!(
            matches!(answer, Err(WriteError::Fenced { generation: 1 })),
            "{answer:?}"
        );
    }
}

async fn stored(js: &Context) -> u64 {
    js.get_stream("T")
        .await
        .expect("the stream")
        .info()
        .await
        .expect("its info")
        .state
        .messages
}

// A current-thread runtime: the writes joined below all reach the committer's queue before
// it runs, so they are gathered into one batch.
#[tokio::test(flavor = "current_thread")]
async fn a_batch_holding_a_command_stored_before_stores_the_others_and_answers_each() {
    let server = NatsServer::start().await.expect("start nats-server");
    let js = async_nats::jetstream::new(server.connect().await.expect("connect"));
    let fence = journal(&js).await;
    let stats = Arc::default();
    let commit = start(&js, &stats);
    // "a", then "a" again (its answer lost, say) with "b" and "c" in one batch: the server
    // refuses that batch whole (10201), and each command goes on its own.
    let a = commit.write(vec![record("a", "t:10:0", fence)]).await;
    assert_eq!(a.expect("a stored"), fence + 1);
    let a2 = vec![record("a", "t:10:0", fence)];
    let b = vec![record("b", "t:11:0", fence)];
    let c = vec![record("c", "t:12:0", fence), record("c", "t:12:1", fence)];
    let (a2, b, c) = tokio::join!(commit.write(a2), commit.write(b), commit.write(c));
    assert!(a2.is_ok(), "{a2:?}");
    assert!(b.is_ok(), "{b:?}");
    assert!(c.is_ok(), "{c:?}");
    // The fence record, "a" once, "b", and both events of "c".
    assert_eq!(stored(&js).await, 5);
    // "a"; then the refused batch, and "a", "b" and "c" each committed on its own.
    assert_eq!(stats.batches.load(Ordering::Relaxed), 4);
    assert_eq!(stats.conflicts.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn ready_writes_are_one_batch_and_a_moved_fence_refuses_every_one() {
    let server = NatsServer::start().await.expect("start nats-server");
    let js = async_nats::jetstream::new(server.connect().await.expect("connect"));
    let fence_seq = journal(&js).await;
    let stats: Arc<CommitStats> = Arc::default();
    let commit = start(&js, &stats);
    let writes = (0..10).map(|i| {
        commit.write(vec![record(
            &format!("e{i}"),
            &format!("t:{i}:0"),
            fence_seq,
        )])
    });
    let answers = futures::future::join_all(writes).await;
    let seqs: Vec<u64> = answers.into_iter().map(|a| a.expect("stored")).collect();
    // One batch, stored in one piece and in order: each command is told its own record.
    assert_eq!(seqs, (fence_seq + 1..=fence_seq + 10).collect::<Vec<_>>());
    assert_eq!(stats.batches.load(Ordering::Relaxed), 1);
    assert_eq!(stats.records.load(Ordering::Relaxed), 10);

    // Another owner claims the partition: every write of this generation is refused, in a
    // batch or alone, and nothing is stored.
    fence(&js).await;
    assert_all_fenced(&commit, 10..13, fence_seq).await;
    let alone = commit.write(vec![record("e13", "t:13:0", fence_seq)]).await;
    assert!(matches!(alone, Err(WriteError::Fenced { .. })), "{alone:?}");
    assert_eq!(stored(&js).await, 12);
}

// Pipelined: a single record is published by the writing task itself, with no hop to the
// writer task. It answers as the task would: its journal sequence (a message id stored before
// is not stored again), `Fenced` once the fence moved; a unit of two records still goes
// through the task.
#[tokio::test(flavor = "current_thread")]
async fn pipelined_single_records_are_published_by_their_writer_and_still_fenced() {
    let server = NatsServer::start().await.expect("start nats-server");
    let js = async_nats::jetstream::new(server.connect().await.expect("connect"));
    let fence_seq = journal(&js).await;
    let stats: Arc<CommitStats> = Arc::default();
    let commit = start_in(&js, &stats, Mode::Pipelined);
    let a = commit.write(vec![record("a", "t:1:0", fence_seq)]).await;
    assert_eq!(a.expect("a stored"), fence_seq + 1);
    let again = commit.write(vec![record("a", "t:1:0", fence_seq)]).await;
    assert_eq!(again.expect("a known"), fence_seq + 1);
    let pair = vec![
        record("b", "t:2:0", fence_seq),
        record("b", "t:2:1", fence_seq),
    ];
    assert_eq!(commit.write(pair).await.expect("b stored"), fence_seq + 3);
    assert_eq!(stored(&js).await, 4);
    // Counted as the server answered them: "a" twice (the second a duplicate), "b"'s two.
    assert_eq!(stats.records.load(Ordering::Relaxed), 4);

    // A subject no stream stores: "no responders", at once, and never taken for stored.
    let mut nowhere = record("d", "t:4:0", fence_seq);
    nowhere.subject = "elsewhere.d".into();
    let lost = commit.write(vec![nowhere]).await;
    assert!(matches!(lost, Err(WriteError::Unconfirmed(_))), "{lost:?}");

    fence(&js).await;
    let late = commit.write(vec![record("c", "t:3:0", fence_seq)]).await;
    assert!(
        matches!(late, Err(WriteError::Fenced { generation: 1 })),
        "{late:?}"
    );
    assert_eq!(stored(&js).await, 5);
}

/// A single record's publish on a single server is boxed apart from its command's future
/// (`GroupCommit::write`): it must stay a small allocation too (see the entity actor's
/// `a_command_future_is_a_small_allocation`).
#[test]
#[allow(unreachable_code, clippy::diverging_sub_expression)]
fn a_single_records_publish_is_a_small_allocation() {
    let size = future_size(|| Committer::write_single(unreachable!(), unreachable!()));
    eprintln!("single publish future: {size} bytes");
    assert!(
        size <= SMALL_ALLOCATION,
        "a single record's publish future is {size} bytes"
    );
}

/// On R3 (`Mode::Batched`), a batch of several commands carries the fence's compare-and-set on
/// its last message only (the commit, which the server checks with the whole batch, stored all
/// or none): its staged messages are stored without it, and once the fence moved the whole
/// batch is refused and nothing of it is stored. Were the commit not fenced, the late batch
/// below would be stored.
#[tokio::test(flavor = "current_thread")]
async fn on_r3_a_batch_is_fenced_at_its_commit_and_refused_whole_once_the_fence_moved() {
    let cluster = jetshard_testkit::NatsCluster::start(3)
        .await
        .expect("start the cluster");
    let js = async_nats::jetstream::new(cluster.connect().await.expect("connect"));
    js.create_stream(stream::Config {
        name: "T".to_owned(),
        subjects: vec!["t.>".to_owned()],
        allow_atomic_publish: true,
        num_replicas: 3,
        ..Default::default()
    })
    .await
    .expect("create the stream");
    jetshard_testkit::wait_stream_writable(&js, FENCE, Duration::from_secs(30))
        .await
        .expect("the stream takes writes");
    let fence_seq = fence(&js).await;
    let stats: Arc<CommitStats> = Arc::default();
    let commit = start(&js, &stats);
    let writes = (0..5).map(|i| {
        commit.write(vec![record(
            &format!("e{i}"),
            &format!("t:{i}:0"),
            fence_seq,
        )])
    });
    let seqs: Vec<u64> = futures::future::join_all(writes)
        .await
        .into_iter()
        .map(|a| a.expect("stored"))
        .collect();
    assert_eq!(seqs, (fence_seq + 1..=fence_seq + 5).collect::<Vec<_>>());
    assert_eq!(stats.batches.load(Ordering::Relaxed), 1);
    let stream = js.get_stream("T").await.expect("the stream");
    for seq in seqs {
        let message = stream.get_raw_message(seq).await.expect("read it back");
        let fenced = message.headers.get(HDR_EXPECTED_SUBJECT_SEQ).is_some();
        // The batch's last message, and it alone, names the fence.
        assert_eq!(fenced, seq == fence_seq + 5, "record at {seq}");
        assert!(message.headers.get(HDR_MSG_ID).is_some(), "record at {seq}");
    }

    // Another owner claims the partition: a batch of this generation is refused whole.
    fence(&js).await;
    assert_all_fenced(&commit, 5..9, fence_seq).await;
    // The first fence record, the five events, the second fence record.
    assert_eq!(stored(&js).await, 7);
}
