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
