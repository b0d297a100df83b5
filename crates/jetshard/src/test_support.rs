//! What jetshard's own tests and benchmarks reach in for, to check the library's choices from
//! outside: the fleet's rendezvous rankings, the tracing targets a stage split filters on, the
//! raw partition hash, a sender's wait for a missing stream. Not part of the API: compiled only
//! with the `test-support` feature, and may change in any release.

pub use crate::command::NO_STREAM_WAIT;
pub use crate::runtime::balance::partition_standbys;
pub use crate::runtime::compaction::PURGE_TARGET as COMPACTION_PURGE_TARGET;
pub use crate::runtime::crash::crash_watchers;
pub use crate::telemetry::STAGE_TARGET as COMMAND_STAGE_TARGET;
pub use crate::wire::partition::fnv1a_32;
