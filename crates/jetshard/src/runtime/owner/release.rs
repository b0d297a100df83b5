//! Leaving a partition: a graceful release or hand-off (drain, snapshot, unpin), a step-down
//! when fenced or failing, a standby holding back or declining a pin.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::message::AckKind;
use ractor::RpcReplyPort;
use tokio::time::Instant;

use super::ack::{acknowledge, unpin};
use super::phase::{Owning, Phase, Refused, Release};
use super::route;
use super::settle::StepDown;
use super::state::OwnerState;
use super::warm::Warm;
use crate::entity::Entity;
use crate::runtime::pin::{self, Delivery};
use crate::status::{OwnershipChange, OwnershipEvent};

impl<E: Entity> OwnerState<E> {
    /// Begins handing the partition over: no new pulls, commands in hand finished and
    /// acknowledged, new deliveries sent back. `reply`: a graceful stop (the owner stops after);
    /// none: a hand-off (the owner cools down, then pulls again).
    pub(super) async fn start_release(&mut self, reply: Option<RpcReplyPort<()>>) {
        self.pull.pause(true);
        let deadline = Instant::now() + self.shared.config.ack_wait;
        match &mut self.phase {
            Phase::Releasing(release, _) => {
                // A stop during a hand-off: the stop wins.
                if reply.is_some() {
                    release.reply = reply;
                }
            }
            _ => {
                let owning = self.phase.take_owning();
                let release = Release {
                    reply,
                    deadline,
                    pulls_idle: false,
                };
                self.phase = Phase::Releasing(release, owning);
            }
        }
        self.finish_release_if_drained().await;
    }

    pub(super) async fn finish_release_if_drained(&mut self) {
        let snapshots = self.snapshots_on_release();
        // Unpinning while a pull of ours without the pin id is still open could pin this
        // process again: wait for the pull loop to be idle (the pulls carrying the pin id are
        // ended by the unpin) as well as for the commands in hand, and, with snapshots, for
        // every entity's snapshot (`route::hand_over`).
        let done = match &mut self.phase {
            Phase::Releasing(release, owning) => {
                let drained = owning
                    .as_deref_mut()
                    .is_none_or(|o| route::hand_over(o, snapshots));
                release.pulls_idle && drained
            }
            _ => false,
        };
        if done {
            Box::pin(self.finish_release()).await;
        }
    }

    /// A standby pulls unless the balancing says this process holds back (then it pauses its
    /// pulls until told otherwise). Nothing else pauses a standby's pulls.
    pub(super) fn hold_standby(&mut self) {
        if matches!(self.phase, Phase::Standby) && self.holding != self.hold_back {
            self.holding = self.hold_back;
            self.pull.pause(self.holding);
        }
    }

    /// Gives back a pin this standby got while holding back, or while its process is leaving
    /// (from a pull it sent before): the delivery goes back to the server, and the pin to
    /// another process, at once. Cheaper than taking the partition only to hand it off again.
    pub(super) async fn decline(&mut self, delivery: Delivery) {
        let nak = AckKind::Nak(Some(Duration::from_millis(100)));
        acknowledge(&self.shared.client, self.partition, delivery.reply, nak).await;
        if self.declined.as_ref() == Some(&delivery.pin) {
            return;
        }
        tracing::debug!(
            partition = self.partition,
            "pinned while holding back or leaving; giving the pin back"
        );
        self.pull.forget_pin(delivery.pin.clone());
        self.declined = Some(delivery.pin);
        unpin(&self.shared, self.partition).await;
    }

    /// Whether a release passivates every entity first, so that each writes a snapshot of
    /// what it wrote since its last one: the next owner then loads it with one read instead of
    /// its records since that snapshot, while its commands wait.
    pub(super) fn snapshots_on_release(&self) -> bool {
        E::snapshots().is_some() && self.shared.config.snapshot_on_passivation
    }

    pub(super) async fn finish_release(&mut self) {
        self.stop_compaction();
        let owned = self.phase.owning_ref().is_some();
        let handing_off =
            matches!(&self.phase, Phase::Releasing(release, _) if release.reply.is_none());
        if owned {
            unpin(&self.shared, self.partition).await;
            if handing_off || !self.timers.is_empty() {
                // A partition is owned only while it has a command to deliver: a partition
                // handed off with none would stay unowned (no queries answered, no timers
                // fired), and armed timers must not wait for the partition's next command. A
                // stopping process's idle partitions are woken by the others' crash watches
                // once it is gone.
                // Tried once here (a stopping owner is gone next), then, if that failed (a
                // clustered stream electing its leader), offered beside the owner for up to the
                // publish patience.
                let (js, names) = (&self.shared.js, &self.shared.names);
                let (partition, partitions) = (self.partition, self.shared.config.partitions);
                if let Err(e) = pin::try_wake(js, names, partition, partitions).await {
                    tracing::debug!(partition, error = %e, "wake-up not stored; offered again");
                    self.wake_beside();
                }
            }
        }
        let Phase::Releasing(release, owning) = std::mem::replace(&mut self.phase, Phase::Standby)
        else {
            return;
        };
        let stopping = release.reply.is_some();
        // The release began one ack wait before its deadline.
        let took = self
            .shared
            .config
            .ack_wait
            .saturating_sub(release.deadline.saturating_duration_since(Instant::now()));
        tracing::debug!(
            partition = self.partition,
            owned,
            took_ms = took.as_millis() as u64,
            "released"
        );
        self.handed_off = owning.as_ref().map(|o| o.generation);
        if let Some(o) = owning {
            let reason = if stopping {
                StepDown::Released
            } else {
                StepDown::HandedOff
            };
            self.left(&o, reason);
            self.myself.stop_children(Some(reason.to_string()));
        }
        match release.reply {
            Some(reply) => {
                let _ = reply.send(());
                self.myself.stop(Some("released".to_owned()));
            }
            None => {
                self.phase = Phase::CoolingDown(Instant::now() + self.shared.config.pin_ttl * 2);
            }
        }
    }

    /// Steps down if this owner holds the partition under `pin`.
    pub(super) async fn step_down_under(&mut self, pin: &Arc<str>, reason: StepDown) {
        if self.phase.owning_ref().is_some_and(|o| o.pin == *pin) {
            self.step_down(reason).await;
        }
    }

    /// Stops owning: nothing acknowledged any more under this generation; commands in hand stay
    /// unacknowledged for the next owner. The entity actors stop; for a reason that may bring
    /// the partition straight back to this process (`StepDown::keeps_warm`), they hand their
    /// states back first, kept for a claim of the next generation (`warm.rs`).
    pub(super) async fn step_down(&mut self, reason: StepDown) {
        let releasing = matches!(self.phase, Phase::Releasing(..));
        let Some(o) = self.phase.take_owning() else {
            return;
        };
        self.stop_compaction();
        self.left(&o, reason);
        let pin = o.pin.clone();
        if !releasing && reason.keeps_warm() {
            self.warm = Some(Box::new(Warm::keep(o)));
        } else {
            self.myself.stop_children(Some(reason.to_string()));
        }
        if releasing {
            // The release goes on (pulls paused); there is nothing left to drain.
            self.finish_release_if_drained().await;
            return;
        }
        if reason.refuses_pin() {
            self.refuse(pin, reason == StepDown::CrashLoop).await;
        } else {
            self.phase = Phase::Standby;
        }
    }

    /// Offers the partition a wake-up (`pin::wake`) beside the owner, replacing one offered
    /// before.
    pub(super) fn wake_beside(&mut self) {
        let (js, names) = (self.shared.js.clone(), self.shared.names.clone());
        let (partition, partitions) = (self.partition, self.shared.config.partitions);
        let waking = tokio::spawn(async move {
            pin::wake(&js, &names, partition, partitions).await;
        });
        if let Some(earlier) = self.waking.replace(waking) {
            earlier.abort();
        }
    }

    /// Says that this owner left generation `o` (its caller stops the entity actors, or asks
    /// them for their states).
    pub(super) fn left(&self, o: &Owning<E>, reason: StepDown) {
        self.metrics.step_down(reason.label());
        self.metrics.set_load(None);
        let node = self.config().node_id.clone();
        tracing::info!(partition = self.partition, generation = o.generation, node = %node, %reason, "stepped down");
        let _ = self.shared.events.send(OwnershipEvent {
            partition: self.partition,
            generation: o.generation,
            node,
            change: OwnershipChange::Released {
                reason: reason.to_string(),
            },
        });
    }

    /// Refuses `pin`: the pull loop forgets it, so the server moves it after its TTL whatever
    /// else happens; with `unpin_now`, it is asked to move it at once.
    pub(super) async fn refuse(&mut self, pin: Arc<str>, unpin_now: bool) {
        self.pull.forget_pin(pin.clone());
        let mut refused = Refused::new(pin);
        if unpin_now {
            refused.unpinned = unpin(&self.shared, self.partition).await;
        }
        self.phase = Phase::Refused(refused);
    }
}
