//! The actor of one live entity: applies its commands strictly in order.
//!
//! It holds the entity's state and the stream sequence of the last command applied to it. For
//! each command it decides, makes the events durable through the partition's fenced journal
//! writer, applies them, and reports a [`Verdict`] to whoever supervises it (the partition's
//! owner, through [`EntityContext::report`]; this module knows nothing of the owner). After a
//! failure it reports and stops; its owner revives it from the journal.
//!
//! Nothing the entity's code or data does escapes as a panic: `decide`, `apply`, the codec and
//! the whole handling of a command run under `catch_unwind`, so a failure is always reported
//! with the command it belongs to, in order with the verdicts before it.
//!
//! An entity whose journal cannot be read back (an event that no longer decodes, an `apply` that
//! panics) is *quarantined*: its state is not to be trusted, so none of its commands are decided;
//! each is dead-lettered naming the journal record at fault. Other entities go on.
//!
//! Passivation: an idle entity's actor hands its state back to the owner and stops. The state
//! waits in the owner's dormant map, a few dozen bytes beyond the state itself, against some
//! kilobytes for a live actor, until the entity's next command spawns a new actor with it.

use std::any::Any;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use async_nats::jetstream::stream::Stream;
use bytes::Bytes;
use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;

use crate::codec::Codec;
use crate::data::CommandOutcome;
use crate::data::Effects;
use crate::data::timers::{Armed, Firing, TimerChange, TimerReport};
use crate::entity::{Entity, EntityId, Snapshots, decode_event};
use crate::error::Error;
use crate::journal::{
    self, Attached, JournalWriter, Record, SnapshotRecord, TimerRecord, WriteError,
};
use crate::query::{self, Known, Query};
use crate::reply::Detail;
use crate::runtime::outbox;
use crate::telemetry::{self, CommandMetrics};
use crate::trace::CommandTrace;
use crate::wire::Names;

/// An entity's state and what its last command came to.
pub(crate) struct Seed<E: Entity> {
    pub(crate) state: E::State,
    pub(crate) last_command_seq: u64,
    /// The outcome of the command at `last_command_seq`, told again to a redelivery of it.
    pub(crate) last_outcome: Option<LastOutcome>,
    /// The journal sequence of the entity's last record known to be in `state` (0: unknown):
    /// a snapshot of `state` covers the records up to it.
    pub(crate) journal_seq: u64,
    /// Events in `state` since its last snapshot (or since it was loaded without one).
    pub(crate) unsnapshotted: u32,
    /// Its armed timers, by name (`timer.rs`).
    pub(crate) timers: BTreeMap<Box<str>, Armed>,
}

impl<E: Entity> Default for Seed<E> {
    fn default() -> Self {
        Self {
            state: E::State::default(),
            last_command_seq: 0,
            last_outcome: None,
            journal_seq: 0,
            unsnapshotted: 0,
            timers: BTreeMap::new(),
        }
    }
}

/// What the last command of an entity came to (kept small: one per dormant entity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LastOutcome {
    Applied { events: u32 },
    Rejected(Box<str>),
    DeadLettered(Box<str>),
}

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

impl LastOutcome {
    /// As written in a snapshot (header `Jetshard-Last-Outcome`).
    pub(crate) fn to_header(&self) -> String {
        match self {
            LastOutcome::Applied { events } => format!("applied {events}"),
            LastOutcome::Rejected(reason) => format!("rejected {reason}"),
            LastOutcome::DeadLettered(reason) => format!("dead_lettered {reason}"),
        }
    }

    /// Reads [`to_header`](Self::to_header)'s text back; `None` if it is not one.
    pub(crate) fn from_header(text: &str) -> Option<Self> {
        let (kind, rest) = text.split_once(' ').unwrap_or((text, ""));
        match kind {
            "applied" => Some(LastOutcome::Applied {
                events: rest.parse().ok()?,
            }),
            "rejected" => Some(LastOutcome::Rejected(rest.into())),
            "dead_lettered" => Some(LastOutcome::DeadLettered(rest.into())),
            _ => None,
        }
    }

    pub(crate) fn to_outcome(&self, command_seq: u64) -> CommandOutcome {
        match self {
            LastOutcome::Applied { events } => CommandOutcome::Applied {
                command_seq,
                events: *events as usize,
            },
            LastOutcome::Rejected(reason) => CommandOutcome::Rejected {
                command_seq,
                reason: reason.to_string(),
            },
            LastOutcome::DeadLettered(reason) => CommandOutcome::DeadLettered {
                command_seq,
                reason: reason.to_string(),
            },
        }
    }
}

impl<E: Entity> Seed<E> {
    /// Takes one record read back from the journal into the state. A record of a command
    /// before the last one seen changes nothing but the outcome memory.
    ///
    /// # Errors
    /// The quarantine of the entity if the record is an event that cannot be read or applied.
    pub(crate) fn replay(
        &mut self,
        entity: &str,
        stored: &journal::StoredEvent<'_>,
        codec: Codec,
    ) -> Result<(), Quarantine> {
        match &stored.record {
            Record::Timer(timer) => match timer {
                TimerRecord::Set {
                    name,
                    due_ms,
                    payload,
                } => {
                    let armed = Armed {
                        set_seq: stored.command_seq,
                        due_ms: *due_ms,
                        payload: (*payload).clone(),
                    };
                    self.timers.insert((*name).into(), armed);
                }
                TimerRecord::Cancel { name } => {
                    self.timers.remove(*name);
                }
                TimerRecord::Fired { name, set_seq } => {
                    if self
                        .timers
                        .get(*name)
                        .is_some_and(|a| a.set_seq == *set_seq)
                    {
                        self.timers.remove(*name);
                    }
                }
            },
            Record::DeadLetter { reason } => {
                if stored.command_seq >= self.last_command_seq {
                    self.last_outcome = Some(LastOutcome::DeadLettered((*reason).into()));
                }
            }
            Record::Event { version, payload } => {
                let quarantine = |reason: String| Quarantine {
                    journal_seq: stored.seq,
                    reason,
                    last_command_seq: self.last_command_seq.max(stored.command_seq),
                };
                let event: E::Event = match decode_event::<E>(*version, payload, codec) {
                    Ok(event) => event,
                    Err(e) => {
                        return Err(quarantine(format!(
                            "event of {entity} at journal seq {} (version {version}) does not decode: {e}",
                            stored.seq
                        )));
                    }
                };
                if let Err(panic) =
                    catch_unwind(AssertUnwindSafe(|| E::apply(&mut self.state, &event)))
                {
                    return Err(quarantine(format!(
                        "apply panicked on the event of {entity} at journal seq {}: {}",
                        stored.seq,
                        panic_message(&*panic)
                    )));
                }
                let events = match &self.last_outcome {
                    Some(LastOutcome::Applied { events })
                        if stored.command_seq == self.last_command_seq =>
                    {
                        events + 1
                    }
                    _ => 1,
                };
                self.last_outcome = Some(LastOutcome::Applied { events });
                self.unsnapshotted = self.unsnapshotted.saturating_add(1);
            }
        }
        self.last_command_seq = self.last_command_seq.max(stored.command_seq);
        self.journal_seq = self.journal_seq.max(stored.seq);
        Ok(())
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
    /// Answer a state query, after the commands before it.
    Query(Query),
}

/// What an entity actor tells its supervisor.
pub(crate) enum EntityReport {
    /// What became of a command.
    Outcome(Outcome),
    /// The actor stopped on passivation, handing its state back.
    Passivated(Passivated),
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
pub(crate) struct Outcome {
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
    /// For answers to state queries.
    pub(crate) client: async_nats::Client,
    pub(crate) names: Arc<Names>,
    pub(crate) codec: Codec,
    pub(crate) report: Reporter,
    /// The partition's decide and write timings.
    pub(crate) metrics: CommandMetrics,
    /// When entities write snapshots (if their type writes them at all).
    pub(crate) snapshots: SnapshotPolicy,
    /// Entity loads in flight in this process, at most [`MAX_LOADS`]: after a takeover every
    /// active entity loads at once, and unbounded, their reads swamp the server.
    pub(crate) loads: Arc<tokio::sync::Semaphore>,
}

/// Entity loads one process runs side by side (each up to four reads at once, then its tail).
pub(crate) const MAX_LOADS: usize = 32;

/// When an entity writes a snapshot of its state ([`Entity::snapshots`] says whether it can).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SnapshotPolicy {
    /// After this many events since its last snapshot.
    pub(crate) every: Option<u32>,
    /// On passivation, if it wrote events since its last snapshot.
    pub(crate) on_passivation: bool,
}

pub(crate) struct EntityActor<E>(PhantomData<fn() -> E>);

impl<E> EntityActor<E> {
    pub(crate) fn new() -> Self {
        Self(PhantomData)
    }
}

/// What the actor knows of its entity's state.
pub(crate) enum Loaded<E: Entity> {
    /// Not read yet: revived from the journal on the first command.
    No,
    Yes(Seed<E>),
    Quarantined(Quarantine),
}

pub(crate) struct EntityState<E: Entity> {
    id: EntityId,
    context: Arc<EntityContext>,
    seed: Loaded<E>,
    /// Set after a failure: later messages are ignored until the actor stops.
    broken: bool,
}

impl<E: Entity> Actor for EntityActor<E> {
    type Msg = EntityMsg;
    type State = EntityState<E>;
    type Arguments = (EntityId, Arc<EntityContext>, Loaded<E>);

    async fn pre_start(
        &self,
        _: ActorRef<EntityMsg>,
        (id, context, seed): Self::Arguments,
    ) -> Result<EntityState<E>, ActorProcessingErr> {
        Ok(EntityState {
            id,
            context,
            seed,
            broken: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<EntityMsg>,
        message: EntityMsg,
        state: &mut EntityState<E>,
    ) -> Result<(), ActorProcessingErr> {
        let work = match message {
            EntityMsg::Work(work) => work,
            EntityMsg::Query(query) => {
                answer_query(state, query).await;
                return Ok(());
            }
            EntityMsg::Passivate => {
                if let Loaded::Yes(seed) = &mut state.seed
                    && !state.broken
                    && state.context.snapshots.on_passivation
                    && seed.unsnapshotted > 0
                {
                    write_snapshot(&state.id, &state.context, seed).await;
                }
                let seed = match std::mem::replace(&mut state.seed, Loaded::No) {
                    Loaded::Yes(seed) if !state.broken => {
                        Some(Box::new(seed) as Box<dyn Any + Send>)
                    }
                    _ => None,
                };
                let passivated = Passivated {
                    entity: state.id.clone(),
                    generation: state.context.journal.generation(),
                    seed,
                };
                state.broken = true;
                myself.stop(Some("passivated".to_owned()));
                (state.context.report)(EntityReport::Passivated(passivated));
                return Ok(());
            }
        };
        if state.broken {
            return Ok(());
        }
        let span = tracing::debug_span!(
            "command",
            partition = state.context.partition,
            entity = %state.id,
            generation = state.context.journal.generation(),
            cmd_seq = work.seq,
            trace_id = work.trace.as_ref().map(|t| tracing::field::display(t.caller.trace_id())),
            parent_id = work.trace.as_ref().map(|t| tracing::field::display(t.caller.parent_id())),
            span_id = work.trace.as_ref().map(|t| tracing::field::display(t.span.parent_id())),
        );
        let seq = work.seq;
        let mut quarantine = None;
        let mut detail = None;
        let mut timers = Vec::new();
        // Boxed: the actor's task then holds only a pointer to the (large) future of a command
        // while it is idle. Unwound: a panic anywhere in it is this command's failure.
        let processing = Box::pin(
            process(state, work, &mut quarantine, &mut detail, &mut timers)
                .instrument(span.clone()),
        );
        let verdict = match AssertUnwindSafe(processing).catch_unwind().await {
            Ok(verdict) => verdict,
            Err(panic) => Verdict::Failed(Failure::Crashed(format!(
                "panicked: {}",
                panic_message(&*panic)
            ))),
        };
        span.in_scope(|| tracing::debug!(verdict = verdict.name(), "command done"));
        let stops = matches!(verdict, Verdict::Fenced | Verdict::Failed(_)) || quarantine.is_some();
        if stops {
            state.broken = true;
            myself.stop(Some("failed".to_owned()));
        }
        let outcome = Outcome {
            entity: state.id.clone(),
            seq,
            generation: state.context.journal.generation(),
            verdict,
            quarantine,
            detail,
            timers,
        };
        (state.context.report)(EntityReport::Outcome(outcome));
        // After the report, so the command's acknowledgement does not wait for it.
        if let (Loaded::Yes(seed), false, Some(every)) =
            (&mut state.seed, state.broken, state.context.snapshots.every)
            && seed.unsnapshotted >= every
        {
            write_snapshot(&state.id, &state.context, seed).await;
        }
        Ok(())
    }
}

/// Answers a state query from the entity's state (revived first if need be), under the
/// generation of this actor's partition.
async fn answer_query<E: Entity>(state: &mut EntityState<E>, query: Query) {
    let context = Arc::clone(&state.context);
    let span = tracing::debug_span!(
        "query",
        partition = context.partition,
        entity = %state.id,
        generation = context.journal.generation(),
    );
    async {
        if state.broken {
            return query::refuse(
                &context.client,
                query,
                "the entity is restarting: ask again".to_owned(),
            )
            .await;
        }
        if matches!(state.seed, Loaded::No) {
            state.seed = match revive::<E>(&state.id, &context).await {
                Ok(seed) => Loaded::Yes(seed),
                Err(Revival::Quarantined(q)) => Loaded::Quarantined(q),
                Err(Revival::Unreadable(reason)) => {
                    return query::refuse(&context.client, query, reason).await;
                }
            };
        }
        let seed = match &state.seed {
            Loaded::Yes(seed) => seed,
            Loaded::Quarantined(q) => {
                return query::refuse(&context.client, query, q.dead_letter_reason()).await;
            }
            Loaded::No => return,
        };
        let known = known::<E>(seed, &context);
        query::answer(
            &context.client,
            &context.journal_stream,
            &context.names,
            query,
            known,
        )
        .await;
    }
    .instrument(span)
    .await;
}

/// What a query is told of an entity's state (its encoding guarded like `decide`).
pub(crate) fn known<E: Entity>(seed: &Seed<E>, context: &EntityContext) -> Known {
    let codec = context.codec;
    let state = catch_unwind(AssertUnwindSafe(|| E::encode_state(&seed.state, codec)))
        .unwrap_or_else(|panic| {
            Err(crate::error::CodecError::Encode(format!(
                "encode_state panicked: {}",
                panic_message(&*panic)
            )))
        });
    Known {
        partition: context.partition,
        generation: context.journal.generation(),
        last_command_seq: seed.last_command_seq,
        state,
    }
}

/// Maps a failed journal write to the verdict it means.
fn write_failed(e: WriteError) -> Verdict {
    match e {
        WriteError::Fenced { .. } => Verdict::Fenced,
        WriteError::Unconfirmed(_) => Verdict::Failed(Failure::Unconfirmed(e.to_string())),
        WriteError::TooManyEvents { .. } | WriteError::Refused(_) => {
            Verdict::Failed(Failure::Refused(e.to_string()))
        }
    }
}

async fn process<E: Entity>(
    state: &mut EntityState<E>,
    work: Work,
    quarantine: &mut Option<Quarantine>,
    detail: &mut Option<Detail>,
    timer_reports: &mut Vec<TimerReport>,
) -> Verdict {
    let Work {
        seq,
        payload,
        deliveries,
        give_up,
        trace,
        detail: wants_detail,
        timer: firing,
    } = work;
    if matches!(state.seed, Loaded::No) {
        let loading = std::time::Instant::now();
        // The semaphore is never closed.
        let permit = state.context.loads.acquire().await.ok();
        let waited = loading.elapsed();
        let revived = revive::<E>(&state.id, &state.context).await;
        drop(permit);
        tracing::debug!(
            waited_ms = waited.as_millis() as u64,
            load_ms = loading.elapsed().saturating_sub(waited).as_millis() as u64,
            "entity loaded"
        );
        telemetry::record(&state.context.metrics.replay_seconds, loading.elapsed());
        state.seed = match revived {
            Ok(seed) => Loaded::Yes(seed),
            Err(Revival::Quarantined(q)) => Loaded::Quarantined(q),
            Err(Revival::Unreadable(reason)) => {
                return Verdict::Failed(Failure::Unconfirmed(reason));
            }
        };
    }
    let last_command_seq = match &state.seed {
        Loaded::Yes(seed) => seed.last_command_seq,
        Loaded::Quarantined(q) => q.last_command_seq,
        Loaded::No => 0,
    };
    if seq <= last_command_seq {
        tracing::debug!(last = last_command_seq, "already processed");
        let earlier = match &state.seed {
            Loaded::Yes(seed) if seq == seed.last_command_seq => seed.last_outcome.clone(),
            _ => None,
        };
        return Verdict::Duplicate { earlier };
    }
    let give_up = match (&state.seed, give_up) {
        (_, Some(reason)) => Some(reason.to_string()),
        (Loaded::Quarantined(q), None) => {
            return Verdict::Failed(Failure::Quarantined(q.clone()));
        }
        (_, None) => None,
    };
    // A timer's command runs only while the entity has that timer armed: once (a repeat finds
    // it fired), and never after a cancel or a new set of the name.
    if let (Some(f), Loaded::Yes(seed)) = (&firing, &state.seed)
        && give_up.is_none()
        && seed
            .timers
            .get(&f.name)
            .is_none_or(|a| a.set_seq != f.set_seq)
    {
        tracing::debug!(timer = %f.name, set_seq = f.set_seq, "timer not armed: command dropped");
        // The owner's table may hold a timer the entity no longer has (it learns of the
        // partition's timers from the journal on acquisition): tell it what the entity has.
        timer_reports.push(match seed.timers.get(&f.name) {
            Some(armed) => TimerReport::Armed {
                name: f.name.clone(),
                armed: armed.clone(),
            },
            None => TimerReport::Disarmed {
                name: f.name.clone(),
            },
        });
        return Verdict::Duplicate { earlier: None };
    }
    let codec = state.context.codec;
    let decoded = match give_up {
        Some(reason) => Err(reason),
        None => codec
            .decode::<E::Command>(&payload)
            .map_err(|e| format!("malformed: {e}")),
    };
    let command = match decoded {
        Ok(command) => command,
        Err(reason) => {
            let id = state.id.as_str();
            let written = state
                .context
                .journal
                .dead_letter(id, seq, deliveries, &reason, payload)
                .await;
            return match written {
                Ok(()) => {
                    if let Loaded::Yes(seed) = &mut state.seed {
                        seed.last_command_seq = seq;
                        seed.last_outcome = Some(LastOutcome::DeadLettered(reason.as_str().into()));
                    }
                    if let Loaded::Quarantined(q) = &mut state.seed {
                        q.last_command_seq = seq;
                    }
                    Verdict::DeadLettered(reason)
                }
                Err(e) => write_failed(e),
            };
        }
    };
    let Loaded::Yes(seed) = &mut state.seed else {
        return Verdict::Failed(Failure::Unconfirmed("entity state missing".to_owned()));
    };
    let deciding = std::time::Instant::now();
    let mut effects = Effects::for_entity(codec, state.id.clone());
    let decided = catch_unwind(AssertUnwindSafe(|| {
        E::decide_with_effects(&seed.state, command, &mut effects)
    }));
    telemetry::record(&state.context.metrics.decide_seconds, deciding.elapsed());
    let decided = match decided {
        Ok(decided) => decided,
        Err(panic) => {
            return Verdict::Failed(Failure::Crashed(format!(
                "decide panicked: {}",
                panic_message(&*panic)
            )));
        }
    };
    let events = match decided {
        Ok(events) => events,
        Err(rejection) => {
            let reason = rejection.to_string();
            if wants_detail {
                *detail = codec.encode(&rejection).ok().map(Detail::Rejection);
            }
            if let Some(f) = &firing {
                // The timer fired, though its command was refused: record it, so that it fires
                // once.
                let written = state
                    .context
                    .journal
                    .append(
                        &state.id,
                        seq,
                        Vec::new(),
                        E::EVENT_VERSION,
                        None,
                        Attached {
                            fired: Some(f),
                            ..Attached::default()
                        },
                    )
                    .await;
                if let Err(e) = written {
                    return write_failed(e);
                }
                seed.timers.remove(&f.name);
                timer_reports.push(TimerReport::Disarmed {
                    name: f.name.clone(),
                });
            }
            seed.last_command_seq = seq;
            seed.last_outcome = Some(LastOutcome::Rejected(reason.as_str().into()));
            return Verdict::Rejected(reason);
        }
    };
    let mut encoded = Vec::with_capacity(events.len());
    for event in &events {
        match codec.encode(event) {
            Ok(bytes) => encoded.push(bytes),
            Err(e) => return Verdict::Failed(Failure::Crashed(e.to_string())),
        }
    }
    let (outbox, mut timer_changes) = match effects.into_parts() {
        Ok(parts) => parts,
        Err(e) => return Verdict::Failed(Failure::Crashed(format!("effects: {e}"))),
    };
    if wants_detail {
        *detail = Some(Detail::Events(encoded.clone()));
    }
    crate::data::timers::resolve(&mut timer_changes, std::time::SystemTime::now());
    let metrics = &state.context.metrics;
    metrics.batch_events.record(encoded.len() as f64);
    let writing = std::time::Instant::now();
    let written = state
        .context
        .journal
        .append(
            &state.id,
            seq,
            encoded,
            E::EVENT_VERSION,
            trace.as_ref().map(|t| &t.span),
            Attached {
                outbox: &outbox,
                timers: &timer_changes,
                fired: firing.as_ref(),
            },
        )
        .await;
    telemetry::record(&metrics.write_seconds, writing.elapsed());
    let journal_seq = match written {
        Ok(journal_seq) => journal_seq,
        Err(e) => return write_failed(e),
    };
    if let Some(f) = &firing {
        seed.timers.remove(&f.name);
        timer_reports.push(TimerReport::Disarmed {
            name: f.name.clone(),
        });
    }
    for change in timer_changes {
        match change {
            TimerChange::Set {
                name,
                due_ms,
                payload,
                ..
            } => {
                let armed = Armed {
                    set_seq: seq,
                    due_ms,
                    payload,
                };
                seed.timers.insert(name.as_str().into(), armed.clone());
                timer_reports.push(TimerReport::Armed {
                    name: name.into(),
                    armed,
                });
            }
            TimerChange::Cancel { name } => {
                seed.timers.remove(name.as_str());
                timer_reports.push(TimerReport::Disarmed { name: name.into() });
            }
        }
    }
    seed.last_command_seq = seq;
    seed.last_outcome = Some(LastOutcome::Applied {
        events: u32::try_from(events.len()).unwrap_or(u32::MAX),
    });
    // 0: a retried batch the server had stored already (its sequence unknown here); a
    // snapshot then covers less than it could, and loading re-reads a little more.
    if let Some(stored) = journal_seq.filter(|s| *s > 0) {
        seed.journal_seq = stored;
    }
    seed.unsnapshotted = seed
        .unsnapshotted
        .saturating_add(u32::try_from(events.len()).unwrap_or(u32::MAX));
    let applied = catch_unwind(AssertUnwindSafe(|| {
        for event in &events {
            E::apply(&mut seed.state, event);
        }
    }));
    if let Err(panic) = applied {
        // The events are durable, so the command is done; the state is not to be trusted, and a
        // rebuild would panic on the same events: the entity is quarantined.
        let reason = format!(
            "apply panicked on the events of command {seq} (journal seq {}): {}",
            journal_seq.unwrap_or(0),
            panic_message(&*panic)
        );
        tracing::error!(%reason, "entity quarantined");
        *quarantine = Some(Quarantine {
            journal_seq: journal_seq.unwrap_or(0),
            reason,
            last_command_seq: seq,
        });
        state.seed = Loaded::No;
    }
    if !outbox.is_empty() {
        let js = async_nats::jetstream::new(state.context.client.clone());
        let context = &state.context;
        outbox::deliver(
            &js,
            &context.names,
            &context.journal,
            state.id.as_str(),
            seq,
            &outbox,
        )
        .await;
    }
    Verdict::Applied {
        events: events.len(),
    }
}

/// Why an entity could not be revived.
enum Revival {
    /// A record of it cannot be read back: quarantine it.
    Quarantined(Quarantine),
    /// The journal could not be read (server unavailable): try again later.
    Unreadable(String),
}

/// Loads one entity from the journal: its latest snapshot, if the entity type writes them and
/// it reads back, then its own records after it: events (`<t>.evt.<p>.<id>`), dead letters
/// (`<t>.dlq.<p>.<id>`, which count as processed) and timer records (`<t>.tmr.<p>.<id>`: its
/// armed timers). Reads only this entity's subjects, so it costs the same however long the
/// partition's history is: four single-message reads side by side (the snapshot, the last
/// event, dead letter and timer record), plus the records after the snapshot if there are any.
///
/// A snapshot is never written while the entity has a timer armed (`write_snapshot`), so every
/// armed timer's `set` record is after the latest snapshot, and read here.
///
/// A snapshot that does not read back (another state version, a damaged record) is ignored:
/// the entity is loaded from all its events, which are the record; never a wedge.
#[tracing::instrument(level = "debug", skip_all, fields(partition = context.partition, entity = %id, generation = context.journal.generation()))]
async fn revive<E: Entity>(id: &EntityId, context: &EntityContext) -> Result<Seed<E>, Revival> {
    let unreadable =
        |e: Error| Revival::Unreadable(format!("cannot revive {id} from the journal: {e}"));
    let codec = context.codec;
    let partition = context.partition;
    let events = context.names.event_subject(partition, id);
    let dead_letters = context.names.entity_dead_letters(partition, id);
    let timers = context.names.timer_subject(partition, id);
    let mut seed = Seed::<E>::default();
    // Records of commands up to `covered` are in the snapshot; those after `from` are read.
    let (mut from, mut covered) = (1, None);
    // The four reads side by side: an entity's first command waits for one round trip, not
    // four, when its snapshot is recent (or it has no history).
    let snapshots = E::snapshots();
    let snapshot = async {
        match snapshots {
            Some(_) => {
                let subject = context.names.snapshot_subject(partition, id);
                journal::latest_snapshot(&context.journal_stream, &subject).await
            }
            None => Ok(None),
        }
    };
    let (latest, events_end, dead_letters_end, timers_end) = futures::try_join!(
        snapshot,
        journal::last_sequence(&context.journal_stream, &events),
        journal::last_sequence(&context.journal_stream, &dead_letters),
        journal::last_sequence(&context.journal_stream, &timers),
    )
    .map_err(unreadable)?;
    if let (Some(snapshots), Some((snapshot_seq, snapshot))) = (snapshots, latest) {
        match restore::<E>(&snapshot, snapshots, codec) {
            Ok(restored) => {
                tracing::debug!(
                    snapshot_seq,
                    cmd_seq = snapshot.command_seq,
                    "loaded from a snapshot"
                );
                from = snapshot.upto + 1;
                covered = Some(snapshot.command_seq);
                seed = restored;
            }
            Err(reason) => tracing::warn!(
                snapshot_seq,
                %reason,
                "snapshot ignored; the entity is loaded from its events"
            ),
        }
    }
    let mut quarantine = None;
    let reads = [
        (events, events_end),
        (dead_letters, dead_letters_end),
        (timers, timers_end),
    ];
    for (filter, end) in reads {
        let read = journal::replay(&context.journal_stream, filter, from, end, |stored| {
            if covered.is_some_and(|c| stored.command_seq <= c) || stored.entity != id.as_str() {
                return Ok(());
            }
            match &mut quarantine {
                None => quarantine = seed.replay(id.as_str(), &stored, codec).err(),
                Some(q) => q.last_command_seq = q.last_command_seq.max(stored.command_seq),
            }
            Ok(())
        })
        .await;
        read.map_err(unreadable)?;
    }
    match quarantine {
        Some(q) => Err(Revival::Quarantined(q)),
        None => Ok(seed),
    }
}

/// The state a snapshot holds, or why it cannot be used.
fn restore<E: Entity>(
    snapshot: &SnapshotRecord,
    snapshots: Snapshots<E::State>,
    codec: Codec,
) -> Result<Seed<E>, String> {
    if snapshot.version != snapshots.version() {
        return Err(format!(
            "state version {} written, this code reads {}",
            snapshot.version,
            snapshots.version()
        ));
    }
    let decoded = catch_unwind(AssertUnwindSafe(|| {
        snapshots.decode(&snapshot.state, codec)
    }));
    let state = match decoded {
        Ok(Ok(state)) => state,
        Ok(Err(e)) => return Err(format!("state does not decode: {e}")),
        Err(panic) => return Err(format!("decoding panicked: {}", panic_message(&*panic))),
    };
    Ok(Seed {
        state,
        last_command_seq: snapshot.command_seq,
        last_outcome: snapshot
            .last_outcome
            .as_deref()
            .and_then(LastOutcome::from_header),
        journal_seq: snapshot.upto,
        unsnapshotted: 0,
        // None was armed when the snapshot was written (`write_snapshot`).
        timers: BTreeMap::new(),
    })
}

/// Writes a snapshot of `seed` (if the entity type writes them), fenced like its events.
/// Best effort: a snapshot is a cache of the events, so a failed one is logged and the entity
/// goes on (a fenced writer learns it is stale at its next event).
///
/// Not while a timer is armed: loading reads the timer records after the latest snapshot
/// only, so a snapshot must not cover the `set` of a timer still armed. The snapshot waits
/// until the entity's timers have fired or been cancelled.
async fn write_snapshot<E: Entity>(id: &EntityId, context: &EntityContext, seed: &mut Seed<E>) {
    let Some(snapshots) = E::snapshots() else {
        return;
    };
    if !seed.timers.is_empty() {
        tracing::trace!(partition = context.partition, entity = %id, armed = seed.timers.len(), "timers armed; no snapshot yet");
        return;
    }
    let encoded = catch_unwind(AssertUnwindSafe(|| {
        snapshots.encode(&seed.state, context.codec)
    }));
    let state = match encoded {
        Ok(Ok(state)) => state,
        Ok(Err(e)) => {
            tracing::warn!(partition = context.partition, entity = %id, error = %e, "state not encoded; no snapshot");
            return;
        }
        Err(panic) => {
            tracing::warn!(partition = context.partition, entity = %id, panic = %panic_message(&*panic), "encoding the state panicked; no snapshot");
            return;
        }
    };
    let record = SnapshotRecord {
        state: state.into(),
        version: snapshots.version(),
        command_seq: seed.last_command_seq,
        upto: seed.journal_seq,
        last_outcome: seed.last_outcome.as_ref().map(LastOutcome::to_header),
    };
    let writing = std::time::Instant::now();
    match context.journal.snapshot(id, record).await {
        Ok(journal_seq) => {
            telemetry::record(&context.metrics.snapshot_seconds, writing.elapsed());
            tracing::debug!(
                partition = context.partition,
                entity = %id,
                generation = context.journal.generation(),
                cmd_seq = seed.last_command_seq,
                journal_seq,
                "snapshot written"
            );
            seed.unsnapshotted = 0;
        }
        // Not confirmed (a clustered stream refuses concurrent fenced writes, a leader change):
        // tried again after the entity's next command.
        Err(e @ WriteError::Unconfirmed(_)) => tracing::debug!(
            partition = context.partition,
            entity = %id,
            generation = context.journal.generation(),
            cmd_seq = seed.last_command_seq,
            error = %e,
            "snapshot not written"
        ),
        Err(e) => tracing::warn!(
            partition = context.partition,
            entity = %id,
            generation = context.journal.generation(),
            cmd_seq = seed.last_command_seq,
            error = %e,
            "snapshot not written"
        ),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_entity::Counter;

    fn record(version: u32, state: &[u8]) -> SnapshotRecord {
        SnapshotRecord {
            state: Bytes::copy_from_slice(state),
            version,
            command_seq: 17,
            upto: 40,
            last_outcome: Some("rejected too late".to_owned()),
        }
    }

    #[test]
    fn the_last_outcome_reads_back_from_its_header() {
        for outcome in [
            LastOutcome::Applied { events: 3 },
            LastOutcome::Rejected("too late".into()),
            LastOutcome::DeadLettered("malformed: x y".into()),
            LastOutcome::Rejected("".into()),
        ] {
            assert_eq!(
                LastOutcome::from_header(&outcome.to_header()),
                Some(outcome)
            );
        }
        assert_eq!(LastOutcome::from_header("applied many"), None);
        assert_eq!(LastOutcome::from_header("other"), None);
    }

    #[test]
    fn a_snapshot_restores_state_mark_and_outcome() {
        let snapshots = Counter::snapshots().unwrap();
        let seed = restore::<Counter>(&record(2, b"42"), snapshots, Codec::Json).unwrap();
        assert_eq!(seed.state, 42);
        assert_eq!(seed.last_command_seq, 17);
        assert_eq!(seed.journal_seq, 40);
        assert_eq!(seed.unsnapshotted, 0);
        assert_eq!(
            seed.last_outcome,
            Some(LastOutcome::Rejected("too late".into()))
        );
    }

    #[test]
    fn a_snapshot_of_another_version_or_that_does_not_decode_is_refused() {
        let snapshots = Counter::snapshots().unwrap();
        let other = restore::<Counter>(&record(1, b"42"), snapshots, Codec::Json);
        assert!(other.is_err_and(|e| e.contains("version 1")));
        let garbage = restore::<Counter>(&record(2, b"\xff{"), snapshots, Codec::Json);
        assert!(garbage.is_err_and(|e| e.contains("does not decode")));
        let bincode = restore::<Counter>(&record(2, &[0xfd; 3]), snapshots, Codec::Bincode);
        assert!(bincode.is_err());
    }
}
