//! Periodic upkeep: timers found and fired, in-progress extension, retries, idle passivation,
//! the release deadline; and the end of the pull loop.

use std::time::Duration;

use async_nats::jetstream::message::AckKind;
use ractor::ActorProcessingErr;
use tokio::time::Instant;

use super::ack::{acknowledge, unpin};
use super::phase::Phase;
use super::route;
use super::settle::{SettleStep, Settled, StepDown};
use super::slot::Blocked;
use super::state::{OwnerMsg, OwnerState};
use crate::entity::Entity;
use crate::journal::fence::Fence;
use crate::runtime::compaction::Sweeper;
use crate::runtime::entity_actor::EntityReport;
use crate::runtime::timer::{self};

impl<E: Entity> OwnerState<E> {
    /// Publishes again the partition's outbox messages whose commands have no done record
    /// (`outbox::recover`, with `writer`: the generation owned now), in place of a recovery
    /// already running, which may have read the outbox before the latest of them were written.
    /// On acquisition, and whenever a command's messages were not all published.
    pub(super) fn recover_outbox(&mut self, writer: crate::journal::JournalWriter) {
        let recovery = tokio::spawn(crate::runtime::outbox::recover(
            self.shared.js.clone(),
            self.shared.journal(self.partition).clone(),
            self.shared.names.clone(),
            self.shared.routes.clone(),
            self.partition,
            writer,
        ));
        if let Some(previous) = self.outbox_recovery.replace(recovery) {
            previous.abort();
        }
    }

    /// [`recover_outbox`](Self::recover_outbox) for the generation owned now, if it is
    /// `generation`: a command's messages were not all published, or writes answered "not
    /// confirmed" landed with theirs (`outbox_in_doubt`).
    pub(super) fn recover_outbox_of(&mut self, generation: u64) {
        let writer = self
            .phase
            .owning_ref()
            .filter(|o| o.generation == generation)
            .map(|o| o.context.journal.clone());
        if let Some(writer) = writer {
            self.recover_outbox(writer);
        }
    }

    /// Reads the partition's armed timers from the journal in a task of its own (entities load
    /// lazily: the owner cannot learn them from loaded states), retried until it succeeds or
    /// the partition is acquired again or dropped; the owner arms them when they come back.
    pub(super) fn find_timers(&mut self, partition: u32, generation: u64) {
        let (journal, names) = (
            self.shared.journal(partition).clone(),
            self.shared.names.clone(),
        );
        let owner = self.myself.clone();
        let scan = tokio::spawn(async move {
            let mut backoff = Duration::from_millis(200);
            loop {
                match timer::armed_in_partition(&journal, &names, partition).await {
                    Ok(found) => {
                        let _ = owner.cast(OwnerMsg::TimersFound { generation, found });
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(partition, error = %e, "armed timers not read; trying again");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                    }
                }
            }
        });
        if let Some(previous) = self.timer_scan.replace(scan) {
            previous.abort();
        }
    }

    /// Starts the background compaction of the partition under `fence` (if configured), in a
    /// task of its own: it holds nothing a command waits on (`runtime/compaction.rs`).
    pub(super) fn start_compaction(&mut self, fence: Fence) {
        self.stop_compaction();
        let config = &self.shared.config;
        let Some(interval) = config.compaction_interval else {
            return;
        };
        let sweeper = Sweeper {
            journal: self.shared.journal(self.partition).clone(),
            commands: self.shared.commands(self.partition).clone(),
            names: self.shared.names.clone(),
            partition: self.partition,
            fence,
            interval,
            budget: config.compaction_budget,
            dead_letter_retention: config.dead_letter_retention,
        };
        let (owner, generation) = (self.myself.clone(), fence.generation);
        self.compaction = Some(tokio::spawn(async move {
            sweeper.run().await;
            // It ends only once a newer generation claimed the partition: on an idle partition
            // the sweep may be the first to see it.
            let _ = owner.cast(OwnerMsg::Entity(EntityReport::Superseded { generation }));
        }));
    }

    /// Stops the background compaction (this owner no longer holds the partition).
    pub(super) fn stop_compaction(&mut self) {
        if let Some(compaction) = self.compaction.take() {
            compaction.abort();
        }
    }

    /// Publishes the commands of the partition's due timers (their entities decide whether they
    /// still hold: `timer.rs`).
    pub(super) async fn fire_timers(&mut self) {
        if self.phase.owning_ref().is_none() {
            return;
        }
        let now_ms = crate::data::timers::unix_ms(std::time::SystemTime::now());
        for (entity, name, armed) in self.timers.due(now_ms, Instant::now()) {
            tracing::debug!(partition = self.partition, %entity, timer = %name, set_seq = armed.set_seq, "timer due");
            timer::fire(&self.shared.js, &self.shared.names, &entity, &name, &armed).await;
        }
    }

    pub(super) async fn on_tick(&mut self) {
        let config = self.shared.config.clone();
        let now = Instant::now();
        match &mut self.phase {
            Phase::CoolingDown(until) if now >= *until => {
                self.phase = Phase::Standby;
                self.holding = self.hold_back;
                self.pull.pause(self.holding);
            }
            Phase::Releasing(release, _) if now >= release.deadline => {
                tracing::warn!(
                    partition = self.partition,
                    "release deadline passed with commands in flight; they will be redelivered"
                );
                self.finish_release().await;
                return;
            }
            Phase::Refused(refused) if refused.wants_unpin(config.pin_ttl) => {
                tracing::warn!(
                    partition = self.partition,
                    "still pinned under a pin this process stepped down from; releasing it"
                );
                refused.unpinned = unpin(&self.shared, self.partition).await;
            }
            _ => {}
        }
        if self.warm.as_ref().is_some_and(|warm| warm.expired()) {
            tracing::debug!(
                partition = self.partition,
                "states kept for a re-claim dropped: no claim came"
            );
            self.warm = None;
        }
        if let Some(generation) = self.outbox_in_doubt.take() {
            self.recover_outbox_of(generation);
        }
        self.step_isolation().await;
        let in_hand = self.post_load();
        self.count_pending(in_hand);
        self.fire_timers().await;
        let partition = self.partition;
        let Some(o) = self.phase.owning() else { return };
        let mut progress = Vec::new();
        let mut idle = Vec::new();
        let mut stuck = Vec::new();
        let mut due = Vec::new();
        for (entity, slot) in &mut o.entities {
            for pending in &mut slot.queue {
                if let Some(reply) = &pending.reply
                    && now.duration_since(pending.progress_at) >= config.ack_wait / 2
                {
                    // Still in hand (waiting its turn, or slow): not to be redelivered yet.
                    pending.progress_at = now;
                    progress.push(reply.clone());
                }
            }
            match slot.blocked {
                Some(Blocked::Redelivery { seq, since })
                    if now.duration_since(since) > config.ack_wait * 2 + Duration::from_secs(1) =>
                {
                    stuck.push((entity.clone(), seq));
                }
                Some(Blocked::Retry { at }) if now >= at => due.push(entity.clone()),
                // Commands in hand, nothing awaited, and no actor: its start failed (`route::
                // spawn`); started again here rather than left until the entity's next command.
                None if slot.actor.is_none()
                    && slot.returning.is_none()
                    && !slot.queue.is_empty() =>
                {
                    due.push(entity.clone());
                }
                _ => {}
            }
            if slot.is_idle() && now.duration_since(slot.last_active) >= config.passivate_after {
                idle.push(entity.clone());
            }
        }
        for entity in idle {
            route::passivate(o, &entity);
        }
        for reply in progress {
            acknowledge(
                &self.shared.client,
                self.partition,
                reply,
                AckKind::Progress,
            )
            .await;
        }
        for entity in due {
            if let Some(slot) = self
                .phase
                .owning()
                .and_then(|o| o.entities.get_mut(&entity))
            {
                slot.blocked = None;
            }
            self.dispatch(&entity);
        }
        for (entity, seq) in stuck {
            // The failed command was never delivered again: give it up so the entity can go on.
            tracing::warn!(partition, %entity, cmd_seq = seq, "a failed command was not redelivered; giving it up");
            let give_up = SettleStep::GiveUp {
                reason: "failed, and not redelivered".to_owned(),
            };
            let _ = self
                .carry_out(&entity, seq, Settled::one(give_up), None)
                .await;
        }
    }

    /// The pull loop ended: nothing more will be delivered to this owner. It stops owning, and
    /// fails, so that its supervisor (the shard system) starts a new owner with a new loop, or
    /// escalates if that keeps happening.
    pub(super) async fn on_pull_loop_ended(
        &mut self,
        reason: String,
    ) -> Result<(), ActorProcessingErr> {
        if let Phase::Releasing(release, _) = &mut self.phase {
            release.pulls_idle = true;
            self.finish_release_if_drained().await;
            if !matches!(self.phase, Phase::Releasing(..)) {
                return Ok(());
            }
        }
        self.step_down(StepDown::PullLoopEnded).await;
        Err(format!(
            "partition {}: the pull loop ended: {reason}",
            self.partition
        )
        .into())
    }
}
