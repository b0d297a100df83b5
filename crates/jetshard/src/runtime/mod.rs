//! The ownership runtime: the actors and tasks that run a process's share of the partitions.
//!
//! - [`owner`]: one actor per partition (pull, claim, route commands to entity actors, settle
//!   their outcomes, release).
//! - [`entity_actor`]: one actor per live entity (decide, write, apply, reply).
//! - [`pin`]: the pull loop of a partition's pinned consumer.
//! - [`crash`]: the watch that unpins a dead process's partitions.
//! - [`balance`]: membership and the fair share of partitions.
//! - [`timer`] and [`outbox`]: what a command sends later or elsewhere, after its events.
//! - [`compaction`]: each owner's background compaction of its partition's journal.
//! - [`topology`]: the streams and consumers a system needs, created or checked at start.
//! - [`leaders`]: a spread journal's stream leaders kept spread over the servers.
//!
//! Architecture Invariant: the runtime sits on the journal (`journal/`), the wire names
//! (`wire/`) and plain data (`data/`); nothing below it imports it. Only
//! [`ShardSystem`](crate::ShardSystem) starts it.

pub(crate) mod balance;
pub(crate) mod compaction;
pub(crate) mod crash;
pub(crate) mod entity_actor;
pub(crate) mod leaders;
pub(crate) mod outbox;
pub(crate) mod owner;
pub(crate) mod pin;
pub(crate) mod timer;
pub(crate) mod topology;
