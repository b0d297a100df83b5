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
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use jetshard::{OwnershipChange, ShardConfig, ShardSystem};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

use crate::entity::{BenchEntity, SnapshottedBenchEntity};
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
    /// Run the bench entity with snapshots (`SnapshottedBenchEntity`).
    #[arg(long)]
    pub snapshots: bool,
}

impl NodeArgs {
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
        .chain(self.snapshots.then(|| "--snapshots".to_owned()))
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
    let config = ShardConfig::builder(args.entity_type.as_str())
        .partitions(args.partitions)
        .node_id(args.node_id.as_str())
        .pin_ttl(Duration::from_millis(args.pin_ttl_ms))
        .balance(args.balance)
        .build()
        .context("node configuration")?;
    let system = if args.snapshots {
        ShardSystem::start::<SnapshottedBenchEntity>(client, config).await
    } else {
        ShardSystem::start::<BenchEntity>(client, config).await
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

#[derive(Default)]
struct Seen {
    ready: bool,
    acquired: Vec<Acquired>,
    /// Acquisitions (`true`) and releases in the order they were printed.
    ownership: Vec<(u32, bool)>,
    /// Each release's partition and reason.
    released: Vec<(u32, String)>,
}

/// A running node child process; killed when dropped.
pub struct NodeProcess {
    id: String,
    child: Child,
    seen: Arc<Mutex<Seen>>,
}

impl NodeProcess {
    /// Starts this binary as a node and waits until its shard system runs.
    pub async fn start(args: &NodeArgs) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("find this executable")?;
        let mut child = Command::new(exe)
            .args(args.to_args())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("spawn a node process")?;
        let stdout = child.stdout.take().context("the node's stdout")?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let sink = seen.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                record(&sink, &line);
            }
        });
        let node = Self {
            id: args.node_id.clone(),
            child,
            seen,
        };
        let what = format!("node {} ready", node.id);
        jetshard_testkit::wait_until(READY_TIMEOUT, &what, || async { node.lock().ready })
            .await
            .with_context(|| format!("node {} did not start", node.id))?;
        Ok(node)
    }

    /// Its node id.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every acquisition it printed.
    pub fn acquisitions(&self) -> Vec<Acquired> {
        self.lock().acquired.clone()
    }

    /// Every release it printed: partition and reason.
    pub fn releases(&self) -> Vec<(u32, String)> {
        self.lock().released.clone()
    }

    /// The partitions it owns now, by its own account.
    pub fn owned(&self) -> BTreeSet<u32> {
        let mut owned = BTreeSet::new();
        for (partition, acquired) in &self.lock().ownership {
            if *acquired {
                owned.insert(*partition);
            } else {
                owned.remove(partition);
            }
        }
        owned
    }

    /// Sends `signal` (a `libc::SIG*`) to the process.
    pub fn signal(&self, signal: i32) -> anyhow::Result<()> {
        let Some(pid) = self.child.id() else {
            bail!("node {} is not running", self.id);
        };
        let pid = i32::try_from(pid).context("pid out of range")?;
        // SAFETY: kill(2) on our own child's pid, which is not reaped yet (we hold the Child).
        let rc = unsafe { libc::kill(pid, signal) };
        if rc != 0 {
            bail!("kill({pid}, {signal}): {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// SIGKILL, and reap.
    pub async fn kill(mut self) -> anyhow::Result<()> {
        self.signal(libc::SIGKILL)?;
        self.child.wait().await.context("reap a killed node")?;
        Ok(())
    }

    /// SIGTERM, and wait (bounded) for a graceful exit; SIGKILL after that.
    pub async fn terminate(mut self) -> anyhow::Result<()> {
        self.signal(libc::SIGTERM)?;
        if tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .is_err()
        {
            self.kill().await?;
        }
        Ok(())
    }
}

fn record(seen: &Mutex<Seen>, line: &str) {
    let parts: Vec<&str> = line.split_whitespace().collect();
    let number = |i: usize| {
        parts
            .get(i)
            .and_then(|p| p.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    match parts.first().copied() {
        Some("READY") => seen.ready = true,
        Some("ACQUIRED") => {
            let partition = u32::try_from(number(1)).unwrap_or(u32::MAX);
            seen.ownership.push((partition, true));
            seen.acquired.push(Acquired {
                partition,
                generation: number(2),
                at_unix_ms: number(3),
                rebuilt_events: number(4),
                elapsed_ms: number(5),
            });
        }
        Some("RELEASED") => {
            let partition = u32::try_from(number(1)).unwrap_or(u32::MAX);
            seen.ownership.push((partition, false));
            seen.released
                .push((partition, parts.get(4..).unwrap_or_default().join(" ")));
        }
        _ => {}
    }
}
