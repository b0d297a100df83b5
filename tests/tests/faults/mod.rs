//! What the fault-injection suites (`chaos.rs`, `cluster.rs`) share: seeds and their random
//! choices ([`seeds`]), faults and the schedules drawn from a seed ([`schedule`]), a load
//! generator that records the history ([`load`]), node processes by slot ([`nodes`]), an R3
//! cluster's servers as targets ([`servers`]), the world a schedule runs in and the faults
//! applied to it ([`world`]), the traffic of every feature at once ([`features`]), and the
//! checks and reporting of a run ([`verify`]). The ledger's model and the journal check are
//! `jetshard_tests::model`.
//!
//! A schedule is a function of its seed: which faults, on which node or partition, when and for
//! how long. The real processes and the server then run in real time, so a seed replays the same
//! schedule, not the same interleaving.

mod features;
mod load;
mod nodes;
mod schedule;
mod seeds;
mod servers;
mod verify;
mod world;

pub use features::*;
pub use load::*;
pub use nodes::*;
pub use schedule::*;
pub use seeds::*;
pub use servers::*;
pub use verify::*;
pub use world::*;
