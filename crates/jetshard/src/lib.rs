//! jetshard
