//! Operating an entity type from any process: who owns which partition, backlogs, pause and
//! resume, moving a pin, dead letters (listed, replayed, purged). Reads and asks the server;
//! needs no running system.

mod compact;
mod dead_letters;
mod handle;

pub use compact::Compacted;
pub use dead_letters::{DeadLetter, DeadLetterPurge, NotADeadLetter, Purged, Replayed};
pub use handle::{Admin, PartitionOverview, overview_table};
