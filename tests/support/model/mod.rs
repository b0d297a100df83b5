//! The ledger, sequentially: the [`Model`] every test judges a journal by, through
//! [`jetshard_testkit::history`].
//!
//! A test records each command it sends as an [`Op`] in a [`History`]; [`check_journal`] reads
//! the ledger's journal back and checks it against that history with [`LedgerModel`]: every
//! acknowledged command has exactly one outcome (or none, for a command the entity rejects), in
//! command order per entity, each what the ledger would do; every write carries its
//! partition's latest generation, and generations rise by one. What the commands set off beyond
//! their events (timers, the outbox, the saga with the stock) is judged by [`check_effects`]
//! (`effects.rs`); state queries' answers by [`check_query_answers`] (`queries.rs`); the
//! entities' final states, queried, by [`check_states`] (`states.rs`), which needs no journal
//! record.

use std::fmt::Write as _;

use async_nats::jetstream::Context;
use jetshard_testkit::history::{self, History, Model, Record, Report, Violation};

use crate::ledger::{LedgerCmd, LedgerEvt};
use crate::stock::StockEvt;

mod effects;
mod queries;
mod states;

pub use effects::{EffectsReport, check_effects};
pub use queries::{check_query_answers, check_query_answers_by_state};
pub use states::{StatesReport, check_states};

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
    /// `LedgerCmd::Arm`: must leave exactly `Armed { name, n }`.
    Arm { name: String, n: u64, after_ms: u64 },
    /// `LedgerCmd::Disarm`: must leave exactly `Disarmed { name }`.
    Disarm { name: String },
    /// `LedgerCmd::Order` (its `reply_to` is the entity it is sent to): must leave exactly
    /// `Ordered { order, stock, qty }`.
    Order {
        order: u64,
        stock: String,
        qty: u64,
        reply_to: String,
    },
}

impl Op {
    /// The command it stands for, if it is one.
    pub fn command(&self) -> Option<LedgerCmd> {
        match self {
            Op::Arm { name, n, after_ms } => {
                return Some(LedgerCmd::Arm {
                    name: name.clone(),
                    n: *n,
                    after_ms: *after_ms,
                });
            }
            Op::Disarm { name } => return Some(LedgerCmd::Disarm { name: name.clone() }),
            Op::Order {
                order,
                stock,
                qty,
                reply_to,
            } => {
                return Some(LedgerCmd::Order {
                    order: *order,
                    stock: stock.clone(),
                    qty: *qty,
                    reply_to: reply_to.clone(),
                });
            }
            _ => {}
        }
        match *self {
            Op::Append(n) | Op::Misplaced(n) => Some(LedgerCmd::Append { n }),
            Op::Push(n) | Op::GivenUp(n) => Some(LedgerCmd::Push { n }),
            Op::Many { from, count } => Some(LedgerCmd::AppendMany { from, count }),
            Op::Panic => Some(LedgerCmd::Panic),
            Op::Refuse => Some(LedgerCmd::Refuse),
            Op::Garbage => None,
            Op::Arm { .. } | Op::Disarm { .. } | Op::Order { .. } => unreachable!("above"),
        }
    }

    /// The events it must leave if applied (none: it must be rejected or dead-lettered).
    fn expected_events(&self) -> Vec<LedgerEvt> {
        match self {
            Op::Arm { name, n, .. } => {
                return vec![LedgerEvt::Armed {
                    name: name.clone(),
                    n: *n,
                }];
            }
            Op::Disarm { name } => return vec![LedgerEvt::Disarmed { name: name.clone() }],
            Op::Order {
                order, stock, qty, ..
            } => {
                return vec![LedgerEvt::Ordered {
                    order: *order,
                    stock: stock.clone(),
                    qty: *qty,
                }];
            }
            _ => {}
        }
        match *self {
            Op::Append(n) | Op::Push(n) => vec![LedgerEvt::Appended { n }],
            Op::Many { from, count } => (from..from + count)
                .map(|n| LedgerEvt::Appended { n })
                .collect(),
            Op::Misplaced(_) | Op::Panic | Op::Refuse | Op::Garbage | Op::GivenUp(_) => Vec::new(),
            Op::Arm { .. } | Op::Disarm { .. } | Op::Order { .. } => unreachable!("above"),
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
        match op {
            &Op::Append(n) => {
                if n != state.len {
                    return Err(format!("Append({n}) applied at length {}", state.len));
                }
                state.len += 1;
            }
            &Op::Push(n) => {
                if let Some(last) = state.last_push
                    && n <= last
                {
                    return Err(format!("Push({n}) applied after Push({last})"));
                }
                state.last_push = Some(n);
                state.len += 1;
            }
            &Op::Many { from, count } => {
                if from != state.len {
                    return Err(format!(
                        "AppendMany from {from} applied at length {}",
                        state.len
                    ));
                }
                state.len += count;
            }
            // Timer and saga steps: their events were compared above, and `check_effects`
            // judges what follows from them.
            Op::Arm { .. } | Op::Disarm { .. } | Op::Order { .. } => {}
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
    let records = read_ledger(js, None).await.expect("read the journal");
    history::check(&LedgerModel, history, &client_outcomes(&records))
}
/// The ledger's journal records, decoded, from `LEDGER_JOURNAL` or from `stream` (a mirror of
/// it, which keeps what a compaction purged), in journal order.
///
/// # Errors
/// The read's, or an event that is no ledger event.
pub async fn read_ledger(
    js: &Context,
    stream: Option<&str>,
) -> Result<Vec<Record<LedgerEvt>>, String> {
    read_decoded(js, "ledger", stream).await
}

/// The stock's journal records, decoded, in journal order.
///
/// # Errors
/// The read's, or an event that is no stock event.
pub async fn read_stock(js: &Context) -> Result<Vec<Record<StockEvt>>, String> {
    read_decoded(js, "stock", None).await
}

/// `entity_type`'s journal records (from `stream`, a copy of its journal made by
/// [`crate::copy_journal`], if given), their events decoded from JSON, in journal order.
async fn read_decoded<E: serde::de::DeserializeOwned>(
    js: &Context,
    entity_type: &str,
    stream: Option<&str>,
) -> Result<Vec<Record<E>>, String> {
    let records = match stream {
        Some(copy) => {
            let mut records = Vec::new();
            for stream in crate::copy_names(copy, &crate::ledger_journals(js).await) {
                let read = history::read_journal_from(js, &stream, entity_type).await;
                records.extend(read.map_err(|e| e.to_string())?);
            }
            records
        }
        None => history::read_journal(js, entity_type)
            .await
            .map_err(|e| e.to_string())?,
    };
    let mut records = records
        .into_iter()
        .map(|r| r.try_map_event(|body| serde_json::from_slice::<E>(&body)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("a {entity_type} event that does not decode: {e}"))?;
    records.sort_by_key(Record::seq);
    Ok(records)
}

/// The records that answer a client's command: the ledger's journal without the events of the
/// commands jetshard itself sent (a timer's `Fired`, the stock's `Settled` through its outbox),
/// which no client history holds; [`check_effects`] judges those.
pub fn client_outcomes(records: &[Record<LedgerEvt>]) -> Vec<Record<LedgerEvt>> {
    records
        .iter()
        .filter(|r| {
            !matches!(
                r,
                Record::Event {
                    event: LedgerEvt::Fired { .. } | LedgerEvt::Settled { .. },
                    ..
                }
            )
        })
        .cloned()
        .collect()
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
