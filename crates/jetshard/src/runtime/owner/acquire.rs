//! Taking a partition: a new generation claimed, and the commands the previous owners held
//! recovered from the command stream. No entity's state is read here: each is loaded on its
//! first command (`entity_actor::revive`), so an acquisition costs a few reads (the consumer's
//! in-hand range, the claim, the in-flight window), not the partition's history.

use async_nats::jetstream::stream::Stream;

use super::shared::Shared;
use super::slot::Pending;
use crate::entity::EntityId;
use crate::error::Error;
use crate::journal::fence::{self, Claimed, InHand};
use crate::runtime::pin;
use crate::wire::Names;

/// What an acquisition gained.
pub(super) struct Acquired {
    pub(super) claimed: Claimed,
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
    #[error("recovering in-flight commands: {0}")]
    Recover(#[source] Error),
}

/// Claims the next generation of `partition` and reads back the commands earlier owners held.
/// `first_new`: the stream sequence of the delivery that pinned this owner, if it was that
/// command's first delivery.
pub(super) async fn claim(
    shared: &Shared,
    partition: u32,
    pin: &str,
    first_new: Option<u64>,
) -> Result<Acquired, AcquireError> {
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
            liveness: &Probe {
                client: shared.js.client(),
                names: &shared.names,
                deaths: &shared.deaths,
            },
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
    // Nothing of the journal is read here: each entity is loaded on its first command, from
    // its own snapshot and records (`entity_actor::revive`), so taking a partition costs the
    // same whatever its history.
    Ok(Acquired { claimed, recovered })
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
/// delivery count (seen in `tests/tests/cluster.rs`, seed 1000): a command missing from the window
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
        // A wake-up is for no entity: acknowledged when it is delivered again.
        if pin::is_wake(Some(&message.headers)) {
            continue;
        }
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
                crate::data::timers::firing_of(Some(&message.headers)),
                crate::data::origin::origin_of(Some(&message.headers)),
            ),
        ));
    }
    Ok(recovered)
}

/// The crash watch's answer to a claim: whether a previous owner's process is gone.
struct Probe<'a> {
    client: async_nats::Client,
    names: &'a Names,
    deaths: &'a crate::runtime::crash::Deaths,
}

impl fence::Liveness for Probe<'_> {
    fn is_gone<'a>(&'a self, incarnation: &'a str) -> futures::future::BoxFuture<'a, bool> {
        Box::pin(crate::runtime::crash::is_gone(
            &self.client,
            self.names,
            self.deaths,
            incarnation,
        ))
    }
}
