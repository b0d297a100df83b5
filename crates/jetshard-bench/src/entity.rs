//! The bench entity: as small as an entity can be, so that what is measured is the framework.

use jetshard::{Entity, Snapshots};
use serde::{Deserialize, Serialize};

/// The entity every scenario runs, with jetshard's defaults untouched (snapshots on).
pub struct BenchEntity;

/// Its commands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum BenchCmd {
    /// Emit one `Stamped` event carrying `at_ns` (the latency scenario's send time).
    Stamp { at_ns: u64 },
    /// [`Stamp`](Self::Stamp) with `pad` bytes carried into its event (`Padded`), so that a
    /// command and its event weigh what the scenario asks (`--command-bytes`).
    Padded { at_ns: u64, pad: Vec<u8> },
    /// Emit no event: the command is applied and acknowledged without a journal write
    /// (the memory scenario activates entities with it).
    Touch,
}

/// Its events.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum BenchEvt {
    /// A `Stamp` command was applied.
    Stamped { at_ns: u64 },
    /// A `Padded` command was applied.
    Padded { at_ns: u64, pad: Vec<u8> },
    /// Sets the entity's blob: the memory scenario's "small state".
    Filled { blob: Vec<u8> },
}

/// Its state: a counter, the last stamp, and an optional blob.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct BenchState {
    /// Events applied.
    pub count: u64,
    /// The last `Stamped` value.
    pub last_at_ns: u64,
    /// The last `Filled` blob.
    pub blob: Vec<u8>,
}

impl Entity for BenchEntity {
    type Command = BenchCmd;
    type Event = BenchEvt;
    type State = BenchState;
    type Rejection = String;

    fn decide(_: &BenchState, command: BenchCmd) -> Result<Vec<BenchEvt>, String> {
        Ok(command.events())
    }

    fn apply(state: &mut BenchState, event: &BenchEvt) {
        state.count += 1;
        match event {
            BenchEvt::Stamped { at_ns } | BenchEvt::Padded { at_ns, .. } => {
                state.last_at_ns = *at_ns
            }
            BenchEvt::Filled { blob } => state.blob.clone_from(blob),
        }
    }
}

/// The bench entity without snapshots (it opts out: [`Entity::snapshots`] returns `None`): each
/// load of an entity replays its whole history. The comparison for jetshard's default
/// ([`BenchEntity`], which writes snapshots every 100 events, on passivation and when a
/// partition is handed over).
pub struct UnsnapshottedBenchEntity;

impl Entity for UnsnapshottedBenchEntity {
    type Command = BenchCmd;
    type Event = BenchEvt;
    type State = BenchState;
    type Rejection = String;

    fn decide(state: &BenchState, command: BenchCmd) -> Result<Vec<BenchEvt>, String> {
        BenchEntity::decide(state, command)
    }

    fn apply(state: &mut BenchState, event: &BenchEvt) {
        BenchEntity::apply(state, event);
    }

    fn snapshots() -> Option<Snapshots<BenchState>> {
        None
    }
}

impl BenchCmd {
    /// What the bench entity decides on it, whatever its state.
    pub fn events(self) -> Vec<BenchEvt> {
        match self {
            BenchCmd::Stamp { at_ns } => vec![BenchEvt::Stamped { at_ns }],
            BenchCmd::Padded { at_ns, pad } => vec![BenchEvt::Padded { at_ns, pad }],
            BenchCmd::Touch => Vec::new(),
        }
    }

    /// A stamp carrying `at_ns` whose encoding (bincode) is about `bytes` long: a
    /// [`Padded`](Self::Padded) one, or the bare [`Stamp`](Self::Stamp) for 0.
    pub fn stamp_of_size(at_ns: u64, bytes: usize) -> Self {
        if bytes == 0 {
            return BenchCmd::Stamp { at_ns };
        }
        // The variant, `at_ns` and the pad's length take at most 11 bytes.
        let pad = vec![b'x'; bytes.saturating_sub(11)];
        BenchCmd::Padded { at_ns, pad }
    }
}

/// The id of the `index`th bench entity.
pub fn entity_id(index: usize) -> String {
    format!("e{index}")
}
