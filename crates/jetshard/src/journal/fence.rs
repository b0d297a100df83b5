//! Generations: the compare-and-set fence record that makes one owner's writes valid.
//!
//! When an owner takes a partition it publishes the next fence record on `<t>.fence.<p>`,
//! expecting the subject's last sequence to be the one it read. Two claimants can never both win
//! the same generation, and every later journal write is checked by the server against the
//! sequence of the fence record its writer won (see [`crate::journal`]).
//!
//! Architecture Invariant: only this module writes fence records.

use async_nats::HeaderMap;
use async_nats::jetstream::context::{Context, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use serde::{Deserialize, Serialize};

use crate::error::{BoxError, Error};
use crate::wire::{HDR_GENERATION, Names, header_u64};

/// The fence an owner holds: its generation and the journal sequence of its fence record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fence {
    pub(crate) generation: u64,
    pub(crate) seq: u64,
}

/// What a won claim tells: the fence, the commands in hand it found (see [`HeldRange`]), and
/// whether to run them in isolation.
#[derive(Debug)]
pub(crate) struct Claimed {
    pub(crate) fence: Fence,
    pub(crate) held: Vec<HeldRange>,
    pub(crate) trial: Option<Trial>,
}

/// What a claimant knows of the commands in hand before it claims.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct InHand {
    /// Those delivered to earlier owners: counted (inclusive range; `None`: none).
    pub(crate) counted: Option<(u64, u64)>,
    /// The first of them that is a command of this partition.
    pub(crate) head: Option<u64>,
    /// Isolate once a command has been in hand at this many claims in a row.
    pub(crate) isolate_at: u32,
}

/// The trial of a claim: whether it isolates, and how often its head was first in hand at an
/// isolated owner's death (`died`: whether the previous owner's process is gone).
pub(crate) fn trial(
    previous: Option<Trial>,
    held: &[HeldRange],
    in_hand: &InHand,
    died: bool,
) -> Option<Trial> {
    let head = in_hand.head?;
    let suspect = held.iter().any(|r| r.claims >= in_hand.isolate_at.max(1));
    if !suspect || claims_holding(held, head) == 0 {
        return None;
    }
    let more = u32::from(died);
    let runs = match previous {
        // The previous owner ran one command at a time: it died with `head` first in hand.
        Some(t) if t.seq == head => t.runs.saturating_add(more),
        Some(_) => more,
        // Commands ran side by side: nothing tells which one was running.
        None => 0,
    };
    Some(Trial { seq: head, runs })
}

/// A fence record's body (JSON). Unknown fields are ignored, so later versions may add some.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct FenceRecord {
    /// The partition.
    pub partition: u32,
    /// The generation this record starts.
    pub generation: u64,
    /// The node that claimed it.
    pub node: String,
    /// The claiming process's incarnation: it answers on `<t>.alive.<incarnation>` while it
    /// runs, so that the next claimant can tell a takeover after its death from one after it lost
    /// the pin alive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<String>,
    /// The pin (`Nats-Pin-Id`) the claimant held the partition's consumer under: a process that
    /// finds the claimant dead unpins the consumer only while it is still pinned to this pin,
    /// so that a partition is moved once, not once per process that noticed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<String>,
    /// The commands in hand at the claim, delivered to earlier owners and not acknowledged
    /// (the consumer's `(ack floor, delivered]`, in command-stream sequences), each range with
    /// how many claims in a row found it in hand after the previous owner died: a command that
    /// kills every process that runs it is counted here, since its process cannot count it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<HeldRange>,
    /// Set when the claimant suspects a command that kills its owners (a command was in hand at
    /// two claims in a row): it runs the commands in hand one at a time, in order, so that the
    /// first one still in hand at the next claim is the one that was running at its death.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trial: Option<Trial>,
}

/// The first command in hand at a claim made in isolation (see [`FenceRecord::trial`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trial {
    /// Its command-stream sequence.
    pub seq: u64,
    /// How many owners in a row, each running the commands in hand one at a time, stopped with
    /// it first in hand: the owners it most likely killed.
    pub runs: u32,
}

/// Commands `first..=last` of the command stream, found in hand by `claims` claims in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldRange {
    /// The first command-stream sequence.
    pub first: u64,
    /// The last command-stream sequence.
    pub last: u64,
    /// Claims in a row that found these commands in hand.
    pub claims: u32,
}

/// The most ranges a fence record keeps (the longest runs of claims win).
const MAX_HELD_RANGES: usize = 64;

/// The ranges of a new claim: the commands in hand now, `window` (inclusive; `None` if nothing
/// is in hand), each counted once more than the previous claim counted it if the previous owner
/// `died` (its process is gone), as often as before if it is alive (it lost the pin; whatever
/// it held did not kill it). Commands counted 0 times are not kept.
pub(crate) fn hold(
    previous: &[HeldRange],
    window: Option<(u64, u64)>,
    died: bool,
) -> Vec<HeldRange> {
    let Some((first, last)) = window.filter(|(first, last)| first <= last) else {
        return Vec::new();
    };
    let more = u32::from(died);
    let mut ranges = Vec::new();
    let mut next = first;
    let mut earlier: Vec<&HeldRange> = previous
        .iter()
        .filter(|r| r.first <= last && r.last >= first)
        .collect();
    earlier.sort_by_key(|r| r.first);
    for range in earlier {
        let (from, to) = (range.first.max(next), range.last.min(last));
        if from > to {
            continue;
        }
        if from > next {
            ranges.push(HeldRange {
                first: next,
                last: from - 1,
                claims: more,
            });
        }
        ranges.push(HeldRange {
            first: from,
            last: to,
            claims: range.claims.saturating_add(more),
        });
        next = to + 1;
    }
    if next <= last {
        ranges.push(HeldRange {
            first: next,
            last,
            claims: more,
        });
    }
    ranges.retain(|r| r.claims > 0);
    if ranges.len() > MAX_HELD_RANGES {
        let mut by_claims = ranges.clone();
        by_claims.sort_by_key(|r| std::cmp::Reverse(r.claims));
        let keep = by_claims[MAX_HELD_RANGES - 1].claims;
        ranges.retain(|r| r.claims >= keep);
        ranges.truncate(MAX_HELD_RANGES);
    }
    ranges
}

/// How many claims in a row found command `seq` in hand (0: none).
pub(crate) fn claims_holding(held: &[HeldRange], seq: u64) -> u32 {
    held.iter()
        .find(|r| r.first <= seq && seq <= r.last)
        .map_or(0, |r| r.claims)
}

/// A fence record that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FenceRecordError {
    /// The body is not a fence record.
    #[error("fence record body is not valid: {0}")]
    Body(String),
    /// The `Jetshard-Generation` header is missing or not a number.
    #[error("fence record has no valid {} header", HDR_GENERATION)]
    Header,
    /// Header and body disagree.
    #[error("fence record header says generation {header}, body says {body}")]
    Mismatch {
        /// From the header.
        header: u64,
        /// From the body.
        body: u64,
    },
}

impl FenceRecord {
    /// A record of `generation` of `partition` claimed by `node`, with nothing in hand.
    pub fn new(partition: u32, generation: u64, node: impl Into<String>) -> Self {
        Self {
            partition,
            generation,
            node: node.into(),
            incarnation: None,
            pin: None,
            held: Vec::new(),
            trial: None,
        }
    }

    /// Reads a stored fence record, checking its header against its body.
    ///
    /// # Errors
    /// [`FenceRecordError`] if either is malformed or they disagree.
    pub fn decode(headers: &HeaderMap, body: &[u8]) -> Result<Self, FenceRecordError> {
        let record: FenceRecord =
            serde_json::from_slice(body).map_err(|e| FenceRecordError::Body(e.to_string()))?;
        let header = header_u64(headers, HDR_GENERATION).ok_or(FenceRecordError::Header)?;
        if header != record.generation {
            return Err(FenceRecordError::Mismatch {
                header,
                body: record.generation,
            });
        }
        Ok(record)
    }
}

/// Why a claim failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClaimError {
    /// Another node claimed the partition at each attempt.
    #[error("lost the generation race {attempts} times")]
    Contended { attempts: u32 },
    /// The last fence record is unreadable; the partition needs an operator.
    #[error("latest fence record at sequence {seq} is unreadable: {source}")]
    Corrupt { seq: u64, source: FenceRecordError },
    /// The server could not be asked or written.
    #[error(transparent)]
    Server(#[from] Error),
}

/// The latest fence record of a partition: `(sequence, record)`, or `None` before the first.
pub(crate) async fn latest(
    journal: &Stream<()>,
    names: &Names,
    partition: u32,
) -> Result<Option<(u64, FenceRecord)>, ClaimError> {
    let subject = names.fence_subject(partition);
    match journal.get_last_raw_message_by_subject(&subject).await {
        Ok(message) => {
            let record =
                FenceRecord::decode(&message.headers, &message.payload).map_err(|source| {
                    ClaimError::Corrupt {
                        seq: message.sequence,
                        source,
                    }
                })?;
            Ok(Some((message.sequence, record)))
        }
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => {
            Err(Error::jetstream(format!("read the last fence record on {subject}"), e).into())
        }
    }
}

/// The server's code for "wrong last sequence" from a clustered stream while another write
/// naming the same expected subject is in flight (not the fence's 10071): try again.
const IN_FLIGHT_COLLISION: u64 = 10164;

/// Who claims: this process's node id, incarnation and the pin it holds the partition under.
pub(crate) struct Claimant<'a> {
    pub(crate) node: &'a str,
    pub(crate) incarnation: &'a str,
    pub(crate) pin: &'a str,
    /// Whether a previous owner's process is gone (the runtime's crash watch answers: a
    /// previous owner known dead is not probed for long again).
    pub(crate) liveness: &'a dyn Liveness,
}

/// Whether the process of an incarnation is gone, as a claim needs to know. The runtime's crash
/// watch implements it; the journal sees only this narrow handle, never the runtime.
pub(crate) trait Liveness: Sync {
    /// Dead (true), or alive or unknown (false).
    fn is_gone<'a>(&'a self, incarnation: &'a str) -> futures::future::BoxFuture<'a, bool>;
}

/// Claims the next generation of `partition` for `claimant`, counting the commands `in_hand`
/// into the record.
pub(crate) async fn claim(
    js: &Context,
    journal: &Stream<()>,
    names: &Names,
    partition: u32,
    claimant: Claimant<'_>,
    in_hand: InHand,
) -> Result<Claimed, ClaimError> {
    let Claimant {
        node,
        incarnation,
        pin,
        liveness,
    } = claimant;
    const ATTEMPTS: u32 = 6;
    let subject = names.fence_subject(partition);
    for attempt in 1..=ATTEMPTS {
        let (previous_seq, previous) = match latest(journal, names, partition).await? {
            Some((seq, record)) => (seq, Some(record)),
            None => (0, None),
        };
        let generation = previous.as_ref().map_or(0, |r| r.generation) + 1;
        // Whether the previous owner died only counts the commands in hand: with none, the
        // probe (up to 20 ms when its process is gone and not known dead yet) is skipped.
        let died = match previous.as_ref().and_then(|r| r.incarnation.as_deref()) {
            Some(theirs) if theirs != incarnation && in_hand.counted.is_some() => {
                liveness.is_gone(theirs).await
            }
            _ => false,
        };
        let held = hold(
            previous.as_ref().map_or(&[][..], |r| &r.held),
            in_hand.counted,
            died,
        );
        let trial = trial(previous.and_then(|r| r.trial), &held, &in_hand, died);
        let record = FenceRecord {
            partition,
            generation,
            node: node.to_owned(),
            incarnation: Some(incarnation.to_owned()),
            pin: (!pin.is_empty()).then(|| pin.to_owned()),
            held,
            trial,
        };
        let body = serde_json::to_vec(&record)
            .map_err(|e| Error::jetstream("encode a fence record", e))?;
        let publish = PublishMessage::build()
            .payload(body.into())
            .header(HDR_GENERATION, generation.to_string())
            .expected_last_subject_sequence(previous_seq);
        let result = async { js.send_publish(subject.clone(), publish).await?.await }.await;
        match result {
            Ok(ack) => {
                return Ok(Claimed {
                    fence: Fence {
                        generation,
                        seq: ack.sequence,
                    },
                    held: record.held,
                    trial: record.trial,
                });
            }
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => continue,
            Err(e) if crate::journal::server_error_code(&e) == Some(IN_FLIGHT_COLLISION) => {
                // A write of the previous owner naming the fence subject was in flight on a
                // clustered journal: read the latest record again and retry shortly.
                let delay = crate::retry::backoff(
                    std::time::Duration::from_millis(20),
                    u64::from(attempt),
                    std::time::Duration::from_millis(500),
                );
                tokio::time::sleep(delay).await;
                continue;
            }
            Err(e) => {
                let source: BoxError = Box::new(e);
                return Err(Error::JetStream {
                    context: format!("publish fence record {generation} on {subject}"),
                    source,
                }
                .into());
            }
        }
    }
    Err(ClaimError::Contended { attempts: ATTEMPTS })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(generation: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(HDR_GENERATION, generation);
        h
    }

    fn range(first: u64, last: u64, claims: u32) -> HeldRange {
        HeldRange {
            first,
            last,
            claims,
        }
    }

    #[test]
    fn a_claim_counts_the_commands_in_hand_once_more_than_the_claim_before() {
        assert_eq!(hold(&[], None, true), vec![]);
        assert_eq!(hold(&[], Some((5, 4)), true), vec![]);
        let first = hold(&[], Some((10, 20)), true);
        assert_eq!(first, vec![range(10, 20, 1)]);
        // The floor moved past 14; 21..=25 came in since.
        let second = hold(&first, Some((15, 25)), true);
        assert_eq!(second, vec![range(15, 20, 2), range(21, 25, 1)]);
        let third = hold(&second, Some((15, 25)), true);
        assert_eq!(third, vec![range(15, 20, 3), range(21, 25, 2)]);
        assert_eq!(claims_holding(&third, 17), 3);
        assert_eq!(claims_holding(&third, 25), 2);
        assert_eq!(claims_holding(&third, 26), 0);
        // The previous owner lost its pin alive: nothing it held killed it; counts carry over.
        assert_eq!(
            hold(&third, Some((15, 40)), false),
            vec![range(15, 20, 3), range(21, 25, 2)]
        );
        // Progress past everything: nothing carried over.
        assert_eq!(hold(&third, Some((30, 31)), true), vec![range(30, 31, 1)]);
        // A window inside an old range, and one spanning gaps between old ranges.
        assert_eq!(
            hold(&[range(1, 100, 4)], Some((50, 60)), true),
            vec![range(50, 60, 5)]
        );
        assert_eq!(
            hold(&[range(5, 6, 2), range(9, 9, 3)], Some((4, 10)), true),
            vec![
                range(4, 4, 1),
                range(5, 6, 3),
                range(7, 8, 1),
                range(9, 9, 4),
                range(10, 10, 1)
            ]
        );
    }

    #[test]
    fn a_claim_isolates_once_a_command_was_in_hand_twice_and_counts_the_heads_of_isolated_owners() {
        let in_hand = |head| InHand {
            counted: Some((10, 20)),
            head: Some(head),
            isolate_at: 2,
        };
        // In hand once: no suspicion.
        assert_eq!(trial(None, &[range(10, 20, 1)], &in_hand(10), true), None);
        // Twice: isolate; nothing known yet of who was running.
        let first = trial(None, &[range(10, 20, 2)], &in_hand(10), true);
        assert_eq!(first, Some(Trial { seq: 10, runs: 0 }));
        // The isolated owner died with 12 first in hand (10 and 11 were done), then again.
        let second = trial(first, &[range(12, 20, 3)], &in_hand(12), true);
        assert_eq!(second, Some(Trial { seq: 12, runs: 1 }));
        assert_eq!(
            trial(second, &[range(12, 20, 4)], &in_hand(12), true),
            Some(Trial { seq: 12, runs: 2 })
        );
        // Nothing in hand from earlier owners: no trial.
        let none = InHand {
            counted: None,
            head: None,
            isolate_at: 2,
        };
        assert_eq!(trial(second, &[], &none, true), None);
        // An isolated owner that lost its pin alive: its head did not kill it.
        assert_eq!(
            trial(second, &[range(12, 20, 4)], &in_hand(12), false),
            Some(Trial { seq: 12, runs: 1 })
        );
    }

    #[test]
    fn a_record_keeps_a_bounded_number_of_ranges_the_longest_held_first() {
        let many: Vec<HeldRange> = (0..200)
            .map(|i| range(i * 2, i * 2, 1 + (i % 3) as u32))
            .collect();
        let next = hold(&many, Some((0, 400)), true);
        assert!(next.len() <= MAX_HELD_RANGES);
        assert!(next.iter().all(|r| r.claims >= 3), "{next:?}");
    }

    #[test]
    fn a_fence_record_round_trips() {
        let record = FenceRecord {
            partition: 3,
            generation: 7,
            node: "n1".into(),
            incarnation: Some("abc".into()),
            pin: Some("p1n".into()),
            held: vec![range(4, 9, 2)],
            trial: Some(Trial { seq: 5, runs: 1 }),
        };
        let body = serde_json::to_vec(&record).unwrap();
        assert_eq!(FenceRecord::decode(&headers("7"), &body).unwrap(), record);
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let body = br#"{"partition":1,"generation":2,"node":"n","claimed_at":"x"}"#;
        assert_eq!(
            FenceRecord::decode(&headers("2"), body).unwrap().generation,
            2
        );
    }

    #[test]
    fn malformed_fence_records_are_typed_errors() {
        let body = br#"{"partition":1,"generation":2,"node":"n"}"#;
        assert!(matches!(
            FenceRecord::decode(&HeaderMap::new(), body),
            Err(FenceRecordError::Header)
        ));
        assert!(matches!(
            FenceRecord::decode(&headers("x"), body),
            Err(FenceRecordError::Header)
        ));
        assert!(matches!(
            FenceRecord::decode(&headers("3"), body),
            Err(FenceRecordError::Mismatch { header: 3, body: 2 })
        ));
        assert!(matches!(
            FenceRecord::decode(&headers("2"), b"{"),
            Err(FenceRecordError::Body(_))
        ));
    }
}
