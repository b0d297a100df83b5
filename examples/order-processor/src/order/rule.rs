//! The order's rules, pure functions: [`Order::rule`], the phase x command table, and
//! [`Order::decision`], what the features make an event cause; and why a command is refused.

use std::fmt;

use super::{Order, OrderCommand, OrderEvent, OrderState, PAYMENT_TIMER, Phase, Stock};
use crate::inventory::InventoryCommand;
use crate::rules::{Decision, Features, Message, Timer};

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
