//! # jetshard
//!
//! Sharded stateful workers on NATS JetStream, built on ractor actors.
//!
//! An application defines its entities (an order, an account, a device) as an [`Entity`]: how a
//! command is decided into events, and how events change state. jetshard runs them across any
//! number of processes:
//!
//! - Entity ids hash to a fixed number of partitions (FNV-1a, as the server's `partition()`
//!   subject transform places them: [`partition_of`]).
//! - Each partition is a durable pull consumer with the `pinned_client` priority policy. In
//!   every process an owner actor per partition keeps pulling; the one the server pins owns the
//!   partition. It claims a new **generation** (a compare-and-set fence record), rebuilds the
//!   partition's state from the journal, and hands commands to one actor per entity.
//! - Every write carries the generation and is fenced by the server, so a stale owner can never
//!   write. A command is acknowledged only after its events are durable, and a redelivered
//!   command whose events were written is not applied twice.
//!
//! Start with [`ShardConfig::builder`] and [`ShardSystem::start`]; send commands with
//! [`CommandSender`] or any NATS client (see `docs/WIRE.md`).
//!
//! # Example
//!
//! An account entity, run by this process (start the same program on other machines and they
//! share the partitions), and one command sent and answered. It needs a `nats-server` 2.11+
//! with JetStream (`nats-server -js`).
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use jetshard::{CommandSender, Entity, Reply, ShardConfig, ShardSystem};
//! use serde::{Deserialize, Serialize};
//!
//! struct Account;
//!
//! #[derive(Serialize, Deserialize)]
//! enum Command { Deposit(u64), Withdraw(u64) }
//!
//! #[derive(Serialize, Deserialize)]
//! enum Event { Deposited(u64), Withdrew(u64) }
//!
//! impl Entity for Account {
//!     type Command = Command;
//!     type Event = Event;
//!     type State = u64; // the balance
//!     type Rejection = String;
//!
//!     fn decide(balance: &u64, command: Command) -> Result<Vec<Event>, String> {
//!         match command {
//!             Command::Deposit(n) => Ok(vec![Event::Deposited(n)]),
//!             Command::Withdraw(n) if n <= *balance => Ok(vec![Event::Withdrew(n)]),
//!             Command::Withdraw(_) => Err("insufficient funds".into()),
//!         }
//!     }
//!
//!     fn apply(balance: &mut u64, event: &Event) {
//!         match event {
//!             Event::Deposited(n) => *balance += n,
//!             Event::Withdrew(n) => *balance -= n,
//!         }
//!     }
//! }
//!
//! // `main` prints an error with Display (its words), not Debug (the struct).
//! #[tokio::main]
//! async fn main() -> std::process::ExitCode {
//!     match run().await {
//!         Ok(()) => std::process::ExitCode::SUCCESS,
//!         Err(e) => {
//!             eprintln!("error: {e}");
//!             std::process::ExitCode::FAILURE
//!         }
//!     }
//! }
//!
//! async fn run() -> Result<(), Box<dyn std::error::Error>> {
//!     // The re-exported client: the very version jetshard is built against.
//!     let client = jetshard::async_nats::connect("nats://127.0.0.1:4222").await?;
//!     let config = ShardConfig::builder("account").partitions(16).build()?;
//!     let system = ShardSystem::start::<Account>(client.clone(), config.clone()).await?;
//!
//!     let sender = CommandSender::<Account>::new(client, &config);
//!     // The reply in the entity's own types: the events written, or its rejection.
//!     let reply = sender
//!         .request("acc-17", &Command::Withdraw(500), Duration::from_secs(5))
//!         .await?;
//!     assert!(matches!(reply, Reply::Rejected { rejection, .. } if rejection == "insufficient funds"));
//!
//!     // Drains, acknowledges, and hands this process's partitions to the others at once.
//!     system.shutdown().await?;
//!     Ok(())
//! }
//! ```
//!
//! # Versions of async-nats and ractor
//!
//! Both appear in jetshard's signatures ([`ShardSystem::start`] takes an
//! [`async_nats::Client`], [`ShardSystem::start_linked`] a [`ractor::ActorCell`]) and are
//! re-exported: use `jetshard::async_nats` and `jetshard::ractor`, or depend on the same minor
//! versions (async-nats 0.51, ractor 0.16), so that the types are the same.
#![deny(missing_docs)]
#![warn(unreachable_pub)]

/// The NATS client jetshard is built on; its types appear in jetshard's API.
pub use async_nats;
/// The actor runtime jetshard is built on; its types appear in jetshard's API.
pub use ractor;

pub mod admin;
mod codec;
mod command;
mod config;
mod data;
mod entity;
mod error;
mod health;
mod journal;
pub mod journal_reader;
mod query;
mod reply;
mod retry;
mod runtime;
mod status;
mod system;
mod telemetry;
#[cfg(test)]
mod test_alloc;
#[cfg(test)]
mod test_entity;
#[cfg(test)]
mod test_events;
#[cfg(feature = "test-support")]
pub mod test_support;
mod trace;
pub mod wire;

pub use codec::Codec;
pub use command::{CommandSender, MAX_KEY_LEN};
pub use config::{CommandRetention, ShardConfig, ShardConfigBuilder};
pub use data::timers::MAX_TIMER_NAME_LEN;
pub use data::{CommandOutcome, EffectError, Effects};
pub use entity::{Entity, EntityId, MAX_ID_LEN, Snapshots};
pub use error::{CodecError, ConfigError, Error, InvalidId};
pub use health::{Health, PartitionHealth};
pub use journal::fence::{FenceRecord, FenceRecordError};
pub use journal_reader::{JournalReader, JournalRecord, RecordKind};
pub use query::{CurrentState, QueryAnswer};
pub use reply::Reply;
pub use status::{
    Loads, NodeStatus, OwnershipChange, OwnershipEvent, PartitionStatus, QuarantinedEntity,
};
pub use system::ShardSystem;
pub use trace::{SpanId, TraceId, TraceParent};
pub use wire::partition::partition_of;

/// The README's code, compiled as a doctest so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctest;

/// The guide's snippets (docs/guide.md), every Rust block compiled as a doctest so that they
/// stay true (excerpts of examples/order-processor with their context as hidden lines).
#[cfg(doctest)]
#[doc = include_str!("../../../docs/guide.md")]
struct GuideDoctest;
