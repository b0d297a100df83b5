//! Facts about the server's pinned pulls that the pull loop's count leans on
//! (`runtime/pin/requested.rs`), checked against the real `nats-server`.

use std::time::{Duration, Instant};

use futures::StreamExt;
use jetshard_tests::init_tracing;

/// How long the pull requests stay open at the server.
const EXPIRES: Duration = Duration::from_millis(2000);

/// Two pulls without the pin id open at a `pinned_client` consumer with messages waiting: the
/// server pins the puller through one and fills it; the other is not served while the pin
/// holds (the same client sent it, but without the id) and ends `408` at its expiry with its
/// whole batch pending. A pull with the pin id is then served at once. So the pull loop does not
/// count such a pull as on its way once it is pinned (`Requested::pinned`): counted, it held the
/// loop back until it expired (the cold pass's first `expires`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulls_without_the_pin_id_wait_once_another_is_pinned() {
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    jetshard_testkit::pinned_pull_consumer(&js, "PIN", "pin.>")
        .await
        .expect("the pinned consumer");
    for i in 0..30 {
        js.publish(format!("pin.{i}"), "m".into())
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    let inbox = client.new_inbox();
    let mut answers = client.subscribe(inbox.clone()).await.expect("subscribe");
    let (client, inbox) = (&client, &inbox);
    let pull = |pin: Option<String>| async move {
        let id = pin
            .map(|pin| format!(r#","id":"{pin}""#))
            .unwrap_or_default();
        let body = format!(
            r#"{{"batch":10,"expires":{},"group":"owners"{id}}}"#,
            EXPIRES.as_nanos()
        );
        client
            .publish_with_reply(
                "$JS.API.CONSUMER.MSG.NEXT.PIN.c",
                inbox.clone(),
                body.into(),
            )
            .await
            .expect("pull");
        client.flush().await.expect("flush");
    };
    let sent = Instant::now();
    pull(None).await;
    pull(None).await;
    // Everything the two pulls get, up to the first status (bounded: the pulls expire).
    let mut pin = None;
    let mut delivered = 0;
    let status = loop {
        let answer = tokio::time::timeout(EXPIRES * 3, answers.next())
            .await
            .expect("an answer before the pulls expire")
            .expect("subscribed");
        match answer.status {
            None | Some(async_nats::StatusCode::OK) => {
                delivered += 1;
                let id = answer.headers.as_ref().and_then(|h| h.get("Nats-Pin-Id"));
                pin = pin.or(id.map(|v| v.to_string()));
            }
            Some(async_nats::StatusCode::IDLE_HEARTBEAT) => {}
            Some(_) => break answer,
        }
    };
    let ended_after = sent.elapsed();
    eprintln!(
        "{delivered} delivered, then {:?} {:?} after {ended_after:?}",
        status.status, status.headers
    );
    assert_eq!(delivered, 10, "one pull filled, the other not served");
    assert_eq!(status.status, Some(async_nats::StatusCode::TIMEOUT));
    let pending = status
        .headers
        .as_ref()
        .and_then(|h| h.get("Nats-Pending-Messages"))
        .map(|v| v.to_string());
    assert_eq!(pending.as_deref(), Some("10"), "its whole batch pending");
    assert!(ended_after >= EXPIRES / 2, "at its expiry: {ended_after:?}");
    // With the pin id: served at once.
    let asked = Instant::now();
    pull(Some(pin.expect("a pin id"))).await;
    let next = tokio::time::timeout(EXPIRES, answers.next())
        .await
        .expect("a pull with the pin id is served")
        .expect("subscribed");
    assert_eq!(next.status, None, "{next:?}");
    eprintln!("a pull with the pin id served after {:?}", asked.elapsed());
}
