//! State queries' answers, judged against the journal or the entities' final states.

use std::collections::BTreeMap;

use jetshard_testkit::history::Record;

use crate::ledger::LedgerEvt;

/// Checks answers to state queries against the journal: each answer of a ledger that the
/// load pushes to (`Push` only) must be a prefix of the numbers its journal holds, in order (an
/// answer is a state the entity had; a stale owner's or a lost write's state is not).
pub fn check_query_answers(
    ledger: &[Record<LedgerEvt>],
    answers: &[(String, Vec<u64>)],
) -> Vec<String> {
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
    prefixes_of(&lists, answers, "the journal's")
}

/// Checks answers to state queries against each entity's final state (queried once the run
/// was over): each answer must be a prefix of it. Needs no journal record, so it judges a run
/// whose journal was compacted.
pub fn check_query_answers_by_state(
    states: &BTreeMap<String, Vec<u64>>,
    answers: &[(String, Vec<u64>)],
) -> Vec<String> {
    let lists = states
        .iter()
        .map(|(entity, state)| (entity.as_str(), state.clone()))
        .collect();
    prefixes_of(&lists, answers, "its final state's")
}

fn prefixes_of(
    lists: &BTreeMap<&str, Vec<u64>>,
    answers: &[(String, Vec<u64>)],
    whose: &str,
) -> Vec<String> {
    let mut violations = Vec::new();
    for (entity, answer) in answers {
        let list = lists.get(entity.as_str()).map_or(&[][..], Vec::as_slice);
        if !list.starts_with(answer) {
            violations.push(format!(
                "{entity}: a query answered {} numbers {}, not a prefix of {whose} {} {}",
                answer.len(),
                short_numbers(answer),
                list.len(),
                short_numbers(list)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64, entity: &str, event: LedgerEvt) -> Record<LedgerEvt> {
        Record::event(seq, 0, entity, 1, seq, event)
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
