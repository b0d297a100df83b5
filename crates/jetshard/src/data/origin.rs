//! Where an outbox message came from, and a target entity's bounded memory of the ones it
//! applied, so that a copy of a message is answered as a duplicate and not applied again.
//!
//! The outbox publishes each message with `Nats-Msg-Id`, so a JetStream target within its
//! duplicate window stores it once. That is not enough: nats-server rebuilds a stream's
//! duplicate window from the messages it still holds, and a command stream (work-queue
//! retention) no longer holds the commands already consumed. After a server restart, a message
//! the outbox publishes again (its command had no done record) is stored again. So the target
//! remembers the origin itself: the message carries `Jetshard-Origin`, the events it produced
//! carry it too, and the entity's snapshots carry the origins it remembers.
//!
//! The bound: an entity remembers the last [`ORIGINS_KEPT`] origins whose messages wrote an
//! event, whatever their source. Not a high-water mark per source partition: messages of one
//! source partition reach a target out of order (a message left for recovery is published after
//! later commands' messages), so a mark would drop a message never applied. A copy that arrives
//! after more than [`ORIGINS_KEPT`] later messages were applied to the same entity is applied
//! again.

use std::collections::VecDeque;
use std::fmt;

use async_nats::HeaderMap;

use crate::wire::HDR_ORIGIN;

/// How many origins an entity remembers (the latest; 24 bytes each, only for entities that
/// outbox messages reached).
pub(crate) const ORIGINS_KEPT: usize = 64;

/// The longest `Jetshard-Origin` header read: a longer one is not an origin.
const MAX_ORIGIN_LEN: usize = 200;

/// One outbox message's origin: the source entity type (hashed), its partition, the source
/// command's sequence in its command stream and the message's index among its command's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Origin {
    source: u64,
    partition: u32,
    index: u32,
    seq: u64,
}

impl Origin {
    /// The origin of the `index`th outbox message of command `command_seq` of `entity_type`'s
    /// `partition`.
    #[cfg(test)]
    pub(crate) fn new(entity_type: &str, partition: u32, command_seq: u64, index: usize) -> Self {
        Self {
            source: fnv1a_64(entity_type.as_bytes()),
            partition,
            index: u32::try_from(index).unwrap_or(u32::MAX),
            seq: command_seq,
        }
    }

    /// Reads `<type>:<partition>:<seq>:<index>` (an outbox message's header) or
    /// `#<type hash, hex>:<partition>:<seq>:<index>` (this origin's [`Display`](fmt::Display),
    /// on events and snapshots).
    pub(crate) fn parse(text: &str) -> Option<Self> {
        if text.len() > MAX_ORIGIN_LEN {
            return None;
        }
        let mut tokens = text.rsplitn(4, ':');
        let index = tokens.next()?.parse().ok()?;
        let seq = tokens.next()?.parse().ok()?;
        let partition = tokens.next()?.parse().ok()?;
        let source = match tokens.next()? {
            "" => return None,
            hashed if hashed.starts_with('#') => u64::from_str_radix(&hashed[1..], 16).ok()?,
            entity_type => fnv1a_64(entity_type.as_bytes()),
        };
        Some(Self {
            source,
            partition,
            index,
            seq,
        })
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{:016x}:{}:{}:{}",
            self.source, self.partition, self.seq, self.index
        )
    }
}

/// The origin of a delivered command, if it is an outbox message (`Jetshard-Origin`); boxed,
/// so that a command without one carries a null pointer.
pub(crate) fn origin_of(headers: Option<&HeaderMap>) -> Option<Box<Origin>> {
    // A static name: a `&str` name is copied at every lookup, and this runs for every delivery.
    let name = async_nats::header::HeaderName::from_static(HDR_ORIGIN);
    Origin::parse(headers?.get(name)?.as_str()).map(Box::new)
}

/// The origins an entity remembers, oldest first: nothing allocated until the first.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
// Boxed: every entity's seed holds one, most of them empty: one pointer, not a `VecDeque`'s
// four words, in each dormant entity.
#[allow(clippy::box_collection)]
pub(crate) struct Origins(Option<Box<VecDeque<Origin>>>);

impl Origins {
    /// Whether a message of `origin` was applied (and is still remembered).
    pub(crate) fn contains(&self, origin: &Origin) -> bool {
        self.0.as_ref().is_some_and(|kept| kept.contains(origin))
    }

    /// Remembers `origin` (once), forgetting the oldest beyond [`ORIGINS_KEPT`].
    pub(crate) fn remember(&mut self, origin: Origin) {
        let kept = self.0.get_or_insert_with(Default::default);
        if kept.contains(&origin) {
            return;
        }
        if kept.len() >= ORIGINS_KEPT {
            kept.pop_front();
        }
        kept.push_back(origin);
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|kept| kept.is_empty())
    }

    /// As a snapshot's `Jetshard-Origins` header: the origins oldest first, separated by
    /// spaces; `None` when there are none.
    pub(crate) fn to_header(&self) -> Option<String> {
        let kept = self.0.as_ref().filter(|kept| !kept.is_empty())?;
        let mut text = String::with_capacity(kept.len() * 32);
        for (i, origin) in kept.iter().enumerate() {
            if i > 0 {
                text.push(' ');
            }
            text.push_str(&origin.to_string());
        }
        Some(text)
    }

    /// Reads [`to_header`](Self::to_header)'s text back, skipping what is not an origin (a
    /// snapshot written before origins were kept has none: empty).
    pub(crate) fn from_header(text: &str) -> Self {
        let mut origins = Self::default();
        for origin in text.split(' ').filter_map(Origin::parse) {
            origins.remember(origin);
        }
        origins
    }
}

/// FNV-1a, 64 bits.
fn fnv1a_64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_reads_back_from_the_message_header_and_from_its_own_text() {
        let origin = Origin::new("order", 3, 42, 1);
        let header = crate::wire::origin_header("order", 3, 42, 1);
        assert_eq!(header, "order:3:42:1");
        assert_eq!(Origin::parse(&header), Some(origin));
        assert_eq!(Origin::parse(&origin.to_string()), Some(origin));
        assert_ne!(Origin::parse("stock:3:42:1"), Some(origin));
        assert_ne!(Origin::parse("order:3:42:2"), Some(origin));
        for bad in [
            "",
            "order",
            "order:3:42",
            ":3:42:1",
            "order:x:42:1",
            "#zz:3:42:1",
        ] {
            assert_eq!(Origin::parse(bad), None, "{bad}");
        }
        assert_eq!(Origin::parse(&format!("{}:1:2:3", "t".repeat(300))), None);
    }

    #[test]
    fn an_entity_remembers_the_latest_origins_and_reads_them_back_from_a_snapshot() {
        let mut origins = Origins::default();
        assert!(origins.is_empty());
        assert_eq!(origins.to_header(), None);
        for seq in 0..(ORIGINS_KEPT as u64 + 5) {
            origins.remember(Origin::new("order", 0, seq, 0));
            origins.remember(Origin::new("order", 0, seq, 0));
        }
        assert!(!origins.contains(&Origin::new("order", 0, 4, 0)));
        assert!(origins.contains(&Origin::new("order", 0, 5, 0)));
        assert!(origins.contains(&Origin::new("order", 0, ORIGINS_KEPT as u64 + 4, 0)));
        let header = origins.to_header().unwrap();
        assert_eq!(Origins::from_header(&header), origins);
        assert!(Origins::from_header("").is_empty());
        assert!(Origins::from_header("garbage here").is_empty());
    }

    #[test]
    fn the_memory_costs_a_pointer_until_the_first_origin() {
        assert_eq!(std::mem::size_of::<Origins>(), 8);
    }
}
