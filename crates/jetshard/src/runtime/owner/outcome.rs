//! An entity's outcome accounted for: the steps [`settle`] decides, carried out (ack, nak,
//! terminate, dead-letter, retry, step down), and replies.

use async_nats::jetstream::message::AckKind;
use ractor::ActorProcessingErr;
use tokio::time::Instant;

use super::ack::{acknowledge, acknowledge_confirmed, respond};
use super::settle;
use super::settle::{Head, SettleStep, Settled, StepDown};
use super::slot::{Blocked, Pending};
use super::state::OwnerState;
use crate::data::CommandOutcome;
use crate::entity::{Entity, EntityId};
use crate::reply::Detail;
use crate::runtime::entity_actor::CommandReport;
use crate::wire::ack_subject;

impl<E: Entity> OwnerState<E> {
    pub(super) async fn on_outcome(
        &mut self,
        mut outcome: CommandReport,
    ) -> Result<(), ActorProcessingErr> {
        let partition = self.partition;
        let policy = self.policy;
        let Some(o) = self.phase.owning() else {
            if let Some(warm) = &mut self.warm {
                warm.outcome(&outcome);
            }
            return Ok(());
        };
        if outcome.generation != o.generation {
            // An actor of the generation before, after a warm re-claim, that stopped on a
            // command: it hands no state back, and its entity loads.
            if Some(outcome.generation) == o.warm_from && super::warm::stops(&outcome) {
                o.doubted.insert(outcome.entity.clone());
                o.surrendering.remove(&outcome.entity);
                if let Some(slot) = o.entities.get_mut(&outcome.entity)
                    && slot.returning.take().is_some()
                {
                    if slot.is_idle() {
                        o.entities.remove(&outcome.entity);
                    } else {
                        self.dispatch(&outcome.entity);
                    }
                }
            }
            return Ok(());
        }
        self.timers
            .report(&outcome.entity, std::mem::take(&mut outcome.timers));
        let stopped = super::warm::stops(&outcome);
        let Some(o) = self.phase.owning() else {
            return Ok(());
        };
        let entity = outcome.entity;
        let Some(slot) = o.entities.get_mut(&entity) else {
            return Ok(());
        };
        let Some(head) = slot.queue.iter().find(|p| p.seq == outcome.seq) else {
            return Ok(());
        };
        slot.last_active = Instant::now();
        let head = Head {
            seq: head.seq,
            deliveries: head.deliveries,
            attempts: head.attempts,
            delivered: head.reply.is_some(),
        };
        // A command retried after a write answered "not confirmed" that comes back a duplicate:
        // that write landed, and its outbox went unpublished (the entity knew only that it
        // failed). The outbox is read again (`on_tick`); the command's timers its next load
        // reported.
        if head.attempts > 0
            && matches!(
                outcome.verdict,
                crate::runtime::entity_actor::Verdict::Duplicate { .. }
            )
        {
            self.outbox_in_doubt = Some(o.generation);
        }
        if stopped {
            // The actor has stopped, and its state with it: its next actor loads the entity.
            slot.actor = None;
            o.doubted.insert(entity.clone());
        }
        match &outcome.verdict {
            crate::runtime::entity_actor::Verdict::Applied { events } => {
                self.counters.applied += 1;
                self.counters.events_written += *events as u64;
                self.metrics.applied.increment(1);
                self.metrics.events_written.increment(*events as u64);
            }
            crate::runtime::entity_actor::Verdict::Duplicate { .. } => {
                self.counters.duplicates += 1;
                self.metrics.duplicate.increment(1);
            }
            crate::runtime::entity_actor::Verdict::Rejected(reason) => {
                self.counters.rejected += 1;
                self.metrics.rejected.increment(1);
                tracing::debug!(partition, %entity, cmd_seq = outcome.seq, %reason, "command rejected");
            }
            crate::runtime::entity_actor::Verdict::DeadLettered(reason) => {
                self.counters.dead_lettered += 1;
                self.metrics.dead_lettered.increment(1);
                tracing::warn!(partition, %entity, cmd_seq = outcome.seq, %reason, "command dead-lettered and terminated");
            }
            crate::runtime::entity_actor::Verdict::Failed(failure) => {
                if matches!(
                    failure,
                    crate::runtime::entity_actor::Failure::Unconfirmed(_)
                ) {
                    self.counters.unconfirmed_writes += 1;
                    self.metrics.unconfirmed_writes.increment(1);
                }
                tracing::warn!(partition, %entity, cmd_seq = outcome.seq, deliveries = head.deliveries, ?failure, "command failed");
            }
            crate::runtime::entity_actor::Verdict::Fenced => {}
        }
        let mut steps = settle::settle(&head, outcome.verdict, &policy, Instant::now());
        if let Some(q) = outcome.quarantine {
            steps = Settled::after(SettleStep::Quarantine(q), steps);
        }
        self.carry_out(&entity, outcome.seq, steps, outcome.detail)
            .await?;
        // The actor stopped: commands queued behind the settled one (cast to it while it was
        // stopping) go to a new actor, unless the entity waits.
        // Looked up only then: a settled command of a running actor (most) costs no lookup.
        if stopped
            && self
                .phase
                .owning()
                .and_then(|o| o.entities.get(&entity))
                .is_some_and(|slot| slot.actor.is_none())
        {
            self.dispatch(&entity);
        }
        Ok(())
    }

    /// Carries out what [`settle::settle`] decided for command `seq` of `entity`.
    pub(super) async fn carry_out(
        &mut self,
        entity: &EntityId,
        seq: u64,
        mut steps: Settled,
        detail: Option<Detail>,
    ) -> Result<(), ActorProcessingErr> {
        let partition = self.partition;
        while let Some(step) = steps.take_next() {
            let Some(o) = self.phase.owning() else {
                break;
            };
            let Some(slot) = o.entities.get_mut(entity) else {
                break;
            };
            let position = slot.queue.iter().position(|p| p.seq == seq);
            match step {
                SettleStep::Finish { terminate, answer } => {
                    // Only what the answers need is kept across their awaits (the rest of the
                    // command is dropped here): the smaller the owner's `handle` future, the
                    // cheaper ractor's two moves of it per message.
                    let Some(Pending {
                        reply,
                        respond_to,
                        trace,
                        ..
                    }) = position.and_then(|at| slot.queue.remove(at))
                    else {
                        continue;
                    };
                    // A command recovered from the stream (its delivery was the previous
                    // owner's, or went back to the server) is acknowledged by its stream
                    // sequence, all the server reads of an explicit acknowledgement: its
                    // place under the consumer's `max_ack_pending` is free at once, not one
                    // ack wait later when it comes back to be found done.
                    let reply = reply.unwrap_or_else(|| {
                        let names = &self.shared.names;
                        let consumer = names.consumer(partition);
                        ack_subject(names.command_stream(partition), &consumer, seq).into()
                    });
                    tracing::trace!(target: crate::telemetry::STAGE_TARGET, seq, "acking");
                    let kind = if terminate {
                        AckKind::Term
                    } else {
                        AckKind::Ack
                    };
                    if o.isolation.is_some() {
                        // The next command runs only once this one is surely off the
                        // consumer's books: the next claim must find the one running first.
                        let timeout = self.shared.config.write_timeout;
                        Box::pin(acknowledge_confirmed(
                            &self.shared.client,
                            partition,
                            reply,
                            kind,
                            timeout,
                        ))
                        .await;
                    } else {
                        acknowledge(&self.shared.client, partition, reply, kind).await;
                    }
                    if let Some(to) = respond_to {
                        let trace = trace.map(|t| t.span);
                        // Boxed apart (one small allocation, beside the reply's own): inline,
                        // it set the size of the owner's `handle` future, which ractor moves
                        // twice per message, replied to or not.
                        let client = &self.shared.client;
                        Box::pin(respond(client, to, answer, detail.as_ref(), trace)).await;
                    }
                }
                SettleStep::GiveUp { reason } => {
                    if let Some(pending) = position.and_then(|at| slot.queue.get_mut(at)) {
                        pending.give_up = Some(reason.into());
                    }
                    slot.blocked = None;
                    self.dispatch(entity);
                }
                SettleStep::RetryAt(at) => {
                    if let Some(pending) = position.and_then(|at| slot.queue.get_mut(at)) {
                        pending.attempts += 1;
                    }
                    slot.blocked = Some(Blocked::Retry { at });
                }
                SettleStep::Nak(delay) => {
                    let reply = position
                        .and_then(|at| slot.queue.get_mut(at))
                        .and_then(|p| p.reply.take());
                    slot.blocked = Some(Blocked::Redelivery {
                        seq,
                        since: Instant::now(),
                    });
                    if let Some(reply) = reply {
                        acknowledge(
                            &self.shared.client,
                            self.partition,
                            reply,
                            AckKind::Nak(Some(delay)),
                        )
                        .await;
                    }
                }
                SettleStep::AwaitRedelivery => {
                    slot.blocked = Some(Blocked::Redelivery {
                        seq,
                        since: Instant::now(),
                    });
                }
                SettleStep::CountCrash => {
                    if o.crashes.exceeded(Instant::now()) {
                        let (generation, crashes) = (o.generation, o.crashes.count());
                        // Give the partition up at once: another process may fare better.
                        Box::pin(self.step_down(StepDown::CrashLoop)).await;
                        return Err(format!("partition {partition} generation {generation}: {crashes} entity crashes within the restart window").into());
                    }
                }
                SettleStep::Quarantine(quarantine) => {
                    tracing::error!(partition, %entity, journal_seq = quarantine.journal_seq, reason = %quarantine.reason, "entity quarantined");
                    o.dormant.forget(entity.as_str());
                    o.quarantined.insert(entity.clone(), quarantine);
                }
                SettleStep::StepDown(reason) => Box::pin(self.step_down(reason)).await,
            }
        }
        // Isolation is rare: its steps are boxed apart (this future is moved twice per message
        // at its largest path's size); without it they do nothing.
        if self
            .phase
            .owning_ref()
            .is_some_and(|o| o.isolation.is_some())
        {
            Box::pin(self.step_isolation()).await;
        }
        self.finish_release_if_drained().await;
        Ok(())
    }

    /// Gives up a command that belongs to no entity (its subject holds no valid id): a
    /// dead-letter record, then terminated. If the record cannot be written now, the command
    /// goes back to the server to be delivered again.
    pub(super) async fn give_up_without_entity(
        &mut self,
        named: &str,
        pending: Pending,
        reason: String,
    ) {
        let Some(o) = self.phase.owning() else { return };
        let journal = o.context.journal.clone();
        let written = journal
            .dead_letter(
                named,
                pending.seq,
                pending.deliveries,
                &reason,
                pending.payload.clone(),
                // Not an entity's subject: `named` is no valid id, or not one of this partition.
                None,
            )
            .await;
        match written {
            Ok(_) => {
                self.counters.dead_lettered += 1;
                self.metrics.dead_lettered.increment(1);
                if let Some(reply) = pending.reply {
                    acknowledge(&self.shared.client, self.partition, reply, AckKind::Term).await;
                }
                if let Some(to) = pending.respond_to {
                    let answer = CommandOutcome::DeadLettered {
                        command_seq: pending.seq,
                        reason,
                    };
                    let trace = pending.trace.as_ref().map(|t| t.span);
                    respond(&self.shared.client, to, answer, None, trace).await;
                }
            }
            Err(crate::journal::WriteError::Fenced { .. }) => {
                self.step_down(StepDown::Fenced).await;
            }
            Err(e) => {
                tracing::warn!(partition = self.partition, cmd_seq = pending.seq, error = %e, "dead-letter record not written; the command goes back to the server");
                if let Some(reply) = pending.reply {
                    let nak = AckKind::Nak(Some(self.policy.retry_delay));
                    acknowledge(&self.shared.client, self.partition, reply, nak).await;
                }
            }
        }
    }
}
