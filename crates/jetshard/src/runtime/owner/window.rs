//! An acquisition's in-flight window read back from the command stream: the commands the
//! consumer delivered and nobody acknowledged, `(ack floor, delivered]`, in stream order.
//!
//! Read first with batched direct gets (`{"seq","next_by_subj","batch"}`, answered by any
//! replica: the server gives a client's queue request to one at random, not first to its own,
//! `tests/tests/nats_facts.rs`), then, for whatever the answers do not prove, one leader API
//! get per command as before. Tested against a replica cut off from its leader:
//! `window/lag_tests.rs`.
//!
//! **What an answer proves.** A replica stores the stream in sequence order (raft applies the
//! leader's entries in order), so one that holds message `s` holds every message below `s` that
//! it has not deleted. In a work queue a command is deleted only once acknowledged, and an
//! acknowledged command was applied and its records are durable (acks after durability). So an
//! answer whose greatest sequence is `g` holds every unacknowledged command of the partition
//! in `[first, g]`: the window is proven through `g`, and whole once `g >= last`. What lies
//! past `g` while `g < last` (a replica behind, or the window's tail acknowledged meanwhile) is
//! read from the leader. A command missing from the window would come back after later ones of
//! its entity and be taken for a duplicate (ARCHITECTURE.md, invariants); the rule above never
//! leaves one out.
//!
//! **What a replica adds: acknowledged commands.** A replica may not yet have applied the
//! deletes of commands the leader has, so an answer may hold commands acknowledged before the
//! read, which the leader would not return. The leader read has the same outcome for a command
//! acknowledged just after it (the previous owner may still be acknowledging while the new one
//! claims), so nothing the claim sees is new:
//! - the command is recovered in vain: its entity finds it applied (its sequence is at most
//!   the entity's last applied command sequence) and acknowledges it again;
//! - `InHand::counted` and the claim's `held` come from the consumer's info alone, so the
//!   delivery counts (`claims_holding`) and the isolation counts are the same either way;
//! - `InHand::head` (the first recovered command) can be an acknowledged one only if every
//!   command of the partition between the ack floor and it is not recovered (a wake-up, or an
//!   id no entity has): the floor is the first unacknowledged delivery. Then the trial names a
//!   command that is done, exactly as when the leader read races the ack; the next claim's
//!   head is another command and the isolation count starts again (`in_hand::trial`): a
//!   poison command is isolated one claim later at worst, never missed.

use async_nats::Client;
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::Stream;
use std::time::Duration;

use super::shared::Shared;
use super::slot::Pending;
use crate::entity::EntityId;
use crate::error::Error;
use crate::journal::direct::{self, Ended};
use crate::runtime::pin;
use crate::wire::Names;

/// Concurrent readers of the leader's part of the window, each walking its own slice of it.
const RECOVERY_READERS: u64 = 16;
/// The narrowest slice (in stream sequences) worth a reader of its own.
const RECOVERY_SLICE_MIN: u64 = 32;
/// The most commands one direct get asks for.
const MAX_BATCH: u64 = 1024;
/// The fewest commands one direct get asks for.
const MIN_BATCH: u64 = 16;
/// The most direct gets in a row before the rest is read from the leader.
const MAX_ASKS: usize = 8;
/// How long a direct get waits for the next message of its answer. The server gives the request
/// to a replica at random, and one may be stalled (its process stopped, or its route silent,
/// while its peers still count it a subscriber): nothing comes, and the rest of the window is
/// read from the leader after this silence, not after [`direct::TIMEOUT`]. A replica that answers
/// sends its messages back to back.
const SILENCE: Duration = Duration::from_secs(1);

/// Reads, straight from the command stream, the commands the consumer has delivered but that
/// were not acknowledged at the claim: those the previous owners held. Applying them first
/// keeps each entity's commands in order across the takeover; their redeliveries are then
/// recognised as already applied.
///
/// The window is the whole of `(ack floor, delivered]`, including what was delivered to this
/// owner itself since its pin: bounding it by the first delivery under the pin (new commands
/// are delivered in stream order) loses commands when a consumer leader change resets the
/// delivery count (seen in `tests/tests/cluster.rs`, seed 1000): a command missing from the
/// window comes back after later ones of its entity and is taken for a duplicate.
///
/// `unacknowledged`: how many commands in the window the consumer had not seen acknowledged
/// (its `num_ack_pending`): what a direct get asks for (a guess: it only sizes the batches).
///
/// Each command's delivery count is set by the caller.
pub(super) async fn recover_window(
    shared: &Shared,
    partition: u32,
    window: Option<(u64, u64)>,
    unacknowledged: u64,
) -> Result<Vec<(EntityId, Pending)>, Error> {
    let Some((first, last)) = window else {
        return Ok(Vec::new());
    };
    let filter = shared.names.partition_commands(partition);
    let at = std::time::Instant::now();
    let mut requests = Requests::default();
    let messages = read(
        shared.js.client(),
        shared.names.command_stream(partition),
        shared.commands(partition),
        (&filter, first, last),
        unacknowledged,
        &mut requests,
    )
    .await?;
    tracing::debug!(
        partition,
        first,
        last,
        direct = requests.direct,
        leader = requests.leader,
        read_us = micros(at.elapsed()),
        "in-flight window read"
    );
    Ok(messages.into_iter().filter_map(pending).collect())
}

/// The requests a window read made.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Requests {
    /// Direct gets (batches), answered by any replica.
    direct: u64,
    /// API gets of the stream leader, one command each.
    leader: u64,
}

/// The messages on `filter` (of stream `stream`, `commands`) in `first..=last` that no replica
/// has deleted, in order: from the replicas as far as their answers prove it, the rest from
/// the leader.
async fn read(
    client: Client,
    stream: &str,
    commands: &Stream<()>,
    (filter, first, last): (&str, u64, u64),
    unacknowledged: u64,
    requests: &mut Requests,
) -> Result<Vec<StreamMessage>, Error> {
    let (mut messages, next) = from_replicas(
        client,
        stream,
        filter,
        (first, last),
        unacknowledged,
        requests,
    )
    .await;
    if next <= last {
        messages.extend(from_leader(commands, filter, next, last, requests).await?);
    }
    Ok(messages)
}

/// How many commands a direct get asks for: those the consumer counted unacknowledged, less
/// those read already, and one more (the first past the window proves it whole when the
/// window's last command was acknowledged); at least [`MIN_BATCH`] (a replica may still hold
/// acknowledged ones), at most one past the sequences `left` in the window, and
/// [`MAX_BATCH`]. Asking for more would bring the commands past the window (the server stops
/// a batch at its count, not at a sequence).
fn batch(unacknowledged: u64, read: u64, left: u64) -> u64 {
    unacknowledged
        .saturating_sub(read)
        .saturating_add(1)
        .max(MIN_BATCH)
        .min(left.saturating_add(1))
        .min(MAX_BATCH)
}

/// What to do after one direct get of the window `..=last`, asked from `next` on.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// The window is proven whole.
    Done,
    /// Proven through `.0 - 1`; the replica holds more: ask it again from `.0`.
    Ask(u64),
    /// Proven through `.0 - 1` only: the rest, from `.0`, is read from the leader.
    Leader(u64),
}

/// The rule of an answer (the module's doc): `greatest`, the greatest sequence it held (`None`:
/// no message, or no valid answer); `more`, whether the replica said it holds more messages on
/// the filter past them.
fn step(next: u64, last: u64, greatest: Option<u64>, more: bool) -> Step {
    match greatest {
        Some(g) if g >= last => Step::Done,
        Some(g) if more => Step::Ask(g + 1),
        Some(g) => Step::Leader(g + 1),
        None => Step::Leader(next),
    }
}

/// The window's commands read with direct gets from `first`, as far as the answers prove it:
/// the messages at or below `last`, and the first sequence not proven (`> last`: none).
async fn from_replicas(
    client: Client,
    stream: &str,
    filter: &str,
    (first, last): (u64, u64),
    unacknowledged: u64,
    requests: &mut Requests,
) -> (Vec<StreamMessage>, u64) {
    let mut messages: Vec<StreamMessage> = Vec::new();
    let mut next = first;
    for _ in 0..MAX_ASKS {
        let batch = batch(unacknowledged, messages.len() as u64, last - next + 1);
        requests.direct += 1;
        let (answer, more) = match ask(&client, stream, filter, next, batch).await {
            Ok(answer) => answer,
            Err(reason) => {
                tracing::debug!(stream, filter, next, reason, "window read from the leader");
                return (messages, next);
            }
        };
        let greatest = answer.last().map(|m| m.sequence);
        messages.extend(answer.into_iter().filter(|m| m.sequence <= last));
        match step(next, last, greatest, more) {
            Step::Done => return (messages, last + 1),
            Step::Ask(from) => next = from,
            Step::Leader(from) => return (messages, from),
        }
    }
    (messages, next)
}

/// One direct get: the messages on `filter` from `seq` on (at most `batch`), in order, and
/// whether the replica holds more past them; `Err` (why) if the answer proves nothing.
async fn ask(
    client: &Client,
    stream: &str,
    filter: &str,
    seq: u64,
    batch: u64,
) -> Result<(Vec<StreamMessage>, bool), String> {
    let body = serde_json::json!({"seq": seq, "next_by_subj": filter, "batch": batch});
    let asked = tokio::time::Instant::now();
    let answer = direct::ask(client, stream, body.to_string().into(), Some(SILENCE)).await?;
    let messages = answer.messages;
    // In order, each past the last (a reordered answer proves nothing).
    let ordered = messages.first().is_none_or(|m| m.sequence >= seq)
        && messages.windows(2).all(|w| w[0].sequence < w[1].sequence);
    if !ordered {
        return Err("an answer out of order".to_owned());
    }
    tracing::debug!(
        seq,
        batch,
        messages = messages.len(),
        answer_us = micros(asked.elapsed()),
        "window direct get answered"
    );
    let more = match answer.ended {
        Ended::Batch { pending, .. } => pending.is_some_and(|p| p > 0),
        Ended::NotFound => false,
    };
    Ok((messages, more))
}

/// Microseconds in `elapsed`.
fn micros(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)
}

/// The commands on `filter` with stream sequences in `first..=last`, one leader API get each,
/// the range cut into slices read side by side and joined in order.
async fn from_leader(
    commands: &Stream<()>,
    filter: &str,
    first: u64,
    last: u64,
    requests: &mut Requests,
) -> Result<Vec<StreamMessage>, Error> {
    let span = last - first + 1;
    let readers = span.div_ceil(RECOVERY_SLICE_MIN).clamp(1, RECOVERY_READERS);
    let width = span.div_ceil(readers);
    let slices = (0..readers).map(|i| {
        let from = first + i * width;
        let to = (from + width - 1).min(last);
        read_slice(commands, filter, from, to)
    });
    let mut messages = Vec::new();
    for (slice, gets) in futures::future::try_join_all(slices).await? {
        messages.extend(slice);
        requests.leader += gets;
    }
    Ok(messages)
}

/// The messages on `filter` with stream sequences in `first..=last`, in order, from the
/// leader, and the number of gets made.
async fn read_slice(
    commands: &Stream<()>,
    filter: &str,
    first: u64,
    last: u64,
) -> Result<(Vec<StreamMessage>, u64), Error> {
    let mut messages = Vec::new();
    let mut gets = 0;
    let mut next = first;
    while next <= last {
        gets += 1;
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
        messages.push(message);
    }
    Ok((messages, gets))
}

/// A recovered command, or `None` for a wake-up (for no entity: acknowledged when it is
/// delivered again) or a command whose subject holds no valid id (dead-lettered when it is
/// delivered).
fn pending(message: StreamMessage) -> Option<(EntityId, Pending)> {
    if pin::is_wake(Some(&message.headers)) {
        return None;
    }
    let entity =
        Names::entity_of_subject(&message.subject).and_then(|id| EntityId::new(id).ok())?;
    Some((
        entity,
        Pending::recovered(
            message.sequence,
            message.payload,
            pin::respond_to(Some(&message.headers)),
            pin::trace_of(Some(&message.headers)),
            crate::data::timers::firing_of(Some(&message.headers)),
            crate::data::origin::origin_of(Some(&message.headers)),
        ),
    ))
}

#[cfg(test)]
mod lag_tests;

#[cfg(test)]
mod tests;
