//! An order's state, rebuilt from its events: its phase and its items.

use serde::{Deserialize, Serialize};

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
