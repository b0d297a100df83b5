//! Taking a partition: a new generation claimed, the state rebuilt from the journal, and the
//! commands the previous owners held recovered from the command stream.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::stream::Stream;
use tokio::time::Instant;

use super::Shared;
use super::route::Pending;
use crate::entity::{Entity, EntityId};
use crate::entity_actor::{Quarantine, Seed};
use crate::error::Error;
use crate::fence::{self, Claimed, InHand};
use crate::journal;
use crate::pin;
use crate::wire::Names;

/// What an acquisition gained.
pub(super) struct Acquired<E: Entity> {
    pub(super) claimed: Claimed,
    /// The rebuilt states.
    pub(super) dormant: HashMap<EntityId, Seed<E>>,
    /// Entities whose records cannot be read back.
    pub(super) quarantined: HashMap<EntityId, Quarantine>,
    /// Events replayed into them, and how long the replay took.
    pub(super) rebuilt_events: u64,
    pub(super) replay_time: Duration,
    /// The previous owners' in-flight commands, in order.
    pub(super) recovered: Vec<(EntityId, Pending)>,
}

/// Why an acquisition failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum AcquireError {
    #[error("reading the commands in hand: {0}")]
    InHand(#[source] Error),
    #[error("claiming a generation: {0}")]
    Claim(#[from] fence::ClaimError),
    #[error("rebuilding generation {generation}: {source}")]
    Rebuild {
        generation: u64,
        #[source]
        source: Error,
    },
    #[error("recovering in-flight commands: {0}")]
    Recover(#[source] Error),
}

/// Claims the next generation of `partition`, rebuilds its entities' state from the journal
/// up to the claim, and reads back the commands earlier owners held. `first_new`: the stream
/// sequence of the delivery that pinned this owner, if it was that command's first delivery.
pub(super) async fn claim_and_rebuild<E: Entity>(
    shared: &Shared,
    partition: u32,
    pin: &str,
    first_new: Option<u64>,
) -> Result<Acquired<E>, AcquireError> {
    // The commands in hand, read before the claim so that the claim can count them (one
    // acknowledged meanwhile is recovered in vain and found applied).
    let in_hand = in_hand(shared, partition)
        .await
        .map_err(AcquireError::InHand)?;
    // Counted: those earlier owners held. New commands are delivered in stream order, so when the
    // pinning delivery was a first one, everything from it on was delivered to this owner only.
    let counted = in_hand.and_then(|(first, last)| {
        let last = first_new.map_or(last, |new| last.min(new.saturating_sub(1)));
        (first <= last).then_some((first, last))
    });
    let mut recovered = recover_window(shared, partition, in_hand)
        .await
        .map_err(AcquireError::Recover)?;
    let head = recovered
        .first()
        .map(|(_, p)| p.seq)
        .filter(|seq| counted.is_some_and(|(_, last)| *seq <= last));
    let max_deliver = shared.config.max_deliver;
    let claimed = fence::claim(
        &shared.js,
        &shared.journal_stream,
        &shared.names,
        partition,
        fence::Claimant {
            node: &shared.config.node_id,
            incarnation: &shared.incarnation,
            pin,
            deaths: &shared.deaths,
        },
        InHand {
            counted,
            head,
            isolate_at: max_deliver.min(2),
        },
    )
    .await?;
    for (_, pending) in &mut recovered {
        pending.deliveries = u64::from(fence::claims_holding(&claimed.held, pending.seq)) + 1;
    }
    let fence = claimed.fence;

    // Every event of this partition precedes our fence record: older owners are fenced.
    let codec = shared.config.codec;
    let mut dormant: HashMap<EntityId, Seed<E>> = HashMap::new();
    let mut quarantined: HashMap<EntityId, Quarantine> = HashMap::new();
    let mut rebuilt = 0;
    let replay_started = Instant::now();
    // Up to our own fence record: everything older owners wrote comes before it. Events first,
    // then dead letters: a dead letter only raises its entity's high-water mark (and says what
    // its command came to), so the order between the two does not matter.
    for filter in [
        shared.names.partition_events(partition),
        shared.names.dead_letter_subject(partition),
    ] {
        rebuilt += journal::replay(&shared.journal_stream, filter, fence.seq, |stored| {
            if let Some(q) = quarantined.get_mut(stored.entity) {
                q.last_command_seq = q.last_command_seq.max(stored.command_seq);
                return Ok(());
            }
            // Most records belong to entities seen before: look up by `&str`, and make an
            // `EntityId` only for a new one.
            let seed = match dormant.get_mut(stored.entity) {
                Some(seed) => seed,
                None => match EntityId::new(stored.entity) {
                    Ok(id) => dormant.entry(id).or_default(),
                    // A dead letter of a command whose subject held no valid id: no entity's.
                    Err(_) => return Ok(()),
                },
            };
            if let Err(quarantine) = seed.replay(stored.entity, &stored, codec) {
                tracing::error!(
                    partition,
                    generation = fence.generation,
                    entity = stored.entity,
                    journal_seq = quarantine.journal_seq,
                    reason = %quarantine.reason,
                    "entity quarantined: its journal cannot be read back"
                );
                if let Some((id, _)) = dormant.remove_entry(stored.entity) {
                    quarantined.insert(id, quarantine);
                }
            }
            Ok(())
        })
        .await
        .map_err(|source| AcquireError::Rebuild {
            generation: fence.generation,
            source,
        })?;
    }
    let replay_time = replay_started.elapsed();
    Ok(Acquired {
        claimed,
        dormant,
        quarantined,
        rebuilt_events: rebuilt,
        replay_time,
        recovered,
    })
}

/// The consumer's `(ack floor, delivered]` as an inclusive range of command-stream sequences:
/// delivered and not acknowledged. `None` if nothing is.
async fn in_hand(shared: &Shared, partition: u32) -> Result<Option<(u64, u64)>, Error> {
    let consumer = shared.names.consumer(partition);
    let info = shared
        .command_stream
        .consumer_info(&consumer)
        .await
        .map_err(|e| Error::jetstream(format!("read consumer {consumer}"), e))?;
    let (floor, delivered) = (
        info.ack_floor.stream_sequence,
        info.delivered.stream_sequence,
    );
    Ok((delivered > floor).then_some((floor + 1, delivered)))
}

/// Concurrent readers of the in-flight window, each walking its own slice of it.
const RECOVERY_READERS: u64 = 16;
/// The narrowest slice (in stream sequences) worth a reader of its own.
const RECOVERY_SLICE_MIN: u64 = 32;

/// Reads, straight from the command stream, the commands the consumer has delivered but that
/// were not acknowledged at the claim: those the previous owners held. Applying them first
/// keeps each entity's commands in order across the takeover; their redeliveries are then
/// recognised as already applied.
///
/// The window is the whole of `(ack floor, delivered]`, including what was delivered to this
/// owner itself since its pin: bounding it by the first delivery under the pin (new commands
/// are delivered in stream order) loses commands when a consumer leader change resets the
/// delivery count (seen in `tests/cluster.rs`, seed 1000): a command missing from the window
/// comes back after later ones of its entity and is taken for a duplicate.
///
/// Each command's delivery count (set by the caller) is the number of claims that found it in
/// hand, plus this owner's own run of it.
///
/// Every read is a get from the stream leader (a replica could lag behind the delivered
/// sequence), one message per request, so the window is cut into slices read side by side and
/// joined in order: up to `max_ack_pending` commands cost a few round trips' worth of time.
async fn recover_window(
    shared: &Shared,
    partition: u32,
    window: Option<(u64, u64)>,
) -> Result<Vec<(EntityId, Pending)>, Error> {
    let Some((first, last)) = window else {
        return Ok(Vec::new());
    };
    let filter = shared.names.partition_commands(partition);
    let span = last - first + 1;
    let readers = span.div_ceil(RECOVERY_SLICE_MIN).clamp(1, RECOVERY_READERS);
    let width = span.div_ceil(readers);
    let slices = (0..readers).map(|i| {
        let from = first + i * width;
        let to = (from + width - 1).min(last);
        read_slice(&shared.command_stream, &filter, from, to)
    });
    let mut recovered = Vec::new();
    for slice in futures::future::try_join_all(slices).await? {
        recovered.extend(slice);
    }
    Ok(recovered)
}

/// The commands on `filter` with stream sequences in `first..=last`, in order.
async fn read_slice(
    commands: &Stream<()>,
    filter: &str,
    first: u64,
    last: u64,
) -> Result<Vec<(EntityId, Pending)>, Error> {
    let mut recovered = Vec::new();
    let mut next = first;
    while next <= last {
        let found = commands
            .raw_message_builder()
            .sequence(next)
            .next_by_subject(filter.to_owned())
            .send()
            .await;
        let message = match found {
            Ok(message) => message,
            Err(e)
                if e.kind()
                    == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
            {
                break;
            }
            Err(e) => {
                return Err(Error::jetstream(
                    format!("read command {next} of {filter}"),
                    e,
                ));
            }
        };
        if message.sequence > last {
            break;
        }
        next = message.sequence + 1;
        // A command whose subject holds no valid id is dead-lettered when it is delivered.
        let Some(entity) =
            Names::entity_of_subject(&message.subject).and_then(|id| EntityId::new(id).ok())
        else {
            continue;
        };
        recovered.push((
            entity,
            Pending::recovered(
                message.sequence,
                message.payload,
                pin::respond_to(Some(&message.headers)),
                pin::trace_of(Some(&message.headers)),
            ),
        ));
    }
    Ok(recovered)
}
