//! The `inventory` entity (`node --inventory`): the stock of one product, reserved by orders.
//!
//! The saga, one durable step at a time (each an outbox message, sent once the event that
//! decided it is durable, and stored once by the target's command stream):
//!
//! ```text
//! order o-1                                  inventory sku-7
//!   AddItem { sku-7, qty 2 }
//!     -> ItemAdded       ── Reserve { o-1, line 0, qty 2 } ──>
//!                                              -> Reserved { o-1, 0, 2 }   (or OutOfStock)
//!                        <── Reserved { line 0 } ──────────
//!     -> ItemReserved { line 0 }                              (ItemUnavailable: o-1 cancelled)
//!   Cancel / PaymentDue (unpaid) / an item out of stock
//!     -> Cancelled / Expired / ItemUnavailable
//!                        ── Release { o-1, line 0 } ──>
//!                                              -> Released { o-1, 0, 2 }
//! ```
//!
//! Every product starts with [`STOCK`] units. A reservation is held per order line: a `Reserve`
//! for a line that is held is refused (jetshard stores an outbox message once within the command
//! stream's duplicate window; this guards a repeat after it), and a release gives back exactly
//! what the line held. Like the order, every command
//! leaves exactly one event, so the journal is a full audit trail; `verify` replays it.

use jetshard::ShardConfigBuilder;
use jetshard::{Codec, CodecError, CommandRetention, Effects, Entity, ShardConfig};
use serde::{Deserialize, Serialize};

use crate::order::{Never, OrderCommand};
use crate::rules::{self, Decision, Features, Message, Rules};

/// The entity type token: `INVENTORY_CMD`, `INVENTORY_JOURNAL`, `inventory.cmd.<sku>`.
pub const ENTITY_TYPE: &str = "inventory";

/// The command stream's name.
pub const COMMAND_STREAM: &str = "INVENTORY_CMD";

/// The journal stream's name.
pub const JOURNAL_STREAM: &str = "INVENTORY_JOURNAL";

/// The units of every product before any reservation.
pub const STOCK: u32 = 10;

/// The settings of the inventory's shard system: as the order's ([`crate::order::shard_config`]),
/// JSON (an order's commands to it are encoded with the order's codec) and commands kept for
/// `verify`.
pub fn shard_config() -> ShardConfigBuilder {
    ShardConfig::builder(ENTITY_TYPE)
        .codec(Codec::Json)
        .command_retention(CommandRetention::Limits)
}

/// The stock of one product; its id is the sku.
pub struct Inventory;

/// What orders ask of a product's stock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum InventoryCommand {
    /// Holds `qty` units for line `line` of `order`, if that many are left.
    Reserve {
        /// The order id: the answer goes to `order.cmd.<order>`.
        order: String,
        /// The order's item line.
        line: u32,
        /// How many.
        qty: u32,
    },
    /// Gives back what line `line` of `order` holds.
    Release {
        /// The order id.
        order: String,
        /// The order's item line.
        line: u32,
    },
}

/// What happened to a product's stock: one event per command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum InventoryEvent {
    /// Units held for an order line.
    Reserved {
        /// The order id.
        order: String,
        /// The order's item line.
        line: u32,
        /// How many.
        qty: u32,
    },
    /// Not enough units left: nothing held.
    OutOfStock {
        /// The order id.
        order: String,
        /// The order's item line.
        line: u32,
        /// How many were asked.
        qty: u32,
    },
    /// Units given back.
    Released {
        /// The order id.
        order: String,
        /// The order's item line.
        line: u32,
        /// How many.
        qty: u32,
    },
    /// The command was refused (a repeat), and why.
    Rejected {
        /// The reason.
        reason: String,
    },
}

impl InventoryEvent {
    /// The event's `type` tag, for counting.
    pub fn kind(&self) -> &'static str {
        match self {
            InventoryEvent::Reserved { .. } => "Reserved",
            InventoryEvent::OutOfStock { .. } => "OutOfStock",
            InventoryEvent::Released { .. } => "Released",
            InventoryEvent::Rejected { .. } => "Rejected",
        }
    }
}

/// Units held for one order line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// The order id.
    pub order: String,
    /// The order's item line.
    pub line: u32,
    /// How many.
    pub qty: u32,
}

/// A product's stock: what is held, by order line; the rest of [`STOCK`] is free.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryState {
    /// The holds, oldest first.
    pub holds: Vec<Hold>,
}

impl InventoryState {
    /// Units not held.
    pub fn free(&self) -> u32 {
        let held: u32 = self.holds.iter().map(|h| h.qty).sum();
        STOCK.saturating_sub(held)
    }

    fn hold(&self, order: &str, line: u32) -> Option<&Hold> {
        self.holds
            .iter()
            .find(|h| h.order == order && h.line == line)
    }
}

impl Inventory {
    /// The rules: each command's event, and the answer to the order.
    pub fn decision(state: &InventoryState, command: InventoryCommand) -> Decision<InventoryEvent> {
        use InventoryCommand as C;
        use InventoryEvent as E;
        match command {
            C::Reserve { order, line, .. } if state.hold(&order, line).is_some() => {
                Decision::event(E::Rejected {
                    reason: format!("line {line} of {order} is held already"),
                })
            }
            C::Reserve { order, line, qty } => {
                let (event, answer) = if qty <= state.free() {
                    let event = E::Reserved {
                        order: order.clone(),
                        line,
                        qty,
                    };
                    (event, OrderCommand::Reserved { line })
                } else {
                    let event = E::OutOfStock {
                        order: order.clone(),
                        line,
                        qty,
                    };
                    (event, OrderCommand::OutOfStock { line })
                };
                let mut decision = Decision::event(event);
                decision.messages.push(Message::Order {
                    order,
                    command: answer,
                });
                decision
            }
            C::Release { order, line } => match state.hold(&order, line) {
                Some(hold) => Decision::event(E::Released {
                    order,
                    line,
                    qty: hold.qty,
                }),
                None => Decision::event(E::Rejected {
                    reason: format!("line {line} of {order} holds nothing"),
                }),
            },
        }
    }
}

impl Rules for Inventory {
    const ENTITY_TYPE: &'static str = ENTITY_TYPE;

    fn decision(
        _: &Features,
        _: &str,
        state: &InventoryState,
        command: InventoryCommand,
    ) -> Decision<InventoryEvent> {
        Inventory::decision(state, command)
    }

    fn kind(event: &InventoryEvent) -> &'static str {
        event.kind()
    }
}

impl Entity for Inventory {
    type Command = InventoryCommand;
    type Event = InventoryEvent;
    type State = InventoryState;
    type Rejection = Never;

    fn decide(
        state: &InventoryState,
        command: InventoryCommand,
    ) -> Result<Vec<InventoryEvent>, Never> {
        Ok(vec![Inventory::decision(state, command).event])
    }

    fn decide_with_effects(
        state: &InventoryState,
        command: InventoryCommand,
        effects: &mut Effects,
    ) -> Result<Vec<InventoryEvent>, Never> {
        Ok(rules::decide::<Inventory>(state, command, effects))
    }

    fn apply(state: &mut InventoryState, event: &InventoryEvent) {
        match event {
            InventoryEvent::Reserved { order, line, qty } => state.holds.push(Hold {
                order: order.clone(),
                line: *line,
                qty: *qty,
            }),
            InventoryEvent::Released { order, line, .. } => state
                .holds
                .retain(|h| !(h.order == *order && h.line == *line)),
            InventoryEvent::OutOfStock { .. } | InventoryEvent::Rejected { .. } => {}
        }
    }

    fn encode_state(state: &InventoryState, codec: Codec) -> Result<Vec<u8>, CodecError> {
        codec.encode(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use InventoryCommand as C;
    use InventoryEvent as E;

    fn run(commands: impl IntoIterator<Item = C>) -> (Vec<Decision<E>>, InventoryState) {
        let mut state = InventoryState::default();
        let mut decisions = Vec::new();
        for command in commands {
            let decision = Inventory::decision(&state, command);
            Inventory::apply(&mut state, &decision.event);
            decisions.push(decision);
        }
        (decisions, state)
    }

    fn reserve(order: &str, line: u32, qty: u32) -> C {
        C::Reserve {
            order: order.into(),
            line,
            qty,
        }
    }

    #[test]
    fn a_reservation_holds_units_and_answers_the_order() {
        let (decisions, state) = run([reserve("o-1", 0, 3)]);
        assert_eq!(
            decisions[0].messages,
            [Message::Order {
                order: "o-1".into(),
                command: OrderCommand::Reserved { line: 0 }
            }]
        );
        assert_eq!(state.free(), STOCK - 3);
    }

    #[test]
    fn what_is_not_in_stock_is_refused_and_the_order_told() {
        let (decisions, state) = run([reserve("o-1", 0, STOCK - 1), reserve("o-2", 0, 2)]);
        assert_eq!(decisions[1].event.kind(), "OutOfStock");
        assert_eq!(
            decisions[1].messages,
            [Message::Order {
                order: "o-2".into(),
                command: OrderCommand::OutOfStock { line: 0 }
            }]
        );
        assert_eq!(state.free(), 1);
    }

    #[test]
    fn a_line_is_never_reserved_twice_and_a_release_gives_back_what_it_held() {
        let (decisions, state) = run([
            reserve("o-1", 0, 2),
            reserve("o-1", 0, 2),
            reserve("o-1", 1, 1),
            C::Release {
                order: "o-1".into(),
                line: 0,
            },
            C::Release {
                order: "o-1".into(),
                line: 0,
            },
        ]);
        assert_eq!(decisions[1].event.kind(), "Rejected");
        assert!(decisions[1].messages.is_empty(), "a repeat is not answered");
        assert_eq!(
            decisions[3].event,
            E::Released {
                order: "o-1".into(),
                line: 0,
                qty: 2
            }
        );
        assert_eq!(decisions[4].event.kind(), "Rejected");
        assert_eq!(state.free(), STOCK - 1);
    }

    #[test]
    fn the_wire_format_is_json_tagged_by_type() {
        let body = Codec::Json.encode(&reserve("o-1", 2, 3)).unwrap();
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"type":"Reserve","order":"o-1","line":2,"qty":3}"#
        );
    }
}
