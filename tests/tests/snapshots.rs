//! Snapshots: on by default (and none for a type that opts out), fenced like events (a stale
//! owner's refused, a current one's rolling up the last), and ignored when they do not read
//! back (the entity loads from its events). Every check compares a state against the fold of
//! the entity's events as the journal holds them.

use async_nats::HeaderMap;
use async_nats::jetstream::Context;
use jetshard::wire::{
    HDR_COMMAND_SEQ, HDR_EXPECTED_SUBJECT, HDR_EXPECTED_SUBJECT_SEQ, HDR_GENERATION, HDR_ROLLUP,
    HDR_SNAPSHOT_UPTO, HDR_STATE_VERSION,
};
use jetshard::{CommandSender, EntityId, ShardSystem};
use jetshard_tests::init_tracing;
use jetshard_tests::tally::{
    Tally, TallyCmd, UnsnapshottedTally, applied, config, replayed, snapshots_of, start, state_of,
};

/// Snapshots are on by default: an entity type that says nothing about them (`Tally`) leaves a
/// snapshot of every entity that wrote events when its owner stops (the release), with no
/// periodic ones configured; one that opts out leaves none, and both load the same states
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_on_by_default_and_an_opted_out_type_writes_none() {
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    let ids: Vec<String> = (0..6).map(|i| format!("e{i}")).collect();
    for (entity_type, default) in [("tally", true), ("plain", false)] {
        let config = config(entity_type, 2).snapshot_every(0).build().unwrap();
        let add = |i: usize| TallyCmd::Add {
            key: (i % 3) as u8,
            by: i as u32,
        };
        let system = if default {
            let sender = CommandSender::<Tally>::new(client.clone(), &config);
            let system = start(&client, &config).await;
            for (i, id) in ids.iter().enumerate() {
                applied(&sender, id, &add(i)).await;
            }
            system
        } else {
            let sender = CommandSender::<UnsnapshottedTally>::new(client.clone(), &config);
            let system = ShardSystem::start::<UnsnapshottedTally>(client.clone(), config.clone())
                .await
                .unwrap();
            for (i, id) in ids.iter().enumerate() {
                applied(&sender, id, &add(i)).await;
            }
            system
        };
        system.shutdown().await.unwrap();
        let found = snapshots_of(&js, entity_type, 2, &ids).await;
        let want = if default { ids.len() } else { 0 };
        assert_eq!(found, want, "{entity_type}: snapshots after the release");
    }
    // The default type's next owner loads from the snapshots the same states.
    let config = config("tally", 2).build().unwrap();
    let sender = CommandSender::<Tally>::new(client.clone(), &config);
    let want = replayed(&js, "tally").await;
    let system = start(&client, &config).await;
    for id in &ids {
        assert_eq!(state_of(&sender, id).await, want[id], "{id}");
    }
    system.shutdown().await.unwrap();
}

/// Publishes a snapshot as an owner of the fence record at `fence_seq` would.
async fn publish_snapshot(
    js: &Context,
    subject: &str,
    fence_subject: &str,
    fence_seq: u64,
    body: &str,
) -> Result<u64, async_nats::jetstream::context::PublishError> {
    let mut headers = HeaderMap::new();
    headers.insert(HDR_GENERATION, "1");
    headers.insert(HDR_COMMAND_SEQ, "1");
    headers.insert(HDR_SNAPSHOT_UPTO, "0");
    headers.insert(HDR_STATE_VERSION, "1");
    headers.insert(HDR_ROLLUP, "sub");
    headers.insert(HDR_EXPECTED_SUBJECT_SEQ, fence_seq.to_string());
    headers.insert(HDR_EXPECTED_SUBJECT, fence_subject);
    let ack = js
        .publish_with_headers(subject.to_owned(), headers, body.to_owned().into())
        .await?
        .await?;
    Ok(ack.sequence)
}

/// A snapshot is fenced as events are: once a newer fence record exists, the server refuses a
/// stale owner's snapshot (and it rolls nothing up). A current owner's snapshot rolls up the
/// entity's previous one, so each entity has one snapshot in the journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owners_snapshot_is_rejected_and_a_current_one_rolls_up_the_last() {
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    let config = config("tally", 1).build().unwrap();
    jetshard_tests::provision(client.clone(), &config).await;
    let names = config.names();
    let fence_subject = names.fence_subject(0);
    let snapshot = names.snapshot_subject(0, &EntityId::new("a").unwrap());
    let fence = |generation: u64| {
        let mut headers = HeaderMap::new();
        headers.insert(HDR_GENERATION, generation.to_string());
        let body = serde_json::to_vec(&jetshard::FenceRecord::new(0, generation, "n")).unwrap();
        (headers, body)
    };
    let (headers, body) = fence(1u64);
    let first = js
        .publish_with_headers(fence_subject.clone(), headers, body.into())
        .await
        .unwrap()
        .await
        .unwrap()
        .sequence;
    let one = publish_snapshot(&js, &snapshot, &fence_subject, first, "{}")
        .await
        .unwrap();
    let two = publish_snapshot(&js, &snapshot, &fence_subject, first, "{}")
        .await
        .unwrap();
    let journal = js.get_stream(names.journal_stream(0)).await.unwrap();
    // Rolled up: the first is gone.
    assert!(journal.get_raw_message(one).await.is_err());
    assert_eq!(last_sequence(&journal, &snapshot).await, two);

    // Generation 2 claims the partition: generation 1's snapshot is refused (10071).
    let (headers, body) = fence(2u64);
    js.publish_with_headers(fence_subject.clone(), headers, body.into())
        .await
        .unwrap()
        .await
        .unwrap();
    let stale = publish_snapshot(&js, &snapshot, &fence_subject, first, "{}").await;
    let error = stale.expect_err("a stale owner's snapshot must be refused");
    assert_eq!(
        error.kind(),
        async_nats::jetstream::context::PublishErrorKind::WrongLastSequence,
        "{error}"
    );
    // Nothing was rolled up by the refused write.
    assert_eq!(last_sequence(&journal, &snapshot).await, two);
}

/// A snapshot that does not read back (garbage, or another state version) is ignored: the
/// entity is loaded from its events, with the same state and the same command high-water mark,
/// and the partition, acquired by a new process, serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_snapshot_falls_back_to_the_events() {
    init_tracing();
    let (_server, client, js) = jetshard_tests::served().await;
    let config = config("tally", 1).snapshot_every(2).build().unwrap();
    let sender = CommandSender::<Tally>::new(client.clone(), &config);
    let system = start(&client, &config).await;
    for by in 1..=5 {
        applied(&sender, "a", &TallyCmd::Add { key: 1, by }).await;
    }
    system.shutdown().await.unwrap();
    let want = replayed(&js, "tally").await["a"].clone();
    assert_eq!(want.events, 5);

    let names = config.names();
    let subject = names.snapshot_subject(0, &EntityId::new("a").unwrap());
    let bad: [(&str, &str); 3] = [
        // Not JSON of the state at all.
        ("1", "\u{0}\u{ff}garbage"),
        // Valid JSON, another shape.
        ("1", "[1,2,3]"),
        // A state of another version (as after a change of the state type).
        ("2", r#"{"sums":{},"events":0,"trail":0}"#),
    ];
    for (version, body) in bad {
        let mut headers = HeaderMap::new();
        headers.insert(HDR_GENERATION, "9");
        // Claims to cover far more than there is: trusted, it would hide every event.
        headers.insert(HDR_COMMAND_SEQ, "1000000");
        headers.insert(HDR_SNAPSHOT_UPTO, "1000000");
        headers.insert(HDR_STATE_VERSION, version);
        js.publish_with_headers(subject.clone(), headers, body.to_owned().into())
            .await
            .unwrap()
            .await
            .unwrap();
        // A new process takes the partition and loads "a" from its events.
        let system = start(&client, &config).await;
        assert_eq!(state_of(&sender, "a").await, want, "snapshot {body:?}");
        applied(&sender, "b", &TallyCmd::Add { key: 0, by: 1 }).await;
        system.shutdown().await.unwrap();
    }
    // "a" goes on from its true state, and its next snapshot is a good one again.
    let system = start(&client, &config).await;
    for by in [7, 8] {
        applied(&sender, "a", &TallyCmd::Add { key: 2, by }).await;
    }
    system.shutdown().await.unwrap();
    let want = replayed(&js, "tally").await["a"].clone();
    assert_eq!(want.events, 7);
    let system = start(&client, &config).await;
    assert_eq!(state_of(&sender, "a").await, want);
    system.shutdown().await.unwrap();
}

/// The journal sequence of the last message on `subject`.
async fn last_sequence(journal: &async_nats::jetstream::stream::Stream, subject: &str) -> u64 {
    journal
        .get_last_raw_message_by_subject(subject)
        .await
        .unwrap()
        .sequence
}
