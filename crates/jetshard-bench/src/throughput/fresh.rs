//! The first command of never-seen entities: what jetshard's load of an empty history costs.

use std::time::Duration;

use anyhow::Context as _;
use jetshard::{ShardConfig, ShardSystem};
use serde::Serialize;
use tokio::time::Instant;

use crate::drain::ENTITY_TYPE;
use crate::entity::BenchEntity;
use crate::load::{self, CommandPublisher, Gate};

/// What became of the first commands of never-seen entities.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FreshRun {
    /// Entities (one command each).
    pub entities: usize,
    /// Seconds until every command was acknowledged or given up, or the timeout.
    pub secs: f64,
    /// Whether the stream drained within the timeout.
    pub drained: bool,
    /// Commands applied.
    pub applied: u64,
    /// Commands given up (dead-lettered) after failing at every delivery.
    pub dead_lettered: u64,
}

/// One command to each of `entities` entities that have no event yet: each first command
/// makes jetshard replay the entity's empty history from the journal.
pub async fn fresh_entities(
    partitions: u32,
    entities: usize,
    command_bytes: usize,
) -> anyhow::Result<FreshRun> {
    const TIMEOUT: Duration = Duration::from_secs(90);
    let server = crate::server::nats_server().await?;
    let control = server.connect().await?;
    let config = ShardConfig::builder(ENTITY_TYPE)
        .partitions(partitions)
        .node_id("bench")
        .build()?;
    let system = ShardSystem::start::<BenchEntity>(server.connect().await?, config)
        .await
        .context("start the shard system")?;
    let gate = Gate::new(control.clone(), ENTITY_TYPE, partitions);
    gate.close().await?;
    let ids = (0..entities).map(|i| format!("fresh{i}")).collect();
    CommandPublisher::for_ids(control.clone(), ENTITY_TYPE, ids)
        .preload(entities, &load::preload_command(command_bytes))
        .await?;
    let started = Instant::now();
    gate.open().await?;
    let drained = load::wait_drained(&control, ENTITY_TYPE, TIMEOUT).await;
    let secs = started.elapsed().as_secs_f64();
    let status = system.status().await.unwrap_or_default();
    super::report_loads("never-seen entities", &status);
    system.shutdown().await.context("shut the system down")?;
    Ok(FreshRun {
        entities,
        secs,
        drained: drained.is_ok(),
        applied: status.iter().map(|p| p.applied).sum(),
        dead_lettered: status.iter().map(|p| p.dead_lettered).sum(),
    })
}
