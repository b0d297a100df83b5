//! TEMPORARY (issue 22 investigation): aggregated timings of the command path.
#![allow(missing_docs)]
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

pub struct Stat {
    pub n: AtomicU64,
    pub ns: AtomicU64,
}
const Z: Stat = Stat {
    n: AtomicU64::new(0),
    ns: AtomicU64::new(0),
};
pub static STATS: [Stat; 8] = [Z, Z, Z, Z, Z, Z, Z, Z];
pub const NAMES: [&str; 8] = [
    "queue(work->process)",
    "load_sem_wait",
    "load_read",
    "decide",
    "write(append)",
    "total(work->report)",
    "loads_with_history",
    "report->ack",
];
pub fn add(i: usize, d: Duration) {
    STATS[i].n.fetch_add(1, Relaxed);
    STATS[i].ns.fetch_add(d.as_nanos() as u64, Relaxed);
}
pub fn take() -> Vec<(&'static str, u64, u64)> {
    STATS
        .iter()
        .zip(NAMES)
        .map(|(s, name)| (name, s.n.swap(0, Relaxed), s.ns.swap(0, Relaxed)))
        .collect()
}
