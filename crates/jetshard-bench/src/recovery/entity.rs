//! The scenario's entity ([`RecoveryEntity`]: the bench's commands and events, snapshots on)
//! and its systems' configuration.

use jetshard::ShardConfig;

pub use crate::entity::RecoveryEntity;

pub(super) const ENTITY_TYPE: &str = "recovery";
pub(super) const PARTITIONS: u32 = 8;

pub(super) fn config(node: &str) -> jetshard::ShardConfigBuilder {
    ShardConfig::builder(ENTITY_TYPE)
        .partitions(PARTITIONS)
        .node_id(node)
        // Entities with ~10 events get a snapshot at their first command after a load.
        .snapshot_every(8)
}
