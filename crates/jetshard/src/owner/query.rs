//! State queries at the owner: each goes where the entity's state is, behind its commands.
//!
//! - a live actor: into its mailbox, behind the commands already handed to it;
//! - a dormant state (rebuilt, or passivated): answered from it here;
//! - no history: the default state, `last_command_seq` 0;
//! - quarantined, or its state on its way back from a stopping actor: refused (ask again).
//!
//! Every answer checks the partition's fence first (`crate::query::answer`): only the owner of
//! the current generation answers.

use std::sync::Arc;

use super::Shared;
use super::phase::Owning;
use crate::entity::Entity;
use crate::entity_actor::{EntityMsg, Seed, known};
use crate::query::{self, Query};

/// Routes `query` to where its entity's state is; an answer given here runs in a task of its
/// own (a fence read), bounded by the fence check's timeout.
pub(super) fn route<E: Entity>(o: &mut Owning<E>, shared: &Arc<Shared>, query: Query) {
    let client = shared.client.clone();
    if let Some(q) = o.quarantined.get(&query.entity) {
        let reason = q.dead_letter_reason();
        tokio::spawn(async move { query::refuse(&client, query, reason).await });
        return;
    }
    let slot = o.entities.get(&query.entity);
    if let Some(resident) = slot.and_then(|s| s.actor.as_ref()) {
        let _ = resident.actor.cast(EntityMsg::Query(query));
        return;
    }
    let waiting = slot.is_some_and(|s| s.returning.is_some() || !s.queue.is_empty());
    if waiting || o.lost.contains(&query.entity) {
        let reason = "the entity's state is being rebuilt: ask again".to_owned();
        tokio::spawn(async move { query::refuse(&client, query, reason).await });
        return;
    }
    let fresh;
    let seed = match o.dormant.get(&query.entity) {
        Some(seed) => seed,
        None => {
            fresh = Seed::<E>::default();
            &fresh
        }
    };
    let known = known::<E>(seed, &o.context);
    let (journal, names) = (shared.journal_stream.clone(), shared.names.clone());
    tokio::spawn(async move { query::answer(&client, &journal, &names, query, known).await });
}
