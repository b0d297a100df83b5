//! Facts about the server that jetshard's design leans on, checked against the real
//! `nats-server` (docs/ARCHITECTURE.md and ../shared/nats-facts.md say where each is used).

use jetshard_tests::init_tracing;

/// What an entity's load leans on (`entity_actor/load.rs`): the last message on a wildcard
/// filter (`<t>.*.<p>.<id>`, every record kind of one entity) comes back whole, by direct get
/// (the filter is sent in the request's subject) and through the stream leader's API alike, and
/// "none" is told apart from a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_record_of_an_entity_of_any_kind_is_one_read_direct_or_through_the_api() {
    use async_nats::jetstream::stream::{Config, DirectGetErrorKind, LastRawMessageErrorKind};
    init_tracing();
    let server = jetshard_testkit::NatsServer::start()
        .await
        .expect("nats-server");
    let js = async_nats::jetstream::new(server.connect().await.expect("connect"));
    let stream = js
        .create_stream(Config {
            name: "FACT".into(),
            subjects: vec!["f.>".into()],
            allow_direct: true,
            ..Default::default()
        })
        .await
        .expect("stream");
    for subject in [
        "f.evt.1.a",
        "f.evt.1.b",
        "f.snap.1.a",
        "f.tmr.1.b",
        "f.evt.2.a",
    ] {
        js.publish(subject, subject.as_bytes().to_vec().into())
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    for (filter, subject, seq) in [("f.*.1.a", "f.snap.1.a", 3), ("f.*.1.b", "f.tmr.1.b", 4)] {
        let direct = stream
            .direct_get_last_for_subject(filter)
            .await
            .expect("a direct get on a wildcard");
        assert_eq!((direct.subject.as_str(), direct.sequence), (subject, seq));
        assert_eq!(direct.payload.as_ref(), subject.as_bytes());
        let api = stream
            .get_last_raw_message_by_subject(filter)
            .await
            .expect("an API get on a wildcard");
        assert_eq!((api.subject.as_str(), api.sequence), (subject, seq));
    }
    let none = stream.direct_get_last_for_subject("f.*.1.c").await;
    assert!(none.is_err_and(|e| e.kind() == DirectGetErrorKind::NotFound));
    let none = stream.get_last_raw_message_by_subject("f.*.1.c").await;
    assert!(none.is_err_and(|e| e.kind() == LastRawMessageErrorKind::NoMessageFound));
}

/// What the in-flight window read leans on (`runtime/owner/window.rs`): a direct get is a queue
/// request to the stream's replicas, and the server a client is connected to gives it to **any**
/// replica of the cluster, chosen at random (server source: `client.go`, `processMsgResults`,
/// which prefers local queue subscribers only for messages that came over a route), not first
/// to its own. Shown with `s2` following (the leader elsewhere) and its routes stalled: of 48
/// direct gets sent at once through a client of `s2`, some are answered (by `s2`'s replica)
/// and some are not (sent to the leader's, over a stalled route): 6-7 of 24 answered in three
/// runs, a third. A round all answered has odds about (1/3)^48, none about (2/3)^48.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_get_goes_to_any_replica_not_first_to_the_local_one() {
    use async_nats::jetstream::stream::Config;
    use futures::StreamExt;
    use jetshard_testkit::wait_until;
    use std::time::Duration;
    init_tracing();
    const SENT: usize = 48;
    let cluster = jetshard_testkit::NatsCluster::start_with_proxied_routes(3)
        .await
        .expect("cluster");
    let proxy = cluster.route_proxy().expect("proxied");
    let client = cluster.node(0).connect().await.expect("connect s0");
    let js = async_nats::jetstream::new(client.clone());
    js.create_stream(Config {
        name: "FACT".into(),
        subjects: vec!["f.>".into()],
        allow_direct: true,
        num_replicas: 3,
        ..Default::default()
    })
    .await
    .expect("stream");
    jetshard_testkit::wait_stream_writable(&js, "f.1", Duration::from_secs(30))
        .await
        .expect("the stream takes writes");
    js.publish("f.1", "one".into())
        .await
        .expect("publish")
        .await
        .expect("stored");
    let (js, client) = (&js, &client);
    wait_until(
        Duration::from_secs(20),
        "the leader off s2",
        || async move {
            let leader = match js.get_stream("FACT").await {
                Ok(stream) => stream.cached_info().cluster.clone().and_then(|c| c.leader),
                Err(_) => None,
            };
            if leader.as_deref() == Some("s2") {
                let _ = client
                    .request("$JS.API.STREAM.LEADER.STEPDOWN.FACT", "".into())
                    .await;
            }
            leader.is_some_and(|leader| leader != "s2")
        },
    )
    .await
    .expect("a leader off s2");
    let local = cluster.node(2).connect().await.expect("connect s2");
    // How many of SENT direct gets sent at once through `local` are answered within `timeout`.
    let answered = |timeout: Duration| {
        let local = local.clone();
        async move {
            let prefix = local.new_inbox();
            let mut answers = local
                .subscribe(format!("{prefix}.*"))
                .await
                .expect("subscribe");
            for i in 0..SENT {
                local
                    .publish_with_reply(
                        "$JS.API.DIRECT.GET.FACT",
                        format!("{prefix}.{i}"),
                        r#"{"seq":1}"#.into(),
                    )
                    .await
                    .expect("request");
            }
            let mut count = 0;
            let deadline = tokio::time::Instant::now() + timeout;
            while count < SENT {
                match tokio::time::timeout_at(deadline, answers.next()).await {
                    Ok(Some(message)) if message.payload.as_ref() == b"one" => count += 1,
                    Ok(Some(_)) => {}
                    _ => break,
                }
            }
            count
        }
    };
    // s2's replica serving (a follower subscribes once it is current): cut off, s2 answers.
    proxy.cut();
    let answered = &answered;
    wait_until(
        Duration::from_secs(20),
        "s2's replica serving",
        || async move { answered(Duration::from_millis(300)).await == SENT },
    )
    .await
    .expect("s2's replica serves direct gets");
    // Routes back, and with them the interest of the other replicas: then stalled.
    proxy.heal();
    let echo = client.subscribe("fact.echo").await.expect("subscribe");
    client.flush().await.expect("flush");
    let echo = tokio::sync::Mutex::new(echo);
    let (echo, local) = (&echo, &local);
    wait_until(Duration::from_secs(20), "s2 routed again", || async move {
        local
            .publish("fact.echo", "".into())
            .await
            .expect("publish");
        local.flush().await.expect("flush");
        let mut echo = echo.lock().await;
        tokio::time::timeout(Duration::from_millis(200), echo.next())
            .await
            .is_ok()
    })
    .await
    .expect("s2 routed again");
    proxy.stall();
    let count = answered(Duration::from_secs(1)).await;
    proxy.heal();
    eprintln!("direct gets answered by the local replica: {count} of {SENT}");
    assert!(0 < count && count < SENT, "{count} of {SENT} answered");
}
