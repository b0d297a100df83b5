//! The codec of `Jetshard-Last-Outcome`: what an entity's last command came to, as stored with
//! its events and snapshots, so that a redelivered command is answered as it was.

use crate::data::CommandOutcome;

/// What the last command of an entity came to (kept small: one per dormant entity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LastOutcome {
    Applied { events: u32 },
    Rejected(Box<str>),
    DeadLettered(Box<str>),
}

impl LastOutcome {
    /// As written in a snapshot (header `Jetshard-Last-Outcome`).
    pub(crate) fn to_header(&self) -> String {
        match self {
            LastOutcome::Applied { events } => format!("applied {events}"),
            LastOutcome::Rejected(reason) => format!("rejected {reason}"),
            LastOutcome::DeadLettered(reason) => format!("dead_lettered {reason}"),
        }
    }

    /// Reads [`to_header`](Self::to_header)'s text back; `None` if it is not one.
    pub(crate) fn from_header(text: &str) -> Option<Self> {
        let (kind, rest) = text.split_once(' ').unwrap_or((text, ""));
        match kind {
            "applied" => Some(LastOutcome::Applied {
                events: rest.parse().ok()?,
            }),
            "rejected" => Some(LastOutcome::Rejected(rest.into())),
            "dead_lettered" => Some(LastOutcome::DeadLettered(rest.into())),
            _ => None,
        }
    }

    pub(crate) fn to_outcome(&self, command_seq: u64) -> CommandOutcome {
        match self {
            LastOutcome::Applied { events } => CommandOutcome::Applied {
                command_seq,
                events: *events as usize,
            },
            LastOutcome::Rejected(reason) => CommandOutcome::Rejected {
                command_seq,
                reason: reason.to_string(),
            },
            LastOutcome::DeadLettered(reason) => CommandOutcome::DeadLettered {
                command_seq,
                reason: reason.to_string(),
            },
        }
    }
}
