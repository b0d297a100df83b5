//! Generations: the compare-and-set fence record that makes one owner's writes valid.
//!
//! When an owner takes a partition it publishes the next fence record on `<t>.fence.<p>`,
//! expecting the subject's last sequence to be the one it read. Two claimants can never both win
//! the same generation, and every later journal write is checked by the server against the
//! sequence of the fence record its writer won (see [`crate::journal`]).
//!
//! Architecture Invariant: only this module writes fence records.

use async_nats::HeaderMap;
use async_nats::header::IntoHeaderName;
use async_nats::jetstream::context::{Context, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use serde::{Deserialize, Serialize};

use crate::error::{BoxError, Error};
use crate::wire::{HDR_GENERATION, Names};

/// The fence an owner holds: its generation and the journal sequence of its fence record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fence {
    pub(crate) generation: u64,
    pub(crate) seq: u64,
}

/// A fence record's body (JSON). Unknown fields are ignored, so later versions may add some.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceRecord {
    /// The partition.
    pub partition: u32,
    /// The generation this record starts.
    pub generation: u64,
    /// The node that claimed it.
    pub node: String,
}

/// A fence record that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FenceRecordError {
    /// The body is not a fence record.
    #[error("fence record body is not valid: {0}")]
    Body(String),
    /// The `Jetshard-Generation` header is missing or not a number.
    #[error("fence record has no valid Jetshard-Generation header")]
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

/// Reads a header as a decimal `u64`.
pub(crate) fn header_u64(headers: &HeaderMap, name: impl IntoHeaderName) -> Option<u64> {
    headers
        .get(name)
        .and_then(|v| v.as_str().trim().parse().ok())
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

/// Claims the next generation of `partition` for `node`.
pub(crate) async fn claim(
    js: &Context,
    journal: &Stream<()>,
    names: &Names,
    partition: u32,
    node: &str,
) -> Result<Fence, ClaimError> {
    const ATTEMPTS: u32 = 3;
    let subject = names.fence_subject(partition);
    for _ in 0..ATTEMPTS {
        let (previous_seq, previous_generation) = match latest(journal, names, partition).await? {
            Some((seq, record)) => (seq, record.generation),
            None => (0, 0),
        };
        let generation = previous_generation + 1;
        let record = FenceRecord {
            partition,
            generation,
            node: node.to_owned(),
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
                return Ok(Fence {
                    generation,
                    seq: ack.sequence,
                });
            }
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => continue,
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

    #[test]
    fn a_fence_record_round_trips() {
        let record = FenceRecord {
            partition: 3,
            generation: 7,
            node: "n1".into(),
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
