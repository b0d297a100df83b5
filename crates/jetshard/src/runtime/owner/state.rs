//! The owner actor's messages, arguments and state (the actor and its dispatch are in
//! `mod.rs`; the state's other methods in one file per responsibility).

use std::sync::Arc;

use ractor::{ActorRef, RpcReplyPort};
use tokio::task::JoinHandle;

use super::phase::{Counters, Phase};
use super::settle::Policy;
use super::shared::Shared;
use super::warm::Warm;
use crate::config::ShardConfig;
use crate::entity::{Entity, EntityId};
use crate::journal::group_commit::CommitStats;
use crate::runtime::entity_actor::{EntityReport, LoadStats};
use crate::runtime::pin::{PinSignal, PullLoop};
use crate::runtime::timer::Timers;
use crate::status::PartitionStatus;
use crate::telemetry::PartitionMetrics;

/// The owner's messages.
pub(crate) enum OwnerMsg {
    /// From the pull loop.
    Pin(PinSignal),
    /// From an entity actor.
    Entity(EntityReport),
    /// Periodic upkeep: in-progress extension, passivation, retries, release deadline.
    Tick,
    /// Graceful stop: finish in-flight commands, release the pin, reply, stop.
    Release(RpcReplyPort<()>),
    /// Balancing: hand the partition to another process (as a graceful stop does), then stay
    /// out of it for a while before pulling again.
    HandOff,
    /// Balancing, every pin TTL: whether this process owns enough while another owns too little,
    /// so that a standby here stops pulling (`true`) and the partitions handed off go to the
    /// process that lacks them, not back and forth between the others (see `balance.rs`).
    HoldBack(bool),
    /// A snapshot for status displays.
    Status(RpcReplyPort<PartitionStatus>),
    /// A state query for one of the partition's entities (`<t>.query.<p>.<id>`).
    Query(crate::query::Query),
    /// The commands stored and not delivered yet, from the consumer's info
    /// (`status::count_pending`), asked for under `generation` after `deliveries` deliveries.
    PendingCounted {
        generation: u64,
        deliveries: u64,
        pending: u64,
    },
    /// The partition's armed timers, read from the journal on acquisition (`find_timers`).
    TimersFound {
        generation: u64,
        found: Vec<(EntityId, Box<str>, crate::data::timers::Armed)>,
    },
}

pub(crate) struct OwnerArgs {
    pub(crate) shared: Arc<Shared>,
    pub(crate) partition: u32,
}

pub(crate) struct OwnerState<E: Entity> {
    pub(super) partition: u32,
    pub(super) shared: Arc<Shared>,
    pub(super) myself: ActorRef<OwnerMsg>,
    /// When the owner started (its pull loop started then).
    pub(super) born: tokio::time::Instant,
    pub(super) pull: PullLoop,
    pub(super) ticker: JoinHandle<()>,
    /// Hands the partition's state queries to this owner.
    pub(super) queries: JoinHandle<()>,
    /// Publishes the outbox messages earlier owners left unconfirmed (`outbox::recover`), from
    /// the last acquisition; stopped with the owner or at the next acquisition.
    pub(super) outbox_recovery: Option<JoinHandle<()>>,
    /// The generation owned when a command retried after a write not confirmed came back a
    /// duplicate (that write landed, its outbox unpublished): the next tick starts one outbox
    /// recovery for all such commands (an election answers every write in flight "not
    /// confirmed" at once; a recovery each would open as many reads).
    pub(super) outbox_in_doubt: Option<u64>,
    /// Reads the partition's armed timers from the journal (`find_timers`), from the last
    /// acquisition; stopped with the owner or at the next acquisition.
    pub(super) timer_scan: Option<JoinHandle<()>>,
    /// Compacts the partition's journal in the background (`runtime/compaction.rs`) while this
    /// owner holds it: started at each acquisition, stopped when it stops owning.
    pub(super) compaction: Option<JoinHandle<()>>,
    /// Offers the wake-up of the partition this owner let go (`pin::wake`, which may take the
    /// publish patience); stopped with the owner or at the next release.
    pub(super) waking: Option<JoinHandle<()>>,
    /// The armed timers of the partition while this owner holds it (`timer.rs`).
    pub(super) timers: Timers,
    pub(super) phase: Phase<E>,
    pub(super) policy: Policy,
    pub(super) counters: Counters,
    /// What the partition's group commits came to, over every generation.
    pub(super) commits: Arc<CommitStats>,
    /// What the partition's entity loads came to, over every generation.
    pub(super) load_stats: Arc<LoadStats>,
    pub(super) metrics: PartitionMetrics,
    /// The pin of the last delivery (for `jetshard_pin_changes_total`).
    pub(super) last_pin: Option<Arc<str>>,
    /// Deliveries to this owner so far, and at the last tick (`status::count_pending`).
    pub(super) deliveries: u64,
    pub(super) deliveries_at_tick: u64,
    /// Asks the consumer's info for the commands waiting (`status::count_pending`), while
    /// the owner is delivered nothing with commands in hand; stopped with the owner.
    pub(super) pending_count: Option<JoinHandle<()>>,
    /// The states of the generation this owner last stepped down from, kept for a claim of
    /// the next one (`warm.rs`).
    pub(super) warm: Option<Box<Warm<E>>>,
    /// The generation this owner handed off, while it cools down: queries get "moving" until
    /// a newer claim exists.
    pub(super) handed_off: Option<u64>,
    /// The balancing's last word: standbys of this process hold back.
    pub(super) hold_back: bool,
    /// Whether this owner's pulls are paused as a standby holding back.
    pub(super) holding: bool,
    /// The last pin this standby was given while holding back, and gave back.
    pub(super) declined: Option<Arc<str>>,
}

impl<E: Entity> Drop for OwnerState<E> {
    fn drop(&mut self) {
        self.ticker.abort();
        self.queries.abort();
        if let Some(recovery) = &self.outbox_recovery {
            recovery.abort();
        }
        if let Some(scan) = &self.timer_scan {
            scan.abort();
        }
        if let Some(compaction) = &self.compaction {
            compaction.abort();
        }
        if let Some(waking) = &self.waking {
            waking.abort();
        }
        if let Some(count) = &self.pending_count {
            count.abort();
        }
    }
}

impl<E: Entity> OwnerState<E> {
    pub(super) fn config(&self) -> &ShardConfig {
        &self.shared.config
    }
}
