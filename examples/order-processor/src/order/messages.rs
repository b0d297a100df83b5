//! What travels: the commands a client sends an order, and the events its journal keeps.

use serde::{Deserialize, Serialize};

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
