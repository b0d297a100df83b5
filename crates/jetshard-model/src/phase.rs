//! The phases of a process's owner of one partition, and the library's step-downs.

/// Where a process's owner of one partition stands. The library's phases (`owner/phase.rs`,
/// `Phase`) are the same but for `Acquiring`, which the library spends inside `Standby` (the
/// owner awaits its claim there): see [`Phase::code_name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Pulling without a pin id; the first delivery under a pin makes it acquire.
    Standby,
    /// Claiming a generation under `pin`; `read`: the fence sequence it read (the claim's
    /// expected last sequence), `None` before the read.
    Acquiring {
        /// The pin it was delivered under.
        pin: u8,
        /// The latest fence record's sequence, once read.
        read: Option<u8>,
        /// The command whose delivery pinned it, if that was its first delivery (`first_new`
        /// in `acquire::claim`): from it on, nothing was in hand at an earlier owner.
        first_new: Option<u8>,
    },
    /// Owns the partition under generation `generation`, whose fence record is at `seq`.
    Owning {
        /// The generation.
        generation: u8,
        /// Its fence record's sequence (what every write expects).
        seq: u8,
        /// The pin.
        pin: u8,
    },
    /// Handing off: no new command started; once no write is in flight, it unpins itself.
    Releasing {
        /// The generation.
        generation: u8,
        /// Its fence record's sequence.
        seq: u8,
        /// The pin.
        pin: u8,
    },
    /// Stepped down under `pin` (pin lost, or fenced): will not acquire under it again.
    Refused {
        /// The refused pin.
        pin: u8,
    },
    /// After a hand-off: not pulling, so the partition goes to another process.
    CoolingDown,
}

impl Phase {
    /// The library's name of this phase (`owner/phase.rs`, `enum Phase`).
    pub fn code_name(&self) -> &'static str {
        match self {
            Phase::Standby | Phase::Acquiring { .. } => "Standby",
            Phase::Owning { .. } => "Owning",
            Phase::Releasing { .. } => "Releasing",
            Phase::Refused { .. } => "Refused",
            Phase::CoolingDown => "CoolingDown",
        }
    }

    /// One value of every phase (for the drift test).
    pub fn all() -> [Phase; 6] {
        [
            Phase::Standby,
            Phase::Acquiring {
                pin: 0,
                read: None,
                first_new: None,
            },
            Phase::Owning {
                generation: 0,
                seq: 0,
                pin: 0,
            },
            Phase::Releasing {
                generation: 0,
                seq: 0,
                pin: 0,
            },
            Phase::Refused { pin: 0 },
            Phase::CoolingDown,
        ]
    }

    pub(crate) fn pulls_under(&self, id: u8) -> bool {
        match *self {
            Phase::Acquiring { pin, .. }
            | Phase::Owning { pin, .. }
            | Phase::Releasing { pin, .. } => pin == id,
            _ => false,
        }
    }
}

/// The library's reasons to step down (`owner/settle.rs`, `enum StepDown`) that the model
/// takes: the pin moved away (`PinLost`), a write refused by the fence (`Fenced`), a hand-off
/// (`HandedOff`).
pub const STEP_DOWNS_MODELLED: &[&str] = &["PinLost", "Fenced", "HandedOff"];

/// The reasons to step down the model leaves out, and why (see docs/MODEL.md).
pub const STEP_DOWNS_LEFT_OUT: &[(&str, &str)] = &[
    (
        "PinMoved",
        "a delivery under another pin of the same process: one pin per process at a time here",
    ),
    (
        "DeliveriesLost",
        "deliveries are never lost in transit here: the step down it causes is a PinLost's",
    ),
    (
        "CrashLoop",
        "entity actors are not modelled: a step down refusing the pin like PinLost's, keeping nothing warm like Fenced's",
    ),
    (
        "PullLoopEnded",
        "the pull loop does not end but with its process (a crash)",
    ),
    (
        "Released",
        "a graceful stop is a hand-off followed by a process that never pulls again",
    ),
];
