//! Compaction of a partition's journal: the records its live state no longer needs, found
//! ([`plan`]) and purged ([`purge`]). One way for both callers: an operator's
//! `Admin::compact` and each owner's background sweep (`runtime/compaction.rs`).
//!
//! A record goes only when the journal itself shows it is not needed, by records that stay:
//! - an entity's events and timer records up to its latest snapshot's `Upto` (the snapshot
//!   holds their effect; no snapshot is written while a timer is armed);
//! - a partition's outbox records up to the first record of a command without a done record
//!   (everything below is of commands whose messages were all confirmed: the records and
//!   their done records go in one purge, so no recovery can find a record without its done
//!   record and publish it again);
//! - an entity's timer records below its first record still needed: the `set` of an armed
//!   timer, or a record of a command above the partition's ack floor (a command that may come
//!   back, whose records say it was handled: the same rule as `Admin::purge_dead_letters`);
//! - a partition's dead letters older than the retention, below the first one that is not
//!   (or whose command is above the ack floor).
//!
//! What the requests look like is chosen for what they cost the server ([`entity_purges`]): a
//! purge steps over every journal message between the first and last record it matches, so
//! the partition's timer records go in one request, each snapshotted entity's events in one
//! on their literal subject.
//!
//! Each rule is monotone: what shows a record unneeded (a snapshot, a done record, a `fired`
//! or `cancel` record, the ack floor, the clock) is never undone, so a purge planned by a
//! process that has since lost the partition removes nothing a newer owner needs. The sweep
//! checks its fence before each batch all the same.

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use async_nats::HeaderMap;
use async_nats::jetstream::stream::Stream;

use crate::entity::EntityId;
use crate::error::Error;
use crate::journal::read::{Record, Scan, TimerRecord};
use crate::wire::{
    Covered, HDR_COMMAND_SEQ, HDR_GENERATION, HDR_OUTBOX_DONE, HDR_SNAPSHOT_UPTO, Names, header_u64,
};

/// What a plan may remove.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// The partition's consumer's ack floor: commands at or below it never come back.
    pub(crate) ack_floor: u64,
    /// Snapshots are read from this journal sequence on (those before were planned already).
    pub(crate) snapshots_from: u64,
    /// Dead letters written before this instant go (`None`: kept).
    pub(crate) dead_letters_before: Option<SystemTime>,
    /// Only records up to this journal sequence are planned (`u64::MAX`: all). The background
    /// sweep passes the journal's last sequence read shortly before it (an interval, at most
    /// 2 s), so that a record stays at least that long: what copies or reads the journal (a
    /// mirror, a backup, a projection) has that long to see it.
    pub(crate) horizon: u64,
    /// Whether an entity purged to its snapshot in this plan keeps its timer records after
    /// the snapshot until a later plan (the background sweep): they go with its next
    /// snapshot's purge, or by themselves at the next plan without one, so that an active
    /// entity costs one purge request a sweep, not two. `Admin::compact` takes them at once.
    pub(crate) defer_timers_of_snapshotted: bool,
}

/// One purge: the messages on `subject` (a filter, wildcards allowed) below journal sequence
/// `below`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Purge {
    pub(crate) subject: String,
    pub(crate) below: u64,
}

/// What to purge in one partition.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub(crate) purges: Vec<Purge>,
    /// Snapshots read.
    pub(crate) snapshots: u64,
    /// Where the next plan reads snapshots from (the last one read, plus one).
    pub(crate) snapshots_next: u64,
}

/// Finds what can go in `partition` under `rules`.
///
/// # Errors
/// The journal could not be read.
pub(crate) async fn plan(
    journal: &Stream<()>,
    names: &Names,
    partition: u32,
    rules: &Rules,
) -> Result<Plan, Error> {
    let mut plan = Plan {
        snapshots_next: rules.snapshots_from,
        ..Plan::default()
    };
    let snapshots = names.partition_snapshots(partition);
    // An entity snapshotted several times since the last plan is purged once, to its latest.
    let mut covered_to: BTreeMap<String, (Covered, u64)> = BTreeMap::new();
    scan_headers(
        journal,
        &snapshots,
        rules.snapshots_from,
        rules.horizon,
        |row| {
            plan.snapshots_next = row.seq + 1;
            let upto = header_u64(row.headers, HDR_SNAPSHOT_UPTO);
            let written = header_u64(row.headers, HDR_GENERATION).is_some();
            if let (Some(upto), true, Some(covered)) =
                (upto, written, names.covered_by_snapshot(row.subject))
            {
                plan.snapshots += 1;
                let entry = covered_to
                    .entry(covered.records.clone())
                    .or_insert((covered, 0));
                entry.1 = entry.1.max(upto + 1);
            }
        },
    )
    .await?;
    // An entity's dead letters go by their retention, not with its snapshot: read after the
    // snapshots (so every dead letter written before one read is seen), they decide whether
    // its snapshot's purge can take every other record of the entity in one request.
    let entity_dead_letters = names.partition_entities_dead_letters(partition);
    let mut dead_letter_rows = Vec::new();
    let mut dead_letter_first: HashMap<String, u64> = HashMap::new();
    scan_headers(journal, &entity_dead_letters, 1, rules.horizon, |row| {
        dead_letter_first
            .entry(row.subject.to_owned())
            .or_insert(row.seq);
        dead_letter_rows.push(DeadLetterRow::of(&row));
    })
    .await?;
    {
        let outbox = names.outbox_subject(partition);
        let mut rows = Vec::new();
        scan_headers(journal, &outbox, 1, rules.horizon, |row| {
            if let Some(command_seq) = header_u64(row.headers, HDR_COMMAND_SEQ) {
                rows.push(OutboxRow {
                    seq: row.seq,
                    command_seq,
                    done: row.headers.get(HDR_OUTBOX_DONE).is_some(),
                });
            }
        })
        .await?;
        if let Some(below) = outbox_below(&rows) {
            // First: one request takes the partition's confirmed outbox records, two of the
            // three records of a command with a message, while a paced sweep's entity purges
            // spread over half its interval.
            plan.purges.insert(
                0,
                Purge {
                    subject: outbox,
                    below,
                },
            );
        }
        let timers = names.partition_timers(partition);
        let end = crate::journal::last_sequence(journal, &timers)
            .await?
            .min(rules.horizon);
        let mut rows = Vec::new();
        crate::journal::replay(journal, timers, 1, end, |stored| {
            if let Record::Timer(timer) = &stored.record {
                rows.push(TimerRow {
                    seq: stored.seq,
                    entity: stored.entity.to_owned(),
                    command_seq: stored.command_seq,
                    op: TimerOp::of(timer),
                });
            }
            Ok(())
        })
        .await?;
        plan.purges.extend(entity_purges(
            names,
            partition,
            covered_to.into_values().collect(),
            &rows,
            &dead_letter_first,
            rules,
        ));
    }
    if let Some(before) = rules.dead_letters_before {
        if let Some(below) = dead_letters_below(&dead_letter_rows, before, rules.ack_floor) {
            plan.purges.push(Purge {
                subject: entity_dead_letters,
                below,
            });
        }
        let filter = names.partition_dead_letters(partition);
        let mut rows = Vec::new();
        scan_headers(journal, &filter, 1, rules.horizon, |row| {
            rows.push(DeadLetterRow::of(&row));
        })
        .await?;
        if let Some(below) = dead_letters_below(&rows, before, rules.ack_floor) {
            plan.purges.push(Purge {
                subject: filter,
                below,
            });
        }
    }
    Ok(plan)
}

/// Carries out one purge; how many messages it removed.
///
/// # Errors
/// The server refused the purge.
pub(crate) async fn purge(journal: &Stream<()>, purge: &Purge) -> Result<u64, Error> {
    let done = journal
        .purge()
        .filter(purge.subject.clone())
        .sequence(purge.below)
        .await
        .map_err(|e| Error::jetstream(format!("purge {}", purge.subject), e))?;
    Ok(done.purged)
}

/// The purges of a partition's entity records: the events each snapshot covers, and the
/// timer records no longer needed (`rows`, the partition's, read up to the horizon).
///
/// The requests are chosen for what they cost the server, not only for what they remove: a
/// filtered purge steps over every journal message between the first and the last record it
/// matches (nats-server's `PurgeEx`), comparing each one's subject with the filter, so its
/// cost is the span of the records, not their number; a literal subject is compared as a
/// string, a wildcard token by token (docs/PERFORMANCE.md, "Why compaction costs the p99 on R3"). So:
/// - the partition's timer records below the first one any of its entities still needs go in
///   one request on `<t>.tmr.<p>.*` (one walk over the partition's timer records, where one
///   request per entity walked each entity's span);
/// - a snapshotted entity's events up to the snapshot go in one request on its literal
///   `<t>.evt.<p>.<id>`, unless it has timer records below the snapshot that the partition's
///   request leaves: then one request on `<t>.*.<p>.<id>` takes both (three literal ones
///   when a dead letter of the entity lies behind the snapshot). Its older snapshots are
///   gone already: each snapshot rolls up the previous one when it is written;
/// - an entity's timer records left above the partition's bound go in a request of their own
///   on `<t>.tmr.<p>.<id>`, deferred to a later plan for an entity purged to its snapshot
///   here when `rules.defer_timers_of_snapshotted` (its next snapshot's purge takes them).
///
/// `snapshotted`: per entity, what its latest snapshot covers and the journal sequence its
/// records go below (the snapshot's `Upto` + 1). `dead_letter_first`: per entity dead-letter
/// subject, its first dead letter.
fn entity_purges(
    names: &Names,
    partition: u32,
    snapshotted: Vec<(Covered, u64)>,
    rows: &[TimerRow],
    dead_letter_first: &HashMap<String, u64>,
    rules: &Rules,
) -> Vec<Purge> {
    let mut purges = Vec::new();
    // Per entity, the journal sequences of its timer records, and how far its snapshot covers
    // its records.
    let mut timer_seqs: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for row in rows {
        timer_seqs.entry(&row.entity).or_default().push(row.seq);
    }
    let snapshot_below: HashMap<&str, u64> = snapshotted
        .iter()
        .filter_map(|(covered, below)| Some((Names::entity_of_subject(&covered.each[1])?, *below)))
        .collect();
    // Per entity, its timer records go below `bound`: those its snapshot covers, and those
    // the timer rule lets go (`timer_keep_from`).
    let keep_from = timer_keep_from(rows, rules.ack_floor);
    let bounds: BTreeMap<&str, u64> = keep_from
        .iter()
        .map(|(entity, keep)| {
            let snapshot = snapshot_below.get(entity).copied().unwrap_or(0);
            (*entity, (*keep).max(snapshot))
        })
        .collect();
    // The partition's bound: its first timer record still needed (past the last read if
    // none is).
    let partition_below = timer_seqs
        .iter()
        .filter_map(|(entity, seqs)| {
            let bound = bounds.get(entity).copied().unwrap_or(0);
            seqs.iter().copied().filter(|s| *s >= bound).min()
        })
        .min()
        .unwrap_or_else(|| rows.iter().map(|r| r.seq + 1).max().unwrap_or(0));
    if rows.iter().any(|r| r.seq < partition_below) {
        purges.push(Purge {
            subject: names.partition_timers(partition),
            below: partition_below,
        });
    }
    // Whether `entity` has timer records in [from, below).
    let timers_in = |entity: &str, from: u64, below: u64| {
        timer_seqs
            .get(entity)
            .is_some_and(|seqs| seqs.iter().any(|s| *s >= from && *s < below))
    };
    for (covered, below) in &snapshotted {
        let [events, timers, snapshots] = &covered.each;
        let entity = Names::entity_of_subject(timers).unwrap_or_default();
        if !timers_in(entity, partition_below, *below) {
            // The common case: one literal request for the entity's events.
            purges.push(Purge {
                subject: events.clone(),
                below: *below,
            });
            continue;
        }
        let dead_letter_below = dead_letter_first
            .get(&covered.dead_letters)
            .is_some_and(|first| first < below);
        if dead_letter_below {
            // Rare: a dead letter lies behind the snapshot; it stays for its retention.
            for subject in [events, timers, snapshots] {
                purges.push(Purge {
                    subject: subject.clone(),
                    below: *below,
                });
            }
        } else {
            // One request for the entity's events, timer records and older snapshots.
            purges.push(Purge {
                subject: covered.records.clone(),
                below: *below,
            });
        }
    }
    for (entity, below) in &bounds {
        let snapshot = snapshot_below.get(*entity).copied();
        if snapshot.is_some_and(|s| s >= *below || rules.defer_timers_of_snapshotted) {
            // Its snapshot's purge takes them, or a later plan does.
            continue;
        }
        let from = snapshot.unwrap_or(0).max(partition_below);
        if !timers_in(entity, from, *below) {
            continue;
        }
        // Records of an invalid id are never written (the writer takes an `EntityId`).
        if let Ok(id) = EntityId::new(*entity) {
            purges.push(Purge {
                subject: names.timer_subject(partition, &id),
                below: *below,
            });
        }
    }
    purges
}

/// One outbox record or done record, as compaction sees it.
#[derive(Debug, Clone, Copy)]
struct OutboxRow {
    seq: u64,
    command_seq: u64,
    done: bool,
}

/// Where the partition's outbox can be purged to: below the first record of a command that
/// has no done record (all of it if every command is done); `None` if nothing can go.
fn outbox_below(rows: &[OutboxRow]) -> Option<u64> {
    let done: std::collections::HashSet<u64> = rows
        .iter()
        .filter(|r| r.done)
        .map(|r| r.command_seq)
        .collect();
    let last = rows.iter().map(|r| r.seq).max()?;
    let first_open = rows
        .iter()
        .filter(|r| !done.contains(&r.command_seq))
        .map(|r| r.seq)
        .min();
    let below = first_open.unwrap_or(last + 1);
    let first = rows.iter().map(|r| r.seq).min()?;
    (below > first).then_some(below)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TimerOp {
    Set { name: String },
    Cancel { name: String },
    Fired { name: String, set_seq: u64 },
}

impl TimerOp {
    fn of(record: &TimerRecord<'_>) -> Self {
        match record {
            TimerRecord::Set { name, .. } => Self::Set {
                name: (*name).to_owned(),
            },
            TimerRecord::Cancel { name } => Self::Cancel {
                name: (*name).to_owned(),
            },
            TimerRecord::Fired { name, set_seq } => Self::Fired {
                name: (*name).to_owned(),
                set_seq: *set_seq,
            },
        }
    }
}

/// One timer record, as compaction sees it.
#[derive(Debug, Clone)]
struct TimerRow {
    seq: u64,
    entity: String,
    command_seq: u64,
    op: TimerOp,
}

/// Per entity with timer records, the journal sequence its timer records are needed from:
/// the first record still needed (the `set` of a timer still armed, or a record of a command
/// above the ack floor, which may be redelivered and must find itself handled), or past its
/// last record if none is. Every record below it can go.
///
/// Why the entity's timers fold the same without them: a purged `set` was overridden by a later
/// `set` of its name, or disarmed by a `cancel` or `fired` after it (its timer is not armed),
/// and a purged `cancel` or `fired` follows the `set` it disarmed, purged with it or before.
fn timer_keep_from(rows: &[TimerRow], ack_floor: u64) -> BTreeMap<&str, u64> {
    let mut by_entity: BTreeMap<&str, Vec<&TimerRow>> = BTreeMap::new();
    for row in rows {
        by_entity.entry(&row.entity).or_default().push(row);
    }
    let mut keep = BTreeMap::new();
    for (entity, mut rows) in by_entity {
        rows.sort_by_key(|r| r.seq);
        // name -> (set record's journal seq, set seq)
        let mut armed: HashMap<&str, (u64, u64)> = HashMap::new();
        for row in &rows {
            match &row.op {
                TimerOp::Set { name } => {
                    armed.insert(name, (row.seq, row.command_seq));
                }
                TimerOp::Cancel { name } => {
                    armed.remove(name.as_str());
                }
                TimerOp::Fired { name, set_seq } => {
                    if armed.get(name.as_str()).is_some_and(|a| a.1 == *set_seq) {
                        armed.remove(name.as_str());
                    }
                }
            }
        }
        let first_armed = armed.values().map(|a| a.0).min();
        let first_open = rows
            .iter()
            .find(|r| r.command_seq > ack_floor)
            .map(|r| r.seq);
        let last = rows.last().map_or(0, |r| r.seq);
        let keep_from = [first_armed, first_open]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(last + 1);
        keep.insert(entity, keep_from);
    }
    keep
}

/// One dead letter, as compaction sees it.
#[derive(Debug, Clone, Copy)]
struct DeadLetterRow {
    seq: u64,
    command_seq: u64,
    written: SystemTime,
}

impl DeadLetterRow {
    fn of(row: &HeaderRow<'_>) -> Self {
        Self {
            seq: row.seq,
            command_seq: header_u64(row.headers, HDR_COMMAND_SEQ).unwrap_or(u64::MAX),
            written: row.published,
        }
    }
}

/// Where dead letters can be purged to: below the first one written at or after `before` or
/// whose command is above the ack floor.
fn dead_letters_below(rows: &[DeadLetterRow], before: SystemTime, ack_floor: u64) -> Option<u64> {
    let first = rows.iter().map(|r| r.seq).min()?;
    let last = rows.iter().map(|r| r.seq).max()?;
    let keep_from = rows
        .iter()
        .filter(|r| r.written >= before || r.command_seq > ack_floor)
        .map(|r| r.seq)
        .min()
        .unwrap_or(last + 1);
    (keep_from > first).then_some(keep_from)
}

/// One message's headers, read by [`scan_headers`].
struct HeaderRow<'a> {
    seq: u64,
    subject: &'a str,
    headers: &'a HeaderMap,
    published: SystemTime,
}

/// Reads the headers of the messages on `filter` from journal sequence `from` up to the last
/// one there when it starts (and at most `upto`), in order (`journal::scan`).
async fn scan_headers(
    journal: &Stream<()>,
    filter: &str,
    from: u64,
    upto: u64,
    mut each: impl FnMut(HeaderRow<'_>),
) -> Result<(), Error> {
    let end = crate::journal::last_sequence(journal, filter)
        .await?
        .min(upto);
    let how = Scan {
        headers_only: true,
        none_pending_is_done: true,
    };
    let empty = HeaderMap::new();
    crate::journal::scan(
        journal,
        filter,
        from,
        end,
        how,
        |message, seq, published| {
            each(HeaderRow {
                seq,
                subject: &message.subject,
                headers: message.headers.as_ref().unwrap_or(&empty),
                published,
            });
            Ok(())
        },
    )
    .await
}

#[cfg(test)]
mod tests;
