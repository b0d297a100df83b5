//! A pull burst's new entities loaded together: the last record of each of their subjects read
//! with one direct get for up to [`MAX_ENTITIES`] of them, each entity's actor taking its own.
//!
//! An entity's last record of each kind (event, snapshot, timer record, dead letter) is what
//! its load reads first (`load::revive`): whether it has any history, its snapshot, and where
//! its history ends. Read one entity at a time, that is one or two reads per entity, through the
//! stream leader's API on a replicated journal; read together, one direct get per batch, which
//! any replica answers, taken only if it is complete up to the partition's watermark
//! (`JournalWriter::watermark`, see `journal::last_records`).
//!
//! The records after the snapshot are still read by each entity (`load::revive`): the last
//! record of each kind does not tell whether there are others before it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_nats::jetstream::message::StreamMessage;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

use super::protocol::EntityContext;
use crate::entity::EntityId;
use crate::journal::last_records::{self, MAX_MESSAGES};
use crate::wire::Names;

/// Entities read in one batch: each has at most four subjects (`<t>.{evt,snap,tmr,dlq}.<p>.<id>`),
/// and the answer holds at most [`MAX_MESSAGES`], the partition's fence record among them.
pub(crate) const MAX_ENTITIES: usize = 64;
const _: () = assert!(MAX_ENTITIES * 4 < MAX_MESSAGES);

/// Each entity's last records, by id: the whole map shared (`Arc`), not copied, with the
/// entities' actors. Keyed by the batch's own ids (a clone of an [`EntityId`] is a reference
/// count), each entity's records left in the `Vec` they were gathered in: per entity, one
/// allocation (none without records).
type Found = HashMap<EntityId, Vec<StreamMessage>>;

/// An entity's last records, as a batch read them: a share of the batch's answer.
pub(crate) struct Known {
    found: Arc<Found>,
    id: EntityId,
}

impl Known {
    /// The last record of each of the entity's subjects (empty: it has no history).
    pub(crate) fn records(&self) -> &[StreamMessage] {
        self.found.get(&self.id).map(Vec::as_slice).unwrap_or(&[])
    }
}

/// One batched read of the last records of some entities of one partition, made when the first
/// of them loads, shared by all (`Arc`: each entity's actor holds it until it loads).
pub(crate) struct BatchLoad {
    read: Shared<BoxFuture<'static, Option<Arc<Found>>>>,
}

impl BatchLoad {
    /// The batched read of `entities` (at most [`MAX_ENTITIES`]) of `context`'s partition.
    /// Nothing is read until one of them loads.
    pub(crate) fn new(context: &Arc<EntityContext>, entities: &[EntityId]) -> Arc<Self> {
        debug_assert!(entities.len() <= MAX_ENTITIES);
        let context = Arc::clone(context);
        let partition = context.partition;
        let fence = context.names.fence_subject(partition);
        let mut filters: Vec<String> = entities
            .iter()
            .map(|id| context.names.entity_records(partition, id))
            .collect();
        // The partition's fence record always matches: an answer with no record at all ("no
        // results") carries no last sequence, so it would prove nothing.
        filters.push(fence.clone());
        let count = entities.len();
        let entities = entities.to_vec();
        let read = async move {
            // Not known: a write of this owner may be stored beyond what it was told.
            let Some(watermark) = context.journal.watermark() else {
                tracing::debug!(partition, "no watermark; entities load one by one");
                return None;
            };
            // One of the process's load permits, for the one read (its entities take none).
            let _permit = Arc::clone(&context.loads).acquire_owned().await.ok();
            let stream = context.names.journal_stream();
            let mut requests = 0;
            let answer =
                last_records::last_records(&context.client, stream, &filters, watermark, &mut requests)
                    .await;
            context
                .load_stats
                .reads
                .fetch_add(requests, Ordering::Relaxed);
            match answer {
                Ok(Some(answer)) => {
                    tracing::debug!(
                        partition,
                        entities = count,
                        records = answer.messages.len(),
                        upto = answer.upto,
                        watermark,
                        "entities' last records read in one batch"
                    );
                    Some(Arc::new(by_entity(&entities, answer.messages, &fence)))
                }
                Ok(None) => {
                    tracing::debug!(partition, watermark, "batched read incomplete; entities load one by one");
                    None
                }
                Err(error) => {
                    tracing::debug!(partition, %error, "batched read failed; entities load one by one");
                    None
                }
            }
        }
        .boxed()
        .shared();
        Arc::new(Self { read })
    }

    /// The last record of each of `id`'s subjects (none: it has no history), as of a sequence
    /// past every record it had when the batch was planned; `None` if the batch was not read
    /// (then the entity is read on its own).
    pub(crate) async fn records_of(&self, id: &EntityId) -> Option<Known> {
        let found = self.read.clone().await?;
        Some(Known {
            found,
            id: id.clone(),
        })
    }
}

/// The messages of a `multi_last` answer by entity (one of `entities`), the fence record left
/// out.
fn by_entity(entities: &[EntityId], messages: Vec<StreamMessage>, fence: &str) -> Found {
    let mut found: Found = entities
        .iter()
        .map(|entity| (entity.clone(), Vec::new()))
        .collect();
    for message in messages {
        if message.subject.as_str() == fence {
            continue;
        }
        let Some(entity) = Names::entity_of_subject(&message.subject) else {
            continue;
        };
        if let Some(records) = found.get_mut(entity) {
            records.push(message);
        }
    }
    found
}
