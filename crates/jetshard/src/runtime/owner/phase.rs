//! The phases of a partition's owner, and what it holds in each.
//!
//! ```text
//!            first delivery under a new pin: claim, rebuild, recover (acquire.rs)
//!  Standby ───────────────────────────────────────────────────────────▶ Owning
//!   ▲  ▲                                                                 │  │
//!   │  │ pin lapses; next delivery        pin lost · pin moved · fenced  │  │
//!   │  └───────── Refused ◀──────────────── crash loop · acquisition failed │
//!   │                                                                       │
//!   │ cool-down over     hand-off done                 release · hand-off   │
//!   └── CoolingDown ◀──────────────────── Releasing ◀───────────────────────┘
//! ```
//!
//! A stop (graceful release) can start in any phase; its owner stops once released.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use ractor::RpcReplyPort;
use tokio::time::Instant;

use super::dormant::Dormant;
use super::isolate::Isolation;
use super::slot::Slot;
use crate::entity::{Entity, EntityId};
use crate::journal::fence::HeldRange;
use crate::retry::RestartWindow;
use crate::runtime::entity_actor::{EntityContext, InBatch, Quarantine};

/// Where an owner stands.
pub(super) enum Phase<E: Entity> {
    /// Pulling as a standby: the first delivery under a pin it has not refused acquires.
    Standby,
    /// Pulling, but not to acquire under this pin again: it stepped down or failed under it.
    /// Deliveries under it go back to the server; the pull loop has forgotten the pin, so the
    /// server moves it after its TTL even when an unpin cannot be done.
    Refused(Refused),
    /// Owns the partition.
    Owning(Box<Owning<E>>),
    /// Handing over: pulls paused, the commands in hand finishing; then unpinned.
    Releasing(Release, Option<Box<Owning<E>>>),
    /// After a hand-off: not pulling until then, so the partition goes to another process.
    CoolingDown(Instant),
}

/// What an owner holds while it owns the partition under one generation.
pub(super) struct Owning<E: Entity> {
    pub(super) generation: u64,
    pub(super) pin: Arc<str>,
    /// The fenced journal writer and the rest of what this generation's entity actors share.
    pub(super) context: Arc<EntityContext>,
    /// The states of entities that have no actor, handed back by passivated actors (within the
    /// process's budget). An entity with neither an actor nor a dormant state is loaded from the
    /// journal by its next actor.
    pub(super) dormant: Dormant<E>,
    /// Entities whose journal cannot be read back (found when they were loaded): their commands
    /// are dead-lettered.
    pub(super) quarantined: HashMap<EntityId, Quarantine>,
    /// Each entity in hand, looked up several times per command (routed, planned, queued,
    /// settled): hashed with foldhash, not SipHash (see [`EntityHasher`]).
    pub(super) entities: HashMap<EntityId, Slot, EntityHasher>,
    /// Entities whose actor stopped on a command under this generation (a write of theirs may
    /// be in doubt): their states are not kept for a warm re-claim (`warm.rs`).
    pub(super) doubted: HashSet<EntityId>,
    /// The generation before, when this one kept its states (a warm re-claim, `warm.rs`): the
    /// states its actors hand back still come in and are taken.
    pub(super) warm_from: Option<u64>,
    /// The entities whose slots wait for the state of an actor of [`Self::warm_from`]'s
    /// generation (`returning`): not kept again if this generation steps down before it comes.
    pub(super) surrendering: HashSet<EntityId>,
    /// Entity actor crashes, against the restart window.
    pub(super) crashes: RestartWindow,
    /// The claim's count of the commands in hand at acquisition (their delivery counts).
    pub(super) held: Vec<HeldRange>,
    /// Set while the commands earlier owners held run one at a time (see `isolate.rs`).
    pub(super) isolation: Option<Isolation>,
    /// The command to give up before decoding when its turn comes in isolation, and why.
    pub(super) suspect: Option<(u64, String)>,
    /// While a pull burst is routed: the batched read of the last records of each entity of
    /// the burst that has neither an actor nor a dormant state (`route::plan_batch_loads`),
    /// handed to its actor when it is spawned.
    pub(super) batch_loads: HashMap<EntityId, InBatch>,
}

/// The hasher of the owner's table of entities in hand: foldhash, seeded at random per table
/// (`foldhash::fast::RandomState`: a random global seed per process and one per table), cheaper
/// per lookup than std's SipHash-1-3. Entity ids are chosen by whoever sends commands, so the
/// table must not let them pick colliding ids: without the seeds they cannot (foldhash's
/// "minimal DoS resistance"; SipHash, a keyed pseudo-random function, resists even one who
/// studies the process's timings, which foldhash does not claim). The table holds only the
/// entities in hand or resident, and a sender reaches it only through the consumer's window.
pub(super) type EntityHasher = foldhash::fast::RandomState;

/// A hand-over in progress.
pub(super) struct Release {
    /// `Some` for a graceful stop; `None` for a hand-off.
    pub(super) reply: Option<RpcReplyPort<()>>,
    /// Past it, commands still in hand are left for redelivery.
    pub(super) deadline: Instant,
    /// Whether the pull loop has no request open any more that an unpin could pin again (one
    /// without the pin id).
    pub(super) pulls_idle: bool,
}

/// A pin under which this owner must not acquire again.
pub(super) struct Refused {
    pub(super) pin: Arc<str>,
    pub(super) since: Instant,
    /// When a delivery under this pin last came in.
    pub(super) last_delivery: Option<Instant>,
    /// Whether the server has confirmed an unpin.
    pub(super) unpinned: bool,
}

impl Refused {
    pub(super) fn new(pin: Arc<str>) -> Self {
        Self {
            pin,
            since: Instant::now(),
            last_delivery: None,
            unpinned: false,
        }
    }

    /// Deliveries still arrive under the refused pin a while after the refusal: the server
    /// still pins this process. An unpin moves the pin at once; it is asked for (again) only
    /// then, never once the pin may have moved on to another process.
    pub(super) fn wants_unpin(&self, pin_ttl: std::time::Duration) -> bool {
        !self.unpinned
            && self.since.elapsed() > pin_ttl
            && self.last_delivery.is_some_and(|at| at.elapsed() < pin_ttl)
    }
}

impl<E: Entity> Phase<E> {
    /// The partition's state, while this owner holds it (owning, or finishing a release).
    pub(super) fn owning(&mut self) -> Option<&mut Owning<E>> {
        match self {
            Phase::Owning(o) | Phase::Releasing(_, Some(o)) => Some(o),
            _ => None,
        }
    }

    pub(super) fn owning_ref(&self) -> Option<&Owning<E>> {
        match self {
            Phase::Owning(o) | Phase::Releasing(_, Some(o)) => Some(o),
            _ => None,
        }
    }

    /// The owned state, taken out; the phase is left as it was otherwise.
    pub(super) fn take_owning(&mut self) -> Option<Box<Owning<E>>> {
        match self {
            Phase::Releasing(_, owning) => owning.take(),
            Phase::Owning(_) => match std::mem::replace(self, Phase::Standby) {
                Phase::Owning(o) => Some(o),
                _ => None,
            },
            _ => None,
        }
    }
}

/// This process's counters of one partition.
#[derive(Default, Clone, Copy)]
pub(super) struct Counters {
    pub(super) applied: u64,
    pub(super) events_written: u64,
    pub(super) rejected: u64,
    pub(super) duplicates: u64,
    pub(super) dead_lettered: u64,
    pub(super) acquisitions: u64,
    pub(super) failed_acquisitions: u64,
    pub(super) unconfirmed_writes: u64,
}
