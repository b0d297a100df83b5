//! Unit tests of `journal::compact`.

use std::time::Duration;

use super::*;

fn out(seq: u64, command_seq: u64, done: bool) -> OutboxRow {
    OutboxRow {
        seq,
        command_seq,
        done,
    }
}

#[test]
fn the_outbox_goes_up_to_the_first_command_not_done() {
    assert_eq!(outbox_below(&[]), None);
    // Two commands done, their records and done records interleaved.
    let rows = [
        out(10, 1, false),
        out(11, 2, false),
        out(12, 1, true),
        out(13, 2, true),
    ];
    assert_eq!(outbox_below(&rows), Some(14));
    // Command 2 not done: everything before its first record goes.
    let rows = [out(10, 1, false), out(11, 2, false), out(12, 1, true)];
    assert_eq!(outbox_below(&rows), Some(11));
    // The first record is of a command not done: nothing goes.
    let rows = [out(10, 2, false), out(11, 1, false), out(12, 1, true)];
    assert_eq!(outbox_below(&rows), None);
}

/// The entities whose timer records can go, and below where.
fn timer_below(rows: &[TimerRow], ack_floor: u64) -> Vec<(String, u64)> {
    timer_keep_from(rows, ack_floor)
        .into_iter()
        .filter(|(e, keep)| rows.iter().any(|r| r.entity == *e && r.seq < *keep))
        .map(|(e, keep)| (e.to_owned(), keep))
        .collect()
}

fn timer(seq: u64, entity: &str, command_seq: u64, op: TimerOp) -> TimerRow {
    TimerRow {
        seq,
        entity: entity.to_owned(),
        command_seq,
        op,
    }
}

fn set(name: &str) -> TimerOp {
    TimerOp::Set {
        name: name.to_owned(),
    }
}

fn fired(name: &str, set_seq: u64) -> TimerOp {
    TimerOp::Fired {
        name: name.to_owned(),
        set_seq,
    }
}

#[test]
fn timer_records_go_up_to_the_set_of_the_first_armed_timer() {
    let rows = [
        // a: set, fired; b: set, cancelled; c: set (armed); d: set, fired.
        timer(1, "e", 1, set("a")),
        timer(2, "e", 2, fired("a", 1)),
        timer(3, "e", 3, set("b")),
        timer(4, "e", 4, TimerOp::Cancel { name: "b".into() }),
        timer(5, "e", 5, set("c")),
        timer(6, "e", 6, set("d")),
        timer(7, "e", 7, fired("d", 6)),
        // Another entity, every timer disarmed.
        timer(8, "f", 8, set("a")),
        timer(9, "f", 9, fired("a", 8)),
    ];
    let below = timer_below(&rows, 100);
    assert_eq!(below, [("e".to_owned(), 5), ("f".to_owned(), 10)]);
}

#[test]
fn a_fired_record_of_an_older_setting_disarms_nothing_and_is_kept_behind_the_newer_set() {
    let rows = [
        timer(1, "e", 1, set("a")),
        timer(2, "e", 2, set("a")),
        timer(3, "e", 3, fired("a", 1)),
    ];
    assert_eq!(timer_below(&rows, 100), [("e".to_owned(), 2)]);
}

#[test]
fn timer_records_of_commands_above_the_ack_floor_stay() {
    let rows = [
        timer(1, "e", 1, set("a")),
        timer(2, "e", 2, fired("a", 1)),
        timer(3, "e", 3, set("b")),
        timer(4, "e", 4, fired("b", 3)),
    ];
    assert_eq!(timer_below(&rows, 2), [("e".to_owned(), 3)]);
    assert!(timer_below(&rows, 0).is_empty());
}

#[test]
fn dead_letters_go_when_old_and_below_the_ack_floor() {
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    let row = |seq, command_seq, at: u64| DeadLetterRow {
        seq,
        command_seq,
        written: t0 + Duration::from_secs(at),
    };
    let rows = [row(5, 1, 0), row(6, 2, 10), row(7, 3, 20)];
    assert_eq!(
        dead_letters_below(&rows, t0 + Duration::from_secs(15), 10),
        Some(7)
    );
    assert_eq!(
        dead_letters_below(&rows, t0 + Duration::from_secs(15), 1),
        Some(6)
    );
    assert_eq!(dead_letters_below(&rows, t0, 10), None);
    assert_eq!(
        dead_letters_below(&rows, t0 + Duration::from_secs(99), 10),
        Some(8)
    );
}

/// Whether `subject` matches `filter` (`*` matches one token).
fn matches(filter: &str, subject: &str) -> bool {
    let (f, s): (Vec<&str>, Vec<&str>) =
        (filter.split('.').collect(), subject.split('.').collect());
    f.len() == s.len() && f.iter().zip(&s).all(|(f, s)| *f == "*" || f == s)
}

fn snapshotted(names: &Names, entity: &str, below: u64) -> (Covered, u64) {
    let id = EntityId::new(entity).unwrap();
    let covered = names
        .covered_by_snapshot(&names.snapshot_subject(3, &id))
        .unwrap();
    (covered, below)
}

fn purge(subject: &str, below: u64) -> Purge {
    Purge {
        subject: subject.to_owned(),
        below,
    }
}

fn rules(ack_floor: u64, defer: bool) -> Rules {
    Rules {
        ack_floor,
        snapshots_from: 1,
        dead_letters_before: None,
        horizon: u64::MAX,
        defer_timers_of_snapshotted: defer,
    }
}

#[test]
fn events_go_by_their_literal_subject_and_the_partition_s_timers_in_one_request() {
    let names = Names::new("t");
    // Two entities, each a timer set and fired, both snapshotted after.
    let rows = [
        timer(1, "a", 1, set("x")),
        timer(2, "b", 2, set("x")),
        timer(3, "a", 3, fired("x", 1)),
        timer(4, "b", 4, fired("x", 2)),
    ];
    let snaps = vec![snapshotted(&names, "a", 10), snapshotted(&names, "b", 12)];
    let purges = entity_purges(&names, 3, snaps, &rows, &HashMap::new(), &rules(100, true));
    assert_eq!(
        purges,
        [
            purge("t.tmr.3.*", 5),
            purge("t.evt.3.a", 10),
            purge("t.evt.3.b", 12)
        ]
    );
}

#[test]
fn an_armed_timer_holds_the_partition_s_timers_back_and_entities_fall_back() {
    let names = Names::new("t");
    let rows = [
        timer(1, "a", 1, set("x")),
        // b's timer stays armed: the partition's records go below it only.
        timer(2, "b", 2, set("x")),
        timer(3, "a", 3, fired("x", 1)),
        timer(4, "c", 4, set("x")),
        timer(5, "c", 5, fired("x", 4)),
        timer(6, "d", 6, set("x")),
        timer(7, "d", 7, fired("x", 6)),
    ];
    let mut dead_letters = HashMap::new();
    // d has a dead letter behind its snapshot.
    dead_letters.insert("t.dlq.3.d".to_owned(), 8);
    let snaps = vec![snapshotted(&names, "c", 9), snapshotted(&names, "d", 10)];
    let purges = entity_purges(
        &names,
        3,
        snaps.clone(),
        &rows,
        &dead_letters,
        &rules(100, true),
    );
    assert_eq!(
        purges,
        [
            purge("t.tmr.3.*", 2),
            // c's timer records above the bound: its events and timers in one request.
            purge("t.*.3.c", 9),
            purge("t.evt.3.d", 10),
            purge("t.tmr.3.d", 10),
            purge("t.snap.3.d", 10),
            // a is not snapshotted: its own request.
            purge("t.tmr.3.a", 4),
        ]
    );
}

/// A small deterministic generator (no dependency): a linear congruential one.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        (self.0 >> 33) % n
    }
}

#[test]
fn entity_purges_remove_every_record_no_longer_needed_and_nothing_else() {
    let names = Names::new("t");
    let entities = ["a", "b", "c", "d", "e"];
    let mut random = Lcg(7);
    for round in 0..2_000 {
        // A journal: each entity's events and timer records, interleaved.
        let mut events: Vec<(u64, &str)> = Vec::new();
        let mut rows = Vec::new();
        let mut sets: HashMap<(&str, &str), Vec<u64>> = HashMap::new();
        let records = 5 + random.below(40);
        for seq in 1..=records {
            let entity = entities[random.below(entities.len() as u64) as usize];
            let name = ["x", "y"][random.below(2) as usize];
            match random.below(5) {
                0 | 1 => events.push((seq, entity)),
                2 => {
                    sets.entry((entity, name)).or_default().push(seq);
                    rows.push(timer(seq, entity, seq, set(name)));
                }
                3 => rows.push(timer(
                    seq,
                    entity,
                    seq,
                    TimerOp::Cancel { name: name.into() },
                )),
                _ => {
                    // A fired record of the latest set, or of an older one.
                    let Some(set_seqs) = sets.get(&(entity, name)) else {
                        continue;
                    };
                    let set_seq = set_seqs[random.below(set_seqs.len() as u64) as usize];
                    rows.push(timer(seq, entity, seq, fired(name, set_seq)));
                }
            }
        }
        let ack_floor = random.below(records + 2);
        let defer = random.below(2) == 0;
        let mut snaps: Vec<(Covered, u64)> = Vec::new();
        for entity in entities {
            if random.below(2) == 0 {
                snaps.push(snapshotted(&names, entity, 1 + random.below(records + 1)));
            }
        }
        let snapshot_of = |entity: &str| {
            snaps
                .iter()
                .find(|(c, _)| c.each[0] == format!("t.evt.3.{entity}"))
                .map(|(_, below)| *below)
        };
        let keep = timer_keep_from(&rows, ack_floor);
        let purges = entity_purges(
            &names,
            3,
            snaps.clone(),
            &rows,
            &HashMap::new(),
            &rules(ack_floor, defer),
        );
        let removed = |seq: u64, subject: &str| {
            purges
                .iter()
                .any(|p| seq < p.below && matches(&p.subject, subject))
        };
        for (seq, entity) in &events {
            let covered = snapshot_of(entity).is_some_and(|below| *seq < below);
            assert_eq!(
                removed(*seq, &format!("t.evt.3.{entity}")),
                covered,
                "round {round}: event {seq} of {entity}, {purges:?}"
            );
        }
        for row in &rows {
            let snapshot = snapshot_of(&row.entity);
            let unneeded = row.seq < keep[row.entity.as_str()].max(snapshot.unwrap_or(0));
            let gone = removed(row.seq, &format!("t.tmr.3.{}", row.entity));
            // Nothing still needed goes.
            assert!(
                !gone || unneeded,
                "round {round}: {row:?} needed, {purges:?}"
            );
            // What is not needed goes, but for a snapshotted entity's records above its
            // snapshot when they are deferred.
            let deferred = defer && snapshot.is_some_and(|s| row.seq >= s);
            assert!(
                gone || !unneeded || deferred,
                "round {round}: {row:?} left, {purges:?}"
            );
        }
        // Never more requests than one per entity as before, and the partition's one.
        let before = snaps.len()
            + keep
                .iter()
                .filter(|(e, k)| {
                    let s = snapshot_of(e);
                    let from = s.unwrap_or(0);
                    !(s.is_some() && (from >= **k || defer))
                        && rows
                            .iter()
                            .any(|r| r.entity == **e && r.seq >= from && r.seq < **k)
                })
                .count();
        assert!(purges.len() <= before + 1, "round {round}: {purges:?}");
    }
}
