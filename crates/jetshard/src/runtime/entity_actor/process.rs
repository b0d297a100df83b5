//! One command, start to finish, as named steps: [`load`] the entity if it is not, [`admit`]
//! the command (a duplicate, a quarantined entity, a timer no longer armed end here),
//! [`decode`] it (or dead-letter it), [`decide`] (a rejection ends here), write the events,
//! outbox and timer records as one fenced unit (`JournalWriter::append`, awaited in [`process`]
//! itself), [`apply`] the events, and publish the outbox. Each step returns `Err(verdict)` when
//! the command ends there.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::duplicate::{events_again, rejection_again};
use super::load::{Revival, revive};
use super::outcome_header::LastOutcome;
use super::protocol::{EntityContext, Failure, Quarantine, Verdict, Work, panic_message};
use super::replay::Seed;
use super::state::{EntityState, Loaded};
use bytes::Bytes;

use crate::data::origin::Origin;
use crate::data::timers::Firing;
use crate::data::timers::{Armed, TimerChange, TimerReport};
use crate::data::{Effects, OutboxMessage};
use crate::entity::{Entity, EntityId};
use crate::journal::{Attached, WriteError};
use crate::reply::Detail;
use crate::runtime::outbox;
use crate::telemetry::{self};

/// Maps a failed journal write to the verdict it means.
pub(super) fn write_failed(e: WriteError) -> Verdict {
    match e {
        WriteError::Fenced { .. } => Verdict::Fenced,
        WriteError::Unconfirmed(_) => Verdict::Failed(Failure::Unconfirmed(e.to_string())),
        WriteError::TooManyEvents { .. } | WriteError::Refused(_) => {
            Verdict::Failed(Failure::Refused(e.to_string()))
        }
    }
}

/// Ends the command with the verdict of a step that returned `Err(verdict)`.
macro_rules! step {
    ($step:expr) => {
        match $step {
            Ok(done) => done,
            Err(verdict) => return verdict,
        }
    };
}

/// Handles one command of the entity: the steps below in order; the verdict of the step it
/// ended at, or `Applied`.
///
/// Its future is allocated for every command (the actor boxes it), so it is kept small: the
/// rare steps are boxed apart, `work` is read in place rather than taken apart into copies, and
/// the write is awaited here rather than through a function holding its arguments beside it.
pub(super) async fn process<E: Entity>(
    state: &mut EntityState<E>,
    work: Work,
    quarantine: &mut Option<Quarantine>,
    detail: &mut Option<Detail>,
    timer_reports: &mut Vec<TimerReport>,
) -> Verdict {
    let seq = work.seq;
    let wants_detail = work.detail;
    tracing::trace!(target: crate::telemetry::STAGE_TARGET, seq, "started");
    step!(load(state, seq).await);
    if std::mem::take(&mut state.timers_untold)
        && let Loaded::Yes(seed) = &state.seed
    {
        timer_reports.extend(seed.timers.iter().map(|(name, armed)| TimerReport::Armed {
            name: name.clone(),
            armed: armed.clone(),
        }));
    }
    let admitted = admit(
        state,
        seq,
        work.give_up,
        work.timer.as_ref(),
        work.origin.as_deref(),
        timer_reports,
    );
    let give_up = match admitted {
        // A client waits: this is the first answer it can get, so it gets the command's own
        // outcome, typed, not an untyped duplicate.
        Err(Verdict::Duplicate {
            earlier: Some(earlier),
        }) if wants_detail => {
            match &earlier {
                LastOutcome::Applied { events } => {
                    let (id, context) = (&state.id, &*state.context);
                    // Boxed: see `load`.
                    Box::pin(events_again::<E>(id, context, seq, *events, detail)).await;
                }
                LastOutcome::Rejected(reason) => {
                    if let Loaded::Yes(seed) = &state.seed {
                        let codec = state.context.codec;
                        *detail =
                            rejection_again::<E>(seed, &work.payload, reason, codec, &state.id);
                    }
                }
                _ => {}
            }
            return Verdict::Duplicate {
                earlier: Some(earlier),
            };
        }
        admitted => step!(admitted),
    };
    let command = step!(decode(state, seq, work.deliveries, work.payload, give_up).await);
    let Loaded::Yes(seed) = &mut state.seed else {
        return Verdict::Failed(Failure::Unconfirmed("entity state missing".to_owned()));
    };
    let context = &*state.context;
    let (events, effects) = step!(
        decide(
            context,
            &state.id,
            seed,
            seq,
            command,
            work.timer.as_ref(),
            wants_detail.then_some(&mut *detail),
            timer_reports,
        )
        .await
    );
    let encoded = step!(encode::<E>(context, &events));
    let (outbox, timer_changes) = step!(effects_to_write(
        effects,
        &encoded,
        wants_detail.then_some(&mut *detail)
    ));
    let metrics = &context.metrics;
    metrics.batch_events.record(encoded.len() as f64);
    let previous = seed.previous();
    let writing = std::time::Instant::now();
    tracing::trace!(target: crate::telemetry::STAGE_TARGET, seq, "writing");
    let written = context
        .journal
        .append(
            &state.id,
            &state.event_subject,
            seq,
            encoded,
            E::EVENT_VERSION,
            work.trace.as_ref().map(|t| &t.span),
            Attached {
                outbox: &outbox,
                timers: &timer_changes,
                fired: work.timer.as_ref(),
                origin: work.origin.as_deref(),
            },
            previous,
        )
        .await;
    telemetry::record(&metrics.write_seconds, writing.elapsed());
    tracing::trace!(target: crate::telemetry::STAGE_TARGET, seq, "written");
    let written = Written {
        journal_seq: step!(written.map_err(write_failed)),
        outbox,
        timer_changes,
    };
    let outbox = apply(
        state,
        seq,
        &events,
        work.timer.as_ref(),
        work.origin.as_deref().copied(),
        written,
        quarantine,
        timer_reports,
    );
    if !outbox.is_empty() {
        let js = async_nats::jetstream::new(state.context.client.clone());
        let context = &state.context;
        // Boxed, as `load`'s reads: a rare step kept out of every command's future.
        let over = Box::pin(outbox::deliver(
            &js,
            &context.names,
            &context.routes,
            &context.journal,
            state.id.as_str(),
            seq,
            &outbox,
        ))
        .await;
        if !over {
            let generation = context.journal.generation();
            (context.report)(super::protocol::EntityReport::OutboxUndelivered { generation });
        }
    }
    Verdict::Applied {
        events: events.len(),
    }
}

/// Loads the entity on its first command: from its latest snapshot and the journal after it,
/// or quarantined. Its reads wait for one of the process's load permits (`MAX_LOADS`): its
/// own reads, or its batch's one read (`revive`).
async fn load<E: Entity>(state: &mut EntityState<E>, seq: u64) -> Result<(), Verdict> {
    if !matches!(state.seed, Loaded::No) {
        return Ok(());
    }
    tracing::trace!(target: crate::telemetry::STAGE_TARGET, seq, "loading");
    let loading = std::time::Instant::now();
    // Boxed: the reads of a load are the largest part of a command's future, which every
    // command allocates (the actor boxes it); only a command that loads pays for them.
    let batch = state.batch.take();
    let revived = Box::pin(revive::<E>(&state.id, &state.context, batch.as_ref())).await;
    tracing::trace!(target: crate::telemetry::STAGE_TARGET, seq, "loaded");
    tracing::debug!(
        load_ms = loading.elapsed().as_millis() as u64,
        "entity loaded"
    );
    telemetry::record(&state.context.metrics.replay_seconds, loading.elapsed());
    state.seed = match revived {
        Ok(seed) => {
            state.timers_untold = true;
            Loaded::Yes(seed)
        }
        Err(Revival::Quarantined(q)) => Loaded::Quarantined(q),
        Err(Revival::Unreadable(reason)) => {
            return Err(Verdict::Failed(Failure::Unconfirmed(reason)));
        }
    };
    Ok(())
}

/// Whether the command is to be handled: not a duplicate, not for a quarantined entity (unless
/// it is given up on anyway), not of a timer the entity no longer has armed. The reason to give
/// it up, if it is to be dead-lettered.
fn admit<E: Entity>(
    state: &EntityState<E>,
    seq: u64,
    give_up: Option<std::sync::Arc<str>>,
    firing: Option<&Firing>,
    origin: Option<&Origin>,
    timer_reports: &mut Vec<TimerReport>,
) -> Result<Option<String>, Verdict> {
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
        return Err(Verdict::Duplicate { earlier });
    }
    // A copy of an outbox message this entity applied: the outbox publishes a message again
    // when its command's done record is missing, and a restarted server no longer knows the
    // msg id of a command it already handed out (`data/origin.rs`).
    if let (Some(origin), Loaded::Yes(seed)) = (origin, &state.seed)
        && seed.origins.contains(origin)
    {
        tracing::debug!(%origin, "outbox message applied before: a duplicate");
        return Err(Verdict::Duplicate { earlier: None });
    }
    let give_up = match (&state.seed, give_up) {
        (_, Some(reason)) => Some(reason.to_string()),
        (Loaded::Quarantined(q), None) => {
            return Err(Verdict::Failed(Failure::Quarantined(q.clone())));
        }
        (_, None) => None,
    };
    // A timer's command runs only while the entity has that timer armed: once (a repeat finds
    // it fired), and never after a cancel or a new set of the name.
    if let (Some(f), Loaded::Yes(seed)) = (firing, &state.seed)
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
        return Err(Verdict::Duplicate { earlier: None });
    }
    Ok(give_up)
}

/// The command decoded; a command given up on, or that does not decode, is dead-lettered.
async fn decode<E: Entity>(
    state: &mut EntityState<E>,
    seq: u64,
    deliveries: u64,
    payload: Bytes,
    give_up: Option<String>,
) -> Result<E::Command, Verdict> {
    let decoded = match give_up {
        Some(reason) => Err(reason),
        None => state
            .context
            .codec
            .decode::<E::Command>(&payload)
            .map_err(|e| format!("malformed: {e}")),
    };
    let reason = match decoded {
        Ok(command) => return Ok(command),
        Err(reason) => reason,
    };
    let id = state.id.as_str();
    let previous = match &state.seed {
        Loaded::Yes(seed) => seed.previous(),
        _ => None,
    };
    // Boxed, as `load`'s reads: a rare step kept out of every command's future.
    let written = Box::pin(
        state
            .context
            .journal
            .dead_letter(id, seq, deliveries, &reason, payload, previous),
    )
    .await;
    Err(match written {
        Ok(stored) => {
            if let Loaded::Yes(seed) = &mut state.seed {
                seed.wrote(Some(stored));
                seed.last_command_seq = seq;
                seed.last_outcome = Some(LastOutcome::DeadLettered(reason.as_str().into()));
            }
            if let Loaded::Quarantined(q) = &mut state.seed {
                q.last_command_seq = seq;
            }
            Verdict::DeadLettered(reason)
        }
        Err(e) => write_failed(e),
    })
}

/// The entity decides (under `catch_unwind`): its events and effects. A rejection ends the
/// command (the `fired` record of its timer is written first, so that the timer fires once).
#[allow(clippy::too_many_arguments)]
async fn decide<E: Entity>(
    context: &EntityContext,
    id: &EntityId,
    seed: &mut Seed<E>,
    seq: u64,
    command: E::Command,
    firing: Option<&Firing>,
    detail: Option<&mut Option<Detail>>,
    timer_reports: &mut Vec<TimerReport>,
) -> Result<(Vec<E::Event>, Effects), Verdict> {
    let codec = context.codec;
    let deciding = std::time::Instant::now();
    let mut effects = Effects::for_entity(codec, id.clone());
    let decided = catch_unwind(AssertUnwindSafe(|| {
        E::decide_with_effects(&seed.state, command, &mut effects)
    }));
    telemetry::record(&context.metrics.decide_seconds, deciding.elapsed());
    let decided = match decided {
        Ok(decided) => decided,
        Err(panic) => {
            return Err(Verdict::Failed(Failure::Crashed(format!(
                "decide panicked: {}",
                panic_message(&*panic)
            ))));
        }
    };
    let rejection = match decided {
        Ok(events) => return Ok((events, effects)),
        Err(rejection) => rejection,
    };
    let reason = rejection.to_string();
    if let Some(detail) = detail {
        *detail = codec.encode(&rejection).ok().map(Detail::Rejection);
    }
    if let Some(f) = firing {
        // The timer fired, though its command was refused: record it, so that it fires once.
        // Boxed, as `load`'s reads: a rare step kept out of every command's future.
        let written = Box::pin(context.journal.append(
            id,
            &context.names.event_subject(context.partition, id).into(),
            seq,
            Vec::new(),
            E::EVENT_VERSION,
            None,
            Attached {
                fired: Some(f),
                ..Attached::default()
            },
            seed.previous(),
        ))
        .await;
        match written {
            Ok(stored) => seed.wrote(stored),
            Err(e) => return Err(write_failed(e)),
        }
        seed.timers.remove(&f.name);
        timer_reports.push(TimerReport::Disarmed {
            name: f.name.clone(),
        });
    }
    seed.last_command_seq = seq;
    seed.last_outcome = Some(LastOutcome::Rejected(reason.as_str().into()));
    Err(Verdict::Rejected(reason))
}

/// What one fenced write stored: the journal sequence (if known), the outbox messages to
/// publish and the timer changes recorded.
struct Written {
    journal_seq: Option<u64>,
    outbox: Vec<OutboxMessage>,
    timer_changes: Vec<TimerChange>,
}

/// The events encoded (before any write: a failure to encode crashes the command).
fn encode<E: Entity>(context: &EntityContext, events: &[E::Event]) -> Result<Vec<Bytes>, Verdict> {
    let mut encoded = Vec::with_capacity(events.len());
    for event in events {
        // Cut from the thread's encoding buffer: no allocation of its own (`Codec::encode_bytes`).
        match context.codec.encode_bytes(event) {
            Ok(bytes) => encoded.push(bytes),
            Err(e) => return Err(Verdict::Failed(Failure::Crashed(e.to_string()))),
        }
    }
    Ok(encoded)
}

/// The outbox messages and timer changes of a command's effects, to be written with its events
/// (`encoded`, also the typed detail when a client waits).
fn effects_to_write(
    effects: Effects,
    encoded: &[Bytes],
    detail: Option<&mut Option<Detail>>,
) -> Result<(Vec<OutboxMessage>, Vec<TimerChange>), Verdict> {
    let (outbox, mut timer_changes) = match effects.into_parts() {
        Ok(parts) => parts,
        Err(e) => return Err(Verdict::Failed(Failure::Crashed(format!("effects: {e}")))),
    };
    if let Some(detail) = detail {
        *detail = Some(Detail::Events(encoded.iter().map(|e| e.to_vec()).collect()));
    }
    // The clock is read only for a command that changes timers (most do not).
    if !timer_changes.is_empty() {
        crate::data::timers::resolve(&mut timer_changes, std::time::SystemTime::now());
    }
    Ok((outbox, timer_changes))
}

/// The events are durable: the entity's timers and last outcome are updated and the events
/// applied (under `catch_unwind`: a panic quarantines the entity). The outbox to publish.
#[allow(clippy::too_many_arguments)]
fn apply<E: Entity>(
    state: &mut EntityState<E>,
    seq: u64,
    events: &[E::Event],
    firing: Option<&Firing>,
    origin: Option<Origin>,
    written: Written,
    quarantine: &mut Option<Quarantine>,
    timer_reports: &mut Vec<TimerReport>,
) -> Vec<OutboxMessage> {
    let Written {
        journal_seq,
        outbox,
        timer_changes,
    } = written;
    let count = events.len();
    let Loaded::Yes(seed) = &mut state.seed else {
        return outbox;
    };
    if let Some(f) = firing {
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
        events: u32::try_from(count).unwrap_or(u32::MAX),
    });
    // Remembered only when its first event carries it, so that a reload remembers the same.
    if let (Some(origin), true) = (origin, count > 0) {
        seed.origins.remember(origin);
    }
    // 0: a retried batch the server had stored already (its sequence unknown here); a
    // snapshot then covers less than it could, and loading re-reads a little more.
    if let Some(stored) = journal_seq.filter(|s| *s > 0) {
        seed.journal_seq = stored;
    }
    seed.wrote(journal_seq);
    seed.unsnapshotted = seed
        .unsnapshotted
        .saturating_add(u32::try_from(count).unwrap_or(u32::MAX));
    let applied = catch_unwind(AssertUnwindSafe(|| {
        for event in events {
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
    outbox
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_alloc::{SMALL_ALLOCATION, future_size};
    use crate::test_entity::Counter;

    /// The entity actor boxes every command's future: it must stay a small allocation
    /// ([`SMALL_ALLOCATION`]). Measured in the test build; before the publish was boxed apart,
    /// the test and release builds gave the same size (1,424 bytes).
    #[test]
    #[allow(unreachable_code, clippy::diverging_sub_expression)]
    fn a_command_future_is_a_small_allocation() {
        let make = || {
            process::<Counter>(
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
            )
        };
        let size = future_size(make);
        eprintln!("process future: {size} bytes");
        assert!(
            size <= SMALL_ALLOCATION,
            "a command's future is {size} bytes"
        );
        // What the actor boxes is that future in its tracing span.
        let boxed = future_size(|| tracing::Instrument::instrument(make(), tracing::Span::none()));
        eprintln!("boxed command future: {boxed} bytes");
        assert!(
            boxed <= SMALL_ALLOCATION,
            "a command's boxed future is {boxed} bytes"
        );
    }
}
