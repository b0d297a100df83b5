//! The check itself: outcomes matched to commands, folded through the model.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{Ack, History, Model, Record, Report, Summary, Violation};

/// One command's outcome in the journal.
struct Outcome<'a, E> {
    command_seq: u64,
    journal_seq: u64,
    generation: u64,
    kind: OutcomeKind<'a, E>,
}

enum OutcomeKind<'a, E> {
    /// Copies of the events, so that the model sees them as one slice.
    Events(Vec<E>),
    DeadLetter(&'a str),
}

/// Checks `journal` (any order; it is sorted by sequence) against `history` and `model`.
///
/// Pure and deterministic: the same input gives the same report.
pub fn check<M>(model: &M, history: &History<M::Command>, journal: &[Record<M::Event>]) -> Report
where
    M: Model,
    M::Event: Clone,
{
    let mut violations = Vec::new();
    let mut summary = Summary {
        commands: history.len(),
        ..Summary::default()
    };
    let mut records: Vec<&Record<M::Event>> = journal.iter().collect();
    records.sort_by_key(|r| r.seq());

    // Journal-level: fences, generations, and each entity's outcomes in journal order.
    let mut fence_of: HashMap<u32, u64> = HashMap::new();
    let mut outcomes: BTreeMap<&str, Vec<Outcome<'_, M::Event>>> = BTreeMap::new();
    for record in &records {
        match record {
            Record::Fence {
                seq,
                partition,
                generation,
            } => {
                summary.fences += 1;
                let previous = fence_of.insert(*partition, *generation).unwrap_or(0);
                if *generation != previous + 1 {
                    violations.push(Violation::GenerationJump {
                        partition: *partition,
                        journal_seq: *seq,
                        previous,
                        generation: *generation,
                    });
                }
            }
            Record::Event {
                seq,
                entity,
                generation,
                command_seq,
                event,
                ..
            } => {
                summary.events += 1;
                check_generation(&fence_of, record, entity, *command_seq, &mut violations);
                let list = outcomes.entry(entity.as_str()).or_default();
                match list.last_mut() {
                    Some(Outcome {
                        command_seq: last_seq,
                        generation: last_generation,
                        kind: OutcomeKind::Events(events),
                        ..
                    }) if last_seq == command_seq && last_generation == generation => {
                        events.push(event.clone());
                    }
                    _ => list.push(Outcome {
                        command_seq: *command_seq,
                        journal_seq: *seq,
                        generation: *generation,
                        kind: OutcomeKind::Events(vec![event.clone()]),
                    }),
                }
            }
            Record::DeadLetter {
                seq,
                entity,
                generation,
                command_seq,
                reason,
                ..
            } => {
                summary.dead_letters += 1;
                check_generation(&fence_of, record, entity, *command_seq, &mut violations);
                outcomes.entry(entity.as_str()).or_default().push(Outcome {
                    command_seq: *command_seq,
                    journal_seq: *seq,
                    generation: *generation,
                    kind: OutcomeKind::DeadLetter(reason),
                });
            }
        }
    }

    // The history: per entity, its commands in issue order; acknowledged ones by entity and
    // sequence (a sequence is its command stream's, and an entity type's commands may be
    // spread over several streams: an entity's are all in one).
    let mut by_entity: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut acked_at: HashMap<(&str, u64), usize> = HashMap::new();
    for (index, sent) in history.sent.iter().enumerate() {
        by_entity
            .entry(sent.entity.as_str())
            .or_default()
            .push(index);
        match sent.ack {
            Ack::Acked(seq) => {
                summary.acked += 1;
                if acked_at
                    .insert((sent.entity.as_str(), seq), index)
                    .is_some()
                {
                    violations.push(Violation::AmbiguousHistory { command_seq: seq });
                }
            }
            Ack::Unknown => summary.unknown += 1,
        }
    }

    // Per entity: attribution, exactly-once, order, and the model.
    let mut answered: HashSet<usize> = HashSet::new();
    summary.entities = outcomes.len();
    for (entity, list) in &outcomes {
        let issued = by_entity.get(entity).map(Vec::as_slice).unwrap_or_default();
        // (sequence, index in the history) of the entity's acknowledged commands, ascending.
        let mut acked: Vec<(u64, usize)> = issued
            .iter()
            .filter_map(|&i| match history.sent[i].ack {
                Ack::Acked(seq) => Some((seq, i)),
                Ack::Unknown => None,
            })
            .collect();
        acked.sort_unstable();
        let mut state = M::State::default();
        let mut first_outcome: HashMap<u64, (u64, u64)> = HashMap::new();
        let mut duplicates: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
        let mut highest: Option<u64> = None;
        let mut unknown_answer: HashMap<u64, usize> = HashMap::new();
        for outcome in list {
            summary.outcomes += 1;
            let at = (outcome.journal_seq, outcome.generation);
            if let Some(first) = first_outcome.get(&outcome.command_seq) {
                duplicates
                    .entry(outcome.command_seq)
                    .or_insert_with(|| vec![*first])
                    .push(at);
                continue;
            }
            first_outcome.insert(outcome.command_seq, at);
            if let Some(highest) = highest
                && outcome.command_seq < highest
            {
                violations.push(Violation::Reordered {
                    entity: (*entity).to_owned(),
                    command_seq: outcome.command_seq,
                    after_command_seq: highest,
                    journal_seq: outcome.journal_seq,
                });
            }
            highest = highest.max(Some(outcome.command_seq));

            let sent = match acked_at.get(&(*entity, outcome.command_seq)) {
                Some(&index) => Some(index),
                None => match_unknown(
                    model,
                    history,
                    issued,
                    &acked,
                    &answered,
                    outcome,
                    &mut unknown_answer,
                ),
            };
            let Some(index) = sent else {
                violations.push(Violation::Unexpected {
                    entity: (*entity).to_owned(),
                    command_seq: outcome.command_seq,
                    journal_seq: outcome.journal_seq,
                });
                continue;
            };
            answered.insert(index);
            let command = &history.sent[index].command;
            let stepped = match &outcome.kind {
                OutcomeKind::Events(events) => model.step(&mut state, command, events),
                OutcomeKind::DeadLetter(reason) => model.dead_lettered(&mut state, command, reason),
            };
            if let Err(reason) = stepped {
                violations.push(Violation::Model {
                    entity: (*entity).to_owned(),
                    command_seq: outcome.command_seq,
                    journal_seq: outcome.journal_seq,
                    reason,
                });
            }
        }
        summary.unknown_applied += unknown_answer.len();
        for (command_seq, outcomes) in duplicates {
            violations.push(Violation::Duplicated {
                entity: (*entity).to_owned(),
                command_seq,
                outcomes,
            });
        }
    }

    for (index, sent) in history.sent.iter().enumerate() {
        if let Ack::Acked(command_seq) = sent.ack
            && !answered.contains(&index)
        {
            if model.expects_outcome(&sent.command) {
                violations.push(Violation::Lost {
                    entity: sent.entity.clone(),
                    command_seq,
                });
            } else {
                summary.silent += 1;
            }
        }
    }
    Report {
        violations,
        summary,
    }
}

fn check_generation<E>(
    fence_of: &HashMap<u32, u64>,
    record: &Record<E>,
    entity: &str,
    command_seq: u64,
    violations: &mut Vec<Violation>,
) {
    let fence_generation = fence_of.get(&record.partition()).copied().unwrap_or(0);
    if record.generation() != fence_generation {
        violations.push(Violation::StaleGeneration {
            partition: record.partition(),
            journal_seq: record.seq(),
            entity: entity.to_owned(),
            command_seq,
            generation: record.generation(),
            fence_generation,
        });
    }
}

/// Matches an outcome whose command sequence no acknowledged command of its entity holds to an
/// unknown command of that entity issued between the acknowledged ones around it.
fn match_unknown<M: Model>(
    model: &M,
    history: &History<M::Command>,
    issued: &[usize],
    acked: &[(u64, usize)],
    answered: &HashSet<usize>,
    outcome: &Outcome<'_, M::Event>,
    unknown_answer: &mut HashMap<u64, usize>,
) -> Option<usize> {
    let after = acked
        .iter()
        .rev()
        .find(|(seq, _)| *seq < outcome.command_seq)
        .map(|(_, index)| *index);
    let before = acked
        .iter()
        .find(|(seq, _)| *seq > outcome.command_seq)
        .map(|(_, index)| *index);
    let taken: HashSet<usize> = unknown_answer.values().copied().collect();
    let candidate = issued.iter().copied().find(|&index| {
        history.sent[index].ack == Ack::Unknown
            && after.is_none_or(|a| index > a)
            && before.is_none_or(|b| index < b)
            && !answered.contains(&index)
            && !taken.contains(&index)
            && match &outcome.kind {
                OutcomeKind::Events(events) => {
                    model.identifies(&history.sent[index].command, events)
                }
                OutcomeKind::DeadLetter(_) => true,
            }
    })?;
    unknown_answer.insert(outcome.command_seq, candidate);
    Some(candidate)
}
