//! What a command decides, as plain data: its event, the commands it sends to other entities,
//! and the timers it sets or cancels; and the features a node runs the rules with.
//!
//! The rules ([`Rules::decision`]) do no IO: they return a [`Decision`], which the entity's
//! `decide_with_effects` hands to jetshard's [`Effects`] ([`Decision::into_effects`]), and which
//! `verify` replays to know what every command should have sent. So the saga and the timers are
//! unit-tested like the rest of the rules, without a server.
//!
//! ## Features
//!
//! Without features (no flags), the order's rules and events are exactly those of the first
//! example: other clients and tools rely on them. With `node --inventory`, every item an order
//! takes is reserved from the `inventory` entity of its product (a small saga, see
//! [`crate::inventory`]); with `node --payment-timeout <duration>`, an order not paid that long
//! after it was placed is cancelled by a durable timer (event `Expired`).
//!
//! jetshard's [`Entity`] is a type whose rules are associated functions: nothing per system is
//! passed to them. Settings that change the rules are therefore a process-wide value, set once
//! by `node` before its shard systems start ([`configure`]); every node must run with the same
//! ones (like the partition count), and `verify` is given them too. The rules themselves take
//! the features as an argument, so tests and `verify` never touch the process-wide value.

use std::sync::OnceLock;
use std::time::Duration;

use jetshard::{Effects, Entity, EntityId};

use crate::inventory::{self, InventoryCommand};
use crate::order::{self, OrderCommand};

/// What the rules do beyond the first example's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    /// Orders reserve their items from the `inventory` entities (`--inventory`).
    pub inventory: bool,
    /// Unpaid orders are cancelled this long after they are placed (`--payment-timeout`).
    pub payment_timeout: Option<Duration>,
}

impl Features {
    /// The first example's rules: no saga, no timer.
    pub const NONE: Features = Features {
        inventory: false,
        payment_timeout: None,
    };
}

static FEATURES: OnceLock<Features> = OnceLock::new();

/// Sets the features of this process's rules, once, before a shard system starts.
///
/// # Errors
/// If they were set before (to other values).
pub fn configure(features: Features) -> anyhow::Result<()> {
    let set = FEATURES.get_or_init(|| features);
    anyhow::ensure!(
        *set == features,
        "the rules' features are set already ({set:?})"
    );
    Ok(())
}

/// The features of this process's rules: [`Features::NONE`] unless [`configure`]d.
pub fn features() -> &'static Features {
    FEATURES.get().unwrap_or(&Features::NONE)
}

/// A command to another entity, sent once the event that decided it is durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// To the inventory of a product (`inventory.cmd.<sku>`).
    Inventory {
        /// The product: the inventory entity's id.
        sku: String,
        /// The command.
        command: InventoryCommand,
    },
    /// To an order (`order.cmd.<order>`).
    Order {
        /// The order id.
        order: String,
        /// The command.
        command: OrderCommand,
    },
}

impl Message {
    /// The target's entity type.
    pub fn entity_type(&self) -> &'static str {
        match self {
            Message::Inventory { .. } => inventory::ENTITY_TYPE,
            Message::Order { .. } => order::ENTITY_TYPE,
        }
    }

    /// The target's id.
    pub fn id(&self) -> &str {
        match self {
            Message::Inventory { sku, .. } => sku,
            Message::Order { order, .. } => order,
        }
    }

    /// The command's body, as jetshard publishes it (JSON, the example's codec).
    pub fn body(&self) -> Vec<u8> {
        let encoded = match self {
            Message::Inventory { command, .. } => serde_json::to_vec(command),
            Message::Order { command, .. } => serde_json::to_vec(command),
        };
        encoded.unwrap_or_default()
    }
}

/// A change to one of the deciding entity's timers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Timer {
    /// Arm `name`: `command` comes back to the entity `after` this long.
    Set {
        /// The timer's name.
        name: &'static str,
        /// When, from the moment the command's records are written.
        after: Duration,
        /// The command it sends (to the entity itself).
        command: OrderCommand,
    },
    /// Disarm `name`: it never fires.
    Cancel {
        /// The timer's name.
        name: &'static str,
    },
}

/// What one command decides. Every command of the example decides exactly one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision<Ev> {
    /// The event.
    pub event: Ev,
    /// Commands to other entities, in order (their index is part of their `Nats-Msg-Id`).
    pub messages: Vec<Message>,
    /// Changes to the entity's own timers.
    pub timers: Vec<Timer>,
}

impl<Ev> Decision<Ev> {
    /// Just the event.
    pub fn event(event: Ev) -> Self {
        Self {
            event,
            messages: Vec::new(),
            timers: Vec::new(),
        }
    }

    /// Hands the messages and timers to jetshard and returns the event.
    pub fn into_effects(self, effects: &mut Effects) -> Ev {
        for message in &self.messages {
            match message {
                Message::Inventory { sku, command } => {
                    effects.command(inventory::ENTITY_TYPE, sku, command);
                }
                Message::Order { order, command } => {
                    effects.command(order::ENTITY_TYPE, order, command);
                }
            }
        }
        for timer in &self.timers {
            match timer {
                Timer::Set {
                    name,
                    after,
                    command,
                } => effects.set_timer_after(name, *after, command),
                Timer::Cancel { name } => effects.cancel_timer(name),
            }
        }
        self.event
    }
}

/// An entity whose rules are a [`Decision`] per command.
pub trait Rules: Entity {
    /// The entity type token.
    const ENTITY_TYPE: &'static str;

    /// The rules: what `command` decides for entity `id` in `state`, with `features`.
    fn decision(
        features: &Features,
        id: &str,
        state: &Self::State,
        command: Self::Command,
    ) -> Decision<Self::Event>;

    /// The event's `type` tag, for counting.
    fn kind(event: &Self::Event) -> &'static str;
}

/// `decide_with_effects` of a [`Rules`] entity: the rules with this process's [`features`],
/// for the entity jetshard names in `effects`.
pub fn decide<R: Rules>(
    state: &R::State,
    command: R::Command,
    effects: &mut Effects,
) -> Vec<R::Event> {
    let id = effects
        .entity_id()
        .map(EntityId::as_str)
        .unwrap_or_default()
        .to_owned();
    vec![R::decision(features(), &id, state, command).into_effects(effects)]
}
