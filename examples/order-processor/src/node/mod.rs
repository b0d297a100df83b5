//! `node`: one process running the order shard system, embedded in an application's
//! supervision tree.
//!
//! ```text
//!   Root (application supervisor)
//!    ├── jetshard shard system   ShardSystem::start_linked(.., root)
//!    │    └── partition owners ── entity actors      (jetshard's own subtree)
//!    └── Reporter                logs ownership changes and, every few seconds, the status
//! ```
//!
//! The root reacts to its children's supervision events: a failed reporter is restarted; a
//! failed shard system (jetshard escalates when its partition owners fail too often) is
//! restarted after a pause, at most [`MAX_SYSTEM_RESTARTS`] times in
//! [`SYSTEM_RESTART_WINDOW`]; beyond that the node exits non-zero so that whatever runs it
//! (systemd, Kubernetes) can decide. SIGINT or SIGTERM shuts down gracefully: the shard system
//! finishes and acknowledges the commands in hand and releases its pins, so the other nodes
//! take over at once instead of after the pin TTL.
//!
//! With `--inventory` the node runs a second shard system beside the order's, for the
//! [`inventory`](crate::inventory) entity type, under the same root (restarted the same way).
//!
//! Ownership changes (of the order's partitions) go to the log (stderr) and, one line each, to
//! stdout for programs that watch the node (the demo, the tests): see [`NodeLine`]. The
//! reporter and the task that forwards it the ownership events are in `reporter.rs`.

mod reporter;

use std::collections::VecDeque;
use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::Client;
use jetshard::{Health, PartitionStatus, ShardConfig, ShardConfigBuilder, ShardSystem};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr, SupervisionEvent};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::oneshot;

use self::reporter::{Forwarder, ReporterMsg, spawn_reporter};
use crate::inventory::{self, Inventory};
use crate::nodes::NodeLine;
use crate::order::{self, Order};
use crate::probe;
use crate::rules::{self, Features};
use crate::verify::keep_journal_copy;

/// How often the shard system may fail within [`SYSTEM_RESTART_WINDOW`] and be restarted.
pub const MAX_SYSTEM_RESTARTS: usize = 3;
/// The window of [`MAX_SYSTEM_RESTARTS`].
pub const SYSTEM_RESTART_WINDOW: Duration = Duration::from_secs(60);
/// The pause before a failed shard system is started again.
const SYSTEM_RESTART_DELAY: Duration = Duration::from_secs(2);

/// How a node runs.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The server, or the servers of a cluster, comma-separated.
    pub nats_url: String,
    /// This node's id, written into fence records.
    pub node_id: String,
    /// Partitions (every node must agree).
    pub partitions: u32,
    /// Pin TTL (every node must agree).
    pub pin_ttl: Duration,
    /// Ack wait (every node must agree).
    pub ack_wait: Duration,
    /// Stream replicas (every node must agree).
    pub replicas: usize,
    /// How often the owners compact their partitions; `None`: the library's default.
    pub compaction_interval: Option<Duration>,
    /// How often the reporter logs the status.
    pub report_every: Duration,
    /// Where to serve `/metrics`, `/healthz` and `/readyz` (see [`crate::probe`]), if anywhere.
    pub metrics_addr: Option<String>,
    /// What the rules do beyond the first example's (every node must agree).
    pub features: Features,
}

impl NodeOptions {
    /// The shard configuration of this node.
    ///
    /// # Errors
    /// If a setting is out of range.
    pub fn shard_config(&self) -> anyhow::Result<ShardConfig> {
        Ok(self.settings(order::shard_config()).build()?)
    }

    /// The shard configuration of the inventory's system, if `--inventory`: the same settings.
    ///
    /// # Errors
    /// If a setting is out of range.
    pub fn inventory_config(&self) -> anyhow::Result<Option<ShardConfig>> {
        if !self.features.inventory {
            return Ok(None);
        }
        Ok(Some(self.settings(inventory::shard_config()).build()?))
    }

    /// This node's settings on an entity type's shared ones.
    fn settings(&self, shared: ShardConfigBuilder) -> ShardConfigBuilder {
        let config = shared
            .node_id(&self.node_id)
            .partitions(self.partitions)
            .pin_ttl(self.pin_ttl)
            .ack_wait(self.ack_wait)
            .replicas(self.replicas);
        match self.compaction_interval {
            Some(interval) => config.compaction_interval(interval),
            None => config,
        }
    }
}

/// Runs a node until SIGINT or SIGTERM (then shuts down gracefully and returns `Ok`), or
/// until its shard system has failed too often (then returns the error).
///
/// # Errors
/// If the configuration is invalid, the server cannot be reached, the shard system cannot
/// start (e.g. the streams exist with other settings), or it fails beyond its restart budget.
pub async fn run(options: NodeOptions) -> anyhow::Result<()> {
    let config = options.shard_config()?;
    let inventory = options.inventory_config()?;
    rules::configure(options.features)?;
    // Before the shard system starts: its owners register their series as they start.
    let recorder = match &options.metrics_addr {
        Some(_) => Some(probe::install_recorder()?),
        None => None,
    };
    let client = crate::connect(
        &options.nats_url,
        async_nats::ConnectOptions::new().name(format!("order-processor {}", options.node_id)),
    )
    .await?;
    let mut interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;

    let (exit, mut failed) = oneshot::channel();
    let args = RootArgs {
        client,
        config: config.clone(),
        inventory,
        report_every: options.report_every,
        exit,
    };
    let (root, root_done) = Actor::spawn(None, Root, args).await.map_err(|e| match e {
        // The root's start failed: its error says why (e.g. the streams exist with
        // other settings), better than the spawn error's wording.
        SpawnErr::StartupFailed(cause) => anyhow::anyhow!("cannot start the node: {cause}"),
        other => anyhow::anyhow!("cannot start the node: {other}"),
    })?;
    let _probe = match (&options.metrics_addr, recorder) {
        (Some(addr), Some(recorder)) => {
            let root = root.clone();
            let health = move || {
                let root = root.clone();
                async move {
                    match root
                        .call(RootMsg::Health, Some(Duration::from_secs(2)))
                        .await
                    {
                        Ok(ractor::rpc::CallResult::Success(health)) => health,
                        _ => None,
                    }
                }
            };
            let probe = probe::serve(addr, recorder, health).await?;
            tracing::info!(node = %options.node_id, addr = %probe.addr, "serving /metrics, /healthz and /readyz");
            Some(probe)
        }
        _ => None,
    };
    say(&NodeLine::Ready {
        node: options.node_id.clone(),
    });

    let failure = tokio::select! {
        _ = interrupt.recv() => None,
        _ = terminate.recv() => None,
        reason = &mut failed => Some(reason.unwrap_or_else(|_| "the root actor ended".to_owned())),
    };
    if let Some(reason) = failure {
        let _ = root_done.await;
        anyhow::bail!("node {} gave up: {reason}", options.node_id);
    }
    tracing::info!(node = %options.node_id, "shutting down: draining, acknowledging, unpinning");
    // jetshard's own bound is the ack wait plus 5 s; allow a margin over it.
    let grace = options.ack_wait + Duration::from_secs(10);
    let stopped = root.call(RootMsg::Shutdown, Some(grace)).await;
    if !matches!(stopped, Ok(ractor::rpc::CallResult::Success(()))) {
        tracing::warn!(node = %options.node_id, "graceful shutdown did not finish in {grace:?}");
        root.stop(Some("shutdown timed out".to_owned()));
    }
    let _ = root_done.await;
    say(&NodeLine::Stopped {
        node: options.node_id,
    });
    Ok(())
}

/// Prints one line for watchers on stdout, at once.
fn say(line: &NodeLine) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The application's root supervisor.
struct Root;

struct RootArgs {
    client: Client,
    config: ShardConfig,
    inventory: Option<ShardConfig>,
    report_every: Duration,
    exit: oneshot::Sender<String>,
}

enum RootMsg {
    /// The shard system's status, for the reporter.
    Status(RpcReplyPort<Vec<PartitionStatus>>),
    /// The shard system's health, for `/readyz`; `None` while none runs.
    Health(RpcReplyPort<Option<Health>>),
    /// Graceful shutdown; replies when done.
    Shutdown(RpcReplyPort<()>),
    /// Start the shard system again after it failed.
    RestartSystem,
}

struct RootState {
    client: Client,
    config: ShardConfig,
    /// The inventory's configuration, with `--inventory`.
    inventory_config: Option<ShardConfig>,
    report_every: Duration,
    /// The order's shard system.
    system: Option<ShardSystem>,
    /// The inventory's, with `--inventory`.
    inventory: Option<ShardSystem>,
    reporter: ActorRef<ReporterMsg>,
    /// Forwards the system's ownership events to the reporter.
    forwarder: Option<Forwarder>,
    failures: VecDeque<Instant>,
    stopping: bool,
    exit: Option<oneshot::Sender<String>>,
}

impl Actor for Root {
    type Msg = RootMsg;
    type State = RootState;
    type Arguments = RootArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<RootMsg>,
        args: RootArgs,
    ) -> Result<RootState, ActorProcessingErr> {
        let reporter = spawn_reporter(&myself, &args.config, args.report_every).await?;
        let mut state = RootState {
            client: args.client,
            config: args.config,
            inventory_config: args.inventory,
            report_every: args.report_every,
            system: None,
            inventory: None,
            reporter,
            forwarder: None,
            failures: VecDeque::new(),
            stopping: false,
            exit: Some(args.exit),
        };
        start_system(&myself, &mut state).await?;
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<RootMsg>,
        message: RootMsg,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            RootMsg::Status(reply) => {
                let status = match &state.system {
                    Some(system) => system.status().await.unwrap_or_default(),
                    None => Vec::new(),
                };
                let _ = reply.send(status);
            }
            RootMsg::Health(reply) => {
                let _ = reply.send(state.system.as_ref().map(ShardSystem::health));
            }
            RootMsg::Shutdown(reply) => {
                state.stopping = true;
                for system in [state.system.take(), state.inventory.take()]
                    .into_iter()
                    .flatten()
                {
                    if let Err(e) = system.shutdown().await {
                        tracing::warn!(error = %e, "shard system shutdown");
                    }
                }
                // Every release is in the channel by now: pass them on, then make sure the
                // reporter printed them (it answers a flush after what was queued before).
                if let Some(forwarder) = state.forwarder.take() {
                    forwarder.finish().await;
                }
                let _ = state
                    .reporter
                    .call(ReporterMsg::Flush, Some(Duration::from_secs(2)))
                    .await;
                let _ = reply.send(());
                myself.stop(Some("shutdown".to_owned()));
            }
            RootMsg::RestartSystem => {
                let inventory_up = state.inventory_config.is_none() || state.inventory.is_some();
                if state.stopping || (state.system.is_some() && inventory_up) {
                    return Ok(());
                }
                if let Err(e) = start_system(&myself, state).await {
                    tracing::error!(error = %e, "shard system did not start again");
                    system_failed(&myself, state, e.to_string());
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<RootMsg>,
        event: SupervisionEvent,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, reason) = match event {
            SupervisionEvent::ActorFailed(cell, error) => (cell, error.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell, reason.unwrap_or_else(|| "stopped".to_owned()))
            }
            _ => return Ok(()),
        };
        if state.stopping {
            return Ok(());
        }
        let id = cell.get_id();
        if id == state.reporter.get_id() {
            tracing::warn!(%reason, "reporter ended; restarting it");
            state.reporter = spawn_reporter(&myself, &state.config, state.report_every).await?;
            if let Some(system) = &state.system {
                state.forwarder = Some(Forwarder::start(system, state.reporter.clone()));
            }
            return Ok(());
        }
        if state
            .system
            .as_ref()
            .is_some_and(|s| s.actor().get_id() == id)
        {
            tracing::error!(node = %state.config.node_id(), %reason, "shard system failed");
            // Its partition owners are gone, so its pins lapse and the other nodes take over.
            state.system = None;
            state.forwarder = None;
            system_failed(&myself, state, reason);
        } else if state
            .inventory
            .as_ref()
            .is_some_and(|s| s.actor().get_id() == id)
        {
            tracing::error!(node = %state.config.node_id(), %reason, "inventory shard system failed");
            state.inventory = None;
            system_failed(&myself, state, reason);
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<RootMsg>,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        state.stopping = true;
        state.forwarder = None;
        myself.stop_children(Some("node stopped".to_owned()));
        Ok(())
    }
}

/// Decides what a failure of the shard system leads to: a restart after a pause, or, past
/// the restart budget, the end of the node.
fn system_failed(myself: &ActorRef<RootMsg>, state: &mut RootState, reason: String) {
    let now = Instant::now();
    state.failures.push_back(now);
    while state
        .failures
        .front()
        .is_some_and(|t| now.duration_since(*t) > SYSTEM_RESTART_WINDOW)
    {
        state.failures.pop_front();
    }
    if state.failures.len() > MAX_SYSTEM_RESTARTS {
        tracing::error!(
            failures = state.failures.len(),
            "shard system failed more than {MAX_SYSTEM_RESTARTS} times in {SYSTEM_RESTART_WINDOW:?}; giving up"
        );
        state.stopping = true;
        if let Some(exit) = state.exit.take() {
            let _ = exit.send(reason);
        }
        myself.stop(Some("shard system failed too often".to_owned()));
        return;
    }
    tracing::warn!(
        failures = state.failures.len(),
        "restarting the shard system in {SYSTEM_RESTART_DELAY:?}"
    );
    myself.send_after(SYSTEM_RESTART_DELAY, || RootMsg::RestartSystem);
}

/// Starts the shard systems that do not run, and the copies of their journals that `verify`
/// reads ([`keep_journal_copy`]). The inventory's first: an order's reservation is published
/// to `inventory.cmd.<sku>`, and must find the inventory's command stream there.
async fn start_system(
    myself: &ActorRef<RootMsg>,
    state: &mut RootState,
) -> Result<(), ActorProcessingErr> {
    let js = async_nats::jetstream::new(state.client.clone());
    if let (Some(config), None) = (&state.inventory_config, &state.inventory) {
        let system = ShardSystem::start_linked::<Inventory>(
            state.client.clone(),
            config.clone(),
            myself.get_cell(),
        )
        .await?;
        keep_journal_copy(&js, inventory::JOURNAL_STREAM).await?;
        state.inventory = Some(system);
    }
    if state.system.is_some() {
        return Ok(());
    }
    let system = ShardSystem::start_linked::<Order>(
        state.client.clone(),
        state.config.clone(),
        myself.get_cell(),
    )
    .await?;
    keep_journal_copy(&js, order::JOURNAL_STREAM).await?;
    state.forwarder = Some(Forwarder::start(&system, state.reporter.clone()));
    state.system = Some(system);
    Ok(())
}
