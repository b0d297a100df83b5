//! [`ShardSystem`], the handle an application holds: start, accessors, status, health, stop.

use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream;
use ractor::{Actor, ActorCell, ActorRef};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use super::actor::SystemActor;
use super::state::SystemMsg;
use crate::config::ShardConfig;
use crate::entity::Entity;
use crate::error::Error;
use crate::health::{Health, HealthBoard};
use crate::journal::server::Streams;
use crate::runtime::owner::Shared;
use crate::runtime::topology;
use crate::status::{OwnershipEvent, PartitionStatus};

/// A running shard system: this process's part in running one entity type.
///
/// Start one per entity type in every process; the processes share the partitions between them
/// through the server's pinning, and take over each other's when one dies or stalls.
///
/// ```no_run
/// # use jetshard::{Entity, ShardConfig, ShardSystem};
/// # async fn run<Order: Entity>(client: async_nats::Client) -> Result<(), jetshard::Error> {
/// let config = ShardConfig::builder("order").partitions(8).build()?;
/// let system = ShardSystem::start::<Order>(client, config).await?;
/// // ... until the process is asked to stop:
/// system.shutdown().await?;
/// # Ok(()) }
/// ```
pub struct ShardSystem {
    actor: ActorRef<SystemMsg>,
    join: JoinHandle<()>,
    events: broadcast::Sender<OwnershipEvent>,
    config: ShardConfig,
    health: Arc<HealthBoard>,
    /// The connection the system runs on, for [`health`](Self::health).
    client: Client,
}

impl ShardSystem {
    /// Creates or validates the entity type's streams and consumers, then starts an owner for
    /// every partition. Standalone: nothing supervises the system.
    ///
    /// # Errors
    /// [`Error::PartitionMismatch`] or [`Error::Incompatible`] if the streams exist with other
    /// settings; [`Error::JetStream`] if the server cannot be reached; [`Error::Spawn`].
    pub async fn start<E: Entity>(client: Client, config: ShardConfig) -> Result<Self, Error> {
        Self::spawn::<E>(client, config, None).await
    }

    /// Like [`start`](Self::start), but linked under `supervisor` in the application's actor
    /// tree: if the system fails (its owners fail too often), the supervisor receives
    /// `SupervisionEvent::ActorFailed` for [`actor`](Self::actor).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn start_linked<E: Entity>(
        client: Client,
        config: ShardConfig,
        supervisor: ActorCell,
    ) -> Result<Self, Error> {
        Self::spawn::<E>(client, config, Some(supervisor)).await
    }

    async fn spawn<E: Entity>(
        client: Client,
        config: ShardConfig,
        supervisor: Option<ActorCell>,
    ) -> Result<Self, Error> {
        // Every command in hand may have a journal write in flight (one per entity): the
        // client's own limit on acknowledgements in flight (5,000 by default, over which a
        // publish fails) must not be lower, and reaching it waits rather than fails.
        let in_flight = (config.partitions as usize)
            .saturating_mul(config.max_ack_pending as usize)
            .max(5_000);
        let js = jetstream::ContextBuilder::new()
            .timeout(config.write_timeout)
            .max_ack_inflight(in_flight)
            .backpressure_on_inflight(true)
            .build(client);
        let names = Arc::new(config.names());
        topology::provision(&js, &names, &config).await?;
        let command_streams = Streams::open(&js, names.command_streams()).await?;
        let journals = Streams::open(&js, names.journal_streams()).await?;
        let leader_elections = if config.replicas > 1 {
            names
                .journal_streams()
                .iter()
                .map(|_| tokio::sync::watch::Sender::new(None))
                .collect()
        } else {
            Vec::new()
        };
        let (events, _) = broadcast::channel(1024);
        let health = Arc::new(HealthBoard::new(config.partitions));
        let client = js.client();
        let shared = Arc::new(Shared {
            client: client.clone(),
            js,
            names,
            routes: Arc::default(),
            config: config.clone(),
            command_streams,
            journals,
            leader_elections,
            events: events.clone(),
            resident: Arc::default(),
            dormant: Arc::default(),
            loads: Arc::new(tokio::sync::Semaphore::new(
                crate::runtime::entity_actor::MAX_LOADS,
            )),
            batch_reads: Arc::new(tokio::sync::Semaphore::new(
                crate::runtime::entity_actor::MAX_BATCH_READS,
            )),
            incarnation: crate::wire::unique_token(),
            health: health.clone(),
            deaths: Arc::default(),
            resumes: Arc::new(crate::runtime::pin::resumed::Resumes::new(
                config.partitions,
            )),
        });
        let actor = SystemActor::<E>::new();
        let spawned = match supervisor {
            Some(supervisor) => Actor::spawn_linked(None, actor, shared, supervisor).await,
            None => Actor::spawn(None, actor, shared).await,
        };
        let (actor, join) = spawned.map_err(|e| Error::Spawn {
            what: "shard system",
            source: Box::new(e),
        })?;
        Ok(Self {
            actor,
            join,
            events,
            config,
            health,
            client,
        })
    }

    /// The system's actor, for linking and monitoring in an application's supervision tree.
    pub fn actor(&self) -> ActorCell {
        self.actor.get_cell()
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &ShardConfig {
        &self.config
    }

    /// Ownership changes in this process from now on.
    pub fn ownership_events(&self) -> broadcast::Receiver<OwnershipEvent> {
        self.events.subscribe()
    }

    /// A snapshot of every partition in this process.
    ///
    /// # Errors
    /// [`Error::Stopped`] if the system is no longer running.
    pub async fn status(&self) -> Result<Vec<PartitionStatus>, Error> {
        match self
            .actor
            .call(SystemMsg::Status, Some(Duration::from_secs(10)))
            .await
        {
            Ok(ractor::rpc::CallResult::Success(status)) => Ok(status),
            _ => Err(Error::Stopped),
        }
    }

    /// Whether this process serves its partitions: [`Health::Ready`] once every partition it
    /// owns is serving (the others it pulls as a standby); [`Health::Degraded`] names each
    /// partition whose owner is starting, acquiring, refused, isolating, releasing or
    /// restarting; [`Health::Disconnected`] while its connection to the server is down (even
    /// if it owns nothing); [`Health::Stopped`] once the system has stopped. It reads the
    /// client's connection state and what each owner last posted, and never waits on one (an
    /// acquisition runs for as long as its replay).
    pub fn health(&self) -> Health {
        let stopping = matches!(
            self.actor.get_status(),
            ractor::ActorStatus::Draining
                | ractor::ActorStatus::Stopping
                | ractor::ActorStatus::Stopped
        );
        if stopping || self.join.is_finished() {
            return Health::Stopped;
        }
        let connected = self.client.connection_state() == async_nats::connection::State::Connected;
        Health::judge(connected, &self.health.phases())
    }

    /// Stops gracefully: every owner finishes and acknowledges the commands in hand (within the
    /// ack wait), releases its pin so a standby takes over at once, and stops.
    ///
    /// # Errors
    /// [`Error::Stopped`] if the system had already stopped.
    pub async fn shutdown(self) -> Result<(), Error> {
        let timeout = self.config.ack_wait + Duration::from_secs(5);
        let result = self.actor.call(SystemMsg::Shutdown, Some(timeout)).await;
        let _ = self.join.await;
        match result {
            Ok(ractor::rpc::CallResult::Success(())) => Ok(()),
            _ => Err(Error::Stopped),
        }
    }
}
