//! The effects a ledger's commands set off, judged from the journals: durable timers, outbox
//! messages and the saga between the ledger and the stock.

use std::collections::BTreeMap;

use jetshard_testkit::history::Record;

use crate::ledger::LedgerEvt;
use crate::stock::{CAPACITY, StockEvt};

/// What [`check_effects`] found: timers and the saga, from the ledger's and the stock's
/// journals.
#[derive(Debug, Default, Clone)]
pub struct EffectsReport {
    /// Broken promises: a timer fired twice, after its cancel or never set; an outbox message
    /// stored twice or never asked for; a saga whose ends disagree; a stock over its capacity.
    pub violations: Vec<String>,
    /// Of the violations, those that name a ledger record the read did not hold (a timer
    /// fired or disarmed but never armed, an order settled or answered but never placed):
    /// broken promises in a whole journal, what a read of one that purges cut short shows.
    pub unplaced: Vec<String>,
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
    pub stock_units: BTreeMap<String, u64>,
}

impl EffectsReport {
    /// Whether no promise is broken and nothing is pending.
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty() && self.pending.is_empty()
    }

    /// A violation that names a ledger record the read did not hold.
    fn unplaced(&mut self, violation: String) {
        self.unplaced.push(violation.clone());
        self.violations.push(violation);
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
                None => report.unplaced(format!(
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
                    None => report.unplaced(format!(
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
                    report.unplaced(format!(
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
            None => report.unplaced(format!(
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
}
