//! What nats-server's duplicate window promises across a restart, for a work-queue stream (the
//! shape of every command stream): the server rebuilds the window from the messages it still
//! holds, so the msg id of a message already consumed (removed) is forgotten, and the same id
//! published again is stored again. This is why an outbox message republished by a new owner
//! after the target's server restarted was applied twice (found by the all-feature chaos
//! schedule, seeds 904, 134, 146: a saga's answer stored twice), and why a target entity now
//! remembers the origins of the outbox messages it applied (`data/origin.rs`; test
//! `outbox::an_outbox_message_published_again_after_a_server_restart_is_applied_once`). If a
//! server version keeps the ids, this test fails: update the docs.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, stream};
use futures::StreamExt;
use jetshard_testkit::NatsServer;

#[tokio::test]
async fn a_work_queue_stream_forgets_the_msg_ids_of_removed_messages_when_restarted() {
    let server = NatsServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    let js = jetstream::new(client.clone());
    let s = js
        .create_stream(stream::Config {
            name: "WQ".into(),
            subjects: vec!["wq.>".into()],
            retention: stream::RetentionPolicy::WorkQueue,
            duplicate_window: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .unwrap();
    let publish = |id: &'static str| {
        let js = js.clone();
        async move {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", id);
            js.publish_with_headers("wq.a", headers, "x".into())
                .await
                .unwrap()
                .await
                .unwrap()
        }
    };
    let first = publish("m1").await;
    let kept = publish("m2").await;
    let consumer = s
        .create_consumer(pull::Config {
            durable_name: Some("c".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = consumer.fetch().max_messages(1).messages().await.unwrap();
    let m = messages.next().await.unwrap().unwrap();
    m.double_ack().await.unwrap();
    let again = publish("m1").await;
    assert!(!first.duplicate && again.duplicate, "{first:?} {again:?}");
    server.kill().unwrap();
    server.restart().await.unwrap();
    let js = jetstream::new(server.connect().await.unwrap());
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", "m1");
    let after = js
        .publish_with_headers("wq.a", headers, "x".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", "m2");
    let kept_after = js
        .publish_with_headers("wq.a", headers, "x".into())
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(
        kept_after.duplicate && kept_after.sequence == kept.sequence,
        "a message still held keeps its id: {kept_after:?}"
    );
    assert!(
        !after.duplicate && after.sequence > kept.sequence,
        "the consumed message's id was forgotten: {after:?}"
    );
}
