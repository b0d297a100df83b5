//! The snapshot cost: commands/s draining a preloaded backlog with snapshots every 100 events
//! against snapshots off.

use std::time::Duration;

use jetshard::{ShardConfig, ShardSystem};
use jetshard_testkit::NatsServer;
use tokio::time::Instant;

use crate::load::{self, CommandPublisher};

use super::entity::{PARTITIONS, RecoveryEntity};

/// Commands per snapshot-cost pass, and the entities they go to.
pub(super) const COST_COMMANDS: usize = 20_000;
pub(super) const COST_ENTITIES: usize = 200;

/// The drain rates, snapshots on and off: the means and each round.
pub(super) struct Cost {
    pub(super) on: f64,
    pub(super) off: f64,
    pub(super) on_rounds: Vec<f64>,
    pub(super) off_rounds: Vec<f64>,
}

/// Commands/s draining a preloaded backlog, snapshots every 100 events against off, on an entity
/// type of its own; rounds alternate.
pub(super) async fn snapshot_cost(
    server: &NatsServer,
    client: &async_nats::Client,
) -> anyhow::Result<Cost> {
    const COST_TYPE: &str = "snapcost";
    let base = |node: &str| {
        ShardConfig::builder(COST_TYPE)
            .partitions(PARTITIONS)
            .node_id(node)
    };
    load::provision(client.clone(), base("provision").build()?).await?;
    let (mut on, mut off) = (Vec::new(), Vec::new());
    // Off, on, on, off, twice: a drift of the machine over the rounds (other tenants, the
    // streams growing) weighs on both sides alike; the means of each side are compared.
    for (round, snapshots) in [false, true, true, false, false, true, true, false]
        .into_iter()
        .enumerate()
    {
        // Entities of their own each round: every round loads never-seen entities (three
        // empty reads each), so the sides differ by the snapshot writes alone.
        let ids: Vec<String> = (0..COST_ENTITIES)
            .map(|i| format!("c{round}-{i}"))
            .collect();
        let publisher = CommandPublisher::for_ids(client.clone(), COST_TYPE, ids);
        publisher
            .preload(COST_COMMANDS, &load::preload_command(0))
            .await?;
        let config = if snapshots {
            base(&format!("cost-{round}")).snapshot_every(100)
        } else {
            base(&format!("cost-{round}"))
                .snapshot_every(0)
                .snapshot_on_passivation(false)
        };
        let started = Instant::now();
        let system =
            ShardSystem::start::<RecoveryEntity>(server.connect().await?, config.build()?).await?;
        let drained = load::wait_drained(client, COST_TYPE, Duration::from_secs(300)).await?;
        let rate = COST_COMMANDS as f64 / drained.duration_since(started).as_secs_f64();
        eprintln!("recovery snapshot cost round {round}: snapshots {snapshots}: {rate:.0} cmd/s");
        if snapshots {
            on.push(rate)
        } else {
            off.push(rate)
        }
        system.shutdown().await?;
    }
    let mean = |rates: &[f64]| rates.iter().sum::<f64>() / rates.len().max(1) as f64;
    Ok(Cost {
        on: mean(&on),
        off: mean(&off),
        on_rounds: on,
        off_rounds: off,
    })
}
