//! The bench entity family: as small as an entity can be, so that what is measured is the
//! framework. One set of commands and events ([`BenchCmd`], [`BenchEvt`]) folded by one
//! [`Bench`] entity into a state of the scenario's shape ([`BenchState`], or [`CountState`]
//! without the blob), with snapshots or without; and [`CompactionEntity`], the same events and
//! state behind commands with an outbox message and timers.

use std::marker::PhantomData;
use std::time::Duration;

use jetshard::{Codec, Effects, Entity, Snapshots};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The bench entity family: the bench's commands and events, folded into the state `S`,
/// with snapshots (jetshard's default, `SNAPSHOTS`) or without.
pub struct Bench<S = BenchState, const SNAPSHOTS: bool = true>(PhantomData<fn() -> S>);

/// The entity every scenario runs, with jetshard's defaults untouched (snapshots on).
pub type BenchEntity = Bench<BenchState, true>;

/// The bench entity without snapshots (it opts out: [`Entity::snapshots`] returns `None`): each
/// load of an entity replays its whole history. The comparison for jetshard's default
/// ([`BenchEntity`], which writes snapshots every 100 events, on passivation and when a
/// partition is handed over).
pub type UnsnapshottedBenchEntity = Bench<BenchState, false>;

/// The recovery scenarios' bench entity (snapshots on): a state without the blob
/// ([`CountState`]).
pub type RecoveryEntity = Bench<CountState, true>;

/// The bench commands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum BenchCmd {
    /// Emit one `Stamped` event carrying `at_ns` (the latency scenario's send time).
    Stamp { at_ns: u64 },
    /// [`Stamp`](Self::Stamp) with `pad` bytes carried into its event (`Padded`), so that a
    /// command and its event weigh what the scenario asks (`--command-bytes`).
    Padded { at_ns: u64, pad: Vec<u8> },
    /// Emit no event: the command is applied and acknowledged without a journal write
    /// (the memory scenario activates entities with it).
    Touch,
}

/// The bench events.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum BenchEvt {
    /// A `Stamp` command was applied.
    Stamped { at_ns: u64 },
    /// A `Padded` command was applied.
    Padded { at_ns: u64, pad: Vec<u8> },
    /// Sets the entity's blob: the memory scenario's "small state".
    Filled { blob: Vec<u8> },
}

/// A state of the bench entity family: what folding one [`BenchEvt`] into it does.
pub trait BenchFold: Default + Serialize + DeserializeOwned + Send + 'static {
    /// Folds `event` in.
    fn fold(&mut self, event: &BenchEvt);
}

/// The bench state: a counter, the last stamp, and an optional blob.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct BenchState {
    /// Events applied.
    pub count: u64,
    /// The last `Stamped` value.
    pub last_at_ns: u64,
    /// The last `Filled` blob.
    pub blob: Vec<u8>,
}

impl BenchFold for BenchState {
    fn fold(&mut self, event: &BenchEvt) {
        self.count += 1;
        match event {
            BenchEvt::Stamped { at_ns } | BenchEvt::Padded { at_ns, .. } => {
                self.last_at_ns = *at_ns
            }
            BenchEvt::Filled { blob } => self.blob.clone_from(blob),
        }
    }
}

/// [`BenchState`] without the blob (the recovery scenarios' state).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct CountState {
    /// Events applied.
    pub count: u64,
    /// The last `Stamped` value.
    pub last_at_ns: u64,
}

impl BenchFold for CountState {
    fn fold(&mut self, event: &BenchEvt) {
        self.count += 1;
        if let BenchEvt::Stamped { at_ns } | BenchEvt::Padded { at_ns, .. } = event {
            self.last_at_ns = *at_ns;
        }
    }
}

impl<S: BenchFold, const SNAPSHOTS: bool> Entity for Bench<S, SNAPSHOTS> {
    type Command = BenchCmd;
    type Event = BenchEvt;
    type State = S;
    type Rejection = String;

    fn decide(_: &S, command: BenchCmd) -> Result<Vec<BenchEvt>, String> {
        Ok(command.events())
    }

    fn apply(state: &mut S, event: &BenchEvt) {
        state.fold(event);
    }

    fn snapshots() -> Option<Snapshots<S>> {
        // jetshard's default, or none.
        SNAPSHOTS.then(|| Snapshots::serde(1))
    }
}

/// The compaction and overload scenarios' entity type.
pub const COMPACTION_TYPE: &str = "cmp";

/// The compaction and overload scenarios' entity: the bench entity with an outbox message per command and
/// timers.
pub struct CompactionEntity;

/// The commands of [`CompactionEntity`].
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
                effects.publish(&format!("{COMPACTION_TYPE}-sink"), at_ns.to_string());
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
        state.fold(event);
    }
}

impl BenchCmd {
    /// What the bench entity decides on it, whatever its state.
    pub fn events(self) -> Vec<BenchEvt> {
        match self {
            BenchCmd::Stamp { at_ns } => vec![BenchEvt::Stamped { at_ns }],
            BenchCmd::Padded { at_ns, pad } => vec![BenchEvt::Padded { at_ns, pad }],
            BenchCmd::Touch => Vec::new(),
        }
    }

    /// A stamp carrying `at_ns` whose encoding (bincode) is about `bytes` long: a
    /// [`Padded`](Self::Padded) one, or the bare [`Stamp`](Self::Stamp) for 0.
    pub fn stamp_of_size(at_ns: u64, bytes: usize) -> Self {
        if bytes == 0 {
            return BenchCmd::Stamp { at_ns };
        }
        // The variant, `at_ns` and the pad's length take at most 11 bytes.
        let pad = vec![b'x'; bytes.saturating_sub(11)];
        BenchCmd::Padded { at_ns, pad }
    }
}

/// The id of the `index`th bench entity.
pub fn entity_id(index: usize) -> String {
    format!("e{index}")
}
