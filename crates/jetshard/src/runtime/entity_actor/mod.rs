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
//! Files: [`protocol`] (what the actor and its owner say), [`process`] (one command as named
//! steps), [`load`], [`batch`] and [`replay`] (an entity's state rebuilt), [`snapshot`],
//! [`outcome_header`] (the `Jetshard-Last-Outcome` codec), [`queries`], [`state`].
//!
//! Passivation: an idle entity's actor hands its state back to the owner and stops. The state
//! waits in the owner's dormant set, encoded (a few dozen bytes beyond its encoding), against
//! some kilobytes for a live actor, until the entity's next command spawns a new actor with it.

mod batch;
mod duplicate;
mod load;
pub(crate) mod outcome_header;
mod process;
mod protocol;
mod queries;
mod replay;
mod snapshot;
mod state;

use std::any::Any;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;

use crate::entity::{Entity, EntityId};

pub(crate) use batch::{BatchLoad, InBatch, MAX_ENTITIES as MAX_BATCH_LOAD};
use process::process;
pub(crate) use protocol::{
    CommandReport, EntityContext, EntityMsg, EntityReport, Failure, LoadStats, MAX_BATCH_READS,
    MAX_LOADS, Passivated, Quarantine, Reporter, SnapshotPolicy, Verdict, Work, panic_message,
};
use queries::answer_query;
pub(crate) use replay::Seed;
use snapshot::write_snapshot;
use state::EntityState;
pub(crate) use state::Loaded;

pub(crate) struct EntityActor<E>(PhantomData<fn() -> E>);

impl<E> EntityActor<E> {
    pub(crate) fn new() -> Self {
        Self(PhantomData)
    }
}

impl<E: Entity> Actor for EntityActor<E> {
    type Msg = EntityMsg;
    type State = EntityState<E>;
    type Arguments = (EntityId, Arc<EntityContext>, Loaded<E>, Option<InBatch>);

    /// Waits for nothing: the owner starts the actor at once, in its own turn
    /// (`owner::route::spawn`), where a start that waited would be a failed spawn.
    async fn pre_start(
        &self,
        _: ActorRef<EntityMsg>,
        (id, context, seed, batch): Self::Arguments,
    ) -> Result<EntityState<E>, ActorProcessingErr> {
        let event_subject = context.names.event_subject(context.partition, &id).into();
        Ok(EntityState {
            id,
            event_subject,
            context,
            seed,
            batch,
            broken: false,
            timers_untold: false,
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
                // Boxed, like a command's processing: the actor's task holds the (large)
                // future of a query or a snapshot only while it runs, not in every idle actor.
                Box::pin(answer_query(state, query)).await;
                return Ok(());
            }
            EntityMsg::Passivate => {
                Box::pin(hand_back(&myself, state, true)).await;
                return Ok(());
            }
            EntityMsg::Surrender => {
                Box::pin(hand_back(&myself, state, false)).await;
                return Ok(());
            }
        };
        if state.broken
            || state
                .context
                .retired
                .load(std::sync::atomic::Ordering::Acquire)
        {
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
        let outcome = CommandReport {
            entity: state.id.clone(),
            seq,
            generation: state.context.journal.generation(),
            verdict,
            quarantine,
            detail,
            timers,
        };
        (state.context.report)(EntityReport::Command(outcome));
        // After the report, so the command's acknowledgement does not wait for it.
        if let (Loaded::Yes(seed), false, Some(every)) =
            (&mut state.seed, state.broken, state.context.snapshots.every)
            && seed.unsnapshotted >= every
        {
            Box::pin(write_snapshot(&state.id, &state.context, seed)).await;
        }
        Ok(())
    }
}

/// Hands the entity's state back to the owner ([`Passivated`]) and stops the actor: on
/// passivation (`snapshot`: first a snapshot of what it wrote since its last one, as the policy
/// says), or on a surrender, when the generation is over and nothing may be written.
async fn hand_back<E: Entity>(
    myself: &ActorRef<EntityMsg>,
    state: &mut EntityState<E>,
    snapshot: bool,
) {
    if let Loaded::Yes(seed) = &mut state.seed
        && snapshot
        && !state.broken
        && state.context.snapshots.on_passivation
        && seed.unsnapshotted > 0
    {
        write_snapshot(&state.id, &state.context, seed).await;
    }
    let seed = match std::mem::replace(&mut state.seed, Loaded::No) {
        Loaded::Yes(seed) if !state.broken => Some(Box::new(seed) as Box<dyn Any + Send>),
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
}
