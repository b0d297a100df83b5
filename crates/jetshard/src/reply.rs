//! Typed replies: what a client that asked ([`CommandSender::request`]) learns of its command.
//!
//! On the wire the reply stays the JSON [`CommandOutcome`] of docs/WIRE.md (so a client that
//! reads only that keeps working), with two optional fields for a client that knows the entity's
//! types: `event_payloads` (the command's events, each encoded with the entity type's codec, then
//! base64) and `rejection_payload` (the entity's rejection, likewise). [`Reply`] is that outcome
//! decoded into the entity's own types.
//!
//! [`CommandSender::request`]: crate::CommandSender::request

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

use crate::codec::Codec;
use crate::data::CommandOutcome;
use crate::entity::{Entity, decode_event};
use crate::error::CodecError;

/// What became of a command, in the entity's own types.
#[non_exhaustive]
pub enum Reply<E: Entity> {
    /// Its events are durable; these are they, in order.
    Applied {
        /// The command's stream sequence.
        command_seq: u64,
        /// The events it wrote (possibly none).
        events: Vec<E::Event>,
    },
    /// The entity refused it; nothing was written.
    Rejected {
        /// The command's stream sequence.
        command_seq: u64,
        /// The entity's rejection, as `decide` returned it.
        rejection: E::Rejection,
    },
    /// The caller sent the same idempotency key twice
    /// ([`request_with_key`](crate::CommandSender::request_with_key)) and the command's answer
    /// went out before this send listened; or, rarely, a redelivered command whose first outcome
    /// the owner cannot give again in typed form (a rejection known only from a snapshot, an
    /// older command redelivered after later ones). A command applied by an owner that stopped
    /// before answering is answered [`Reply::Applied`] with its events, read back from the
    /// journal. `earlier` is its first outcome, untyped, when known.
    Duplicate {
        /// The command's stream sequence.
        command_seq: u64,
        /// Its first outcome, if the owner knows it (`Applied` with the event count, `Rejected`
        /// with the reason's text, `DeadLettered`).
        earlier: Option<CommandOutcome>,
    },
    /// It was given up: undecodable, or failing at every delivery.
    DeadLettered {
        /// The command's stream sequence.
        command_seq: u64,
        /// Why.
        reason: String,
    },
}

impl<E: Entity> Reply<E> {
    /// The command's stream sequence.
    pub fn command_seq(&self) -> u64 {
        match self {
            Reply::Applied { command_seq, .. }
            | Reply::Rejected { command_seq, .. }
            | Reply::Duplicate { command_seq, .. }
            | Reply::DeadLettered { command_seq, .. } => *command_seq,
        }
    }
}

impl<E: Entity> std::fmt::Debug for Reply<E>
where
    E::Event: std::fmt::Debug,
    E::Rejection: std::fmt::Debug,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reply::Applied {
                command_seq,
                events,
            } => f
                .debug_struct("Applied")
                .field("command_seq", command_seq)
                .field("events", events)
                .finish(),
            Reply::Rejected {
                command_seq,
                rejection,
            } => f
                .debug_struct("Rejected")
                .field("command_seq", command_seq)
                .field("rejection", rejection)
                .finish(),
            Reply::Duplicate {
                command_seq,
                earlier,
            } => f
                .debug_struct("Duplicate")
                .field("command_seq", command_seq)
                .field("earlier", earlier)
                .finish(),
            Reply::DeadLettered {
                command_seq,
                reason,
            } => f
                .debug_struct("DeadLettered")
                .field("command_seq", command_seq)
                .field("reason", reason)
                .finish(),
        }
    }
}

/// The typed part of an outcome, encoded by the entity actor for a client that asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Detail {
    /// The command's events, each as the codec encoded it for the journal.
    Events(Vec<Vec<u8>>),
    /// The entity's rejection, encoded with the codec.
    Rejection(Vec<u8>),
}

/// The reply's JSON body: the outcome, and the typed detail if there is one.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ReplyBody {
    #[serde(flatten)]
    pub(crate) outcome: CommandOutcome,
    /// Present (possibly empty) on the first answer of an applied command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) event_payloads: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rejection_payload: Option<String>,
}

impl ReplyBody {
    /// The body of `outcome`, with `detail` if it belongs to it.
    pub(crate) fn new(outcome: CommandOutcome, detail: Option<&Detail>) -> Self {
        let (mut event_payloads, mut rejection_payload) = (None, None);
        match (&outcome, detail) {
            (CommandOutcome::Applied { .. }, Some(Detail::Events(events))) => {
                event_payloads = Some(events.iter().map(|e| BASE64.encode(e)).collect());
            }
            (CommandOutcome::Rejected { .. }, Some(Detail::Rejection(rejection))) => {
                rejection_payload = Some(BASE64.encode(rejection));
            }
            _ => {}
        }
        Self {
            outcome,
            event_payloads,
            rejection_payload,
        }
    }

    /// Decodes the body into the entity's types. An applied or rejected outcome without its
    /// payload is the answer to a redelivery: a [`Reply::Duplicate`] naming it.
    pub(crate) fn into_reply<E: Entity>(self, codec: Codec) -> Result<Reply<E>, CodecError> {
        let unbase = |s: &str| {
            BASE64
                .decode(s)
                .map_err(|e| CodecError::Decode(format!("the reply payload: not base64: {e}")))
        };
        Ok(
            match (self.outcome, self.event_payloads, self.rejection_payload) {
                (CommandOutcome::Applied { command_seq, .. }, Some(payloads), _) => {
                    let mut events = Vec::with_capacity(payloads.len());
                    for payload in &payloads {
                        events.push(decode_event::<E>(
                            E::EVENT_VERSION,
                            &unbase(payload)?,
                            codec,
                        )?);
                    }
                    Reply::Applied {
                        command_seq,
                        events,
                    }
                }
                (CommandOutcome::Rejected { command_seq, .. }, _, Some(payload)) => {
                    Reply::Rejected {
                        command_seq,
                        rejection: codec.decode(&unbase(&payload)?)?,
                    }
                }
                (CommandOutcome::Duplicate { command_seq }, _, _) => Reply::Duplicate {
                    command_seq,
                    earlier: None,
                },
                (
                    CommandOutcome::DeadLettered {
                        command_seq,
                        reason,
                    },
                    _,
                    _,
                ) => Reply::DeadLettered {
                    command_seq,
                    reason,
                },
                (earlier, _, _) => Reply::Duplicate {
                    command_seq: outcome_seq(&earlier),
                    earlier: Some(earlier),
                },
            },
        )
    }
}

fn outcome_seq(outcome: &CommandOutcome) -> u64 {
    match outcome {
        CommandOutcome::Applied { command_seq, .. }
        | CommandOutcome::Rejected { command_seq, .. }
        | CommandOutcome::Duplicate { command_seq }
        | CommandOutcome::DeadLettered { command_seq, .. } => *command_seq,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_entity::Counter;

    fn round_trip(body: ReplyBody) -> Reply<Counter> {
        let json = serde_json::to_vec(&body).unwrap();
        let body: ReplyBody = serde_json::from_slice(&json).unwrap();
        body.into_reply::<Counter>(Codec::Bincode).unwrap()
    }

    #[test]
    fn an_applied_reply_carries_the_events_and_stays_a_command_outcome() {
        let codec = Codec::Bincode;
        let events = vec![codec.encode(&7u32).unwrap(), codec.encode(&8u32).unwrap()];
        let outcome = CommandOutcome::Applied {
            command_seq: 3,
            events: 2,
        };
        let body = ReplyBody::new(outcome.clone(), Some(&Detail::Events(events)));
        let json = serde_json::to_vec(&body).unwrap();
        // An untyped reader still reads the outcome.
        assert_eq!(
            serde_json::from_slice::<CommandOutcome>(&json).unwrap(),
            outcome
        );
        assert!(matches!(
            round_trip(body),
            Reply::Applied { command_seq: 3, events } if events == vec![7, 8]
        ));
    }

    #[test]
    fn a_rejection_comes_back_typed() {
        let rejection = Codec::Bincode.encode(&"too much".to_owned()).unwrap();
        let outcome = CommandOutcome::Rejected {
            command_seq: 4,
            reason: "too much".into(),
        };
        let body = ReplyBody::new(outcome, Some(&Detail::Rejection(rejection)));
        assert!(matches!(
            round_trip(body),
            Reply::Rejected { command_seq: 4, rejection } if rejection == "too much"
        ));
    }

    #[test]
    fn an_outcome_without_its_payload_is_a_duplicate() {
        let outcome = CommandOutcome::Applied {
            command_seq: 5,
            events: 1,
        };
        let body = ReplyBody::new(outcome.clone(), None);
        assert!(matches!(
            round_trip(body),
            Reply::Duplicate { command_seq: 5, earlier: Some(o) } if o == outcome
        ));
    }
}
