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
//! The rules are pure functions (`rule.rs`), tested without a server (`tests.rs`): [`Order::rule`] is the first
//! example's phase x command table; [`Order::decision`] adds what the features
//! ([`crate::rules::Features`]) make an event cause: a reservation per item (`--inventory`), a
//! payment timer (`--payment-timeout`), and their compensations.

mod messages;
mod rule;
mod state;
#[cfg(test)]
mod tests;

use std::fmt;

use jetshard::{
    Codec, CodecError, CommandRetention, Effects, Entity, ShardConfig, ShardConfigBuilder,
};
use serde::{Deserialize, Serialize};

use crate::rules::{self, Decision, Features, Rules};

pub use messages::{OrderCommand, OrderEvent};
pub use rule::Refusal;
pub use state::{Item, OrderState, Phase, Stock};

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
/// command ever sent back from `ORDER_CMD` and hold the journal against it. Everything else is
/// the library's default: the owners compact the journal, and `verify` reads a copy of it that
/// keeps what compaction purges ([`crate::verify::keep_journal_copy`]).
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
