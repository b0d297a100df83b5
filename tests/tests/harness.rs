//! The test harness itself, against real `nats-server` processes: a server starts and serves
//! JetStream, keeps its file store across a stop, a crash and a restart, freezes and thaws,
//! a cluster keeps a replicated stream through losing its leader, a proxy cuts and stalls
//! connections, and nothing is left running after a drop.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_nats::RequestErrorKind;
use async_nats::connection::State;
use async_nats::jetstream::{self, message::PublishMessage, stream};
use jetshard_testkit::{NatsCluster, NatsServer, TcpProxy, wait_until};

type TestResult = Result<(), Box<dyn Error>>;

fn orders_stream(replicas: usize) -> stream::Config {
    stream::Config {
        name: "ORDERS".to_owned(),
        subjects: vec!["orders.>".to_owned()],
        num_replicas: replicas,
        ..Default::default()
    }
}

async fn payload_at(stream: &stream::Stream, sequence: u64) -> Result<String, Box<dyn Error>> {
    let message = stream.get_raw_message(sequence).await?;
    Ok(String::from_utf8(message.payload.to_vec())?)
}

/// A client that retries a lost connection every 50 ms, so that reconnects are quick to see.
async fn eager_client(url: &str) -> Result<async_nats::Client, async_nats::ConnectError> {
    async_nats::ConnectOptions::new()
        .reconnect_delay_callback(|_| Duration::from_millis(50))
        .connect(url)
        .await
}

/// Whether the server answers a request within `within`. Nobody serves the subject, so the
/// answer is the server's own "no responders": a full round trip, unlike `Client::flush`,
/// which only writes to the socket.
async fn server_answers(client: &async_nats::Client, within: Duration) -> bool {
    let request = client.request("harness.nobody", "".into());
    match tokio::time::timeout(within, request).await {
        Ok(Ok(_)) => true,
        Ok(Err(error)) => error.kind() == RequestErrorKind::NoResponders,
        Err(_) => false,
    }
}

/// The pids of the processes whose command line mentions `path`, read from `/proc`.
fn processes_mentioning(path: &Path) -> Vec<u32> {
    let needle = path.as_os_str().as_encoded_bytes();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // A process may exit while we look; then there is nothing to read.
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                cmdline
                    .split(|byte| *byte == 0)
                    .any(|arg| arg.windows(needle.len()).any(|window| window == needle))
            })
        })
        .collect()
}

#[tokio::test]
async fn a_single_server_stores_a_jetstream_message_and_reads_it_back() -> TestResult {
    jetshard_tests::init_tracing();
    let server = NatsServer::start().await?;
    assert!(
        server.url().starts_with("nats://127.0.0.1:"),
        "{}",
        server.url()
    );
    let jetstream = jetstream::new(server.connect().await?);
    let stream = jetstream.create_stream(orders_stream(1)).await?;

    let ack = jetstream.publish("orders.1", "hello".into()).await?.await?;

    assert_eq!(ack.sequence, 1);
    let message = stream.get_raw_message(1).await?;
    assert_eq!(message.subject.as_str(), "orders.1");
    assert_eq!(payload_at(&stream, 1).await?, "hello");
    Ok(())
}

#[tokio::test]
async fn a_stopped_or_killed_server_restarts_on_its_port_with_its_file_store() -> TestResult {
    jetshard_tests::init_tracing();
    let server = NatsServer::start().await?;
    let port = server.port();
    {
        let jetstream = jetstream::new(server.connect().await?);
        jetstream.create_stream(orders_stream(1)).await?;
        jetstream
            .publish("orders.1", "before stop".into())
            .await?
            .await?;
    }

    server.stop().await?;
    assert_eq!(server.pid(), None);
    server.restart().await?;

    assert_eq!(server.port(), port);
    {
        let jetstream = jetstream::new(server.connect().await?);
        let stream = jetstream.get_stream("ORDERS").await?;
        assert_eq!(payload_at(&stream, 1).await?, "before stop");
        jetstream
            .publish("orders.2", "before kill".into())
            .await?
            .await?;
    }

    server.kill()?;
    assert_eq!(server.pid(), None);
    server.restart().await?;

    let jetstream = jetstream::new(server.connect().await?);
    let stream = jetstream.get_stream("ORDERS").await?;
    assert_eq!(payload_at(&stream, 1).await?, "before stop");
    assert_eq!(payload_at(&stream, 2).await?, "before kill");
    Ok(())
}

#[tokio::test]
async fn a_paused_server_answers_nothing_until_it_is_resumed() -> TestResult {
    jetshard_tests::init_tracing();
    let server = NatsServer::start().await?;
    let jetstream = jetstream::new(server.connect().await?);
    jetstream.query_account().await?;

    server.pause()?;
    let while_paused =
        tokio::time::timeout(Duration::from_millis(500), jetstream.query_account()).await;
    assert!(
        !matches!(while_paused, Ok(Ok(_))),
        "a paused server answered"
    );
    assert!(server.pid().is_some(), "a paused server counts as running");

    server.resume()?;
    wait_until(
        Duration::from_secs(10),
        "JetStream to answer after resume",
        || async { jetstream.query_account().await.is_ok() },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_three_node_cluster_keeps_a_replicated_stream_through_losing_its_leader() -> TestResult {
    jetshard_tests::init_tracing();
    let cluster = NatsCluster::start(3).await?;
    assert_eq!(cluster.urls().split(',').count(), 3);
    let jetstream = jetstream::ContextBuilder::new()
        .timeout(Duration::from_secs(1))
        .build(cluster.connect().await?);
    let mut stream = jetstream.create_stream(orders_stream(3)).await?;
    jetshard_testkit::wait_stream_writable(&jetstream, "orders.1", Duration::from_secs(30)).await?;
    let first = PublishMessage::build()
        .payload("first".into())
        .message_id("first");
    jetstream.send_publish("orders.1", first).await?.await?;
    let old_leader = stream
        .info()
        .await?
        .cluster
        .as_ref()
        .and_then(|cluster| cluster.leader.clone())
        .ok_or("the stream has no leader")?;
    let old_leader_node = cluster
        .node_by_name(&old_leader)
        .ok_or("the leader is not a node of the cluster")?;

    old_leader_node.kill()?;

    // A new leader takes 5-7 s to emerge; the message id makes the retries safe.
    wait_until(
        Duration::from_secs(30),
        "a publish accepted by a new stream leader",
        || async {
            let second = PublishMessage::build()
                .payload("second".into())
                .message_id("second");
            match jetstream.send_publish("orders.2", second).await {
                Ok(ack) => ack.await.is_ok(),
                Err(_) => false,
            }
        },
    )
    .await?;
    let info = stream.info().await?;
    assert_eq!(info.state.messages, 2);
    let new_leader = info
        .cluster
        .as_ref()
        .and_then(|cluster| cluster.leader.clone());
    assert!(
        new_leader.is_some() && new_leader.as_deref() != Some(old_leader.as_str()),
        "leader {old_leader} -> {new_leader:?}"
    );
    assert_eq!(payload_at(&stream, 1).await?, "first");
    assert_eq!(payload_at(&stream, 2).await?, "second");

    old_leader_node.restart().await?;

    wait_until(
        Duration::from_secs(30),
        "the restarted node to be a current replica again",
        || async {
            let Ok(stream) = jetstream.get_stream("ORDERS").await else {
                return false;
            };
            stream
                .cached_info()
                .cluster
                .as_ref()
                .is_some_and(|cluster| {
                    cluster.leader.is_some()
                        && cluster.replicas.len() == 2
                        && cluster
                            .replicas
                            .iter()
                            .all(|peer| peer.current && !peer.offline)
                })
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_cut_proxy_disconnects_its_clients_until_it_is_healed() -> TestResult {
    jetshard_tests::init_tracing();
    let server = NatsServer::start().await?;
    let proxy = TcpProxy::start(server.addr()).await?;
    let client = eager_client(&proxy.url()).await?;
    assert!(server_answers(&client, Duration::from_secs(5)).await);

    proxy.cut();

    wait_until(
        Duration::from_secs(5),
        "the client to lose its connection",
        || async { client.connection_state() != State::Connected },
    )
    .await?;
    // Reconnects (every 50 ms) are refused while the proxy is cut.
    assert!(
        !server_answers(&client, Duration::from_millis(300)).await,
        "a request got through a cut proxy"
    );
    assert_ne!(client.connection_state(), State::Connected);

    proxy.heal();

    wait_until(
        Duration::from_secs(10),
        "the client to reconnect through the healed proxy",
        || async { client.connection_state() == State::Connected },
    )
    .await?;
    assert!(server_answers(&client, Duration::from_secs(5)).await);
    Ok(())
}

#[tokio::test]
async fn a_stalled_proxy_holds_traffic_until_it_is_healed() -> TestResult {
    jetshard_tests::init_tracing();
    let server = NatsServer::start().await?;
    let proxy = TcpProxy::start(server.addr()).await?;
    let client = eager_client(&proxy.url()).await?;
    assert!(server_answers(&client, Duration::from_secs(5)).await);

    proxy.stall();

    assert!(
        !server_answers(&client, Duration::from_millis(300)).await,
        "a request got through a stalled proxy"
    );
    assert_eq!(client.connection_state(), State::Connected);

    proxy.heal();

    assert!(server_answers(&client, Duration::from_secs(5)).await);
    Ok(())
}

#[tokio::test]
async fn dropping_a_server_or_a_cluster_leaves_no_nats_server_process() -> TestResult {
    jetshard_tests::init_tracing();
    let server = NatsServer::start().await?;
    let paused = NatsServer::start().await?;
    paused.pause()?;
    let cluster = NatsCluster::start(3).await?;

    let mut store_dirs: Vec<PathBuf> =
        vec![server.store_dir().to_owned(), paused.store_dir().to_owned()];
    store_dirs.extend(
        cluster
            .nodes()
            .iter()
            .map(|node| node.store_dir().to_owned()),
    );
    let mut pids = vec![server.pid(), paused.pid()];
    pids.extend(cluster.nodes().iter().map(NatsServer::pid));
    for (store_dir, pid) in store_dirs.iter().zip(&pids) {
        let pid = pid.ok_or("a server is not running")?;
        assert_eq!(
            processes_mentioning(store_dir),
            vec![pid],
            "{}",
            store_dir.display()
        );
    }

    drop(server);
    drop(paused);
    drop(cluster);

    // Drop kills and reaps before it returns: no waiting needed.
    for store_dir in &store_dirs {
        assert_eq!(
            processes_mentioning(store_dir),
            Vec::<u32>::new(),
            "{}",
            store_dir.display()
        );
        assert!(
            !store_dir.exists(),
            "{} was not removed",
            store_dir.display()
        );
    }
    Ok(())
}
