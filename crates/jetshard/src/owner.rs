//! The shard-owner actor of one partition in one process.
//!
//! Every process runs one owner per partition. All of them pull; the server pins one, and that
//! one owns the partition:
//!
//! ```text
//!            first delivery under a new pin
//! Standby ─────────────────────────────────▶ Acquiring: claim generation g+1 (fence CAS),
//!    ▲                                        rebuild from the journal, recover the in-flight
//!    │                                        window of the previous owner
//!    │ pin lost (423) · write fenced (10071)          │
//!    │ pin moved · released · acquisition failed      ▼
//!    └───────────────────────────────────────── Owning: route commands to entity actors,
//!                                               ack each once its events are durable
//! ```
//!
//! Architecture Invariant: a partition's state lives in exactly one owner actor (and its entity
//! actors); the owner is the only place that acknowledges, naks or terminates its commands, and
//! it does so only while owning under the generation the outcome was produced with.

use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::Context;
use async_nats::jetstream::message::AckKind;
use async_nats::jetstream::stream::Stream;
use async_nats::{Client, Subject};
use bytes::Bytes;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::command::CommandOutcome;
use crate::config::ShardConfig;
use crate::entity::{Entity, EntityId};
use crate::entity_actor::{
    EntityActor, EntityContext, EntityMsg, Outcome, Passivated, Seed, Verdict, Work, apply_replayed,
};
use crate::fence;
use crate::journal::{self, JournalWriter};
use crate::pin::{self, Delivery, PinSignal, PullLoop, PullSettings};
use crate::status::{OwnershipChange, OwnershipEvent, PartitionStatus};
use crate::wire::{Names, PRIORITY_GROUP};

/// What one entity type's owners share.
pub(crate) struct Shared {
    pub(crate) js: Context,
    pub(crate) client: Client,
    pub(crate) names: Arc<Names>,
    pub(crate) config: ShardConfig,
    pub(crate) command_stream: Stream<()>,
    pub(crate) journal_stream: Stream<()>,
    pub(crate) events: broadcast::Sender<OwnershipEvent>,
    /// Live entity actors over all partitions of this system (for the resident cap).
    pub(crate) resident: Arc<AtomicUsize>,
}

/// A live entity actor, counted in [`Shared::resident`] while it is held.
struct Resident {
    actor: ActorRef<EntityMsg>,
    count: Arc<AtomicUsize>,
}

impl Resident {
    fn new(actor: ActorRef<EntityMsg>, count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self {
            actor,
            count: Arc::clone(count),
        }
    }
}

impl Drop for Resident {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The owner's messages.
pub(crate) enum OwnerMsg {
    /// From the pull loop.
    Pin(PinSignal),
    /// From an entity actor.
    Outcome(Outcome),
    /// From a passivated entity actor: its state, for the dormant map.
    Passivated(Passivated),
    /// Periodic upkeep: in-progress extension, passivation, stuck retries, release deadline.
    Tick,
    /// Graceful stop: finish in-flight commands, release the pin, reply, stop.
    Release(RpcReplyPort<()>),
    /// Balancing: hand the partition to another process (as a graceful stop does), then stay
    /// out of it for a while before pulling again.
    HandOff,
    /// A snapshot for status displays.
    Status(RpcReplyPort<PartitionStatus>),
}

pub(crate) struct OwnerArgs {
    pub(crate) shared: Arc<Shared>,
    pub(crate) partition: u32,
}

pub(crate) struct OwnerActor<E>(PhantomData<fn() -> E>);

impl<E> OwnerActor<E> {
    pub(crate) fn new() -> Self {
        Self(PhantomData)
    }
}

pub(crate) struct OwnerState<E: Entity> {
    partition: u32,
    shared: Arc<Shared>,
    pull: Option<PullLoop>,
    ticker: JoinHandle<()>,
    /// A pin under which this owner must not acquire (it was fenced or failed under it).
    refused_pin: Option<Refused>,
    role: Role<E>,
    release: Option<Release>,
    /// After a hand-off: no pulling until then, so the partition goes to another process.
    cooldown_until: Option<Instant>,
    counters: Counters,
}

/// A hand-over in progress.
struct Release {
    /// `Some` for a graceful stop; `None` for a hand-off.
    reply: Option<RpcReplyPort<()>>,
    /// Past it, commands still in hand are left for redelivery.
    deadline: Instant,
    /// Whether the pull loop has no request open any more.
    pulls_idle: bool,
}

/// A pin under which this owner must not acquire again: it stepped down or failed under it.
struct Refused {
    pin: Arc<str>,
    since: Instant,
    /// When a delivery under this pin last came in.
    last_delivery: Option<Instant>,
    /// Whether the pin has been released at the server.
    unpinned: bool,
}

impl Refused {
    fn new(pin: Arc<str>, unpinned: bool) -> Self {
        Self {
            pin,
            since: Instant::now(),
            last_delivery: None,
            unpinned,
        }
    }

    /// Deliveries still arrive under the refused pin long after the refusal: the server still
    /// pins this process (it was fenced by a claimant that is not pinned), so the partition
    /// would stall. Release the pin.
    fn still_pinned(&self, pin_ttl: Duration) -> bool {
        !self.unpinned
            && self.since.elapsed() > pin_ttl * 2
            && self.last_delivery.is_some_and(|at| at.elapsed() < pin_ttl)
    }
}

impl<E: Entity> Drop for OwnerState<E> {
    fn drop(&mut self) {
        self.ticker.abort();
    }
}

#[derive(Default, Clone, Copy)]
struct Counters {
    applied: u64,
    events_written: u64,
    rejected: u64,
    duplicates: u64,
    dead_lettered: u64,
    acquisitions: u64,
}

enum Role<E: Entity> {
    Standby,
    Owning(Box<Owning<E>>),
}

struct Owning<E: Entity> {
    generation: u64,
    pin: Arc<str>,
    /// The fenced journal writer and the rest of what this generation's entity actors share.
    context: Arc<EntityContext>,
    /// The states of entities that have no actor: rebuilt on acquisition, or handed back by
    /// a passivated actor.
    dormant: HashMap<EntityId, Seed<E>>,
    entities: HashMap<EntityId, Slot>,
    crashes: VecDeque<Instant>,
}

/// One entity's commands in hand, in the order they are applied.
struct Slot {
    actor: Option<Resident>,
    /// The passivated actor whose state is on its way back: no new actor until it arrives, so
    /// the entity never runs on a state older than its last command.
    returning: Option<ActorId>,
    queue: VecDeque<Pending>,
    /// Set after a failed command: nothing of this entity runs until that command is retried,
    /// so later commands cannot overtake it.
    blocked: Option<Blocked>,
    last_active: Instant,
}

/// Why an entity waits, and for what.
#[derive(Clone, Copy)]
enum Blocked {
    /// The handler failed on `seq`, which was nak'd (or, recovered from the stream, was never
    /// ours to nak): wait for the server to deliver it again.
    Redelivery { seq: u64, since: Instant },
    /// The journal did not confirm a write (leader change, lost connection): keep the
    /// delivery (in-progress acks hold it) and retry here at `at`, without spending a delivery.
    Retry { at: Instant },
}

struct Pending {
    seq: u64,
    payload: Bytes,
    /// The delivery to acknowledge; `None` for a command recovered from the stream on
    /// acquisition (its delivery belongs to the previous owner) or after a nak.
    reply: Option<Subject>,
    deliveries: u64,
    /// Local retries after unconfirmed writes.
    attempts: u32,
    progress_at: Instant,
    /// Where the client wants the outcome.
    respond_to: Option<Subject>,
}

impl<E: Entity> Actor for OwnerActor<E> {
    type Msg = OwnerMsg;
    type State = OwnerState<E>;
    type Arguments = OwnerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<OwnerMsg>,
        args: OwnerArgs,
    ) -> Result<OwnerState<E>, ActorProcessingErr> {
        let config = &args.shared.config;
        let settings = PullSettings {
            batch: config.pull_batch,
            expires: config.pull_expires(),
        };
        let sink = {
            let myself = myself.clone();
            move |signal| myself.cast(OwnerMsg::Pin(signal)).is_ok()
        };
        let pull = pin::start(
            args.shared.js.clone(),
            &args.shared.names.command_stream,
            &args.shared.names.consumer(args.partition),
            settings,
            sink,
        );
        let tick = (config.ack_wait / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
        let ticker = myself.send_interval(tick, || OwnerMsg::Tick);
        Ok(OwnerState {
            partition: args.partition,
            shared: args.shared,
            pull: Some(pull),
            ticker,
            refused_pin: None,
            role: Role::Standby,
            release: None,
            cooldown_until: None,
            counters: Counters::default(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<OwnerMsg>,
        message: OwnerMsg,
        state: &mut OwnerState<E>,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            OwnerMsg::Pin(PinSignal::Delivered(delivery)) => {
                state.on_delivery(&myself, delivery).await
            }
            OwnerMsg::Pin(PinSignal::Lost { pin }) => {
                if matches!(&state.role, Role::Owning(o) if o.pin == pin) {
                    state.step_down(&myself, "pin lost");
                }
                Ok(())
            }
            OwnerMsg::Pin(PinSignal::Gap { pin }) => {
                // The lost delivery comes back only after the ack wait, behind later ones.
                // Take the partition afresh: a new generation and the recovery of every
                // unacknowledged command, in order, before anything newer.
                if matches!(&state.role, Role::Owning(o) if o.pin == pin) {
                    state.step_down(&myself, "deliveries lost in transit");
                }
                Ok(())
            }
            OwnerMsg::Outcome(outcome) => state.on_outcome(&myself, outcome).await,
            OwnerMsg::Passivated(passivated) => {
                state.on_passivated(&myself, passivated).await;
                Ok(())
            }
            OwnerMsg::Tick => state.on_tick(&myself).await,
            OwnerMsg::Release(reply) => {
                state.start_release(&myself, Some(reply)).await;
                Ok(())
            }
            OwnerMsg::HandOff => {
                if matches!(state.role, Role::Owning(_)) && state.release.is_none() {
                    state.start_release(&myself, None).await;
                }
                Ok(())
            }
            OwnerMsg::Pin(PinSignal::Idle) => {
                if let Some(release) = &mut state.release {
                    release.pulls_idle = true;
                }
                state.finish_release_if_drained(&myself).await;
                Ok(())
            }
            OwnerMsg::Status(reply) => {
                let _ = reply.send(state.status());
                Ok(())
            }
        }
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<OwnerMsg>,
        event: SupervisionEvent,
        state: &mut OwnerState<E>,
    ) -> Result<(), ActorProcessingErr> {
        // Entity actors report failures as outcomes and stop themselves. One that dies
        // otherwise (a panic outside the guarded calls) fails the command it was working on,
        // the first in its queue, like any other failure.
        let SupervisionEvent::ActorFailed(cell, error) = event else {
            return Ok(());
        };
        let Role::Owning(o) = &mut state.role else {
            return Ok(());
        };
        let lost = o
            .entities
            .iter()
            .find(|(_, slot)| slot.returning == Some(cell.get_id()))
            .map(|(entity, _)| entity.clone());
        if let Some(entity) = lost {
            // It died passivating, its state with it: the next actor revives from the journal.
            if let Some(slot) = o.entities.get_mut(&entity) {
                slot.returning = None;
            }
            dispatch_all::<E>(&myself, &state.shared, state.partition, o, &entity).await;
            return Ok(());
        }
        let failed = o.entities.iter().find_map(|(entity, slot)| {
            let resident = slot.actor.as_ref()?;
            (resident.actor.get_id() == cell.get_id())
                .then(|| Some((entity.clone(), slot.queue.front()?.seq)))
                .flatten()
        });
        let Some((entity, seq)) = failed else {
            return Ok(());
        };
        tracing::error!(partition = state.partition, %entity, cmd_seq = seq, %error, "entity actor failed");
        let outcome = Outcome {
            entity,
            seq,
            generation: o.generation,
            verdict: Verdict::Failed {
                reason: error.to_string(),
                crashed: true,
            },
        };
        state.on_outcome(&myself, outcome).await
    }
}

impl<E: Entity> OwnerState<E> {
    fn config(&self) -> &ShardConfig {
        &self.shared.config
    }

    async fn on_delivery(
        &mut self,
        myself: &ActorRef<OwnerMsg>,
        delivery: Delivery,
    ) -> Result<(), ActorProcessingErr> {
        // `None`: the subject's last token is no valid id (a foreign publisher): dead-lettered.
        let entity =
            Names::entity_of_subject(&delivery.subject).and_then(|id| EntityId::new(id).ok());
        if self.release.is_some() || self.cooldown_until.is_some() {
            // Handing over: let the next owner have it soon.
            let delay = Duration::from_millis(100);
            let nak = AckKind::Nak(Some(delay));
            acknowledge(&self.shared.client, self.partition, delivery.reply, nak).await;
            return Ok(());
        }
        if let Role::Owning(o) = &self.role
            && o.pin != delivery.pin
        {
            self.step_down(myself, "pin moved");
        }
        if matches!(self.role, Role::Standby) {
            if let Some(refused) = &mut self.refused_pin
                && refused.pin == delivery.pin
            {
                // Not ours to process; back to the server soon for whoever owns it.
                refused.last_delivery = Some(Instant::now());
                let nak = AckKind::Nak(Some(self.shared.config.retry_delay));
                acknowledge(&self.shared.client, self.partition, delivery.reply, nak).await;
                return Ok(());
            }
            self.acquire(myself, delivery, entity).await;
            return Ok(());
        }
        let subject = delivery.subject.clone();
        self.route_or_reject(
            myself,
            entity.as_ref(),
            &subject,
            Pending::delivered(delivery),
        )
        .await;
        Ok(())
    }

    /// Routes a delivered command to its entity, or, if its subject holds no valid entity id,
    /// gives it up with a dead-letter record.
    async fn route_or_reject(
        &mut self,
        myself: &ActorRef<OwnerMsg>,
        entity: Option<&EntityId>,
        subject: &str,
        pending: Pending,
    ) {
        match entity {
            Some(entity) => self.route(myself, entity, pending).await,
            None => {
                tracing::warn!(partition = self.partition, %subject, "command subject holds no valid entity id; dead-lettered");
                let id = Names::entity_of_subject(subject)
                    .unwrap_or_default()
                    .to_owned();
                self.give_up(myself, &id, pending, "the subject holds no valid entity id")
                    .await;
            }
        }
    }

    /// Takes the partition: a new generation, the state rebuilt, the previous owner's
    /// unacknowledged commands recovered in order. `first` is the delivery that showed the pin.
    async fn acquire(
        &mut self,
        myself: &ActorRef<OwnerMsg>,
        first: Delivery,
        first_entity: Option<EntityId>,
    ) {
        let first_seq = first.seq;
        let first_subject = first.subject.clone();
        let started = Instant::now();
        let partition = self.partition;
        let node = self.config().node_id.clone();
        let pin = first.pin.clone();
        let acquired = claim_and_rebuild::<E>(&self.shared, partition).await;
        let Acquired {
            fence,
            dormant,
            rebuilt_events,
            replay_time,
            recovered,
        } = match acquired {
            Ok(parts) => parts,
            Err(reason) => {
                tracing::error!(partition, node = %node, %reason, "cannot take the partition; releasing the pin");
                self.refused_pin = Some(Refused::new(pin, true));
                self.unpin().await;
                return;
            }
        };
        let journal = JournalWriter::new(
            self.shared.js.clone(),
            self.shared.names.clone(),
            partition,
            fence,
        );
        let context = Arc::new(EntityContext {
            partition,
            journal,
            journal_stream: self.shared.journal_stream.clone(),
            names: self.shared.names.clone(),
            codec: self.shared.config.codec,
            owner: myself.clone(),
        });
        self.role = Role::Owning(Box::new(Owning {
            generation: fence.generation,
            pin,
            context,
            dormant,
            entities: HashMap::new(),
            crashes: VecDeque::new(),
        }));
        self.counters.acquisitions += 1;
        tracing::info!(
            partition,
            generation = fence.generation,
            node = %node,
            rebuilt_events,
            recovered = recovered.len(),
            replay_ms = replay_time.as_millis() as u64,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "acquired partition"
        );
        let _ = self.shared.events.send(OwnershipEvent {
            partition,
            generation: fence.generation,
            node,
            change: OwnershipChange::Acquired,
        });

        // The previous owner's unacknowledged commands, and the first delivery, in stream order.
        let mut first = Some(Pending::delivered(first));
        for (entity, pending) in recovered.into_iter().filter(|(_, p)| p.seq != first_seq) {
            if let Some(f) = first.take_if(|f| f.seq < pending.seq) {
                self.route_or_reject(myself, first_entity.as_ref(), &first_subject, f)
                    .await;
            }
            self.route(myself, &entity, pending).await;
        }
        if let Some(f) = first {
            self.route_or_reject(myself, first_entity.as_ref(), &first_subject, f)
                .await;
        }
    }
}

/// What an acquisition gained.
struct Acquired<E: Entity> {
    fence: fence::Fence,
    /// The rebuilt states.
    dormant: HashMap<EntityId, Seed<E>>,
    /// Events replayed into them, and how long the replay took.
    rebuilt_events: u64,
    replay_time: Duration,
    /// The previous owner's in-flight commands.
    recovered: Vec<(EntityId, Pending)>,
}

async fn claim_and_rebuild<E: Entity>(
    shared: &Shared,
    partition: u32,
) -> Result<Acquired<E>, String> {
    {
        let fence = fence::claim(
            &shared.js,
            &shared.journal_stream,
            &shared.names,
            partition,
            &shared.config.node_id,
        )
        .await
        .map_err(|e| format!("claiming a generation: {e}"))?;

        // Every event of this partition precedes our fence record: older owners are fenced.
        let codec = shared.config.codec;
        let mut dormant: HashMap<EntityId, Seed<E>> = HashMap::new();
        let mut failure = None;
        // Up to our own fence record: everything older owners wrote comes before it. Events
        // first, then dead letters: a dead letter only raises its entity's high-water mark,
        // so the order between the two does not matter.
        let mut rebuilt = 0;
        let replay_started = Instant::now();
        for filter in [
            shared.names.partition_events(partition),
            shared.names.dead_letter_subject(partition),
        ] {
            rebuilt += journal::replay(&shared.journal_stream, filter, fence.seq, |stored| {
                // Most records belong to entities seen before: look up by `&str`, and make an
                // `EntityId` only for a new one.
                let seed = match dormant.get_mut(stored.entity) {
                    Some(seed) => seed,
                    None => dormant.entry(EntityId::new(stored.entity)?).or_default(),
                };
                let Some(payload) = stored.payload else {
                    // A dead letter: that command is done with.
                    seed.last_command_seq = seed.last_command_seq.max(stored.command_seq);
                    return Ok(());
                };
                let event: E::Event = codec.decode(payload)?;
                if let Err(reason) = apply_replayed::<E>(seed, &event, stored.command_seq) {
                    failure = Some(reason.clone());
                    return Err(crate::Error::jetstream("rebuild", reason));
                }
                Ok(())
            })
            .await
            .map_err(|e| {
                format!(
                    "rebuilding generation {}: {}",
                    fence.generation,
                    failure.take().unwrap_or_else(|| e.to_string())
                )
            })?;
        }

        let replay_time = replay_started.elapsed();
        let recovered = recover_window(shared, partition)
            .await
            .map_err(|e| format!("recovering in-flight commands: {e}"))?;
        Ok(Acquired {
            fence,
            dormant,
            rebuilt_events: rebuilt,
            replay_time,
            recovered,
        })
    }
}

/// Concurrent readers of the in-flight window, each walking its own slice of it.
const RECOVERY_READERS: u64 = 16;
/// The narrowest slice (in stream sequences) worth a reader of its own.
const RECOVERY_SLICE_MIN: u64 = 32;

/// Reads, straight from the command stream, the commands the consumer has delivered but
/// that are not acknowledged yet: those the previous owner held. Applying them first keeps
/// each entity's commands in order across the takeover; their redeliveries are then
/// recognised as already applied.
///
/// The window is the whole of `(ack floor, delivered]`, including what was delivered to this
/// owner itself since its pin: bounding it by the first delivery under the pin (new commands
/// are delivered in stream order) loses commands when a consumer leader change resets the
/// delivery count (seen in `tests/cluster.rs`, seed 1000): a command missing from the window
/// comes back after later ones of its entity and is taken for a duplicate.
///
/// Every read is a get from the stream leader (a replica could lag behind the delivered
/// sequence), one message per request, so the window `(ack floor, delivered]` is cut into
/// slices read side by side and joined in order: up to `max_ack_pending` commands cost a few
/// round trips' worth of time instead of one round trip each.
async fn recover_window(
    shared: &Shared,
    partition: u32,
) -> Result<Vec<(EntityId, Pending)>, crate::Error> {
    let names = &shared.names;
    let consumer = names.consumer(partition);
    let info = shared
        .command_stream
        .consumer_info(&consumer)
        .await
        .map_err(|e| crate::Error::jetstream(format!("read consumer {consumer}"), e))?;
    let (floor, delivered) = (
        info.ack_floor.stream_sequence,
        info.delivered.stream_sequence,
    );
    if delivered <= floor {
        return Ok(Vec::new());
    }
    let filter = names.partition_commands(partition);
    let span = delivered - floor;
    let readers = span.div_ceil(RECOVERY_SLICE_MIN).clamp(1, RECOVERY_READERS);
    let width = span.div_ceil(readers);
    let slices = (0..readers).map(|i| {
        let first = floor + 1 + i * width;
        let last = (first + width - 1).min(delivered);
        read_slice(&shared.command_stream, &filter, first, last)
    });
    let mut recovered = Vec::new();
    for slice in futures::future::try_join_all(slices).await? {
        recovered.extend(slice);
    }
    Ok(recovered)
}

/// The commands on `filter` with stream sequences in `first..=last`, in order.
async fn read_slice(
    commands: &Stream<()>,
    filter: &str,
    first: u64,
    last: u64,
) -> Result<Vec<(EntityId, Pending)>, crate::Error> {
    let mut recovered = Vec::new();
    let mut next = first;
    while next <= last {
        let found = commands
            .raw_message_builder()
            .sequence(next)
            .next_by_subject(filter.to_owned())
            .send()
            .await;
        let message = match found {
            Ok(message) => message,
            Err(e)
                if e.kind()
                    == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
            {
                break;
            }
            Err(e) => {
                return Err(crate::Error::jetstream(
                    format!("read command {next} of {filter}"),
                    e,
                ));
            }
        };
        if message.sequence > last {
            break;
        }
        next = message.sequence + 1;
        let Some(entity) =
            Names::entity_of_subject(&message.subject).and_then(|id| EntityId::new(id).ok())
        else {
            continue;
        };
        recovered.push((
            entity,
            Pending {
                seq: message.sequence,
                reply: None,
                // Delivered at least once (it is at or below the consumer's delivered
                // sequence); how often is not known here.
                deliveries: 1,
                attempts: 0,
                progress_at: Instant::now(),
                respond_to: pin::respond_to(Some(&message.headers)),
                payload: message.payload,
            },
        ));
    }
    Ok(recovered)
}

impl<E: Entity> OwnerState<E> {
    /// Queues a command for its entity and, unless the entity waits for a retry, hands it on.
    async fn route(&mut self, myself: &ActorRef<OwnerMsg>, entity: &EntityId, pending: Pending) {
        let Role::Owning(o) = &mut self.role else {
            return;
        };
        let slot = o.entities.entry(entity.clone()).or_insert_with(|| Slot {
            actor: None,
            returning: None,
            queue: VecDeque::new(),
            blocked: None,
            last_active: Instant::now(),
        });
        slot.last_active = Instant::now();
        if let Some(held) = slot.queue.iter_mut().find(|p| p.seq == pending.seq) {
            // A redelivery of a command still in hand: keep the newest delivery to acknowledge.
            if pending.reply.is_some() {
                held.reply = pending.reply;
                held.deliveries = pending.deliveries;
            }
            held.progress_at = Instant::now();
            if matches!(slot.blocked, Some(Blocked::Redelivery { seq, .. }) if seq == pending.seq) {
                slot.blocked = None;
                dispatch_all::<E>(myself, &self.shared, self.partition, o, entity).await;
            }
            return;
        }
        let (seq, deliveries) = (pending.seq, pending.deliveries);
        let payload = pending.payload.clone();
        slot.queue.push_back(pending);
        if slot.blocked.is_none() {
            if slot.actor.is_none() {
                dispatch_all::<E>(myself, &self.shared, self.partition, o, entity).await;
            } else if let Some(resident) = &slot.actor {
                let _ = resident.actor.cast(EntityMsg::Work(Work {
                    seq,
                    payload,
                    deliveries,
                }));
            }
        }
    }

    async fn on_outcome(
        &mut self,
        myself: &ActorRef<OwnerMsg>,
        outcome: Outcome,
    ) -> Result<(), ActorProcessingErr> {
        let partition = self.partition;
        let max_deliver = u64::from(self.config().max_deliver);
        let retry_delay = self.config().retry_delay;
        let ack_wait = self.config().ack_wait;
        let (max_restarts, restart_window) = (
            self.config().max_entity_restarts,
            self.config().restart_window,
        );
        let shared = Arc::clone(&self.shared);
        let Role::Owning(o) = &mut self.role else {
            return Ok(());
        };
        if outcome.generation != o.generation {
            return Ok(());
        }
        let Some(slot) = o.entities.get_mut(&outcome.entity) else {
            return Ok(());
        };
        let Some(position) = slot.queue.iter().position(|p| p.seq == outcome.seq) else {
            return Ok(());
        };
        slot.last_active = Instant::now();
        let entity = outcome.entity;
        match outcome.verdict {
            Verdict::Applied { .. } | Verdict::Duplicate | Verdict::Rejected(_) => {
                match &outcome.verdict {
                    Verdict::Applied { events } => {
                        self.counters.applied += 1;
                        self.counters.events_written += *events as u64;
                    }
                    Verdict::Duplicate => self.counters.duplicates += 1,
                    Verdict::Rejected(reason) => {
                        self.counters.rejected += 1;
                        tracing::debug!(partition, %entity, cmd_seq = outcome.seq, %reason, "command rejected");
                    }
                    _ => {}
                }
                if let Some(done) = slot.queue.remove(position) {
                    if let Some(reply) = done.reply {
                        acknowledge(&shared.client, partition, reply, AckKind::Ack).await;
                    }
                    if let Some(to) = done.respond_to {
                        let seq = done.seq;
                        let answer = match outcome.verdict {
                            Verdict::Applied { events } => CommandOutcome::Applied {
                                command_seq: seq,
                                events,
                            },
                            Verdict::Rejected(reason) => CommandOutcome::Rejected {
                                command_seq: seq,
                                reason,
                            },
                            _ => CommandOutcome::Duplicate { command_seq: seq },
                        };
                        respond(&shared.client, to, &answer).await;
                    }
                }
            }
            Verdict::DeadLettered(reason) => {
                tracing::warn!(partition, %entity, cmd_seq = outcome.seq, %reason, "undecodable command dead-lettered and terminated");
                self.counters.dead_lettered += 1;
                if let Some(bad) = slot.queue.remove(position) {
                    if let Some(reply) = bad.reply {
                        acknowledge(&shared.client, partition, reply, AckKind::Term).await;
                    }
                    if let Some(to) = bad.respond_to {
                        let answer = CommandOutcome::DeadLettered {
                            command_seq: bad.seq,
                            reason,
                        };
                        respond(&shared.client, to, &answer).await;
                    }
                }
            }
            Verdict::Fenced => {
                self.step_down(myself, "fenced: a newer generation owns the partition");
            }
            Verdict::Failed { reason, crashed } => {
                slot.actor = None;
                if crashed {
                    let now = Instant::now();
                    o.crashes.push_back(now);
                    while o
                        .crashes
                        .front()
                        .is_some_and(|t| now.duration_since(*t) > restart_window)
                    {
                        o.crashes.pop_front();
                    }
                    if o.crashes.len() > max_restarts as usize {
                        let generation = o.generation;
                        // Give the partition up at once: another process may fare better.
                        self.unpin().await;
                        self.step_down(myself, "entity actors crash too often");
                        return Err(format!("partition {partition} generation {generation}: more than {max_restarts} entity crashes within {restart_window:?}; last: {reason}").into());
                    }
                }
                let failed = &mut slot.queue[position];
                tracing::warn!(partition, %entity, cmd_seq = failed.seq, deliveries = failed.deliveries, %reason, "command failed");
                if !crashed {
                    failed.attempts += 1;
                    let delay = retry_delay
                        .saturating_mul(1 << failed.attempts.min(5))
                        .min(Duration::from_secs(5));
                    slot.blocked = Some(Blocked::Retry {
                        at: Instant::now() + delay,
                    });
                    self.finish_release_if_drained(myself).await;
                    return Ok(());
                }
                let blocked = Some(Blocked::Redelivery {
                    seq: failed.seq,
                    since: Instant::now(),
                });
                match failed.reply.take() {
                    Some(reply) if failed.deliveries >= max_deliver => {
                        failed.reply = Some(reply);
                        if let Some(bad) = slot.queue.remove(position) {
                            let reason = format!(
                                "failed at each of {} deliveries; last: {reason}",
                                bad.deliveries
                            );
                            self.give_up(myself, entity.as_str(), bad, &reason).await;
                        }
                        if let Role::Owning(o) = &mut self.role {
                            dispatch_all::<E>(myself, &self.shared, partition, o, &entity).await;
                        }
                    }
                    Some(reply) => {
                        let delay = retry_delay
                            .saturating_mul(1 << failed.deliveries.clamp(1, 16).saturating_sub(1))
                            .min(ack_wait);
                        slot.blocked = blocked;
                        let nak = AckKind::Nak(Some(delay));
                        acknowledge(&shared.client, partition, reply, nak).await;
                    }
                    None => slot.blocked = blocked,
                }
            }
        }
        self.finish_release_if_drained(myself).await;
        Ok(())
    }

    /// Takes a passivated actor's state into the dormant map, and gives the entity a new actor
    /// if commands came in meanwhile.
    async fn on_passivated(&mut self, myself: &ActorRef<OwnerMsg>, passivated: Passivated) {
        let Role::Owning(o) = &mut self.role else {
            return;
        };
        let entity = passivated.entity;
        if passivated.generation != o.generation {
            return;
        }
        let Some(slot) = o.entities.get_mut(&entity) else {
            return;
        };
        if slot.returning.take().is_none() {
            return;
        }
        if let Some(seed) = passivated
            .seed
            .and_then(|seed| seed.downcast::<Seed<E>>().ok())
        {
            o.dormant.insert(entity.clone(), *seed);
        }
        if slot.queue.is_empty() && slot.blocked.is_none() {
            o.entities.remove(&entity);
        } else {
            dispatch_all::<E>(myself, &self.shared, self.partition, o, &entity).await;
        }
    }

    /// Terminates a command for good and leaves a dead-letter record of it.
    async fn give_up(
        &mut self,
        myself: &ActorRef<OwnerMsg>,
        entity: &str,
        bad: Pending,
        reason: &str,
    ) {
        let Role::Owning(o) = &self.role else { return };
        let journal = o.context.journal.clone();
        self.counters.dead_lettered += 1;
        let written = journal
            .dead_letter(entity, bad.seq, bad.deliveries, reason, bad.payload.clone())
            .await;
        match written {
            Ok(()) => {
                if let Some(reply) = bad.reply {
                    acknowledge(&self.shared.client, self.partition, reply, AckKind::Term).await;
                }
                if let Some(to) = bad.respond_to {
                    let reason = reason.to_owned();
                    let answer = CommandOutcome::DeadLettered {
                        command_seq: bad.seq,
                        reason,
                    };
                    respond(&self.shared.client, to, &answer).await;
                }
            }
            Err(crate::journal::WriteError::Fenced { .. }) => {
                self.step_down(myself, "fenced while dead-lettering")
            }
            Err(e) => {
                tracing::warn!(partition = self.partition, %entity, cmd_seq = bad.seq, error = %e, "dead-letter record not written; the command stays unacknowledged")
            }
        }
    }

    async fn on_tick(&mut self, myself: &ActorRef<OwnerMsg>) -> Result<(), ActorProcessingErr> {
        let config = self.shared.config.clone();
        let partition = self.partition;
        if let Some(until) = self.cooldown_until
            && Instant::now() >= until
        {
            self.cooldown_until = None;
            if let Some(pull) = &self.pull {
                pull.pause(false);
            }
        }
        if let Some(release) = &self.release
            && Instant::now() >= release.deadline
        {
            tracing::warn!(
                partition,
                "release deadline passed with commands in flight; they will be redelivered"
            );
            self.finish_release(myself).await;
            return Ok(());
        }
        if self
            .refused_pin
            .as_ref()
            .is_some_and(|r| r.still_pinned(config.pin_ttl))
        {
            tracing::warn!(
                partition,
                "still pinned under a pin this process stepped down from; releasing it"
            );
            self.unpin().await;
            if let Some(refused) = &mut self.refused_pin {
                refused.unpinned = true;
            }
        }
        let shared = Arc::clone(&self.shared);
        let Role::Owning(o) = &mut self.role else {
            return Ok(());
        };
        let now = Instant::now();
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
                    acknowledge(&shared.client, partition, reply.clone(), AckKind::Progress).await;
                }
            }
            match slot.blocked {
                Some(Blocked::Redelivery { since, .. })
                    if now.duration_since(since) > config.ack_wait * 2 + Duration::from_secs(1) =>
                {
                    stuck.push(entity.clone());
                }
                Some(Blocked::Retry { at }) if now >= at => due.push(entity.clone()),
                _ => {}
            }
            if slot.queue.is_empty()
                && slot.blocked.is_none()
                && slot.returning.is_none()
                && now.duration_since(slot.last_active) >= config.passivate_after
            {
                idle.push(entity.clone());
            }
        }
        for entity in idle {
            passivate(o, &entity);
        }
        for entity in due {
            if let Some(slot) = o.entities.get_mut(&entity) {
                slot.blocked = None;
            }
            dispatch_all::<E>(myself, &shared, partition, o, &entity).await;
        }
        for entity in stuck {
            // The failed command was never delivered again (its delivery limit was reached
            // under an earlier owner): give it up so the entity can go on.
            let Role::Owning(o) = &mut self.role else {
                break;
            };
            let Some(slot) = o.entities.get_mut(&entity) else {
                continue;
            };
            slot.blocked = None;
            if let Some(bad) = slot.queue.pop_front() {
                self.give_up(
                    myself,
                    entity.as_str(),
                    bad,
                    "not redelivered after failing",
                )
                .await;
            }
            if let Role::Owning(o) = &mut self.role {
                dispatch_all::<E>(myself, &self.shared, partition, o, &entity).await;
            }
        }
        Ok(())
    }

    /// Begins handing the partition over: no new pulls, commands in hand finished and
    /// acknowledged, new deliveries sent back. `reply`: a graceful stop (the owner stops after);
    /// none: a hand-off (the owner cools down, then pulls again).
    async fn start_release(
        &mut self,
        myself: &ActorRef<OwnerMsg>,
        reply: Option<RpcReplyPort<()>>,
    ) {
        if let Some(pull) = &self.pull {
            pull.pause(true);
        }
        let pulls_idle = self.pull.is_none();
        let deadline = Instant::now() + self.shared.config.ack_wait;
        self.release = Some(Release {
            reply,
            deadline,
            pulls_idle,
        });
        self.finish_release_if_drained(myself).await;
    }

    async fn finish_release_if_drained(&mut self, myself: &ActorRef<OwnerMsg>) {
        // Unpinning while a pull of ours is still open could pin this process again: wait for
        // the pull loop to be idle as well as for the commands in hand.
        if !self.release.as_ref().is_some_and(|r| r.pulls_idle) {
            return;
        }
        let drained = match &self.role {
            Role::Standby => true,
            Role::Owning(o) => o.entities.values().all(|s| s.queue.is_empty()),
        };
        if drained {
            self.finish_release(myself).await;
        }
    }

    async fn finish_release(&mut self, myself: &ActorRef<OwnerMsg>) {
        let Some(release) = self.release.take() else {
            return;
        };
        let stopping = release.reply.is_some();
        if matches!(self.role, Role::Owning(_)) {
            self.unpin().await;
            self.step_down(myself, if stopping { "released" } else { "handed off" });
        }
        match release.reply {
            Some(reply) => {
                self.pull = None;
                let _ = reply.send(());
                myself.stop(Some("released".to_owned()));
            }
            None => self.cooldown_until = Some(Instant::now() + self.shared.config.pin_ttl * 2),
        }
    }

    /// Asks the server to move the pin at once instead of after the TTL.
    async fn unpin(&mut self) {
        let consumer = self.shared.names.consumer(self.partition);
        if let Err(e) = self
            .shared
            .command_stream
            .unpin_consumer(&consumer, PRIORITY_GROUP)
            .await
        {
            tracing::warn!(partition = self.partition, error = %e, "unpin failed; the pin will expire after its TTL");
        }
    }

    /// Stops owning: entity actors stopped, state dropped, nothing acknowledged any more under
    /// this generation. Commands in hand stay unacknowledged for the next owner.
    fn step_down(&mut self, myself: &ActorRef<OwnerMsg>, reason: &str) {
        let Role::Owning(o) = std::mem::replace(&mut self.role, Role::Standby) else {
            return;
        };
        myself.stop_children(Some(reason.to_owned()));
        if !matches!(
            reason,
            "released" | "handed off" | "deliveries lost in transit"
        ) {
            self.refused_pin = Some(Refused::new(o.pin.clone(), false));
        }
        let node = self.config().node_id.clone();
        tracing::info!(partition = self.partition, generation = o.generation, node = %node, reason, "stepped down");
        let _ = self.shared.events.send(OwnershipEvent {
            partition: self.partition,
            generation: o.generation,
            node,
            change: OwnershipChange::Released {
                reason: reason.to_owned(),
            },
        });
    }

    fn status(&self) -> PartitionStatus {
        let (generation, resident, in_hand) = match &self.role {
            Role::Standby => (None, 0, 0),
            Role::Owning(o) => (
                Some(o.generation),
                o.entities.values().filter(|s| s.actor.is_some()).count(),
                o.entities.values().map(|s| s.queue.len()).sum(),
            ),
        };
        PartitionStatus {
            partition: self.partition,
            generation,
            resident_entities: resident,
            commands_in_hand: in_hand,
            applied: self.counters.applied,
            events_written: self.counters.events_written,
            rejected: self.counters.rejected,
            duplicates: self.counters.duplicates,
            dead_lettered: self.counters.dead_lettered,
            acquisitions: self.counters.acquisitions,
        }
    }
}

/// (Re)starts an entity's actor if needed and hands it every command in hand, in order.
async fn dispatch_all<E: Entity>(
    myself: &ActorRef<OwnerMsg>,
    shared: &Arc<Shared>,
    partition: u32,
    o: &mut Owning<E>,
    entity: &EntityId,
) {
    let Some(slot) = o.entities.get_mut(entity) else {
        return;
    };
    if slot.queue.is_empty() || slot.blocked.is_some() || slot.returning.is_some() {
        return;
    }
    if slot.actor.is_none() {
        let seed = o.dormant.remove(entity);
        // Without waiting for the actor's start (its `pre_start` only stores its arguments, and
        // cannot fail): the owner goes on routing while the actor starts, and the commands sent
        // meanwhile wait in its mailbox.
        match ractor::ActorRuntime::spawn_linked_instant(
            None,
            EntityActor::<E>::new(),
            (entity.clone(), Arc::clone(&o.context), seed),
            myself.get_cell(),
        ) {
            Ok((actor, _)) => slot.actor = Some(Resident::new(actor, &shared.resident)),
            Err(e) => {
                tracing::error!(partition, %entity, error = %e, "cannot spawn entity actor");
                return;
            }
        }
        if let Some(cap) = shared.config.max_resident_entities
            && shared.resident.load(Ordering::Relaxed) > cap
        {
            evict_idle(o, shared.resident.load(Ordering::Relaxed) - cap * 9 / 10);
        }
    }
    let Some(slot) = o.entities.get_mut(entity) else {
        return;
    };
    if let Some(resident) = &slot.actor {
        for pending in &slot.queue {
            let _ = resident.actor.cast(EntityMsg::Work(Work {
                seq: pending.seq,
                payload: pending.payload.clone(),
                deliveries: pending.deliveries,
            }));
        }
    }
}

/// Asks an idle entity's actor to hand its state back and stop ([`OwnerState::on_passivated`]
/// takes the state); forgets an entity that has no actor.
fn passivate<E: Entity>(o: &mut Owning<E>, entity: &EntityId) {
    let Some(slot) = o.entities.get_mut(entity) else {
        return;
    };
    match slot.actor.take() {
        Some(resident) => {
            slot.returning = Some(resident.actor.get_id());
            let _ = resident.actor.cast(EntityMsg::Passivate);
        }
        None if slot.returning.is_none() => {
            o.entities.remove(entity);
        }
        None => {}
    }
}

/// Passivates up to `count` of this partition's idle resident entities, least recently active
/// first: the resident cap is over.
fn evict_idle<E: Entity>(o: &mut Owning<E>, count: usize) {
    let mut idle: Vec<(Instant, EntityId)> = o
        .entities
        .iter()
        .filter(|(_, s)| s.actor.is_some() && s.queue.is_empty() && s.blocked.is_none())
        .map(|(id, s)| (s.last_active, id.clone()))
        .collect();
    let count = count.min(idle.len());
    if count == 0 {
        return;
    }
    if count < idle.len() {
        idle.select_nth_unstable_by_key(count - 1, |(at, _)| *at);
    }
    for (_, entity) in idle.into_iter().take(count) {
        passivate(o, &entity);
    }
}

impl Pending {
    fn delivered(delivery: Delivery) -> Self {
        Pending {
            seq: delivery.seq,
            payload: delivery.payload,
            reply: Some(delivery.reply),
            deliveries: delivery.deliveries,
            attempts: 0,
            progress_at: Instant::now(),
            respond_to: delivery.respond_to,
        }
    }
}

/// Tells a client the outcome of its command (best effort: the outcome is in the journal).
async fn respond(client: &Client, to: Subject, outcome: &CommandOutcome) {
    let Ok(body) = serde_json::to_vec(outcome) else {
        return;
    };
    if let Err(e) = client.publish(to, body.into()).await {
        tracing::debug!(error = %e, "outcome reply not sent");
    }
}

/// Sends an acknowledgement of any kind for one delivery: a core publish to its reply subject.
async fn acknowledge(client: &Client, partition: u32, reply: Subject, kind: AckKind) {
    if let Err(e) = client.publish(reply, kind.into()).await {
        tracing::warn!(partition, error = %e, "acknowledgement not sent; the server will redeliver");
    }
}
