//! State queries at the owner: each goes to the entity's actor, behind its commands.
//!
//! - a live actor: into its mailbox, behind the commands already handed to it;
//! - no actor: one is started for it (with the entity's dormant state if the owner keeps one,
//!   else it loads the entity from the journal first, as for a command: entities are loaded
//!   lazily, so "no state here" says nothing about the entity's history);
//! - quarantined, or its state on its way back from a stopping actor, or commands of it
//!   waiting: refused (ask again).
//!
//! Every answer checks the partition's fence first (`crate::query::answer`): only the owner of
//! the current generation answers.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use ractor::ActorCell;
use tokio::time::Instant;

use super::phase::Owning;
use super::route;
use crate::entity::Entity;
use crate::query::{self, Query};
use crate::runtime::entity_actor::EntityMsg;

/// Routes `query` to its entity's actor (started if need be); a refusal given here runs in a
/// task of its own.
pub(super) fn route<E: Entity>(
    o: &mut Owning<E>,
    client: &async_nats::Client,
    supervisor: &ActorCell,
    resident: &Arc<AtomicUsize>,
    query: Query,
) {
    let client = client.clone();
    if let Some(q) = o.quarantined.get(&query.entity) {
        let reason = q.dead_letter_reason();
        tokio::spawn(async move { query::refuse(&client, query, reason, false).await });
        return;
    }
    let slot = o.entities.get(&query.entity);
    let waiting =
        slot.is_some_and(|s| s.actor.is_none() && (s.returning.is_some() || !s.queue.is_empty()));
    if waiting {
        let reason = "the entity's state is being rebuilt: ask again".to_owned();
        tokio::spawn(async move { query::refuse(&client, query, reason, true).await });
        return;
    }
    let entity = query.entity.clone();
    if slot.is_none_or(|s| s.actor.is_none()) && !route::spawn(o, &entity, supervisor, resident) {
        let reason = "the entity's actor cannot start: ask again".to_owned();
        tokio::spawn(async move { query::refuse(&client, query, reason, true).await });
        return;
    }
    let Some(slot) = o.entities.get_mut(&entity) else {
        return;
    };
    slot.last_active = Instant::now();
    if let Some(resident) = &slot.actor {
        let _ = resident.actor.cast(EntityMsg::Query(query));
    }
}
