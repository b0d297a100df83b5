//! # order-processor: jetshard by example
//!
//! An actor-based order processor that runs on several nodes. Each order is a jetshard
//! [`Entity`](jetshard::Entity) ([`order`]): its commands are decided one at a time by the
//! actor of that order, inside the partition owned by exactly one node; when a node dies or
//! stalls, another takes its partitions over, fenced so that the stale one cannot write.
//!
//! Two flags of `node` show entities that do real work ([`rules`]): `--inventory` runs a second
//! entity type, [`inventory`], from which orders reserve their items (a saga: commands between
//! entities through jetshard's outbox), and `--payment-timeout <duration>` cancels unpaid
//! orders with a durable timer. Without them, the order's rules and events are the first
//! example's, exactly.
//!
//! The binary, `order-processor`, has one subcommand per module:
//!
//! | command | module | what it does |
//! |---|---|---|
//! | `node` | [`node`] | runs one node: the shard system embedded in a ractor supervision tree |
//! | `load` | [`load`] | publishes a realistic mix of commands for many orders |
//! | `status` | [`status`] | prints who owns which partition, backlogs, pauses |
//! | `get` | | prints an order's state, asked of its owner (a state query) |
//! | `verify` | [`verify`] | checks the journals against every command, the rules, the saga and the timers |
//! | `demo` | [`demo`] | a server, three nodes with both features, a load, a SIGKILL, a takeover, a verification |
//!
//! Run the demo with `scripts/demo` from the repository root (it installs `nats-server` first).
//! By hand, with a server on `nats://127.0.0.1:4222`:
//!
//! ```text
//! cargo run --release -p order-processor -- node --nats-url nats://127.0.0.1:4222 --node-id a
//! cargo run --release -p order-processor -- node --nats-url nats://127.0.0.1:4222 --node-id b
//! cargo run --release -p order-processor -- load --nats-url nats://127.0.0.1:4222 --orders 1000
//! cargo run --release -p order-processor -- status --nats-url nats://127.0.0.1:4222
//! cargo run --release -p order-processor -- verify --nats-url nats://127.0.0.1:4222
//! ```
//!
//! With the features, give every `node` and `verify` the same flags, e.g.
//! `--inventory --payment-timeout 30s`.
//!
//! On a clustered JetStream, give every command the servers comma-separated
//! (`--nats-url nats://a:4222,nats://b:4222,nats://c:4222`) and the nodes `--replicas 3`.
//!
//! [`nodes`] drives node processes from outside (the demo and the integration test use it).

use anyhow::Context as _;

/// Connects to the first of `urls` (comma-separated: the servers of a cluster) that answers;
/// the client learns the cluster's other servers from it and reconnects to them.
///
/// # Errors
/// If none of them can be reached.
pub async fn connect(
    urls: &str,
    options: async_nats::ConnectOptions,
) -> anyhow::Result<async_nats::Client> {
    let servers: Vec<&str> = urls
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .collect();
    options
        .connect(servers)
        .await
        .with_context(|| format!("connect to {urls}"))
}

pub mod demo;
pub mod inventory;
pub mod load;
pub mod node;
pub mod nodes;
pub mod order;
pub mod probe;
pub mod rules;
pub mod status;
pub mod verify;
