//! What an owner holds per entity: its actor (if resident), its commands in hand, and why it
//! is blocked; plain data that [`route`](super::route) works on.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_nats::Subject;
use bytes::Bytes;
use ractor::{ActorId, ActorRef};
use tokio::time::Instant;

use crate::data::origin::Origin;
use crate::data::timers::Firing;
use crate::runtime::entity_actor::{EntityMsg, Work};
use crate::runtime::pin::Delivery;
use crate::trace::CommandTrace;

/// A live entity actor, counted in the system's resident count while it is held.
pub(super) struct Resident {
    pub(super) actor: ActorRef<EntityMsg>,
    count: Arc<AtomicUsize>,
}

impl Resident {
    pub(super) fn new(actor: ActorRef<EntityMsg>, count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self {
            actor,
            count: Arc::clone(count),
        }
    }
}

impl Drop for Resident {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One entity's commands in hand, in the order they are applied.
pub(super) struct Slot {
    pub(super) actor: Option<Resident>,
    /// The passivated actor whose state is on its way back: no new actor until it arrives, so
    /// the entity never runs on a state older than its last command.
    pub(super) returning: Option<ActorId>,
    pub(super) queue: VecDeque<Pending>,
    /// Set after a failed command: nothing of this entity runs until that command is retried,
    /// so later commands cannot overtake it.
    pub(super) blocked: Option<Blocked>,
    pub(super) last_active: Instant,
}

impl Slot {
    pub(super) fn new() -> Self {
        Self {
            actor: None,
            returning: None,
            queue: VecDeque::new(),
            blocked: None,
            last_active: Instant::now(),
        }
    }

    /// Nothing in hand, nothing pending: the entity may be passivated or forgotten.
    pub(super) fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.blocked.is_none() && self.returning.is_none()
    }
}

/// Why an entity waits, and for what.
#[derive(Clone, Copy, Debug)]
pub(super) enum Blocked {
    /// Its first command failed and was nak'd (or, recovered from the stream, was never ours to
    /// nak): wait for the server to deliver it again.
    Redelivery { seq: u64, since: Instant },
    /// Retry its first command here at `at`, without spending a delivery.
    Retry { at: Instant },
}

/// A command in hand.
pub(super) struct Pending {
    pub(super) seq: u64,
    pub(super) payload: Bytes,
    /// The delivery to acknowledge; `None` for a command recovered from the stream on
    /// acquisition (its delivery belongs to the previous owner) or after a nak: once done, such
    /// a command is acknowledged on a subject built from its stream sequence (`wire::ack_subject`).
    pub(super) reply: Option<Subject>,
    /// Deliveries so far, takeovers included.
    pub(super) deliveries: u64,
    /// Local retries after unconfirmed writes.
    pub(super) attempts: u32,
    pub(super) progress_at: Instant,
    /// Where the client wants the outcome.
    pub(super) respond_to: Option<Subject>,
    /// Set once the command is to be given up: its dead letter is written next, with this
    /// reason, instead of deciding it.
    pub(super) give_up: Option<Arc<str>>,
    /// Its trace context (`traceparent`), if it came with one.
    pub(super) trace: Option<Box<CommandTrace>>,
    /// Which timer fired, if it is a timer's command.
    pub(super) timer: Option<Firing>,
    /// Where it came from, if it is an outbox message.
    pub(super) origin: Option<Box<Origin>>,
}

impl Pending {
    /// A delivered command, and the subject it was delivered on (which `Pending` does not keep).
    pub(super) fn delivered(delivery: Delivery) -> (Self, Subject) {
        let pending = Pending {
            seq: delivery.seq,
            payload: delivery.payload,
            reply: Some(delivery.reply),
            deliveries: delivery.deliveries,
            attempts: 0,
            progress_at: Instant::now(),
            respond_to: delivery.respond_to,
            give_up: None,
            trace: delivery.trace,
            timer: delivery.timer,
            origin: delivery.origin,
        };
        (pending, delivery.subject)
    }

    /// A command read back from the stream on acquisition (its delivery count is set from the
    /// claim's count of it).
    pub(super) fn recovered(
        seq: u64,
        payload: Bytes,
        respond_to: Option<Subject>,
        trace: Option<Box<CommandTrace>>,
        timer: Option<Firing>,
        origin: Option<Box<Origin>>,
    ) -> Self {
        Pending {
            seq,
            payload,
            reply: None,
            deliveries: 1,
            attempts: 0,
            progress_at: Instant::now(),
            respond_to,
            give_up: None,
            trace,
            timer,
            origin,
        }
    }

    pub(super) fn work(&self) -> Work {
        Work {
            seq: self.seq,
            payload: self.payload.clone(),
            deliveries: self.deliveries,
            give_up: self.give_up.clone(),
            trace: self.trace.clone(),
            detail: self.respond_to.is_some(),
            timer: self.timer.clone(),
            origin: self.origin.clone(),
        }
    }
}
