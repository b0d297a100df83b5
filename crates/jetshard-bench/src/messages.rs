//! Messages the system under test's connection sends and receives, per command of a pass: the
//! count of requests, deliveries, acknowledgements and replies behind a command (what an entity's
//! first command adds to a warm one, say: its load's reads). jetshard's side registers the
//! client it hands the shard system ([`watch`]); [`crate::drain::timed_passes`] reads it.

use std::sync::{Arc, Mutex, PoisonError};

static WATCHED: Mutex<Vec<Arc<async_nats::Statistics>>> = Mutex::new(Vec::new());

/// Messages counted so far on the watched connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Messages {
    /// Sent by the client: publishes, requests, acknowledgements.
    pub sent: u64,
    /// Received: deliveries, replies, acknowledgements of writes.
    pub received: u64,
}

impl Messages {
    /// The messages counted since `earlier`.
    pub fn since(self, earlier: Messages) -> Messages {
        Messages {
            sent: self.sent.saturating_sub(earlier.sent),
            received: self.received.saturating_sub(earlier.received),
        }
    }
}

/// Counts the messages of `client`'s connection from now on, until [`unwatch`].
pub fn watch(client: &async_nats::Client) {
    *WATCHED.lock().unwrap_or_else(PoisonError::into_inner) = vec![client.statistics()];
}

/// Counts `client`'s messages too, with those of the connection [`watch`]ed (a system on two
/// connections).
pub fn watch_also(client: &async_nats::Client) {
    WATCHED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(client.statistics());
}

/// Stops counting (the next side of a scenario runs on another connection).
pub fn unwatch() {
    WATCHED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clear();
}

/// The watched connection's messages so far; `None` when none is watched.
pub fn now() -> Option<Messages> {
    use std::sync::atomic::Ordering::Relaxed;
    let watched = WATCHED.lock().unwrap_or_else(PoisonError::into_inner);
    if watched.is_empty() {
        return None;
    }
    Some(Messages {
        sent: watched.iter().map(|s| s.out_messages.load(Relaxed)).sum(),
        received: watched.iter().map(|s| s.in_messages.load(Relaxed)).sum(),
    })
}
