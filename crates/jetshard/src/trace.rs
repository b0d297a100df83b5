//! W3C trace context (`traceparent`, <https://www.w3.org/TR/trace-context/>) carried through a
//! command, without a tracing backend: jetshard reads and writes the header and records its
//! ids on the entity's `command` span; an application that runs OpenTelemetry (or anything
//! else) links its own spans by the same ids.
//!
//! The path: a client stamps `traceparent` on the command (any client, or
//! [`CommandSender::traced`](crate::CommandSender::traced)); the owner reads it at delivery
//! and gives the command a span id of its own, a child of the caller's; the entity actor's
//! `command` span records `trace_id`, `parent_id` (the caller's) and `span_id` (the command's);
//! the events the command writes and the outcome told to `Jetshard-Reply-To` carry
//! `traceparent` with the command's span id as their parent (docs/WIRE.md).

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

/// A W3C `traceparent`: version 00, a trace id, the id of the parent span, and flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    trace_id: u128,
    parent_id: u64,
    flags: u8,
}

impl TraceParent {
    /// A new trace, sampled, whose root span is `parent_id` (both random).
    pub fn new_root() -> TraceParent {
        let trace_id = (u128::from(random_u64()) << 64) | u128::from(random_u64());
        TraceParent {
            trace_id: trace_id.max(1),
            parent_id: random_u64().max(1),
            flags: 0x01,
        }
    }

    /// The same trace under a new span, a child of this one (a random span id).
    pub fn child(&self) -> TraceParent {
        TraceParent {
            parent_id: random_u64().max(1),
            ..*self
        }
    }

    /// Reads a `traceparent` header value. Versions after 00 are read as 00 says (their first
    /// four fields), as the specification asks; `None` if it is not valid.
    pub fn parse(value: &str) -> Option<TraceParent> {
        let value = value.trim();
        let bytes = value.as_bytes();
        if bytes.len() < 55 || (bytes.len() > 55 && bytes[55] != b'-') {
            return None;
        }
        let lower_hex = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let (version, trace_id, parent_id, flags) = (
            value.get(0..2)?,
            value.get(3..35)?,
            value.get(36..52)?,
            value.get(53..55)?,
        );
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        if ![version, trace_id, parent_id, flags]
            .iter()
            .all(|s| lower_hex(s))
        {
            return None;
        }
        if version == "ff" || (version == "00" && bytes.len() != 55) {
            return None;
        }
        let trace_id = u128::from_str_radix(trace_id, 16).ok()?;
        let parent_id = u64::from_str_radix(parent_id, 16).ok()?;
        if trace_id == 0 || parent_id == 0 {
            return None;
        }
        Some(TraceParent {
            trace_id,
            parent_id,
            flags: u8::from_str_radix(flags, 16).ok()?,
        })
    }

    /// The trace id, as 32 lowercase hex digits when displayed.
    pub fn trace_id(&self) -> TraceId {
        TraceId(self.trace_id)
    }

    /// The parent span's id, as 16 lowercase hex digits when displayed.
    pub fn parent_id(&self) -> SpanId {
        SpanId(self.parent_id)
    }

    /// Whether the caller records this trace (flag `01`).
    pub fn sampled(&self) -> bool {
        self.flags & 0x01 != 0
    }
}

impl fmt::Display for TraceParent {
    /// The header value: `00-<trace id>-<parent id>-<flags>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.parent_id, self.flags
        )
    }
}

/// A trace id; displayed as 32 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub u128);

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// A span id; displayed as 16 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub u64);

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The trace context of one command in this process: the caller's, and the command's own span
/// (a child of it), under which its events and outcome go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CommandTrace {
    pub(crate) caller: TraceParent,
    pub(crate) span: TraceParent,
}

impl CommandTrace {
    /// The context of a command that came with `traceparent: value`, if it is valid.
    /// Boxed: most commands carry none, and a delivery stays small without one.
    pub(crate) fn of(value: &str) -> Option<Box<CommandTrace>> {
        let caller = TraceParent::parse(value)?;
        Some(Box::new(CommandTrace {
            caller,
            span: caller.child(),
        }))
    }
}

/// 64 random bits (std's randomly keyed hasher over a counter: ids, not secrets).
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    RandomState::new().hash_one((COUNTER.fetch_add(1, Ordering::Relaxed), nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_specification_example_reads_and_writes_back() {
        let t = TraceParent::parse(EXAMPLE).expect("valid");
        assert_eq!(t.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id().to_string(), "00f067aa0ba902b7");
        assert!(t.sampled());
        assert_eq!(t.to_string(), EXAMPLE);
    }

    #[test]
    fn invalid_values_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
        // A later version may append fields; its first four are read.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever";
        assert!(TraceParent::parse(later).is_some());
    }

    #[test]
    fn a_child_keeps_the_trace_and_takes_a_new_span() {
        let root = TraceParent::new_root();
        let child = root.child();
        assert_eq!(child.trace_id(), root.trace_id());
        assert_ne!(child.parent_id(), root.parent_id());
        assert_eq!(TraceParent::parse(&child.to_string()), Some(child));
        assert_ne!(TraceParent::new_root().trace_id(), root.trace_id());
    }
}
