//! Unit tests of the journal writer (real server).

use super::*;
use async_nats::jetstream::stream::Stream;
use jetshard_testkit::NatsServer;

/// A fresh server with a journal stream `T` on `t.>` and a writer of partition 0 whose writes
/// time out after `timeout`.
async fn journal(timeout: std::time::Duration) -> (NatsServer, Stream, Arc<Names>, JournalWriter) {
    let server = NatsServer::start().await.expect("start nats-server");
    let js = async_nats::jetstream::new(server.connect().await.expect("connect"));
    let stream = js
        .create_stream(async_nats::jetstream::stream::Config {
            name: "T".to_owned(),
            subjects: vec!["t.>".to_owned()],
            allow_atomic_publish: true,
            ..Default::default()
        })
        .await
        .expect("create the journal");
    let names = Arc::new(Names::new("t"));
    let writer = test_writer(js, Arc::clone(&names), timeout).await;
    (server, stream, names, writer)
}

/// After a write of its generation was answered "not confirmed" (the server stopped past
/// the write timeout), a writer names no previous record (`Jetshard-Previous`) on any record
/// of the generation, asked or not: the unconfirmed record is stored once the server runs
/// again, after whatever an entity's actor read or wrote since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_write_not_confirmed_no_record_of_its_entity_names_a_previous_one() {
    let (server, stream, names, writer) = journal(std::time::Duration::from_millis(300)).await;
    let fence_seq = writer.watermark().expect("no write of its own yet");
    let id = EntityId::new("a").expect("an id");
    let subject: Subject = names.event_subject(0, &id).into();
    let event = |command: u64, previous: u64| {
        writer.append(
            &id,
            &subject,
            command,
            vec![Bytes::from_static(b"e")],
            1,
            None,
            Attached::default(),
            Some(&Lineage::at(previous)),
        )
    };
    let previous_of = |seq: u64| {
        let stream = stream.clone();
        async move {
            let message = stream.get_raw_message(seq).await.expect("read it back");
            message
                .headers
                .get(HDR_PREVIOUS)
                .map(|v| v.as_str().to_owned())
        }
    };
    // Every write answered: the record names what it was given.
    let first = event(1, fence_seq)
        .await
        .expect("written")
        .expect("a record");
    assert_eq!(previous_of(first).await, Some(fence_seq.to_string()));

    // Not confirmed in time, yet stored once the server runs again.
    server.pause().expect("pause the server");
    let late = event(2, first).await;
    server.resume().expect("resume the server");
    assert!(
        matches!(late, Err(WriteError::Unconfirmed(_))),
        "not confirmed: {late:?}"
    );
    let late_seq = first + 1;
    jetshard_testkit::wait_until(
        std::time::Duration::from_secs(10),
        "the late record stored",
        || {
            let stream = stream.clone();
            async move { stream.get_raw_message(late_seq).await.is_ok() }
        },
    )
    .await
    .expect("the late record stored");

    // From now on this entity's records under this generation name nothing, events and dead
    // letters alike.
    let after = event(3, late_seq)
        .await
        .expect("written")
        .expect("a record");
    assert_eq!(previous_of(after).await, None, "an event after the doubt");
    let letter = writer
        .dead_letter(
            "a",
            4,
            1,
            "given up",
            Bytes::new(),
            Some(&Lineage::at(after)),
        )
        .await
        .expect("written");
    assert_eq!(
        previous_of(letter).await,
        None,
        "a dead letter after the doubt"
    );
    // Another entity's records go on naming theirs: a link speaks of its own entity only.
    let other = EntityId::new("b").expect("an id");
    let other_subject: Subject = names.event_subject(0, &other).into();
    let others = writer
        .append(
            &other,
            &other_subject,
            5,
            vec![Bytes::from_static(b"e")],
            1,
            None,
            Attached::default(),
            Some(&Lineage::at(fence_seq)),
        )
        .await
        .expect("written")
        .expect("a record");
    assert_eq!(previous_of(others).await, Some(fence_seq.to_string()));
}

#[test]
fn the_fence_headers_built_with_room_are_the_fence_headers_once_each() {
    let fence = Fence {
        generation: 12,
        seq: 345,
    };
    let built = fenced_headers(&fence, "t.fence.3");
    let mut plain = HeaderMap::new();
    plain.insert(name(HDR_GENERATION), "12");
    plain.insert(name(HDR_EXPECTED_SUBJECT_SEQ), "345");
    plain.insert(name(HDR_EXPECTED_SUBJECT), "t.fence.3");
    assert_eq!(built, plain);
    assert_eq!(built.get_all(HDR_GENERATION).count(), 1);
    let mut event = built.clone();
    event.insert(name(HDR_MSG_ID), "t:1:0");
    assert_eq!(event.len(), 4);
    assert_eq!(built.len(), 3, "a clone is the record's own");
}

#[tokio::test(flavor = "current_thread")]
async fn an_event_at_version_one_carries_no_version_header_and_another_version_does() {
    let server = NatsServer::start().await.expect("start nats-server");
    let js = async_nats::jetstream::new(server.connect().await.expect("connect"));
    let settings = test_settings(std::time::Duration::from_secs(5));
    let fence = Fence {
        generation: 3,
        seq: 7,
    };
    let writer = JournalWriter::new(js, Arc::new(Names::new("t")), 0, fence, settings);
    let fenced = |headers: &HeaderMap| {
        headers.get(HDR_GENERATION).map(|v| v.as_str()) == Some("3")
            && headers.get(HDR_EXPECTED_SUBJECT_SEQ).map(|v| v.as_str()) == Some("7")
            && headers.get(HDR_EXPECTED_SUBJECT).is_some()
    };
    let first = writer.event_headers(UNRECORDED_EVENT_VERSION);
    assert!(fenced(&first));
    assert!(first.get(HDR_EVENT_VERSION).is_none());
    for version in [2, 5, 2] {
        let headers = writer.event_headers(version);
        assert!(fenced(&headers));
        let expected = version.to_string();
        assert_eq!(
            headers.get(HDR_EVENT_VERSION).map(|v| v.as_str()),
            Some(expected.as_str())
        );
    }
}

/// An entity's record names where the entity's commands before its link ended
/// (`Jetshard-Earlier`, the gaps down from the link), on a command's only record as on the last
/// of several and on a dead letter; a record with nothing known before its link names none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_names_where_its_entitys_earlier_commands_ended() {
    let (_server, stream, _, writer) = journal(std::time::Duration::from_secs(5)).await;
    let id = EntityId::new("a").expect("an id");
    let headers_of = |seq: u64| {
        let stream = stream.clone();
        async move {
            let message = stream.get_raw_message(seq).await.expect("read it back");
            let header = |name: &str| message.headers.get(name).map(|v| v.as_str().to_owned());
            (header(HDR_PREVIOUS), header(HDR_UNIT), header(HDR_EARLIER))
        }
    };
    let mut lineage = Lineage::at(writer.watermark().expect("the fence"));
    let fence_seq = lineage.last();
    let first = append(&writer, &id, 1, vec![Bytes::from_static(b"e")], &lineage).await;
    assert_eq!(
        headers_of(first).await,
        (Some(fence_seq.to_string()), None, None)
    );
    lineage.followed_by(first);
    let two = vec![Bytes::from_static(b"e"), Bytes::from_static(b"f")];
    let second = append(&writer, &id, 2, two, &lineage).await;
    assert_eq!(
        headers_of(second).await,
        (
            None,
            Some(format!("2 {first}")),
            Some((first - fence_seq).to_string())
        )
    );
    lineage.followed_by(second);
    let letter = writer
        .dead_letter("a", 3, 1, "given up", Bytes::new(), Some(&lineage))
        .await
        .expect("written");
    assert_eq!(
        headers_of(letter).await,
        (
            Some(second.to_string()),
            None,
            Some(format!("{} {}", second - first, first - fence_seq))
        )
    );
}

/// Appends `events` of command `command` of entity `id` (on its event subject, partition 0),
/// linked as `previous` says.
async fn append(
    writer: &JournalWriter,
    id: &EntityId,
    command: u64,
    events: Vec<Bytes>,
    previous: &Lineage,
) -> u64 {
    let subject: Subject = Names::new("t").event_subject(0, id).into();
    writer
        .append(
            id,
            &subject,
            command,
            events,
            1,
            None,
            Attached::default(),
            Some(previous),
        )
        .await
        .expect("written")
        .expect("a record")
}
