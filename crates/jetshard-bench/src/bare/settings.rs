//! The bare loop's settings ([`BareSettings`]).

/// How a bare loop runs. The default runs on jetshard's streams, with jetshard's headers,
/// behind the harness's pause gate; the throughput scenario runs it [`BareSettings::careful`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BareSettings {
    /// Event writes in flight per partition (0: [`IN_FLIGHT`](super::IN_FLIGHT)).
    pub in_flight: usize,
    /// Events carry only the server's headers (fence check and `Nats-Msg-Id`), not
    /// `Jetshard-Generation` / `Jetshard-Command-Seq`.
    pub server_headers_only: bool,
    /// The consumers are not paused while the commands are pre-loaded: the loop pulls nothing
    /// then, and starts pulling (a new pull stream, the pins moved off the old ones) when the
    /// pass starts, as `bareloop` starts its loop after the fill
    /// ([`BareLoop::hold`](super::BareLoop::hold)).
    pub held: bool,
}

impl BareSettings {
    /// The loop a user writes by hand, driven as `bareloop` is: with the server's headers only,
    /// held rather than paused during the fill (its drain also runs it on streams of its own,
    /// [`provision_own`](super::provision_own)). Measured against the loop without them
    /// (docs/PERFORMANCE.md, "throughput"), only the pause gate moved the server's CPU per
    /// command.
    pub fn careful() -> Self {
        Self {
            in_flight: 0,
            server_headers_only: true,
            held: true,
        }
    }
}
