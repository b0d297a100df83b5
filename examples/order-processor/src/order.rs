//! The `order` entity: its commands, events, state and rules.
//!
//! Commands and events are JSON objects tagged by `type`, so any NATS client can send a command
//! (`{"type":"Place","customer":"c-1"}` to `order.cmd.o-17`) and read the journal.
//!
//! Every command leaves exactly one event: what it did (`Placed`, `ItemAdded`, `Paid`,
//! `Shipped`, `Cancelled`; with the features of [`crate::rules`], also `ItemReserved`,
//! `ItemUnavailable`, `Expired`), or `Rejected` with the reason. A refusal is an event rather than a
//! [`jetshard::Entity::Rejection`] (which writes nothing), so that the journal is a complete
//! audit trail of every decision; the `Rejection` type is therefore
//! [`Never`], which has no value. A body that is not a command at all never reaches
//! [`decide`](Order::decide): jetshard terminates it and writes a dead-letter record.
//!
//! The rules are pure functions, tested below without a server: [`Order::rule`] is the first
//! example's phase x command table; [`Order::decision`] adds what the features
//! ([`crate::rules::Features`]) make an event cause: a reservation per item (`--inventory`), a
//! payment timer (`--payment-timeout`), and their compensations.

use std::fmt;

use jetshard::{
    Codec, CodecError, CommandRetention, Effects, Entity, ShardConfig, ShardConfigBuilder,
};
use serde::{Deserialize, Serialize};

use crate::inventory::InventoryCommand;
use crate::rules::{self, Decision, Features, Message, Rules, Timer};

/// The name of the order's payment timer (`--payment-timeout`).
pub const PAYMENT_TIMER: &str = "payment";

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
        // `verify` holds the whole journal (timer and outbox records included) against every
        // command: nothing may be compacted away.
        .compaction(false)
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
    /// From the inventory (`--inventory`): item `line` is reserved.
    Reserved {
        /// The item's line, from 0, in the order it was added.
        line: u32,
    },
    /// From the inventory (`--inventory`): item `line` is out of stock; the order is cancelled.
    OutOfStock {
        /// The item's line.
        line: u32,
    },
    /// From the order's own payment timer (`--payment-timeout`): cancels the order if unpaid.
    PaymentDue,
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
    /// An item was reserved by the inventory.
    ItemReserved {
        /// The item's line.
        line: u32,
    },
    /// An item was out of stock: the order is cancelled, if it was open or paid.
    ItemUnavailable {
        /// The item's line.
        line: u32,
    },
    /// The order was not paid in time: cancelled by its payment timer.
    Expired,
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
            OrderEvent::ItemReserved { .. } => "ItemReserved",
            OrderEvent::ItemUnavailable { .. } => "ItemUnavailable",
            OrderEvent::Expired => "Expired",
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
    /// The items, by line.
    #[serde(default)]
    pub items: Vec<Item>,
}

impl OrderState {
    /// The lines whose items the inventory reserved.
    pub fn reserved(&self) -> impl Iterator<Item = (u32, &Item)> {
        (0..)
            .zip(&self.items)
            .filter(|(_, item)| item.stock == Stock::Reserved)
    }
}

/// One item line of an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    /// The product.
    pub sku: String,
    /// How many.
    pub qty: u32,
    /// What the inventory answered.
    pub stock: Stock,
}

/// What the inventory answered for an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stock {
    /// No answer (yet; always, without `--inventory`).
    Unconfirmed,
    /// Reserved for the order.
    Reserved,
    /// Out of stock.
    Unavailable,
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
    /// `Ship` before the inventory reserved every item (`--inventory`).
    NotReserved,
    /// An answer of the inventory about a line the order does not have.
    NoSuchLine(u32),
    /// An answer of the inventory about a line it answered before.
    LineAnswered(u32),
    /// A command of a feature the node runs without (its flag).
    FeatureOff(&'static str),
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
            Refusal::NotReserved => f.write_str("items not all reserved yet"),
            Refusal::NoSuchLine(line) => write!(f, "no item line {line}"),
            Refusal::LineAnswered(line) => write!(f, "item line {line} was answered before"),
            Refusal::FeatureOff(flag) => write!(f, "{flag} is off"),
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

            (_, C::Reserved { line }) => {
                Self::unanswered(state, line).map(|()| OrderEvent::ItemReserved { line })
            }
            (_, C::OutOfStock { line }) => {
                Self::unanswered(state, line).map(|()| OrderEvent::ItemUnavailable { line })
            }

            (P::Open, C::PaymentDue) => Ok(OrderEvent::Expired),
            (phase, C::PaymentDue) => Err(Refusal::NotOpen(phase)),
        }
    }

    fn unanswered(state: &OrderState, line: u32) -> Result<(), Refusal> {
        let item = usize::try_from(line)
            .ok()
            .and_then(|i| state.items.get(i))
            .ok_or(Refusal::NoSuchLine(line))?;
        match item.stock {
            Stock::Unconfirmed => Ok(()),
            Stock::Reserved | Stock::Unavailable => Err(Refusal::LineAnswered(line)),
        }
    }

    /// The rules with `features`: [`rule`](Self::rule)'s event (a refusal as `Rejected`), and
    /// what else it causes for order `id`. Without features, exactly `rule`.
    ///
    /// - `--inventory`: an added item is reserved from the inventory of its product; an order
    ///   ships only once every item is reserved; an order that ends unshipped (cancelled, out of
    ///   stock, expired) releases what it holds, and a reservation answered after it ended is
    ///   released at once.
    /// - `--payment-timeout`: placing arms the payment timer, which sends `PaymentDue`; paying,
    ///   or the order's end while open, disarms it.
    ///
    /// The commands of a feature that is off (`Reserved`, `OutOfStock`, `PaymentDue`) are
    /// refused. (With it on, they are commands like any other: who may publish to
    /// `order.cmd.*` is a matter of permissions, docs/SECURITY.md.)
    pub fn decision(
        features: &Features,
        id: &str,
        state: &OrderState,
        command: OrderCommand,
    ) -> Decision<OrderEvent> {
        let off = match command {
            OrderCommand::Reserved { .. } | OrderCommand::OutOfStock { .. }
                if !features.inventory =>
            {
                Some("--inventory")
            }
            OrderCommand::PaymentDue if features.payment_timeout.is_none() => {
                Some("--payment-timeout")
            }
            _ => None,
        };
        if let Some(flag) = off {
            return Decision::event(rejected(&Refusal::FeatureOff(flag)));
        }
        let not_reserved = state.items.iter().any(|item| item.stock != Stock::Reserved);
        if features.inventory
            && command == OrderCommand::Ship
            && state.phase == Phase::Paid
            && not_reserved
        {
            return Decision::event(rejected(&Refusal::NotReserved));
        }
        let event = match Order::rule(state, command) {
            Ok(event) => event,
            Err(refusal) => return Decision::event(rejected(&refusal)),
        };
        let mut decision = Decision::event(event);
        let (mut release, mut disarm) = (false, false);
        match &decision.event {
            OrderEvent::Placed { .. } => {
                if let Some(after) = features.payment_timeout {
                    decision.timers.push(Timer::Set {
                        name: PAYMENT_TIMER,
                        after,
                        command: OrderCommand::PaymentDue,
                    });
                }
            }
            OrderEvent::ItemAdded { sku, qty, .. } if features.inventory => {
                decision.messages.push(Message::Inventory {
                    sku: sku.clone(),
                    command: InventoryCommand::Reserve {
                        order: id.to_owned(),
                        line: state.lines,
                        qty: *qty,
                    },
                });
            }
            OrderEvent::Paid { .. } => disarm = true,
            OrderEvent::Cancelled | OrderEvent::ItemUnavailable { .. } => {
                // Ends the order (an unavailable item only while it is open or paid).
                let ends = matches!(state.phase, Phase::Open | Phase::Paid);
                release = ends;
                disarm = ends && state.phase == Phase::Open;
            }
            // The timer fired: it is disarmed already.
            OrderEvent::Expired => release = true,
            OrderEvent::ItemReserved { line }
                if features.inventory && state.phase == Phase::Cancelled =>
            {
                decision.messages.push(release_message(id, state, *line));
            }
            _ => {}
        }
        if release && features.inventory {
            for (line, _) in state.reserved() {
                decision.messages.push(release_message(id, state, line));
            }
        }
        if disarm && features.payment_timeout.is_some() {
            decision.timers.push(Timer::Cancel {
                name: PAYMENT_TIMER,
            });
        }
        decision
    }
}

fn rejected(refusal: &Refusal) -> OrderEvent {
    OrderEvent::Rejected {
        reason: refusal.to_string(),
    }
}

/// Gives item `line` of order `id` back to its inventory.
fn release_message(id: &str, state: &OrderState, line: u32) -> Message {
    let sku = usize::try_from(line)
        .ok()
        .and_then(|i| state.items.get(i))
        .map(|item| item.sku.clone())
        .unwrap_or_default();
    Message::Inventory {
        sku,
        command: InventoryCommand::Release {
            order: id.to_owned(),
            line,
        },
    }
}

impl Rules for Order {
    const ENTITY_TYPE: &'static str = ENTITY_TYPE;

    fn decision(
        features: &Features,
        id: &str,
        state: &OrderState,
        command: OrderCommand,
    ) -> Decision<OrderEvent> {
        Order::decision(features, id, state, command)
    }

    fn kind(event: &OrderEvent) -> &'static str {
        event.kind()
    }
}

impl Entity for Order {
    type Command = OrderCommand;
    type Event = OrderEvent;
    type State = OrderState;
    /// Refusals are `Rejected` events, so `decide` never fails.
    type Rejection = Never;

    /// The rules with this process's features ([`rules::features`]), without their effects.
    fn decide(state: &OrderState, command: OrderCommand) -> Result<Vec<OrderEvent>, Never> {
        Self::decide_with_effects(state, command, &mut Effects::new(Codec::Json))
    }

    /// [`Order::decision`] with this process's features; jetshard sends its messages and
    /// sets its timers once the event is durable.
    fn decide_with_effects(
        state: &OrderState,
        command: OrderCommand,
        effects: &mut Effects,
    ) -> Result<Vec<OrderEvent>, Never> {
        Ok(rules::decide::<Order>(state, command, effects))
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
                sku,
                qty,
                price_cents,
            } => {
                state.lines += 1;
                state.items.push(Item {
                    sku: sku.clone(),
                    qty: *qty,
                    stock: Stock::Unconfirmed,
                });
                // `rule` refused anything that would overflow; saturate rather than panic on a
                // journal written by other rules.
                state.total_cents = state
                    .total_cents
                    .saturating_add(u64::from(*qty).saturating_mul(*price_cents));
            }
            OrderEvent::Paid { .. } => state.phase = Phase::Paid,
            OrderEvent::Shipped => state.phase = Phase::Shipped,
            OrderEvent::Cancelled | OrderEvent::Expired => state.phase = Phase::Cancelled,
            OrderEvent::ItemReserved { line } => set_stock(state, *line, Stock::Reserved),
            OrderEvent::ItemUnavailable { line } => {
                set_stock(state, *line, Stock::Unavailable);
                if matches!(state.phase, Phase::Open | Phase::Paid) {
                    state.phase = Phase::Cancelled;
                }
            }
            OrderEvent::Rejected { .. } => {}
        }
    }
}

fn set_stock(state: &mut OrderState, line: u32, stock: Stock) {
    if let Some(item) = usize::try_from(line)
        .ok()
        .and_then(|i| state.items.get_mut(i))
    {
        item.stock = stock;
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

    /// Runs commands through [`Order::decision`] with `features`, for order `o-1`.
    fn decide_all(
        features: &Features,
        commands: impl IntoIterator<Item = C>,
    ) -> (Vec<Decision<E>>, OrderState) {
        let mut state = OrderState::default();
        let mut decisions = Vec::new();
        for command in commands {
            let decision = Order::decision(features, "o-1", &state, command);
            Order::apply(&mut state, &decision.event);
            decisions.push(decision);
        }
        (decisions, state)
    }

    const INVENTORY: Features = Features {
        inventory: true,
        payment_timeout: None,
    };
    const TIMEOUT: Features = Features {
        inventory: false,
        payment_timeout: Some(std::time::Duration::from_secs(30)),
    };

    fn reserve(line: u32, qty: u32) -> Message {
        Message::Inventory {
            sku: "sku-1".into(),
            command: InventoryCommand::Reserve {
                order: "o-1".into(),
                line,
                qty,
            },
        }
    }

    fn release(line: u32) -> Message {
        Message::Inventory {
            sku: "sku-1".into(),
            command: InventoryCommand::Release {
                order: "o-1".into(),
                line,
            },
        }
    }

    #[test]
    fn without_features_a_decision_is_the_first_examples_rule_and_nothing_else() {
        let script = [
            place(),
            add(2, 150),
            C::Ship,
            C::Pay { amount_cents: 300 },
            C::Ship,
            C::Cancel,
        ];
        let (decisions, _) = decide_all(&Features::NONE, script.clone());
        let (events, _) = run(script);
        for (decision, event) in decisions.iter().zip(&events) {
            assert_eq!(decision, &Decision::event(event.clone()));
        }
        let (decisions, state) = decide_all(
            &Features::NONE,
            [
                place(),
                add(1, 5),
                C::Reserved { line: 0 },
                C::OutOfStock { line: 0 },
                C::PaymentDue,
            ],
        );
        assert_eq!(
            decisions[2].event,
            rejected(Refusal::FeatureOff("--inventory"))
        );
        assert_eq!(
            decisions[4].event,
            rejected(Refusal::FeatureOff("--payment-timeout"))
        );
        assert_eq!(state.phase, Phase::Open);
    }

    #[test]
    fn an_added_item_is_reserved_and_the_order_ships_only_once_all_are() {
        let (d, state) = decide_all(
            &INVENTORY,
            [
                place(),
                add(2, 100),
                add(1, 100),
                C::Reserved { line: 0 },
                C::Pay { amount_cents: 300 },
                C::Ship,
                C::Reserved { line: 1 },
                C::Reserved { line: 1 },
                C::Ship,
            ],
        );
        assert_eq!(d[1].messages, [reserve(0, 2)]);
        assert_eq!(d[2].messages, [reserve(1, 1)]);
        assert_eq!(d[5].event, rejected(Refusal::NotReserved));
        assert_eq!(d[7].event, rejected(Refusal::LineAnswered(1)));
        assert_eq!(d[8].event, E::Shipped);
        assert_eq!(state.reserved().count(), 2);
    }

    #[test]
    fn an_item_out_of_stock_cancels_the_order_and_releases_what_it_holds() {
        let (d, state) = decide_all(
            &INVENTORY,
            [
                place(),
                add(1, 100),
                add(5, 100),
                C::Reserved { line: 0 },
                C::OutOfStock { line: 1 },
                C::Pay { amount_cents: 600 },
            ],
        );
        assert_eq!(d[4].event, E::ItemUnavailable { line: 1 });
        assert_eq!(d[4].messages, [release(0)]);
        assert_eq!(state.phase, Phase::Cancelled);
        assert_eq!(d[5].event, rejected(Refusal::NotOpen(Phase::Cancelled)));
    }

    #[test]
    fn a_reservation_answered_after_the_order_ended_is_released_at_once() {
        let (d, _) = decide_all(
            &INVENTORY,
            [place(), add(1, 100), C::Cancel, C::Reserved { line: 0 }],
        );
        assert!(d[2].messages.is_empty(), "nothing held yet");
        assert_eq!(d[3].event, E::ItemReserved { line: 0 });
        assert_eq!(d[3].messages, [release(0)]);
    }

    #[test]
    fn the_payment_timer_is_armed_when_placed_and_disarmed_by_payment() {
        let (d, _) = decide_all(
            &TIMEOUT,
            [
                place(),
                add(1, 5),
                C::Pay { amount_cents: 5 },
                C::PaymentDue,
            ],
        );
        assert_eq!(
            d[0].timers,
            [Timer::Set {
                name: PAYMENT_TIMER,
                after: std::time::Duration::from_secs(30),
                command: C::PaymentDue
            }]
        );
        assert_eq!(
            d[2].timers,
            [Timer::Cancel {
                name: PAYMENT_TIMER
            }]
        );
        // jetshard never delivers it now; were it to, it would change nothing.
        assert_eq!(d[3].event, rejected(Refusal::NotOpen(Phase::Paid)));
    }

    #[test]
    fn an_unpaid_order_expires_and_releases_what_it_holds() {
        let both = Features {
            inventory: true,
            ..TIMEOUT
        };
        let (d, state) = decide_all(
            &both,
            [place(), add(1, 5), C::Reserved { line: 0 }, C::PaymentDue],
        );
        assert_eq!(d[3].event, E::Expired);
        assert_eq!(d[3].messages, [release(0)]);
        assert!(d[3].timers.is_empty(), "a fired timer is disarmed already");
        assert_eq!(state.phase, Phase::Cancelled);
        let (d, _) = decide_all(&both, [place(), C::Cancel]);
        assert_eq!(
            d[1].timers,
            [Timer::Cancel {
                name: PAYMENT_TIMER
            }]
        );
    }

    #[test]
    fn the_shared_config_is_valid() {
        let config = shard_config().node_id("n").build().unwrap();
        assert_eq!(config.entity_type(), ENTITY_TYPE);
        assert_eq!(config.codec(), Codec::Json);
    }
}
