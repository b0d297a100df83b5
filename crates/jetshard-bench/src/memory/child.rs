//! The memory child: the hidden `memory-child` subcommand's shard system, the parent's handle
//! on it, and the ractor baseline.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use jetshard::{ShardConfig, ShardSystem};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::{ChildArgs, ENTITY_TYPE, PARTITIONS};
use crate::cpu::{heap_in_use_bytes, rss_bytes};
use crate::entity::BenchEntity;

/// The child's status line.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ChildStatus {
    pub(super) owned: usize,
    pub(super) resident: usize,
    pub(super) in_hand: usize,
    pub(super) applied: u64,
    pub(super) dormant: usize,
}

/// The parent's handle on a memory child: requests on its stdin, answers on its stdout.
pub(super) struct MemoryChild {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    pub(super) peak_resident: usize,
}

impl MemoryChild {
    pub(super) async fn start(
        url: &str,
        max_resident: Option<usize>,
        max_dormant: Option<usize>,
        passivate_after: Duration,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("find this executable")?;
        let mut command = Command::new(exe);
        let passivate_after_ms = passivate_after.as_millis().to_string();
        command.args([
            "memory-child",
            "--url",
            url,
            "--passivate-after-ms",
            &passivate_after_ms,
        ]);
        if let Some(cap) = max_resident {
            command.args(["--max-resident", &cap.to_string()]);
        }
        if let Some(budget) = max_dormant {
            command.args(["--max-dormant", &budget.to_string()]);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("spawn the memory child")?;
        let stdin = child.stdin.take().context("the child's stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("the child's stdout")?).lines();
        let mut child = Self {
            child,
            stdin,
            stdout,
            peak_resident: 0,
        };
        let ready = child.line().await?;
        if ready != "READY" {
            bail!("the memory child said {ready:?} instead of READY");
        }
        Ok(child)
    }

    async fn line(&mut self) -> anyhow::Result<String> {
        tokio::time::timeout(Duration::from_secs(60), self.stdout.next_line())
            .await
            .context("the memory child did not answer within 60 s")?
            .context("read from the memory child")?
            .context("the memory child exited")
    }

    async fn ask(&mut self, request: &str) -> anyhow::Result<Vec<u64>> {
        self.stdin
            .write_all(format!("{request}\n").as_bytes())
            .await
            .context("write to the memory child")?;
        self.stdin
            .flush()
            .await
            .context("write to the memory child")?;
        let answer = self.line().await?;
        let mut words = answer.split_whitespace();
        if words.next() != Some(request) {
            bail!("the memory child answered {answer:?} to {request}");
        }
        words
            .map(|w| w.parse().with_context(|| format!("a number in {answer:?}")))
            .collect()
    }

    pub(super) async fn rss(&mut self) -> anyhow::Result<u64> {
        let answer = self.ask("RSS").await?;
        answer.first().copied().context("an RSS figure")
    }

    pub(super) async fn heap(&mut self) -> anyhow::Result<u64> {
        let answer = self.ask("HEAP").await?;
        answer.first().copied().context("a heap figure")
    }

    async fn status(&mut self) -> anyhow::Result<ChildStatus> {
        let answer = self.ask("STATUS").await?;
        let [owned, resident, in_hand, applied, dormant] = answer[..] else {
            bail!("a status of five numbers, got {answer:?}");
        };
        let status = ChildStatus {
            owned: owned as usize,
            resident: resident as usize,
            in_hand: in_hand as usize,
            applied,
            dormant: dormant as usize,
        };
        self.peak_resident = self.peak_resident.max(status.resident);
        Ok(status)
    }

    /// Polls the child's status until `done` holds.
    pub(super) async fn wait_for(
        &mut self,
        within: Duration,
        what: &str,
        done: impl Fn(&ChildStatus) -> bool,
    ) -> anyhow::Result<ChildStatus> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let status = self.status().await?;
            if done(&status) {
                return Ok(status);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("timed out after {within:?} waiting for {what}; last status {status:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(super) async fn quit(mut self) -> anyhow::Result<()> {
        self.stdin
            .write_all(b"QUIT\n")
            .await
            .context("write to the memory child")?;
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(status) => {
                status.context("wait for the memory child")?;
            }
            Err(_) => self.child.kill().await.context("kill the memory child")?,
        }
        Ok(())
    }
}

/// The body of the hidden `memory-child` subcommand: one shard system, answering `RSS`,
/// `STATUS` and `QUIT` on stdin.
pub async fn run_child(args: ChildArgs) -> anyhow::Result<()> {
    if let Some(n) = args.ractor_baseline {
        return run_ractor_baseline(n).await;
    }
    let client = async_nats::connect(args.url.as_str())
        .await
        .with_context(|| format!("connect to {}", args.url))?;
    let mut config = ShardConfig::builder(ENTITY_TYPE)
        .partitions(PARTITIONS)
        .node_id("memory")
        .passivate_after(Duration::from_millis(args.passivate_after_ms));
    if let Some(cap) = args.max_resident {
        config = config.max_resident_entities(cap);
    }
    if let Some(budget) = args.max_dormant {
        config = config.max_dormant_entities(budget);
    }
    let system = ShardSystem::start::<BenchEntity>(client, config.build()?)
        .await
        .context("start the shard system")?;
    println!("READY");
    let mut requests = BufReader::new(tokio::io::stdin()).lines();
    while let Some(request) = requests.next_line().await.context("read a request")? {
        match request.trim() {
            "RSS" => println!("RSS {}", rss_bytes().unwrap_or(0)),
            "HEAP" => println!("HEAP {}", heap_in_use_bytes().unwrap_or(0)),
            "STATUS" => {
                let status = system.status().await.context("read the system status")?;
                let owned = status.iter().filter(|p| p.generation.is_some()).count();
                let resident: usize = status.iter().map(|p| p.resident_entities).sum();
                let in_hand: usize = status.iter().map(|p| p.commands_in_hand).sum();
                let applied: u64 = status.iter().map(|p| p.applied + p.duplicates).sum();
                let dormant: usize = status.iter().map(|p| p.dormant_entities).sum();
                println!("STATUS {owned} {resident} {in_hand} {applied} {dormant}");
            }
            "QUIT" => break,
            other => eprintln!("memory child: unknown request {other:?}"),
        }
    }
    system.shutdown().await.context("shut down")?;
    Ok(())
}

/// RSS per idle ractor actor linked to a supervisor, measured in a child process.
pub(super) async fn ractor_baseline(n: usize) -> anyhow::Result<f64> {
    let exe = std::env::current_exe().context("find this executable")?;
    let output = Command::new(exe)
        .args([
            "memory-child",
            "--url",
            "-",
            "--passivate-after-ms",
            "0",
            "--ractor-baseline",
            &n.to_string(),
        ])
        .stderr(Stdio::inherit())
        .output()
        .await
        .context("run the ractor baseline child")?;
    let text = String::from_utf8_lossy(&output.stdout);
    let numbers: Vec<u64> = text
        .split_whitespace()
        .skip(1)
        .filter_map(|w| w.parse().ok())
        .collect();
    let [before, after] = numbers[..] else {
        bail!("the ractor baseline child printed {text:?}");
    };
    Ok((after as f64 - before as f64) / n as f64)
}

/// An actor that does nothing: the smallest resident thing ractor has.
struct Idle;

impl ractor::Actor for Idle {
    type Msg = ();
    type State = ();
    type Arguments = ();

    async fn pre_start(
        &self,
        _: ractor::ActorRef<()>,
        _: (),
    ) -> Result<(), ractor::ActorProcessingErr> {
        Ok(())
    }
}

/// The ractor baseline, in the child: one supervisor, `n` idle actors linked to it.
async fn run_ractor_baseline(n: usize) -> anyhow::Result<()> {
    let (supervisor, _) = ractor::Actor::spawn(None, Idle, ())
        .await
        .context("spawn the supervisor")?;
    let before = rss_bytes().unwrap_or(0);
    let mut actors = Vec::with_capacity(n);
    for _ in 0..n {
        let (actor, _) = ractor::Actor::spawn_linked(None, Idle, (), supervisor.get_cell())
            .await
            .context("spawn an idle actor")?;
        actors.push(actor);
    }
    let after = rss_bytes().unwrap_or(0);
    println!("RACTOR {before} {after}");
    supervisor.stop(None);
    Ok(())
}
