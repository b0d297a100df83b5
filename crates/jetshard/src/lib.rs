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
#![deny(missing_docs)]

pub mod admin;
mod balance;
mod codec;
mod command;
mod config;
mod entity;
mod entity_actor;
mod error;
mod fence;
mod journal;
mod owner;
mod partition;
mod pin;
mod retry;
mod status;
mod system;
mod topology;
pub mod wire;

pub use codec::Codec;
pub use command::{CommandOutcome, CommandSender, MAX_KEY_LEN};
pub use config::{CommandRetention, ShardConfig, ShardConfigBuilder};
pub use entity::{Entity, EntityId, MAX_ID_LEN};
pub use error::{CodecError, ConfigError, Error, InvalidId};
pub use fence::{FenceRecord, FenceRecordError, HeldRange, Trial};
pub use partition::{fnv1a_32, partition_of};
pub use status::{NodeStatus, OwnershipChange, OwnershipEvent, PartitionStatus, QuarantinedEntity};
pub use system::ShardSystem;

/// The README's code, compiled as a doctest so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctest;
