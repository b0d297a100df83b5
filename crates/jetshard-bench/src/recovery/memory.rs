//! The memory passes: known entities touched once each and passivated, with a dormant budget
//! and without one.

use std::time::Duration;

use jetshard::ShardSystem;
use tokio::time::Instant;

use crate::entity::BenchCmd;
use crate::load::{self, CommandPublisher};

use super::entity::{ENTITY_TYPE, RecoveryEntity, config};

/// Entities touched in the memory passes.
pub(super) const MEMORY_ENTITIES: usize = 5_000;
/// The dormant budget of the bounded memory pass.
pub(super) const DORMANT_BUDGET: usize = 500;

/// What the two passes left: dormant states held and RSS growth of this process.
pub(super) struct Memory {
    pub(super) bounded_dormant: usize,
    pub(super) unbounded_dormant: usize,
    pub(super) bounded_rss_kb: u64,
    pub(super) unbounded_rss_kb: u64,
}

/// Touches [`MEMORY_ENTITIES`] known entities (each loaded from the journal), passivated at once,
/// with a dormant budget and without one (other entities each pass, past the first `skip` of
/// `ids`).
pub(super) async fn memory_passes(
    client: &async_nats::Client,
    ids: &[String],
    skip: usize,
) -> anyhow::Result<Memory> {
    let mut dormant = [0usize; 2];
    let mut rss = [0u64; 2];
    for (pass, budget) in [Some(DORMANT_BUDGET), None].into_iter().enumerate() {
        let base = skip + pass * MEMORY_ENTITIES;
        let touched: Vec<String> = ids
            .iter()
            .cycle()
            .skip(base)
            .take(MEMORY_ENTITIES)
            .cloned()
            .collect();
        let mut builder = config(&format!("memory-{pass}"))
            .snapshot_every(0)
            .passivate_after(Duration::from_millis(200));
        builder = match budget {
            Some(budget) => builder.max_dormant_entities(budget),
            None => builder.dormant_entity_budget(false),
        };
        let system = ShardSystem::start::<RecoveryEntity>(client.clone(), builder.build()?).await?;
        let before = rss_kb();
        let publisher = CommandPublisher::for_ids(client.clone(), ENTITY_TYPE, touched.clone());
        let mut window = load::AckWindow::default();
        for i in 0..touched.len() {
            window
                .push(publisher.send_to(i, &BenchCmd::Touch).await?)
                .await?;
        }
        window.drain().await?;
        load::wait_drained(client, ENTITY_TYPE, Duration::from_secs(300)).await?;
        // Every actor passivated.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = system.status().await?;
            let resident: usize = status.iter().map(|p| p.resident_entities).sum();
            if resident == 0 || Instant::now() > deadline {
                dormant[pass] = status.iter().map(|p| p.dormant_entities).sum();
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        rss[pass] = rss_kb().saturating_sub(before);
        eprintln!(
            "recovery memory, budget {budget:?}: {} dormant states, RSS +{} KB",
            dormant[pass], rss[pass]
        );
        system.shutdown().await?;
    }
    Ok(Memory {
        bounded_dormant: dormant[0],
        unbounded_dormant: dormant[1],
        bounded_rss_kb: rss[0],
        unbounded_rss_kb: rss[1],
    })
}

/// This process's resident set, KB (0 where /proc is not there).
fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}
