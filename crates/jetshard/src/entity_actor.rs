//! The actor of one live entity: applies its commands strictly in order.
//!
//! It holds the entity's state and the stream sequence of the last command applied to it. For
//! each command it decides, makes the events durable through the partition's fenced journal
//! writer, applies them, and reports an [`Outcome`] to its owner, which acknowledges the command.
//! After a failure it reports and stops; its owner revives it from the journal.

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

/// What an entity actor needs besides its state.
pub(crate) struct EntityArgs {
    pub(crate) id: EntityId,
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
    args: EntityArgs,
    /// Loaded lazily, so that reviving from the journal runs in this actor, not its owner.
    seed: Option<Seed<E>>,
    /// Set after a failure: later messages are ignored until the actor stops.
    broken: bool,
}

impl<E: Entity> Actor for EntityActor<E> {
    type Msg = Work;
    type State = EntityState<E>;
    /// The seed is `None` for an entity to revive from the journal.
    type Arguments = (EntityArgs, Option<Seed<E>>);

    async fn pre_start(
        &self,
        _: ActorRef<Work>,
        (args, seed): Self::Arguments,
    ) -> Result<EntityState<E>, ActorProcessingErr> {
        Ok(EntityState {
            args,
            seed,
            broken: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Work>,
        work: Work,
        state: &mut EntityState<E>,
    ) -> Result<(), ActorProcessingErr> {
        if state.broken {
            return Ok(());
        }
        let span = tracing::debug_span!(
            "command",
            partition = state.args.partition,
            entity = %state.args.id,
            generation = state.args.journal.generation(),
            cmd_seq = work.seq,
        );
        let seq = work.seq;
        let verdict = process(state, work).instrument(span).await;
        let stops = matches!(verdict, Verdict::Fenced | Verdict::Failed { .. });
        let outcome = Outcome {
            entity: state.args.id.clone(),
            seq,
            generation: state.args.journal.generation(),
            verdict,
        };
        if stops {
            state.broken = true;
            myself.stop(Some("failed".to_owned()));
        }
        // The owner is gone only when the partition is being dropped; nothing to report then.
        let _ = state.args.owner.cast(OwnerMsg::Outcome(outcome));
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
        match revive::<E>(&state.args).await {
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
    let codec = state.args.codec;
    let command: E::Command = match codec.decode(&payload) {
        Ok(command) => command,
        Err(e) => {
            let reason = format!("malformed: {e}");
            let id = state.args.id.as_str();
            let written = state
                .args
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
    match state
        .args
        .journal
        .append(&state.args.id, seq, encoded)
        .await
    {
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
async fn revive<E: Entity>(args: &EntityArgs) -> Result<Seed<E>, String> {
    let mut seed = Seed::<E>::default();
    let codec = args.codec;
    let filter = args.names.event_subject(args.partition, &args.id);
    let fail = |e: crate::Error| format!("cannot revive {} from the journal: {e}", args.id);
    let upto = journal::last_sequence(&args.journal_stream, &filter)
        .await
        .map_err(fail)?;
    journal::replay(&args.journal_stream, vec![filter], upto, |stored| {
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
