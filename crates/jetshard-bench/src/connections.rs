//! How many connections the system under test runs on (`JETSHARD_BENCH_SPLIT`, an experiment
//! of stop 38): unset, one; `writes`, `acks`, `pulls` (comma-separated) put that traffic on a
//! second connection to the same server.

use anyhow::Context as _;
use jetshard::{Entity, ShardConfig, ShardSystem, Split};
use jetshard_testkit::NatsServer;

/// The split `JETSHARD_BENCH_SPLIT` asks for; `None` when unset or empty.
pub fn split() -> Option<Split> {
    let value = std::env::var("JETSHARD_BENCH_SPLIT").ok()?;
    let mut split = Split::default();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part {
            "writes" => split.writes = true,
            "acks" => split.acks = true,
            "pulls" => split.pulls = true,
            other => eprintln!("JETSHARD_BENCH_SPLIT: unknown part {other:?}, ignored"),
        }
    }
    (split.writes || split.acks || split.pulls).then_some(split)
}

/// Starts `E`'s system on `client`, and on a second connection to `server` if
/// `JETSHARD_BENCH_SPLIT` asks for one (its messages counted with `client`'s).
pub async fn start<E: Entity>(
    server: &NatsServer,
    client: async_nats::Client,
    config: ShardConfig,
) -> anyhow::Result<ShardSystem> {
    let system = match split() {
        None => ShardSystem::start::<E>(client, config).await,
        Some(split) => {
            eprintln!("system on two connections: {split:?}");
            let second = server.connect().await?;
            crate::messages::watch_also(&second);
            ShardSystem::start_split::<E>(client, second, split, config).await
        }
    };
    system.context("start the shard system")
}
