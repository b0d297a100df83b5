//! Message ids (`Nats-Msg-Id`): what the server de-duplicates each journal write, command and
//! outbox message by.

use crate::wire::id::EntityId;
use crate::wire::names::Names;

impl Names {
    /// `Nats-Msg-Id` of the unpin record for the fence record at `fence_seq`: the first watch
    /// to store it unpins; every other watch that found the same owner dead is told
    /// "duplicate" and leaves the pin alone.
    pub fn unpin_msg_id(&self, partition: u32, fence_seq: u64) -> String {
        format!("{}:unpin:{partition}:{fence_seq}", self.entity_type)
    }

    /// `Nats-Msg-Id` of the `index`th event of the command at `command_seq`.
    pub fn event_msg_id(&self, command_seq: u64, index: usize) -> String {
        use std::fmt::Write;
        // Sized up front (two numbers of up to 20 digits): `format!` would start this one from
        // an empty string and grow it, an allocation more for every event written.
        let mut id = String::with_capacity(self.entity_type.len() + 42);
        let _ = write!(id, "{}:{command_seq}:{index}", self.entity_type);
        id
    }

    /// `Nats-Msg-Id` of the `index`th outbox record of the command at `command_seq`.
    pub(crate) fn outbox_record_msg_id(&self, command_seq: u64, index: usize) -> String {
        format!("{}:out-record:{command_seq}:{index}", self.entity_type)
    }

    /// `Nats-Msg-Id` of the outbox *done* record of the command at `command_seq`.
    pub(crate) fn outbox_done_msg_id(&self, command_seq: u64) -> String {
        format!("{}:out-done:{command_seq}", self.entity_type)
    }

    /// `Nats-Msg-Id` of the `index`th outbox message (as published) of the command at
    /// `command_seq`.
    pub(crate) fn outbox_msg_id(&self, command_seq: u64, index: usize) -> String {
        format!("{}:{command_seq}:out:{index}", self.entity_type)
    }

    /// `Nats-Msg-Id` of the dead letter of the command at `command_seq`.
    pub(crate) fn dead_letter_msg_id(&self, command_seq: u64) -> String {
        format!("{}:dlq:{command_seq}", self.entity_type)
    }

    /// `Nats-Msg-Id` of a dead letter's command published again (`jetshard dlq replay`).
    pub(crate) fn replay_msg_id(&self, dead_letter_seq: u64) -> String {
        format!("{}:replay:{dead_letter_seq}", self.entity_type)
    }

    /// `Nats-Msg-Id` of a timer's command, as published when it fires.
    pub(crate) fn timer_fired_msg_id(&self, entity: &EntityId, name: &str, set_seq: u64) -> String {
        format!("{}:timer:{entity}:{name}:{set_seq}", self.entity_type)
    }

    /// `Nats-Msg-Id` of a command sent with an idempotency key.
    pub(crate) fn keyed_command_msg_id(id: &str, key: &str) -> String {
        format!("{id}:{key}")
    }
}

/// `Nats-Msg-Id` of the `index`th timer record (a set, a cancel, or the `fired` record) of the
/// command at `command_seq`.
pub(crate) fn timer_record_msg_id(entity_type: &str, command_seq: u64, index: usize) -> String {
    format!("{entity_type}:{command_seq}:timer:{index}")
}
