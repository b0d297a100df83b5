//! Taking a partition: a new generation claimed, and the commands the previous owners held
//! recovered from the command stream. No entity's state is read here: each is loaded on its
//! first command (`entity_actor::revive`), so an acquisition costs a few reads (the consumer's
//! in-hand range, the claim, the in-flight window), not the partition's history.

use std::sync::atomic::{AtomicBool, Ordering};

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
    /// The claim, from its start (the fence record read ahead in hand): the liveness probe,
    /// the fenced publish (and, past a lost first attempt, the latest fence record read
    /// again).
    pub(super) claim_us: u64,
    /// Whether the claim ran side by side with the window's read without waiting for it
    /// (it could not isolate: `claim`'s doc), rather than after it.
    pub(super) overlapped: bool,
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

/// How long the claim waits for the fence record read ahead before reading it itself. A read
/// takes milliseconds; one sent to a journal leader as it died is never answered (the client
/// gives up after its request timeout, 10 s), and while the takeover waits, the pin may move on
/// and another process claim: this claim would then supersede a live owner.
const READ_AHEAD_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// Claims the next generation of `partition` and reads back the commands earlier owners held.
/// `pinned` says whether the pull loop still holds `pin` (no claim is published once it does
/// not). `first_new`: the stream sequence of the delivery that pinned this owner, if it was
/// that command's first delivery.
///
/// The order of the reads: the latest fence record is read ahead from the start, side by side
/// with the rest; the commands in hand (the consumer's info) come first of the rest, since
/// both the window and the claim's count are taken from them; then the window and the claim,
/// side by side. The claim needs the window only for its `head` (the first recovered command
/// earlier owners held), and that only when it may isolate (`fence::Claimant::head`: a held
/// range counted at `isolate_at` claims or more): then it waits for the window's read, as
/// before; otherwise (a fresh start, a cold pass, any takeover without a suspect command) the
/// window is read while the claim is published (`Steps::overlapped`). A window read after, or
/// during, the claim holds the same commands the claim would have seen before it: the earlier
/// owners' writes are fenced from the claim on, so what changes meanwhile is only commands
/// acknowledged (recovered in vain, found applied: `window.rs`). Should the window read fail
/// after the claim was won, the acquisition fails as before and the generation is left
/// unused, as when an owner dies right after its claim: the next claim supersedes it.
pub(super) async fn claim(
    shared: &Shared,
    partition: u32,
    pin: &str,
    pinned: &(dyn Fn() -> bool + Sync),
    first_new: Option<u64>,
) -> Result<Acquired, AcquireError> {
    let at = std::time::Instant::now();
    // The latest fence record, read side by side with everything else (the claim's first
    // attempt uses it; see `fence::Claimant::read_ahead`). An error here leaves the claim to
    // read it itself.
    let (ahead_sender, ahead) = tokio::sync::oneshot::channel();
    let read_ahead = async {
        let read = tokio::time::timeout(
            READ_AHEAD_PATIENCE,
            fence::latest(shared.journal(partition), &shared.names, partition),
        )
        .await;
        let _ = ahead_sender.send((read.ok().and_then(Result::ok), lap(at)));
    };
    let rest = async {
        // The commands in hand, read before the claim so that the claim can count them (one
        // acknowledged meanwhile is recovered in vain and found applied).
        let (in_hand, unacknowledged) = in_hand(shared, partition)
            .await
            .map_err(AcquireError::InHand)?;
        let in_hand_us = lap(at);
        let counted = counted(in_hand, first_new);
        // The window's head, for the claim if it needs it (`WindowHead`).
        let (head_sender, head_receiver) = tokio::sync::watch::channel(None);
        let window = async {
            let recovered = window::recover_window(shared, partition, in_hand, unacknowledged)
                .await
                .map_err(AcquireError::Recover)?;
            head_sender.send_replace(Some(head(&recovered, counted)));
            Ok::<_, AcquireError>((recovered, lap(at) - in_hand_us))
        };
        let window_head = WindowHead {
            window: head_receiver,
            asked: AtomicBool::new(false),
        };
        let claim = async {
            let (read_ahead, read_ahead_us) = ahead.await.unwrap_or((None, 0));
            let claim_at = std::time::Instant::now();
            let claimed = claim_counting(
                shared,
                partition,
                (pin, pinned),
                read_ahead,
                counted,
                &window_head,
            )
            .await?;
            Ok::<_, AcquireError>((claimed, read_ahead_us, lap(claim_at)))
        };
        let ((recovered, window_us), (claimed, read_ahead_us, claim_us)) =
            tokio::try_join!(window, claim)?;
        let steps = Steps {
            in_hand_us,
            window_us,
            read_ahead_us,
            claim_us,
            overlapped: !window_head.asked.load(Ordering::Relaxed),
        };
        Ok::<_, AcquireError>((claimed, recovered, steps))
    };
    let ((), result) = tokio::join!(read_ahead, rest);
    let (claimed, mut recovered, steps) = result?;
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

/// The claim of the next generation, counting the commands in hand `counted` (earlier owners
/// held them); `head`, the first of them recovered, is awaited only if the claim may isolate.
async fn claim_counting(
    shared: &Shared,
    partition: u32,
    (pin, pinned): (&str, &(dyn Fn() -> bool + Sync)),
    read_ahead: Option<Option<(u64, fence::FenceRecord)>>,
    counted: Option<(u64, u64)>,
    head: &WindowHead,
) -> Result<Claimed, fence::ClaimError> {
    fence::claim(
        &shared.js,
        shared.journal(partition),
        &shared.names,
        partition,
        fence::Claimant {
            node: &shared.config.node_id,
            incarnation: &shared.incarnation,
            pin,
            pinned,
            liveness: &Probe {
                client: shared.js.client(),
                names: &shared.names,
                deaths: &shared.deaths,
            },
            read_ahead,
            head: Some(head),
        },
        InHand {
            counted,
            head: None,
            isolate_at: shared.config.max_deliver.min(2),
        },
    )
    .await
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
        .commands(partition)
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

/// The first command in hand as the window read finds it (`head`), for a claim that may isolate
/// (`fence::PendingHead`): `None` in `window` until the read is done; `asked` once a claim waited.
struct WindowHead {
    window: tokio::sync::watch::Receiver<Option<Option<u64>>>,
    asked: AtomicBool,
}

impl fence::PendingHead for WindowHead {
    fn head(&self) -> futures::future::BoxFuture<'_, Option<u64>> {
        self.asked.store(true, Ordering::Relaxed);
        let mut window = self.window.clone();
        Box::pin(async move {
            // The sender gone without a value: the window read failed, and so does the
            // acquisition (its error ends the claim's join): no head.
            window
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|head| *head)
                .flatten()
        })
    }
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
