//! The journal of a partition on the server: fenced writes ([`JournalWriter`], batched by
//! [`group_commit`]), the fence records that claim a partition's generations ([`fence`]), and
//! reads of what was written ([`read`]).
//!
//! Architecture Invariant: the journal knows nothing of the runtime (owners, entity actors, the
//! crash watch): it imports only `wire/`, `data/` and the crate's leaf modules (errors,
//! telemetry, retry). What it needs to know of the runtime comes in as a narrow trait
//! ([`fence::Liveness`]).

pub(crate) mod chain;
pub(crate) mod compact;
pub(crate) mod direct;
pub(crate) mod fence;
pub(crate) mod group_commit;
pub(crate) mod last_records;
pub(crate) mod read;
pub(crate) mod server;
pub(crate) mod write;

pub(crate) use read::{
    Reads, Record, Scan, SnapshotRecord, StoredEvent, TimerRecord, first_sequence, last_record,
    last_sequence, latest_snapshot, replay, replay_found, replay_known, replay_with, scan,
    snapshot_record, tail_is_known,
};
pub(crate) use server::{WriteError, server_error_code};
pub(crate) use write::{Attached, JournalWriter};
