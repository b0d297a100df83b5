//! The ledger, sequentially: the [`Model`] every test judges a journal by, through
//! [`jetshard_testkit::history`].
//!
//! A test records each command it sends as an [`Op`] in a [`History`]; [`check_journal`] reads
//! the ledger's journal back and checks it against that history with [`LedgerModel`]: every
//! acknowledged command has exactly one outcome (or none, for a command the entity rejects), in
//! command order per entity, each what the ledger would do; every write carries its
//! partition's latest generation, and generations rise by one.

use std::fmt::Write as _;

use async_nats::jetstream::Context;
use jetshard_testkit::history::{self, History, Model, Record, Report, Violation};

use crate::ledger::{LedgerCmd, LedgerEvt};

/// A command as the history records it, with what the ledger must make of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `LedgerCmd::Append { n }` sent when `n` is the entity's length: must leave exactly
    /// `Appended { n }`.
    Append(u64),
    /// `LedgerCmd::Append { n }` sent when `n` is not the entity's length: rejected, so it must
    /// leave nothing.
    Misplaced(u64),
    /// `LedgerCmd::Push { n }`: must leave exactly `Appended { n }`; `n` rises per entity.
    Push(u64),
    /// `LedgerCmd::AppendMany { from, count }`, sent only when `from` is the entity's length.
    Many { from: u64, count: u64 },
    /// `LedgerCmd::Panic`: must be dead-lettered.
    Panic,
    /// `LedgerCmd::Refuse`: rejected, so it must leave nothing.
    Refuse,
    /// A payload that is no command: must be dead-lettered.
    Garbage,
    /// `LedgerCmd::Push { n }` whose dead letter the test wrote itself, standing for an owner
    /// that gave it up and crashed: must leave that dead letter and never an event.
    GivenUp(u64),
}

impl Op {
    /// The command it stands for, if it is one.
    pub fn command(&self) -> Option<LedgerCmd> {
        match *self {
            Op::Append(n) | Op::Misplaced(n) => Some(LedgerCmd::Append { n }),
            Op::Push(n) | Op::GivenUp(n) => Some(LedgerCmd::Push { n }),
            Op::Many { from, count } => Some(LedgerCmd::AppendMany { from, count }),
            Op::Panic => Some(LedgerCmd::Panic),
            Op::Refuse => Some(LedgerCmd::Refuse),
            Op::Garbage => None,
        }
    }

    /// The events it must leave if applied (none: it must be rejected or dead-lettered).
    fn expected_events(&self) -> Vec<LedgerEvt> {
        match *self {
            Op::Append(n) | Op::Push(n) => vec![LedgerEvt::Appended { n }],
            Op::Many { from, count } => (from..from + count)
                .map(|n| LedgerEvt::Appended { n })
                .collect(),
            Op::Misplaced(_) | Op::Panic | Op::Refuse | Op::Garbage | Op::GivenUp(_) => Vec::new(),
        }
    }

    /// Whether the entity rejects it (jetshard writes nothing for a rejection).
    fn rejected(&self) -> bool {
        matches!(self, Op::Misplaced(_) | Op::Refuse)
    }
}

/// The ledger's model: an entity is a list of numbers.
pub struct LedgerModel;

/// An entity in the model.
#[derive(Default)]
pub struct LedgerState {
    len: u64,
    last_push: Option<u64>,
}

impl Model for LedgerModel {
    type Command = Op;
    type Event = LedgerEvt;
    type State = LedgerState;

    fn step(&self, state: &mut LedgerState, op: &Op, events: &[LedgerEvt]) -> Result<(), String> {
        let expected = op.expected_events();
        if op.rejected() {
            return Err(format!("{op:?} must be rejected, but left {events:?}"));
        }
        if expected.is_empty() {
            return Err(format!("{op:?} must be dead-lettered, but left {events:?}"));
        }
        if events != expected {
            return Err(format!(
                "{op:?} left {} events {:?}, expected {:?}",
                events.len(),
                short(events),
                short(&expected)
            ));
        }
        match *op {
            Op::Append(n) => {
                if n != state.len {
                    return Err(format!("Append({n}) applied at length {}", state.len));
                }
                state.len += 1;
            }
            Op::Push(n) => {
                if let Some(last) = state.last_push
                    && n <= last
                {
                    return Err(format!("Push({n}) applied after Push({last})"));
                }
                state.last_push = Some(n);
                state.len += 1;
            }
            Op::Many { from, count } => {
                if from != state.len {
                    return Err(format!(
                        "AppendMany from {from} applied at length {}",
                        state.len
                    ));
                }
                state.len += count;
            }
            Op::Misplaced(_) | Op::Panic | Op::Refuse | Op::Garbage | Op::GivenUp(_) => {}
        }
        Ok(())
    }

    fn dead_lettered(&self, _: &mut LedgerState, op: &Op, reason: &str) -> Result<(), String> {
        match op {
            Op::Panic | Op::Garbage | Op::GivenUp(_) => Ok(()),
            _ => Err(format!("{op:?} was dead-lettered: {reason}")),
        }
    }

    fn expects_outcome(&self, op: &Op) -> bool {
        !op.rejected()
    }

    fn identifies(&self, op: &Op, events: &[LedgerEvt]) -> bool {
        events == op.expected_events()
    }
}

fn short(events: &[LedgerEvt]) -> String {
    if events.len() <= 4 {
        format!("{events:?}")
    } else {
        format!("[{:?} .. {:?}]", events[0], events[events.len() - 1])
    }
}

/// Reads the ledger's journal back and checks it against `history`. Read it once the command
/// stream is drained, or a command still waiting shows as lost.
pub async fn check_journal(js: &Context, history: &History<Op>) -> Report {
    let records = history::read_journal(js, "ledger")
        .await
        .expect("read the journal");
    let records: Vec<Record<LedgerEvt>> = records
        .into_iter()
        .map(|r| r.try_map_event(|body| serde_json::from_slice::<LedgerEvt>(&body)))
        .collect::<Result<_, _>>()
        .expect("every event is a ledger event");
    history::check(&LedgerModel, history, &records)
}

/// The journal records of the entities a report names (at most `limit` entities), one line
/// each, for a failure message.
pub async fn journal_excerpt(js: &Context, report: &Report, limit: usize) -> String {
    let mut entities: Vec<String> = Vec::new();
    for violation in report.violations() {
        let entity = match violation {
            Violation::Lost { entity, .. }
            | Violation::Duplicated { entity, .. }
            | Violation::Unexpected { entity, .. }
            | Violation::Reordered { entity, .. }
            | Violation::Model { entity, .. }
            | Violation::StaleGeneration { entity, .. } => entity.clone(),
            _ => continue,
        };
        if !entities.contains(&entity) && entities.len() < limit {
            entities.push(entity);
        }
    }
    let Ok(records) = history::read_journal(js, "ledger").await else {
        return "(journal unreadable)".to_owned();
    };
    let mut text = String::new();
    for entity in entities {
        let _ = writeln!(text, "journal of {entity:?}:");
        for record in &records {
            let line = match record {
                Record::Event {
                    seq,
                    partition,
                    entity: e,
                    generation,
                    command_seq,
                    event,
                } if *e == entity => format!(
                    "  seq {seq} p{partition} gen {generation} event of command {command_seq}: {}",
                    String::from_utf8_lossy(event)
                ),
                Record::DeadLetter {
                    seq,
                    partition,
                    entity: e,
                    generation,
                    command_seq,
                    reason,
                } if *e == entity => format!(
                    "  seq {seq} p{partition} gen {generation} dead letter of command {command_seq}: {reason}"
                ),
                _ => continue,
            };
            let _ = writeln!(text, "{line}");
        }
    }
    text
}
