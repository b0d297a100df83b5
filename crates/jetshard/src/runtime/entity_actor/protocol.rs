//! What the entity actor and its owner say to each other: the actor's messages, its reports
//! (an outcome with its verdict, a passivation), and the context an owner starts it with.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use async_nats::jetstream::stream::Stream;
use bytes::Bytes;

use super::outcome_header::LastOutcome;
use crate::codec::Codec;
use crate::data::timers::{Firing, TimerReport};
use crate::entity::EntityId;
use crate::journal::JournalWriter;
use crate::query::Query;
use crate::reply::Detail;
use crate::telemetry::CommandMetrics;
use crate::trace::CommandTrace;
use crate::wire::Names;

impl Verdict {
    /// A word for logs.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Verdict::Applied { .. } => "applied",
            Verdict::Duplicate { .. } => "duplicate",
            Verdict::Rejected(_) => "rejected",
            Verdict::DeadLettered(_) => "dead_lettered",
            Verdict::Fenced => "fenced",
            Verdict::Failed(_) => "failed",
        }
    }
}

/// Why an entity's journal cannot be read back: its commands are dead-lettered instead of
/// decided until a process whose code reads the record owns the partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Quarantine {
    /// The journal record at fault.
    pub(crate) journal_seq: u64,
    pub(crate) reason: String,
    /// The last command of the entity in the journal: a redelivery of one up to it is known.
    pub(crate) last_command_seq: u64,
}

impl Quarantine {
    /// The reason given to each command of the entity that is dead-lettered.
    pub(crate) fn dead_letter_reason(&self) -> String {
        format!("entity quarantined: {}", self.reason)
    }
}

/// What an entity actor is asked to do.
pub(crate) enum EntityMsg {
    /// Apply a command.
    Work(Work),
    /// Idle: give the state back ([`Passivated`]) and stop.
    Passivate,
    /// The owner stepped down but may claim the partition again: give the state back
    /// ([`Passivated`]) without writing anything (no snapshot: the generation is over) and
    /// stop. Work queued before it is done first, as its writes may still be stored.
    Surrender,
    /// Answer a state query, after the commands before it.
    Query(Query),
}

/// What an entity actor tells its supervisor.
pub(crate) enum EntityReport {
    /// What became of a command.
    Command(CommandReport),
    /// The actor stopped on passivation, handing its state back.
    Passivated(Passivated),
    /// A read or write outside any command (a query's fence check, a snapshot, a compaction
    /// sweep's fence check) found that a newer generation than `generation` owns the
    /// partition. Without it, an owner whose generation a late claim superseded, with no
    /// command arriving, would go on holding the pin while refusing every query: nobody would
    /// serve the partition.
    Superseded { generation: u64 },
    /// A command's outbox messages were not all published (or not recorded done) under
    /// `generation`, after the publish's patience: the owner starts a recovery, which publishes
    /// them again until it can. Without it they waited for the partition's next owner.
    OutboxUndelivered { generation: u64 },
}

/// An entity actor's state, handed back on passivation.
pub(crate) struct Passivated {
    pub(crate) entity: EntityId,
    pub(crate) generation: u64,
    /// A `Seed<E>` of the entity type; `None` if the actor holds no state it trusts (the next
    /// actor revives the entity from the journal).
    pub(crate) seed: Option<Box<dyn Any + Send>>,
}

/// A command for the entity.
pub(crate) struct Work {
    pub(crate) seq: u64,
    pub(crate) payload: Bytes,
    /// How often it has been delivered (for a dead-letter record).
    pub(crate) deliveries: u64,
    /// Give it up with this reason instead of deciding it: a dead-letter record, written in the
    /// entity's order, without decoding the command.
    pub(crate) give_up: Option<Arc<str>>,
    /// The command's trace context: its events carry its span as their parent.
    pub(crate) trace: Option<Box<CommandTrace>>,
    /// A client waits for the outcome: report its typed [`Detail`] (the encoded events or
    /// rejection) with it.
    pub(crate) detail: bool,
    /// Set when it is a timer's command: decided only if the entity has that timer armed.
    pub(crate) timer: Option<Firing>,
    /// Set when it is an outbox message: a duplicate if the entity remembers having applied
    /// a message of that origin; else its events carry the origin.
    pub(crate) origin: Option<Box<crate::data::origin::Origin>>,
}

/// What became of one command.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Its events are durable (possibly none).
    Applied { events: usize },
    /// It had been processed before (a redelivery); how, if this actor knows.
    Duplicate { earlier: Option<LastOutcome> },
    /// The entity refused it; nothing was written.
    Rejected(String),
    /// A dead-letter record of it is durable (written in the entity's order): it is to be
    /// terminated.
    DeadLettered(String),
    /// The write was rejected by the fence: the partition has a newer owner.
    Fenced,
    /// Not done; the entity actor has stopped.
    Failed(Failure),
}

/// Why a command was not done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The journal did not confirm a write (leader change, lost connection): the write may be
    /// stored; retrying with the same message ids is safe and spends no delivery.
    Unconfirmed(String),
    /// The entity's code or data failed on it (a panic in `decide` or the codec): a delivery is
    /// spent.
    Crashed(String),
    /// The write can never succeed as it is (an event over the server's payload limit).
    Refused(String),
    /// The entity's journal cannot be read back.
    Quarantined(Quarantine),
}

/// The report of one command.
pub(crate) struct CommandReport {
    pub(crate) entity: EntityId,
    pub(crate) seq: u64,
    pub(crate) generation: u64,
    pub(crate) verdict: Verdict,
    /// Set when the command is done but the entity is not to be trusted any more: `apply`
    /// panicked on its durable events.
    pub(crate) quarantine: Option<Quarantine>,
    /// The typed part of the outcome, when [`Work::detail`] asked for it.
    pub(crate) detail: Option<Detail>,
    /// What the command did to the entity's timers (durable), for the owner's table.
    pub(crate) timers: Vec<TimerReport>,
}

/// Where an entity actor's reports go.
pub(crate) type Reporter = Arc<dyn Fn(EntityReport) + Send + Sync>;

/// What the entity actors of one partition under one generation share (one allocation for
/// all of them: a live actor's size is what passivation is weighed against).
pub(crate) struct EntityContext {
    pub(crate) partition: u32,
    pub(crate) journal: JournalWriter,
    pub(crate) journal_stream: Stream<()>,
    /// Whether entity loads read the journal with direct gets (a single-replica journal:
    /// `journal::last_record`).
    pub(crate) direct_reads: bool,
    /// For answers to state queries.
    pub(crate) client: async_nats::Client,
    pub(crate) names: Arc<Names>,
    /// The outbox's learned layouts of other entity types (shared by the system).
    pub(crate) routes: Arc<crate::runtime::outbox::Routes>,
    pub(crate) codec: Codec,
    pub(crate) report: Reporter,
    /// The partition's decide and write timings.
    pub(crate) metrics: CommandMetrics,
    /// When entities write snapshots (if their type writes them at all).
    pub(crate) snapshots: SnapshotPolicy,
    /// Entity loads in flight in this process, at most [`MAX_LOADS`]: after a takeover every
    /// active entity loads at once, and unbounded, their reads swamp the server.
    pub(crate) loads: Arc<tokio::sync::Semaphore>,
    /// Batched loads' reads in flight in this process, at most [`MAX_BATCH_READS`]: apart from
    /// `loads`, so that a burst's batched reads (one request for up to 64 entities each) do not
    /// queue behind each other for the permits of single loads.
    pub(crate) batch_reads: Arc<tokio::sync::Semaphore>,
    /// What the partition's entity loads came to (the owner's status).
    pub(crate) load_stats: Arc<LoadStats>,
    /// Set when the owner stepped down from this generation and asked its actors for their
    /// states ([`EntityMsg::Surrender`]): the commands still queued to them are dropped, not
    /// written (their outcomes would not be acknowledged, and on a replicated journal a write
    /// of the old generation in flight makes any new claim wait: 10164).
    pub(crate) retired: std::sync::atomic::AtomicBool,
}

/// What the entity loads of a partition came to in this process, over every generation.
#[derive(Debug, Default)]
pub(crate) struct LoadStats {
    /// Entities loaded from the journal.
    pub(crate) loads: AtomicU64,
    /// Of them, those whose last records came from a batched read (`batch.rs`).
    pub(crate) batched: AtomicU64,
    /// Requests the loads made of the server: each batched read once, each single read.
    pub(crate) reads: AtomicU64,
}

/// Entity loads one process runs side by side (each one or two reads, then its tail).
pub(crate) const MAX_LOADS: usize = 32;

/// Batched loads' reads one process runs side by side (`batch.rs`: one `multi_last` direct get
/// each, for up to 64 entities, so up to 4,096 entities' loads at once). A cold burst of 8
/// partitions at `max_ack_pending` 1024 plans ~160 of them at once; under [`MAX_LOADS`] they
/// waited for each other's permits as long as for their reads (docs/PERFORMANCE.md, "Loading
/// an entity"). Bounded all the same: a takeover of many partitions plans as many.
pub(crate) const MAX_BATCH_READS: usize = 64;

/// When an entity writes a snapshot of its state ([`Entity::snapshots`] says whether it can).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SnapshotPolicy {
    /// After this many events since its last snapshot.
    pub(crate) every: Option<u32>,
    /// On passivation, if it wrote events since its last snapshot.
    pub(crate) on_passivation: bool,
}

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".to_owned()
    }
}
