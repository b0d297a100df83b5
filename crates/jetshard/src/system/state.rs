//! The system actor's messages and state.

use std::collections::HashMap;
use std::sync::Arc;

use async_nats::Subject;
use ractor::{ActorId, ActorRef, RpcReplyPort};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::retry::RestartWindow;
use crate::runtime::balance::{Heartbeat, Membership};
use crate::runtime::owner::{OwnerMsg, Shared};
use crate::status::PartitionStatus;

/// What the system actor is told: by its handle, its timers and its listeners.
pub(super) enum SystemMsg {
    Status(RpcReplyPort<Vec<PartitionStatus>>),
    Shutdown(RpcReplyPort<()>),
    Respawn(u32),
    /// Another process's heartbeat.
    Heard(Heartbeat),
    /// Time to say how many partitions this process owns, and to hand one off if it owns too
    /// many.
    Balance,
    /// A status request on `<t>.status`: answer it there.
    Report(Subject),
}

/// The system actor's state: its owners, its membership view, and the tasks it owns.
pub(super) struct SystemState {
    pub(super) shared: Arc<Shared>,
    pub(super) owners: Vec<Option<ActorRef<OwnerMsg>>>,
    pub(super) partition_of: HashMap<ActorId, u32>,
    /// Owner failures, against the system's restart window.
    pub(super) failures: RestartWindow,
    pub(super) stopping: bool,
    pub(super) membership: Membership,
    /// The live members as last told to the crash watch (`None`: no membership, balancing off).
    pub(super) members: tokio::sync::watch::Sender<Option<std::collections::BTreeSet<String>>>,
    /// The other live members' incarnations (and nodes), as last told to the crash watch.
    pub(super) peers: tokio::sync::watch::Sender<std::collections::BTreeMap<String, String>>,
    /// Partitions this process owned at the last balancing round.
    pub(super) owned: u32,
    /// When this process last said its heartbeat, and what it owned then.
    pub(super) said: Option<(Instant, u32)>,
    /// Per partition: whether its standby pauses its pulls (it holds back, or it is not one of
    /// the partition's standbys), as last told to its owner.
    pub(super) holding: Vec<bool>,
    /// Per partition: whether this process is one of its standbys, for the members in
    /// `members` (computed again only when they change).
    pub(super) standing_by: Vec<bool>,
    pub(super) last_hand_off: Option<Instant>,
    /// The heartbeat listener and the balance timer; stopped with the system.
    pub(super) tasks: Vec<JoinHandle<()>>,
}

impl Drop for SystemState {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
