//! One journal record as the checker sees it, and reading a journal back.

use async_nats::HeaderMap;
use async_nats::jetstream;
use jetshard::journal_reader::{JournalReader, JournalRecord, RecordKind};
use jetshard::wire::{HDR_COMMAND_SEQ, HDR_ENTITY, HDR_GENERATION};

/// One record of an entity type's journal (`<T>_JOURNAL`), with the event body as `E`: raw
/// bytes as [`read_journal`] returns it, or decoded with [`Record::try_map_event`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record<E> {
    /// An event, `<t>.evt.<p>.<id>`.
    Event {
        /// Journal sequence.
        seq: u64,
        /// The partition.
        partition: u32,
        /// The entity id.
        entity: String,
        /// The writer's generation (`Jetshard-Generation`).
        generation: u64,
        /// The command that caused it (`Jetshard-Command-Seq`).
        command_seq: u64,
        /// The event body.
        event: E,
    },
    /// A fence record, `<t>.fence.<p>`: the start of a generation.
    Fence {
        /// Journal sequence.
        seq: u64,
        /// The partition.
        partition: u32,
        /// The generation it starts.
        generation: u64,
    },
    /// A dead letter, `<t>.dlq.<p>.<id>` (or `<t>.dlq.<p>`): a command given up.
    DeadLetter {
        /// Journal sequence.
        seq: u64,
        /// The partition.
        partition: u32,
        /// The entity id (`Jetshard-Entity`).
        entity: String,
        /// The writer's generation.
        generation: u64,
        /// The command given up.
        command_seq: u64,
        /// Why (`Jetshard-Reason`).
        reason: String,
    },
}

impl<E> Record<E> {
    /// An event record, for hand-built journals.
    pub fn event(
        seq: u64,
        partition: u32,
        entity: impl Into<String>,
        generation: u64,
        command_seq: u64,
        event: E,
    ) -> Self {
        Record::Event {
            seq,
            partition,
            entity: entity.into(),
            generation,
            command_seq,
            event,
        }
    }

    /// A fence record, for hand-built journals.
    pub fn fence(seq: u64, partition: u32, generation: u64) -> Self {
        Record::Fence {
            seq,
            partition,
            generation,
        }
    }

    /// A dead-letter record, for hand-built journals.
    pub fn dead_letter(
        seq: u64,
        partition: u32,
        entity: impl Into<String>,
        generation: u64,
        command_seq: u64,
        reason: impl Into<String>,
    ) -> Self {
        Record::DeadLetter {
            seq,
            partition,
            entity: entity.into(),
            generation,
            command_seq,
            reason: reason.into(),
        }
    }

    /// The journal sequence.
    pub fn seq(&self) -> u64 {
        match self {
            Record::Event { seq, .. }
            | Record::Fence { seq, .. }
            | Record::DeadLetter { seq, .. } => *seq,
        }
    }

    /// The partition.
    pub fn partition(&self) -> u32 {
        match self {
            Record::Event { partition, .. }
            | Record::Fence { partition, .. }
            | Record::DeadLetter { partition, .. } => *partition,
        }
    }

    /// The generation the record carries.
    pub fn generation(&self) -> u64 {
        match self {
            Record::Event { generation, .. }
            | Record::Fence { generation, .. }
            | Record::DeadLetter { generation, .. } => *generation,
        }
    }

    /// Decodes (or otherwise converts) an event's body; other records pass through.
    ///
    /// # Errors
    /// Whatever `decode` returns for this record's body.
    pub fn try_map_event<F, X, Err>(self, decode: F) -> Result<Record<X>, Err>
    where
        F: FnOnce(E) -> Result<X, Err>,
    {
        Ok(match self {
            Record::Event {
                seq,
                partition,
                entity,
                generation,
                command_seq,
                event,
            } => Record::Event {
                seq,
                partition,
                entity,
                generation,
                command_seq,
                event: decode(event)?,
            },
            Record::Fence {
                seq,
                partition,
                generation,
            } => Record::Fence {
                seq,
                partition,
                generation,
            },
            Record::DeadLetter {
                seq,
                partition,
                entity,
                generation,
                command_seq,
                reason,
            } => Record::DeadLetter {
                seq,
                partition,
                entity,
                generation,
                command_seq,
                reason,
            },
        })
    }
}

impl Record<Vec<u8>> {
    /// Reads one stored journal message of `entity_type`, as the wire contract
    /// (`docs/WIRE.md`) lays it out. Never panics, whatever the input.
    ///
    /// # Errors
    /// [`MalformedRecord`] naming what is missing or unreadable, or that it is not an event, a
    /// fence record or a dead letter.
    pub fn parse(
        entity_type: &str,
        seq: u64,
        subject: &str,
        headers: Option<&HeaderMap>,
        payload: Vec<u8>,
    ) -> Result<Self, MalformedRecord> {
        let ours = subject
            .strip_prefix(entity_type)
            .is_some_and(|rest| rest.starts_with('.'));
        if !ours {
            return Err(MalformedRecord {
                seq,
                subject: subject.to_owned(),
                reason: "not a subject of this entity type".to_owned(),
            });
        }
        let record = JournalRecord::decode(entity_type, seq, subject, headers, payload.into());
        Self::from_journal(record)?.ok_or_else(|| MalformedRecord {
            seq,
            subject: subject.to_owned(),
            reason: "not an event, fence or dead-letter subject".to_owned(),
        })
    }

    /// The history's view of a record read with jetshard's [`JournalReader`]: `None` for the
    /// records that are not part of an entity's history (snapshots are a cache of the events,
    /// outbox records the messages commands sent, timer and unpin records neither).
    ///
    /// # Errors
    /// [`MalformedRecord`] for an event, fence record or dead letter without the headers the
    /// wire contract gives it, or a subject outside the contract.
    pub fn from_journal(record: JournalRecord) -> Result<Option<Self>, MalformedRecord> {
        let malformed = |reason: &str| MalformedRecord {
            seq: record.seq,
            subject: record.subject.clone(),
            reason: reason.to_owned(),
        };
        let required = |value: Option<u64>, name: &str| {
            value.ok_or_else(|| malformed(&format!("no numeric {name} header")))
        };
        let partition = || {
            record
                .partition
                .ok_or_else(|| malformed("the partition token is not a number"))
        };
        let seq = record.seq;
        Ok(Some(match &record.kind {
            RecordKind::Event {
                entity, payload, ..
            } => Record::Event {
                seq,
                partition: partition()?,
                entity: entity.clone(),
                generation: required(record.generation, HDR_GENERATION)?,
                command_seq: required(record.command_seq, HDR_COMMAND_SEQ)?,
                event: payload.to_vec(),
            },
            RecordKind::Fence(_) => Record::Fence {
                seq,
                partition: partition()?,
                generation: required(record.generation, HDR_GENERATION)?,
            },
            RecordKind::DeadLetter { entity, reason, .. } => Record::DeadLetter {
                seq,
                partition: partition()?,
                entity: entity
                    .clone()
                    .ok_or_else(|| malformed(&format!("no {HDR_ENTITY} header")))?,
                generation: required(record.generation, HDR_GENERATION)?,
                command_seq: required(record.command_seq, HDR_COMMAND_SEQ)?,
                reason: reason.clone().unwrap_or_default(),
            },
            RecordKind::Other => {
                return Err(malformed("not an event, fence or dead-letter subject"));
            }
            _ => return Ok(None),
        }))
    }
}

/// A journal message that is not a record of the wire contract.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("journal record at sequence {seq} on {subject} is malformed: {reason}")]
pub struct MalformedRecord {
    /// Journal sequence.
    pub seq: u64,
    /// Its subject.
    pub subject: String,
    /// What is wrong.
    pub reason: String,
}

/// Why [`read_journal`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The server did not serve the journal.
    #[error("reading the journal: {context}")]
    JetStream {
        /// What was being done.
        context: String,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A record does not follow the wire contract.
    #[error(transparent)]
    Malformed(#[from] MalformedRecord),
}

impl ReadError {
    fn jetstream(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ReadError::JetStream {
            context: context.into(),
            source: source.into(),
        }
    }
}

/// Reads the whole journal of `entity_type` (the stream `<T>_JOURNAL`), in order, as it is when
/// the read starts, with jetshard's [`JournalReader`], and keeps the history's records (see
/// [`Record::from_journal`]). Event bodies stay raw; decode them with [`Record::try_map_event`].
///
/// # Errors
/// [`ReadError::JetStream`] if the stream cannot be read (or stalls for 10 s),
/// [`ReadError::Malformed`] for a record outside the wire contract.
pub async fn read_journal(
    js: &jetstream::Context,
    entity_type: &str,
) -> Result<Vec<Record<Vec<u8>>>, ReadError> {
    let read = async { JournalReader::open(js, entity_type).await?.all().await };
    let records = read
        .await
        .map_err(|e| ReadError::jetstream(format!("read the journal of {entity_type}"), e))?;
    let mut history = Vec::with_capacity(records.len());
    for record in records {
        history.extend(Record::from_journal(record)?);
    }
    Ok(history)
}

/// As [`read_journal`], from the stream `stream` instead of the entity type's journal: a mirror
/// of it (`mirror: <T>_JOURNAL`), which keeps the records a compaction purged from the journal.
///
/// # Errors
/// As [`read_journal`].
pub async fn read_journal_from(
    js: &jetstream::Context,
    stream: &str,
    entity_type: &str,
) -> Result<Vec<Record<Vec<u8>>>, ReadError> {
    let opened = js
        .get_stream_no_info(stream)
        .await
        .map_err(|e| ReadError::jetstream(format!("open the stream {stream}"), e))?;
    let records = JournalReader::new(opened, entity_type)
        .all()
        .await
        .map_err(|e| {
            ReadError::jetstream(format!("read {stream} as the journal of {entity_type}"), e)
        })?;
    let mut history = Vec::with_capacity(records.len());
    for record in records {
        history.extend(Record::from_journal(record)?);
    }
    Ok(history)
}
