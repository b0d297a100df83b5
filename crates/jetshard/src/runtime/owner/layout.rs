//! What a resident entity (a live entity actor) holds on the heap, and where: measured with the
//! unit tests' counting allocator (`test_alloc`) on a current-thread runtime, so that every
//! task's allocations are this thread's. Printed (`cargo test -p jetshard --lib -- layout
//! --nocapture`), not timed.

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::slot::Slot;
use crate::entity::EntityId;
use crate::runtime::entity_actor::{EntityMsg, Seed};
use crate::test_alloc::held_by_this_thread;
use crate::test_entity::Counter;
use crate::{CommandOutcome, CommandSender, ShardConfig, ShardSystem};

/// Entities measured (each side).
const N: usize = 1_000;

/// An actor that does nothing: ractor's smallest resident thing.
struct Idle;

impl Actor for Idle {
    type Msg = ();
    type State = ();
    type Arguments = ();
    async fn pre_start(&self, _: ActorRef<()>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }
}

/// Heap per idle ractor actor linked to a supervisor (its cell, mailbox channels and task).
async fn bare_actor() -> isize {
    let (supervisor, _) = Actor::spawn(None, Idle, ()).await.unwrap();
    let mut actors = Vec::with_capacity(N);
    let before = held_by_this_thread();
    for _ in 0..N {
        let (actor, _) = Actor::spawn_linked(None, Idle, (), supervisor.get_cell())
            .await
            .unwrap();
        actors.push(actor);
    }
    tokio::task::yield_now().await;
    let per = (held_by_this_thread() - before) / N as isize;
    for actor in actors {
        actor.stop(None);
    }
    supervisor.stop(None);
    per
}

/// Heap per resident entity of [`Counter`] after one command each, on a one-partition system
/// whose actors are never passivated; warmed by `N` other entities first, so that what grows
/// once per partition (buffers, caches up to their bound) is not counted per entity.
async fn resident_entity() -> isize {
    let server = jetshard_testkit::NatsServer::start()
        .await
        .expect("nats-server");
    let client = async_nats::connect(server.url()).await.expect("connect");
    let config = ShardConfig::builder("layout")
        .partitions(1)
        .passivate_after(Duration::from_secs(3_600))
        .compaction(false)
        .build()
        .unwrap();
    let system = ShardSystem::start::<Counter>(client.clone(), config.clone())
        .await
        .unwrap();
    let sender = CommandSender::<Counter>::new(client.clone(), &config);
    let ask = Duration::from_secs(30);
    let touch = |from: usize| {
        let sender = sender.clone();
        async move {
            for k in from..from + N {
                let outcome = sender
                    .request_outcome(&format!("e{k}"), &1, ask)
                    .await
                    .unwrap();
                assert!(matches!(outcome, CommandOutcome::Applied { .. }));
            }
        }
    };
    touch(0).await;
    let before = held_by_this_thread();
    touch(N).await;
    let resident = system.status().await.unwrap()[0].resident_entities;
    assert_eq!(resident, 2 * N);
    let per = (held_by_this_thread() - before) / N as isize;
    system.shutdown().await.unwrap();
    per
}

/// Prints where a resident entity's heap goes: ractor's bare actor, the owner's slot (its map
/// entry, at the table's fill), the actor's state and the rest (the entity actor's task beyond
/// a bare actor's, its id). A measurement, with a loose bound on jetshard's own part.
#[test]
#[cfg(target_pointer_width = "64")]
fn what_a_resident_entity_holds_on_the_heap() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (bare, resident) =
        runtime.block_on(async { (bare_actor().await, resident_entity().await) });
    let slot = std::mem::size_of::<(EntityId, Slot)>() + 1;
    let state = std::mem::size_of::<Seed<Counter>>();
    let message = std::mem::size_of::<EntityMsg>();
    eprintln!(
        "RESIDENT {resident} bytes of heap per resident entity: a bare ractor actor {bare}; \
         the owner's slot {slot} (+ the table's spare slots); the seed {state}; \
         an entity message {message}; the rest {} (the entity actor's task beyond a bare one's, \
         its id)",
        resident - bare - slot as isize - state as isize
    );
    // jetshard's own part was about 20 KB (debug build) while the actor's task carried the
    // futures of a state query and of a snapshot write inline; boxed, about 2.5 KB.
    assert!(resident > bare, "{resident} {bare}");
    assert!(
        resident - bare <= 6 * 1024,
        "{resident} bytes per resident entity, {bare} of them ractor's"
    );
}
