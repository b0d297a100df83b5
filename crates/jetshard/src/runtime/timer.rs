//! Durable timers: an entity sets and cancels them while deciding; a due timer fires as a
//! command through the normal path, once.
//!
//! - **Set / cancel** are journal records of the entity (`<t>.tmr.<p>.<id>` with
//!   `Jetshard-Timer-Op`, not events), written in the same all-or-none unit as the events of the
//!   command that decided them, fenced like them. A stale owner's set is refused by the fence, so
//!   it never exists.
//! - The entity's armed timers are part of its [`Seed`](crate::runtime::entity_actor::Seed), rebuilt with
//!   it when it is loaded (its timer records after its latest snapshot: no snapshot is written
//!   while a timer is armed, so none covers an armed timer's `set`).
//! - The owner keeps a table of the partition's armed timers ([`Timers`]: read from the
//!   partition's timer records on acquisition, [`armed_in_partition`], without loading any
//!   entity; then from the outcomes of its commands) and, when one is due, publishes its command
//!   to `<t>.cmd.<id>` with `Jetshard-Timer`, `Jetshard-Timer-Set` and
//!   `Nats-Msg-Id: <t>:timer:<id>:<name>:<set seq>` (again every [`REFIRE_AFTER`] until it has
//!   fired: the msg id makes a repeat within the duplicate window one stored command).
//! - **Fired once**: the entity actor decides a timer's command only if the entity still has
//!   that timer armed under that set sequence, and writes a `fired` record in the same unit as
//!   its events (also when the command is rejected). A repeat, or the command of a timer
//!   cancelled or set again meanwhile, is dropped as a duplicate. The check is in the entity's
//!   own order, against its durable records: exact across crashes, failovers and restarts.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::Context;
use async_nats::jetstream::stream::Stream;
use tokio::time::Instant;

use crate::data::timers::{Armed, TimerReport};
use crate::entity::EntityId;
use crate::error::Error;
use crate::journal::{Record, TimerRecord};
use crate::wire::{HDR_MSG_ID, HDR_TIMER, HDR_TIMER_SET, Names};

/// A due timer whose command has not come back applied is published again after this long.
pub(crate) const REFIRE_AFTER: Duration = Duration::from_secs(30);

/// One armed timer in the owner's table.
struct Entry {
    armed: Armed,
    /// When its command was last published.
    published: Option<Instant>,
}

/// The armed timers of a partition, as its owner knows them: from the outcomes of its commands,
/// and from the partition's timer records read once on acquisition ([`found`](Self::found)).
#[derive(Default)]
pub(crate) struct Timers {
    entries: HashMap<(EntityId, Box<str>), Entry>,
    /// Whether the timer records read on acquisition are in.
    scanned: bool,
    /// Until then: the timers an outcome armed or disarmed, which the records read (older)
    /// must not arm again.
    reported: HashSet<(EntityId, Box<str>)>,
}

impl Timers {
    /// Arms (or re-arms) a timer. The same setting told again (a loaded entity tells all it
    /// has armed) keeps when its command was last published.
    pub(crate) fn arm(&mut self, entity: &EntityId, name: Box<str>, armed: Armed) {
        let key = (entity.clone(), name);
        if self
            .entries
            .get(&key)
            .is_some_and(|e| e.armed.set_seq == armed.set_seq)
        {
            return;
        }
        self.entries.insert(
            key,
            Entry {
                armed,
                published: None,
            },
        );
    }

    /// Arms the timers found in the journal on acquisition, but those an outcome armed or
    /// disarmed since (which is newer: the read may end before that command's records).
    pub(crate) fn found(&mut self, found: Vec<(EntityId, Box<str>, Armed)>) {
        for (entity, name, armed) in found {
            let key = (entity, name);
            if self.reported.contains(&key) {
                continue;
            }
            self.entries.entry(key).or_insert(Entry {
                armed,
                published: None,
            });
        }
        self.scanned = true;
        self.reported = HashSet::new();
    }

    /// Takes what one command did to an entity's timers.
    pub(crate) fn report(&mut self, entity: &EntityId, reports: Vec<TimerReport>) {
        for report in reports {
            if !self.scanned {
                let name = match &report {
                    TimerReport::Armed { name, .. } | TimerReport::Disarmed { name } => name,
                };
                self.reported.insert((entity.clone(), name.clone()));
            }
            match report {
                TimerReport::Armed { name, armed } => self.arm(entity, name, armed),
                TimerReport::Disarmed { name } => {
                    self.entries.remove(&(entity.clone(), name));
                }
            }
        }
    }

    /// How many are armed.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is armed.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The timers due at `now_ms` whose command is to be published (again), marked published
    /// at `now`.
    pub(crate) fn due(&mut self, now_ms: u64, now: Instant) -> Vec<(EntityId, Box<str>, Armed)> {
        let mut due = Vec::new();
        for ((entity, name), entry) in &mut self.entries {
            let waited = entry
                .published
                .is_none_or(|at| now.duration_since(at) >= REFIRE_AFTER);
            if entry.armed.due_ms <= now_ms && waited {
                entry.published = Some(now);
                due.push((entity.clone(), name.clone(), entry.armed.clone()));
            }
        }
        due
    }
}

/// The armed timers of a partition, read from its timer records (`<t>.tmr.<p>.*`: one filter,
/// none of the events): how a new owner learns the timers of entities it has not loaded (they
/// load lazily, on their first command). Records are folded as the entity folds them
/// ([`Seed::replay`](crate::runtime::entity_actor::Seed::replay)).
///
/// # Errors
/// The journal could not be read.
pub(crate) async fn armed_in_partition(
    journal: &Stream<()>,
    names: &Names,
    partition: u32,
) -> Result<Vec<(EntityId, Box<str>, Armed)>, Error> {
    let filter = names.partition_timers(partition);
    let end = crate::journal::last_sequence(journal, &filter).await?;
    let mut armed: HashMap<(EntityId, Box<str>), Armed> = HashMap::new();
    crate::journal::replay(journal, filter, 1, end, |stored| {
        let (Record::Timer(timer), Ok(entity)) = (&stored.record, EntityId::new(stored.entity))
        else {
            return Ok(());
        };
        match timer {
            TimerRecord::Set {
                name,
                due_ms,
                payload,
            } => {
                let timer = Armed {
                    set_seq: stored.command_seq,
                    due_ms: *due_ms,
                    payload: (*payload).clone(),
                };
                armed.insert((entity, (*name).into()), timer);
            }
            TimerRecord::Cancel { name } => {
                armed.remove(&(entity, (*name).into()));
            }
            TimerRecord::Fired { name, set_seq } => {
                let key = (entity, (*name).into());
                if armed.get(&key).is_some_and(|a| a.set_seq == *set_seq) {
                    armed.remove(&key);
                }
            }
        }
        Ok(())
    })
    .await?;
    Ok(armed
        .into_iter()
        .map(|((entity, name), timer)| (entity, name, timer))
        .collect())
}

/// `Nats-Msg-Id` of a timer's command.
pub(crate) fn fired_msg_id(names: &Names, entity: &EntityId, name: &str, set_seq: u64) -> String {
    names.timer_fired_msg_id(entity, name, set_seq)
}

/// Publishes a due timer's command (not awaiting the stream's ack: a lost one is published
/// again after [`REFIRE_AFTER`]).
pub(crate) async fn fire(
    js: &Context,
    names: &Names,
    entity: &EntityId,
    name: &str,
    armed: &Armed,
) {
    let mut headers = HeaderMap::new();
    headers.insert(HDR_TIMER, name);
    headers.insert(HDR_TIMER_SET, armed.set_seq.to_string());
    headers.insert(HDR_MSG_ID, fired_msg_id(names, entity, name, armed.set_seq));
    let subject = names.command_subject(entity);
    if let Err(e) = js
        .publish_with_headers(subject, headers, armed.payload.clone())
        .await
    {
        tracing::warn!(%entity, timer = name, error = %e, "timer command not published; published again later");
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::data::timers::{Firing, firing_of, valid_name};

    fn armed(set_seq: u64, due_ms: u64) -> Armed {
        Armed {
            set_seq,
            due_ms,
            payload: Bytes::from_static(b"x"),
        }
    }

    #[test]
    fn a_due_timer_is_published_once_per_refire_period_until_it_is_disarmed() {
        let mut timers = Timers::default();
        let e = EntityId::new("e").unwrap();
        timers.arm(&e, "a".into(), armed(1, 100));
        timers.arm(&e, "b".into(), armed(2, 500));
        let now = Instant::now();
        assert!(timers.due(50, now).is_empty());
        let due = timers.due(100, now);
        assert_eq!(due.len(), 1);
        assert_eq!(&*due[0].1, "a");
        assert!(timers.due(200, now).is_empty(), "not again at once");
        assert_eq!(timers.due(200, now + REFIRE_AFTER).len(), 1);
        timers.report(&e, vec![TimerReport::Disarmed { name: "a".into() }]);
        timers.report(&e, vec![TimerReport::Disarmed { name: "b".into() }]);
        assert_eq!(timers.len(), 0);
    }

    #[test]
    fn a_timer_told_again_by_a_loaded_entity_is_not_published_again_before_its_time() {
        let mut timers = Timers::default();
        let e = EntityId::new("e").unwrap();
        timers.arm(&e, "a".into(), armed(1, 100));
        let now = Instant::now();
        assert_eq!(timers.due(100, now).len(), 1);
        timers.arm(&e, "a".into(), armed(1, 100));
        assert!(
            timers.due(200, now).is_empty(),
            "the same setting: not again at once"
        );
        timers.arm(&e, "a".into(), armed(2, 100));
        assert_eq!(
            timers.due(200, now).len(),
            1,
            "a new setting is due at once"
        );
    }

    #[test]
    fn a_timer_found_in_the_journal_does_not_replace_what_an_outcome_reported() {
        let mut timers = Timers::default();
        let e = EntityId::new("e").unwrap();
        timers.report(
            &e,
            vec![TimerReport::Armed {
                name: "a".into(),
                armed: armed(7, 100),
            }],
        );
        timers.found(vec![
            (e.clone(), "a".into(), armed(3, 50)),
            (e.clone(), "b".into(), armed(4, 50)),
        ]);
        let mut due = timers.due(1_000, Instant::now());
        due.sort_by(|x, y| x.1.cmp(&y.1));
        let sets: Vec<u64> = due.iter().map(|(_, _, a)| a.set_seq).collect();
        assert_eq!(sets, [7, 4]);
    }

    #[test]
    fn a_timer_found_in_the_journal_is_not_armed_again_after_an_outcome_disarmed_it() {
        // The read on acquisition ends before the command that cancels `a`; the command's
        // outcome comes first.
        let mut timers = Timers::default();
        let e = EntityId::new("e").unwrap();
        timers.report(&e, vec![TimerReport::Disarmed { name: "a".into() }]);
        timers.found(vec![(e.clone(), "a".into(), armed(3, 50))]);
        assert!(timers.due(1_000, Instant::now()).is_empty());
        // Once the read is in, outcomes alone keep the table.
        timers.report(
            &e,
            vec![TimerReport::Armed {
                name: "a".into(),
                armed: armed(9, 50),
            }],
        );
        assert_eq!(timers.due(1_000, Instant::now()).len(), 1);
        assert!(timers.reported.is_empty());
    }

    #[test]
    fn a_firing_is_read_from_its_headers() {
        let mut headers = HeaderMap::new();
        headers.insert(HDR_TIMER, "pay");
        headers.insert(HDR_TIMER_SET, "42");
        assert_eq!(
            firing_of(Some(&headers)),
            Some(Firing {
                name: "pay".into(),
                set_seq: 42
            })
        );
        assert_eq!(firing_of(Some(&HeaderMap::new())), None);
        assert!(valid_name("pay-1") && !valid_name("a b") && !valid_name(""));
    }
}
