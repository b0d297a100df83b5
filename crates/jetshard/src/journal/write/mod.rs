//! Fenced writes of a partition's records: events, snapshots, dead letters, outbox and timer
//! records.
//!
//! Architecture Invariant: every write of a partition other than its fence record goes through
//! [`JournalWriter`], which fences it with the writer's generation. A writer whose generation is
//! no longer the partition's latest gets [`WriteError::Fenced`] from the server, never a stored
//! message.

use std::sync::Arc;

use async_nats::header::HeaderName;
use async_nats::jetstream::context::Context;
use async_nats::{HeaderMap, Subject};
use bytes::Bytes;
use futures::FutureExt;
use futures::future::Either;
use serde::Deserialize;
use serde::de::value::MapDeserializer;

use crate::data::OutboxMessage;
use crate::data::origin::Origin;
use crate::data::timers::{Firing, TimerChange};
use crate::entity::EntityId;
use crate::journal::chain::Lineage;
use crate::journal::fence::Fence;
use crate::journal::group_commit::{self, GroupCommit, Outgoing};
use crate::journal::read::SnapshotRecord;
use crate::journal::server::{MAX_EVENTS_PER_COMMAND, WriteError};
use crate::trace::TraceParent;
use crate::wire::{
    HDR_COMMAND_SEQ, HDR_DELIVERIES, HDR_EARLIER, HDR_ENTITY, HDR_EVENT_VERSION,
    HDR_EXPECTED_SUBJECT, HDR_EXPECTED_SUBJECT_SEQ, HDR_GENERATION, HDR_LAST_OUTCOME, HDR_MSG_ID,
    HDR_ORIGIN, HDR_ORIGINS, HDR_OUTBOX_DONE, HDR_OUTBOX_INDEX, HDR_OUTBOX_TARGET, HDR_PREVIOUS,
    HDR_REASON, HDR_ROLLUP, HDR_SNAPSHOT_UPTO, HDR_STATE_VERSION, HDR_TIMER, HDR_TIMER_DUE,
    HDR_TIMER_OP, HDR_TIMER_SET, HDR_TRACEPARENT, HDR_UNIT, Names, decimal_string,
};

/// The records a command writes beside its events, in the same unit.
#[derive(Default, Clone, Copy)]
pub(crate) struct Attached<'a> {
    /// Its outbox messages (`outbox.rs`).
    pub(crate) outbox: &'a [OutboxMessage],
    /// The timers it sets and cancels (`timer.rs`).
    pub(crate) timers: &'a [TimerChange],
    /// The timer it is the command of.
    pub(crate) fired: Option<&'a Firing>,
    /// Where the command came from, if it is an outbox message: on its first event.
    pub(crate) origin: Option<&'a Origin>,
}

/// Writes one partition's records under one generation, through the partition's
/// [`GroupCommit`].
#[derive(Clone)]
pub(crate) struct JournalWriter {
    names: Arc<Names>,
    partition: u32,
    fence: Fence,
    /// The fence headers every record carries, built once: each record starts from a clone,
    /// which has room for the record's own headers without growing.
    fenced: HeaderMap,
    /// [`Self::event_headers`]: the first event version written, and its headers.
    event_headers: Arc<std::sync::OnceLock<(u32, HeaderMap)>>,
    commit: GroupCommit,
    /// The entities a write of this generation was answered "not confirmed" for
    /// ([`Self::certain`]).
    doubted: Arc<Doubted>,
}

/// Entities with a write in doubt, of one generation.
#[derive(Default)]
struct Doubted {
    /// Whether there is any: most generations have none, and ask without a lock.
    any: std::sync::atomic::AtomicBool,
    entities: std::sync::Mutex<std::collections::HashSet<Box<str>>>,
}

impl Doubted {
    fn insert(&self, entity: &str) {
        let mut entities = self
            .entities
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        entities.insert(entity.into());
        self.any.store(true, std::sync::atomic::Ordering::Release);
    }

    fn contains(&self, entity: &str) -> bool {
        self.any.load(std::sync::atomic::Ordering::Acquire)
            && self
                .entities
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains(entity)
    }

    /// Takes note of `written`, a write of `entity`'s records.
    fn note<T>(&self, entity: &str, written: &Result<T, WriteError>) {
        if let Err(WriteError::Unconfirmed(_)) = written {
            self.insert(entity);
        }
    }
}

impl JournalWriter {
    /// The writer of `partition` under `fence`; starts the partition's group commit, which
    /// ends when the last clone of the writer is dropped.
    pub(crate) fn new(
        js: Context,
        names: Arc<Names>,
        partition: u32,
        fence: Fence,
        commit: group_commit::Settings,
    ) -> Self {
        let fenced = fenced_headers(&fence, &names.fence_subject(partition));
        let commit = GroupCommit::start(js, partition, fence.generation, commit);
        Self {
            names,
            partition,
            fence,
            fenced,
            event_headers: Arc::default(),
            commit,
            doubted: Arc::default(),
        }
    }

    pub(crate) fn generation(&self) -> u64 {
        self.fence.generation
    }

    /// The partition it writes.
    pub(crate) fn partition(&self) -> u32 {
        self.partition
    }

    /// A journal sequence every record of the partition's entities is at or below, as far as
    /// this writer knows: its fence record's (every earlier owner's write is before it) or the
    /// highest its own writes were acknowledged at. `None` when a write of its own may be
    /// stored beyond that (see [`GroupCommit::acked`]).
    pub(crate) fn watermark(&self) -> Option<u64> {
        Some(self.commit.acked()?.max(self.fence.seq))
    }

    /// `previous` (what an entity's actor knows of its records before the one it writes, for
    /// `Jetshard-Previous`), unless a write of `entity` under this generation is in doubt: a
    /// record answered "not confirmed" may be stored after the reads that loaded its entity
    /// again and after the writes since, so what its actor knows may have a gap. Then no record
    /// of that entity under this generation carries a link (its loads read as before until the
    /// next generation, whose claim fences such records out). A link speaks of its own
    /// entity's records only, so the other entities go on linking; unless a write was given up
    /// before its answer ([`GroupCommit::in_doubt`]), whose entity is not known here: then no
    /// record of the generation carries one.
    fn certain<'l>(&self, entity: &str, previous: Option<&'l Lineage>) -> Option<&'l Lineage> {
        previous.filter(|_| !self.commit.in_doubt() && !self.doubted.contains(entity))
    }

    /// Puts the links of `previous` on an entity's record: `Jetshard-Previous` on a command's
    /// only record of it, `Jetshard-Unit` with the count `own` of several, and where the
    /// commands before them ended (`Jetshard-Earlier`) when known.
    fn link(headers: &mut HeaderMap, own: usize, previous: &Lineage) {
        let last = previous.last();
        match own {
            0 => return,
            1 => headers.insert(name(HDR_PREVIOUS), decimal_string(last)),
            k => headers.insert(name(HDR_UNIT), format!("{k} {last}")),
        }
        if let Some(earlier) = previous.earlier_header() {
            headers.insert(name(HDR_EARLIER), earlier);
        }
    }

    /// Makes a command's events durable, fenced, de-duplicated by `<t>:<command seq>:<index>`,
    /// each marked with the event encoding's `version`. Returns the journal sequence of the
    /// command's last record of the entity (`None` for none: no events nor timer records; 0 if
    /// the server answered that it had them already).
    ///
    /// A command's events are stored all or none (a fence moved mid-way must not leave half a
    /// command in the journal), together with the other commands the group commit gathers. The
    /// server checks every write against the fence (a single publish on its own, an atomic batch
    /// at its commit, whose message alone names it): once another owner has claimed the
    /// partition, every later write is rejected.
    ///
    /// The command's outbox records (`<t>.out.<p>`, one per message, see `outbox.rs`) go in the
    /// same all-or-none unit as its events.
    ///
    /// `event_subject` is the entity's [`Names::event_subject`], kept by its actor.
    ///
    /// `previous`: a journal sequence every earlier record of the entity is at or below, if the
    /// caller knows one, recorded on the unit's last record of the entity (`Jetshard-Previous`
    /// on a command's only record of it, `Jetshard-Unit` with the count of several, and
    /// `Jetshard-Earlier` for where the commands before ended) unless a
    /// write of this generation is in doubt ([`Self::certain`]). The unit's records of the
    /// entity come last in it, after its outbox records, so that it is stored in the sequences
    /// up to the one the write returns: loads follow these links back (`journal/chain/`).
    ///
    /// Not an `async fn`: the records are built when it is called, so that the future (part of
    /// every command's future) holds them and the write, not the arguments besides.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn append<'a>(
        &'a self,
        entity: &EntityId,
        event_subject: &Subject,
        command_seq: u64,
        events: Vec<Bytes>,
        version: u32,
        trace: Option<&TraceParent>,
        attached: Attached<'_>,
        previous: Option<&Lineage>,
    ) -> impl Future<Output = Result<Option<u64>, WriteError>> + Send + use<'a> {
        let Attached {
            outbox,
            timers,
            fired,
            origin,
        } = attached;
        let records = events.len() + outbox.len() + timers.len() + usize::from(fired.is_some());
        if records > MAX_EVENTS_PER_COMMAND {
            return Either::Right(std::future::ready(Err(WriteError::TooManyEvents {
                events: records,
            })));
        }
        if records == 0 {
            return Either::Right(std::future::ready(Ok(None)));
        }
        // Built only for a command that writes such records (most write events alone).
        let outbox_subject = if outbox.is_empty() {
            Subject::from_static("")
        } else {
            Subject::from(self.names.outbox_subject(self.partition))
        };
        let outbox_records = outbox.iter().enumerate().map(|(index, message)| {
            let mut headers = self.fenced_headers();
            headers.insert(name(HDR_COMMAND_SEQ), command_seq.to_string());
            headers.insert(name(HDR_ENTITY), entity.as_str());
            headers.insert(name(HDR_OUTBOX_TARGET), message.subject.as_str());
            headers.insert(name(HDR_OUTBOX_INDEX), index.to_string());
            headers.insert(
                name(HDR_MSG_ID),
                self.names.outbox_record_msg_id(command_seq, index),
            );
            Outgoing {
                subject: outbox_subject.clone(),
                headers,
                payload: message.payload.clone(),
            }
        });
        let timer_subject = if timers.is_empty() && fired.is_none() {
            Subject::from_static("")
        } else {
            Subject::from(self.names.timer_subject(self.partition, entity))
        };
        let timer_records = timer_records(&self.names.entity_type, command_seq, timers, fired)
            .map(|(mut headers, payload)| {
                for (header, values) in self.fenced.iter() {
                    for value in values {
                        headers.insert(header.clone(), value.clone());
                    }
                }
                Outgoing {
                    subject: timer_subject.clone(),
                    headers,
                    payload,
                }
            })
            .collect::<Vec<_>>();
        // The command's records of the entity: its events and timer records, stored last in the
        // unit (after its outbox records), so that they hold the unit's last sequences.
        let own = records - outbox.len();
        let mut records: Vec<Outgoing> = outbox_records
            .chain(events.into_iter().enumerate().map(|(index, event)| {
                let mut headers = self.event_headers(version);
                headers.insert(name(HDR_COMMAND_SEQ), decimal_string(command_seq));
                headers.insert(
                    name(HDR_MSG_ID),
                    self.names.event_msg_id(command_seq, index),
                );
                if let Some(trace) = trace {
                    headers.insert(name(HDR_TRACEPARENT), trace.to_string());
                }
                if let (Some(origin), 0) = (origin, index) {
                    headers.insert(HDR_ORIGIN, origin.to_string());
                }
                Outgoing {
                    subject: event_subject.clone(),
                    headers,
                    payload: event,
                }
            }))
            .chain(timer_records)
            .collect();
        if let (Some(previous), Some(last)) =
            (self.certain(entity.as_str(), previous), records.last_mut())
        {
            Self::link(&mut last.headers, own, previous);
        }
        // A command with outbox records only wrote nothing of the entity: its sequence is not
        // the entity's (its next record links past it, to its last own record).
        let (doubted, entity) = (Arc::clone(&self.doubted), entity.clone());
        Either::Left(self.commit.write(records).map(move |written| {
            doubted.note(entity.as_str(), &written);
            written.map(|seq| (own > 0).then_some(seq))
        }))
    }

    /// Records that every outbox message of the command at `command_seq` was published.
    pub(crate) async fn outbox_done(
        &self,
        entity: &str,
        command_seq: u64,
    ) -> Result<(), WriteError> {
        let mut headers = self.fenced_headers();
        headers.insert(name(HDR_COMMAND_SEQ), command_seq.to_string());
        headers.insert(name(HDR_ENTITY), entity);
        headers.insert(name(HDR_OUTBOX_DONE), "1");
        headers.insert(name(HDR_MSG_ID), self.names.outbox_done_msg_id(command_seq));
        let record = Outgoing {
            subject: self.names.outbox_subject(self.partition).into(),
            headers,
            payload: Bytes::new(),
        };
        self.commit.write(vec![record]).await.map(drop)
    }

    /// Records a command that was given up (undecodable, or failing at every delivery), so an
    /// operator can see it and replay it: `<t>.dlq.<p>`, the command's payload as body. Returns
    /// its journal sequence (0 if the server had it already). `previous` as for
    /// [`Self::append`] (the record is on the entity's subject when `entity` is a valid id).
    pub(crate) async fn dead_letter(
        &self,
        entity: &str,
        command_seq: u64,
        deliveries: u64,
        reason: &str,
        payload: Bytes,
        previous: Option<&Lineage>,
    ) -> Result<u64, WriteError> {
        let mut headers = self.fenced_headers();
        headers.insert(name(HDR_COMMAND_SEQ), command_seq.to_string());
        headers.insert(name(HDR_ENTITY), entity);
        headers.insert(name(HDR_DELIVERIES), deliveries.to_string());
        headers.insert(name(HDR_REASON), sanitize_header(reason));
        headers.insert(name(HDR_MSG_ID), self.names.dead_letter_msg_id(command_seq));
        if let Some(previous) = self.certain(entity, previous) {
            Self::link(&mut headers, 1, previous);
        }
        let record = Outgoing {
            subject: self
                .names
                .dead_letter_subject(self.partition, entity)
                .into(),
            headers,
            payload,
        };
        let written = self.commit.write(vec![record]).await;
        self.doubted.note(entity, &written);
        written
    }

    /// Writes a snapshot of an entity's state on `<t>.snap.<p>.<id>`, fenced like an event (a
    /// stale owner's snapshot is rejected by the server), rolling up the entity's previous
    /// snapshot. Returns the snapshot's journal sequence.
    pub(crate) async fn snapshot(
        &self,
        entity: &EntityId,
        snapshot: SnapshotRecord,
    ) -> Result<u64, WriteError> {
        let mut headers = self.fenced_headers();
        headers.insert(name(HDR_COMMAND_SEQ), snapshot.command_seq.to_string());
        headers.insert(name(HDR_SNAPSHOT_UPTO), snapshot.upto.to_string());
        headers.insert(name(HDR_STATE_VERSION), snapshot.version.to_string());
        headers.insert(name(HDR_ROLLUP), "sub");
        if let Some(outcome) = &snapshot.last_outcome {
            headers.insert(name(HDR_LAST_OUTCOME), sanitize_header(outcome));
        }
        if let Some(origins) = &snapshot.origins {
            headers.insert(HDR_ORIGINS, origins.as_str());
        }
        let record = Outgoing {
            subject: self.names.snapshot_subject(self.partition, entity).into(),
            headers,
            payload: snapshot.state,
        };
        self.commit.write(vec![record]).await
    }

    /// A new record's headers: the fence's.
    fn fenced_headers(&self) -> HeaderMap {
        self.fenced.clone()
    }

    /// A new event's headers: the fence's and the encoding's `version`, which is left out when
    /// it is 1 (readers take an event without it as version 1: the events written before
    /// versions were recorded). Leaving it out saves the header's two allocations and ~27 bytes
    /// per event; the fence's map then grows once when the event's own go in.
    /// Another version: cloned from a map built once, whose capacity (4 headers: room for 7)
    /// takes the event's own without growing.
    fn event_headers(&self, version: u32) -> HeaderMap {
        if version == UNRECORDED_EVENT_VERSION {
            return self.fenced.clone();
        }
        let (built, headers) = self.event_headers.get_or_init(|| {
            let mut headers = self.fenced.clone();
            headers.insert(name(HDR_EVENT_VERSION), version.to_string());
            (version, headers)
        });
        if *built == version {
            return headers.clone();
        }
        let mut headers = self.fenced.clone();
        headers.insert(name(HDR_EVENT_VERSION), version.to_string());
        headers
    }
}

/// The event version a reader assumes when an event has no `Jetshard-Event-Version`.
const UNRECORDED_EVENT_VERSION: u32 = 1;

/// A header name without an allocation (`&str` names are copied at every use).
fn name(header: &'static str) -> HeaderName {
    HeaderName::from_static(header)
}

/// How many headers the map every record starts from has room for: the fence's 3 and an
/// event's own (command sequence, message id, and its links: `Jetshard-Previous` or
/// `Jetshard-Unit`, `Jetshard-Earlier`), so that a record's headers are one clone and do not
/// grow (a grown map rehashes every header it holds). An event with a trace context or an
/// origin grows it once: a room for those too would make every clone twice as large.
const RECORD_HEADER_ROOM: usize = 7;

/// The fence headers of every record written under `fence`, in a map with room for
/// [`RECORD_HEADER_ROOM`] headers (a clone keeps the room).
///
/// `HeaderMap` has no `with_capacity`; its deserializer sizes the map by the number of entries
/// it is given, duplicates included, so the fence's headers are given with the first of them
/// repeated up to the room (a repeated name replaces itself: the map holds the three).
fn fenced_headers(fence: &Fence, fence_subject: &str) -> HeaderMap {
    let generation = fence.generation.to_string();
    let seq = fence.seq.to_string();
    let fence_headers = [
        (HDR_GENERATION, generation.as_str()),
        (HDR_EXPECTED_SUBJECT_SEQ, seq.as_str()),
        (HDR_EXPECTED_SUBJECT, fence_subject),
    ];
    let repeated = std::iter::repeat_n(fence_headers[0], RECORD_HEADER_ROOM - fence_headers.len());
    let entries = fence_headers
        .into_iter()
        .chain(repeated)
        .map(|(header, value)| (header, vec![value]));
    let sized = HeaderMap::deserialize(MapDeserializer::<_, serde::de::value::Error>::new(entries));
    sized.unwrap_or_else(|_| {
        // Not reached (the names and values are valid): the same headers, without the room.
        let mut headers = HeaderMap::new();
        for (header, value) in fence_headers {
            headers.insert(name(header), value);
        }
        headers
    })
}

/// The timer records of a command (headers without the fence, and body): its sets and cancels,
/// and the `fired` record of the timer it is the command of.
fn timer_records<'a>(
    entity_type: &'a str,
    command_seq: u64,
    timers: &'a [TimerChange],
    fired: Option<&'a Firing>,
) -> impl Iterator<Item = (HeaderMap, Bytes)> + 'a {
    let record = move |index: usize, op: &str, timer: &str| {
        let mut headers = HeaderMap::new();
        headers.insert(name(HDR_COMMAND_SEQ), command_seq.to_string());
        headers.insert(name(HDR_TIMER_OP), op);
        headers.insert(name(HDR_TIMER), timer);
        headers.insert(
            name(HDR_MSG_ID),
            crate::wire::timer_record_msg_id(entity_type, command_seq, index),
        );
        headers
    };
    let changes = timers
        .iter()
        .enumerate()
        .map(move |(index, change)| match change {
            TimerChange::Set {
                name: timer,
                due_ms,
                payload,
                ..
            } => {
                let mut headers = record(index, "set", timer);
                headers.insert(name(HDR_TIMER_DUE), due_ms.to_string());
                (headers, payload.clone())
            }
            TimerChange::Cancel { name: timer } => (record(index, "cancel", timer), Bytes::new()),
        });
    let fired = fired.map(move |f| {
        let mut headers = record(timers.len(), "fired", &f.name);
        headers.insert(name(HDR_TIMER_SET), f.set_seq.to_string());
        (headers, Bytes::new())
    });
    changes.chain(fired)
}

/// Header values cannot hold line breaks.
fn sanitize_header(value: &str) -> String {
    value
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(512)
        .collect()
}

/// A pipelined writer's settings for unit tests (a single server), with `write_timeout`.
#[cfg(test)]
pub(crate) fn test_settings(write_timeout: std::time::Duration) -> group_commit::Settings {
    group_commit::Settings {
        mode: group_commit::Mode::Pipelined,
        stats: Arc::new(group_commit::CommitStats::default()),
        metrics: crate::telemetry::CommitMetrics {
            records: metrics::Histogram::noop(),
            conflicts: metrics::Counter::noop(),
        },
        write_timeout,
        leader_elections: None,
    }
}

/// A pipelined writer of partition 0 at generation 1 over `js`, for unit tests on a real
/// server: its fence record is published now, after whatever the test wrote before, so the
/// writer's watermark (the fence record's sequence until it writes) covers those records.
#[cfg(test)]
pub(crate) async fn test_writer(
    js: Context,
    names: Arc<Names>,
    write_timeout: std::time::Duration,
) -> JournalWriter {
    let seq = js
        .publish(names.fence_subject(0), "fence".into())
        .await
        .expect("publish a fence record")
        .await
        .expect("store it")
        .sequence;
    let fence = Fence { generation: 1, seq };
    JournalWriter::new(js, names, 0, fence, test_settings(write_timeout))
}

#[cfg(test)]
mod tests;
