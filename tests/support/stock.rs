//! `Stock`: the saga's second entity type. A stock holds [`CAPACITY`] units; an order's
//! `Reserve` (sent by a ledger's outbox, `LedgerCmd::Order`) is reserved while units are left,
//! else refused, and either way answered through the stock's own outbox with
//! `LedgerCmd::Settle` to the ordering ledger. `ledger-node --stock on` runs it beside the
//! ledger.

use jetshard::{Codec, CodecError, Effects, Entity, Snapshots};
use serde::{Deserialize, Serialize};

use crate::ledger::LedgerCmd;

/// Units one stock entity holds.
pub const CAPACITY: u64 = 30;

/// The stock entity type.
pub struct Stock;

/// Its commands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum StockCmd {
    /// Reserve `qty` units for the order `order` of the ledger `reply_to`, and answer it.
    Reserve {
        order: u64,
        qty: u64,
        reply_to: String,
    },
}

/// Its events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StockEvt {
    /// `qty` units reserved for the order `order` of `reply_to`.
    Reserved {
        order: u64,
        qty: u64,
        reply_to: String,
    },
    /// The order `order` of `reply_to` refused: fewer than `qty` units left.
    Refused {
        order: u64,
        qty: u64,
        reply_to: String,
    },
}

/// A stock's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StockState {
    /// Units reserved.
    pub reserved: u64,
    /// Orders answered (reserved or refused).
    pub answered: u64,
}

impl Entity for Stock {
    type Command = StockCmd;
    type Event = StockEvt;
    type State = StockState;
    type Rejection = String;

    fn decide(state: &StockState, command: StockCmd) -> Result<Vec<StockEvt>, String> {
        Self::decide_with_effects(state, command, &mut Effects::new(Codec::Json))
    }

    fn decide_with_effects(
        state: &StockState,
        command: StockCmd,
        effects: &mut Effects,
    ) -> Result<Vec<StockEvt>, String> {
        let StockCmd::Reserve {
            order,
            qty,
            reply_to,
        } = command;
        let reserved = state.reserved + qty <= CAPACITY;
        effects.command("ledger", &reply_to, &LedgerCmd::Settle { order, reserved });
        Ok(vec![if reserved {
            StockEvt::Reserved {
                order,
                qty,
                reply_to,
            }
        } else {
            StockEvt::Refused {
                order,
                qty,
                reply_to,
            }
        }])
    }

    fn snapshots() -> Option<Snapshots<StockState>> {
        Some(Snapshots::serde(1))
    }

    fn encode_state(state: &StockState, codec: Codec) -> Result<Vec<u8>, CodecError> {
        codec.encode(state)
    }

    fn apply(state: &mut StockState, event: &StockEvt) {
        state.answered += 1;
        if let StockEvt::Reserved { qty, .. } = event {
            state.reserved += qty;
        }
    }
}

/// The stock's config beside [`crate::ledger_config`]: same partitions and node id, JSON,
/// snapshots every few events.
pub fn stock_config(partitions: u32, node: &str) -> jetshard::ShardConfigBuilder {
    // Never compacted, even where the ledger is: the saga's checker reads the stock's journal
    // whole (`model::check_effects`), against the ledger's.
    crate::config("stock", partitions, node)
        .compaction(false)
        .codec(Codec::Json)
        .retry_delay(std::time::Duration::from_millis(50))
        .snapshot_every(crate::snapshot_every())
}
