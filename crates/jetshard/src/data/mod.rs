//! Plain data that the public API and the runtime share: what a command decides beyond its
//! events ([`Effects`](crate::Effects), timer changes, outbox messages) and what became of it
//! ([`CommandOutcome`](crate::CommandOutcome)).
//!
//! Architecture Invariant: this module does no IO and imports nothing from `runtime/`,
//! `journal/` or the API modules; it sits on `wire/` (ids and header names) and the leaf modules
//! `codec` and `error` only (`grep -rn "crate::" crates/jetshard/src/data`).

mod effects;
pub(crate) mod origin;
mod outcome;
pub(crate) mod timers;

pub(crate) use effects::OutboxMessage;
pub use effects::{EffectError, Effects};
pub use outcome::CommandOutcome;
