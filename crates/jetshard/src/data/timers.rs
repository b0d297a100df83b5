//! Timers as data: the changes a command decides, an armed timer, a firing as delivered.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::HeaderMap;
use bytes::Bytes;

use crate::wire::{HDR_TIMER, HDR_TIMER_SET};

/// The longest timer name, in bytes.
pub const MAX_TIMER_NAME_LEN: usize = 64;

/// A change to an entity's timers, decided by a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TimerChange {
    /// Arm `name` (replacing an armed one of that name): `payload` is the command it sends.
    Set {
        name: String,
        due_ms: u64,
        /// Due this long after the record is written (then `due_ms` is set when it is).
        after: Option<Duration>,
        payload: Bytes,
    },
    /// Disarm `name`.
    Cancel { name: String },
}

/// An armed timer of one entity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Armed {
    /// The command sequence that set it.
    pub(crate) set_seq: u64,
    pub(crate) due_ms: u64,
    pub(crate) payload: Bytes,
}

/// A timer's command, as delivered: which timer fired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Firing {
    pub(crate) name: Box<str>,
    pub(crate) set_seq: u64,
}

/// What became of an entity's timers with one command, for the owner's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TimerReport {
    Armed { name: Box<str>, armed: Armed },
    Disarmed { name: Box<str> },
}

/// The timer's command read from a delivered command's headers.
pub(crate) fn firing_of(headers: Option<&HeaderMap>) -> Option<Firing> {
    let headers = headers?;
    let name = headers
        .get(async_nats::header::HeaderName::from_static(HDR_TIMER))?
        .as_str();
    let set_seq = headers
        .get(async_nats::header::HeaderName::from_static(HDR_TIMER_SET))?
        .as_str()
        .parse()
        .ok()?;
    Some(Firing {
        name: name.into(),
        set_seq,
    })
}

/// Whether `name` can name a timer (it travels in a header).
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TIMER_NAME_LEN
        && !name.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// Sets the due time of the timers set relative to now (`Effects::set_timer_after`).
pub(crate) fn resolve(changes: &mut [TimerChange], now: SystemTime) {
    for change in changes {
        if let TimerChange::Set {
            due_ms,
            after: Some(after),
            ..
        } = change
        {
            *due_ms = unix_ms(now + *after);
        }
    }
}

/// Unix milliseconds of `at` (0 before the epoch).
pub(crate) fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
