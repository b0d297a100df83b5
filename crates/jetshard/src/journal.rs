//! The journal: fenced writes of a partition's events, and replays of them.
//!
//! Architecture Invariant: every write of a partition other than its fence record goes through
//! [`JournalWriter`], which fences it with the writer's generation. A writer whose generation is
//! no longer the partition's latest gets [`WriteError::Fenced`] from the server, never a stored
//! message.

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::header::HeaderName;
use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::context::Context;
use async_nats::jetstream::stream::{LastRawMessageErrorKind, RawMessageErrorKind, Stream};
use bytes::Bytes;
use futures::StreamExt;

use crate::entity::EntityId;
use crate::error::{BoxError, Error};
use crate::fence::{Fence, header_u64};
use crate::group_commit::{CommitStats, GroupCommit, MAX_BATCH_MESSAGES, Mode, Outgoing};
use crate::telemetry::CommitMetrics;
use crate::trace::TraceParent;
use crate::wire::{
    HDR_COMMAND_SEQ, HDR_DELIVERIES, HDR_ENTITY, HDR_EVENT_VERSION, HDR_EXPECTED_SUBJECT,
    HDR_EXPECTED_SUBJECT_SEQ, HDR_GENERATION, HDR_LAST_OUTCOME, HDR_MSG_ID, HDR_REASON, HDR_ROLLUP,
    HDR_SNAPSHOT_UPTO, HDR_STATE_VERSION, HDR_TRACEPARENT, Names,
};

/// Why a journal write did not happen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    /// The partition has a newer generation: this writer is stale and must stop.
    #[error("fenced: generation {generation} is no longer the partition's latest")]
    Fenced { generation: u64 },
    /// The server did not confirm the write (timeout, leader change, connection loss). The
    /// write may or may not be stored; a retry with the same message ids is safe.
    #[error("journal write not confirmed: {0}")]
    Unconfirmed(#[source] BoxError),
    /// The write can never succeed as it is (an event over the server's `max_payload`): a
    /// retry would fail the same way.
    #[error("journal write refused: {0}")]
    Refused(String),
    /// More events than one atomic batch can hold.
    #[error(
        "a command decided {events} events; at most {MAX_EVENTS_PER_COMMAND} fit one atomic write"
    )]
    TooManyEvents { events: usize },
}

/// The server's limit on messages in one atomic batch: a command's events are one unit.
pub(crate) const MAX_EVENTS_PER_COMMAND: usize = MAX_BATCH_MESSAGES;

/// The JetStream error code behind a publish error, if the server answered with one.
pub(crate) fn server_error_code(
    error: &async_nats::jetstream::context::PublishError,
) -> Option<u64> {
    std::error::Error::source(error)?
        .downcast_ref::<async_nats::jetstream::Error>()
        .map(|e| e.error_code().0)
}

/// A unique token (batch ids, incarnations): the process id, a clock reading and a counter, in
/// hex (a valid subject token).
pub(crate) fn unique_token() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{:x}{:x}{:x}",
        std::process::id(),
        nanos,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Writes one partition's records under one generation, through the partition's
/// [`GroupCommit`].
#[derive(Clone)]
pub(crate) struct JournalWriter {
    names: Arc<Names>,
    partition: u32,
    fence: Fence,
    fence_subject: Arc<str>,
    commit: GroupCommit,
}

impl JournalWriter {
    /// The writer of `partition` under `fence`; starts the partition's group commit, which
    /// ends when the last clone of the writer is dropped.
    pub(crate) fn new(
        js: Context,
        names: Arc<Names>,
        partition: u32,
        fence: Fence,
        mode: Mode,
        stats: Arc<CommitStats>,
        metrics: CommitMetrics,
    ) -> Self {
        let fence_subject = names.fence_subject(partition).into();
        let commit = GroupCommit::start(js, partition, fence.generation, mode, stats, metrics);
        Self {
            names,
            partition,
            fence,
            fence_subject,
            commit,
        }
    }

    pub(crate) fn generation(&self) -> u64 {
        self.fence.generation
    }

    /// Makes a command's events durable, fenced, de-duplicated by `<t>:<command seq>:<index>`,
    /// each marked with the event encoding's `version`. Returns the journal sequence of the last
    /// event (`None` for no events; 0 if the server answered that it had them already).
    ///
    /// A command's events are stored all or none (a fence moved mid-way must not leave half a
    /// command in the journal), together with the other commands the group commit gathers. The
    /// server checks each message against the fence: once another owner has claimed the
    /// partition, every later write is rejected.
    pub(crate) async fn append(
        &self,
        entity: &EntityId,
        command_seq: u64,
        events: Vec<Vec<u8>>,
        version: u32,
        trace: Option<&TraceParent>,
    ) -> Result<Option<u64>, WriteError> {
        if events.len() > MAX_EVENTS_PER_COMMAND {
            return Err(WriteError::TooManyEvents {
                events: events.len(),
            });
        }
        if events.is_empty() {
            return Ok(None);
        }
        let subject = self.names.event_subject(self.partition, entity);
        let records = events
            .into_iter()
            .enumerate()
            .map(|(index, event)| {
                let mut headers = self.fenced_headers();
                headers.insert(HDR_COMMAND_SEQ, command_seq.to_string());
                headers.insert(HDR_EVENT_VERSION, version.to_string());
                headers.insert(HDR_MSG_ID, self.names.event_msg_id(command_seq, index));
                if let Some(trace) = trace {
                    headers.insert(HDR_TRACEPARENT, trace.to_string());
                }
                Outgoing {
                    subject: subject.clone(),
                    headers,
                    payload: event.into(),
                }
            })
            .collect();
        self.commit.write(records).await.map(Some)
    }

    /// Records a command that was given up (undecodable, or failing at every delivery), so an
    /// operator can see it and replay it: `<t>.dlq.<p>`, the command's payload as body.
    pub(crate) async fn dead_letter(
        &self,
        entity: &str,
        command_seq: u64,
        deliveries: u64,
        reason: &str,
        payload: Bytes,
    ) -> Result<(), WriteError> {
        let mut headers = self.fenced_headers();
        headers.insert(HDR_COMMAND_SEQ, command_seq.to_string());
        headers.insert(HDR_ENTITY, entity);
        headers.insert(HDR_DELIVERIES, deliveries.to_string());
        headers.insert(HDR_REASON, sanitize_header(reason));
        headers.insert(
            HDR_MSG_ID,
            format!("{}:dlq:{command_seq}", self.names.entity_type),
        );
        let record = Outgoing {
            subject: self.names.dead_letter_subject(self.partition, entity),
            headers,
            payload,
        };
        self.commit.write(vec![record]).await.map(drop)
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
        headers.insert(HDR_COMMAND_SEQ, snapshot.command_seq.to_string());
        headers.insert(HDR_SNAPSHOT_UPTO, snapshot.upto.to_string());
        headers.insert(HDR_STATE_VERSION, snapshot.version.to_string());
        headers.insert(HDR_ROLLUP, "sub");
        if let Some(outcome) = &snapshot.last_outcome {
            headers.insert(HDR_LAST_OUTCOME, sanitize_header(outcome));
        }
        let record = Outgoing {
            subject: self.names.snapshot_subject(self.partition, entity),
            headers,
            payload: snapshot.state,
        };
        self.commit.write(vec![record]).await
    }

    fn fenced_headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(HDR_GENERATION, self.fence.generation.to_string());
        headers.insert(HDR_EXPECTED_SUBJECT_SEQ, self.fence.seq.to_string());
        headers.insert(HDR_EXPECTED_SUBJECT, &*self.fence_subject);
        headers
    }
}

/// Header values cannot hold line breaks.
fn sanitize_header(value: &str) -> String {
    value
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(512)
        .collect()
}

/// A snapshot of one entity's state, as written to or read from `<t>.snap.<p>.<id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SnapshotRecord {
    /// The state, encoded by the entity's `Snapshots`.
    pub(crate) state: Bytes,
    /// The version of the state's encoding.
    pub(crate) version: u32,
    /// The entity's last command it covers (its events and dead letters included).
    pub(crate) command_seq: u64,
    /// The journal sequence of the entity's last record it covers: records after it are read
    /// on top of it.
    pub(crate) upto: u64,
    /// What the last command came to (`applied <n>`, `rejected <why>`, `dead_lettered <why>`).
    pub(crate) last_outcome: Option<String>,
}

/// The latest snapshot on `subject`, with its own journal sequence; `None` if there is none or
/// it lacks jetshard's headers (then the entity loads from its events).
pub(crate) async fn latest_snapshot(
    journal: &Stream<()>,
    subject: &str,
) -> Result<Option<(u64, SnapshotRecord)>, Error> {
    let message = match journal.get_last_raw_message_by_subject(subject).await {
        Ok(message) => message,
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
        Err(e) => return Err(Error::jetstream(format!("read the snapshot {subject}"), e)),
    };
    let headers = &message.headers;
    let record = (|| {
        header_u64(headers, GENERATION)?;
        Some(SnapshotRecord {
            version: u32::try_from(header_u64(headers, STATE_VERSION)?).ok()?,
            command_seq: header_u64(headers, COMMAND_SEQ)?,
            upto: header_u64(headers, SNAPSHOT_UPTO)?,
            last_outcome: headers.get(LAST_OUTCOME).map(|v| v.as_str().to_owned()),
            state: message.payload.clone(),
        })
    })();
    if record.is_none() {
        tracing::warn!(
            subject,
            seq = message.sequence,
            "snapshot without jetshard headers ignored"
        );
    }
    Ok(record.map(|r| (message.sequence, r)))
}

/// One record of an entity read back from the journal.
pub(crate) struct StoredEvent<'a> {
    /// The entity id as written: not necessarily a valid id (a dead letter of a command whose
    /// subject held none names what it held).
    pub(crate) entity: &'a str,
    /// The record's journal sequence.
    pub(crate) seq: u64,
    pub(crate) command_seq: u64,
    pub(crate) record: Record<'a>,
}

/// What a stored record holds.
pub(crate) enum Record<'a> {
    /// An event, in the given version of its type's encoding.
    Event { version: u32, payload: &'a Bytes },
    /// A dead letter: its command was given up, which counts as processed.
    DeadLetter { reason: &'a str },
}

/// Reads, in journal order, every record on `filter` (a subject, wildcards allowed) from journal
/// sequence `from` up to and including `end`, calling `each` on each event and dead letter.
/// Reads nothing when `end` is before `from`.
///
/// One filter per read: the server serves a consumer with several filters, one of them sparse
/// (a partition's fence records among its events), at a few hundred records a second, against
/// ~100k with one (measured by `jetshard-bench rebuild`, nats-server 2.15).
///
/// The end is a sequence, not "nothing pending": a replica serving the replay may lag behind
/// the stream leader. `end` is the last record on the filter as asked of the leader
/// ([`last_sequence`]), and the replay waits for it, so it sees every record written before
/// that. Returns how many events were read.
pub(crate) async fn replay(
    journal: &Stream<()>,
    filter: String,
    from: u64,
    end: u64,
    mut each: impl FnMut(StoredEvent<'_>) -> Result<(), Error>,
) -> Result<u64, Error> {
    if end == 0 || end < from {
        return Ok(0);
    }
    // Most loads read a short tail: single-message reads, no consumer to create and delete.
    let (mut read, mut from) = (0, from);
    for _ in 0..DIRECT_READS {
        let found = journal
            .raw_message_builder()
            .sequence(from)
            .next_by_subject(filter.clone())
            .send()
            .await;
        let message = match found {
            Ok(message) => message,
            // Removed since `end` was read (a compaction): nothing more.
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => return Ok(read),
            Err(e) => return Err(Error::jetstream(format!("read {filter} from {from}"), e)),
        };
        if message.sequence > end {
            return Ok(read);
        }
        read += take_record(
            &message.subject,
            Some(&message.headers),
            &message.payload,
            message.sequence,
            &mut each,
        )?;
        if message.sequence == end {
            return Ok(read);
        }
        from = message.sequence + 1;
    }
    let deliver_policy = if from <= 1 {
        DeliverPolicy::All
    } else {
        DeliverPolicy::ByStartSequence {
            start_sequence: from,
        }
    };
    let consumer = journal
        .create_consumer(pull::OrderedConfig {
            filter_subject: filter.clone(),
            deliver_policy,
            ..Default::default()
        })
        .await
        .map_err(|e| Error::jetstream(format!("open a replay of {filter}"), e))?;
    let name = consumer.cached_info().name.clone();
    let read = read_all(consumer, &filter, end, &mut each)
        .await
        .map(|more| read + more);
    // Entities load side by side, each with its own reader: left to expire (after 30 s
    // unused), their consumers would pile up on the stream (the server refuses past its limit).
    if let Err(e) = journal.delete_consumer(&name).await {
        tracing::debug!(%filter, error = %e, "replay consumer not deleted; it expires");
    }
    read
}

async fn read_all(
    consumer: async_nats::jetstream::consumer::Consumer<pull::OrderedConfig>,
    filter: &str,
    end: u64,
    each: &mut impl FnMut(StoredEvent<'_>) -> Result<(), Error>,
) -> Result<u64, Error> {
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| Error::jetstream(format!("replay {filter}"), e))?;
    let mut read = 0;
    loop {
        let next = tokio::time::timeout(Duration::from_secs(30), messages.next())
            .await
            .map_err(|e| Error::jetstream(format!("replay {filter}: no message for 30 s"), e))?;
        let message = match next {
            Some(Ok(message)) => message,
            Some(Err(e)) => return Err(Error::jetstream(format!("replay {filter}"), e)),
            None => {
                return Err(Error::jetstream(
                    format!("replay {filter}"),
                    "the replay ended early",
                ));
            }
        };
        let seq = message
            .info()
            .map_err(|e| Error::jetstream(format!("replay {filter}"), e.to_string()))?
            .stream_sequence;
        if seq > end {
            return Ok(read);
        }
        let message = &message.message;
        read += take_record(
            &message.subject,
            message.headers.as_ref(),
            &message.payload,
            seq,
            each,
        )?;
        if seq == end {
            return Ok(read);
        }
    }
}

/// Records read one request each before a replay opens a consumer for the rest.
const DIRECT_READS: usize = 16;

/// Hands one stored record to `each`; whether it was an event (1) or not (0).
fn take_record(
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: &Bytes,
    seq: u64,
    each: &mut impl FnMut(StoredEvent<'_>) -> Result<(), Error>,
) -> Result<u64, Error> {
    match stored_record(subject, headers, payload, seq) {
        Some(record) => {
            let event = u64::from(matches!(record.record, Record::Event { .. }));
            each(record)?;
            Ok(event)
        }
        // Not written by jetshard (no generation or command header): never part of any
        // entity's state. Whoever can publish there should not be able to (docs/SECURITY.md).
        None => {
            tracing::warn!(%subject, seq, "journal record without jetshard headers ignored");
            Ok(0)
        }
    }
}

/// The journal sequence of the last record on `subject`, 0 if there is none (asked of the
/// stream leader).
pub(crate) async fn last_sequence(journal: &Stream<()>, subject: &str) -> Result<u64, Error> {
    match journal.get_last_raw_message_by_subject(subject).await {
        Ok(message) => Ok(message.sequence),
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(0),
        Err(e) => Err(Error::jetstream(
            format!("read the last record on {subject}"),
            e,
        )),
    }
}

// Prebuilt: a lookup by `&str` builds (and allocates) a header name each time, and a replay
// looks up two or three per record.
const GENERATION: HeaderName = HeaderName::from_static(HDR_GENERATION);
const COMMAND_SEQ: HeaderName = HeaderName::from_static(HDR_COMMAND_SEQ);
const ENTITY: HeaderName = HeaderName::from_static(HDR_ENTITY);
const EVENT_VERSION: HeaderName = HeaderName::from_static(HDR_EVENT_VERSION);
const REASON: HeaderName = HeaderName::from_static(HDR_REASON);
const STATE_VERSION: HeaderName = HeaderName::from_static(HDR_STATE_VERSION);
const SNAPSHOT_UPTO: HeaderName = HeaderName::from_static(HDR_SNAPSHOT_UPTO);
const LAST_OUTCOME: HeaderName = HeaderName::from_static(HDR_LAST_OUTCOME);

fn stored_record<'a>(
    subject: &'a str,
    headers: Option<&'a HeaderMap>,
    payload: &'a Bytes,
    seq: u64,
) -> Option<StoredEvent<'a>> {
    let headers = headers?;
    header_u64(headers, GENERATION)?;
    let command_seq = header_u64(headers, COMMAND_SEQ)?;
    match subject.split('.').nth(1)? {
        "evt" => Some(StoredEvent {
            entity: Names::entity_of_subject(subject)?,
            seq,
            command_seq,
            record: Record::Event {
                // Events written before versions were recorded are version 1.
                version: header_u64(headers, EVENT_VERSION)
                    .map_or(1, |v| u32::try_from(v).unwrap_or(u32::MAX)),
                payload,
            },
        }),
        "dlq" => Some(StoredEvent {
            entity: headers.get(ENTITY)?.as_str(),
            seq,
            command_seq,
            record: Record::DeadLetter {
                reason: headers.get(REASON).map_or("", |r| r.as_str()),
            },
        }),
        _ => None,
    }
}
