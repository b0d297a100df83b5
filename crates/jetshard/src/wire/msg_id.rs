//! Message ids (`Nats-Msg-Id`): what the server de-duplicates each journal write, command and
//! outbox message by.

use crate::wire::id::EntityId;

/// The most digits of a `u64` in decimal.
pub(crate) const DECIMAL_DIGITS: usize = 20;

/// `number` in decimal, written into the end of `digits`: what `format!("{number}")` writes,
/// without `fmt`'s machinery, for the numbers written into every command's message ids,
/// headers and reply subjects. Bytes, not a `&str`: `str::from_utf8` over them cost as much
/// as writing them (~50 instructions a number); [`push_decimal`] makes text of them.
pub(crate) fn decimal(mut number: u64, digits: &mut [u8; DECIMAL_DIGITS]) -> &[u8] {
    let mut at = DECIMAL_DIGITS;
    loop {
        at -= 1;
        digits[at] = b'0' + (number % 10) as u8;
        number /= 10;
        if number == 0 {
            break;
        }
    }
    &digits[at..]
}

/// Appends `number` in decimal to `text` (ASCII digits, pushed as `char`s: no UTF-8 check).
pub(crate) fn push_decimal(text: &mut String, number: u64) {
    let mut digits = [0; DECIMAL_DIGITS];
    text.extend(
        decimal(number, &mut digits)
            .iter()
            .map(|digit| char::from(*digit)),
    );
}

/// A token of ASCII digits as a number (`None`: empty, not only digits, or past `u64`): what
/// `str::parse::<u64>` reads of the numbers the server writes, without its generic machinery.
pub(crate) fn read_decimal(token: &[u8]) -> Option<u64> {
    if token.is_empty() {
        return None;
    }
    token.iter().try_fold(0u64, |number, byte| {
        let digit = byte.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        number.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// `number` in decimal, as a new `String` of exactly its length.
pub(crate) fn decimal_string(number: u64) -> String {
    let mut digits = [0; DECIMAL_DIGITS];
    let digits = decimal(number, &mut digits);
    let mut text = String::with_capacity(digits.len());
    text.extend(digits.iter().map(|digit| char::from(*digit)));
    text
}
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
        // Sized up front (two numbers of up to 20 digits): `format!` would start this one from
        // an empty string and grow it, an allocation more for every event written; the numbers
        // written by `decimal`, not `fmt` (a fifth of the instructions).
        let mut id = String::with_capacity(self.entity_type.len() + 42);
        id.push_str(&self.entity_type);
        id.push(':');
        push_decimal(&mut id, command_seq);
        id.push(':');
        push_decimal(&mut id, index as u64);
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
    /// `command_seq` of `partition`: `<t>:<seq>:out:<index>`, or `<t>:<p>:<seq>:out:<index>`
    /// with the commands spread over several streams, each numbering its own (a target hears
    /// from all of them within one duplicate window).
    pub(crate) fn outbox_msg_id(&self, partition: u32, command_seq: u64, index: usize) -> String {
        if self.is_spread() {
            format!("{}:{partition}:{command_seq}:out:{index}", self.entity_type)
        } else {
            format!("{}:{command_seq}:out:{index}", self.entity_type)
        }
    }

    /// `Nats-Msg-Id` of the dead letter of the command at `command_seq`.
    pub(crate) fn dead_letter_msg_id(&self, command_seq: u64) -> String {
        format!("{}:dlq:{command_seq}", self.entity_type)
    }

    /// `Nats-Msg-Id` of a dead letter's command published again (`jetshard dlq replay`):
    /// `<t>:replay:<seq>`, or `<t>:replay:<p>:<seq>` in a journal spread over several streams,
    /// where a sequence names a record of one stream only.
    pub(crate) fn replay_msg_id(&self, partition: u32, dead_letter_seq: u64) -> String {
        if self.journal_streams().len() == 1 {
            format!("{}:replay:{dead_letter_seq}", self.entity_type)
        } else {
            format!("{}:replay:{partition}:{dead_letter_seq}", self.entity_type)
        }
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

#[cfg(test)]
mod decimal_tests {
    use super::*;

    #[test]
    fn numbers_are_written_and_read_as_fmt_and_parse_do() {
        let mut digits = [0; DECIMAL_DIGITS];
        for number in [
            0,
            1,
            9,
            10,
            99,
            100,
            12_345,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ] {
            let written = decimal(number, &mut digits).to_owned();
            assert_eq!(written, number.to_string().into_bytes());
            assert_eq!(decimal_string(number), number.to_string());
            let mut pushed = String::from("x:");
            push_decimal(&mut pushed, number);
            assert_eq!(pushed, format!("x:{number}"));
            assert_eq!(read_decimal(&written), Some(number));
        }
        for bad in ["", "x", "1x", "-1", " 1", "18446744073709551616"] {
            assert_eq!(read_decimal(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn an_event_msg_id_is_the_type_the_command_and_the_index() {
        let names = Names::new("order");
        assert_eq!(names.event_msg_id(0, 0), "order:0:0");
        assert_eq!(
            names.event_msg_id(u64::MAX, 12),
            format!("order:{}:12", u64::MAX)
        );
    }
}
