//! The `order` entity: its commands, events, state and rules.
//!
//! Commands and events are JSON objects tagged by `type`, so any NATS client can send a command
//! (`{"type":"Place","customer":"c-1"}` to `order.cmd.o-17`) and read the journal.
//!
//! Every command leaves exactly one event: what it did (`Placed`, `ItemAdded`, `Paid`,
//! `Shipped`, `Cancelled`), or `Rejected` with the reason. A refusal is an event rather than a
//! [`jetshard::Entity::Rejection`] (which writes nothing), so that the journal is a complete
//! audit trail of every decision; the `Rejection` type is therefore
//! [`Never`], which has no value. A body that is not a command at all never reaches
//! [`decide`](Order::decide): jetshard terminates it and writes a dead-letter record.
//!
//! The rules are pure functions, tested below without a server.

use std::fmt;

use jetshard::{Codec, CodecError, CommandRetention, Entity, ShardConfig, ShardConfigBuilder};
use serde::{Deserialize, Serialize};

/// The order's rejection: it has no value (refusals are `Rejected` events). An uninhabited
/// enum rather than `Infallible`, because a rejection travels in typed replies (serde).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Never {}

impl fmt::Display for Never {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {}
    }
}

/// The entity type token: it names the streams (`ORDER_CMD`, `ORDER_JOURNAL`), the subjects
/// (`order.cmd.<id>`, `order.evt.<p>.<id>`) and the consumers (`order-p<p>`).
pub const ENTITY_TYPE: &str = "order";

/// The command stream's name.
pub const COMMAND_STREAM: &str = "ORDER_CMD";

/// The journal stream's name.
pub const JOURNAL_STREAM: &str = "ORDER_JOURNAL";

/// The settings every process of the example shares: the entity type, the JSON codec, and
/// commands kept after acknowledgement (limits retention), so that `verify` can read every
/// command ever sent back from `ORDER_CMD` and hold the journal against it.
///
/// Nodes add their node id and timings. Every node must use the same partitions, pin TTL and
/// ack wait: the consumers are created with them, and a node with other values is refused at
/// start (`jetshard::Error::Incompatible`).
pub fn shard_config() -> ShardConfigBuilder {
    ShardConfig::builder(ENTITY_TYPE)
        .codec(Codec::Json)
        .command_retention(CommandRetention::Limits)
}

/// Checks that both streams exist: a node creates them when it first starts.
///
/// # Errors
/// If one is missing or the server does not answer.
pub async fn require_streams(js: &async_nats::jetstream::Context) -> anyhow::Result<()> {
    for stream in [COMMAND_STREAM, JOURNAL_STREAM] {
        js.get_stream(stream).await.map_err(|e| {
            anyhow::anyhow!("stream {stream}: {e} (start a node first: it creates the streams)")
        })?;
    }
    Ok(())
}

/// An order: placed once, filled with items, paid for the exact total, then shipped; or
/// cancelled before it ships.
pub struct Order;

/// What a client asks of an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum OrderCommand {
    /// Opens the order for a customer.
    Place {
        /// The customer's id.
        customer: String,
    },
    /// Adds `qty` of a product at a unit price.
    AddItem {
        /// The product.
        sku: String,
        /// How many; at least 1.
        qty: u32,
        /// The unit price, in cents.
        price_cents: u64,
    },
    /// Pays the order; the amount must equal the total.
    Pay {
        /// The amount paid, in cents.
        amount_cents: u64,
    },
    /// Ships a paid order.
    Ship,
    /// Cancels an order that has not shipped.
    Cancel,
}

/// What happened to an order: one event per command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum OrderEvent {
    /// The order was opened.
    Placed {
        /// The customer's id.
        customer: String,
    },
    /// An item was added.
    ItemAdded {
        /// The product.
        sku: String,
        /// How many.
        qty: u32,
        /// The unit price, in cents.
        price_cents: u64,
    },
    /// The order was paid.
    Paid {
        /// The amount paid, in cents.
        amount_cents: u64,
    },
    /// The order was shipped.
    Shipped,
    /// The order was cancelled.
    Cancelled,
    /// The command was refused, and why.
    Rejected {
        /// The broken rule.
        reason: String,
    },
}

impl OrderEvent {
    /// The event's `type` tag, for counting.
    pub fn kind(&self) -> &'static str {
        match self {
            OrderEvent::Placed { .. } => "Placed",
            OrderEvent::ItemAdded { .. } => "ItemAdded",
            OrderEvent::Paid { .. } => "Paid",
            OrderEvent::Shipped => "Shipped",
            OrderEvent::Cancelled => "Cancelled",
            OrderEvent::Rejected { .. } => "Rejected",
        }
    }
}

/// Where an order is in its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Not placed yet.
    #[default]
    New,
    /// Placed; items may be added; not paid.
    Open,
    /// Paid, not shipped.
    Paid,
    /// Shipped: final.
    Shipped,
    /// Cancelled: final.
    Cancelled,
}

/// An order's state, rebuilt from its events; read by `order-processor get` (JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderState {
    /// Where the order is.
    pub phase: Phase,
    /// Who placed it.
    pub customer: Option<String>,
    /// Number of item lines.
    pub lines: u32,
    /// The sum of `qty * price_cents` over the lines.
    pub total_cents: u64,
}

/// Why a command was refused; its text is the `reason` of the `Rejected` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `Place` on an order that was placed before.
    AlreadyPlaced,
    /// Any command but `Place` on an order never placed.
    NotPlaced,
    /// `AddItem` or `Pay` on a paid, shipped or cancelled order.
    NotOpen(Phase),
    /// `AddItem` with `qty` 0.
    ZeroQuantity,
    /// The total would not fit 64 bits.
    TotalTooLarge,
    /// `Pay` with no items.
    NoItems,
    /// `Pay` with another amount than the total.
    WrongAmount {
        /// The order's total.
        expected: u64,
        /// The amount offered.
        offered: u64,
    },
    /// `Ship` on an order that is not paid (or already shipped, or cancelled).
    NotShippable(Phase),
    /// `Cancel` on a shipped or cancelled order.
    NotCancellable(Phase),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::AlreadyPlaced => f.write_str("already placed"),
            Refusal::NotPlaced => f.write_str("not placed"),
            Refusal::NotOpen(phase) => write!(f, "order is {phase:?}, not open"),
            Refusal::ZeroQuantity => f.write_str("quantity must be at least 1"),
            Refusal::TotalTooLarge => f.write_str("total too large"),
            Refusal::NoItems => f.write_str("no items to pay for"),
            Refusal::WrongAmount { expected, offered } => {
                write!(f, "amount {offered} does not match total {expected}")
            }
            Refusal::NotShippable(phase) => write!(f, "order is {phase:?}, not paid"),
            Refusal::NotCancellable(phase) => write!(f, "order is {phase:?}, cannot cancel"),
        }
    }
}

impl Order {
    /// The rules: the event a command causes, or why it is refused.
    pub fn rule(state: &OrderState, command: OrderCommand) -> Result<OrderEvent, Refusal> {
        use OrderCommand as C;
        use Phase as P;
        match (state.phase, command) {
            (P::New, C::Place { customer }) => Ok(OrderEvent::Placed { customer }),
            (_, C::Place { .. }) => Err(Refusal::AlreadyPlaced),
            (P::New, _) => Err(Refusal::NotPlaced),

            (P::Open, C::AddItem { qty: 0, .. }) => Err(Refusal::ZeroQuantity),
            (
                P::Open,
                C::AddItem {
                    sku,
                    qty,
                    price_cents,
                },
            ) => {
                u64::from(qty)
                    .checked_mul(price_cents)
                    .and_then(|line| line.checked_add(state.total_cents))
                    .ok_or(Refusal::TotalTooLarge)?;
                Ok(OrderEvent::ItemAdded {
                    sku,
                    qty,
                    price_cents,
                })
            }
            (phase, C::AddItem { .. }) => Err(Refusal::NotOpen(phase)),

            (P::Open, C::Pay { .. }) if state.lines == 0 => Err(Refusal::NoItems),
            (P::Open, C::Pay { amount_cents }) if amount_cents != state.total_cents => {
                Err(Refusal::WrongAmount {
                    expected: state.total_cents,
                    offered: amount_cents,
                })
            }
            (P::Open, C::Pay { amount_cents }) => Ok(OrderEvent::Paid { amount_cents }),
            (phase, C::Pay { .. }) => Err(Refusal::NotOpen(phase)),

            (P::Paid, C::Ship) => Ok(OrderEvent::Shipped),
            (phase, C::Ship) => Err(Refusal::NotShippable(phase)),

            (P::Open | P::Paid, C::Cancel) => Ok(OrderEvent::Cancelled),
            (phase, C::Cancel) => Err(Refusal::NotCancellable(phase)),
        }
    }
}

impl Entity for Order {
    type Command = OrderCommand;
    type Event = OrderEvent;
    type State = OrderState;
    /// Refusals are `Rejected` events, so `decide` never fails.
    type Rejection = Never;

    fn decide(state: &OrderState, command: OrderCommand) -> Result<Vec<OrderEvent>, Never> {
        let event = Order::rule(state, command).unwrap_or_else(|refusal| OrderEvent::Rejected {
            reason: refusal.to_string(),
        });
        Ok(vec![event])
    }

    fn encode_state(state: &OrderState, codec: Codec) -> Result<Vec<u8>, CodecError> {
        codec.encode(state)
    }

    fn apply(state: &mut OrderState, event: &OrderEvent) {
        match event {
            OrderEvent::Placed { customer } => {
                state.phase = Phase::Open;
                state.customer = Some(customer.clone());
            }
            OrderEvent::ItemAdded {
                qty, price_cents, ..
            } => {
                state.lines += 1;
                // `rule` refused anything that would overflow; saturate rather than panic on a
                // journal written by other rules.
                state.total_cents = state
                    .total_cents
                    .saturating_add(u64::from(*qty).saturating_mul(*price_cents));
            }
            OrderEvent::Paid { .. } => state.phase = Phase::Paid,
            OrderEvent::Shipped => state.phase = Phase::Shipped,
            OrderEvent::Cancelled => state.phase = Phase::Cancelled,
            OrderEvent::Rejected { .. } => {}
        }
    }
}

/// Runs commands through the rules from a new order, as jetshard does one at a time, and
/// returns the events and the final state.
pub fn run(commands: impl IntoIterator<Item = OrderCommand>) -> (Vec<OrderEvent>, OrderState) {
    let mut state = OrderState::default();
    let mut events = Vec::new();
    for command in commands {
        let Ok(decided) = Order::decide(&state, command);
        for event in decided {
            Order::apply(&mut state, &event);
            events.push(event);
        }
    }
    (events, state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use OrderCommand as C;
    use OrderEvent as E;

    fn place() -> C {
        C::Place {
            customer: "c-1".into(),
        }
    }

    fn add(qty: u32, price_cents: u64) -> C {
        C::AddItem {
            sku: "sku-1".into(),
            qty,
            price_cents,
        }
    }

    fn rejected(refusal: Refusal) -> E {
        E::Rejected {
            reason: refusal.to_string(),
        }
    }

    #[test]
    fn a_paid_order_ships() {
        let (events, state) = run([
            place(),
            add(2, 150),
            add(1, 700),
            C::Pay { amount_cents: 1000 },
            C::Ship,
        ]);
        assert_eq!(events.last(), Some(&E::Shipped));
        assert!(events.iter().all(|e| !matches!(e, E::Rejected { .. })));
        assert_eq!(state.phase, Phase::Shipped);
        assert_eq!(state.total_cents, 1000);
        assert_eq!(state.lines, 2);
    }

    #[test]
    fn every_command_leaves_exactly_one_event() {
        let commands = vec![place(), place(), C::Ship, add(0, 5), C::Cancel, C::Cancel];
        let (events, _) = run(commands.clone());
        assert_eq!(events.len(), commands.len());
    }

    #[test]
    fn an_order_is_placed_only_once() {
        let (events, _) = run([place(), place()]);
        assert_eq!(events[1], rejected(Refusal::AlreadyPlaced));
    }

    #[test]
    fn nothing_but_place_is_accepted_before_place() {
        for command in [add(1, 1), C::Pay { amount_cents: 0 }, C::Ship, C::Cancel] {
            let (events, state) = run([command]);
            assert_eq!(events, vec![rejected(Refusal::NotPlaced)]);
            assert_eq!(state, OrderState::default());
        }
    }

    #[test]
    fn items_need_a_quantity_and_an_open_order() {
        let (events, _) = run([place(), add(0, 100)]);
        assert_eq!(events[1], rejected(Refusal::ZeroQuantity));
        let (events, _) = run([
            place(),
            add(1, 100),
            C::Pay { amount_cents: 100 },
            add(1, 1),
        ]);
        assert_eq!(events[3], rejected(Refusal::NotOpen(Phase::Paid)));
        let (events, _) = run([place(), C::Cancel, add(1, 1)]);
        assert_eq!(events[2], rejected(Refusal::NotOpen(Phase::Cancelled)));
    }

    #[test]
    fn a_total_that_overflows_is_refused() {
        let (events, state) = run([place(), add(2, u64::MAX / 2 + 1)]);
        assert_eq!(events[1], rejected(Refusal::TotalTooLarge));
        assert_eq!(state.total_cents, 0);
    }

    #[test]
    fn payment_must_match_the_total_of_at_least_one_item() {
        let (events, _) = run([place(), C::Pay { amount_cents: 0 }]);
        assert_eq!(events[1], rejected(Refusal::NoItems));
        let (events, state) = run([place(), add(3, 100), C::Pay { amount_cents: 299 }]);
        assert_eq!(
            events[2],
            rejected(Refusal::WrongAmount {
                expected: 300,
                offered: 299
            })
        );
        assert_eq!(state.phase, Phase::Open);
        let (events, _) = run([
            place(),
            add(3, 100),
            C::Pay { amount_cents: 300 },
            C::Pay { amount_cents: 300 },
        ]);
        assert_eq!(events[3], rejected(Refusal::NotOpen(Phase::Paid)));
    }

    #[test]
    fn only_a_paid_order_ships_and_only_once() {
        let (events, _) = run([place(), add(1, 5), C::Ship]);
        assert_eq!(events[2], rejected(Refusal::NotShippable(Phase::Open)));
        let (events, _) = run([
            place(),
            add(1, 5),
            C::Pay { amount_cents: 5 },
            C::Ship,
            C::Ship,
        ]);
        assert_eq!(events[3], E::Shipped);
        assert_eq!(events[4], rejected(Refusal::NotShippable(Phase::Shipped)));
    }

    #[test]
    fn cancel_is_allowed_until_shipped_and_only_once() {
        let (events, state) = run([place(), add(1, 5), C::Pay { amount_cents: 5 }, C::Cancel]);
        assert_eq!(events[3], E::Cancelled);
        assert_eq!(state.phase, Phase::Cancelled);
        let (events, _) = run([place(), C::Cancel, C::Cancel]);
        assert_eq!(
            events[2],
            rejected(Refusal::NotCancellable(Phase::Cancelled))
        );
        let (events, _) = run([
            place(),
            add(1, 5),
            C::Pay { amount_cents: 5 },
            C::Ship,
            C::Cancel,
        ]);
        assert_eq!(events[4], rejected(Refusal::NotCancellable(Phase::Shipped)));
        let (events, _) = run([place(), C::Cancel, C::Ship]);
        assert_eq!(events[2], rejected(Refusal::NotShippable(Phase::Cancelled)));
    }

    #[test]
    fn the_wire_format_is_json_tagged_by_type() {
        let command: OrderCommand =
            serde_json::from_str(r#"{"type":"Place","customer":"c-1"}"#).unwrap();
        assert_eq!(command, place());
        let command: OrderCommand = serde_json::from_str(r#"{"type":"Ship"}"#).unwrap();
        assert_eq!(command, C::Ship);
        let command: OrderCommand =
            serde_json::from_str(r#"{"type":"AddItem","sku":"s","qty":2,"price_cents":5}"#)
                .unwrap();
        assert_eq!(
            command,
            C::AddItem {
                sku: "s".into(),
                qty: 2,
                price_cents: 5
            }
        );
        let event = Codec::Json
            .encode(&E::Rejected {
                reason: "not placed".into(),
            })
            .unwrap();
        assert_eq!(
            String::from_utf8(event).unwrap(),
            r#"{"type":"Rejected","reason":"not placed"}"#
        );
    }

    #[test]
    fn bodies_that_are_not_commands_do_not_decode() {
        for body in [
            &b"not json"[..],
            br#"{"type":"Teleport"}"#,
            br#"{"type":"AddItem","sku":"s"}"#,
            br#"{"type":"AddItem","sku":"s","qty":-1,"price_cents":5}"#,
            br#"{"customer":"c-1"}"#,
        ] {
            assert!(
                Codec::Json.decode::<OrderCommand>(body).is_err(),
                "{body:?}"
            );
        }
    }

    #[test]
    fn the_shared_config_is_valid() {
        let config = shard_config().node_id("n").build().unwrap();
        assert_eq!(config.entity_type(), ENTITY_TYPE);
        assert_eq!(config.codec(), Codec::Json);
    }
}
