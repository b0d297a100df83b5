//! Deliveries lost at the tail: commands the consumer delivered under this loop's pin that never
//! arrived, with nothing delivered after them. A jump of the consumer sequence shows a loss
//! only when a later delivery arrives ([`super::PinSignal::Gap`]); when the lost ones were the
//! last (the partition quiet, or the consumer at `max_ack_pending` with every slot taken by
//! them) nothing arrives, and the server sends them again only after the ack wait.
//!
//! Deliveries are lost where the way between the consumer's leader and this process breaks:
//! a connection dropped with deliveries in it (this client reconnects), a consumer leader that
//! stops (its pulls go unanswered past their expiry, or the consumer has no responders while
//! its replicas elect another). After any of these the loop asks the consumer (one request,
//! off the loop's task) what it delivered: a delivered sequence past the last this loop
//! received, the same in two answers [`SETTLE`] apart, under this loop's pin, is a loss, and
//! the loop reports it ([`super::PinSignal::TailLost`]: the owner takes the partition afresh
//! under the pin it holds and recovers every unacknowledged command in order). Two answers, so that deliveries still on their way are
//! not taken for lost; a false report costs a re-claim, never a command.
//!
//! Cost: nothing while the way is healthy (a pull is answered by its expiry); a request per
//! [`SETTLE`] per partition owned, for at most [`MAX_ASKS`] after each such event.

use std::time::Duration;

use async_nats::jetstream::stream::Stream;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::wire::PRIORITY_GROUP;

/// The wait before each question: long enough for deliveries on their way to arrive.
pub(super) const SETTLE: Duration = Duration::from_secs(1);

/// The most questions after one event (the consumer may be electing a leader meanwhile).
const MAX_ASKS: u32 = 20;

/// What the consumer answered: the consumer sequence it delivered last, and the pin it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ConsumerView {
    pub(super) delivered: u64,
    pub(super) pinned: Option<String>,
}

/// What an answer means for the loop.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum TailFinding {
    /// Nothing lost, or nothing to judge (the pin is not this loop's any more).
    Clear,
    /// Delivered past what arrived: ask again after [`SETTLE`].
    AskAgain,
    /// Delivered past what arrived in two answers: lost.
    Lost,
}

/// The check of one loop.
pub(super) struct TailCheck {
    stream: Stream<()>,
    consumer: String,
    /// When to ask next (none: nothing suspected).
    next_ask: Option<Instant>,
    asks: u32,
    /// The delivered sequence of the last answer that was past what had arrived.
    beyond: Option<u64>,
    asked: Option<JoinHandle<Option<ConsumerView>>>,
}

impl TailCheck {
    pub(super) fn new(stream: Stream<()>, consumer: String) -> Self {
        TailCheck {
            stream,
            consumer,
            next_ask: None,
            asks: 0,
            beyond: None,
            asked: None,
        }
    }

    /// Something happened that can lose deliveries: ask the consumer after [`SETTLE`] (unless
    /// a check is already under way).
    pub(super) fn suspect(&mut self, now: Instant, why: &str) {
        if self.next_ask.is_none() && self.asked.is_none() {
            tracing::debug!(why, "deliveries may be lost: asking the consumer");
            self.next_ask = Some(now + SETTLE);
            self.asks = 0;
            self.beyond = None;
        }
    }

    /// When the loop must wake to ask.
    pub(super) fn wake_at(&self) -> Option<Instant> {
        self.next_ask.filter(|_| self.asked.is_none())
    }

    /// Sends the question if it is due.
    pub(super) fn ask_if_due(&mut self, now: Instant) {
        if self.asked.is_some() || self.next_ask.is_none_or(|at| now < at) {
            return;
        }
        self.next_ask = None;
        self.asks += 1;
        let (stream, consumer) = (self.stream.clone(), self.consumer.clone());
        self.asked = Some(tokio::spawn(async move {
            let info = tokio::time::timeout(SETTLE * 2, stream.consumer_info(&consumer)).await;
            match info {
                Ok(Ok(info)) => Some(ConsumerView {
                    delivered: info.delivered.consumer_sequence,
                    pinned: info
                        .priority_groups
                        .iter()
                        .find(|g| g.group == PRIORITY_GROUP)
                        .and_then(|g| g.pinned_client_id.clone()),
                }),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "consumer not read");
                    None
                }
                Err(_) => None,
            }
        }));
    }

    /// The question under way, if any: the loop polls it beside its deliveries.
    pub(super) fn asked(&mut self) -> Option<&mut JoinHandle<Option<ConsumerView>>> {
        self.asked.as_mut()
    }

    /// Takes the answer (`None`: the request failed) against what arrived: `pin` held,
    /// `received` the last consumer sequence delivered to this loop under it.
    pub(super) fn answered(
        &mut self,
        answer: Option<ConsumerView>,
        pin: Option<&str>,
        received: Option<u64>,
        now: Instant,
    ) -> TailFinding {
        self.asked = None;
        let finding = judge(self.beyond, answer.as_ref(), pin, received);
        self.beyond = answer.as_ref().map(|a| a.delivered);
        if finding == TailFinding::AskAgain && self.asks < MAX_ASKS {
            self.next_ask = Some(now + SETTLE);
        } else {
            self.next_ask = None;
            self.beyond = None;
        }
        if finding == TailFinding::Lost {
            tracing::warn!(
                received = ?received,
                delivered = ?answer.map(|a| a.delivered),
                "deliveries lost at the tail"
            );
        }
        finding
    }
}

/// An answer against the one before (`beyond`: the delivered sequence it gave, if it was past
/// what had arrived), the pin held and the last consumer sequence received under it.
fn judge(
    beyond: Option<u64>,
    answer: Option<&ConsumerView>,
    pin: Option<&str>,
    received: Option<u64>,
) -> TailFinding {
    match (answer, pin, received) {
        (None, _, _) => TailFinding::AskAgain,
        (Some(answer), Some(pin), Some(received))
            if answer.pinned.as_deref() == Some(pin) && answer.delivered > received =>
        {
            if beyond == Some(answer.delivered) {
                TailFinding::Lost
            } else {
                TailFinding::AskAgain
            }
        }
        _ => TailFinding::Clear,
    }
}

impl Drop for TailCheck {
    fn drop(&mut self) {
        if let Some(asked) = &self.asked {
            asked.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(delivered: u64, pinned: &str) -> ConsumerView {
        ConsumerView {
            delivered,
            pinned: Some(pinned.to_owned()),
        }
    }

    #[test]
    fn a_delivery_past_what_arrived_is_lost_only_when_two_answers_agree() {
        let first = answer(7, "p");
        // Delivered 6 and 7, received 5: perhaps still on their way.
        assert_eq!(
            judge(None, Some(&first), Some("p"), Some(5)),
            TailFinding::AskAgain
        );
        // The same a second later, nothing more received: lost.
        assert_eq!(
            judge(Some(7), Some(&first), Some("p"), Some(5)),
            TailFinding::Lost
        );
        // Or 6 arrived meanwhile, 7 did not: still lost.
        assert_eq!(
            judge(Some(7), Some(&first), Some("p"), Some(6)),
            TailFinding::Lost
        );
        // The consumer delivered more since: on its way, perhaps.
        let later = answer(9, "p");
        assert_eq!(
            judge(Some(7), Some(&later), Some("p"), Some(6)),
            TailFinding::AskAgain
        );
    }

    #[test]
    fn nothing_is_lost_when_everything_arrived_or_the_pin_is_not_ours() {
        assert_eq!(
            judge(None, Some(&answer(7, "p")), Some("p"), Some(7)),
            TailFinding::Clear
        );
        assert_eq!(
            judge(Some(9), Some(&answer(9, "q")), Some("p"), Some(7)),
            TailFinding::Clear
        );
        let unpinned = ConsumerView {
            delivered: 9,
            pinned: None,
        };
        assert_eq!(
            judge(Some(9), Some(&unpinned), Some("p"), Some(7)),
            TailFinding::Clear
        );
        // Nothing received under the pin, or no pin: nothing to judge.
        assert_eq!(
            judge(Some(9), Some(&answer(9, "p")), Some("p"), None),
            TailFinding::Clear
        );
        assert_eq!(
            judge(Some(9), Some(&answer(9, "p")), None, Some(3)),
            TailFinding::Clear
        );
    }

    #[test]
    fn an_unanswered_question_is_asked_again() {
        assert_eq!(
            judge(Some(9), None, Some("p"), Some(3)),
            TailFinding::AskAgain
        );
    }
}
