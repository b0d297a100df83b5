//! One command, start to finish: decide, write the events (and outbox and timer records) as one
//! fenced unit, apply, publish the outbox, report.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::load::{Revival, revive};
use super::outcome_header::LastOutcome;
use super::protocol::{Failure, Quarantine, Verdict, Work, panic_message};
use super::state::{EntityState, Loaded};
use crate::data::Effects;
use crate::data::timers::{Armed, TimerChange, TimerReport};
use crate::entity::Entity;
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

pub(super) async fn process<E: Entity>(
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
