//! What a delivered command carries (its headers and `$JS.ACK` reply subject, read into a
//! [`Delivery`]), and the wake-up command (see the [pull loop](super)).

use std::sync::Arc;

use async_nats::Subject;
use async_nats::header::HeaderName;
use bytes::Bytes;

use crate::trace::CommandTrace;
use crate::wire::{HDR_PIN_ID, HDR_REPLY_TO, HDR_TRACEPARENT};

/// A command delivered to this process, with the pin it came under.
#[derive(Debug)]
pub(crate) struct Delivery {
    pub(crate) pin: Arc<str>,
    /// The stored subject, `<t>.cmd.<p>.<id>`.
    pub(crate) subject: Subject,
    /// Where acknowledgements go (`$JS.ACK...`).
    pub(crate) reply: Subject,
    pub(crate) payload: Bytes,
    /// The command's sequence in the command stream.
    pub(crate) seq: u64,
    /// How often it has been delivered, this time included.
    pub(crate) deliveries: u64,
    /// Where the client wants the outcome (`Jetshard-Reply-To`).
    pub(crate) respond_to: Option<Subject>,
    /// The consumer's commands not delivered yet, as the server counted at this delivery.
    pub(crate) pending: u64,
    /// The command's trace context, if it came with a valid `traceparent`.
    pub(crate) trace: Option<Box<CommandTrace>>,
    /// Which timer fired, if it is a timer's command (`Jetshard-Timer`).
    pub(crate) timer: Option<crate::data::timers::Firing>,
    /// A wake-up (`Jetshard-Wake`, see [`wake`]): acknowledged, routed to no entity.
    pub(crate) wake: bool,
    /// Where it came from, if it is an outbox message (`Jetshard-Origin`).
    pub(crate) origin: Option<Box<crate::data::origin::Origin>>,
}

/// What one pass over a delivery's headers finds: the pin id it came under, and whether it
/// carries any header of jetshard's own that the readers below look for (a reply subject, a
/// trace context, a timer, a wake-up, an origin).
///
/// Each reader looks its header up in the map, hashing the name (SipHash) per lookup: six
/// lookups per command, where most commands carry only the pin id and a message id. The pass
/// lets them skip the map when none of their headers is there.
pub(crate) struct Scanned<'a> {
    /// `Nats-Pin-Id`'s value.
    pub(crate) pin: Option<&'a str>,
    /// The headers, when one of jetshard's command headers is among them; `None` otherwise
    /// (every reader would find nothing).
    pub(crate) command_headers: Option<&'a async_nats::HeaderMap>,
}

/// Reads `headers` once (see [`Scanned`]).
pub(crate) fn scan(headers: Option<&async_nats::HeaderMap>) -> Scanned<'_> {
    let mut scanned = Scanned {
        pin: None,
        command_headers: None,
    };
    let Some(headers) = headers else {
        return scanned;
    };
    for (name, values) in headers.iter() {
        let name: &str = name.as_ref();
        if name == HDR_PIN_ID {
            scanned.pin = values.first().map(|v| v.as_str());
        } else if [
            HDR_REPLY_TO,
            HDR_TRACEPARENT,
            crate::wire::HDR_TIMER,
            crate::wire::HDR_WAKE,
            crate::wire::HDR_ORIGIN,
        ]
        .contains(&name)
        {
            scanned.command_headers = Some(headers);
        }
    }
    scanned
}

/// Whether a stored command is a wake-up (see [`wake`]).
pub(crate) fn is_wake(headers: Option<&async_nats::HeaderMap>) -> bool {
    headers.is_some_and(|h| {
        h.get(HeaderName::from_static(crate::wire::HDR_WAKE))
            .is_some()
    })
}

/// Sends a wake-up to `partition`: a command for no entity, so that the server pins a standby
/// at once although no command of an entity is waiting (a partition is owned only while it
/// has a command to deliver). The new owner reads the partition's armed timers on acquisition
/// and fires those due; the wake-up itself is acknowledged and routed nowhere. Sent after a
/// dead owner's partition is unpinned (the crash watch) and by an owner that lets its partition go
/// with timers armed: otherwise those timers would wait for the partition's next command.
///
/// Offered with the publish patience of the outbox ([`crate::retry::with_publish_patience`]):
/// during a clustered command stream's leader election it answers "no responders" for seconds.
/// Callers run it beside their work (it may take [`crate::retry::PUBLISH_PATIENCE`]).
pub(crate) async fn wake(
    js: &async_nats::jetstream::Context,
    names: &crate::wire::Names,
    partition: u32,
    partitions: u32,
) {
    let stored =
        crate::retry::with_publish_patience(|| try_wake(js, names, partition, partitions)).await;
    match stored {
        Ok(()) => tracing::debug!(partition, "woke the partition"),
        Err(e) => {
            tracing::warn!(partition, error = %e, "wake-up not sent; the partition's timers wait for its next command");
        }
    }
}

/// One attempt of [`wake`]: the wake-up stored, or why not.
pub(crate) async fn try_wake(
    js: &async_nats::jetstream::Context,
    names: &crate::wire::Names,
    partition: u32,
    partitions: u32,
) -> Result<(), String> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(crate::wire::HDR_WAKE, "1");
    let subject = names.wake_subject(partition, partitions);
    match js
        .publish_with_headers(subject, headers, Bytes::new())
        .await
    {
        Ok(ack) => ack.await.map(drop).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// The `Jetshard-Reply-To` subject of a command, if it has a valid one.
pub(crate) fn respond_to(headers: Option<&async_nats::HeaderMap>) -> Option<Subject> {
    let subject = headers?
        .get(HeaderName::from_static(HDR_REPLY_TO))?
        .as_str();
    let valid = !subject.is_empty() && !subject.contains(['*', '>', ' ', '\t', '\r', '\n']);
    valid.then(|| Subject::from(subject))
}

/// The trace context of a command with a valid `traceparent` header.
pub(crate) fn trace_of(headers: Option<&async_nats::HeaderMap>) -> Option<Box<CommandTrace>> {
    CommandTrace::of(
        headers?
            .get(HeaderName::from_static(HDR_TRACEPARENT))?
            .as_str(),
    )
}

/// Reads the stream sequence and delivery count from a `$JS.ACK` reply subject, in either
/// layout (ADR-15): `<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>`,
/// or with `<domain>.<account hash>.` in front and optional tokens after.
pub(super) fn ack_info(reply: &str) -> Option<AckInfo> {
    // Read in place, in one pass over the bytes, into a fixed array of tokens: this runs for
    // every delivered command (split by `char`, with `str::parse`, it cost ~2,300 instructions
    // a delivery; through `slice::split`, ~650). A plain loop over the bytes that
    // notes where each of the first 9 tokens ends.
    use crate::wire::read_decimal;
    let rest = reply.strip_prefix(crate::wire::ACK_PREFIX)?.as_bytes();
    let mut ends = [0usize; 9];
    let mut count = 0;
    for (at, byte) in rest.iter().enumerate() {
        if *byte == b'.' {
            if let Some(end) = ends.get_mut(count) {
                *end = at;
            }
            count += 1;
        }
    }
    if let Some(end) = ends.get_mut(count) {
        *end = rest.len();
    }
    count += 1;
    let token = |index: usize| -> Option<&[u8]> {
        let start = match index {
            0 => 0,
            _ => ends.get(index - 1)? + 1,
        };
        rest.get(start..*ends.get(index)?)
    };
    let first = match count {
        7 => 2,
        n if n >= 9 => 4,
        _ => return None,
    };
    Some(AckInfo {
        deliveries: read_decimal(token(first)?)?,
        stream_seq: read_decimal(token(first + 1)?)?,
        consumer_seq: read_decimal(token(first + 2)?)?,
        pending: token(first + 4).and_then(read_decimal).unwrap_or(0),
    })
}

/// What a `$JS.ACK` reply subject tells of a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AckInfo {
    pub(super) stream_seq: u64,
    pub(super) deliveries: u64,
    /// The consumer's delivery counter: it rises by one with every delivery, so a jump means a
    /// delivery to this process was lost on the way (a dropped connection).
    pub(super) consumer_seq: u64,
    /// The consumer's pending count after this delivery: commands stored and not delivered yet.
    pub(super) pending: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scan_finds_the_pin_and_passes_the_headers_only_when_a_reader_wants_them() {
        let mut plain = async_nats::HeaderMap::new();
        plain.insert(HDR_PIN_ID, "pin-1");
        plain.insert("Nats-Msg-Id", "m-1");
        let scanned = scan(Some(&plain));
        assert_eq!(scanned.pin, Some("pin-1"));
        assert!(scanned.command_headers.is_none());
        assert!(scan(None).pin.is_none());
        for header in [
            HDR_REPLY_TO,
            HDR_TRACEPARENT,
            crate::wire::HDR_TIMER,
            crate::wire::HDR_WAKE,
            crate::wire::HDR_ORIGIN,
        ] {
            let mut headers = plain.clone();
            headers.insert(header, "x");
            let scanned = scan(Some(&headers));
            assert_eq!(scanned.pin, Some("pin-1"), "{header}");
            assert!(scanned.command_headers.is_some(), "{header}");
        }
        let mut reply = async_nats::HeaderMap::new();
        reply.insert(HDR_REPLY_TO, "_INBOX.a");
        let scanned = scan(Some(&reply));
        assert_eq!(scanned.pin, None);
        assert_eq!(
            respond_to(scanned.command_headers).as_deref(),
            Some("_INBOX.a")
        );
    }

    #[test]
    fn ack_subjects_of_both_layouts_are_read() {
        let info = |stream_seq, deliveries, consumer_seq, pending| {
            Some(AckInfo {
                stream_seq,
                deliveries,
                consumer_seq,
                pending,
            })
        };
        assert_eq!(
            ack_info("$JS.ACK.C.p0.1.15.5.1795319414023821828.9"),
            info(15, 1, 5, 9)
        );
        assert_eq!(
            ack_info("$JS.ACK.C.p0.3.15.5.1795319414023821828.0"),
            info(15, 3, 5, 0)
        );
        assert_eq!(
            ack_info("$JS.ACK._.ACCHASH.C.p0.2.16.5.1795319414023821828.0.tok"),
            info(16, 2, 5, 0)
        );
        assert_eq!(
            ack_info("$JS.ACK._.ACCHASH.C.p0.2.16.5.1795319414023821828.0"),
            info(16, 2, 5, 0)
        );
        assert_eq!(
            ack_info("$JS.ACK.C.p0.7.18446744073709551615.12.1.x"),
            info(u64::MAX, 7, 12, 0),
            "a pending count that does not read is 0"
        );
        for bad in [
            "",
            "$JS.ACK.",
            "$JS.ACK.C.p0.x.15.5.1.0",
            "other.C.p0.1.15.5.1.0",
            "$JS.ACK.a.b.c",
            "$JS.ACK.C.p0.1.15..1.0",
            "$JS.ACK.C.p0.1.18446744073709551616.5.1.0",
            "$JS.ACK.C.p0.1.15.5.1.0.x",
        ] {
            assert_eq!(ack_info(bad), None, "{bad}");
        }
    }
}
