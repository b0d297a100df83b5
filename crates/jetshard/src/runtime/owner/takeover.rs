//! The actor's side of taking a partition: the claim and recovery ([`acquire`]), then a
//! fenced writer, the timer scan and outbox recovery started, the recovered commands routed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::time::Instant;

use super::dormant::Dormant;
use super::isolate::Isolation;
use super::phase::{Owning, Phase};
use super::slot::Slot;
use super::state::{OwnerMsg, OwnerState};
use super::{acquire, route, settle};
use crate::entity::{Entity, EntityId};
use crate::health::PartitionHealth;
use crate::journal::JournalWriter;
use crate::journal::fence::ClaimError;
use crate::journal::group_commit::{self, Mode};
use crate::retry::RestartWindow;
use crate::runtime::entity_actor::{EntityContext, Reporter, SnapshotPolicy};
use crate::runtime::pin::Delivery;
use crate::runtime::timer::Timers;
use crate::status::{OwnershipChange, OwnershipEvent};
use crate::telemetry::{self};
use crate::wire::Names;

impl<E: Entity> OwnerState<E> {
    /// Takes the partition under `pin`: a new generation, the state rebuilt, the previous
    /// owners' unacknowledged commands recovered in order. `first` is the delivery that showed
    /// the pin; none when the pull loop found deliveries lost at the tail under a pin it holds
    /// (nothing else will be delivered to show it).
    pub(super) async fn acquire(&mut self, pin: Arc<str>, first: Option<Delivery>) {
        let started = Instant::now();
        let partition = self.partition;
        let node = self.config().node_id.clone();
        let first_new = first
            .as_ref()
            .and_then(|f| (f.deliveries == 1).then_some(f.seq));
        self.shared
            .health
            .set(partition, PartitionHealth::Acquiring);
        let pull = &self.pull;
        let pinned = || !pull.lost(&pin);
        let acquired = acquire::claim(&self.shared, partition, &pin, &pinned, first_new).await;
        let acquired = match acquired {
            Ok(acquired) => acquired,
            // Another process is pinned now: nothing claimed, and its pin is not to be moved.
            Err(acquire::AcquireError::Claim(ClaimError::PinLost)) => {
                tracing::info!(partition, node = %node, "the pin moved on while taking the partition; not claimed");
                self.refuse(pin, false).await;
                return;
            }
            Err(e) => {
                self.counters.failed_acquisitions += 1;
                self.metrics.acquisition_failed.increment(1);
                tracing::error!(partition, node = %node, error = %e, "cannot take the partition; releasing the pin");
                self.refuse(pin, true).await;
                return;
            }
        };
        let fence = acquired.claimed.fence;
        let journal = JournalWriter::new(
            self.shared.js.clone(),
            self.shared.names.clone(),
            partition,
            fence,
            group_commit::Settings {
                mode: Mode::for_replicas(self.shared.config.replicas),
                stats: self.commits.clone(),
                metrics: self.metrics.commit.clone(),
                write_timeout: self.shared.config.write_timeout,
                leader_elections: self.shared.leader_elections(partition),
            },
        );
        let report: Reporter = {
            let owner = self.myself.clone();
            Arc::new(move |report| {
                // The owner is gone only when the partition is being dropped: nobody to tell.
                let _ = owner.cast(OwnerMsg::Entity(report));
            })
        };
        let context = Arc::new(EntityContext {
            partition,
            journal,
            journal_stream: self.shared.journal(partition).clone(),
            direct_reads: self.shared.config.replicas == 1,
            client: self.shared.client.clone(),
            names: self.shared.names.clone(),
            routes: self.shared.routes.clone(),
            codec: self.shared.config.codec,
            report,
            snapshots: SnapshotPolicy {
                every: self.shared.config.snapshot_every,
                on_passivation: self.shared.config.snapshot_on_passivation,
            },
            loads: Arc::clone(&self.shared.loads),
            batch_reads: Arc::clone(&self.shared.batch_reads),
            load_stats: Arc::clone(&self.load_stats),
            metrics: self.metrics.command.clone(),
            retired: std::sync::atomic::AtomicBool::new(false),
        });
        self.recover_outbox(context.journal.clone());
        // The states this owner kept when it stepped down, if its claim proves them still true.
        let (dormant, slots, doubted, warm_from) = match self
            .warm
            .take()
            .and_then(|warm| warm.reclaimed(fence.generation))
        {
            Some(mut kept) => {
                let slots = kept.returning_slots();
                (kept.dormant, slots, kept.doubted, Some(kept.from))
            }
            None => (
                Dormant::new(Arc::clone(&self.shared.dormant), self.shared.config.codec),
                Vec::new(),
                HashSet::new(),
                None,
            ),
        };
        let surrendering: HashSet<EntityId> = slots.iter().map(|(id, _)| id.clone()).collect();
        let entities: HashMap<EntityId, Slot, _> = slots.into_iter().collect();
        let kept_warm = dormant.len() + entities.len();
        let trial = acquired.claimed.trial;
        let isolation = trial.map(|_| {
            let held = acquired.recovered.iter().map(|(_, p)| p.seq);
            Isolation::new(held, Instant::now() + self.shared.config.ack_wait * 2)
        });
        let suspect = trial.and_then(|t| {
            let deliveries = acquired
                .recovered
                .iter()
                .find(|(_, p)| p.seq == t.seq)
                .map_or(0, |(_, p)| p.deliveries);
            settle::suspect(t.runs, deliveries, &self.policy).map(|reason| (t.seq, reason))
        });
        if let Some(t) = trial {
            tracing::warn!(
                partition,
                generation = fence.generation,
                first_in_hand = t.seq,
                runs = t.runs,
                suspect = suspect.is_some(),
                "commands were in hand at two takeovers in a row: running them one at a time"
            );
        }
        self.phase = Phase::Owning(Box::new(Owning {
            generation: fence.generation,
            pin,
            context,
            dormant,
            quarantined: HashMap::new(),
            doubted,
            warm_from,
            surrendering,
            entities,
            crashes: RestartWindow::new(
                self.shared.config.max_entity_restarts,
                self.shared.config.restart_window,
            ),
            held: acquired.claimed.held,
            isolation,
            suspect,
            batch_loads: HashMap::new(),
        }));
        self.timers = Timers::default();
        self.find_timers(partition, fence.generation);
        self.start_compaction(fence);
        self.counters.acquisitions += 1;
        self.metrics.acquired.increment(1);
        telemetry::record(&self.metrics.acquire_seconds, started.elapsed());
        self.post_load();
        tracing::info!(
            partition,
            generation = fence.generation,
            node = %node,
            // Nothing is replayed at acquisition any more (entities load on their first
            // command); the fields stay for the readers of this line (jetshard-bench).
            rebuilt_events = 0u64,
            recovered = acquired.recovered.len(),
            // Entity states kept from this owner's previous generation (`warm.rs`).
            kept_warm,
            replay_ms = 0u64,
            elapsed_ms = started.elapsed().as_millis() as u64,
            in_hand_us = acquired.steps.in_hand_us,
            window_us = acquired.steps.window_us,
            read_ahead_us = acquired.steps.read_ahead_us,
            claim_us = acquired.steps.claim_us,
            // The claim did not wait for the window (it could not isolate).
            claim_overlapped = acquired.steps.overlapped,
            // From the owner's start (its pull loop's first pull) to this acquisition's start.
            since_start_ms = started.duration_since(self.born).as_millis() as u64,
            "acquired partition"
        );
        let _ = self.shared.events.send(OwnershipEvent {
            partition,
            generation: fence.generation,
            node,
            change: OwnershipChange::Acquired,
        });

        if trial.is_some() {
            // In isolation, the commands earlier owners held run as the server delivers them
            // again, one at a time.
            if let Some(first) = first {
                self.deliver(first).await;
            }
            return;
        }
        // The previous owners' unacknowledged commands, and the first delivery, in stream order;
        // their entities load together (the burst's other deliveries are planned after).
        if let Phase::Owning(o) = &mut self.phase {
            let recovered = acquired.recovered.iter().map(|(entity, _)| entity.as_str());
            let first_named = first
                .as_ref()
                .filter(|f| !f.wake)
                .and_then(|f| Names::entity_of_subject(&f.subject));
            route::plan_batch_loads(o, recovered.chain(first_named));
        }
        let first_seq = first.as_ref().map(|f| f.seq);
        let mut first = first;
        for (entity, pending) in acquired.recovered {
            if let Some(f) = first.take_if(|f| f.seq <= pending.seq) {
                self.route_delivery(f, None).await;
            }
            if Some(pending.seq) != first_seq {
                self.route(&entity, pending);
            }
        }
        if let Some(f) = first {
            self.route_delivery(f, None).await;
        }
    }
}
