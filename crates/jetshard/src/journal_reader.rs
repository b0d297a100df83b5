//! Reading an entity type's journal back, for tools, audits and checkers: every record of the
//! journal, of one partition, or on one subject, in journal order, decoded into typed values
//! ([`JournalRecord`]).
//!
//! The records and their layout are the wire contract (docs/WIRE.md): events, snapshots, fence
//! records, timer records, outbox records, dead letters and a crash watch's unpin records, all
//! on `<t>.<kind>.<p>[.<id>]` in the stream `<T>_JOURNAL` (or `<T>_JOURNAL_<k>`, a partition's
//! stream of a journal spread over several). Decoding never fails: a header that
//! is missing or unreadable is `None`, a subject the contract does not name is
//! [`RecordKind::Other`]. What to make of such a record is the reader's business (the testkit's
//! history checker calls it malformed, `Admin::dead_letters` reads zeros).
//!
//! The running system does not read through this module: an owner's loading reads one entity's
//! records with single-message reads first (`journal::replay`), which a reader of whole
//! partitions has no use for.
//!
//! ```no_run
//! # async fn run(client: jetshard::async_nats::Client) -> Result<(), jetshard::Error> {
//! use jetshard::journal_reader::{JournalReader, RecordKind};
//!
//! let js = jetshard::async_nats::jetstream::new(client);
//! let reader = JournalReader::open(&js, "order").await?;
//! for record in reader.partition(3).await? {
//!     if let RecordKind::Event { entity, payload, .. } = &record.kind {
//!         println!("{} {entity}: {} bytes", record.seq, payload.len());
//!     }
//! }
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::Context;
use async_nats::jetstream::consumer::{Consumer, pull};
use async_nats::jetstream::stream::Stream;
use bytes::Bytes;
use futures::StreamExt;

use crate::error::Error;
use crate::journal::fence::{FenceRecord, FenceRecordError};
use crate::journal::server::{Streams, recorded_names};
use crate::wire::header_u64;
use crate::wire::{
    HDR_COMMAND_SEQ, HDR_DELIVERIES, HDR_ENTITY, HDR_EVENT_VERSION, HDR_GENERATION,
    HDR_LAST_OUTCOME, HDR_MSG_ID, HDR_OUTBOX_DONE, HDR_OUTBOX_INDEX, HDR_OUTBOX_TARGET, HDR_REASON,
    HDR_SNAPSHOT_UPTO, HDR_STATE_VERSION, HDR_TIMER, HDR_TIMER_DUE, HDR_TIMER_OP, HDR_TIMER_SET,
    Names,
};

/// How long a read waits for the next record before it gives up.
pub(crate) const READ_STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// One record of the journal, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JournalRecord {
    /// Its sequence in its journal stream (the stream of its partition).
    pub seq: u64,
    /// Its subject, `<t>.<kind>.<p>[.<id>]`.
    pub subject: String,
    /// The partition token of the subject (`None` if it is not a number, or there is none).
    pub partition: Option<u32>,
    /// `Jetshard-Generation`: the writer's generation (every record jetshard writes has it).
    pub generation: Option<u64>,
    /// `Jetshard-Command-Seq`: the command that wrote it (for a snapshot, the last command it
    /// covers; for a timer set, its set sequence).
    pub command_seq: Option<u64>,
    /// What the record is, and what it holds.
    pub kind: RecordKind,
}

/// What a journal record is, decoded from its subject and headers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordKind {
    /// `<t>.evt.<p>.<id>`: an event.
    Event {
        /// The entity id.
        entity: String,
        /// `Jetshard-Event-Version` (1 when absent: written before versions were recorded).
        version: u32,
        /// The event, as the entity type encoded it.
        payload: Bytes,
    },
    /// `<t>.snap.<p>.<id>`: a snapshot of an entity's state.
    Snapshot {
        /// The entity id.
        entity: String,
        /// `Jetshard-State-Version`: the version of the state's encoding.
        version: Option<u32>,
        /// `Jetshard-Snapshot-Upto`: the journal sequence of the last record it covers.
        upto: Option<u64>,
        /// `Jetshard-Last-Outcome`: what the last command it covers came to.
        last_outcome: Option<String>,
        /// The state, as the entity type's `Snapshots` encoded it.
        state: Bytes,
    },
    /// `<t>.fence.<p>`: the claim of a generation, its body decoded.
    Fence(Result<FenceRecord, FenceRecordError>),
    /// `<t>.tmr.<p>.<id>`: a timer set, cancelled or fired.
    Timer {
        /// The entity id.
        entity: String,
        /// `Jetshard-Timer`: the timer's name.
        name: Option<String>,
        /// `Jetshard-Timer-Op` and its details (`None` if missing or unknown).
        op: Option<TimerOp>,
        /// A set's payload: the command the timer sends when it fires.
        payload: Bytes,
    },
    /// `<t>.out.<p>`: an outbox record.
    Outbox(OutboxRecord),
    /// `<t>.dlq.<p>.<id>` (or `<t>.dlq.<p>`, for a command whose subject held no valid id): a
    /// command given up.
    DeadLetter {
        /// `Jetshard-Entity`: the entity id as the command's subject held it.
        entity: Option<String>,
        /// `Jetshard-Deliveries`: how often it had been delivered.
        deliveries: Option<u64>,
        /// `Jetshard-Reason`: why it was given up.
        reason: Option<String>,
        /// The command, as published.
        payload: Bytes,
    },
    /// `<t>.unpin.<p>`: a crash watch's request to move the partition's pin.
    Unpin,
    /// A subject outside the wire contract (another entity type's, or an unknown kind).
    Other,
}

/// What a timer record says (`Jetshard-Timer-Op`: a fixed set, a new one would be a change of
/// the wire contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerOp {
    /// Armed, due at `due_ms` (`Jetshard-Timer-Due`, Unix milliseconds).
    Set {
        /// When it falls due, Unix milliseconds.
        due_ms: u64,
    },
    /// Disarmed.
    Cancel,
    /// Fired: the setting with this set sequence (`Jetshard-Timer-Set`).
    Fired {
        /// The set sequence.
        set_seq: u64,
    },
}

/// An outbox record: one message a command sends, or the mark that all of them were published.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutboxRecord {
    /// A message to publish.
    Message {
        /// `Jetshard-Entity`: the entity whose command sent it.
        entity: Option<String>,
        /// `Jetshard-Outbox-Target`: the subject it goes to.
        target: Option<String>,
        /// `Jetshard-Outbox-Index`: its place among the command's messages.
        index: Option<u64>,
        /// `Nats-Msg-Id` it is published with.
        msg_id: Option<String>,
        /// Its body.
        payload: Bytes,
    },
    /// `Jetshard-Outbox-Done`: every message of the command was published.
    Done {
        /// `Jetshard-Entity`: the entity whose command sent them.
        entity: Option<String>,
    },
}

impl JournalRecord {
    /// Decodes one stored record of `entity_type`'s journal. Never fails and never panics,
    /// whatever the input: what is missing is `None`, an unknown subject is
    /// [`RecordKind::Other`].
    pub fn decode(
        entity_type: &str,
        seq: u64,
        subject: &str,
        headers: Option<&HeaderMap>,
        payload: Bytes,
    ) -> Self {
        let empty = HeaderMap::new();
        let headers = headers.unwrap_or(&empty);
        let text = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
        let number = |name: &str| header_u64(headers, name);
        let tokens: Vec<&str> = subject
            .strip_prefix(entity_type)
            .and_then(|rest| rest.strip_prefix('.'))
            .map(|rest| rest.split('.').collect())
            .unwrap_or_default();
        let partition = tokens.get(1).and_then(|p| p.parse().ok());
        let kind = match tokens[..] {
            ["evt", _, entity] => RecordKind::Event {
                entity: entity.to_owned(),
                version: number(HDR_EVENT_VERSION)
                    .map_or(1, |v| u32::try_from(v).unwrap_or(u32::MAX)),
                payload,
            },
            ["snap", _, entity] => RecordKind::Snapshot {
                entity: entity.to_owned(),
                version: number(HDR_STATE_VERSION).and_then(|v| u32::try_from(v).ok()),
                upto: number(HDR_SNAPSHOT_UPTO),
                last_outcome: text(HDR_LAST_OUTCOME),
                state: payload,
            },
            ["fence", _] => RecordKind::Fence(FenceRecord::decode(headers, &payload)),
            ["tmr", _, entity] => RecordKind::Timer {
                entity: entity.to_owned(),
                name: text(HDR_TIMER),
                op: match text(HDR_TIMER_OP).as_deref() {
                    Some("set") => number(HDR_TIMER_DUE).map(|due_ms| TimerOp::Set { due_ms }),
                    Some("cancel") => Some(TimerOp::Cancel),
                    Some("fired") => {
                        number(HDR_TIMER_SET).map(|set_seq| TimerOp::Fired { set_seq })
                    }
                    _ => None,
                },
                payload,
            },
            ["out", _] if headers.get(HDR_OUTBOX_DONE).is_some() => {
                RecordKind::Outbox(OutboxRecord::Done {
                    entity: text(HDR_ENTITY),
                })
            }
            ["out", _] => RecordKind::Outbox(OutboxRecord::Message {
                entity: text(HDR_ENTITY),
                target: text(HDR_OUTBOX_TARGET),
                index: number(HDR_OUTBOX_INDEX),
                msg_id: text(HDR_MSG_ID),
                payload,
            }),
            ["dlq", _] | ["dlq", _, _] => RecordKind::DeadLetter {
                entity: text(HDR_ENTITY),
                deliveries: number(HDR_DELIVERIES),
                reason: text(HDR_REASON),
                payload,
            },
            ["unpin", _] => RecordKind::Unpin,
            _ => RecordKind::Other,
        };
        JournalRecord {
            seq,
            subject: subject.to_owned(),
            partition,
            generation: number(HDR_GENERATION),
            command_seq: number(HDR_COMMAND_SEQ),
            kind,
        }
    }
}

/// Reads one entity type's journal (the stream `<T>_JOURNAL`, or each stream of a journal
/// spread over several) with ordered consumers.
///
/// The records of one partition are in one stream, in the order written; a journal spread
/// over several streams has no order across them, and its records come stream by stream (a
/// record's [`seq`](JournalRecord::seq) is its sequence in its partition's stream).
#[derive(Clone)]
pub struct JournalReader {
    journals: Streams,
    names: Names,
}

impl JournalReader {
    /// A reader of `entity_type`'s journal over `js`, over as many streams as the entity
    /// type's command stream records (one if there is no command stream).
    ///
    /// # Errors
    /// [`Error::JetStream`] if the streams cannot be read or opened.
    pub async fn open(js: &Context, entity_type: &str) -> Result<Self, Error> {
        let names = recorded_names(js, entity_type).await?;
        let journals = Streams::open(js, names.journal_streams()).await?;
        Ok(Self { journals, names })
    }

    /// A reader of the journal in `journals`, laid out as `names` says.
    pub(crate) fn of(journals: Streams, names: Names) -> Self {
        Self { journals, names }
    }

    /// A reader of `entity_type`'s journal held in one stream `journal`, already opened (the
    /// stream `<T>_JOURNAL`, or a mirror of the journal).
    pub fn new(journal: Stream<()>, entity_type: &str) -> Self {
        Self {
            journals: Streams::one(journal),
            names: Names::new(entity_type),
        }
    }

    /// Every record of the journal, in order, as it is when the read starts.
    ///
    /// # Errors
    /// [`Error::JetStream`] if the journal cannot be read, or a read stalls for 10 s.
    pub async fn all(&self) -> Result<Vec<JournalRecord>, Error> {
        self.read_all(&[self.names.all_subjects()]).await
    }

    /// Every record of `partition` (events, snapshots, fence, timer and outbox records, dead
    /// letters, unpin records), in order.
    ///
    /// # Errors
    /// As [`all`](Self::all).
    pub async fn partition(&self, partition: u32) -> Result<Vec<JournalRecord>, Error> {
        let filters = self.names.partition_subjects(partition);
        self.read(self.journals.of(partition), filters).await
    }

    /// Every dead letter of the entity type, in order.
    ///
    /// # Errors
    /// As [`all`](Self::all).
    pub async fn dead_letters(&self) -> Result<Vec<JournalRecord>, Error> {
        self.read_all(&[self.names.all_dead_letters()]).await
    }

    /// Every record on `filter` (a subject of this journal, wildcards allowed), in order.
    ///
    /// # Errors
    /// As [`all`](Self::all).
    pub async fn subject(&self, filter: &str) -> Result<Vec<JournalRecord>, Error> {
        // A filter that names its partition is read from that partition's stream alone.
        match filter.split('.').nth(2).map(str::parse::<u32>) {
            Some(Ok(partition)) => {
                self.read(self.journals.of(partition), vec![filter.to_owned()])
                    .await
            }
            _ => self.read_all(&[filter.to_owned()]).await,
        }
    }

    /// Every record on `filters`, stream by stream.
    async fn read_all(&self, filters: &[String]) -> Result<Vec<JournalRecord>, Error> {
        let mut records = Vec::new();
        for journal in self.journals.all() {
            records.extend(self.read(journal, filters.to_vec()).await?);
        }
        Ok(records)
    }

    async fn read(
        &self,
        journal: &Stream<()>,
        mut filters: Vec<String>,
    ) -> Result<Vec<JournalRecord>, Error> {
        let what = filters.join(", ");
        let config = if filters.len() == 1 {
            pull::OrderedConfig {
                filter_subject: filters.remove(0),
                ..Default::default()
            }
        } else {
            pull::OrderedConfig {
                filter_subjects: filters,
                ..Default::default()
            }
        };
        let consumer = journal
            .create_consumer(config)
            .await
            .map_err(|e| Error::jetstream(format!("read {what}"), e))?;
        let name = consumer.cached_info().name.clone();
        let read = self.read_from(consumer, &what).await;
        // A reader called again and again (a dashboard polling dead letters) would otherwise
        // leave a consumer per read on the stream until each expires, up to the stream's limit.
        if let Err(e) = journal.delete_consumer(&name).await {
            tracing::debug!(%what, error = %e, "read consumer not deleted; it expires");
        }
        read
    }

    async fn read_from(
        &self,
        consumer: Consumer<pull::OrderedConfig>,
        what: &str,
    ) -> Result<Vec<JournalRecord>, Error> {
        let mut records = Vec::new();
        if consumer.cached_info().num_pending == 0 {
            return Ok(records);
        }
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| Error::jetstream(format!("read {what}"), e))?;
        loop {
            let next = tokio::time::timeout(READ_STALL_TIMEOUT, messages.next())
                .await
                .map_err(|e| Error::jetstream(format!("read {what}: stalled"), e))?;
            let message = match next {
                Some(Ok(message)) => message,
                Some(Err(e)) => return Err(Error::jetstream(format!("read {what}"), e)),
                None => {
                    return Err(Error::jetstream(
                        format!("read {what}"),
                        "the read ended early",
                    ));
                }
            };
            let info = message
                .info()
                .map_err(|e| Error::jetstream(format!("read {what}"), e.to_string()))?;
            let (seq, pending) = (info.stream_sequence, info.pending);
            records.push(JournalRecord::decode(
                self.names.entity_type(),
                seq,
                &message.subject,
                message.headers.as_ref(),
                message.payload.clone(),
            ));
            if pending == 0 {
                return Ok(records);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use jetshard_testkit::NatsServer;

    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_read_leaves_no_consumer_on_the_journal() {
        let server = NatsServer::start().await.expect("start nats-server");
        let js = async_nats::jetstream::new(server.connect().await.expect("connect"));
        let names = Names::new("t");
        let mut journal = js
            .create_stream(async_nats::jetstream::stream::Config {
                name: names.journal_stream(0).to_owned(),
                subjects: vec![names.all_subjects()],
                ..Default::default()
            })
            .await
            .expect("create the journal");
        js.publish(
            names.event_subject(0, &crate::EntityId::new("a").unwrap()),
            "e".into(),
        )
        .await
        .expect("publish")
        .await
        .expect("stored");
        let reader = JournalReader::open(&js, "t").await.expect("open");
        for _ in 0..3 {
            assert_eq!(reader.all().await.expect("read").len(), 1);
            assert!(reader.dead_letters().await.expect("read").is_empty());
        }
        let info = journal.info().await.expect("stream info");
        assert_eq!(
            info.state.consumer_count, 0,
            "every read deleted its consumer"
        );
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, *value);
        }
        headers
    }

    #[test]
    fn records_are_decoded_by_subject_and_headers() {
        let h = headers(&[(HDR_GENERATION, "4"), (HDR_COMMAND_SEQ, "17")]);
        let event = JournalRecord::decode("t", 9, "t.evt.2.x-1", Some(&h), Bytes::from("{}"));
        assert_eq!(
            (event.partition, event.generation, event.command_seq),
            (Some(2), Some(4), Some(17))
        );
        assert_eq!(
            event.kind,
            RecordKind::Event {
                entity: "x-1".into(),
                version: 1,
                payload: Bytes::from("{}")
            }
        );
        let h = headers(&[
            (HDR_GENERATION, "4"),
            (HDR_COMMAND_SEQ, "17"),
            (HDR_TIMER, "pay"),
            (HDR_TIMER_OP, "fired"),
            (HDR_TIMER_SET, "12"),
        ]);
        let timer = JournalRecord::decode("t", 10, "t.tmr.0.o-1", Some(&h), Bytes::new());
        assert!(matches!(
            timer.kind,
            RecordKind::Timer { name: Some(ref n), op: Some(TimerOp::Fired { set_seq: 12 }), .. }
                if n == "pay"
        ));
        let h = headers(&[(HDR_ENTITY, "o-1"), (HDR_OUTBOX_DONE, "1")]);
        let done = JournalRecord::decode("t", 11, "t.out.0", Some(&h), Bytes::new());
        assert!(matches!(
            done.kind,
            RecordKind::Outbox(OutboxRecord::Done { .. })
        ));
        let letter = JournalRecord::decode("t", 12, "t.dlq.1", None, Bytes::new());
        assert_eq!(letter.partition, Some(1));
        assert!(matches!(
            letter.kind,
            RecordKind::DeadLetter { entity: None, .. }
        ));
        let fence = JournalRecord::decode("t", 13, "t.fence.1", None, Bytes::from("x"));
        assert!(matches!(fence.kind, RecordKind::Fence(Err(_))));
        for subject in ["u.evt.1.x", "t.evt.1", "t.cmd.1.x", "t", "", "t."] {
            let record = JournalRecord::decode("t", 1, subject, None, Bytes::new());
            assert_eq!(record.kind, RecordKind::Other, "{subject}");
        }
        let odd = JournalRecord::decode("t", 1, "t.evt.x.y", None, Bytes::new());
        assert_eq!(odd.partition, None);
    }
}
