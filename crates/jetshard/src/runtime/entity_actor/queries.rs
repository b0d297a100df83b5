//! State queries answered by a live entity (`<t>.query.<p>.<id>`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use tracing::Instrument;

use super::load::{Revival, revive};
use super::protocol::{EntityContext, EntityReport, panic_message};
use super::replay::Seed;
use super::state::{EntityState, Loaded};
use crate::entity::Entity;
use crate::query::{self, EntityView, Query};

/// Answers a state query from the entity's state (revived first if need be), under the
/// generation of this actor's partition.
pub(super) async fn answer_query<E: Entity>(state: &mut EntityState<E>, query: Query) {
    let context = Arc::clone(&state.context);
    let span = tracing::debug_span!(
        "query",
        partition = context.partition,
        entity = %state.id,
        generation = context.journal.generation(),
    );
    async {
        if state.broken {
            return query::refuse(
                &context.client,
                query,
                "the entity is restarting: ask again".to_owned(),
                true,
            )
            .await;
        }
        if matches!(state.seed, Loaded::No) {
            let batch = state.batch.take();
            state.seed = match revive::<E>(&state.id, &context, batch.as_ref()).await {
                Ok(seed) => {
                    state.timers_untold = true;
                    Loaded::Yes(seed)
                }
                Err(Revival::Quarantined(q)) => Loaded::Quarantined(q),
                Err(Revival::Unreadable(reason)) => {
                    return query::refuse(&context.client, query, reason, true).await;
                }
            };
        }
        let seed = match &state.seed {
            Loaded::Yes(seed) => seed,
            Loaded::Quarantined(q) => {
                return query::refuse(&context.client, query, q.dead_letter_reason(), false).await;
            }
            Loaded::No => return,
        };
        let view = view::<E>(seed, &context);
        let generation = view.generation;
        let superseded = query::answer(
            &context.client,
            &context.journal_stream,
            &context.names,
            query,
            view,
        )
        .await;
        if superseded.is_some() {
            (context.report)(EntityReport::Superseded { generation });
        }
    }
    .instrument(span)
    .await;
}

/// What a query is told of an entity's state (its encoding guarded like `decide`).
pub(crate) fn view<E: Entity>(seed: &Seed<E>, context: &EntityContext) -> EntityView {
    let codec = context.codec;
    let state = catch_unwind(AssertUnwindSafe(|| E::encode_state(&seed.state, codec)))
        .unwrap_or_else(|panic| {
            Err(crate::error::CodecError::Encode(format!(
                "encode_state panicked: {}",
                panic_message(&*panic)
            )))
        });
    EntityView {
        partition: context.partition,
        generation: context.journal.generation(),
        last_command_seq: seed.last_command_seq,
        state,
    }
}
