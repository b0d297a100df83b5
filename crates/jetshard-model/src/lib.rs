//! A model of jetshard's partition ownership protocol, checked with
//! [`stateright`](https://docs.rs/stateright): claim (a fence record published with a
//! compare-and-set), the server's pin (assigned on a delivery, kept by pulls, lapsing after its
//! TTL, moved by an unpin), the crash watch's verdict and its unpin record, hand-off,
//! group-committed fenced writes, acknowledgements, redeliveries and the delivery count that
//! decides when a failing command is given up, and the warm re-claim (an owner whose pin moved
//! keeps its entity states for its next claim if that claim is the next generation; a fenced
//! write or a hand-off keeps none).
//! Processes crash and stall.
//!
//! What each part stands for in the library, what the model leaves out and how to run it:
//! `docs/MODEL.md`. The checks are the crate's tests (`cargo test -p jetshard-model`).

#![deny(missing_docs)]

mod ownership;
mod phase;
mod state;
mod step;

pub use ownership::*;
pub use phase::*;
pub use state::*;

/// Deliberate bugs, each the removal of one safeguard of the protocol. The tests show that each
/// one breaks a property (the checker finds a counterexample).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Bugs {
    /// A claim publishes its fence record without the expected-last-sequence check
    /// (`fence::claim` without `expected_last_subject_sequence`).
    pub claim_without_cas: bool,
    /// The crash watch unpins without first storing the deduplicated unpin record
    /// (`crash::unpin_if_still_owned` without `first_to_unpin`).
    pub unpin_without_record: bool,
    /// A command is acknowledged as soon as its events are sent, not once they are stored.
    pub ack_before_durable: bool,
    /// Journal writes carry no fence headers: the server stores them whatever the latest fence.
    pub write_without_fence: bool,
    /// A claim keeps the warm entities whatever generation it wins, not only the one after
    /// theirs (`takeover.rs` without the `generation + 1` check).
    pub warm_without_fence_chain: bool,
    /// A step-down keeps an entity warm although its write is in doubt (sent, unanswered).
    pub warm_in_doubt: bool,
}

/// How many isolated owners in a row must have died with a command first in hand before it is
/// given up (`settle::ISOLATED_DEATHS`; `tests/drift.rs` holds the two equal).
pub const ISOLATED_DEATHS: u8 = 2;

/// The bounds of one model: how many processes, partitions and commands, and which faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Config {
    /// Processes (2-3 is what the tests check).
    pub processes: u8,
    /// Partitions (1-2).
    pub partitions: u8,
    /// Commands per partition, all for one entity (applied in order), published up front.
    pub commands: u8,
    /// A command (partition, index) that fails every time it runs, to be given up.
    pub failing: Option<(u8, u8)>,
    /// A command (partition, index) that kills the process that runs it (it is given up once
    /// claims have counted it in hand at `max_deliver` deaths, in isolation: `fence::Trial`).
    pub poison: Option<(u8, u8)>,
    /// Deliveries (takeovers included) after which a failing command is given up.
    pub max_deliver: u8,
    /// Process crashes (SIGKILL: the process is gone for good).
    pub crashes: u8,
    /// Process stalls (SIGSTOP: no step of its own, no pull, its connection stays; SIGCONT later).
    pub stalls: u8,
    /// Hand-offs (an owner releasing a partition to balance the processes).
    pub hand_offs: u8,
    /// Safeguards removed.
    pub bugs: Bugs,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            processes: 2,
            partitions: 1,
            commands: 2,
            failing: None,
            poison: None,
            max_deliver: 2,
            crashes: 1,
            stalls: 1,
            hand_offs: 1,
            bugs: Bugs::default(),
        }
    }
}
