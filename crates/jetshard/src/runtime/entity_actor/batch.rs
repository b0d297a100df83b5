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

/// Each entity's last records, by its place in the batch (`BatchLoad::new`'s `entities`): the
/// whole answer shared (`Arc`), not copied, with the entities' actors, each entity's records
/// left in the `Vec` they were gathered in: per entity, one allocation (none without records).
type Found = Vec<Vec<StreamMessage>>;

/// An entity's last records, as a batch read them: a share of the batch's answer.
pub(crate) struct BatchedRecords {
    found: Arc<Found>,
    place: usize,
}

impl BatchedRecords {
    /// The last record of each of the entity's subjects (empty: it has no history).
    pub(crate) fn records(&self) -> &[StreamMessage] {
        self.found.get(self.place).map(Vec::as_slice).unwrap_or(&[])
    }
}

/// One batched read of the last records of some entities of one partition, started when it is
/// planned (`owner::route::plan_batch_loads`), shared by all (`Arc`: each entity's actor holds
/// it until it loads).
pub(crate) struct BatchLoad {
    read: Shared<BoxFuture<'static, Option<Arc<Found>>>>,
}

impl BatchLoad {
    /// The batched read of `entities` (at most [`MAX_ENTITIES`]) of `context`'s partition,
    /// started at once (a task of its own; it waits for one of the process's
    /// [`MAX_BATCH_READS`](super::MAX_BATCH_READS) permits). Called within a tokio runtime.
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
            // One of the process's batched-read permits, for the one read (its entities take
            // no load permit).
            let asked = std::time::Instant::now();
            let _permit = Arc::clone(&context.batch_reads).acquire_owned().await.ok();
            let permitted = std::time::Instant::now();
            let stream = context.names.journal_stream(partition);
            let mut requests = 0;
            let answer =
                last_records::last_records(&context.client, stream, &filters, watermark, &mut requests)
                    .await;
            tracing::trace!(
                target: crate::telemetry::STAGE_TARGET,
                partition,
                entities = count,
                records = answer.as_ref().ok().and_then(Option::as_ref).map_or(0, |a| a.messages.len()),
                permit_us = micros(permitted - asked),
                read_us = micros(permitted.elapsed()),
                "batch read"
            );
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
                        requests,
                        permit_wait_us = micros(permitted - asked),
                        read_us = micros(permitted.elapsed()),
                        // Batched reads of the process in flight as this one ended, it included.
                        batch_reads_in_flight = super::MAX_BATCH_READS - context.batch_reads.available_permits(),
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
        // Started now, in a task of its own, not when the first of its entities' actors is
        // spawned and polled (under a cold burst, behind the spawns and first polls of hundreds
        // of others): the read overlaps them. Its entities' actors await the same answer.
        tokio::spawn(read.clone());
        Arc::new(Self { read })
    }
}

/// Whole microseconds of `d` (for the debug lines).
fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// An entity's share of a [`BatchLoad`]: the batch and the entity's place in it (what its
/// records are found by in the answer, no lookup by id).
pub(crate) struct InBatch {
    batch: Arc<BatchLoad>,
    place: usize,
}

impl InBatch {
    /// The entity at `place` in the `entities` `batch` was made for.
    pub(crate) fn new(batch: Arc<BatchLoad>, place: usize) -> Self {
        Self { batch, place }
    }

    /// The last record of each of the entity's subjects (none: it has no history), as of a
    /// sequence past every record it had when the batch was planned; `None` if the batch was
    /// not read (then the entity is read on its own).
    pub(crate) async fn records(&self) -> Option<BatchedRecords> {
        let found = self.batch.read.clone().await?;
        Some(BatchedRecords {
            found,
            place: self.place,
        })
    }
}

/// The messages of a `multi_last` answer by entity (by place in `entities`), the fence record
/// left out.
fn by_entity(entities: &[EntityId], messages: Vec<StreamMessage>, fence: &str) -> Found {
    let place: HashMap<&str, usize> = entities
        .iter()
        .enumerate()
        .map(|(i, entity)| (entity.as_str(), i))
        .collect();
    let mut found: Found = std::iter::repeat_with(Vec::new)
        .take(entities.len())
        .collect();
    for message in messages {
        if message.subject.as_str() == fence {
            continue;
        }
        let Some(entity) = Names::entity_of_subject(&message.subject) else {
            continue;
        };
        if let Some(&i) = place.get(entity) {
            found[i].push(message);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(subject: &str, sequence: u64) -> StreamMessage {
        StreamMessage {
            subject: subject.into(),
            sequence,
            headers: async_nats::HeaderMap::new(),
            payload: bytes::Bytes::new(),
            time: time::OffsetDateTime::UNIX_EPOCH,
        }
    }

    /// Each record lands at its entity's place in the batch (what its actor's share names),
    /// the fence record and records of entities not in the batch left out.
    #[test]
    fn an_answer_is_split_by_each_entitys_place_in_the_batch() {
        let entities = ["b", "a", "c"].map(|id| EntityId::new(id).expect("an id"));
        let answer = [
            ("t.fence.0", 1),
            ("t.evt.0.a", 2),
            ("t.evt.0.c", 3),
            ("t.snap.0.a", 4),
            ("t.evt.0.stranger", 5),
        ]
        .map(|(subject, seq)| message(subject, seq))
        .to_vec();
        let found = by_entity(&entities, answer, "t.fence.0");
        let sequences: Vec<Vec<u64>> = found
            .iter()
            .map(|records| records.iter().map(|m| m.sequence).collect())
            .collect();
        assert_eq!(sequences, [vec![], vec![2, 4], vec![3]]);
        let known = |place| BatchedRecords {
            found: Arc::new(by_entity(
                &entities,
                vec![message("t.evt.0.c", 9)],
                "t.fence.0",
            )),
            place,
        };
        assert!(known(1).records().is_empty());
        assert_eq!(known(2).records()[0].sequence, 9);
    }
}
