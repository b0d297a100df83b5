//! The scenario's entity (the bench's commands and events, snapshots on) and its systems'
//! configuration.

use jetshard::{Entity, ShardConfig};
use serde::{Deserialize, Serialize};

use crate::entity::{BenchCmd, BenchEvt};

pub(super) const ENTITY_TYPE: &str = "recovery";
pub(super) const PARTITIONS: u32 = 8;

/// The bench entity (snapshots on, jetshard's default): the same commands and events as [`crate::entity`].
pub struct RecoveryEntity;

/// Its state.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct RecoveryState {
    /// Events applied.
    pub count: u64,
    /// The last `Stamped` value.
    pub last_at_ns: u64,
}

impl Entity for RecoveryEntity {
    type Command = BenchCmd;
    type Event = BenchEvt;
    type State = RecoveryState;
    type Rejection = String;

    fn decide(_: &RecoveryState, command: BenchCmd) -> Result<Vec<BenchEvt>, String> {
        Ok(command.events())
    }

    fn apply(state: &mut RecoveryState, event: &BenchEvt) {
        state.count += 1;
        if let BenchEvt::Stamped { at_ns } | BenchEvt::Padded { at_ns, .. } = event {
            state.last_at_ns = *at_ns;
        }
    }
}

pub(super) fn config(node: &str) -> jetshard::ShardConfigBuilder {
    ShardConfig::builder(ENTITY_TYPE)
        .partitions(PARTITIONS)
        .node_id(node)
        // Entities with ~10 events get a snapshot at their first command after a load.
        .snapshot_every(8)
}
