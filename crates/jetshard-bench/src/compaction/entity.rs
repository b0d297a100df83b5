//! The scenario's entity ([`CompactionEntity`]: the bench entity with an outbox message per
//! command and timers) and its systems' configuration, shared by the long runs and the timer
//! reads.

use std::time::Duration;

use anyhow::Context as _;

use jetshard::{Codec, ShardConfig};

pub use crate::entity::{CompactionCmd, CompactionEntity};

/// The scenario's entity type.
pub(super) const ENTITY_TYPE: &str = crate::entity::COMPACTION_TYPE;
/// Its journal stream (`Names::journal_stream`) when the journal is one stream.
pub(super) const JOURNAL: &str = "CMP_JOURNAL";

/// The long runs' configuration; `compaction`: background compaction every `interval`, or off.
pub(super) fn config(
    partitions: u32,
    snapshot_every: u32,
    compaction: Option<Duration>,
    replicas: usize,
    journal_streams: u32,
) -> anyhow::Result<ShardConfig> {
    let builder = ShardConfig::builder(ENTITY_TYPE)
        .partitions(partitions)
        .replicas(replicas)
        .journal_streams(journal_streams)
        .node_id("bench")
        .codec(Codec::Json)
        .snapshot_every(snapshot_every);
    let builder = match compaction {
        Some(interval) => builder.compaction_interval(interval),
        None => builder.compaction(false),
    };
    Ok(builder.build()?)
}

/// The long runs' `i`-th command (to entity `ids[i % ids.len()]` of the entity type `names`
/// names, every tenth command of an entity arming a timer), stamped `at_ns`, and its subject:
/// the compaction and overload scenarios offer the same load.
pub(crate) fn work(
    names: &jetshard::wire::Names,
    ids: &[String],
    i: usize,
    at_ns: u64,
) -> anyhow::Result<(String, bytes::Bytes)> {
    let entity = i % ids.len();
    let timer = (i / ids.len()).is_multiple_of(10);
    let command = CompactionCmd::Work { at_ns, timer };
    let payload = Codec::Json.encode(&command).context("encode a command")?;
    let id = jetshard::EntityId::new(&ids[entity]).context("a bench entity id")?;
    Ok((names.command_subject(&id), payload.into()))
}
