//! A warm re-claim: a process that loses its pin and claims the partition again keeps its
//! entities' states when the fence chain proves nobody else claimed in between (its new
//! generation is the next after its own), and loads them all again otherwise.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::Context;
use jetshard::admin::Admin;
use jetshard::wire::{
    HDR_COMMAND_SEQ, HDR_EXPECTED_SUBJECT, HDR_EXPECTED_SUBJECT_SEQ, HDR_GENERATION,
};
use jetshard::{CommandSender, EntityId, PartitionStatus, ShardConfig, ShardSystem};
use jetshard_tests::init_tracing;
use jetshard_tests::tally::{
    Tally, TallyCmd, TallyEvt, applied, config, replayed, start, state_of,
};

const ENTITIES: u32 = 20;

/// Unpinned by an operator, the owner steps down when the next command comes under a new pin
/// of the same process, and claims again: the next generation after its own, so every entity
/// goes on from the state it held, and none is loaded from the journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_reclaimed_by_its_own_process_serves_its_entities_without_loading_them() {
    let u = unpinned().await;
    add_to_each(&u.sender, &u.ids, 1).await;

    let after = status(&u.system).await;
    assert_eq!(after.generation, Some(u.generation + 1), "{after:?}");
    assert_eq!(
        after.entity_loads, u.before.entity_loads,
        "a warm re-claim loads nothing: {after:?}"
    );
    same_as_the_journal(&u.js, &u.sender, &u.config, &u.ids).await;
    u.system.shutdown().await.unwrap();
}

/// The same, but another claimant takes a generation in between and writes an event of one
/// entity under it: the owner's claim is not the next after its own, so it keeps nothing, and
/// every entity is loaded again, that event included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_after_another_generation_wrote_loads_every_entity_again() {
    let u = unpinned().await;
    let written = another_generation_writes(&u.js, &u.config, &u.ids[0]).await;
    assert_eq!(written, u.generation + 1);
    add_to_each(&u.sender, &u.ids, 1).await;

    let after = status(&u.system).await;
    assert_eq!(after.generation, Some(u.generation + 2), "{after:?}");
    assert!(
        after.entity_loads >= u.before.entity_loads + u64::from(ENTITIES),
        "every entity loaded again: {:?} -> {after:?}",
        u.before
    );
    let first = state_of(&u.sender, &u.ids[0]).await;
    assert_eq!(
        first.sums.get(&9),
        Some(&100),
        "the other generation's event: {first:?}"
    );
    same_as_the_journal(&u.js, &u.sender, &u.config, &u.ids).await;
    u.system.shutdown().await.unwrap();
}

/// A one-partition `Tally` system that has applied a command to each of [`ENTITIES`]
/// entities (all of them resident), its status then, and its partition unpinned since.
struct Unpinned {
    _server: jetshard_testkit::NatsServer,
    js: Context,
    config: ShardConfig,
    sender: CommandSender<Tally>,
    system: ShardSystem,
    ids: Vec<String>,
    before: PartitionStatus,
    /// The generation it owned the partition under.
    generation: u64,
}

/// [`Unpinned`]. The owner learns of the unpin from the next delivery, which comes under a new
/// pin (with no command waiting, nobody is pinned meanwhile).
async fn unpinned() -> Unpinned {
    init_tracing();
    let (server, client, js) = jetshard_tests::served().await;
    let config = config("tally", 1)
        .passivate_after(Duration::from_secs(600))
        .build()
        .unwrap();
    let sender = CommandSender::<Tally>::new(client.clone(), &config);
    let system = start(&client, &config).await;
    let ids: Vec<String> = (0..ENTITIES).map(|i| format!("e{i}")).collect();
    add_to_each(&sender, &ids, 0).await;
    let before = status(&system).await;
    let generation = before.generation.expect("owned");
    Admin::new(client.clone(), "tally").unpin(0).await.unwrap();
    Unpinned {
        _server: server,
        js,
        config,
        sender,
        system,
        ids,
        before,
        generation,
    }
}

/// Claims the next generation as another process would, and writes an event of `entity`
/// under it (`Added { key: 9, by: 100 }`). Returns the generation.
async fn another_generation_writes(js: &Context, config: &ShardConfig, entity: &str) -> u64 {
    let names = config.names();
    let (generation, fence_seq) = jetshard_tests::fence::claim_elsewhere(js, &names, 0).await;
    let fence_subject = names.fence_subject(0);
    // The event of a command already stored, so that later commands still apply after it.
    let commands = js.get_stream(names.command_stream(0)).await.unwrap();
    let command_seq = commands.get_info().await.unwrap().state.last_sequence;
    let mut headers = HeaderMap::new();
    headers.insert(HDR_GENERATION, generation.to_string());
    headers.insert(HDR_COMMAND_SEQ, command_seq.to_string());
    headers.insert(HDR_EXPECTED_SUBJECT_SEQ, fence_seq.to_string());
    headers.insert(HDR_EXPECTED_SUBJECT, fence_subject);
    let event = serde_json::to_vec(&TallyEvt::Added { key: 9, by: 100 }).unwrap();
    let subject = names.event_subject(0, &EntityId::new(entity).unwrap());
    js.publish_with_headers(subject, headers, event.into())
        .await
        .unwrap()
        .await
        .unwrap();
    generation
}

/// Round `round` of commands: one `Add` to each of `ids`, each applied.
async fn add_to_each(sender: &CommandSender<Tally>, ids: &[String], round: u8) {
    for (i, id) in ids.iter().enumerate() {
        let command = TallyCmd::Add {
            key: round,
            by: i as u32 + 1,
        };
        applied(sender, id, &command).await;
    }
}

/// Every entity's state as its actor holds it equals a full replay of the journal.
async fn same_as_the_journal(
    js: &Context,
    sender: &CommandSender<Tally>,
    config: &ShardConfig,
    ids: &[String],
) {
    let want = replayed(js, config.names().entity_type()).await;
    for id in ids {
        assert_eq!(state_of(sender, id).await, want[id], "{id}");
    }
}

async fn status(system: &ShardSystem) -> PartitionStatus {
    system.status().await.unwrap().remove(0)
}
