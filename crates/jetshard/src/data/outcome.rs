//! What became of a command: the outcome a reply carries and the journal records.

use serde::{Deserialize, Serialize};

/// What became of a command, as told to a client that asked (`Jetshard-Reply-To`; JSON with an
/// `outcome` tag, see docs/WIRE.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum CommandOutcome {
    /// Its events are durable.
    Applied {
        /// The command's stream sequence.
        command_seq: u64,
        /// How many events it wrote.
        events: usize,
    },
    /// The entity refused it; nothing was written.
    Rejected {
        /// The command's stream sequence.
        command_seq: u64,
        /// The entity's reason.
        reason: String,
    },
    /// It had been processed before (this was a redelivery), and what it came to then is not
    /// known here any more. A redelivery whose first outcome is known is answered with that
    /// outcome instead (applied, rejected or dead-lettered).
    Duplicate {
        /// The command's stream sequence.
        command_seq: u64,
    },
    /// It was given up: undecodable, or failing at every delivery.
    DeadLettered {
        /// The command's stream sequence.
        command_seq: u64,
        /// Why.
        reason: String,
    },
}
