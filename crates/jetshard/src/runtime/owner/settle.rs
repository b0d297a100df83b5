//! The owner's failure policy, as a pure function: what becomes of a command given what its
//! entity actor reported. No I/O, no actor: unit-tested without a server.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::data::CommandOutcome;
use crate::retry::backoff;
use crate::runtime::entity_actor::{Failure, Quarantine, Verdict};

/// The settings the policy reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    /// Deliveries (takeovers included) after which a failing command is given up.
    pub(crate) max_deliver: u64,
    /// Base delay of retries and naks.
    pub(crate) retry_delay: Duration,
    /// The longest nak delay.
    pub(crate) ack_wait: Duration,
}

/// What the policy needs to know of the command at hand.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Head {
    pub(crate) seq: u64,
    /// Deliveries so far, this one included (takeovers included).
    pub(crate) deliveries: u64,
    /// Local retries after unconfirmed writes so far.
    pub(crate) attempts: u32,
    /// Whether this process holds a delivery of it to acknowledge (not one recovered from the
    /// stream on acquisition, whose delivery belongs to the previous owner).
    pub(crate) delivered: bool,
}

/// Why an owner stops owning its partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepDown {
    /// A pull carrying the pin was refused: another process is pinned.
    PinLost,
    /// A delivery came under another pin of this process.
    PinMoved,
    /// A delivery under the pin was lost in transit: take the partition afresh, so that the
    /// lost command is recovered before anything newer.
    DeliveriesLost,
    /// A write was rejected by the fence: a newer generation owns the partition.
    Fenced,
    /// Entity actors crash more often than the restart window allows.
    CrashLoop,
    /// The pull loop ended: nothing more can be delivered here.
    PullLoopEnded,
    /// A graceful stop.
    Released,
    /// A hand-off to balance the processes.
    HandedOff,
}

impl StepDown {
    /// Whether this owner must not acquire again under the pin it held: the pin is to go to
    /// another process (or, once it lapses, to this one under a new pin).
    pub(crate) fn refuses_pin(self) -> bool {
        matches!(
            self,
            StepDown::PinLost | StepDown::PinMoved | StepDown::Fenced | StepDown::CrashLoop
        )
    }

    /// Whether the owner keeps its entity states for a claim of the next generation
    /// (`owner/warm.rs`): it left for a reason of the pin's or the delivery's, not because
    /// another owner claimed the partition (fenced) or its entities fail.
    pub(crate) fn keeps_warm(self) -> bool {
        matches!(
            self,
            StepDown::PinLost | StepDown::PinMoved | StepDown::DeliveriesLost
        )
    }
}

impl StepDown {
    /// The `reason` label of `jetshard_step_downs_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            StepDown::PinLost => "pin_lost",
            StepDown::PinMoved => "pin_moved",
            StepDown::DeliveriesLost => "deliveries_lost",
            StepDown::Fenced => "fenced",
            StepDown::CrashLoop => "crash_loop",
            StepDown::PullLoopEnded => "pull_loop_ended",
            StepDown::Released => "released",
            StepDown::HandedOff => "handed_off",
        }
    }
}

impl fmt::Display for StepDown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StepDown::PinLost => "pin lost",
            StepDown::PinMoved => "pin moved",
            StepDown::DeliveriesLost => "deliveries lost in transit",
            StepDown::Fenced => "fenced: a newer generation owns the partition",
            StepDown::CrashLoop => "entity actors crash too often",
            StepDown::PullLoopEnded => "pull loop ended",
            StepDown::Released => "released",
            StepDown::HandedOff => "handed off",
        })
    }
}

/// One thing the owner does about a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SettleStep {
    /// Done: out of the queue; acknowledged (`terminate`: for good, no redelivery) if this
    /// process holds its delivery; the outcome told to the client who asked.
    Finish {
        terminate: bool,
        answer: CommandOutcome,
    },
    /// Give it up: a dead-letter record (written by the entity, in its order), then finished as
    /// terminated. It stays first in its entity's queue until then.
    GiveUp { reason: String },
    /// Keep it first; retry it here at this time, spending no delivery.
    RetryAt(Instant),
    /// Keep it first; hand it back to the server to be delivered again after this delay.
    Nak(Duration),
    /// Keep it first; it was never this process's to nak: wait for the server to redeliver it.
    AwaitRedelivery,
    /// Count an entity actor's crash against the partition's restart window.
    CountCrash,
    /// Mark the entity quarantined.
    Quarantine(Quarantine),
    /// Stop owning the partition.
    StepDown(StepDown),
}

/// What a verdict comes to: up to three steps, carried out in order. Kept inline: the owner
/// settles every command, and a `Vec` was an allocation each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settled([Option<SettleStep>; 3]);

impl Settled {
    /// One step.
    pub(crate) fn one(step: SettleStep) -> Self {
        Self([Some(step), None, None])
    }

    /// Two steps, `first` first.
    fn two(first: SettleStep, second: SettleStep) -> Self {
        Self([Some(first), Some(second), None])
    }

    /// Takes the next step out, in order. In place: an iterator beside the steps would
    /// double their room in the owner's `handle` future, which awaits between them.
    pub(crate) fn take_next(&mut self) -> Option<SettleStep> {
        self.0.iter_mut().find_map(Option::take)
    }

    /// `step` first, then these (`settle` gives at most two: none is lost).
    pub(crate) fn after(step: SettleStep, then: Self) -> Self {
        let [a, b, dropped] = then.0;
        debug_assert!(dropped.is_none(), "settle gives at most two steps");
        Self([Some(step), a, b])
    }
}

impl IntoIterator for Settled {
    type Item = SettleStep;
    type IntoIter = std::iter::Flatten<std::array::IntoIter<Option<SettleStep>, 3>>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter().flatten()
    }
}

impl PartialEq<Vec<SettleStep>> for Settled {
    fn eq(&self, other: &Vec<SettleStep>) -> bool {
        self.0.iter().flatten().eq(other.iter())
    }
}

/// Local retries of unconfirmed writes back off up to this.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// How many isolated owners in a row must have died with a command first in hand before it is
/// given up. One death proves nothing: a process can be killed from outside (a node drained, an
/// OOM kill, an operator) while it runs an innocent command alone, and that command, in hand
/// beside the poison at every death before isolation, is past `max_deliver` as well. Two in a
/// row, the same command running alone each time, are not chance; a command that kills its
/// owners reaches two at the cost of one more death.
pub(crate) const ISOLATED_DEATHS: u32 = 2;

/// Whether the first command in hand at an isolated acquisition is given up before it is decoded
/// or decided, and why: it was first in hand when [`ISOLATED_DEATHS`] isolated owners in a row
/// died (`runs`), and it has been in hand for more deliveries than allowed (takeovers included).
pub(crate) fn suspect(runs: u32, deliveries: u64, policy: &Policy) -> Option<String> {
    (runs >= ISOLATED_DEATHS && deliveries > policy.max_deliver).then(|| {
        format!(
            "delivered {deliveries} times (takeovers included), more than max_deliver {}, and running when {runs} owner(s) in a row died: given up before decoding",
            policy.max_deliver
        )
    })
}

/// Decides what becomes of the command `head` given its entity's `verdict`.
pub(crate) fn settle(head: &Head, verdict: Verdict, policy: &Policy, now: Instant) -> Settled {
    let seq = head.seq;
    let finish = |terminate, answer| Settled::one(SettleStep::Finish { terminate, answer });
    match verdict {
        Verdict::Applied { events } => finish(
            false,
            CommandOutcome::Applied {
                command_seq: seq,
                events,
            },
        ),
        Verdict::Duplicate { earlier } => finish(
            false,
            earlier.map_or(CommandOutcome::Duplicate { command_seq: seq }, |e| {
                e.to_outcome(seq)
            }),
        ),
        Verdict::Rejected(reason) => finish(
            false,
            CommandOutcome::Rejected {
                command_seq: seq,
                reason,
            },
        ),
        Verdict::DeadLettered(reason) => finish(
            true,
            CommandOutcome::DeadLettered {
                command_seq: seq,
                reason,
            },
        ),
        Verdict::Fenced => Settled::one(SettleStep::StepDown(StepDown::Fenced)),
        Verdict::Failed(Failure::Unconfirmed(_)) => {
            let delay = backoff(
                policy.retry_delay,
                u64::from(head.attempts) + 1,
                MAX_RETRY_DELAY,
            );
            Settled::one(SettleStep::RetryAt(now + delay))
        }
        Verdict::Failed(Failure::Refused(reason)) => Settled::one(SettleStep::GiveUp {
            reason: format!("can never be written: {reason}"),
        }),
        Verdict::Failed(Failure::Quarantined(quarantine)) => {
            let reason = quarantine.dead_letter_reason();
            Settled::two(
                SettleStep::Quarantine(quarantine),
                SettleStep::GiveUp { reason },
            )
        }
        Verdict::Failed(Failure::Crashed(reason)) => {
            let next = if head.deliveries >= policy.max_deliver {
                SettleStep::GiveUp {
                    reason: format!(
                        "failed at each of {} deliveries; last: {reason}",
                        head.deliveries
                    ),
                }
            } else if head.delivered {
                SettleStep::Nak(backoff(
                    policy.retry_delay,
                    head.deliveries,
                    policy.ack_wait,
                ))
            } else {
                SettleStep::AwaitRedelivery
            };
            Settled::two(SettleStep::CountCrash, next)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::entity_actor::outcome_header::LastOutcome;

    const POLICY: Policy = Policy {
        max_deliver: 3,
        retry_delay: Duration::from_millis(100),
        ack_wait: Duration::from_secs(2),
    };

    fn head(deliveries: u64, delivered: bool) -> Head {
        Head {
            seq: 7,
            deliveries,
            attempts: 0,
            delivered,
        }
    }

    #[test]
    fn done_commands_are_acknowledged_and_answered() {
        let now = Instant::now();
        assert_eq!(
            settle(&head(1, true), Verdict::Applied { events: 2 }, &POLICY, now),
            vec![SettleStep::Finish {
                terminate: false,
                answer: CommandOutcome::Applied {
                    command_seq: 7,
                    events: 2
                }
            }]
        );
        assert_eq!(
            settle(
                &head(1, true),
                Verdict::DeadLettered("x".into()),
                &POLICY,
                now
            ),
            vec![SettleStep::Finish {
                terminate: true,
                answer: CommandOutcome::DeadLettered {
                    command_seq: 7,
                    reason: "x".into()
                }
            }]
        );
    }

    #[test]
    fn a_redelivery_is_told_what_happened_the_first_time() {
        let now = Instant::now();
        let earlier = Some(LastOutcome::Rejected("no funds".into()));
        assert_eq!(
            settle(&head(2, true), Verdict::Duplicate { earlier }, &POLICY, now),
            vec![SettleStep::Finish {
                terminate: false,
                answer: CommandOutcome::Rejected {
                    command_seq: 7,
                    reason: "no funds".into()
                }
            }]
        );
        assert_eq!(
            settle(
                &head(2, true),
                Verdict::Duplicate { earlier: None },
                &POLICY,
                now
            ),
            vec![SettleStep::Finish {
                terminate: false,
                answer: CommandOutcome::Duplicate { command_seq: 7 }
            }]
        );
    }

    #[test]
    fn unconfirmed_writes_retry_here_backing_off_without_spending_deliveries() {
        let now = Instant::now();
        let failed = || Verdict::Failed(Failure::Unconfirmed("timeout".into()));
        let mut h = head(1, true);
        assert_eq!(
            settle(&h, failed(), &POLICY, now),
            vec![SettleStep::RetryAt(now + Duration::from_millis(100))]
        );
        h.attempts = 3;
        assert_eq!(
            settle(&h, failed(), &POLICY, now),
            vec![SettleStep::RetryAt(now + Duration::from_millis(800))]
        );
        h.attempts = 30;
        assert_eq!(
            settle(&h, failed(), &POLICY, now),
            vec![SettleStep::RetryAt(now + MAX_RETRY_DELAY)]
        );
    }

    #[test]
    fn crashes_spend_deliveries_then_give_up() {
        let now = Instant::now();
        let crashed = || Verdict::Failed(Failure::Crashed("boom".into()));
        assert_eq!(
            settle(&head(1, true), crashed(), &POLICY, now),
            vec![
                SettleStep::CountCrash,
                SettleStep::Nak(Duration::from_millis(100))
            ]
        );
        assert_eq!(
            settle(&head(2, false), crashed(), &POLICY, now),
            vec![SettleStep::CountCrash, SettleStep::AwaitRedelivery]
        );
        let last: Vec<SettleStep> = settle(&head(3, true), crashed(), &POLICY, now)
            .into_iter()
            .collect();
        assert!(
            matches!(&last[..], [SettleStep::CountCrash, SettleStep::GiveUp { reason }] if reason.contains("3 deliveries") && reason.contains("boom")),
            "{last:?}"
        );
    }

    #[test]
    fn writes_that_can_never_succeed_and_quarantined_entities_give_up_at_once() {
        let now = Instant::now();
        let refused: Vec<SettleStep> = settle(
            &head(1, true),
            Verdict::Failed(Failure::Refused("too big".into())),
            &POLICY,
            now,
        )
        .into_iter()
        .collect();
        assert!(
            matches!(&refused[..], [SettleStep::GiveUp { .. }]),
            "{refused:?}"
        );
        let q = Quarantine {
            journal_seq: 42,
            reason: "event at journal seq 42 does not decode".into(),
            last_command_seq: 5,
        };
        let steps: Vec<SettleStep> = settle(
            &head(1, true),
            Verdict::Failed(Failure::Quarantined(q.clone())),
            &POLICY,
            now,
        )
        .into_iter()
        .collect();
        assert_eq!(steps[0], SettleStep::Quarantine(q));
        assert!(
            matches!(&steps[1], SettleStep::GiveUp { reason } if reason.contains("quarantined") && reason.contains("42"))
        );
    }

    #[test]
    fn a_fenced_write_steps_down() {
        assert_eq!(
            settle(&head(1, true), Verdict::Fenced, &POLICY, Instant::now()),
            vec![SettleStep::StepDown(StepDown::Fenced)]
        );
    }

    #[test]
    fn a_suspect_past_the_delivery_limit_is_given_up_before_decoding() {
        assert_eq!(
            suspect(0, 9, &POLICY),
            None,
            "no owner died running it alone"
        );
        assert_eq!(
            suspect(1, 9, &POLICY),
            None,
            "one isolated owner died running it: maybe killed from outside"
        );
        assert_eq!(suspect(2, 3, &POLICY), None, "within the limit");
        let reason = suspect(2, 4, &POLICY).unwrap();
        assert!(reason.contains("delivered 4 times"), "{reason}");
        assert!(reason.contains("2 owner(s) in a row died"), "{reason}");
    }
}
