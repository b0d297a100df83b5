//! The `Fragile` test entity: handlers that fail on purpose. `apply` panics on an event that
//! is durable (`Poison`), an event's serialization panics (`BadEncode`), and `Check` shows the
//! state. Used by the poison tests (`tests/tests/poison.rs`) and the retry and pin tests
//! (`tests/tests/retries_and_pins.rs`), which start it with [`config`] or [`retrying`] and
//! [`start`].

use std::time::Duration;

use jetshard::{CommandSender, Entity, ShardConfig, ShardConfigBuilder, ShardSystem};
use serde::{Deserialize, Serialize};

/// A `Fragile` system of `partitions` on one node, `n1`, with the tests' short pin and ack
/// wait ([`crate::config`]).
pub fn config(partitions: u32) -> ShardConfigBuilder {
    crate::config("fragile", partitions, "n1")
}

/// [`config`], retrying a failed command after 50 ms and giving it up at its `max_deliver`th
/// delivery.
pub fn retrying(partitions: u32, max_deliver: u32) -> ShardConfigBuilder {
    config(partitions)
        .retry_delay(Duration::from_millis(50))
        .max_deliver(max_deliver)
}

/// Starts a `Fragile` system on `client`, and a sender of commands to it.
pub async fn start(
    client: &async_nats::Client,
    config: &ShardConfig,
) -> (CommandSender<Fragile>, ShardSystem) {
    let sender = CommandSender::<Fragile>::new(client.clone(), config);
    let system = ShardSystem::start::<Fragile>(client.clone(), config.clone())
        .await
        .unwrap();
    (sender, system)
}

/// A sum of numbers whose handlers fail on purpose.
pub struct Fragile;

/// A command to a `Fragile`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FragileCmd {
    /// Adds to the sum.
    Add(u32),
    /// Decides `Poison`, on which `apply` panics.
    Poison,
    /// Decides `Unencodable`, whose serialization panics.
    BadEncode,
    /// Rejected unless the entity's sum is this.
    Check(u32),
}

/// An event of a `Fragile`.
#[derive(Debug, Clone, Deserialize)]
pub enum FragileEvt {
    /// Added to the sum.
    Added(u32),
    /// `apply` panics on it.
    Poison,
    /// Its serialization panics.
    Unencodable,
}

impl Serialize for FragileEvt {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            FragileEvt::Added(n) => {
                serializer.serialize_newtype_variant("FragileEvt", 0, "Added", n)
            }
            FragileEvt::Poison => serializer.serialize_unit_variant("FragileEvt", 1, "Poison"),
            FragileEvt::Unencodable => panic!("this event cannot be encoded"),
        }
    }
}

impl Entity for Fragile {
    type Command = FragileCmd;
    type Event = FragileEvt;
    type State = u32;
    type Rejection = String;

    fn decide(sum: &u32, command: FragileCmd) -> Result<Vec<FragileEvt>, String> {
        match command {
            FragileCmd::Add(n) => Ok(vec![FragileEvt::Added(n)]),
            FragileCmd::Poison => Ok(vec![FragileEvt::Poison]),
            FragileCmd::BadEncode => Ok(vec![FragileEvt::Unencodable]),
            FragileCmd::Check(n) if n == *sum => Ok(vec![]),
            FragileCmd::Check(_) => Err(format!("the sum is {sum}")),
        }
    }

    fn apply(sum: &mut u32, event: &FragileEvt) {
        match event {
            FragileEvt::Added(n) => *sum += n,
            FragileEvt::Poison => panic!("apply cannot take Poison"),
            FragileEvt::Unencodable => {}
        }
    }
}
