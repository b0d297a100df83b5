//! The fence record: its body (JSON, with the commands in hand it counts) and its typed read.

use async_nats::HeaderMap;
use serde::{Deserialize, Serialize};

use crate::wire::{HDR_GENERATION, header_u64};

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
    pub(crate) held: Vec<HeldRange>,
    /// Set when the claimant suspects a command that kills its owners (a command was in hand at
    /// two claims in a row): it runs the commands in hand one at a time, in order, so that the
    /// first one still in hand at the next claim is the one that was running at its death.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) trial: Option<Trial>,
}

/// The first command in hand at a claim made in isolation (see [`FenceRecord::trial`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Trial {
    /// Its command-stream sequence.
    pub(crate) seq: u64,
    /// How many owners in a row, each running the commands in hand one at a time, stopped with
    /// it first in hand: the owners it most likely killed.
    pub(crate) runs: u32,
}

/// Commands `first..=last` of the command stream, found in hand by `claims` claims in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HeldRange {
    /// The first command-stream sequence.
    pub(crate) first: u64,
    /// The last command-stream sequence.
    pub(crate) last: u64,
    /// Claims in a row that found these commands in hand.
    pub(crate) claims: u32,
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
            incarnation: Some("abc".into()),
            pin: Some("p1n".into()),
            held: vec![HeldRange {
                first: 4,
                last: 9,
                claims: 2,
            }],
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
