//! The actor of one live entity: applies its commands strictly in order.
//!
//! It holds the entity's state and the stream sequence of the last command applied to it. For
//! each command it decides, makes the events durable through the partition's fenced journal
//! writer, applies them, and reports an [`Outcome`] to its owner, which acknowledges the command.
//! After a failure it reports and stops; its owner revives it from the journal.
//!
//! Passivation: an idle entity's actor hands its state back to the owner and stops. The state
//! waits in the owner's dormant map, a few dozen bytes beyond the state itself, against some
//! kilobytes for a live actor, until the entity's next command spawns a new actor with it.

use std::any::Any;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use async_nats::jetstream::stream::Stream;
use bytes::Bytes;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;

use crate::codec::Codec;
use crate::entity::{Entity, EntityId};
use crate::journal::{self, JournalWriter, WriteError};
use crate::owner::OwnerMsg;
use crate::wire::Names;

/// An entity's state and the last command applied to it.
pub(crate) struct Seed<E: Entity> {
    pub(crate) state: E::State,
    pub(crate) last_command_seq: u64,
}

impl<E: Entity> Default for Seed<E> {
    fn default() -> Self {
        Self {
            state: E::State::default(),
            last_command_seq: 0,
        }
    }
}

/// What an entity actor is asked to do.
pub(crate) enum EntityMsg {
    /// Apply a command.
    Work(Work),
    /// Idle: give the state back to the owner ([`Passivated`]) and stop.
    Passivate,
}

/// An entity actor's state, handed back to its owner on passivation.
pub(crate) struct Passivated {
    pub(crate) entity: EntityId,
    pub(crate) generation: u64,
    /// A `Seed<E>` of the owner's entity type; `None` if the actor holds no state it trusts
    /// (the next actor revives the entity from the journal).
    pub(crate) seed: Option<Box<dyn Any + Send>>,
}

/// A command for the entity.
pub(crate) struct Work {
    pub(crate) seq: u64,
    pub(crate) payload: Bytes,
    /// How often it has been delivered (for a dead-letter record).
    pub(crate) deliveries: u64,
}

/// What became of one command.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Its events are durable (possibly none).
    Applied { events: usize },
    /// It had been applied before (a redelivery): acknowledge it, nothing more.
    Duplicate,
    /// The entity refused it; nothing was written.
    Rejected(String),
    /// Its payload is not a valid command: a dead-letter record is written (in the entity's
    /// order), and the command is to be terminated.
    DeadLettered(String),
    /// The write was rejected by the fence: the partition has a newer owner.
    Fenced,
    /// Not applied; retry it. The entity actor has stopped.
    Failed { reason: String, crashed: bool },
}

/// The report sent to the owner for every command.
pub(crate) struct Outcome {
    pub(crate) entity: EntityId,
    pub(crate) seq: u64,
    pub(crate) generation: u64,
    pub(crate) verdict: Verdict,
}

/// What the entity actors of one partition under one generation share (one allocation for
/// all of them: a live actor's size is what passivation is weighed against).
pub(crate) struct EntityContext {
    pub(crate) partition: u32,
    pub(crate) journal: JournalWriter,
    pub(crate) journal_stream: Stream<()>,
    pub(crate) names: Arc<Names>,
    pub(crate) codec: Codec,
    pub(crate) owner: ActorRef<OwnerMsg>,
}

pub(crate) struct EntityActor<E>(PhantomData<fn() -> E>);

impl<E> EntityActor<E> {
    pub(crate) fn new() -> Self {
        Self(PhantomData)
    }
}

pub(crate) struct EntityState<E: Entity> {
    id: EntityId,
    context: Arc<EntityContext>,
    /// Loaded lazily, so that reviving from the journal runs in this actor, not its owner.
    seed: Option<Seed<E>>,
    /// Set after a failure: later messages are ignored until the actor stops.
    broken: bool,
}

impl<E: Entity> Actor for EntityActor<E> {
    type Msg = EntityMsg;
    type State = EntityState<E>;
    /// The seed is `None` for an entity to revive from the journal.
    type Arguments = (EntityId, Arc<EntityContext>, Option<Seed<E>>);

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
            EntityMsg::Passivate => {
                let seed = state.seed.take().filter(|_| !state.broken);
                let passivated = Passivated {
                    entity: state.id.clone(),
                    generation: state.context.journal.generation(),
                    seed: seed.map(|seed| Box::new(seed) as Box<dyn Any + Send>),
                };
                state.broken = true;
                myself.stop(Some("passivated".to_owned()));
                let _ = state.context.owner.cast(OwnerMsg::Passivated(passivated));
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
        );
        let seq = work.seq;
        // Boxed: the actor's task then holds only a pointer to the (large) future of a command
        // while it is idle.
        let verdict = Box::pin(process(state, work).instrument(span)).await;
        let stops = matches!(verdict, Verdict::Fenced | Verdict::Failed { .. });
        let outcome = Outcome {
            entity: state.id.clone(),
            seq,
            generation: state.context.journal.generation(),
            verdict,
        };
        if stops {
            state.broken = true;
            myself.stop(Some("failed".to_owned()));
        }
        // The owner is gone only when the partition is being dropped; nothing to report then.
        let _ = state.context.owner.cast(OwnerMsg::Outcome(outcome));
        Ok(())
    }
}

async fn process<E: Entity>(state: &mut EntityState<E>, work: Work) -> Verdict {
    let Work {
        seq,
        payload,
        deliveries,
    } = work;
    if state.seed.is_none() {
        match revive::<E>(&state.id, &state.context).await {
            Ok(seed) => state.seed = Some(seed),
            Err(reason) => {
                return Verdict::Failed {
                    reason,
                    crashed: false,
                };
            }
        }
    }
    let Some(seed) = state.seed.as_mut() else {
        return Verdict::Failed {
            reason: "entity state missing".to_owned(),
            crashed: false,
        };
    };
    if seq <= seed.last_command_seq {
        tracing::debug!(last = seed.last_command_seq, "already applied");
        return Verdict::Duplicate;
    }
    let codec = state.context.codec;
    let command: E::Command = match codec.decode(&payload) {
        Ok(command) => command,
        Err(e) => {
            let reason = format!("malformed: {e}");
            let id = state.id.as_str();
            let written = state
                .context
                .journal
                .dead_letter(id, seq, deliveries, &reason, payload)
                .await;
            return match written {
                Ok(()) => {
                    seed.last_command_seq = seq;
                    Verdict::DeadLettered(reason)
                }
                Err(WriteError::Fenced { .. }) => Verdict::Fenced,
                Err(e @ WriteError::Unconfirmed(_)) => Verdict::Failed {
                    reason: e.to_string(),
                    crashed: false,
                },
                Err(e) => Verdict::Failed {
                    reason: e.to_string(),
                    crashed: true,
                },
            };
        }
    };
    let decided = match catch_unwind(AssertUnwindSafe(|| E::decide(&seed.state, command))) {
        Ok(decided) => decided,
        Err(panic) => {
            return Verdict::Failed {
                reason: format!("decide panicked: {}", panic_message(&*panic)),
                crashed: true,
            };
        }
    };
    let events = match decided {
        Ok(events) => events,
        Err(rejection) => {
            seed.last_command_seq = seq;
            return Verdict::Rejected(rejection.to_string());
        }
    };
    let mut encoded = Vec::with_capacity(events.len());
    for event in &events {
        match codec.encode(event) {
            Ok(bytes) => encoded.push(bytes),
            Err(e) => {
                return Verdict::Failed {
                    reason: e.to_string(),
                    crashed: true,
                };
            }
        }
    }
    match state.context.journal.append(&state.id, seq, encoded).await {
        Ok(()) => {}
        Err(WriteError::Fenced { .. }) => return Verdict::Fenced,
        Err(e @ WriteError::Unconfirmed(_)) => {
            return Verdict::Failed {
                reason: e.to_string(),
                crashed: false,
            };
        }
        Err(e @ (WriteError::TooManyEvents { .. } | WriteError::Refused(_))) => {
            return Verdict::Failed {
                reason: e.to_string(),
                crashed: true,
            };
        }
    }
    seed.last_command_seq = seq;
    let applied = catch_unwind(AssertUnwindSafe(|| {
        for event in &events {
            E::apply(&mut seed.state, event);
        }
    }));
    if let Err(panic) = applied {
        // The events are durable, so the command is done; the state in memory is not to be
        // trusted. Drop it: the next command revives the entity from the journal.
        tracing::error!(
            panic = panic_message(&*panic),
            "apply panicked after the events were written"
        );
        state.seed = None;
    }
    Verdict::Applied {
        events: events.len(),
    }
}

/// Rebuilds one entity from its events in the journal.
async fn revive<E: Entity>(id: &EntityId, context: &EntityContext) -> Result<Seed<E>, String> {
    let mut seed = Seed::<E>::default();
    let codec = context.codec;
    let filter = context.names.event_subject(context.partition, id);
    let fail = |e: crate::Error| format!("cannot revive {id} from the journal: {e}");
    journal::replay(&context.journal_stream, filter, u64::MAX, |stored| {
        let Some(payload) = stored.payload else {
            return Ok(());
        };
        let event: E::Event = codec.decode(payload).map_err(crate::Error::from)?;
        apply_replayed::<E>(&mut seed, &event, stored.command_seq)
            .map_err(|reason| crate::Error::jetstream("revive", reason))
    })
    .await
    .map_err(fail)?;
    Ok(seed)
}

/// Applies one replayed event, catching a panicking `apply`.
pub(crate) fn apply_replayed<E: Entity>(
    seed: &mut Seed<E>,
    event: &E::Event,
    command_seq: u64,
) -> Result<(), String> {
    catch_unwind(AssertUnwindSafe(|| E::apply(&mut seed.state, event))).map_err(|panic| {
        format!(
            "apply panicked on a journal event of command {command_seq}: {}",
            panic_message(&*panic)
        )
    })?;
    seed.last_command_seq = seed.last_command_seq.max(command_seq);
    Ok(())
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".to_owned()
    }
}
