//! The scenario's entity (the bench entity with an outbox message per command and timers) and
//! its systems' configuration, shared by the long runs and the timer reads.

use std::time::Duration;

use anyhow::Context as _;

use jetshard::{Codec, Effects, Entity, ShardConfig, Snapshots};
use serde::{Deserialize, Serialize};

use crate::entity::{BenchEvt, BenchState};

/// The scenario's entity type.
pub(super) const ENTITY_TYPE: &str = "cmp";
/// Its journal stream (`Names::journal_stream`) when the journal is one stream.
pub(super) const JOURNAL: &str = "CMP_JOURNAL";

/// The entity of this scenario: the bench entity with an outbox message per command and
/// timers.
pub struct CompactionEntity;

/// Its commands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum CompactionCmd {
    /// One event carrying `at_ns`, one outbox message; with `timer`, arms `t` 50 ms ahead.
    Work { at_ns: u64, timer: bool },
    /// A timer's command: no event.
    Fire,
    /// Cancels the timers `c0..c<cancel>` and sets `c0..c<set>` an hour ahead.
    Churn { cancel: u32, set: u32 },
    /// Cancels `c0..c<cancel>` and arms `keep` an hour ahead.
    Keep { cancel: u32 },
}

impl Entity for CompactionEntity {
    type Command = CompactionCmd;
    type Event = BenchEvt;
    type State = BenchState;
    type Rejection = String;

    fn decide(state: &BenchState, command: CompactionCmd) -> Result<Vec<BenchEvt>, String> {
        Self::decide_with_effects(state, command, &mut Effects::new(Codec::Json))
    }

    fn decide_with_effects(
        _: &BenchState,
        command: CompactionCmd,
        effects: &mut Effects,
    ) -> Result<Vec<BenchEvt>, String> {
        let hour = Duration::from_secs(3600);
        Ok(match command {
            CompactionCmd::Work { at_ns, timer } => {
                effects.publish(&format!("{ENTITY_TYPE}-sink"), at_ns.to_string());
                if timer {
                    effects.set_timer_after("t", Duration::from_millis(50), &CompactionCmd::Fire);
                }
                vec![BenchEvt::Stamped { at_ns }]
            }
            CompactionCmd::Fire => Vec::new(),
            CompactionCmd::Churn { cancel, set } => {
                for i in 0..cancel {
                    effects.cancel_timer(&format!("c{i}"));
                }
                for i in 0..set {
                    effects.set_timer_after(&format!("c{i}"), hour, &CompactionCmd::Fire);
                }
                Vec::new()
            }
            CompactionCmd::Keep { cancel } => {
                for i in 0..cancel {
                    effects.cancel_timer(&format!("c{i}"));
                }
                effects.set_timer_after("keep", hour, &CompactionCmd::Fire);
                Vec::new()
            }
        })
    }

    fn apply(state: &mut BenchState, event: &BenchEvt) {
        crate::entity::BenchEntity::apply(state, event);
    }

    fn snapshots() -> Option<Snapshots<BenchState>> {
        Some(Snapshots::serde(1))
    }
}

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
