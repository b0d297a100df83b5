//! Shared helpers for the integration tests.
//!
//! Each test file is its own binary and pulls these in as the `jetshard_tests` library.
//! Servers, clusters, proxies and `wait_until` come from `jetshard-testkit`.

/// Sends `tracing` output to the test harness, which shows it for failing tests only.
///
/// The filter comes from `RUST_LOG` (e.g. `RUST_LOG=jetshard=debug`); without it only errors
/// are shown. Safe to call from every test: only the first call installs the subscriber.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

pub mod journal;
pub mod ledger;
pub mod node;
pub mod secure;

use std::time::Duration;

use jetshard::{ShardConfig, ShardSystem};

/// A config for the `ledger` test entity with short timings, JSON-encoded.
pub fn ledger_config(partitions: u32, node: &str) -> jetshard::ShardConfigBuilder {
    ShardConfig::builder("ledger")
        .partitions(partitions)
        .node_id(node)
        .codec(jetshard::Codec::Json)
        .pin_ttl(Duration::from_secs(1))
        .ack_wait(Duration::from_secs(3))
        .retry_delay(Duration::from_millis(50))
}

/// How many commands this system has applied, over all partitions.
pub async fn applied(system: &ShardSystem) -> u64 {
    system
        .status()
        .await
        .map(|s| s.iter().map(|p| p.applied + p.duplicates).sum())
        .unwrap_or(0)
}
