//! The drain protocol the throughput, scaling, latency and cluster scenarios share: start the
//! consumer side (a shard system, or the bare loop), pause every partition's consumer (or hold
//! the bare loop), pre-load the commands round-robin over the entities, resume and time until
//! the work-queue command stream is empty (every command acknowledged), pass after pass.

use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use tokio::time::Instant;

use crate::Options;
use crate::allocs::{self, Allocated};
use crate::bare::BareLoop;
use crate::cpu::{CpuMeter, CpuSpent};
#[cfg(feature = "profiling")]
use crate::instructions::{self, Counted};
use crate::load::{self, CommandPublisher, Gate};
use crate::report::{Row, Worse};

/// jetshard's default `max_ack_pending` (what `--pass-stages` weighs commands in hand against
/// when `--max-ack-pending` is not given).
#[cfg(feature = "profiling")]
const DEFAULT_MAX_ACK_PENDING: u32 = 1024;

/// The entity type the throughput runs use.
pub const ENTITY_TYPE: &str = "bench";

/// What one drain run is given.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DrainSpec {
    /// Partitions.
    pub partitions: u32,
    /// Distinct entities the commands go to.
    pub entities: usize,
    /// Commands per pass.
    pub commands: usize,
    /// Passes (the first is cold).
    pub passes: usize,
    /// The longest a pass may take; a pass cut short reports the rate of what it drained.
    pub time_box: Duration,
    /// jetshard's `pull_batch` (default: jetshard's default).
    pub pull_batch: Option<u32>,
    /// jetshard's `max_ack_pending` (default: jetshard's default).
    pub max_ack_pending: Option<u32>,
    /// jetshard's `passivate_after` (default: jetshard's default, 30 s).
    pub passivate_after: Option<Duration>,
    /// jetshard's `pin_ttl` (`None`: its default); under valgrind a pull loop can be slower
    /// than the default TTL, and its owner then loses the pin.
    pub pin_ttl: Option<Duration>,
    /// The encoded size of each command and of its event (`--command-bytes`; 0: the bare
    /// stamp, about 10 bytes).
    pub command_bytes: usize,
    /// Each pass split by stage (`--pass-stages`, [`crate::pass_stages`]).
    pub stages: bool,
}

impl DrainSpec {
    /// Two passes of `commands` over `options.entities` entities in `partitions` partitions,
    /// each pass boxed at `time_box`, the commands `options.command_bytes` long, with
    /// jetshard's defaults and no stage split.
    pub fn new(options: &Options, partitions: u32, commands: usize, time_box: Duration) -> Self {
        Self {
            partitions,
            entities: options.entities,
            commands,
            passes: 2,
            time_box,
            pull_batch: None,
            max_ack_pending: None,
            passivate_after: None,
            pin_ttl: None,
            command_bytes: options.command_bytes,
            stages: false,
        }
    }
}

/// One timed drain.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Pass {
    /// Commands acknowledged per second.
    pub rate: f64,
    /// Seconds from resume to empty (or to the end of the time box).
    pub secs: f64,
    /// Whether every command was acknowledged within the time box.
    pub complete: bool,
    /// Deliveries beyond one per command (the consumers' delivery counters): commands the
    /// server delivered again because an acknowledgement did not come within the ack wait
    /// (or a nak). Zero on a healthy run.
    pub redeliveries: u64,
    /// CPU spent meanwhile.
    pub cpu: CpuSpent,
    /// Heap allocations of this process (the client side) meanwhile.
    pub allocated: Allocated,
    /// User-space instructions and cycles of this process meanwhile, from its hardware
    /// counters; `None` where the kernel refused them ([`instructions`]).
    #[cfg(feature = "profiling")]
    pub counted: Option<Counted>,
    /// What the kernel did for this process meanwhile: context switches, system calls by
    /// kind, wake-ups ([`crate::kernel`]).
    #[cfg(feature = "profiling")]
    pub kernel: crate::kernel::Kernel,
    /// This process's instructions meanwhile as callgrind counted them, when the harness runs
    /// under it ([`instructions::callgrind`]).
    #[cfg(feature = "profiling")]
    pub callgrind_instructions: Option<u64>,
}

impl Pass {
    /// Client CPU microseconds per command.
    pub fn client_us_per_command(&self, commands: usize) -> f64 {
        self.cpu.client_secs * 1e6 / commands as f64
    }

    /// Client heap allocations per command.
    pub fn allocs_per_command(&self, commands: usize) -> f64 {
        self.allocated.allocs as f64 / commands as f64
    }

    /// Client bytes allocated per command.
    pub fn alloc_bytes_per_command(&self, commands: usize) -> f64 {
        self.allocated.bytes as f64 / commands as f64
    }

    /// Server CPU microseconds per command.
    pub fn server_us_per_command(&self, commands: usize) -> f64 {
        self.cpu.server_secs * 1e6 / commands as f64
    }

    /// Client user-space instructions per command: the hardware's count, else callgrind's;
    /// `None` when neither counted (always without the `profiling` feature).
    #[cfg(not(feature = "profiling"))]
    pub fn instructions_per_command(&self, _commands: usize) -> Option<f64> {
        None
    }

    /// Client user-space instructions per command: the hardware's count, else callgrind's;
    /// `None` when neither counted.
    #[cfg(feature = "profiling")]
    pub fn instructions_per_command(&self, commands: usize) -> Option<f64> {
        let instructions = match self.counted {
            Some(counted) => counted.instructions,
            None => self.callgrind_instructions?,
        };
        Some(instructions as f64 / commands as f64)
    }

    /// Client user-space cycles per command; `None` when not counted (always without the
    /// `profiling` feature).
    pub fn cycles_per_command(&self, commands: usize) -> Option<f64> {
        #[cfg(feature = "profiling")]
        return Some(self.counted?.cycles? as f64 / commands as f64);
        #[cfg(not(feature = "profiling"))]
        {
            let _ = commands;
            None
        }
    }
}

/// The passes of one run, and how often partitions were acquired during it.
#[derive(Debug, Clone, Serialize)]
pub struct DrainRun {
    /// The passes in order (fewer than asked for if a backlog never cleared).
    pub passes: Vec<Pass>,
    /// Acquisitions (jetshard only): more than `partitions` means ownership moved mid-run.
    pub acquisitions: Option<u64>,
}

impl AsRef<DrainRun> for DrainRun {
    fn as_ref(&self) -> &DrainRun {
        self
    }
}

/// A figure of a pass as the drain scenarios report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Figure {
    /// Commands acknowledged per second.
    Rate,
    /// Server CPU microseconds per command.
    ServerCpu,
    /// Client CPU microseconds per command.
    ClientCpu,
    /// Server and client CPU microseconds per command, together.
    TotalCpu,
    /// Cores the servers and the client kept busy over the pass (their CPU per command times
    /// the rate): near the machine's cores, the pass was bound by the CPU.
    CoresBusy,
    /// Client heap allocations per command.
    Allocs,
    /// Client bytes allocated per command.
    AllocBytes,
    /// Client user-space instructions per command (NaN where not counted).
    Instructions,
    /// Client user-space cycles per command (NaN where not counted).
    Cycles,
}

impl Figure {
    /// Its value in `pass`, of `commands` commands.
    pub fn of(self, pass: &Pass, commands: usize) -> f64 {
        match self {
            Figure::Rate => pass.rate,
            Figure::ServerCpu => pass.server_us_per_command(commands),
            Figure::ClientCpu => pass.client_us_per_command(commands),
            Figure::TotalCpu => {
                pass.server_us_per_command(commands) + pass.client_us_per_command(commands)
            }
            Figure::CoresBusy => Figure::TotalCpu.of(pass, commands) * pass.rate / 1e6,
            Figure::Allocs => pass.allocs_per_command(commands),
            Figure::AllocBytes => pass.alloc_bytes_per_command(commands),
            Figure::Instructions => pass.instructions_per_command(commands).unwrap_or(f64::NAN),
            Figure::Cycles => pass.cycles_per_command(commands).unwrap_or(f64::NAN),
        }
    }

    /// Its unit.
    pub fn unit(self) -> &'static str {
        match self {
            Figure::Rate => "cmd/s",
            Figure::ServerCpu | Figure::ClientCpu | Figure::TotalCpu => "us",
            Figure::CoresBusy => "cores",
            Figure::Allocs => "allocs",
            Figure::AllocBytes => "bytes",
            Figure::Instructions => "instructions",
            Figure::Cycles => "cycles",
        }
    }

    /// Which way it gets worse: a rate lower, a cost higher.
    pub fn worse(self) -> Worse {
        match self {
            Figure::Rate => Worse::Lower,
            _ => Worse::Higher,
        }
    }
}

/// The rows of one side's pass over its rounds: each figure's median, its worst round beside
/// it (the rows the throughput and cluster scenarios report per side and pass).
pub struct PassRows<'a, R> {
    scenario: &'static str,
    runs: &'a [R],
    pass: usize,
    commands: usize,
}

impl<'a, R: AsRef<DrainRun>> PassRows<'a, R> {
    /// Pass `pass` (0 is cold) of `runs`, each of `commands` commands per pass.
    pub fn new(scenario: &'static str, runs: &'a [R], pass: usize, commands: usize) -> Self {
        PassRows {
            scenario,
            runs,
            pass,
            commands,
        }
    }

    /// The figure of each round that has the pass (a run that stopped before it has none).
    pub fn rounds(&self, figure: Figure) -> Vec<f64> {
        self.runs
            .iter()
            .filter_map(|r| r.as_ref().passes.get(self.pass))
            .map(|p| figure.of(p, self.commands))
            .collect()
    }

    /// The figure's row, named `case`.
    pub fn row(&self, case: impl Into<String>, figure: Figure) -> Row {
        Row::over_rounds(
            self.scenario,
            case,
            &self.rounds(figure),
            figure.unit(),
            figure.worse(),
        )
    }
}

/// Runs the passes of the protocol against whatever consumes `ENTITY_TYPE`'s partitions.
pub async fn timed_passes(
    server_pids: &[u32],
    control: &async_nats::Client,
    spec: DrainSpec,
    check: impl Fn() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Pass>> {
    timed_passes_polling(server_pids, control, spec, None, check).await
}

/// [`timed_passes`] with the drain polled every `poll` (`None`: [`load::drain`]'s).
pub async fn timed_passes_polling(
    server_pids: &[u32],
    control: &async_nats::Client,
    spec: DrainSpec,
    poll: Option<Duration>,
    check: impl Fn() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Pass>> {
    timed_passes_with(server_pids, control, spec, poll, None, check).await
}

/// [`timed_passes_polling`]; with `hold`, the bare loop is held ([`BareLoop::hold`]) instead of
/// the consumers paused while the commands are pre-loaded.
pub async fn timed_passes_with(
    server_pids: &[u32],
    control: &async_nats::Client,
    spec: DrainSpec,
    poll: Option<Duration>,
    hold: Option<&BareLoop>,
    check: impl Fn() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Pass>> {
    let gate = Gate::new(control.clone(), ENTITY_TYPE, spec.partitions);
    let publisher = CommandPublisher::new(control.clone(), ENTITY_TYPE, spec.entities);
    let mut passes = Vec::new();
    for pass in 0..spec.passes {
        match hold {
            Some(bare) => bare.hold(false).await?,
            None => gate.close().await?,
        }
        publisher
            .preload(spec.commands, &load::preload_command(spec.command_bytes))
            .await?;
        check()?;
        let delivered_before = deliveries(control, spec.partitions).await?;
        let cpu = CpuMeter::start(server_pids);
        let allocated = allocs::now();
        #[cfg(feature = "profiling")]
        let (counted, kernel, recording) = {
            let counted = instructions::now();
            let kernel = crate::kernel::now();
            if instructions::callgrind::running() {
                instructions::callgrind::pass_started();
            }
            let recording = spec.stages.then(crate::pass_stages::PassStages::start);
            (counted, kernel, recording)
        };
        let messages = crate::messages::now();
        let started = Instant::now();
        match hold {
            Some(bare) => bare.hold(true).await?,
            None => gate.open().await?,
        }
        if std::env::var_os("BENCH_DRAIN_DEBUG").is_some() {
            eprintln!(
                "pass {pass} opened at {:?} ({} took {:.1} ms)",
                std::time::SystemTime::now(),
                if hold.is_some() {
                    "the hold's end"
                } else {
                    "the gate's resumes"
                },
                started.elapsed().as_secs_f64() * 1e3
            );
        }
        let drained = load::drain_polling(control, ENTITY_TYPE, spec.time_box, poll).await?;
        let secs = drained.at.duration_since(started).as_secs_f64();
        if std::env::var_os("BENCH_DRAIN_DEBUG").is_some() {
            eprintln!(
                "pass {pass} drained at {:?} after {secs:.2}s",
                std::time::SystemTime::now()
            );
        }
        let acknowledged = (spec.commands as u64).saturating_sub(drained.remaining);
        let cpu = cpu.spent();
        #[cfg(feature = "profiling")]
        let kernel = crate::kernel::now().since(kernel);
        #[cfg(feature = "profiling")]
        if let Some(recording) = recording {
            recording.finish(
                pass,
                spec.max_ack_pending.unwrap_or(DEFAULT_MAX_ACK_PENDING),
            );
        }
        let allocated = allocs::now().since(allocated);
        #[cfg(feature = "profiling")]
        let counted = instructions::now()
            .zip(counted)
            .map(|(now, then)| now.since(then));
        #[cfg(feature = "profiling")]
        let callgrind_instructions = instructions::callgrind::running()
            .then(|| instructions::callgrind::pass_ended(&format!("pass {pass}")))
            .flatten();
        let messages = crate::messages::now()
            .zip(messages)
            .map(|(now, then)| now.since(then));
        let delivered = deliveries(control, spec.partitions)
            .await?
            .saturating_sub(delivered_before);
        let redeliveries = delivered.saturating_sub(spec.commands as u64);
        if redeliveries > 0 {
            eprintln!("  pass {pass}: {redeliveries} commands were delivered more than once");
        }
        let done = Pass {
            rate: acknowledged as f64 / secs,
            secs,
            complete: drained.remaining == 0,
            redeliveries,
            cpu,
            allocated,
            #[cfg(feature = "profiling")]
            counted,
            #[cfg(feature = "profiling")]
            kernel,
            #[cfg(feature = "profiling")]
            callgrind_instructions,
        };
        let per_command = |n: u64| n as f64 / spec.commands as f64;
        eprintln!(
            "  pass {pass}: {:.0} cmd/s, server {:.1} us/cmd, client {:.1} us/cmd, {:.1} allocs / {:.0} B per cmd (by size <64 B, <256, <1K, <4K, <16K, more: {}; over {} B: {:.3}; reallocs {:.2})",
            done.rate,
            done.server_us_per_command(spec.commands),
            done.client_us_per_command(spec.commands),
            done.allocs_per_command(spec.commands),
            done.alloc_bytes_per_command(spec.commands),
            allocated
                .sizes
                .map(|n| format!("{:.1}", per_command(n)))
                .join(" / "),
            allocs::SMALL_BIN_LIMIT,
            per_command(allocated.large),
            per_command(allocated.reallocs),
        );
        if allocated.frees > 0 {
            eprintln!(
                "  pass {pass}: frees {:.1} per cmd, {:.1} of them on another thread than the allocation's",
                per_command(allocated.frees),
                per_command(allocated.cross_frees),
            );
        }
        eprintln!(
            "  pass {pass}: CPU busy {:.2} of the machine's {} cores (client {:.2}, server {:.2})",
            (cpu.client_secs + cpu.server_secs) / secs,
            std::thread::available_parallelism().map_or(0, usize::from),
            cpu.client_secs / secs,
            cpu.server_secs / secs,
        );
        #[cfg(feature = "profiling")]
        {
            eprintln!(
                "  pass {pass}: client user-space instructions per cmd: {}",
                instructions_line(&done, spec.commands)
            );
            eprintln!(
                "  pass {pass}: the client's kernel: {}",
                kernel.line(spec.commands)
            );
        }
        if let Some(messages) = messages {
            eprintln!(
                "  pass {pass}: the system's connection: {:.2} messages sent, {:.2} received per cmd",
                per_command(messages.sent),
                per_command(messages.received)
            );
        }
        passes.push(done);
        if drained.remaining > 0 {
            eprintln!(
                "  pass {pass} did not drain within {:?}: {} commands left",
                spec.time_box, drained.remaining
            );
            if pass + 1 < spec.passes {
                // The next pass starts from an empty stream; if the backlog does not clear
                // within another time box, the remaining passes are not run.
                let rest = load::drain(control, ENTITY_TYPE, spec.time_box).await?;
                if rest.remaining > 0 {
                    eprintln!(
                        "  the backlog did not clear ({} commands left); skipping the remaining passes",
                        rest.remaining
                    );
                    break;
                }
            }
        }
        check()?;
    }
    Ok(passes)
}

/// Deliveries so far over every partition's consumer (their consumer sequences).
async fn deliveries(control: &async_nats::Client, partitions: u32) -> anyhow::Result<u64> {
    let names = jetshard::wire::Names::new(ENTITY_TYPE);
    let js = async_nats::jetstream::new(control.clone());
    let stream = js
        .get_stream_no_info(names.command_stream(0))
        .await
        .context("open the command stream")?;
    let mut total = 0;
    for partition in 0..partitions {
        // Under valgrind a request can time out while the server is fine: a few more tries.
        let mut tries = 0;
        let info = loop {
            match stream.consumer_info(names.consumer(partition)).await {
                Ok(info) => break info,
                Err(e) if tries < 5 => {
                    tries += 1;
                    eprintln!("  read the consumer of partition {partition}: {e}; asking again");
                }
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("read the consumer of partition {partition}"));
                }
            }
        };
        total += info.delivered.consumer_sequence;
    }
    Ok(total)
}

#[cfg(feature = "profiling")]
/// A pass's instructions and cycles per command as printed: the hardware's, callgrind's, or
/// "n/a" and why.
fn instructions_line(pass: &Pass, commands: usize) -> String {
    let per_command = |n: u64| n as f64 / commands as f64;
    let mut line = match pass.counted {
        Some(counted) => format!(
            "{:.0}, cycles {} (perf counters{})",
            per_command(counted.instructions),
            counted
                .cycles
                .map_or("n/a".to_owned(), |c| format!("{:.0}", per_command(c))),
            if counted.scaled {
                ", multiplexed: scaled estimates"
            } else {
                ""
            }
        ),
        None => format!(
            "n/a (perf_event_open: {})",
            instructions::refused().unwrap_or_else(|| "no counted thread".to_owned())
        ),
    };
    if let Some(instructions) = pass.callgrind_instructions {
        line.push_str(&format!("; callgrind: {:.0}", per_command(instructions)));
    } else if instructions::callgrind::running() {
        line.push_str("; callgrind: its dump not found in the working directory");
    }
    line
}
