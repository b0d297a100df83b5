//! Reads of the journal: a partition's records replayed in order, an entity's latest
//! snapshot, the last sequence on a subject.

use std::time::{Duration, SystemTime};

use async_nats::HeaderMap;
use async_nats::header::HeaderName;
use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::stream::{
    DirectGetErrorKind, LastRawMessageErrorKind, RawMessageErrorKind, Stream,
};
use async_nats::jetstream::{self, message::StreamMessage};
use bytes::Bytes;
use futures::StreamExt;

use crate::error::Error;
use crate::wire::header_u64;
use crate::wire::{
    HDR_COMMAND_SEQ, HDR_ENTITY, HDR_EVENT_VERSION, HDR_GENERATION, HDR_LAST_OUTCOME, HDR_ORIGIN,
    HDR_ORIGINS, HDR_PREVIOUS, HDR_REASON, HDR_SNAPSHOT_UPTO, HDR_STATE_VERSION, HDR_TIMER,
    HDR_TIMER_DUE, HDR_TIMER_OP, HDR_TIMER_SET, Names,
};

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
    /// The origins of the outbox messages the entity remembers having applied
    /// (`Jetshard-Origins`; `None` when there are none, and in snapshots written before they were
    /// kept).
    pub(crate) origins: Option<String>,
}

/// The latest snapshot on `subject` (read as [`last_record`] reads), with its own journal
/// sequence; `None` if there is none or it lacks jetshard's headers (then the entity loads from
/// its events).
pub(crate) async fn latest_snapshot(
    journal: &Stream<()>,
    subject: &str,
    direct: bool,
) -> Result<Option<(u64, SnapshotRecord)>, Error> {
    Ok(last_record(journal, subject, direct)
        .await?
        .and_then(|message| snapshot_record(&message)))
}

/// The snapshot `message` holds (read from `<t>.snap.<p>.<id>`), with its journal sequence;
/// `None`, with a warning, if it lacks jetshard's headers.
pub(crate) fn snapshot_record(message: &StreamMessage) -> Option<(u64, SnapshotRecord)> {
    let headers = &message.headers;
    let record = (|| {
        header_u64(headers, GENERATION)?;
        Some(SnapshotRecord {
            version: u32::try_from(header_u64(headers, STATE_VERSION)?).ok()?,
            command_seq: header_u64(headers, COMMAND_SEQ)?,
            upto: header_u64(headers, SNAPSHOT_UPTO)?,
            last_outcome: headers.get(LAST_OUTCOME).map(|v| v.as_str().to_owned()),
            origins: headers.get(ORIGINS).map(|v| v.as_str().to_owned()),
            state: message.payload.clone(),
        })
    })();
    if record.is_none() {
        tracing::warn!(
            subject = %message.subject,
            seq = message.sequence,
            "snapshot without jetshard headers ignored"
        );
    }
    record.map(|r| (message.sequence, r))
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
    Event {
        version: u32,
        payload: &'a Bytes,
        /// Where the command came from, if it was an outbox message (`Jetshard-Origin`).
        origin: Option<&'a str>,
    },
    /// A dead letter: its command was given up, which counts as processed.
    DeadLetter { reason: &'a str },
    /// A timer record (`<t>.tmr.<p>.<id>`, not an event).
    Timer(TimerRecord<'a>),
}

/// A timer record read back.
pub(crate) enum TimerRecord<'a> {
    Set {
        name: &'a str,
        due_ms: u64,
        payload: &'a Bytes,
    },
    Cancel {
        name: &'a str,
    },
    Fired {
        name: &'a str,
        set_seq: u64,
    },
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
    each: impl FnMut(StoredEvent<'_>) -> Result<(), Error>,
) -> Result<u64, Error> {
    Ok(replay_with(journal, filter, from, end, Reads::Leader, each)
        .await?
        .events)
}

/// How a replay's single-message reads reach the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    /// Through the API: the stream leader answers.
    Leader,
    /// By direct get, its answer final: the journal has a single replica (see [`last_record`]).
    Direct,
    /// By direct get, which any replica answers (a quarter of the server's CPU of an API read):
    /// a replica behind the leader holds a prefix of the stream, so it never answers a wrong
    /// record, only "none" for one past its end. A "none" is asked again of the leader.
    DirectConfirmed,
}

/// What a replay read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Replayed {
    /// Events handed on.
    pub(crate) events: u64,
    /// Requests made of the server: single-message reads, and one for a consumer.
    pub(crate) requests: u64,
}

/// [`replay`], its single-message reads made as `reads` says.
pub(crate) async fn replay_with(
    journal: &Stream<()>,
    filter: String,
    from: u64,
    end: u64,
    mut reads: Reads,
    mut each: impl FnMut(StoredEvent<'_>) -> Result<(), Error>,
) -> Result<Replayed, Error> {
    let mut done = Replayed::default();
    if end == 0 || end < from {
        return Ok(done);
    }
    // Most loads read a short tail: single-message reads, no consumer to create and delete.
    let mut from = from;
    for _ in 0..DIRECT_READS {
        // Nothing more (removed since `end` was read: a compaction), or past the end.
        let next = next_record(journal, &filter, from, &mut reads, &mut done.requests).await?;
        let Some(message) = next else {
            return Ok(done);
        };
        if message.sequence > end {
            return Ok(done);
        }
        done.events += take_message(&message, &mut each)?;
        if message.sequence == end {
            return Ok(done);
        }
        from = message.sequence + 1;
    }
    done.requests += 1;
    // Boxed: the ordered consumer's future is large, and only a long tail gets here.
    Box::pin(scan(
        journal,
        &filter,
        from,
        end,
        Scan::default(),
        |message, seq, _| {
            done.events += take_record(
                &message.subject,
                message.headers.as_ref(),
                &message.payload,
                seq,
                &mut each,
            )?;
            Ok(())
        },
    ))
    .await?;
    Ok(done)
}

/// The first record on `filter` at or after journal sequence `from`, `None` if there is none:
/// as `reads` says (a failure of a direct get other than "none" turns them off: the API is
/// asked from then on).
async fn next_record(
    journal: &Stream<()>,
    filter: &str,
    from: u64,
    reads: &mut Reads,
    requests: &mut u64,
) -> Result<Option<StreamMessage>, Error> {
    *requests += 1;
    if *reads != Reads::Leader {
        match journal
            .direct_get_next_for_subject(filter.to_owned(), Some(from))
            .await
        {
            Ok(message) => return Ok(Some(message)),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound && *reads == Reads::Direct => {
                return Ok(None);
            }
            // Perhaps past the end of a replica behind: the leader says.
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => *requests += 1,
            Err(e) => {
                tracing::debug!(%filter, error = %e, "direct get failed; asking the API");
                *reads = Reads::Leader;
                *requests += 1;
            }
        }
    }
    match journal
        .raw_message_builder()
        .sequence(from)
        .next_by_subject(filter.to_owned())
        .send()
        .await
    {
        Ok(message) => Ok(Some(message)),
        Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(Error::jetstream(format!("read {filter} from {from}"), e)),
    }
}

/// Whether `known`, the last record of each of an entity's subjects (a `multi_last` answer,
/// complete up to `end`, the last of them), holds every record of the entity from journal
/// sequence `from` to `end`: the record at `end` names a sequence every earlier record of the
/// entity is at or below (`Jetshard-Previous`, written by the entity's actor on a command's
/// only record), that sequence is another known record naming one in turn, and so on down to
/// one below `from`; and no known record in the range is off that chain. Then the entity's
/// tail is [`replay_known`]'s, with no read. Not when the chain breaks: a record without the
/// header (written before it existed, or one of a command's several records), or one a
/// compaction purged.
pub(crate) fn tail_is_known(known: &[StreamMessage], from: u64, end: u64) -> bool {
    let record = |seq: u64| {
        known
            .iter()
            .find(|m| m.sequence == seq && !Names::is_snapshot_subject(&m.subject))
    };
    let mut chained = 0;
    let mut at = end;
    while at >= from {
        let Some(previous) = record(at).and_then(|r| header_u64(&r.headers, PREVIOUS)) else {
            return false;
        };
        if previous >= at {
            return false;
        }
        chained += 1;
        at = previous;
    }
    chained == in_range(known, from, end).count()
}

/// Hands the records of `known` from `from` to `end` to `each`, in journal order, as [`replay`]
/// would read them (snapshots passed); how many were events. For a tail that
/// [`tail_is_known`].
pub(crate) fn replay_known(
    known: &[StreamMessage],
    from: u64,
    end: u64,
    mut each: impl FnMut(StoredEvent<'_>) -> Result<(), Error>,
) -> Result<u64, Error> {
    let mut events = 0;
    let mut next = from;
    // At most one record per subject of the entity: no need to sort.
    while let Some(message) = in_range(known, next, end).min_by_key(|m| m.sequence) {
        events += take_message(message, &mut each)?;
        next = message.sequence + 1;
    }
    Ok(events)
}

/// Hands `records`, an entity's records in journal order (found by following their links,
/// `journal/chain/`), to `each`, as [`replay`] would read them; how many were events.
pub(crate) fn replay_found(
    records: &[StreamMessage],
    mut each: impl FnMut(StoredEvent<'_>) -> Result<(), Error>,
) -> Result<u64, Error> {
    let mut events = 0;
    for message in records {
        events += take_message(message, &mut each)?;
    }
    Ok(events)
}

/// The records of `known` (snapshots aside) from `from` to `end`.
fn in_range(known: &[StreamMessage], from: u64, end: u64) -> impl Iterator<Item = &StreamMessage> {
    known.iter().filter(move |m| {
        (from..=end).contains(&m.sequence) && !Names::is_snapshot_subject(&m.subject)
    })
}

/// How [`scan`] reads.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Scan {
    /// Headers only, no payloads.
    pub(crate) headers_only: bool,
    /// Nothing pending when the consumer is made means nothing to read. Not for a replay:
    /// a replica serving it may not have `end` yet (it is waited for instead); right where
    /// reading less only does less (compaction's plans).
    pub(crate) none_pending_is_done: bool,
}

/// Reads the messages on `filter` (one subject, wildcards allowed) from journal sequence
/// `from` up to and including `end`, in order, with an ordered consumer (deleted after use),
/// calling `each` with each message, its journal sequence and when it was stored (an error of
/// `each` ends the read with it). It ends at
/// `end`, or at the last message on the filter before it (`end` was removed since it was
/// read: a compaction); it fails if no message comes for 30 s.
pub(crate) async fn scan(
    journal: &Stream<()>,
    filter: &str,
    from: u64,
    end: u64,
    how: Scan,
    mut each: impl FnMut(&jetstream::Message, u64, SystemTime) -> Result<(), Error>,
) -> Result<(), Error> {
    if end == 0 || end < from {
        return Ok(());
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
            filter_subject: filter.to_owned(),
            deliver_policy,
            headers_only: how.headers_only,
            ..Default::default()
        })
        .await
        .map_err(|e| Error::jetstream(format!("open a read of {filter}"), e))?;
    let name = consumer.cached_info().name.clone();
    let read = async {
        if how.none_pending_is_done && consumer.cached_info().num_pending == 0 {
            return Ok(());
        }
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| Error::jetstream(format!("read {filter}"), e))?;
        loop {
            let next = tokio::time::timeout(Duration::from_secs(30), messages.next())
                .await
                .map_err(|e| Error::jetstream(format!("read {filter}: no message for 30 s"), e))?;
            let message = match next {
                Some(Ok(message)) => message,
                Some(Err(e)) => return Err(Error::jetstream(format!("read {filter}"), e)),
                None => return Err(Error::jetstream(format!("read {filter}"), "ended early")),
            };
            let info = message
                .info()
                .map_err(|e| Error::jetstream(format!("read {filter}"), e.to_string()))?;
            let (seq, pending) = (info.stream_sequence, info.pending);
            let published = SystemTime::from(info.published);
            if seq > end {
                return Ok(());
            }
            each(&message, seq, published)?;
            // Nothing more on the filter: `end` itself was removed since it was read (a
            // compaction), or this is it.
            if seq == end || pending == 0 {
                return Ok(());
            }
        }
    };
    let read = read.await;
    // Entities load side by side, each with its own reader: left to expire (after 30 s
    // unused), their consumers would pile up on the stream (the server refuses past its limit).
    if let Err(e) = journal.delete_consumer(&name).await {
        tracing::debug!(%filter, error = %e, "read consumer not deleted; it expires");
    }
    read
}

/// Records read one request each before a replay opens a consumer for the rest.
const DIRECT_READS: usize = 16;

/// [`take_record`] of a message read by itself (a direct get, a `multi_last` answer).
fn take_message(
    message: &StreamMessage,
    each: &mut impl FnMut(StoredEvent<'_>) -> Result<(), Error>,
) -> Result<u64, Error> {
    take_record(
        &message.subject,
        Some(&message.headers),
        &message.payload,
        message.sequence,
        each,
    )
}

/// Hands one stored record to `each`; whether it was an event (1) or not (0).
fn take_record(
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: &Bytes,
    seq: u64,
    each: &mut impl FnMut(StoredEvent<'_>) -> Result<(), Error>,
) -> Result<u64, Error> {
    // A replay of every record of an entity (`<t>.*.<p>.<id>`) passes its snapshots: they are
    // read on their own, before it.
    if Names::is_snapshot_subject(subject) {
        return Ok(0);
    }
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

/// The last record on `filter` (wildcards allowed: `<t>.*.<p>.<id>` is every record of one
/// entity), `None` if there is none. By direct get when `direct` (the journal has a single
/// replica: the server that answers is the stream's only one, so it is as fresh as the leader's
/// API); a direct get costs the server a quarter of an API get (measured with nats-server 2.15:
/// ~6.5 against ~28 us of CPU per read; docs/PERFORMANCE.md, "Loading an entity"). A journal without
/// `allow_direct` (or any other failure of the direct get) is asked through the API, which
/// the stream leader answers.
pub(crate) async fn last_record(
    journal: &Stream<()>,
    filter: &str,
    direct: bool,
) -> Result<Option<StreamMessage>, Error> {
    if direct {
        match journal.direct_get_last_for_subject(filter).await {
            Ok(message) => return Ok(Some(message)),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => return Ok(None),
            Err(e) => tracing::debug!(filter, error = %e, "direct get failed; asking the API"),
        }
    }
    match journal.get_last_raw_message_by_subject(filter).await {
        Ok(message) => Ok(Some(message)),
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(Error::jetstream(
            format!("read the last record on {filter}"),
            e,
        )),
    }
}

/// The journal sequence of the first record on `subject` (a compaction purges from the
/// front), `None` if there is none.
pub(crate) async fn first_sequence(
    journal: &Stream<()>,
    subject: &str,
) -> Result<Option<u64>, Error> {
    let found = journal
        .raw_message_builder()
        .sequence(1)
        .next_by_subject(subject.to_owned())
        .send()
        .await;
    match found {
        Ok(message) => Ok(Some(message.sequence)),
        Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(Error::jetstream(
            format!("read the first record on {subject}"),
            e,
        )),
    }
}

/// The journal sequence of the last record on `subject`, 0 if there is none (asked of the
/// stream leader).
pub(crate) async fn last_sequence(journal: &Stream<()>, subject: &str) -> Result<u64, Error> {
    Ok(last_record(journal, subject, false)
        .await?
        .map_or(0, |message| message.sequence))
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
const ORIGIN: HeaderName = HeaderName::from_static(HDR_ORIGIN);
const ORIGINS: HeaderName = HeaderName::from_static(HDR_ORIGINS);
const PREVIOUS: HeaderName = HeaderName::from_static(HDR_PREVIOUS);
const TIMER_OP: HeaderName = HeaderName::from_static(HDR_TIMER_OP);
const TIMER: HeaderName = HeaderName::from_static(HDR_TIMER);
const TIMER_DUE: HeaderName = HeaderName::from_static(HDR_TIMER_DUE);
const TIMER_SET: HeaderName = HeaderName::from_static(HDR_TIMER_SET);

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
        "tmr" => {
            let name = headers.get(TIMER)?.as_str();
            let timer = match headers.get(TIMER_OP)?.as_str() {
                "set" => TimerRecord::Set {
                    name,
                    due_ms: header_u64(headers, TIMER_DUE)?,
                    payload,
                },
                "cancel" => TimerRecord::Cancel { name },
                "fired" => TimerRecord::Fired {
                    name,
                    set_seq: header_u64(headers, TIMER_SET)?,
                },
                _ => return None,
            };
            Some(StoredEvent {
                entity: Names::entity_of_subject(subject)?,
                seq,
                command_seq,
                record: Record::Timer(timer),
            })
        }
        "evt" => Some(StoredEvent {
            entity: Names::entity_of_subject(subject)?,
            seq,
            command_seq,
            record: Record::Event {
                // Events written before versions were recorded are version 1.
                version: header_u64(headers, EVENT_VERSION)
                    .map_or(1, |v| u32::try_from(v).unwrap_or(u32::MAX)),
                payload,
                origin: headers.get(ORIGIN).map(|o| o.as_str()),
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

#[cfg(test)]
mod tests;
