//! Checking a run against jetshard's promises: what clients sent, against what the journal holds.
//!
//! A fault-injection test records a [`History`]: every command a client published, with the
//! stream sequence the command stream acknowledged ([`Ack::Acked`]) or [`Ack::Unknown`] when the
//! publish was never confirmed (it may or may not be stored). After the run it reads the entity
//! type's journal back ([`read_journal`]: events, fence records, dead letters) and hands both to
//! [`check`] with a [`Model`], the sequential specification of one entity. The [`Report`] lists
//! every [`Violation`] of these properties:
//!
//! | property | violation |
//! |---|---|
//! | every acknowledged command left exactly one outcome: its events, or a dead letter (none, if the model expects none: [`Model::expects_outcome`]) | [`Violation::Lost`], [`Violation::Duplicated`] |
//! | nothing has an outcome that no client sent | [`Violation::Unexpected`] |
//! | per entity, outcomes come in command order (command sequences rise) | [`Violation::Reordered`] |
//! | per entity, the outcomes follow the model, folded in journal order | [`Violation::Model`] |
//! | every event and dead letter carries the generation of its partition's latest fence record before it | [`Violation::StaleGeneration`] |
//! | a partition's generations rise by exactly one | [`Violation::GenerationJump`] |
//!
//! This is the Jepsen idea applied to jetshard's journal: the history is checked against a
//! model, not against the code that produced it.
//!
//! # What the checker needs from a test
//!
//! - **Every command leaves an outcome, or the model knows it leaves none.** jetshard writes
//!   nothing for a command its entity rejects, so a rejected command looks lost unless
//!   [`Model::expects_outcome`] says no for it (the test knows it sent a command the entity
//!   refuses). Such a command that does leave an outcome is still folded through the model,
//!   which can refuse it.
//! - **One command in flight per entity.** A client publishes an entity's next command only
//!   after the previous one was acknowledged or given up as unknown, and records them in that
//!   order. Then an entity's stored commands are in client order, which is how an outcome of an
//!   [`Ack::Unknown`] command is matched to it: to an unknown command between the acknowledged
//!   ones around its command sequence, the first for which [`Model::identifies`] holds. Make
//!   command values unique (a counter per entity) and `identifies` exact, and the matching is
//!   exact. Retrying an unconfirmed publish with the same `Nats-Msg-Id` until it is acknowledged
//!   leaves few unknowns.
//! - **The run is over.** Read the journal after every command in the stream was handled (a
//!   work-queue command stream is empty), or an acknowledged command still waiting shows as lost.
//!
//! # Examples
//!
//! ```
//! use jetshard_testkit::history::{Ack, History, Model, Record, check};
//!
//! /// Each command `n` must leave exactly the event `n`, and `n` rises per entity.
//! struct Rising;
//!
//! impl Model for Rising {
//!     type Command = u64;
//!     type Event = u64;
//!     type State = Option<u64>;
//!
//!     fn step(&self, last: &mut Option<u64>, n: &u64, events: &[u64]) -> Result<(), String> {
//!         if events != [*n] {
//!             return Err(format!("command {n} left events {events:?}"));
//!         }
//!         if last.is_some_and(|last| last >= *n) {
//!             return Err(format!("{n} after {last:?}"));
//!         }
//!         *last = Some(*n);
//!         Ok(())
//!     }
//! }
//!
//! let mut history = History::new();
//! history.record("e1", 0, Ack::Acked(1));
//! history.record("e1", 1, Ack::Acked(2));
//! let journal = vec![
//!     Record::fence(1, 0, 1),
//!     Record::event(2, 0, "e1", 1, 1, 0),
//!     Record::event(3, 0, "e1", 1, 2, 1),
//! ];
//! let report = check(&Rising, &history, &journal);
//! assert!(report.is_ok(), "{report}");
//!
//! // The same journal without command 2's event: it was acknowledged, so it is lost.
//! let report = check(&Rising, &history, &journal[..2]);
//! assert_eq!(report.violations().len(), 1);
//! assert!(report.to_string().contains("lost"), "{report}");
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use async_nats::HeaderMap;
use async_nats::jetstream;
use jetshard::journal_reader::{JournalReader, JournalRecord, RecordKind};
use jetshard::wire::{HDR_COMMAND_SEQ, HDR_ENTITY, HDR_GENERATION};

/// What became of one publish, as the client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ack {
    /// The command stream stored the command at this sequence.
    Acked(u64),
    /// The publish was never confirmed: the command may or may not be stored.
    Unknown,
}

/// One command a client published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent<C> {
    /// The entity id it was addressed to.
    pub entity: String,
    /// The command, or a small model value standing for it.
    pub command: C,
    /// What the publish returned.
    pub ack: Ack,
}

/// Every command clients published in a run, per entity in the order they were issued.
#[derive(Clone, Debug)]
pub struct History<C> {
    sent: Vec<Sent<C>>,
}

impl<C> Default for History<C> {
    fn default() -> Self {
        History { sent: Vec::new() }
    }
}

impl<C> History<C> {
    /// An empty history.
    pub fn new() -> Self {
        History::default()
    }

    /// Records a command. An entity's commands must be recorded in the order they were issued,
    /// each after the previous one was acknowledged or given up (see the module docs).
    pub fn record(&mut self, entity: impl Into<String>, command: C, ack: Ack) {
        self.sent.push(Sent {
            entity: entity.into(),
            command,
            ack,
        });
    }

    /// Appends another client's history (another task's, say); the relative order of one
    /// entity's commands must still be their issue order.
    pub fn extend(&mut self, other: History<C>) {
        self.sent.extend(other.sent);
    }

    /// Every command recorded, in order.
    pub fn sent(&self) -> &[Sent<C>] {
        &self.sent
    }

    /// How many commands were recorded.
    pub fn len(&self) -> usize {
        self.sent.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }
}

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

/// The sequential specification of one entity, folded over its outcomes in journal order.
///
/// The checker starts each entity at `State::default()` and calls [`step`](Model::step) for
/// every command that left events, [`dead_lettered`](Model::dead_lettered) for every command
/// given up, in journal order. An `Err` is reported as [`Violation::Model`].
pub trait Model {
    /// What the history records per command (the command itself, or a small value for it).
    type Command;
    /// A decoded event.
    type Event;
    /// An entity's state in the model.
    type State: Default;

    /// Checks that `command` may leave exactly `events` in `state`, and advances `state`.
    ///
    /// # Errors
    /// Why the outcome is not what the model allows.
    fn step(
        &self,
        state: &mut Self::State,
        command: &Self::Command,
        events: &[Self::Event],
    ) -> Result<(), String>;

    /// Checks that `command` may be given up (dead-lettered) in `state`; the default allows
    /// it and leaves the state as it is.
    ///
    /// # Errors
    /// Why the model does not allow it (e.g. a command that can never fail).
    fn dead_lettered(
        &self,
        state: &mut Self::State,
        command: &Self::Command,
        reason: &str,
    ) -> Result<(), String> {
        let _ = (state, command, reason);
        Ok(())
    }

    /// Whether `command`, acknowledged, must leave an outcome (events or a dead letter). The
    /// default says yes. Say no for a command the entity rejects (jetshard writes nothing for a
    /// rejection): it is then not reported [`Violation::Lost`] when it leaves none, and counted
    /// in [`Summary::silent`]. An outcome it leaves anyway still goes through
    /// [`step`](Model::step) or [`dead_lettered`](Model::dead_lettered).
    fn expects_outcome(&self, command: &Self::Command) -> bool {
        let _ = command;
        true
    }

    /// Whether `events` can be the outcome of `command`: used only to match an outcome to one
    /// of several [`Ack::Unknown`] commands. The default says yes to any.
    fn identifies(&self, command: &Self::Command, events: &[Self::Event]) -> bool {
        let _ = (command, events);
        true
    }
}

/// A broken promise, with what is needed to find it in the journal.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// An acknowledged command left no outcome.
    Lost {
        /// The entity.
        entity: String,
        /// The command's stream sequence.
        command_seq: u64,
    },
    /// A command left more than one outcome (applied twice, or applied and dead-lettered).
    Duplicated {
        /// The entity.
        entity: String,
        /// The command's stream sequence.
        command_seq: u64,
        /// Each outcome's first journal sequence and generation.
        outcomes: Vec<(u64, u64)>,
    },
    /// An outcome of a command no client sent to this entity (or more outcomes than unknown
    /// commands could explain).
    Unexpected {
        /// The entity of the outcome.
        entity: String,
        /// The command sequence it names.
        command_seq: u64,
        /// Its first journal sequence.
        journal_seq: u64,
    },
    /// An entity's outcome came after the outcome of a later command.
    Reordered {
        /// The entity.
        entity: String,
        /// The command sequence that came late.
        command_seq: u64,
        /// The later command already seen.
        after_command_seq: u64,
        /// The late outcome's first journal sequence.
        journal_seq: u64,
    },
    /// The model does not allow an outcome.
    Model {
        /// The entity.
        entity: String,
        /// The command.
        command_seq: u64,
        /// The outcome's first journal sequence.
        journal_seq: u64,
        /// The model's reason.
        reason: String,
    },
    /// An event or dead letter written under another generation than its partition's latest
    /// fence record before it: a stale (or premature) owner's write.
    StaleGeneration {
        /// The partition.
        partition: u32,
        /// The record's journal sequence.
        journal_seq: u64,
        /// Its entity.
        entity: String,
        /// Its command.
        command_seq: u64,
        /// The generation it carries.
        generation: u64,
        /// The generation of the latest fence record before it (0: none).
        fence_generation: u64,
    },
    /// A fence record that does not follow its predecessor by exactly one generation.
    GenerationJump {
        /// The partition.
        partition: u32,
        /// The fence record's journal sequence.
        journal_seq: u64,
        /// The previous generation (0: none).
        previous: u64,
        /// The generation it claims.
        generation: u64,
    },
    /// The history holds the same acknowledged sequence twice, for two commands.
    AmbiguousHistory {
        /// The sequence.
        command_seq: u64,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Lost {
                entity,
                command_seq,
            } => write!(
                f,
                "lost: entity {entity:?} command {command_seq} was acknowledged but left no outcome"
            ),
            Violation::Duplicated {
                entity,
                command_seq,
                outcomes,
            } => {
                write!(
                    f,
                    "duplicated: entity {entity:?} command {command_seq} left {} outcomes:",
                    outcomes.len()
                )?;
                for (seq, generation) in outcomes {
                    write!(f, " [journal seq {seq}, generation {generation}]")?;
                }
                Ok(())
            }
            Violation::Unexpected {
                entity,
                command_seq,
                journal_seq,
            } => write!(
                f,
                "unexpected: entity {entity:?} has an outcome of command {command_seq} at journal seq {journal_seq}, which no client sent to it"
            ),
            Violation::Reordered {
                entity,
                command_seq,
                after_command_seq,
                journal_seq,
            } => write!(
                f,
                "reordered: entity {entity:?} command {command_seq} (journal seq {journal_seq}) came after command {after_command_seq}"
            ),
            Violation::Model {
                entity,
                command_seq,
                journal_seq,
                reason,
            } => write!(
                f,
                "model: entity {entity:?} command {command_seq} (journal seq {journal_seq}): {reason}"
            ),
            Violation::StaleGeneration {
                partition,
                journal_seq,
                entity,
                command_seq,
                generation,
                fence_generation,
            } => write!(
                f,
                "stale generation: partition {partition} journal seq {journal_seq} (entity {entity:?}, command {command_seq}) carries generation {generation}, but the latest fence before it is generation {fence_generation}"
            ),
            Violation::GenerationJump {
                partition,
                journal_seq,
                previous,
                generation,
            } => write!(
                f,
                "generation jump: partition {partition} fence at journal seq {journal_seq} claims generation {generation} after {previous}"
            ),
            Violation::AmbiguousHistory { command_seq } => write!(
                f,
                "ambiguous history: two recorded commands were acknowledged at sequence {command_seq}"
            ),
        }
    }
}

/// Counts of what was checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Summary {
    /// Commands in the history.
    pub commands: usize,
    /// Of those, acknowledged.
    pub acked: usize,
    /// Of those, unknown.
    pub unknown: usize,
    /// Unknown commands that turned out to be stored (they left an outcome).
    pub unknown_applied: usize,
    /// Entities with an outcome.
    pub entities: usize,
    /// Outcomes: commands applied (events) or given up (dead letters).
    pub outcomes: usize,
    /// Event records.
    pub events: usize,
    /// Dead-letter records.
    pub dead_letters: usize,
    /// Fence records.
    pub fences: usize,
    /// Acknowledged commands that left no outcome, as the model expects of them
    /// ([`Model::expects_outcome`]).
    pub silent: usize,
}

/// What [`check`] found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    violations: Vec<Violation>,
    summary: Summary,
}

impl Report {
    /// Whether no property was violated.
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// Every violation, journal-level ones first, then per entity.
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// Counts of what was checked.
    pub fn summary(&self) -> Summary {
        self.summary
    }
}

/// At most this many violations are printed by `Display`; the rest are counted.
const DISPLAY_LIMIT: usize = 50;

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.summary;
        write!(
            f,
            "{} violations; {} commands ({} acked, {} unknown of which {} applied), {} entities, {} outcomes, {} events, {} dead letters, {} fence records",
            self.violations.len(),
            s.commands,
            s.acked,
            s.unknown,
            s.unknown_applied,
            s.entities,
            s.outcomes,
            s.events,
            s.dead_letters,
            s.fences
        )?;
        if s.silent > 0 {
            write!(f, ", {} commands silent as expected", s.silent)?;
        }
        for violation in self.violations.iter().take(DISPLAY_LIMIT) {
            write!(f, "\n  {violation}")?;
        }
        if self.violations.len() > DISPLAY_LIMIT {
            write!(
                f,
                "\n  ... and {} more",
                self.violations.len() - DISPLAY_LIMIT
            )?;
        }
        Ok(())
    }
}

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

    // The history: per entity, its commands in issue order; acknowledged ones by sequence.
    let mut by_entity: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut acked_at: HashMap<u64, usize> = HashMap::new();
    for (index, sent) in history.sent.iter().enumerate() {
        by_entity
            .entry(sent.entity.as_str())
            .or_default()
            .push(index);
        match sent.ack {
            Ack::Acked(seq) => {
                summary.acked += 1;
                if acked_at.insert(seq, index).is_some() {
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

            let sent = match acked_at.get(&outcome.command_seq) {
                Some(&index) if history.sent[index].entity == *entity => Some(index),
                Some(_) => None,
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

#[cfg(test)]
mod tests {
    use super::*;

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
        history.record("f", 9, Ack::Acked(10));
        let found = violations(&history, &journal());
        assert!(
            found.contains(&Violation::AmbiguousHistory { command_seq: 10 }),
            "{found:?}"
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
}
