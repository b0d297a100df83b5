//! Entities' states, asked of their owners, held against the commands sent: an oracle that
//! needs no journal record, so it judges what a compacted journal (or a mirror that a purge
//! outran) can no longer show.
//!
//! The ledger's state is a list of numbers: `Appended { n }` adds `n`, `Fired { n, .. }` adds
//! the timer's `n` marked [`FIRED`], `Disarmed { name }` the timer's mark ([`disarmed`]),
//! `Settled { order, .. }` adds `order`. So each entity the chaos schedules write shows every
//! command's effect in its state: a load entity's `Push`es (in order), a timer entity's timers
//! that fired and those disarmed, an ordering entity's orders that the stock answered.

use std::collections::{BTreeMap, HashSet};

use jetshard_testkit::history::{Ack, History};

use super::Op;
use crate::ledger::{FIRED, disarmed};

/// What [`check_states`] found.
#[derive(Debug, Default)]
pub struct StatesReport {
    /// Entities judged.
    pub judged: usize,
    /// Acknowledged commands whose effect the state does not show (yet: a timer not due, an
    /// answer on its way; lost if it stays so).
    pub missing: Vec<String>,
    /// Broken promises: a number twice, one no command sent, `Push`es out of their order.
    pub violations: Vec<String>,
}

/// How often a number may appear in an entity's state: at least `.0`, at most `.1` times.
type Bounds = (u32, u32);

/// Judges each entity of `history` by `states` (entity -> its state, as its owner answered a
/// query). An acknowledged `Push n` (or `Append`, `Many`) must show its numbers exactly once,
/// an unconfirmed one at most once, all in the order they were sent; an acknowledged `Arm`
/// whose name was not disarmed (acknowledged) must have fired exactly once, any other at most
/// once; an acknowledged `Disarm` must show exactly once (an unconfirmed one at most once); an
/// acknowledged `Order` must be settled exactly once; a rejected or dead-lettered
/// command shows nothing; no number may be there that no command sent. Entities missing from
/// `states` are not judged.
pub fn check_states(history: &History<Op>, states: &BTreeMap<String, Vec<u64>>) -> StatesReport {
    let mut by_entity: BTreeMap<&str, Vec<(&Op, Ack)>> = BTreeMap::new();
    for sent in history.sent() {
        by_entity
            .entry(sent.entity.as_str())
            .or_default()
            .push((&sent.command, sent.ack));
    }
    let mut report = StatesReport::default();
    for (entity, sent) in by_entity {
        let Some(state) = states.get(entity) else {
            continue;
        };
        let bounds = bounds_of(&sent);
        report.judged += 1;
        let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
        for &n in state {
            *seen.entry(n).or_default() += 1;
        }
        for (&n, &count) in &seen {
            match bounds.get(&n) {
                None => report.violations.push(format!(
                    "{entity}: its state holds {n}, which no command sent"
                )),
                Some(&(_, most)) if count > most => report.violations.push(format!(
                    "{entity}: its state holds {n} {count} times (at most {most})"
                )),
                Some(_) => {}
            }
        }
        for (&n, &(least, _)) in &bounds {
            if seen.get(&n).copied().unwrap_or(0) < least {
                report.missing.push(format!(
                    "{entity}: the acknowledged command of {n} does not show in its state"
                ));
            }
        }
        let pushes: HashSet<u64> = sent
            .iter()
            .flat_map(|(op, _)| match op {
                Op::Push(n) | Op::Append(n) => *n..*n + 1,
                Op::Many { from, count } => *from..*from + *count,
                _ => 0..0,
            })
            .collect();
        let in_state: Vec<u64> = state
            .iter()
            .copied()
            .filter(|n| pushes.contains(n))
            .collect();
        if let Some(pair) = in_state.windows(2).find(|pair| pair[0] > pair[1]) {
            report.violations.push(format!(
                "{entity}: Push {} applied after Push {}",
                pair[1], pair[0]
            ));
        }
    }
    report
}

/// The numbers `sent` may leave in the state.
fn bounds_of(sent: &[(&Op, Ack)]) -> BTreeMap<u64, Bounds> {
    let disarms: HashSet<&str> = sent
        .iter()
        .filter_map(|(op, ack)| match (op, ack) {
            (Op::Disarm { name }, Ack::Acked(_)) => Some(name.as_str()),
            _ => None,
        })
        .collect();
    let mut bounds: BTreeMap<u64, Bounds> = BTreeMap::new();
    for &(op, ack) in sent {
        let certain = matches!(ack, Ack::Acked(_));
        let (numbers, least) = match op {
            Op::Push(n) | Op::Append(n) | Op::Order { order: n, .. } => {
                (*n..*n + 1, u32::from(certain))
            }
            Op::Many { from, count } => (*from..*from + *count, u32::from(certain)),
            Op::Arm { name, n, .. } => (
                FIRED | *n..(FIRED | *n) + 1,
                u32::from(certain && !disarms.contains(&**name)),
            ),
            Op::Disarm { name } => {
                let mark = disarmed(name);
                (mark..mark + 1, u32::from(certain))
            }
            Op::Misplaced(_) | Op::Refuse | Op::Panic | Op::Garbage | Op::GivenUp(_) => continue,
        };
        for n in numbers {
            let entry = bounds.entry(n).or_default();
            entry.0 += least;
            entry.1 += 1;
        }
    }
    bounds
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(sent: &[(&str, Op, Ack)]) -> History<Op> {
        let mut history = History::new();
        for (entity, op, ack) in sent {
            history.record(*entity, op.clone(), *ack);
        }
        history
    }

    fn states(states: &[(&str, &[u64])]) -> BTreeMap<String, Vec<u64>> {
        states
            .iter()
            .map(|(e, s)| ((*e).to_owned(), s.to_vec()))
            .collect()
    }

    fn arm(name: &str, n: u64) -> Op {
        Op::Arm {
            name: name.to_owned(),
            n,
            after_ms: 100,
        }
    }

    #[test]
    fn pushes_show_once_each_in_order() {
        let h = history(&[
            ("e", Op::Push(0), Ack::Acked(1)),
            ("e", Op::Push(1), Ack::Unknown),
            ("e", Op::Push(2), Ack::Acked(3)),
        ]);
        for good in [&[0, 1, 2][..], &[0, 2]] {
            let r = check_states(&h, &states(&[("e", good)]));
            assert_eq!((r.judged, r.missing.len(), r.violations.len()), (1, 0, 0));
        }
        let lost = check_states(&h, &states(&[("e", &[0, 1])]));
        assert_eq!((lost.missing.len(), lost.violations.len()), (1, 0));
        let twice = check_states(&h, &states(&[("e", &[0, 2, 2])]));
        assert_eq!(twice.violations.len(), 1, "{:?}", twice.violations);
        let foreign = check_states(&h, &states(&[("e", &[0, 2, 7])]));
        assert_eq!(foreign.violations.len(), 1, "{:?}", foreign.violations);
        let reordered = check_states(&h, &states(&[("e", &[2, 0])]));
        assert_eq!(reordered.violations.len(), 1, "{:?}", reordered.violations);
    }

    #[test]
    fn timers_fire_once_unless_disarmed_and_orders_settle_once() {
        let h = history(&[
            ("t", arm("a", 0), Ack::Acked(1)),
            ("t", arm("b", 1), Ack::Acked(2)),
            ("t", Op::Disarm { name: "b".into() }, Ack::Acked(3)),
            (
                "o",
                Op::Order {
                    order: 4,
                    stock: "s".into(),
                    qty: 1,
                    reply_to: "o".into(),
                },
                Ack::Acked(4),
            ),
        ]);
        let b = disarmed("b");
        // The disarmed timer may have fired before its cancel, or not; the cancel shows once.
        for fired in [&[FIRED, b][..], &[FIRED | 1, FIRED, b], &[b, FIRED]] {
            let r = check_states(&h, &states(&[("t", fired), ("o", &[4])]));
            assert_eq!((r.judged, r.missing.len(), r.violations.len()), (2, 0, 0));
        }
        let unfired = check_states(&h, &states(&[("t", &[FIRED | 1, b]), ("o", &[])]));
        assert_eq!((unfired.missing.len(), unfired.violations.len()), (2, 0));
        let twice = check_states(&h, &states(&[("t", &[FIRED, FIRED, b]), ("o", &[4, 4])]));
        assert_eq!(twice.violations.len(), 2, "{:?}", twice.violations);
        // A lost cancel, a doubled one, one no command sent.
        let lost = check_states(&h, &states(&[("t", &[FIRED]), ("o", &[4])]));
        assert_eq!((lost.missing.len(), lost.violations.len()), (1, 0));
        let doubled = check_states(&h, &states(&[("t", &[FIRED, b, b]), ("o", &[4])]));
        assert_eq!(doubled.violations.len(), 1, "{:?}", doubled.violations);
        let foreign = check_states(
            &h,
            &states(&[("t", &[FIRED, b, disarmed("a")]), ("o", &[4])]),
        );
        assert_eq!(foreign.violations.len(), 1, "{:?}", foreign.violations);
        // A fired timer's number is not a Push's.
        let pushed = check_states(&h, &states(&[("t", &[0, b]), ("o", &[4])]));
        assert_eq!((pushed.missing.len(), pushed.violations.len()), (1, 1));
    }

    #[test]
    fn rejected_and_dead_lettered_commands_show_nothing() {
        let h = history(&[
            ("p", Op::Panic, Ack::Acked(1)),
            ("p", Op::Append(0), Ack::Acked(2)),
            ("p", Op::Misplaced(5), Ack::Acked(3)),
            ("p", Op::Many { from: 1, count: 2 }, Ack::Acked(4)),
        ]);
        let r = check_states(&h, &states(&[("p", &[0, 1, 2])]));
        assert_eq!((r.judged, r.missing.len(), r.violations.len()), (1, 0, 0));
        let r = check_states(&h, &states(&[("p", &[0, 1, 2, 5])]));
        assert_eq!(r.violations.len(), 1, "{:?}", r.violations);
        // An entity nobody asked about is not judged.
        let r = check_states(&h, &BTreeMap::new());
        assert_eq!(r.judged, 0);
    }
}
