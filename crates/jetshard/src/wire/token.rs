//! Tokens and keys jetshard makes up: unique tokens (batch ids, incarnations) and the
//! rendezvous-hashing keys every process of a fleet must spell alike.

/// A unique token (batch ids, incarnations): the process id, a clock reading and a counter, in
/// hex (a valid subject token).
pub(crate) fn unique_token() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{:x}{:x}{:x}",
        std::process::id(),
        nanos,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The rendezvous-hashing key under which processes rank themselves as watchers of the node
/// `node` (the crash watch): every process of a fleet must spell it alike.
pub(crate) fn watch_key(node: &str) -> String {
    format!("watch:{node}")
}

/// The rendezvous-hashing key under which processes rank themselves as standbys of
/// `partition`: every process of a fleet must spell it alike.
pub(crate) fn standby_key(partition: u32) -> String {
    format!("p{partition}")
}
