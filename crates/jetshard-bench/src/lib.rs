//! # jetshard-bench
//!
//! What jetshard costs over writing the JetStream loop by hand, how fast it recovers, and how
//! much memory an entity takes. Twelve scenarios, each against a fresh `nats-server` from
//! `jetshard-testkit`, each against a baseline measured in the same run, because the machines
//! are shared and noisy: ratios are steadier than absolute figures.
//!
//! | scenario | measures | baseline |
//! |---|---|---|
//! | `throughput` | commands/s drained end to end, cold and warm | the bare async-nats loop ([`bare`]) |
//! | `latency` | publish -> durable event, p50/p99/p999 at 50% of the warm maximum | - |
//! | `failover` | SIGKILL / SIGSTOP of the owner -> first event of the new owner | pin TTL + 300 ms |
//! | `memory` | RSS per resident entity, idle and with state, with and without passivation | - |
//! | `scaling` | throughput at 1..256 partitions and 1..3 processes | the bare loop (partitions) |
//! | `cluster` | commands/s on 3 servers with R3 streams, cold and warm; 10164 refusals | the serialized bare loop ([`cluster`]) |
//! | `fleet` (was `scale`) | idle messages and CPU per process and per partition as the fleet grows; time to an even spread; SIGKILL failover in a fleet | the same figure at the smallest fleet |
//! | `recovery` (also `rebuild`) | events an acquisition replays (none); acquisition -> first command with a long history; first-command latency; dormant memory; snapshot cost | the full replay of the partition; loaded entities; snapshots off |
//! | `compaction` | journal messages and bytes over a long run; command p99; the acquisition's timer read after 100k timers | compaction off; 1k timers ever set |
//! | `overload` | a SIGSTOP of the server (or of the journal's leader on R3, or a SIGKILL of a node) at a sustainable rate: seconds until the backlog drains, the completed rate after the fault | the offered rate; the latency before the fault |
//! | `spread` | on 5 servers with R3 streams, the journal in one stream against spread over five: each server's CPU at a fixed rate, latency, maximum rate | one journal stream |
//! | `loads` | one entity's load (latency, server CPU) with 10x more records of other entities in the journal | the same with 1x; a journal written without links |
//!
//! Figures are printed as a table and written as JSON; targets are reported, never asserted.
//! A figure measured over rounds is their median, with the worst round beside it (`worst`,
//! `n` rounds); a single measurement is its own worst.
//! Run everything at default sizes (about 35 minutes on 2 cores) with
//! `cargo run --release -p jetshard-bench` or `cargo bench -p jetshard-bench`.

pub mod allocs;
pub mod bare;
pub mod bareloop;
pub mod cluster;
pub mod compaction;
pub mod cpu;
pub mod cpu_cap;
pub mod drain;
pub mod entity;
pub mod failover;
pub mod fleet;
#[cfg(feature = "profiling")]
pub mod instructions;
#[cfg(feature = "profiling")]
pub mod kernel;
pub mod latency;
pub mod load;
pub mod loads;
pub mod memory;
pub mod messages;
pub mod node;
pub mod offered;
pub mod overload;
#[cfg(feature = "profiling")]
pub mod pass_stages;
pub mod probe;
pub mod recovery;
pub mod report;
pub mod runqueue;
pub mod scaling;
pub mod server;
pub mod spread;
pub mod stages;
pub mod stats;
pub mod throughput;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;

use crate::report::{Meta, Report};

/// The scenarios, in the order `all` runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
pub enum Scenario {
    /// Commands/s through jetshard against the bare loop.
    Throughput,
    /// Publish -> durable event latency at a fixed offered rate.
    Latency,
    /// Owner SIGKILL / SIGSTOP -> first command processed by the new owner.
    Failover,
    /// RSS per resident entity.
    Memory,
    /// Throughput over partition and process counts.
    Scaling,
    /// Throughput on a 3-server cluster with R3 streams, against serialized and pipelined bare
    /// loops.
    Cluster,
    /// Bounded recovery: what an acquisition reads (nothing of the journal), lazy loading,
    /// snapshots, the dormant budget (formerly also `rebuild`, still accepted).
    #[value(alias = "rebuild")]
    Recovery,
    /// Idle cost of a fleet per process and per partition as it grows, and a SIGKILL
    /// failover in a fleet (formerly `scale`, still accepted).
    #[value(alias = "scale")]
    Fleet,
    /// The journal bounded by background compaction: size over a long run, command latency
    /// with compaction on and off, the acquisition's timer read after many timers.
    Compaction,
    /// A stall (SIGSTOP of the server) at a sustainable rate: whether and when the backlog
    /// drains and the completed rate comes back to the offered rate.
    Overload,
    /// One entity's load with 10x more records of other entities in the journal: the same
    /// latency and server CPU (it reads the entity's own records only).
    Loads,
    /// On a 5-server cluster, the journal in one stream against spread over five: each
    /// server's CPU at a fixed rate, the latency and the maximum rate.
    Spread,
}

/// The sizes and settings of a run.
#[derive(Args, Debug, Clone, Serialize)]
pub struct Options {
    /// Commands per throughput pass.
    #[arg(long, default_value_t = 100_000)]
    pub commands: usize,
    /// Entities the throughput and latency commands go to.
    #[arg(long, default_value_t = 10_000)]
    pub entities: usize,
    /// Partitions of the throughput and latency scenarios.
    #[arg(long, default_value_t = 8)]
    pub partitions: u32,
    /// Never-seen entities given one command each, to measure jetshard's first-command path
    /// (0 skips it).
    #[arg(long, default_value_t = 2_000)]
    pub fresh_entities: usize,
    /// Throughput: run only jetshard's side, no bare loop and no never-seen entities (for
    /// profiling jetshard under `perf`).
    #[arg(long, conflicts_with = "bare_only")]
    pub jetshard_only: bool,
    /// Throughput: run only the bare loop, no jetshard and no never-seen entities (for
    /// profiling the baseline, or comparing it with another loop).
    #[arg(long)]
    pub bare_only: bool,
    /// Throughput: the independent `bareloop` binary (a hand-written async-nats command loop,
    /// built apart from this project), run every round beside the bench's bare loop; the bench's
    /// loop is checked against its `B-loop-pinned` figure (within 10%).
    #[arg(long, env = "BARELOOP_BIN")]
    pub bareloop: Option<PathBuf>,
    /// Throughput, cluster, scaling and latency: the encoded size of each command and of its
    /// event, in bytes. The default, 128, is `bareloop`'s payload, so that both loops do the
    /// same work; 0 sends the bare stamp (about 10 bytes). The size matters to the server: see
    /// docs/PERFORMANCE.md "What the server's consumer lookup costs".
    #[arg(long, default_value_t = 128)]
    pub command_bytes: usize,
    /// Throughput: jetshard's `pull_batch` (default: jetshard's default, 256).
    #[arg(long)]
    pub pull_batch: Option<u32>,
    /// Throughput: jetshard's `max_ack_pending` (default: jetshard's default, 1024).
    #[arg(long)]
    pub max_ack_pending: Option<u32>,
    /// Throughput: jetshard's `passivate_after`, in seconds (default: jetshard's default, 30 s).
    /// Under valgrind a pass takes minutes: a longer one keeps the warm pass's actors live.
    #[arg(long)]
    pub passivate_after_secs: Option<u64>,
    /// Throughput: how long each pass may take to drain, in seconds. Under callgrind's cache
    /// simulation a cold pass of 10,000 entities takes longer than the default.
    #[arg(long, default_value_t = 120)]
    pub time_box_secs: u64,
    /// Throughput: jetshard's `pin_ttl`, in seconds (default: jetshard's default, 2 s). Under
    /// callgrind's cache simulation a pull loop can be slower than that, and its owner then
    /// steps down and reloads its entities in the middle of a pass.
    #[arg(long)]
    pub pin_ttl_secs: Option<u64>,
    /// Throughput rounds (bare, then jetshard, each round); medians are reported, with the
    /// worst round beside them.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Commands of each long run of the compaction scenario (the 2M takes hours on
    /// a shared 2-core machine at the default rate).
    #[arg(long, default_value_t = 100_000)]
    pub compaction_commands: usize,
    /// Offered rate of the compaction scenario's long runs, commands/s.
    #[arg(long, default_value_t = 2_000.0)]
    pub compaction_rate: f64,
    /// Snapshot interval (events) of the compaction scenario's long runs.
    #[arg(long, default_value_t = 10)]
    pub compaction_snapshot_every: u32,
    /// Rounds of the compaction scenario's long runs (compaction off, then on, each round;
    /// 0: none). Medians of the rounds are reported, with the worst beside them.
    #[arg(long, default_value_t = 1)]
    pub compaction_rounds: usize,
    /// Whether each round of the compaction scenario's long runs starts with the baseline,
    /// compaction off (false: only compaction on, for a long run whose journal would not fit
    /// the disk without it; the latency target then has nothing to compare against).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub compaction_baseline: bool,
    /// Whether the compaction scenario measures the acquisition's timer read (false: only the
    /// long runs).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub compaction_timer_reads: bool,
    /// Background compaction's interval in the compaction scenario's long runs, seconds (the
    /// library's default is 30; 2 compresses a long run in time).
    #[arg(long, default_value_t = 2)]
    pub compaction_interval_secs: u64,
    /// Stream replicas of the compaction scenario's long runs: 1 (one server)
    /// or 3 (a 3-server cluster with R3 streams).
    #[arg(long, default_value_t = 1)]
    pub compaction_replicas: usize,
    /// Streams the compaction scenario's long runs spread their journal over
    /// (`ShardConfig::journal_streams`).
    #[arg(long, default_value_t = 1)]
    pub journal_streams: u32,
    /// Offered rate of the overload scenario, commands/s (one that the machine sustains).
    #[arg(long, default_value_t = 800.0)]
    pub overload_rate: f64,
    /// Seconds the overload scenario offers its rate.
    #[arg(long, default_value_t = 150)]
    pub overload_secs: u64,
    /// When the overload scenario injects its fault, seconds into the load.
    #[arg(long, default_value_t = 40)]
    pub overload_stall_at: u64,
    /// How long the overload scenario keeps the server (or the journal's leader) frozen, seconds.
    #[arg(long, default_value_t = 15)]
    pub overload_stall_secs: u64,
    /// The overload scenario's fault at `--overload-stall-at`: the server frozen, the busier of
    /// two node processes SIGKILLed, or the journal's leader of a 3-server cluster frozen.
    #[arg(long, value_enum, default_value_t = overload::Fault::Stall)]
    pub overload_fault: overload::Fault,
    /// Background compaction's interval in the overload scenario, seconds (0: off).
    #[arg(long, default_value_t = 30)]
    pub overload_compaction_interval_secs: u64,
    /// How long the overload scenario's producer waits for a publish's acknowledgement before
    /// it sends the command again, milliseconds (5,000: the client's default ack timeout).
    #[arg(long, default_value_t = 5000)]
    pub overload_resend_ms: u64,
    /// Records of other entities in the journal of the loads scenario's baseline case.
    #[arg(long, default_value_t = 100_000)]
    pub loads_others: usize,
    /// How many times as many other records the loads scenario's grown case holds.
    #[arg(long, default_value_t = 10)]
    pub loads_factor: usize,
    /// Entities loaded (one after another) in each case of the loads scenario.
    #[arg(long, default_value_t = 2000)]
    pub loads_targets: usize,
    /// Events of each loaded entity (no snapshot: all read by its load).
    #[arg(long, default_value_t = 8)]
    pub loads_tail: usize,
    /// Replicas of the loads scenario's streams (3: on a 3-server cluster).
    #[arg(long, default_value_t = 1)]
    pub loads_replicas: usize,
    /// Commands per pass of the cluster scenario (3 servers, R3 streams).
    #[arg(long, default_value_t = 20_000)]
    pub cluster_commands: usize,
    /// Rounds of the cluster scenario (serialized bare, pipelined bare, jetshard, each round).
    #[arg(long, default_value_t = 1)]
    pub cluster_rounds: usize,
    /// Rounds of the spread scenario (one journal stream, then as many as servers, each round).
    #[arg(long, default_value_t = 1)]
    pub spread_rounds: usize,
    /// Servers of the spread scenario's cluster, 3 to 5: its spread layout has as many streams
    /// each. With 3, every server holds a replica of every stream in both layouts, so the two
    /// differ only in the number of raft groups and where they are led.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(3..=5))]
    pub spread_servers: u8,
    /// Offered rate of the spread scenario, commands/s.
    #[arg(long, default_value_t = 1_500.0)]
    pub spread_rate: f64,
    /// Seconds of the spread scenario's offered load (after a 2-s warm-up).
    #[arg(long, default_value_t = 20)]
    pub spread_secs: u64,
    /// Partitions of the spread scenario.
    #[arg(long, default_value_t = 10)]
    pub spread_partitions: u32,
    /// Commands of the spread scenario's backlog (its maximum rate).
    #[arg(long, default_value_t = 100_000)]
    pub spread_drain_commands: usize,
    /// Caps each server of the spread scenario at this many cores (a CPU cgroup of its own,
    /// needs root): servers on machines of their own, each that size, instead of all on every
    /// core of this one.
    #[arg(long)]
    pub spread_server_cores: Option<f64>,
    /// Seconds of measured latency load.
    #[arg(long, default_value_t = 10)]
    pub latency_secs: u64,
    /// Latency rounds (bare, then jetshard, each round); medians of the percentiles are
    /// reported.
    #[arg(long, default_value_t = 2)]
    pub latency_rounds: usize,
    /// Offered rate of the latency scenario, commands/s (default: half the warm throughput
    /// measured in this run, or measured first if throughput is not run).
    #[arg(long)]
    pub latency_rate: Option<f64>,
    /// Latency and spread: also split each command's latency by stage (stored, pulled,
    /// routed, started, written, seen, acked; jetshard's stage trace events and the bare
    /// loop's) and print each stage's p50/p99 beside the total; spread also prints each
    /// process's time on a CPU and waiting for one.
    #[arg(long)]
    pub latency_stages: bool,
    /// Throughput and cluster: split each pass by stage (jetshard's stage trace events): the
    /// commands that loaded their entity beside the others, commands in hand per partition
    /// against `max_ack_pending`, pull requests, batched reads and loads at once
    /// (`pass_stages.rs`). Recording costs CPU: the rates of such a run are not figures.
    /// Needs a build with `--features profiling`.
    #[arg(long)]
    pub pass_stages: bool,
    /// Events in the partition of the recovery scenario.
    #[arg(long, default_value_t = 200_000)]
    pub recovery_events: usize,
    /// Entities those events belong to.
    #[arg(long, default_value_t = 20_000)]
    pub recovery_entities: usize,
    /// Failover trials per pin TTL and signal.
    #[arg(long, default_value_t = 20)]
    pub failover_trials: usize,
    /// A pause before each failover trial, milliseconds, once the commands the last takeover
    /// recovered are acknowledged. Takeovers that follow each other within a second or two
    /// are faster than one after a quiet spell, which is what a real failover meets
    /// (docs/PERFORMANCE.md, "failover"): the default spaces trials 10 s.
    #[arg(long, default_value_t = 10_000)]
    pub failover_pause_ms: u64,
    /// Run the rolling deploy (part of `failover`) with the bench entity opted out of
    /// snapshots (`UnsnapshottedBenchEntity`; the default runs it as jetshard's defaults leave
    /// it, snapshots on): each move of a partition then loads every entity from its whole
    /// history.
    #[arg(long)]
    pub rolling_without_snapshots: bool,
    /// Pin TTLs of the failover scenario, milliseconds.
    #[arg(long, value_delimiter = ',', default_value = "1000,2000")]
    pub pin_ttls_ms: Vec<u64>,
    /// Resident entities in the memory scenario.
    #[arg(long, default_value_t = 100_000)]
    pub memory_entities: usize,
    /// Run only the memory scenario's bounded variant (every entity known, a hundredth of them
    /// resident and as many dormant).
    #[arg(long)]
    pub memory_bounded_only: bool,
    /// Commands per pass in the scaling scenario.
    #[arg(long, default_value_t = 20_000)]
    pub scaling_commands: usize,
    /// Partition counts of the scaling scenario.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256")]
    pub scaling_partitions: Vec<u32>,
    /// Process counts of the scaling scenario.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    pub scaling_processes: Vec<usize>,
    /// Process counts of the fleet scenario (shard systems in this process, each on its own
    /// connection).
    #[arg(
        long,
        alias = "scale-nodes",
        value_delimiter = ',',
        default_value = "4,16,64"
    )]
    pub fleet_nodes: Vec<usize>,
    /// Partition counts of the fleet scenario.
    #[arg(
        long,
        alias = "scale-partitions",
        value_delimiter = ',',
        default_value = "64,256"
    )]
    pub fleet_partitions: Vec<u32>,
    /// Seconds of idle measured per fleet in the fleet scenario.
    #[arg(long, alias = "scale-idle-secs", default_value_t = 10)]
    pub fleet_idle_secs: u64,
    /// Node processes of the fleet scenario's SIGKILL failover (0: none).
    #[arg(long, alias = "scale-failover-nodes", default_value_t = 16)]
    pub fleet_failover_nodes: usize,
    /// SIGKILL trials of the fleet scenario's failover (each kills the owner of some partitions).
    #[arg(long, alias = "scale-failover-trials", default_value_t = 5)]
    pub fleet_failover_trials: usize,
    /// The big sizes: recovery 10M events over 100k entities, memory at 1M entities
    /// (overrides those settings; takes far longer than the default sizes).
    #[arg(long)]
    pub big: bool,
    /// Where the JSON results go (default: `<target dir>/jetshard-bench/results.json`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Parser, Debug)]
#[command(
    name = "jetshard-bench",
    about = "jetshard's benchmarks: each scenario against a fresh local nats-server, with a \
             baseline measured in the same run",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// Scenarios to run (default: all of them, in order).
    #[arg(value_enum)]
    scenarios: Vec<Scenario>,
    #[command(flatten)]
    options: Options,
    #[command(subcommand)]
    child: Option<ChildRole>,
}

/// What a child process of the harness runs.
#[derive(Subcommand, Debug)]
enum ChildRole {
    /// A shard-system node (failover, multi-process scaling).
    #[command(hide = true)]
    Node(node::NodeArgs),
    /// An isolated process whose memory is measured.
    #[command(hide = true)]
    MemoryChild(memory::ChildArgs),
}

/// Opens the calling thread's counters: instructions and cycles, system calls and wake-ups
/// (with the `profiling` feature; nothing without it).
fn count_this_thread() {
    #[cfg(feature = "profiling")]
    {
        instructions::count_this_thread();
        kernel::count_this_thread();
    }
}

/// Refuses the options that need the profiling instruments in a build without them.
fn check_profiling(options: &Options) -> anyhow::Result<()> {
    if cfg!(feature = "profiling") {
        return Ok(());
    }
    if options.pass_stages {
        anyhow::bail!(
            "--pass-stages needs the profiling instruments: build with `--features profiling` \
             (cargo run --release -p jetshard-bench --features profiling -- ...)"
        );
    }
    if std::env::var_os("BENCH_SYSCALLS").is_some() {
        eprintln!(
            "BENCH_SYSCALLS is ignored: the kernel's counts need a build with `--features profiling`"
        );
    }
    Ok(())
}

/// Runs the harness with `args` (the first is the program name); blocks until done.
///
/// # Errors
/// The first scenario that could not run (a server that did not start, a drain that timed
/// out); figures that miss their targets are not errors.
pub fn main_with_args(args: impl IntoIterator<Item = OsString>) -> anyhow::Result<()> {
    let args: Vec<OsString> = args.into_iter().collect();
    let cli = Cli::parse_from(&args);
    // Every thread that runs the harness's work counts its own instructions (an inherited
    // counter would see a thread's only once it exits).
    // So do its tracepoint counters (system calls, wake-ups: `kernel`).
    count_this_thread();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(count_this_thread)
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    match cli.child {
        Some(ChildRole::Node(node_args)) => runtime.block_on(node::run(node_args)),
        Some(ChildRole::MemoryChild(child_args)) => runtime.block_on(memory::run_child(child_args)),
        None => {
            let args = args
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            runtime.block_on(run(cli.scenarios, cli.options, args))
        }
    }
}

async fn run(
    scenarios: Vec<Scenario>,
    mut options: Options,
    args: Vec<String>,
) -> anyhow::Result<()> {
    check_profiling(&options)?;
    if options.big {
        options.memory_entities = 1_000_000;
        options.recovery_events = 10_000_000;
        options.recovery_entities = 100_000;
    }
    let scenarios = if scenarios.is_empty() {
        Scenario::value_variants().to_vec()
    } else {
        scenarios
    };
    let acquisitions = probe::install_collecting();
    let started = Instant::now();
    let started_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut report = Report {
        meta: Meta {
            started_unix,
            elapsed_secs: 0.0,
            cpus: std::thread::available_parallelism().map_or(0, usize::from),
            server_version: server_version().await,
            git: git_describe(),
            args,
        },
        rows: Vec::new(),
        details: serde_json::Map::new(),
    };
    report
        .details
        .insert("options".to_owned(), serde_json::to_value(&options)?);
    let out = options.out.clone().unwrap_or_else(default_out);
    let mut measured = None;
    for scenario in scenarios {
        let scenario_started = Instant::now();
        eprintln!("== {scenario:?}");
        let result = match scenario {
            Scenario::Throughput => throughput::run(&options, &mut report)
                .await
                .map(|m| measured = Some(m)),
            Scenario::Latency => latency::run(&options, measured, &mut report).await,
            Scenario::Failover => failover::run(&options, &mut report).await,
            Scenario::Memory => memory::run(&options, &mut report).await,
            Scenario::Scaling => scaling::run(&options, &mut report).await,
            Scenario::Cluster => cluster::run(&options, &mut report).await,
            Scenario::Recovery => recovery::run(&options, &acquisitions, &mut report).await,
            Scenario::Fleet => fleet::run(&options, &mut report).await,
            Scenario::Compaction => compaction::run(&options, &mut report).await,
            Scenario::Overload => overload::run(&options, &mut report).await,
            Scenario::Loads => loads::run(&options, &mut report).await,
            Scenario::Spread => spread::run(&options, &mut report).await,
        };
        if let Err(e) = result {
            // One failed scenario does not cost the figures of the others.
            eprintln!("scenario {scenario:?} failed: {e:#}");
            report.details.insert(
                format!("{scenario:?}_error").to_lowercase(),
                serde_json::Value::String(format!("{e:#}")),
            );
        }
        eprintln!(
            "== {scenario:?} took {:.1} s",
            scenario_started.elapsed().as_secs_f64()
        );
        report.meta.elapsed_secs = started.elapsed().as_secs_f64();
        report.write_json(&out)?;
    }
    report.print_table(&mut std::io::stdout())?;
    println!(
        "\n{} figures in {:.0} s; JSON: {}",
        report.rows.len(),
        report.meta.elapsed_secs,
        out.display()
    );
    Ok(())
}

/// `<target dir>/jetshard-bench/results.json`, the target dir found above this executable.
fn default_out() -> PathBuf {
    let target = std::env::current_exe()
        .ok()
        .and_then(|exe| {
            exe.ancestors()
                .find(|dir| dir.join("CACHEDIR.TAG").exists())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from("target"));
    target.join("jetshard-bench").join("results.json")
}

/// The version the testkit's server reports, from a throwaway server.
async fn server_version() -> String {
    let Ok(server) = crate::server::nats_server().await else {
        return "unknown".to_owned();
    };
    match server.connect().await {
        Ok(client) => client.server_info().version,
        Err(_) => "unknown".to_owned(),
    }
}

fn git_describe() -> Option<String> {
    let output = std::process::Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
