//! Facts about the server that jetshard's design leans on, checked against the real
//! `nats-server` (docs/ARCHITECTURE.md says where each is used).

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

/// How long the pull requests of [`across_a_pause`] stay open at the server.
const PULL_EXPIRES: std::time::Duration = std::time::Duration::from_millis(2500);

/// What a pull request left open across a consumer's pause got once the pause ended.
#[derive(Debug)]
struct AfterPause {
    /// How long after the pull was sent its first answer came (a delivery or a status).
    first_after: std::time::Duration,
    /// That answer's status (`None`: a delivery).
    status: Option<async_nats::StatusCode>,
    /// How long a fresh pull sent after that answer took to be given a message.
    fresh_pull_after: std::time::Duration,
}

/// A pull consumer (`replicas` replicas; in a `pinned_client` priority group if `group`), a pull
/// request open (batch 10, [`PULL_EXPIRES`]), the consumer paused by API (an hour, or `until` from
/// now: then it ends by itself), three messages published while paused, and (without `until`)
/// the consumer resumed by API, both seen to hold at the consumer's leader (its info): what the
/// open pull gets, and when.
async fn across_a_pause(
    client: &async_nats::Client,
    name: &str,
    replicas: usize,
    group: bool,
    until: Option<std::time::Duration>,
) -> AfterPause {
    use async_nats::jetstream::consumer::{AckPolicy, PriorityPolicy, pull};
    use async_nats::jetstream::stream::Config;
    use futures::StreamExt;
    use jetshard_testkit::wait_until;
    use std::time::Duration;
    use tokio::time::Instant;
    let js = async_nats::jetstream::new(client.clone());
    let stream = js
        .create_stream(Config {
            name: name.into(),
            subjects: vec![format!("{name}.>")],
            num_replicas: replicas,
            ..Default::default()
        })
        .await
        .expect("stream");
    jetshard_testkit::wait_stream_writable(&js, &format!("{name}.0"), Duration::from_secs(30))
        .await
        .expect("the stream takes writes");
    let mut consumer = pull::Config {
        durable_name: Some("c".into()),
        ack_policy: AckPolicy::Explicit,
        num_replicas: replicas,
        ..Default::default()
    };
    if group {
        consumer.priority_policy = PriorityPolicy::PinnedClient;
        consumer.priority_groups = vec!["owners".into()];
        consumer.priority_timeout = Duration::from_secs(30);
    }
    stream.create_consumer(consumer).await.expect("consumer");
    let paused = |want: bool| {
        let stream = stream.clone();
        async move {
            let (stream, what) = (&stream, if want { "paused" } else { "resumed" });
            wait_until(Duration::from_secs(10), what, || async move {
                stream
                    .consumer_info("c")
                    .await
                    .is_ok_and(|info| info.paused == want)
            })
            .await
            .expect("the consumer's leader to see it");
        }
    };
    let inbox = client.new_inbox();
    let mut answers = client.subscribe(inbox.clone()).await.expect("subscribe");
    let body = match group {
        true => format!(
            r#"{{"batch":10,"expires":{},"group":"owners"}}"#,
            PULL_EXPIRES.as_nanos()
        ),
        false => format!(r#"{{"batch":10,"expires":{}}}"#, PULL_EXPIRES.as_nanos()),
    };
    let pull_subject = format!("$JS.API.CONSUMER.MSG.NEXT.{name}.c");
    let pull = || async {
        client
            .publish_with_reply(pull_subject.clone(), inbox.clone(), body.clone().into())
            .await
            .expect("pull");
        client.flush().await.expect("flush");
        Instant::now()
    };
    let pause_for = until.unwrap_or(Duration::from_secs(3600));
    stream
        .pause_consumer(
            "c",
            time::OffsetDateTime::now_utc() + time::Duration::try_from(pause_for).expect("short"),
        )
        .await
        .expect("pause");
    paused(true).await;
    let sent = pull().await;
    for i in 0..3 {
        js.publish(format!("{name}.{i}"), "m".into())
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    if until.is_none() {
        stream.resume_consumer("c").await.expect("resume");
        paused(false).await;
    }
    let first = tokio::time::timeout(PULL_EXPIRES + Duration::from_secs(5), answers.next())
        .await
        .expect("an answer to the open pull, at the latest its expiry")
        .expect("subscribed");
    let first_after = sent.elapsed();
    let status = first.status.filter(|s| *s != async_nats::StatusCode::OK);
    // A fresh pull once the first answer came: how long until it is given a message.
    let fresh = pull().await;
    loop {
        let next = tokio::time::timeout(Duration::from_secs(5), answers.next())
            .await
            .expect("a delivery to a fresh pull")
            .expect("subscribed");
        if next.status.is_none() || next.status == Some(async_nats::StatusCode::OK) {
            break;
        }
    }
    AfterPause {
        first_after,
        status,
        fresh_pull_after: fresh.elapsed(),
    }
}

/// [`across_a_pause`] resumed by API, with and without a `pinned_client` group, on `replicas`
/// replicas: the open pull gets nothing and ends `408` at its expiry; a fresh pull is served.
async fn open_pulls_wait_for_their_expiry_after_an_api_resume(
    client: &async_nats::Client,
    replicas: usize,
) {
    for (name, group) in [("PLAIN", false), ("PINNED", true)] {
        let after = across_a_pause(client, name, replicas, group, None).await;
        eprintln!("R{replicas}, {name}, resumed by API: {after:?}");
        assert_eq!(
            after.status,
            Some(async_nats::StatusCode::TIMEOUT),
            "{name}"
        );
        assert!(
            after.first_after >= PULL_EXPIRES - std::time::Duration::from_millis(100),
            "{name}: {after:?}"
        );
        assert!(after.fresh_pull_after < PULL_EXPIRES, "{name}: {after:?}");
    }
}

/// What the owners' resume after a consumer pause leans on (`runtime/pin/`, `admin`): a pull
/// request waiting when a consumer is **resumed by API** (`$JS.API.CONSUMER.PAUSE` without a
/// time) is not served: the server's delivery loop, asleep while paused, is woken by a new
/// message, a new pull request or the nearest expiry of a waiting one, and the resume is none of
/// these (server source: `consumer.go`, `updateConfig` -> `updatePauseState` stops the pause
/// timer and does not signal; the timer, when a pause ends by itself, does). So the open pull
/// ends with `408` at its expiry without a message, and the next pull is served at once. With
/// and without a `pinned_client` priority group alike. A pause that ends by itself serves the
/// open pull (the control).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_pull_is_not_served_after_an_api_resume_only_a_new_pull_is() {
    use std::time::Duration;
    init_tracing();
    let server = jetshard_testkit::NatsServer::start()
        .await
        .expect("nats-server");
    let client = server.connect().await.expect("connect");
    open_pulls_wait_for_their_expiry_after_an_api_resume(&client, 1).await;
    // The control: a pause that ends by itself (1 s) serves the open pull before it expires.
    let after = across_a_pause(&client, "ENDS", 1, true, Some(Duration::from_secs(1))).await;
    eprintln!("R1, PINNED, pause ended by itself: {after:?}");
    assert_eq!(after.status, None, "{after:?}");
    assert!(after.first_after < PULL_EXPIRES, "{after:?}");
}

/// [`an_open_pull_is_not_served_after_an_api_resume_only_a_new_pull_is`] on an R3 consumer of a
/// 3-server cluster: the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_pull_is_not_served_after_an_api_resume_on_r3_either() {
    init_tracing();
    let cluster = jetshard_testkit::NatsCluster::start(3)
        .await
        .expect("cluster");
    let client = cluster.connect().await.expect("connect");
    open_pulls_wait_for_their_expiry_after_an_api_resume(&client, 3).await;
}

/// What the owners' pull after a resume (`runtime/pin/resumed.rs`) leans on for its count of
/// what is still requested (`pin/requested.rs`): once a new pull wakes a resumed consumer, the
/// pulls left open across the pause are served too, in a `pinned_client` group as long as they
/// carry the pin id, as the owner's do. So a pull that the resume left waiting is not lost: it
/// counts as requested, and is filled, as any other. (Without the new pull it waits for its
/// expiry: [`an_open_pull_is_not_served_after_an_api_resume_only_a_new_pull_is`].)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_resume_a_new_pull_wakes_the_consumer_and_the_open_pulls_are_served_too() {
    use futures::StreamExt;
    use jetshard_testkit::wait_until;
    use std::time::Duration;
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    let stream = jetshard_testkit::pinned_pull_consumer(&js, "WAKE", "wake.>")
        .await
        .expect("the pinned consumer");
    let inbox = client.new_inbox();
    let mut answers = client.subscribe(inbox.clone()).await.expect("subscribe");
    let (client, inbox) = (&client, &inbox);
    let pull = |pin: Option<&str>| {
        let body = match pin {
            Some(pin) => format!(
                r#"{{"batch":10,"expires":{},"group":"owners","id":"{pin}"}}"#,
                PULL_EXPIRES.as_nanos()
            ),
            None => format!(
                r#"{{"batch":1,"expires":{},"group":"owners"}}"#,
                PULL_EXPIRES.as_nanos()
            ),
        };
        async move {
            client
                .publish_with_reply(
                    "$JS.API.CONSUMER.MSG.NEXT.WAKE.c",
                    inbox.clone(),
                    body.into(),
                )
                .await
                .expect("pull");
            client.flush().await.expect("flush");
        }
    };
    let paused = |want: bool| {
        let stream = &stream;
        async move {
            wait_until(
                Duration::from_secs(10),
                "the consumer's leader to see it",
                || async move {
                    stream
                        .consumer_info("c")
                        .await
                        .is_ok_and(|info| info.paused == want)
                },
            )
            .await
            .expect("paused or resumed");
        }
    };
    // Pinned, as an owner is (a pull of one message: nothing of it left open).
    pull(None).await;
    js.publish("wake.first", "m".into())
        .await
        .expect("publish")
        .await
        .expect("stored");
    let first = tokio::time::timeout(Duration::from_secs(5), answers.next())
        .await
        .expect("the first message")
        .expect("subscribed");
    let pin = first
        .headers
        .as_ref()
        .and_then(|h| h.get("Nats-Pin-Id"))
        .map(|v| v.to_string())
        .expect("a pin id");
    // A pull left open across the pause, 30 messages stored meanwhile, a resume by API.
    stream
        .pause_consumer(
            "c",
            time::OffsetDateTime::now_utc() + time::Duration::hours(1),
        )
        .await
        .expect("pause");
    paused(true).await;
    pull(Some(&pin)).await;
    for i in 0..30 {
        js.publish(format!("wake.{i}"), "m".into())
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    stream.resume_consumer("c").await.expect("resume");
    paused(false).await;
    // One new pull, and another once ten messages came: all three pulls are filled, the one
    // left open across the pause included, long before any of them expires.
    let woken = std::time::Instant::now();
    pull(Some(&pin)).await;
    let mut delivered = 0;
    let mut third = false;
    while delivered < 30 {
        let answer = tokio::time::timeout(PULL_EXPIRES / 2, answers.next())
            .await
            .unwrap_or_else(|_| panic!("{delivered} of 30 delivered, then nothing"))
            .expect("subscribed");
        if answer.status.is_none() || answer.status == Some(async_nats::StatusCode::OK) {
            delivered += 1;
        }
        if delivered == 10 && !third {
            third = true;
            pull(Some(&pin)).await;
        }
    }
    eprintln!(
        "30 delivered to three pulls {:?} after the new pull",
        woken.elapsed()
    );
    assert!(woken.elapsed() < PULL_EXPIRES / 2, "{:?}", woken.elapsed());
}

/// What spreading an entity type's journal over several streams could lean on to spread their
/// leaders: a stream leader step-down that names the preferred server
/// (`$JS.API.STREAM.LEADER.STEPDOWN.<stream>` with `{"placement":{"preferred":"<server>"}}`)
/// hands the leadership to that server. Each of three R3 streams is moved twice, one request
/// each time, to a server not leading it: a server that ignored the preference would pick
/// either of the two followers, and pass all six moves with odds of 1 in 64. It is a hand-over,
/// not a placement: when that server restarts, another takes the leadership.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_down_hands_a_streams_leadership_to_the_server_it_names() {
    use async_nats::jetstream::stream::Config;
    use jetshard_testkit::wait_until;
    use std::time::Duration;
    init_tracing();
    let cluster = jetshard_testkit::NatsCluster::start(3)
        .await
        .expect("cluster");
    let client = cluster.connect().await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    let leader_of = |name: String| {
        let js = js.clone();
        async move {
            js.get_stream(&name)
                .await
                .ok()
                .and_then(|stream| stream.cached_info().cluster.clone())
                .and_then(|cluster| cluster.leader)
        }
    };
    let servers = ["s0", "s1", "s2"];
    for i in 0..servers.len() {
        let name = format!("SPREAD_{i}");
        js.create_stream(Config {
            name: name.clone(),
            subjects: vec![format!("spread.{i}.>")],
            num_replicas: 3,
            ..Default::default()
        })
        .await
        .expect("stream");
        let subject = format!("spread.{i}.x");
        jetshard_testkit::wait_stream_writable(&js, &subject, Duration::from_secs(30))
            .await
            .expect("the stream takes writes");
        for _ in 0..2 {
            let leader = leader_of(name.clone()).await.expect("a leader");
            let named = servers
                .iter()
                .find(|s| **s != leader)
                .copied()
                .expect("a follower");
            let request = format!(r#"{{"placement":{{"preferred":"{named}"}}}}"#);
            let answer = client
                .request(
                    format!("$JS.API.STREAM.LEADER.STEPDOWN.{name}"),
                    request.into(),
                )
                .await
                .expect("the step-down answered");
            let answer = String::from_utf8_lossy(&answer.payload).into_owned();
            assert!(answer.contains(r#""success":true"#), "{answer}");
            let what = format!("{name} led by a server after {leader}");
            wait_until(Duration::from_secs(30), &what, || {
                let leader_now = leader_of(name.clone());
                let leader = leader.clone();
                async move { leader_now.await.is_some_and(|now| now != leader) }
            })
            .await
            .expect("a new leader");
            assert_eq!(
                leader_of(name.clone()).await.as_deref(),
                Some(named),
                "{name}: led by the server the step-down named"
            );
            jetshard_testkit::wait_stream_writable(&js, &subject, Duration::from_secs(30))
                .await
                .expect("the stream takes writes again");
        }
    }
    // A hand-over, not a placement: the server leading SPREAD_0 restarts, another leads it.
    let leader = leader_of("SPREAD_0".to_owned()).await.expect("a leader");
    cluster
        .node_by_name(&leader)
        .expect("a server of the cluster")
        .restart()
        .await
        .expect("restart the leader");
    wait_until(
        Duration::from_secs(30),
        "SPREAD_0 led by another server",
        || {
            let now = leader_of("SPREAD_0".to_owned());
            let leader = leader.clone();
            async move { now.await.is_some_and(|now| now != leader) }
        },
    )
    .await
    .expect("another leader");
}

/// What a takeover leans on to free the consumer of the previous owner's deliveries
/// (`runtime/owner/outcome.rs`): an explicit acknowledgement is looked up by its stream
/// sequence alone. A client other than the one the messages were delivered to acknowledges
/// one of them on an ack subject it builds from that sequence, with a wrong delivery sequence
/// (`$JS.ACK.<stream>.<consumer>.1.<seq>.<seq>.0.0`, as jetshard builds it): the server answers,
/// the consumer's count of deliveries awaiting acknowledgement drops, a work queue removes the
/// message, and the room it frees under `max_ack_pending` is used by the next pull at once. The
/// same for a sequence not delivered yet changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_built_from_the_stream_sequence_acknowledges_another_clients_delivery() {
    init_tracing();
    let server = jetshard_testkit::NatsServer::start()
        .await
        .expect("nats-server");
    let owner = server.connect().await.expect("connect");
    let other = server.connect().await.expect("connect another client");
    ack_by_stream_sequence(owner, other, 1).await;
}

/// The same on a 3-server cluster, R3 stream and consumer, the two clients on different
/// servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_built_from_the_stream_sequence_acknowledges_another_clients_delivery_on_r3() {
    init_tracing();
    let cluster = jetshard_testkit::NatsCluster::start(3)
        .await
        .expect("cluster");
    let owner = cluster.node(0).connect().await.expect("connect to s0");
    let other = cluster.node(1).connect().await.expect("connect to s1");
    ack_by_stream_sequence(owner, other, 3).await;
}

/// The fact above, on streams of `replicas`: `owner` pulls, `other` acknowledges.
async fn ack_by_stream_sequence(
    owner: async_nats::Client,
    other: async_nats::Client,
    replicas: usize,
) {
    use async_nats::jetstream::consumer::{AckPolicy, pull};
    use async_nats::jetstream::stream::{Config, RetentionPolicy};
    use futures::StreamExt;
    use jetshard_testkit::wait_until;
    use std::time::Duration;
    const PATIENCE: Duration = Duration::from_secs(15);
    let owner = async_nats::jetstream::new(owner);
    let stream = owner
        .create_stream(Config {
            name: "FACTQ".into(),
            subjects: vec!["q.>".into()],
            retention: RetentionPolicy::WorkQueue,
            num_replicas: replicas,
            ..Default::default()
        })
        .await
        .expect("stream");
    jetshard_testkit::wait_stream_writable(&owner, "q.c", PATIENCE)
        .await
        .expect("the stream answers");
    // One message off the consumer's filter first: stream and delivery sequences differ.
    for subject in ["q.b", "q.a", "q.a", "q.a", "q.a", "q.a"] {
        owner
            .publish(subject, "x".into())
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("c".into()),
            filter_subject: "q.a".into(),
            ack_policy: AckPolicy::Explicit,
            ack_wait: Duration::from_secs(60),
            max_ack_pending: 3,
            num_replicas: replicas,
            ..Default::default()
        })
        .await
        .expect("consumer");
    // The stream sequences of the messages one pull of `count` brings within `expires`.
    let pull = |count: usize, expires: Duration| {
        let consumer = consumer.clone();
        async move {
            consumer
                .fetch()
                .max_messages(count)
                .expires(expires)
                .messages()
                .await
                .expect("fetch")
                .map(|m| m.expect("a message").info().expect("info").stream_sequence)
                .collect::<Vec<u64>>()
                .await
        }
    };
    assert_eq!(pull(3, Duration::from_secs(2)).await, vec![2, 3, 4]);
    let mut consumer = consumer.clone();
    let awaiting = consumer.info().await.expect("info").num_ack_pending;
    assert_eq!(awaiting, 3);
    // Full: a pull gets nothing more.
    let more = pull(1, Duration::from_millis(300)).await;
    assert_eq!(more, Vec::<u64>::new(), "max_ack_pending reached");
    // A sequence not delivered yet (6): the server does not answer, and nothing changes (seen
    // below, once the next acknowledgement, handled after it, is answered).
    other
        .publish("$JS.ACK.FACTQ.c.1.6.6.0.0", "+ACK".into())
        .await
        .expect("publish");
    // The delivery of sequence 3 (its delivery sequence is 2), acknowledged by the other client.
    other
        .request("$JS.ACK.FACTQ.c.1.3.3.0.0", "+ACK".into())
        .await
        .expect("the server answers the acknowledgement");
    wait_until(PATIENCE, "the acknowledgement counted", || {
        let mut consumer = consumer.clone();
        async move { consumer.info().await.is_ok_and(|i| i.num_ack_pending == 2) }
    })
    .await
    .expect("one delivery fewer awaiting acknowledgement");
    wait_until(PATIENCE, "the work queue to remove the message", || async {
        stream.get_raw_message(3).await.is_err()
    })
    .await
    .expect("the acknowledged message removed");
    assert!(
        stream.get_raw_message(6).await.is_ok(),
        "an acknowledgement of a sequence not delivered removed it"
    );
    let next = pull(1, Duration::from_secs(2)).await;
    assert_eq!(next, vec![5], "the freed room serves the next pull");
}
