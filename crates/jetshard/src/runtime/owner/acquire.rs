//! Taking a partition: a new generation claimed, and the commands the previous owners held
//! recovered from the command stream. No entity's state is read here: each is loaded on its
//! first command (`entity_actor::revive`), so an acquisition costs a few reads (the consumer's
//! in-hand range, the claim, the in-flight window), not the partition's history.

use super::shared::Shared;
use super::slot::Pending;
use super::window;
use crate::entity::EntityId;
use crate::error::Error;
use crate::journal::fence::{self, Claimed, InHand};
use crate::wire::Names;

/// What an acquisition gained.
pub(super) struct Acquired {
    pub(super) claimed: Claimed,
    /// The previous owners' in-flight commands, in order.
    pub(super) recovered: Vec<(EntityId, Pending)>,
    /// How long each step took (for the `acquired partition` log line).
    pub(super) steps: Steps,
}

/// An acquisition's steps, timed: each one's wall-clock duration in microseconds.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Steps {
    /// The consumer info (the commands in hand).
    pub(super) in_hand_us: u64,
    /// The in-flight window's read (`window::recover_window`).
    pub(super) window_us: u64,
    /// The latest fence record read ahead, side by side with the two above (from their start).
    pub(super) read_ahead_us: u64,
    /// The claim after the reads: the liveness probe, the fenced publish (and, past a lost
    /// first attempt, the latest fence record read again).
    pub(super) claim_us: u64,
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
    let at = std::time::Instant::now();
    let mut steps = Steps::default();
    // The latest fence record, read side by side with the commands in hand and the window
    // (the claim's first attempt uses it; see `fence::Claimant::read_ahead`). An error here
    // leaves the claim to read it itself.
    let read_ahead = async {
        let read = fence::latest(&shared.journal_stream, &shared.names, partition).await;
        (read.ok(), lap(at))
    };
    let reads = async {
        // The commands in hand, read before the claim so that the claim can count them (one
        // acknowledged meanwhile is recovered in vain and found applied).
        let (in_hand, unacknowledged) = in_hand(shared, partition)
            .await
            .map_err(AcquireError::InHand)?;
        let in_hand_us = lap(at);
        let recovered = window::recover_window(shared, partition, in_hand, unacknowledged)
            .await
            .map_err(AcquireError::Recover)?;
        Ok::<_, AcquireError>((in_hand, recovered, in_hand_us, lap(at) - in_hand_us))
    };
    let ((read_ahead, read_ahead_us), reads) = tokio::join!(read_ahead, reads);
    let (in_hand, mut recovered, in_hand_us, window_us) = reads?;
    steps.read_ahead_us = read_ahead_us;
    steps.in_hand_us = in_hand_us;
    steps.window_us = window_us;
    let claim_at = std::time::Instant::now();
    let counted = counted(in_hand, first_new);
    let head = head(&recovered, counted);
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
            read_ahead,
        },
        InHand {
            counted,
            head,
            isolate_at: max_deliver.min(2),
        },
    )
    .await?;
    steps.claim_us = lap(claim_at);
    for (_, pending) in &mut recovered {
        pending.deliveries = u64::from(fence::claims_holding(&claimed.held, pending.seq)) + 1;
    }
    // Nothing of the journal is read here: each entity is loaded on its first command, from
    // its own snapshot and records (`entity_actor::revive`), so taking a partition costs the
    // same whatever its history.
    Ok(Acquired {
        claimed,
        recovered,
        steps,
    })
}

/// Microseconds since `at`.
fn lap(at: std::time::Instant) -> u64 {
    u64::try_from(at.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// The commands in hand that earlier owners held, of those in hand (`in_hand`). New commands are
/// delivered in stream order, so when the pinning delivery was a first one (`first_new`),
/// everything from it on was delivered to this owner only. From the consumer's info alone: the
/// window read does not change it.
pub(super) fn counted(in_hand: Option<(u64, u64)>, first_new: Option<u64>) -> Option<(u64, u64)> {
    in_hand.and_then(|(first, last)| {
        let last = first_new.map_or(last, |new| last.min(new.saturating_sub(1)));
        (first <= last).then_some((first, last))
    })
}

/// The claim's head: the first recovered command, if earlier owners held it (`counted`).
pub(super) fn head(recovered: &[(EntityId, Pending)], counted: Option<(u64, u64)>) -> Option<u64> {
    recovered
        .first()
        .map(|(_, p)| p.seq)
        .filter(|seq| counted.is_some_and(|(_, last)| *seq <= last))
}

/// The consumer's `(ack floor, delivered]` as an inclusive range of command-stream sequences:
/// delivered and not acknowledged (`None` if nothing is), and how many commands in it are not
/// acknowledged (`num_ack_pending`).
async fn in_hand(shared: &Shared, partition: u32) -> Result<(Option<(u64, u64)>, u64), Error> {
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
    Ok((
        (delivered > floor).then_some((floor + 1, delivered)),
        u64::try_from(info.num_ack_pending).unwrap_or(u64::MAX),
    ))
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
