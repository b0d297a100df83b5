//! Checking a run against jetshard's promises: what clients sent, against what the journal holds.
//!
//! A fault-injection test records a [`History`]: every command a client published, with the
//! stream sequence the command stream acknowledged ([`Ack::Acked`]) or [`Ack::Unknown`] when the
//! publish was never confirmed (it may or may not be stored). After the run it reads the entity
//! type's journal back ([`read_journal`]: events, fence records, dead letters) and hands both to
//! [`check`] with a [`Model`], the sequential specification of one entity. The [`Report`] lists
//! every [`Violation`] of these properties:
//!
//! | property | violation |
//! |---|---|
//! | every acknowledged command left exactly one outcome: its events, or a dead letter (none, if the model expects none: [`Model::expects_outcome`]) | [`Violation::Lost`], [`Violation::Duplicated`] |
//! | nothing has an outcome that no client sent | [`Violation::Unexpected`] |
//! | per entity, outcomes come in command order (command sequences rise) | [`Violation::Reordered`] |
//! | per entity, the outcomes follow the model, folded in journal order | [`Violation::Model`] |
//! | every event and dead letter carries the generation of its partition's latest fence record before it | [`Violation::StaleGeneration`] |
//! | a partition's generations rise by exactly one | [`Violation::GenerationJump`] |
//!
//! This is the Jepsen idea applied to jetshard's journal: the history is checked against a
//! model, not against the code that produced it.
//!
//! # What the checker needs from a test
//!
//! - **Every command leaves an outcome, or the model knows it leaves none.** jetshard writes
//!   nothing for a command its entity rejects, so a rejected command looks lost unless
//!   [`Model::expects_outcome`] says no for it (the test knows it sent a command the entity
//!   refuses). Such a command that does leave an outcome is still folded through the model,
//!   which can refuse it.
//! - **One command in flight per entity.** A client publishes an entity's next command only
//!   after the previous one was acknowledged or given up as unknown, and records them in that
//!   order. Then an entity's stored commands are in client order, which is how an outcome of an
//!   [`Ack::Unknown`] command is matched to it: to an unknown command between the acknowledged
//!   ones around its command sequence, the first for which [`Model::identifies`] holds. Make
//!   command values unique (a counter per entity) and `identifies` exact, and the matching is
//!   exact. Retrying an unconfirmed publish with the same `Nats-Msg-Id` until it is acknowledged
//!   leaves few unknowns.
//! - **The run is over.** Read the journal after every command in the stream was handled (a
//!   work-queue command stream is empty), or an acknowledged command still waiting shows as lost.
//!
//! # Examples
//!
//! ```
//! use jetshard_testkit::history::{Ack, History, Model, Record, check};
//!
//! /// Each command `n` must leave exactly the event `n`, and `n` rises per entity.
//! struct Rising;
//!
//! impl Model for Rising {
//!     type Command = u64;
//!     type Event = u64;
//!     type State = Option<u64>;
//!
//!     fn step(&self, last: &mut Option<u64>, n: &u64, events: &[u64]) -> Result<(), String> {
//!         if events != [*n] {
//!             return Err(format!("command {n} left events {events:?}"));
//!         }
//!         if last.is_some_and(|last| last >= *n) {
//!             return Err(format!("{n} after {last:?}"));
//!         }
//!         *last = Some(*n);
//!         Ok(())
//!     }
//! }
//!
//! let mut history = History::new();
//! history.record("e1", 0, Ack::Acked(1));
//! history.record("e1", 1, Ack::Acked(2));
//! let journal = vec![
//!     Record::fence(1, 0, 1),
//!     Record::event(2, 0, "e1", 1, 1, 0),
//!     Record::event(3, 0, "e1", 1, 2, 1),
//! ];
//! let report = check(&Rising, &history, &journal);
//! assert!(report.is_ok(), "{report}");
//!
//! // The same journal without command 2's event: it was acknowledged, so it is lost.
//! let report = check(&Rising, &history, &journal[..2]);
//! assert_eq!(report.violations().len(), 1);
//! assert!(report.to_string().contains("lost"), "{report}");
//! ```

mod check;
mod record;
mod report;

pub use check::check;
pub use record::{MalformedRecord, ReadError, Record, read_journal, read_journal_from};
pub use report::{Report, Summary, Violation};

/// What became of one publish, as the client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ack {
    /// The command stream stored the command at this sequence.
    Acked(u64),
    /// The publish was never confirmed: the command may or may not be stored.
    Unknown,
}

/// One command a client published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent<C> {
    /// The entity id it was addressed to.
    pub entity: String,
    /// The command, or a small model value standing for it.
    pub command: C,
    /// What the publish returned.
    pub ack: Ack,
}

/// Every command clients published in a run, per entity in the order they were issued.
#[derive(Clone, Debug)]
pub struct History<C> {
    sent: Vec<Sent<C>>,
}

impl<C> Default for History<C> {
    fn default() -> Self {
        History { sent: Vec::new() }
    }
}

impl<C> History<C> {
    /// An empty history.
    pub fn new() -> Self {
        History::default()
    }

    /// Records a command. An entity's commands must be recorded in the order they were issued,
    /// each after the previous one was acknowledged or given up (see the module docs).
    pub fn record(&mut self, entity: impl Into<String>, command: C, ack: Ack) {
        self.sent.push(Sent {
            entity: entity.into(),
            command,
            ack,
        });
    }

    /// Appends another client's history (another task's, say); the relative order of one
    /// entity's commands must still be their issue order.
    pub fn extend(&mut self, other: History<C>) {
        self.sent.extend(other.sent);
    }

    /// Every command recorded, in order.
    pub fn sent(&self) -> &[Sent<C>] {
        &self.sent
    }

    /// How many commands were recorded.
    pub fn len(&self) -> usize {
        self.sent.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }
}

/// The sequential specification of one entity, folded over its outcomes in journal order.
///
/// The checker starts each entity at `State::default()` and calls [`step`](Model::step) for
/// every command that left events, [`dead_lettered`](Model::dead_lettered) for every command
/// given up, in journal order. An `Err` is reported as [`Violation::Model`].
pub trait Model {
    /// What the history records per command (the command itself, or a small value for it).
    type Command;
    /// A decoded event.
    type Event;
    /// An entity's state in the model.
    type State: Default;

    /// Checks that `command` may leave exactly `events` in `state`, and advances `state`.
    ///
    /// # Errors
    /// Why the outcome is not what the model allows.
    fn step(
        &self,
        state: &mut Self::State,
        command: &Self::Command,
        events: &[Self::Event],
    ) -> Result<(), String>;

    /// Checks that `command` may be given up (dead-lettered) in `state`; the default allows
    /// it and leaves the state as it is.
    ///
    /// # Errors
    /// Why the model does not allow it (e.g. a command that can never fail).
    fn dead_lettered(
        &self,
        state: &mut Self::State,
        command: &Self::Command,
        reason: &str,
    ) -> Result<(), String> {
        let _ = (state, command, reason);
        Ok(())
    }

    /// Whether `command`, acknowledged, must leave an outcome (events or a dead letter). The
    /// default says yes. Say no for a command the entity rejects (jetshard writes nothing for a
    /// rejection): it is then not reported [`Violation::Lost`] when it leaves none, and counted
    /// in [`Summary::silent`]. An outcome it leaves anyway still goes through
    /// [`step`](Model::step) or [`dead_lettered`](Model::dead_lettered).
    fn expects_outcome(&self, command: &Self::Command) -> bool {
        let _ = command;
        true
    }

    /// Whether `events` can be the outcome of `command`: used only to match an outcome to one
    /// of several [`Ack::Unknown`] commands. The default says yes to any.
    fn identifies(&self, command: &Self::Command, events: &[Self::Event]) -> bool {
        let _ = (command, events);
        true
    }
}

#[cfg(test)]
mod tests;
