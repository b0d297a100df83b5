//! The window read's rules, and the read against one server and a routed cluster.

use std::collections::BTreeSet;

use async_nats::jetstream::{self, AckKind, Context, consumer, stream};
use futures::StreamExt;
use jetshard_testkit::{NatsCluster, NatsServer};

use super::*;

/// The filter of partition 0's consumer.
pub(super) const FILTER: &str = "c.cmd.0.*";

#[test]
fn a_direct_get_asks_for_the_commands_left_unacknowledged() {
    assert_eq!(batch(250, 0, 2000), 251);
    // A replica holding acknowledged commands too: asked again, a few at a time.
    assert_eq!(batch(250, 240, 2000), MIN_BATCH);
    assert_eq!(batch(250, 300, 2000), MIN_BATCH);
    // Never more than the window holds, and one past it.
    assert_eq!(batch(250, 0, 100), 101);
    assert_eq!(batch(250, 0, 5), 6);
    assert_eq!(batch(5000, 0, 9000), MAX_BATCH);
}

#[test]
fn an_answer_proves_the_window_through_its_greatest_sequence() {
    // It reached the window's end (or past it): whole.
    assert_eq!(step(10, 20, Some(20), false), Step::Done);
    assert_eq!(step(10, 20, Some(25), true), Step::Done);
    // Cut short by its batch or size, the replica holding more: asked again past it.
    assert_eq!(step(10, 20, Some(14), true), Step::Ask(15));
    // Nothing more on this replica: behind, or the tail acknowledged; the leader says.
    assert_eq!(step(10, 20, Some(14), false), Step::Leader(15));
    // Nothing at all, or no valid answer: all from the leader.
    assert_eq!(step(10, 20, None, false), Step::Leader(10));
    assert_eq!(step(10, 20, None, true), Step::Leader(10));
}

/// Stream `C`, a command stream like jetshard's (a work queue on `c.>`), `replicas` of it,
/// direct gets `allowed` or not, and its consumer `p0` on [`FILTER`]; and the stream as
/// the window reads it.
pub(super) async fn command_stream(
    js: &Context,
    replicas: usize,
    allowed: bool,
) -> (consumer::PullConsumer, Stream<()>) {
    js.create_stream(stream::Config {
        name: "C".to_owned(),
        subjects: vec!["c.>".to_owned()],
        retention: stream::RetentionPolicy::WorkQueue,
        allow_direct: allowed,
        num_replicas: replicas,
        ..Default::default()
    })
    .await
    .expect("create the stream");
    jetshard_testkit::wait_stream_writable(js, "c.cmd.0.e-0", Duration::from_secs(30))
        .await
        .expect("the stream takes writes");
    let consumer = js
        .get_stream("C")
        .await
        .expect("stream")
        .create_consumer(consumer::pull::Config {
            durable_name: Some("p0".to_owned()),
            filter_subject: FILTER.to_owned(),
            ack_policy: consumer::AckPolicy::Explicit,
            max_ack_pending: 1000,
            ..Default::default()
        })
        .await
        .expect("create the consumer");
    let commands = crate::journal::server::open_stream(js, "C")
        .await
        .expect("open");
    (consumer, commands)
}

/// The window `w` of stream `C` read as an acquisition reads it, the direct gets sent
/// through `client`, `unacknowledged` commands counted in it: what it read, and how.
pub(super) async fn read_window(
    client: &Client,
    commands: &Stream<()>,
    w: (u64, u64),
    unacknowledged: usize,
) -> (Vec<StreamMessage>, Requests) {
    let mut requests = Requests::default();
    let read = read(
        client.clone(),
        "C",
        commands,
        (FILTER, w.0, w.1),
        unacknowledged as u64,
        &mut requests,
    )
    .await
    .expect("read the window");
    (read, requests)
}

/// On stream `C` ([`command_stream`]), `replicas` of it, direct gets `allowed` or not: 300
/// commands on partitions 0 and 1 in turn, of which the consumer of partition 0 was
/// delivered its first 100 and acknowledged every third and the last. The window
/// `(ack floor, delivered]`, the sequences in it acknowledged and not, and the stream.
async fn delivered_in_part(
    js: &Context,
    replicas: usize,
    allowed: bool,
) -> ((u64, u64), BTreeSet<u64>, BTreeSet<u64>, Stream<()>) {
    let (consumer, commands) = command_stream(js, replicas, allowed).await;
    for i in 0..300 {
        js.publish(format!("c.cmd.{}.e-{}", i % 2, i % 7), "c".into())
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    let mut delivered = Vec::new();
    while delivered.len() < 100 {
        let mut batch = consumer
            .fetch()
            .max_messages(100 - delivered.len())
            .messages()
            .await
            .expect("fetch");
        while let Some(message) = batch.next().await {
            delivered.push(message.expect("a delivery"));
        }
    }
    let (mut acked, mut unacked) = (BTreeSet::new(), BTreeSet::new());
    for (i, message) in delivered.iter().enumerate() {
        let seq = message.info().expect("info").stream_sequence;
        if i % 3 == 1 || i == delivered.len() - 1 {
            message.double_ack_with(AckKind::Ack).await.expect("ack");
            acked.insert(seq);
        } else {
            unacked.insert(seq);
        }
    }
    let mut consumer = consumer;
    let info = consumer.info().await.expect("consumer info");
    let window = (
        info.ack_floor.stream_sequence + 1,
        info.delivered.stream_sequence,
    );
    (window, acked, unacked, commands)
}

/// Checks a read of the window: in order, every unacknowledged command in it, and nothing
/// else but acknowledged ones (a replica not yet through their deletes).
pub(super) fn check(
    read: &[StreamMessage],
    window: (u64, u64),
    acked: &BTreeSet<u64>,
    unacked: &BTreeSet<u64>,
) {
    let seqs: Vec<u64> = read.iter().map(|m| m.sequence).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert!(
        seqs.iter().all(|s| (window.0..=window.1).contains(s)),
        "{seqs:?}"
    );
    let read: BTreeSet<u64> = seqs.iter().copied().collect();
    let missing: Vec<_> = unacked
        .iter()
        .filter(|s| (window.0..=window.1).contains(*s) && !read.contains(*s))
        .collect();
    assert!(
        missing.is_empty(),
        "unacknowledged commands left out: {missing:?}"
    );
    assert!(
        read.iter()
            .all(|s| unacked.contains(s) || acked.contains(s)),
        "{seqs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_replica_answers_the_whole_window_in_one_request() {
    let cluster = NatsCluster::start(3).await.expect("start the cluster");
    let js = jetstream::new(cluster.connect().await.expect("connect"));
    let (window, acked, unacked, commands) = delivered_in_part(&js, 3, true).await;
    assert!(window.0 < window.1, "{window:?}");
    // From each server (any replica answers, at random): whatever a replica answers,
    // the read holds the window; once the replica is through the window (it is usually at
    // once), one direct get reads it all: its last command is acknowledged, the first past it
    // proves the window whole.
    for node in cluster.nodes() {
        let client = node.connect().await.expect("connect");
        let (client, commands) = (&client, &commands);
        let (acked, unacked) = (&acked, &unacked);
        jetshard_testkit::wait_until(Duration::from_secs(30), "one direct get", || async move {
            let (read, requests) = read_window(client, commands, window, unacked.len()).await;
            check(&read, window, acked, unacked);
            assert!(requests.direct >= 1, "{requests:?}");
            requests
                == Requests {
                    direct: 1,
                    leader: 0,
                }
        })
        .await
        .expect("a replica through the window");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn without_direct_gets_the_window_is_read_from_the_leader_at_once() {
    let server = NatsServer::start().await.expect("start nats-server");
    let client = server.connect().await.expect("connect");
    let js = jetstream::new(client.clone());
    let (window, acked, unacked, commands) = delivered_in_part(&js, 1, false).await;
    let started = std::time::Instant::now();
    let (read, requests) = read_window(&client, &commands, window, unacked.len()).await;
    // No responders: answered at once, and the leader read it all.
    assert!(
        started.elapsed() < direct::TIMEOUT,
        "{:?}",
        started.elapsed()
    );
    check(&read, window, &acked, &unacked);
    assert_eq!(
        read.len(),
        unacked.iter().filter(|s| **s >= window.0).count()
    );
    assert_eq!(requests.direct, 1);
    assert!(requests.leader >= read.len() as u64, "{requests:?}");
}
