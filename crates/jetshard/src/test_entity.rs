//! The entity of the library's unit tests: a counter that adds each command to its state, with
//! a snapshot every two events.

use crate::entity::{Entity, Snapshots};

/// Adds each command (`u32`) to its state; never rejects.
pub(crate) struct Counter;

impl Entity for Counter {
    type Command = u32;
    type Event = u32;
    type State = u64;
    type Rejection = String;
    fn decide(_: &u64, command: u32) -> Result<Vec<u32>, String> {
        Ok(vec![command])
    }
    fn apply(state: &mut u64, event: &u32) {
        *state += u64::from(*event);
    }
    fn snapshots() -> Option<Snapshots<u64>> {
        Some(Snapshots::serde(2))
    }
}
