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
use crate::stock::{CAPACITY, StockEvt};

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
    let records = match stream {
        Some(stream) => history::read_journal_from(js, stream, "ledger").await,
        None => history::read_journal(js, "ledger").await,
    }
    .map_err(|e| e.to_string())?;
    let mut records = records
        .into_iter()
        .map(|r| r.try_map_event(|body| serde_json::from_slice::<LedgerEvt>(&body)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("a ledger event that does not decode: {e}"))?;
    records.sort_by_key(Record::seq);
    Ok(records)
}

/// The stock's journal records, decoded, in journal order.
///
/// # Errors
/// The read's, or an event that is no stock event.
pub async fn read_stock(js: &Context) -> Result<Vec<Record<StockEvt>>, String> {
    let records = history::read_journal(js, "stock")
        .await
        .map_err(|e| e.to_string())?;
    let mut records = records
        .into_iter()
        .map(|r| r.try_map_event(|body| serde_json::from_slice::<StockEvt>(&body)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("a stock event that does not decode: {e}"))?;
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

/// What [`check_effects`] found: timers and the saga, from the ledger's and the stock's
/// journals.
#[derive(Debug, Default, Clone)]
pub struct EffectsReport {
    /// Broken promises: a timer fired twice, after its cancel or never set; an outbox message
    /// stored twice or never asked for; a saga whose ends disagree; a stock over its capacity.
    pub violations: Vec<String>,
    /// What has not happened yet but must: an armed timer not yet fired, an order not yet
    /// answered. Once the run is over and its timers were due, each of these is lost.
    pub pending: Vec<String>,
    /// Timers armed (`Armed` events).
    pub timers_set: usize,
    /// Timers fired (`Fired` events).
    pub timers_fired: usize,
    /// Timers disarmed before they fired.
    pub timers_cancelled: usize,
    /// Orders (`Ordered` events).
    pub orders: usize,
    /// Orders the stock reserved.
    pub reserved: usize,
    /// Orders the stock refused.
    pub refused: usize,
    /// Units reserved per stock entity, by its journal.
    pub stock_units: std::collections::BTreeMap<String, u64>,
}

impl EffectsReport {
    /// Whether no promise is broken and nothing is pending.
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty() && self.pending.is_empty()
    }
}

/// Where a timer is in its entity's journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimerState {
    Armed,
    Disarmed,
    Fired,
}

/// Checks the timers and the saga against the journals: each timer (`Arm`, a name used once per
/// entity) fires at most once, never after its cancel in the entity's order, and is pending
/// until it fired or was cancelled; each outbox message is stored exactly once at its target
/// (one `Reserved`/`Refused` at the stock per `Ordered`, one `Settled` per answer, agreeing with
/// it); each stock stays within [`CAPACITY`], reserving exactly while units are left.
pub fn check_effects(ledger: &[Record<LedgerEvt>], stock: &[Record<StockEvt>]) -> EffectsReport {
    use std::collections::BTreeMap;
    let mut report = EffectsReport::default();
    let mut timers: BTreeMap<(String, String), (u64, TimerState)> = BTreeMap::new();
    // (ordering ledger, order) -> (stock, qty)
    let mut orders: BTreeMap<(String, u64), (String, u64)> = BTreeMap::new();
    // (ordering ledger, order) -> settled as reserved?
    let mut settled: BTreeMap<(String, u64), bool> = BTreeMap::new();
    for record in ledger {
        let Record::Event {
            seq, entity, event, ..
        } = record
        else {
            continue;
        };
        match event {
            LedgerEvt::Armed { name, n } => {
                report.timers_set += 1;
                let key = (entity.clone(), name.clone());
                if timers.insert(key, (*n, TimerState::Armed)).is_some() {
                    report.violations.push(format!(
                        "{entity}: timer {name} armed twice (journal seq {seq}); each name is set once"
                    ));
                }
            }
            LedgerEvt::Disarmed { name } => match timers.get_mut(&(entity.clone(), name.clone())) {
                Some((_, state @ TimerState::Armed)) => {
                    report.timers_cancelled += 1;
                    *state = TimerState::Disarmed;
                }
                Some((_, TimerState::Fired)) => {}
                Some((_, TimerState::Disarmed)) => report.violations.push(format!(
                    "{entity}: timer {name} disarmed twice (journal seq {seq})"
                )),
                None => report.violations.push(format!(
                    "{entity}: timer {name} disarmed but never armed (journal seq {seq})"
                )),
            },
            LedgerEvt::Fired { name, n } => {
                report.timers_fired += 1;
                match timers.get_mut(&(entity.clone(), name.clone())) {
                    Some((armed, state @ TimerState::Armed)) if armed == n => {
                        *state = TimerState::Fired;
                    }
                    Some((armed, TimerState::Armed)) => report.violations.push(format!(
                        "{entity}: timer {name} fired {n}, but was armed with {armed} (journal seq {seq})"
                    )),
                    Some((_, TimerState::Fired)) => report.violations.push(format!(
                        "{entity}: timer {name} fired twice (journal seq {seq})"
                    )),
                    Some((_, TimerState::Disarmed)) => report.violations.push(format!(
                        "{entity}: timer {name} fired after its cancel (journal seq {seq})"
                    )),
                    None => report.violations.push(format!(
                        "{entity}: timer {name} fired but was never armed (journal seq {seq})"
                    )),
                }
            }
            LedgerEvt::Ordered { order, stock, qty } => {
                report.orders += 1;
                let key = (entity.clone(), *order);
                if orders.insert(key, (stock.clone(), *qty)).is_some() {
                    report.violations.push(format!(
                        "{entity}: order {order} placed twice (journal seq {seq})"
                    ));
                }
            }
            LedgerEvt::Settled { order, reserved } => {
                let key = (entity.clone(), *order);
                if !orders.contains_key(&key) {
                    report.violations.push(format!(
                        "{entity}: order {order} settled before or without being placed (journal seq {seq})"
                    ));
                }
                if settled.insert(key, *reserved).is_some() {
                    report.violations.push(format!(
                        "{entity}: the stock's answer to order {order} stored twice (journal seq {seq})"
                    ));
                }
            }
            LedgerEvt::Appended { .. } => {}
        }
    }
    for ((entity, name), (n, state)) in &timers {
        if *state == TimerState::Armed {
            report
                .pending
                .push(format!("{entity}: timer {name} ({n}) armed, not fired"));
        }
    }
    // (ordering ledger, order) -> reserved?
    let mut answered: BTreeMap<(String, u64), bool> = BTreeMap::new();
    let mut units: BTreeMap<String, u64> = BTreeMap::new();
    for record in stock {
        let Record::Event {
            seq, entity, event, ..
        } = record
        else {
            if let Record::DeadLetter { entity, reason, .. } = record {
                report
                    .violations
                    .push(format!("stock {entity}: a Reserve dead-lettered: {reason}"));
            }
            continue;
        };
        let (order, qty, reply_to, reserved) = match event {
            StockEvt::Reserved {
                order,
                qty,
                reply_to,
            } => (*order, *qty, reply_to, true),
            StockEvt::Refused {
                order,
                qty,
                reply_to,
            } => (*order, *qty, reply_to, false),
        };
        let key = (reply_to.clone(), order);
        match orders.get(&key) {
            Some((to, ordered)) if to == entity && *ordered == qty => {}
            Some(placed) => report.violations.push(format!(
                "stock {entity}: order {order} of {reply_to} answered for {qty} units, placed as {placed:?} (journal seq {seq})"
            )),
            None => report.violations.push(format!(
                "stock {entity}: order {order} of {reply_to} answered but never placed (journal seq {seq})"
            )),
        }
        if answered.insert(key, reserved).is_some() {
            report.violations.push(format!(
                "stock {entity}: the Reserve of order {order} of {reply_to} stored twice (journal seq {seq})"
            ));
        }
        let held = units.entry(entity.clone()).or_default();
        if reserved {
            report.reserved += 1;
            *held += qty;
            if *held > CAPACITY {
                report.violations.push(format!(
                    "stock {entity}: {held} units reserved, over its capacity {CAPACITY} (journal seq {seq})"
                ));
            }
        } else {
            report.refused += 1;
            if *held + qty <= CAPACITY {
                report.violations.push(format!(
                    "stock {entity}: order {order} of {qty} refused with {held} of {CAPACITY} reserved (journal seq {seq})"
                ));
            }
        }
    }
    for (key, (stock, _)) in &orders {
        match (answered.get(key), settled.get(key)) {
            (Some(reserved), Some(settled)) if reserved != settled => {
                report.violations.push(format!(
                    "{}: order {} reserved {reserved} by {stock}, settled {settled}",
                    key.0, key.1
                ));
            }
            (Some(_), Some(_)) => {}
            (None, Some(_)) => report.violations.push(format!(
                "{}: order {} settled, but {stock} stored no answer",
                key.0, key.1
            )),
            (None, None) => report.pending.push(format!(
                "{}: order {} not yet answered by {stock}",
                key.0, key.1
            )),
            (Some(_), None) => report.pending.push(format!(
                "{}: the answer of {stock} to order {} not yet stored",
                key.0, key.1
            )),
        }
    }
    report.stock_units = units;
    report
}

/// Checks answers to state queries against the journal: each answer of a ledger that the
/// load pushes to (`Push` only) must be a prefix of the numbers its journal holds, in order (an
/// answer is a state the entity had; a stale owner's or a lost write's state is not).
pub fn check_query_answers(
    ledger: &[Record<LedgerEvt>],
    answers: &[(String, Vec<u64>)],
) -> Vec<String> {
    use std::collections::BTreeMap;
    let mut lists: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for record in ledger {
        if let Record::Event {
            entity,
            event: LedgerEvt::Appended { n },
            ..
        } = record
        {
            lists.entry(entity.as_str()).or_default().push(*n);
        }
    }
    let mut violations = Vec::new();
    for (entity, answer) in answers {
        let journal = lists.get(entity.as_str()).map_or(&[][..], Vec::as_slice);
        if !journal.starts_with(answer) {
            violations.push(format!(
                "{entity}: a query answered {} numbers {}, not a prefix of the journal's {} {}",
                answer.len(),
                short_numbers(answer),
                journal.len(),
                short_numbers(journal)
            ));
        }
    }
    violations
}

fn short_numbers(numbers: &[u64]) -> String {
    if numbers.len() <= 6 {
        format!("{numbers:?}")
    } else {
        format!(
            "[{} .. {}]",
            numbers[..3]
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            numbers[numbers.len() - 3..]
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
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

#[cfg(test)]
mod tests {
    //! Each check of [`check_effects`] fails on a doctored journal.
    use super::*;

    fn event(seq: u64, entity: &str, event: LedgerEvt) -> Record<LedgerEvt> {
        Record::event(seq, 0, entity, 1, seq, event)
    }

    fn stock(seq: u64, entity: &str, event: StockEvt) -> Record<StockEvt> {
        Record::event(seq, 0, entity, 1, seq, event)
    }

    fn armed(name: &str) -> LedgerEvt {
        LedgerEvt::Armed {
            name: name.into(),
            n: 7,
        }
    }

    fn fired(name: &str) -> LedgerEvt {
        LedgerEvt::Fired {
            name: name.into(),
            n: 7,
        }
    }

    fn ordered(order: u64) -> LedgerEvt {
        LedgerEvt::Ordered {
            order,
            stock: "st".into(),
            qty: 2,
        }
    }

    fn reserved(order: u64) -> StockEvt {
        StockEvt::Reserved {
            order,
            qty: 2,
            reply_to: "o".into(),
        }
    }

    fn settled(order: u64) -> LedgerEvt {
        LedgerEvt::Settled {
            order,
            reserved: true,
        }
    }

    /// A timer armed and fired once, another cancelled, an order reserved and settled.
    fn good() -> (Vec<Record<LedgerEvt>>, Vec<Record<StockEvt>>) {
        let ledger = vec![
            event(1, "t", armed("a")),
            event(2, "t", armed("b")),
            event(3, "t", LedgerEvt::Disarmed { name: "b".into() }),
            event(4, "t", fired("a")),
            event(5, "o", ordered(0)),
            event(6, "o", settled(0)),
        ];
        (ledger, vec![stock(1, "st", reserved(0))])
    }

    #[test]
    fn a_clean_journal_passes() {
        let (ledger, stock) = good();
        let report = check_effects(&ledger, &stock);
        assert!(report.is_ok(), "{report:?}");
        assert_eq!((report.timers_set, report.timers_fired), (2, 1));
        assert_eq!((report.orders, report.reserved), (1, 1));
        assert_eq!(report.stock_units.get("st"), Some(&2));
    }

    #[test]
    fn a_duplicated_timer_firing_is_a_violation() {
        let (mut ledger, stock) = good();
        ledger.push(event(7, "t", fired("a")));
        let report = check_effects(&ledger, &stock);
        assert!(
            report.violations.iter().any(|v| v.contains("fired twice")),
            "{report:?}"
        );
    }

    #[test]
    fn a_timer_firing_after_its_cancel_is_a_violation() {
        let (mut ledger, stock) = good();
        ledger.push(event(7, "t", fired("b")));
        let report = check_effects(&ledger, &stock);
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("after its cancel")),
            "{report:?}"
        );
    }

    #[test]
    fn a_lost_timer_is_pending() {
        let (mut ledger, stock) = good();
        ledger.remove(3); // a's firing
        let report = check_effects(&ledger, &stock);
        assert!(!report.is_ok());
        assert!(
            report.pending.iter().any(|p| p.contains("timer a")),
            "{report:?}"
        );
    }

    #[test]
    fn a_doubled_outbox_message_is_a_violation() {
        let (ledger, mut stock) = good();
        stock.push(super::tests::stock(2, "st", reserved(0)));
        let report = check_effects(&ledger, &stock);
        assert!(
            report.violations.iter().any(|v| v.contains("stored twice")),
            "{report:?}"
        );
        // The answer back, doubled.
        let (mut ledger, stock) = good();
        ledger.push(event(7, "o", settled(0)));
        let report = check_effects(&ledger, &stock);
        assert!(
            report.violations.iter().any(|v| v.contains("stored twice")),
            "{report:?}"
        );
    }

    #[test]
    fn a_lost_outbox_message_is_pending_and_a_wrong_answer_a_violation() {
        let (ledger, _) = good();
        let report = check_effects(&ledger, &[]);
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("stored no answer")),
            "{report:?}"
        );
        let report = check_effects(&ledger[..5], &[]);
        assert!(
            report
                .pending
                .iter()
                .any(|p| p.contains("not yet answered")),
            "{report:?}"
        );
        let refused = StockEvt::Refused {
            order: 0,
            qty: 2,
            reply_to: "o".into(),
        };
        let report = check_effects(&ledger, &[stock(1, "st", refused)]);
        assert!(
            report.violations.iter().any(|v| v.contains("refused with")),
            "{report:?}"
        );
    }

    #[test]
    fn a_stock_over_its_capacity_is_a_violation() {
        let mut ledger = Vec::new();
        let mut stock = Vec::new();
        for order in 0..=CAPACITY / 2 {
            ledger.push(event(order + 1, "o", ordered(order)));
            stock.push(super::tests::stock(order + 1, "st", reserved(order)));
        }
        let report = check_effects(&ledger, &stock);
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("over its capacity")),
            "{report:?}"
        );
    }

    #[test]
    fn a_query_answer_off_the_journal_is_a_violation() {
        let ledger = vec![
            event(1, "e", LedgerEvt::Appended { n: 0 }),
            event(2, "e", LedgerEvt::Appended { n: 1 }),
        ];
        let ok = [("e".to_owned(), vec![0]), ("e".to_owned(), vec![0, 1])];
        assert!(check_query_answers(&ledger, &ok).is_empty());
        let bad = [("e".to_owned(), vec![0, 2])];
        assert_eq!(check_query_answers(&ledger, &bad).len(), 1);
    }
}
