//! The bare loop's settings: [`Knob`]s (one difference each, switched on for an experiment)
//! and [`BareSettings`].

/// One way of running this loop, switched on for an experiment (`jetshard-bench throughput
/// --bare-knob <knob>`: rounds alternate the loop without and with it, in one run, so that what
/// each costs the server is measured against the same machine load). Without knobs the loop
/// runs on jetshard's streams, with jetshard's headers, behind the harness's pause gate; the
/// throughput scenario runs it [`BareSettings::careful`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
pub enum Knob {
    /// Events carry only the server's headers (fence check and `Nats-Msg-Id`), not
    /// `Jetshard-Generation` / `Jetshard-Command-Seq`.
    NoJetshardHeaders,
    /// `Nats-Msg-Id` is `e<command seq>` (as `bareloop`'s), not `<t>:<command seq>:0`.
    ShortMsgId,
    /// No `Nats-Msg-Id` at all (not exactly-once: the experiment only).
    NoMsgId,
    /// The journal's duplicate window is the server's default (2 min), not jetshard's 10 min.
    DefaultDuplicateWindow,
    /// The command's payload is published as the event, not decoded, decided and encoded.
    PassPayload,
    /// The journal holds no seed event per entity before the run.
    NoSeed,
    /// The drain is polled every 500 ms (not every 50 ms, 2 ms near the end).
    SlowDrainPoll,
    /// Each pull asks for 1,000 commands (not 500).
    PullBatch1000,
    /// The consumers are not paused while the commands are pre-loaded: the loop pulls nothing
    /// then, and starts pulling (a new pull stream, the pins moved off the old ones) when the
    /// pass starts, as `bareloop` starts its loop after the fill ([`BareLoop::hold`](super::BareLoop::hold)).
    NoPause,
    /// The loop drains streams and consumers it creates itself, as a user writing the loop by
    /// hand would ([`provision_own`](super::provision_own)): the journal holds only events and fence records, with
    /// the server's default duplicate window and no atomic batches, roll-ups or direct gets;
    /// not the streams jetshard provisions.
    OwnStreams,
}

impl Knob {
    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// How a bare loop runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct BareSettings {
    /// Event writes in flight per partition (0: [`IN_FLIGHT`](super::IN_FLIGHT)).
    pub in_flight: usize,
    /// The experiment's differences, one bit per [`Knob`].
    knobs: u32,
}

impl BareSettings {
    /// The loop a user writes by hand, driven as `bareloop` is: [`Knob::OwnStreams`],
    /// [`Knob::NoJetshardHeaders`], [`Knob::NoPause`]. Measured against the loop without them
    /// (docs/PERFORMANCE.md, "throughput"), only the pause gate moved the server's CPU per command.
    pub fn careful() -> Self {
        Self::with(&[Knob::OwnStreams, Knob::NoJetshardHeaders, Knob::NoPause])
    }

    /// The default loop with `knobs` switched on.
    pub fn with(knobs: &[Knob]) -> Self {
        Self {
            in_flight: 0,
            knobs: knobs.iter().fold(0, |bits, knob| bits | knob.bit()),
        }
    }

    /// Whether `knob` is switched on.
    pub fn has(&self, knob: Knob) -> bool {
        self.knobs & knob.bit() != 0
    }
}
