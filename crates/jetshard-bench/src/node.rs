//! Node processes: this binary re-executed as one shard-system process (the hidden `node`
//! subcommand), so that failover and multi-process scaling face real SIGKILL and SIGSTOP.
//!
//! A node prints one line per event on stdout:
//! - `READY` once its shard system runs;
//! - `ACQUIRED <partition> <generation> <unix ms> <rebuilt events> <elapsed ms>`;
//! - `RELEASED <partition> <generation> <unix ms> <reason>`;
//! - `STOPPED` after a graceful shutdown (SIGTERM).

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use jetshard::{Codec, OwnershipChange, ShardConfig, ShardSystem};
use jetshard_testkit::ChildNode;
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};

use crate::compaction::CompactionEntity;
use crate::entity::{BenchEntity, UnsnapshottedBenchEntity};
use crate::probe;

/// How long a node may take to start its shard system.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The settings of one node process.
#[derive(Args, Debug, Clone)]
pub struct NodeArgs {
    /// The server's URL.
    #[arg(long)]
    pub url: String,
    /// The entity type.
    #[arg(long)]
    pub entity_type: String,
    /// This node's id.
    #[arg(long)]
    pub node_id: String,
    /// Partitions.
    #[arg(long)]
    pub partitions: u32,
    /// Pin TTL in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub pin_ttl_ms: u64,
    /// Share partitions evenly with the other nodes (jetshard's balancing).
    #[arg(long)]
    pub balance: bool,
    /// Run the bench entity without snapshots (`UnsnapshottedBenchEntity`, which opts out of
    /// jetshard's default).
    #[arg(long)]
    pub without_snapshots: bool,
    /// Run the overload scenario's entity (`CompactionEntity`: JSON, an outbox message per
    /// command, timers) with snapshots every this many events, instead of the bench entity.
    #[arg(long)]
    pub overload_entity: Option<u32>,
    /// Background compaction's interval in seconds, for `--overload-entity` (0: off).
    #[arg(long, default_value_t = 0)]
    pub compaction_interval_secs: u64,
}

impl NodeArgs {
    /// A node of `entity_type` (the bench entity, snapshots on) on the server at `url`,
    /// balancing its `partitions` with the other nodes under a pin TTL of `pin_ttl_ms`.
    pub fn new(
        url: String,
        entity_type: &str,
        node_id: String,
        partitions: u32,
        pin_ttl_ms: u64,
    ) -> Self {
        Self {
            url,
            entity_type: entity_type.to_owned(),
            node_id,
            partitions,
            pin_ttl_ms,
            balance: true,
            without_snapshots: false,
            overload_entity: None,
            compaction_interval_secs: 0,
        }
    }

    fn to_args(&self) -> Vec<String> {
        vec![
            "node".to_owned(),
            "--url".to_owned(),
            self.url.clone(),
            "--entity-type".to_owned(),
            self.entity_type.clone(),
            "--node-id".to_owned(),
            self.node_id.clone(),
            "--partitions".to_owned(),
            self.partitions.to_string(),
            "--pin-ttl-ms".to_owned(),
            self.pin_ttl_ms.to_string(),
        ]
        .into_iter()
        .chain(self.balance.then(|| "--balance".to_owned()))
        .chain(
            self.without_snapshots
                .then(|| "--without-snapshots".to_owned()),
        )
        .chain(self.overload_entity.into_iter().flat_map(|every| {
            [
                "--overload-entity".to_owned(),
                every.to_string(),
                "--compaction-interval-secs".to_owned(),
                self.compaction_interval_secs.to_string(),
            ]
        }))
        .collect()
    }
}

/// The body of the hidden `node` subcommand: runs the bench entity's shard system until
/// SIGTERM, printing ownership lines.
pub async fn run(args: NodeArgs) -> anyhow::Result<()> {
    probe::install(|a| {
        println!(
            "ACQUIRED {} {} {} {} {}",
            a.partition, a.generation, a.at_unix_ms, a.rebuilt_events, a.elapsed_ms
        );
    });
    let client = async_nats::ConnectOptions::new()
        .reconnect_delay_callback(|_| Duration::from_millis(100))
        .connect(args.url.as_str())
        .await
        .with_context(|| format!("connect to {}", args.url))?;
    let builder = ShardConfig::builder(args.entity_type.as_str())
        .partitions(args.partitions)
        .node_id(args.node_id.as_str())
        .pin_ttl(Duration::from_millis(args.pin_ttl_ms))
        .balance(args.balance);
    let system = match args.overload_entity {
        Some(every) => {
            let builder = builder.codec(Codec::Json).snapshot_every(every);
            let builder = match args.compaction_interval_secs {
                0 => builder.compaction(false),
                secs => builder.compaction_interval(Duration::from_secs(secs)),
            };
            let config = builder.build().context("node configuration")?;
            ShardSystem::start::<CompactionEntity>(client, config).await
        }
        None => {
            let config = builder.build().context("node configuration")?;
            if args.without_snapshots {
                ShardSystem::start::<UnsnapshottedBenchEntity>(client, config).await
            } else {
                ShardSystem::start::<BenchEntity>(client, config).await
            }
        }
    }
    .context("start the shard system")?;
    let mut events = system.ownership_events();
    let mut terminate = signal(SignalKind::terminate()).context("install a SIGTERM handler")?;
    println!("READY");
    loop {
        tokio::select! {
            event = events.recv() => {
                let Ok(event) = event else { continue };
                if let OwnershipChange::Released { reason } = event.change {
                    println!("RELEASED {} {} {} {reason}", event.partition, event.generation, probe::unix_ms());
                }
            }
            _ = terminate.recv() => break,
        }
    }
    system.shutdown().await.context("shut down")?;
    println!("STOPPED");
    Ok(())
}

/// One `ACQUIRED` line of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    /// The partition.
    pub partition: u32,
    /// The generation claimed.
    pub generation: u64,
    /// When, unix milliseconds.
    pub at_unix_ms: u64,
    /// Events replayed.
    pub rebuilt_events: u64,
    /// Claim + replay + recovery, milliseconds.
    pub elapsed_ms: u64,
}

/// A running node child process; killed when dropped.
pub struct NodeProcess {
    process: ChildNode,
}

impl NodeProcess {
    /// Starts this binary as a node and waits until its shard system runs.
    pub async fn start(args: &NodeArgs) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("find this executable")?;
        let mut command = Command::new(exe);
        command.args(args.to_args()).stderr(Stdio::inherit());
        let mut process =
            ChildNode::spawn(&args.node_id, command).context("spawn a node process")?;
        process
            .wait_printed("READY", READY_TIMEOUT)
            .await
            .with_context(|| format!("node {} did not start", args.node_id))?;
        Ok(Self { process })
    }

    /// Its node id.
    pub fn id(&self) -> &str {
        self.process.id()
    }

    /// Every acquisition it printed.
    pub fn acquisitions(&self) -> Vec<Acquired> {
        lines_of(&self.process, "ACQUIRED")
            .iter()
            .map(|words| Acquired {
                partition: u32::try_from(number(words, 1)).unwrap_or(u32::MAX),
                generation: number(words, 2),
                at_unix_ms: number(words, 3),
                rebuilt_events: number(words, 4),
                elapsed_ms: number(words, 5),
            })
            .collect()
    }

    /// Every release it printed: partition and reason.
    pub fn releases(&self) -> Vec<(u32, String)> {
        lines_of(&self.process, "RELEASED")
            .iter()
            .map(|words| {
                (
                    u32::try_from(number(words, 1)).unwrap_or(u32::MAX),
                    words.get(4..).unwrap_or_default().join(" "),
                )
            })
            .collect()
    }

    /// The partitions it owns now, by its own account.
    pub fn owned(&self) -> BTreeSet<u32> {
        self.process.owned()
    }

    /// Sends `signal` (a `libc::SIG*`) to the process.
    pub fn signal(&self, signal: i32) -> anyhow::Result<()> {
        self.process
            .signal(signal)
            .with_context(|| format!("signal {signal} to node {}", self.id()))
    }

    /// SIGKILL, and reap.
    pub async fn kill(mut self) -> anyhow::Result<()> {
        self.process.kill().await.context("SIGKILL a node")
    }

    /// SIGTERM, and wait (bounded) for a graceful exit; SIGKILL after that.
    pub async fn terminate(mut self) -> anyhow::Result<()> {
        self.process.terminate(Duration::from_secs(20)).await;
        Ok(())
    }
}

/// The lines of `node` whose first word is `what`, as their words.
fn lines_of(node: &ChildNode, what: &str) -> Vec<Vec<String>> {
    node.lines()
        .iter()
        .map(|line| {
            line.split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|words| words.first().is_some_and(|w| w == what))
        .collect()
}

/// Word `i` of a line as a number, 0 if there is none.
fn number(words: &[String], i: usize) -> u64 {
    words.get(i).and_then(|w| w.parse().ok()).unwrap_or(0)
}
