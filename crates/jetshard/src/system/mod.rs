//! The shard system: one entity type's partitions in this process, under one supervisor.
//!
//! | file | what |
//! |---|---|
//! | `handle.rs` | [`ShardSystem`], the handle: start (streams provisioned, the system actor spawned), its accessors, `status`, `health`, `shutdown`; `start_split` and `Split`, an experiment's seam (a second connection; not API) |
//! | `state.rs` | the system actor's messages (`SystemMsg`) and state (`SystemState`) |
//! | `actor.rs` | the system actor: the tasks it owns started (liveness answers, crash watch, status and heartbeat listeners), an owner per partition spawned, supervised and restarted, the stop |
//! | `balance.rs` | balancing rounds: heartbeats, hand-offs, who stands by and who holds back |

mod actor;
mod balance;
mod handle;
mod state;

pub use handle::{ShardSystem, Split};
