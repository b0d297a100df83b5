//! What one entity type's owners share: the server handles, names, config and the
//! system-wide counters.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use async_nats::Client;
use async_nats::jetstream::Context;
use async_nats::jetstream::stream::Stream;
use tokio::sync::broadcast;

use crate::config::ShardConfig;
use crate::health::HealthBoard;
use crate::journal::server::Streams;
use crate::status::OwnershipEvent;
use crate::wire::Names;

/// What one entity type's owners share.
pub(crate) struct Shared {
    pub(crate) js: Context,
    pub(crate) client: Client,
    pub(crate) names: Arc<Names>,
    /// The layouts of other entity types the outbox learned (`outbox::Routes`).
    pub(crate) routes: Arc<crate::runtime::outbox::Routes>,
    pub(crate) config: ShardConfig,
    pub(crate) command_streams: Streams,
    pub(crate) journals: Streams,
    /// Each journal stream's leader elections seen by this process, in the order of
    /// [`Names::journal_streams`] (empty on one server: no elections).
    pub(crate) leader_elections: Vec<tokio::sync::watch::Sender<Option<tokio::time::Instant>>>,
    pub(crate) events: broadcast::Sender<OwnershipEvent>,
    /// Live entity actors over all partitions of this system (for the resident cap).
    pub(crate) resident: Arc<AtomicUsize>,
    /// Dormant entity states over all partitions of this system (for their budget).
    pub(crate) dormant: Arc<super::dormant::DormantTotals>,
    /// Entity loads in flight over all partitions of this system.
    pub(crate) loads: Arc<tokio::sync::Semaphore>,
    /// Batched loads' reads in flight over all partitions of this system.
    pub(crate) batch_reads: Arc<tokio::sync::Semaphore>,
    /// This process's run of the shard system: it answers on `<t>.alive.<incarnation>`, and its
    /// fence records name it.
    pub(crate) incarnation: String,
    /// Each owner's phase, for [`ShardSystem::health`](crate::ShardSystem::health).
    pub(crate) health: Arc<HealthBoard>,
    /// Other processes this one found dead (see [`crate::runtime::crash`]).
    pub(crate) deaths: Arc<crate::runtime::crash::Deaths>,
    /// The partitions' consumers resumed, told to their pull loops (see
    /// [`crate::runtime::pin::resumed`]).
    pub(crate) resumes: Arc<crate::runtime::pin::resumed::Resumes>,
}

impl Shared {
    /// The command stream holding `partition`'s commands.
    pub(crate) fn commands(&self, partition: u32) -> &Stream<()> {
        self.command_streams.of(partition)
    }

    /// The journal stream holding `partition`'s records.
    pub(crate) fn journal(&self, partition: u32) -> &Stream<()> {
        self.journals.of(partition)
    }

    /// The leader elections of `partition`'s journal stream (`None` on one server).
    pub(crate) fn leader_elections(
        &self,
        partition: u32,
    ) -> Option<crate::journal::group_commit::Elections> {
        self.leader_elections
            .get(self.names.journal_index(partition))
            .map(tokio::sync::watch::Sender::subscribe)
    }
}
