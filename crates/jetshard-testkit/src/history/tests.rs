use super::*;

use async_nats::HeaderMap;
use jetshard::wire::{HDR_COMMAND_SEQ, HDR_ENTITY, HDR_GENERATION};

/// Command `n` must leave exactly the event `n`; `n` rises per entity; command `0` may be
/// dead-lettered, no other.
struct Rising;

impl Model for Rising {
    type Command = u64;
    type Event = u64;
    type State = Option<u64>;

    fn step(&self, last: &mut Option<u64>, n: &u64, events: &[u64]) -> Result<(), String> {
        if events != [*n] {
            return Err(format!("command {n} left events {events:?}"));
        }
        if last.is_some_and(|last| last >= *n) {
            return Err(format!("{n} after {last:?}"));
        }
        *last = Some(*n);
        Ok(())
    }

    fn dead_lettered(&self, _: &mut Option<u64>, n: &u64, _: &str) -> Result<(), String> {
        if *n == 0 {
            Ok(())
        } else {
            Err(format!("command {n} cannot fail"))
        }
    }

    fn identifies(&self, n: &u64, events: &[u64]) -> bool {
        events == [*n]
    }
}

/// Entity `e` on partition 0: commands 1, 2, 3 at sequences 10, 11, 12, all acknowledged.
fn history() -> History<u64> {
    let mut history = History::new();
    for (n, seq) in [(1, 10), (2, 11), (3, 12)] {
        history.record("e", n, Ack::Acked(seq));
    }
    history
}

/// The journal a correct run leaves for [`history`].
fn journal() -> Vec<Record<u64>> {
    vec![
        Record::fence(1, 0, 1),
        Record::event(2, 0, "e", 1, 10, 1),
        Record::event(3, 0, "e", 1, 11, 2),
        Record::event(4, 0, "e", 1, 12, 3),
    ]
}

fn violations(history: &History<u64>, journal: &[Record<u64>]) -> Vec<Violation> {
    check(&Rising, history, journal).violations().to_vec()
}

#[test]
fn a_correct_run_has_no_violations() {
    let report = check(&Rising, &history(), &journal());
    assert!(report.is_ok(), "{report}");
    let summary = report.summary();
    assert_eq!(
        (summary.commands, summary.acked, summary.outcomes),
        (3, 3, 3)
    );
    assert_eq!(
        (summary.events, summary.fences, summary.entities),
        (3, 1, 1)
    );
}

#[test]
fn an_acknowledged_command_without_outcome_is_lost() {
    let mut journal = journal();
    journal.remove(2);
    // Command 3 now follows command 1 in the model too: allowed, since `n` only rises.
    assert_eq!(
        violations(&history(), &journal),
        vec![Violation::Lost {
            entity: "e".into(),
            command_seq: 11
        }]
    );
}

#[test]
fn a_command_applied_twice_is_duplicated_with_both_outcomes() {
    let mut journal = journal();
    // A stale owner's second write of command 11, under generation 2 after a takeover.
    journal.push(Record::fence(5, 0, 2));
    journal.push(Record::event(6, 0, "e", 2, 11, 2));
    let found = violations(&history(), &journal);
    assert!(
        found.contains(&Violation::Duplicated {
            entity: "e".into(),
            command_seq: 11,
            outcomes: vec![(3, 1), (6, 2)],
        }),
        "{found:?}"
    );
}

#[test]
fn an_event_and_a_dead_letter_of_one_command_are_two_outcomes() {
    let mut journal = journal();
    journal.push(Record::dead_letter(5, 0, "e", 1, 12, "failed"));
    let found = violations(&history(), &journal);
    assert!(
        matches!(&found[..], [Violation::Duplicated { command_seq: 12, outcomes, .. }] if outcomes.len() == 2),
        "{found:?}"
    );
}

#[test]
fn two_events_of_one_command_are_checked_by_the_model_as_one_outcome() {
    let mut journal = journal();
    // Command 10 stored its event twice back to back (a de-duplication failure).
    journal.insert(2, Record::event(2, 0, "e", 1, 10, 1));
    for (i, record) in journal.iter_mut().enumerate() {
        if let Record::Event { seq, .. } | Record::Fence { seq, .. } = record {
            *seq = i as u64 + 1;
        }
    }
    let found = violations(&history(), &journal);
    assert!(
        matches!(&found[..], [Violation::Model { command_seq: 10, reason, .. }] if reason.contains("[1, 1]")),
        "{found:?}"
    );
}

#[test]
fn an_outcome_no_client_sent_is_unexpected() {
    let mut journal = journal();
    journal.push(Record::event(5, 0, "e", 1, 99, 4));
    journal.push(Record::event(6, 0, "stranger", 1, 12, 3));
    let found = violations(&history(), &journal);
    assert!(
        found.contains(&Violation::Unexpected {
            entity: "e".into(),
            command_seq: 99,
            journal_seq: 5
        }),
        "{found:?}"
    );
    // Command 12 was sent to `e`, not to `stranger`.
    assert!(
        found.contains(&Violation::Unexpected {
            entity: "stranger".into(),
            command_seq: 12,
            journal_seq: 6
        }),
        "{found:?}"
    );
}

#[test]
fn outcomes_out_of_command_order_are_reordered() {
    let journal = vec![
        Record::fence(1, 0, 1),
        Record::event(2, 0, "e", 1, 10, 1),
        Record::event(3, 0, "e", 1, 12, 3),
        Record::event(4, 0, "e", 1, 11, 2),
    ];
    let found = violations(&history(), &journal);
    assert!(
        found.contains(&Violation::Reordered {
            entity: "e".into(),
            command_seq: 11,
            after_command_seq: 12,
            journal_seq: 4
        }),
        "{found:?}"
    );
    // The model sees 2 after 3 as well.
    assert!(
        found.iter().any(|v| matches!(
            v,
            Violation::Model {
                command_seq: 11,
                ..
            }
        )),
        "{found:?}"
    );
}

#[test]
fn an_outcome_the_model_forbids_is_reported_with_its_reason() {
    let mut journal = journal();
    journal[2] = Record::event(3, 0, "e", 1, 11, 7);
    journal.push(Record::dead_letter(5, 0, "e", 1, 13, "gave up"));
    let mut history = history();
    history.record("e", 4, Ack::Acked(13));
    let found = violations(&history, &journal);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        matches!(&found[0], Violation::Model { command_seq: 11, journal_seq: 3, reason, .. } if reason.contains("[7]")),
        "{found:?}"
    );
    assert!(
        matches!(&found[1], Violation::Model { command_seq: 13, reason, .. } if reason.contains("cannot fail")),
        "{found:?}"
    );
}

#[test]
fn a_write_under_an_old_generation_is_stale() {
    let mut journal = journal();
    // Generation 2 claimed the partition; then a write of generation 1 landed.
    journal.insert(2, Record::fence(2, 0, 2));
    for (i, record) in journal.iter_mut().enumerate() {
        if let Record::Event { seq, .. } | Record::Fence { seq, .. } = record {
            *seq = i as u64 + 1;
        }
    }
    let found = violations(&history(), &journal);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(
        found[0],
        Violation::StaleGeneration {
            partition: 0,
            journal_seq: 4,
            entity: "e".into(),
            command_seq: 11,
            generation: 1,
            fence_generation: 2
        }
    );
}

#[test]
fn a_write_before_any_fence_is_stale() {
    let journal = vec![Record::event(1, 3, "e", 1, 10, 1)];
    let mut history = History::new();
    history.record("e", 1, Ack::Acked(10));
    let found = violations(&history, &journal);
    assert_eq!(
        found,
        vec![Violation::StaleGeneration {
            partition: 3,
            journal_seq: 1,
            entity: "e".into(),
            command_seq: 10,
            generation: 1,
            fence_generation: 0
        }]
    );
}

#[test]
fn generations_that_do_not_rise_by_one_jump() {
    let journal = vec![
        Record::fence(1, 0, 1),
        Record::fence(2, 1, 1),
        Record::fence(3, 0, 3),
        Record::fence(4, 1, 1),
    ];
    let found = violations(&History::new(), &journal);
    assert_eq!(
        found,
        vec![
            Violation::GenerationJump {
                partition: 0,
                journal_seq: 3,
                previous: 1,
                generation: 3
            },
            Violation::GenerationJump {
                partition: 1,
                journal_seq: 4,
                previous: 1,
                generation: 1
            },
        ]
    );
}

#[test]
fn an_unknown_command_may_have_one_outcome_or_none() {
    let mut history = History::new();
    history.record("e", 1, Ack::Acked(10));
    history.record("e", 2, Ack::Unknown);
    history.record("e", 3, Ack::Unknown);
    history.record("e", 4, Ack::Acked(14));
    // 2 was never stored; 3 was, at sequence 12.
    let journal = vec![
        Record::fence(1, 0, 1),
        Record::event(2, 0, "e", 1, 10, 1),
        Record::event(3, 0, "e", 1, 12, 3),
        Record::event(4, 0, "e", 1, 14, 4),
    ];
    let report = check(&Rising, &history, &journal);
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.summary().unknown_applied, 1);

    // Two outcomes between the acknowledged neighbours that no unknown command explains.
    let mut journal = journal;
    journal.insert(3, Record::event(4, 0, "e", 1, 13, 9));
    journal[4] = Record::event(5, 0, "e", 1, 14, 4);
    let found = violations(&history, &journal);
    assert!(
        found.contains(&Violation::Unexpected {
            entity: "e".into(),
            command_seq: 13,
            journal_seq: 4
        }),
        "{found:?}"
    );
}

#[test]
fn an_unknown_command_is_not_matched_outside_its_place_in_the_history() {
    let mut history = History::new();
    history.record("e", 1, Ack::Unknown);
    history.record("e", 2, Ack::Acked(11));
    // An outcome after command 11 cannot be the unknown command issued before it.
    let journal = vec![
        Record::fence(1, 0, 1),
        Record::event(2, 0, "e", 1, 11, 2),
        Record::event(3, 0, "e", 1, 12, 1),
    ];
    let found = violations(&history, &journal);
    assert!(
        found.contains(&Violation::Unexpected {
            entity: "e".into(),
            command_seq: 12,
            journal_seq: 3
        }),
        "{found:?}"
    );
}

/// [`Rising`], but a command of 100 or more is one the entity rejects: it must leave nothing.
struct Refusing;

impl Model for Refusing {
    type Command = u64;
    type Event = u64;
    type State = Option<u64>;

    fn step(&self, last: &mut Option<u64>, n: &u64, events: &[u64]) -> Result<(), String> {
        if *n >= 100 {
            return Err(format!("command {n} must be rejected, but left {events:?}"));
        }
        Rising.step(last, n, events)
    }

    fn expects_outcome(&self, n: &u64) -> bool {
        *n < 100
    }
}

#[test]
fn a_command_the_model_expects_no_outcome_of_is_not_lost_when_it_leaves_none() {
    let mut history = history();
    history.record("e", 100, Ack::Acked(13));
    let report = check(&Refusing, &history, &journal());
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.summary().silent, 1);
    assert!(report.to_string().contains("1 commands silent"), "{report}");
    // The same command under a model that expects an outcome of every command is lost.
    assert_eq!(
        violations(&history, &journal()),
        vec![Violation::Lost {
            entity: "e".into(),
            command_seq: 13
        }]
    );
}

#[test]
fn an_outcome_of_a_command_expected_to_leave_none_goes_through_the_model() {
    let mut history = history();
    history.record("e", 100, Ack::Acked(13));
    let mut journal = journal();
    journal.push(Record::event(5, 0, "e", 1, 13, 100));
    let report = check(&Refusing, &history, &journal);
    assert_eq!(report.summary().silent, 0);
    assert!(
        matches!(report.violations(), [Violation::Model { command_seq: 13, reason, .. }] if reason.contains("must be rejected")),
        "{report}"
    );
}

#[test]
fn a_history_with_one_sequence_acknowledged_twice_is_ambiguous() {
    let mut history = history();
    history.record("e", 9, Ack::Acked(10));
    let found = violations(&history, &journal());
    assert!(
        found.contains(&Violation::AmbiguousHistory { command_seq: 10 }),
        "{found:?}"
    );
}

/// An entity type's commands spread over several streams: each stream numbers its own, so two
/// entities' commands may share a sequence, each judged apart.
#[test]
fn two_entities_acknowledged_at_one_sequence_by_different_streams_are_both_judged() {
    let mut history = history();
    history.record("f", 1, Ack::Acked(10));
    let mut journal = journal();
    journal.push(Record::event(5, 0, "f", 1, 10, 1));
    assert_eq!(violations(&history, &journal), []);
    // Its outcome missing, it is lost, as any other.
    let found = violations(&history, &self::journal());
    assert_eq!(
        found,
        [Violation::Lost {
            entity: "f".into(),
            command_seq: 10
        }]
    );
}

#[test]
fn the_report_names_entity_sequences_and_generations() {
    let mut journal = journal();
    journal.push(Record::fence(5, 0, 2));
    journal.push(Record::event(6, 0, "e", 1, 13, 4));
    let mut history = history();
    history.record("e", 4, Ack::Acked(13));
    let report = check(&Rising, &history, &journal);
    let text = report.to_string();
    assert!(text.starts_with("1 violations; 4 commands"), "{text}");
    assert!(
        text.contains("partition 0 journal seq 6 (entity \"e\", command 13) carries generation 1, but the latest fence before it is generation 2"),
        "{text}"
    );
}

#[test]
fn journal_messages_are_parsed_by_subject_and_headers() {
    use jetshard::wire::HDR_REASON;
    let mut headers = HeaderMap::new();
    headers.insert(HDR_GENERATION, "4");
    headers.insert(HDR_COMMAND_SEQ, "17");
    let event = Record::parse(
        "ledger",
        9,
        "ledger.evt.2.x-1",
        Some(&headers),
        b"{}".to_vec(),
    );
    assert_eq!(event, Ok(Record::event(9, 2, "x-1", 4, 17, b"{}".to_vec())));
    headers.insert(HDR_ENTITY, "x-1");
    headers.insert(HDR_REASON, "malformed");
    let letter = Record::parse("ledger", 10, "ledger.dlq.2", Some(&headers), vec![]);
    assert_eq!(
        letter,
        Ok(Record::dead_letter(10, 2, "x-1", 4, 17, "malformed"))
    );
    let letter = Record::parse("ledger", 10, "ledger.dlq.2.x-1", Some(&headers), vec![]);
    assert_eq!(
        letter,
        Ok(Record::dead_letter(10, 2, "x-1", 4, 17, "malformed"))
    );
    let fence = Record::parse("ledger", 11, "ledger.fence.2", Some(&headers), vec![]);
    assert_eq!(fence, Ok(Record::fence(11, 2, 4)));
    for (subject, headers) in [
        ("ledger.evt.2.x-1", None),
        ("ledger.evt.x.x-1", Some(&headers)),
        ("other.evt.2.x-1", Some(&headers)),
        ("ledger.cmd.2.x-1", Some(&headers)),
        ("ledger", Some(&headers)),
        ("", Some(&headers)),
    ] {
        assert!(
            Record::parse("ledger", 1, subject, headers, vec![]).is_err(),
            "{subject}"
        );
    }
}
