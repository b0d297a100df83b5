//! Scenario 5, memory: resident set size per resident entity, measured in a child process that
//! runs nothing but one shard system (the hidden `memory-child` subcommand).
//!
//! Per variant, on a fresh server: the parent writes one event per entity into the journal
//! (a `Stamped` for an idle entity, a 64-byte `Filled` blob for "small state"), starts the
//! child, and has it report `VmRSS` at three points:
//! 1. **standby**: the system runs, owns nothing;
//! 2. **rebuilt**: every partition acquired, so every entity's state was rebuilt into the
//!    owner's dormant map (no actor yet);
//! 3. **resident**: one `Touch` command (no event) sent to every entity, so each has a live
//!    entity actor holding its state.
//!
//! `(resident - rebuilt) / entities` is the cost of a resident entity beyond its rebuilt state:
//! the actor, its mailbox and task, the owner's slot.
//!
//! The passivated variant goes on to a fourth point: with `passivate_after` at
//! [`PASSIVATE_AFTER`], every actor hands its state back to its owner and stops; once none is
//! left, the heap in use (glibc's `mallinfo2`; RSS does not fall when memory is freed) against
//! the rebuilt point is what an idle entity costs on jetshard's lean path.
//!
//! With a resident cap (jetshard's `max_resident_entities`, a tenth of the entities), the
//! figures are the largest number of resident entities seen while every entity is touched
//! (polled every 50 ms), and the RSS growth per touched entity.
//!
//! Since entities load lazily (on their first command), the **rebuilt** point reads no state:
//! its figure is about 0, and the resident figures include the entity's load.
//!
//! The **bounded** variant is issue 12's memory target: every entity is known (it has an event
//! in the journal), a hundredth of them may be resident (`max_resident_entities`) and as many
//! dormant (`max_dormant_entities`), and traffic moves over all of them (one `Touch` each, in
//! waves). RSS and glibc's heap in use are sampled after every tenth of the entities: the heap
//! must stay flat (the last sample within 10% of the one at a tenth), RSS bounded (the last
//! within 10% of the one half-way: glibc keeps freed pages for a while), and the heap is given
//! per entity the budgets keep (resident or dormant).

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use clap::Args;
use jetshard::{Codec, ShardConfig, ShardSystem};
use jetshard_testkit::NatsServer;
use serde::Serialize;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::Options;
use crate::cpu::{heap_in_use_bytes, rss_bytes};
use crate::entity::{BenchCmd, BenchEntity, BenchEvt, BenchState};
use crate::load::{self, AckWindow, CommandPublisher};
use crate::report::{Report, Row};

const ENTITY_TYPE: &str = "mem";
const PARTITIONS: u32 = 8;
/// The blob of the "small state" variant.
const SMALL_STATE_BYTES: usize = 64;
/// Entities touched at a time.
const WAVE: usize = 2_000;
/// The resident cap of the capped variant, as a fraction of the entities.
const CAP_DIVISOR: usize = 10;
/// What one resident entity is budgeted at when checking that a variant fits in memory
/// (measured: about 7.5 KB for jetshard's live entity actor, 6.7 KB for ractor's idle actor).
const BUDGET_PER_ENTITY: u64 = 10 * 1024;
/// The resident and the dormant budget of the bounded variant, as fractions of the entities.
const BOUNDED_DIVISOR: usize = 100;
/// How much the bounded variant's RSS may grow from a tenth of the entities touched to all.
const FLAT_WITHIN: f64 = 1.10;
/// The share of the available memory a variant may use: the machine is shared.
const MEMORY_SHARE: f64 = 0.5;

/// The idle time after which the passivated variant's entities are passivated.
const PASSIVATE_AFTER: Duration = Duration::from_secs(2);
/// The idle time of the other variants: longer than any run, so nothing is passivated.
const NEVER: Duration = Duration::from_secs(3600);

/// The target of issue 6 for an idle resident entity beyond its state.
const TARGET_BYTES: f64 = 4096.0;

/// The settings of the child process.
#[derive(Args, Debug, Clone)]
pub struct ChildArgs {
    /// The server's URL.
    #[arg(long)]
    pub url: String,
    /// jetshard's `max_resident_entities` (default: no cap).
    #[arg(long)]
    pub max_resident: Option<usize>,
    /// jetshard's `max_dormant_entities` (default: jetshard's default).
    #[arg(long)]
    pub max_dormant: Option<usize>,
    /// jetshard's `passivate_after`, milliseconds.
    #[arg(long)]
    pub passivate_after_ms: u64,
    /// Instead of a shard system: spawn this many idle ractor actors linked to one supervisor
    /// and report RSS before and after (the baseline of a resident entity).
    #[arg(long)]
    pub ractor_baseline: Option<usize>,
}

/// A variant of the scenario.
#[derive(Debug, Clone, Copy, Serialize)]
struct Variant {
    name: &'static str,
    state_bytes: usize,
    capped: bool,
    /// Measure again once every entity has been passivated.
    passivated: bool,
    /// Resident and dormant budgets of a hundredth of the entities each; RSS sampled as the
    /// traffic moves over all of them.
    bounded: bool,
}

/// What a variant measured.
#[derive(Debug, Clone, Serialize, Default)]
struct Figures {
    entities: usize,
    standby_rss: u64,
    rebuilt_rss: u64,
    resident_rss: u64,
    resident_at_end: usize,
    peak_resident: usize,
    cap: Option<usize>,
    touch_secs: f64,
    rebuilt_heap: u64,
    resident_heap: u64,
    passivated_rss: u64,
    passivated_heap: u64,
    passivate_secs: f64,
    /// The dormant budget (bounded variant).
    dormant_budget: Option<usize>,
    /// RSS after each tenth of the entities was touched (bounded variant).
    rss_by_tenth: Vec<u64>,
    /// glibc's heap in use at the same points.
    heap_by_tenth: Vec<u64>,
    /// Dormant states held at the end.
    dormant_at_end: usize,
}

/// Scenario 5.
pub async fn run(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let variants = [
        Variant {
            name: "idle",
            state_bytes: 0,
            capped: false,
            passivated: false,
            bounded: false,
        },
        Variant {
            name: "64-byte state",
            state_bytes: SMALL_STATE_BYTES,
            capped: false,
            passivated: false,
            bounded: false,
        },
        Variant {
            name: "idle, passivate_after = 2 s",
            state_bytes: 0,
            capped: false,
            passivated: true,
            bounded: false,
        },
        Variant {
            name: "idle, max_resident_entities = entities / 10",
            state_bytes: 0,
            capped: true,
            passivated: false,
            bounded: false,
        },
        Variant {
            name: "every entity known, resident and dormant budgets = entities / 100 each",
            state_bytes: 0,
            capped: true,
            passivated: false,
            bounded: true,
        },
    ];
    let n = options.memory_entities;
    let mut details = serde_json::Map::new();
    // Every entity resident at once must fit in a share of what the machine has free; the
    // capped variant holds a tenth of them.
    let available = crate::cpu::available_memory_bytes().unwrap_or(u64::MAX);
    let fits = |entities: usize| {
        (entities as u64).saturating_mul(BUDGET_PER_ENTITY) as f64
            <= available as f64 * MEMORY_SHARE
    };
    if !fits(n) {
        eprintln!(
            "memory: {n} resident entities would not fit in half of the {} MB available; only the capped variant runs",
            available / (1024 * 1024)
        );
        details.insert(
            "skipped".to_owned(),
            json!(format!(
                "uncapped variants and the ractor baseline at {n} entities: {} MB available",
                available / (1024 * 1024)
            )),
        );
    }
    let ractor_bytes = if fits(n) && !options.memory_bounded_only {
        eprintln!("memory: {n} idle ractor actors (baseline)");
        let bytes = ractor_baseline(n).await?;
        report.rows.push(Row::new(
            "memory",
            format!("baseline: idle ractor actor linked to a supervisor, {n} actors"),
            bytes,
            "bytes",
        ));
        details.insert("ractor_idle_actor_bytes".to_owned(), json!(bytes));
        bytes
    } else {
        0.0
    };
    for variant in variants {
        if options.memory_bounded_only && !variant.bounded {
            continue;
        }
        if !variant.capped && !fits(n) {
            continue;
        }
        eprintln!("memory: {} entities, {}", n, variant.name);
        let figures = measure(variant, n).await?;
        if variant.bounded {
            bounded_rows(report, &figures, n, variant.name);
            details.insert(
                variant.name.to_owned(),
                json!({ "variant": variant, "figures": figures }),
            );
            continue;
        }
        let per = |from: u64, to: u64| (to as f64 - from as f64) / n as f64;
        let heap = per;
        let rebuilt = per(figures.standby_rss, figures.rebuilt_rss);
        let resident = per(figures.rebuilt_rss, figures.resident_rss);
        let case = |what: &str| format!("{what}, {n} entities, {}", variant.name);
        report.rows.push(Row::new(
            "memory",
            case("rebuilt (dormant) state per entity"),
            rebuilt,
            "bytes",
        ));
        if let Some(cap) = figures.cap {
            // The cap may be exceeded by entities busy at once; allow one pull batch per partition.
            let slack = 256 * PARTITIONS as usize;
            report.rows.push(
                Row::new(
                    "memory",
                    case("largest resident count seen while touched"),
                    figures.peak_resident as f64,
                    "entities",
                )
                .target(
                    format!("<= cap {cap} + busy ({slack})"),
                    figures.peak_resident <= cap + slack,
                ),
            );
            report.rows.push(Row::new(
                "memory",
                case("RSS growth per entity touched"),
                resident,
                "bytes",
            ));
        } else if variant.passivated {
            let idle = heap(figures.rebuilt_heap, figures.passivated_heap);
            report.rows.push(
                Row::new(
                    "memory",
                    case("idle entity after passivation beyond its state, heap in use"),
                    idle,
                    "bytes",
                )
                .target("<= 4 KB", idle <= TARGET_BYTES),
            );
        } else {
            report.rows.push(
                Row::new(
                    "memory",
                    case("live entity actor beyond its state"),
                    resident,
                    "bytes",
                )
                .against(ractor_bytes),
            );
            report.rows.push(Row::new(
                "memory",
                case("live entity actor beyond its state, heap in use"),
                heap(figures.rebuilt_heap, figures.resident_heap),
                "bytes",
            ));
        }
        details.insert(
            variant.name.to_owned(),
            json!({ "variant": variant, "figures": figures }),
        );
    }
    details.insert(
        "state_inline_bytes".to_owned(),
        json!(std::mem::size_of::<BenchState>()),
    );
    report
        .details
        .insert("memory".to_owned(), serde_json::Value::Object(details));
    Ok(())
}

/// The bounded variant's rows: the heap in use flat as traffic moves over every known entity
/// (from a tenth touched to all), RSS bounded (from half touched to all: glibc keeps pages it
/// freed, so RSS climbs for a while where the heap does not), and what the process holds per
/// entity it may keep.
fn bounded_rows(report: &mut Report, figures: &Figures, n: usize, name: &str) {
    let mb = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    let (rss, heap) = (&figures.rss_by_tenth, &figures.heap_by_tenth);
    let (Some(&rss_first), Some(&rss_half), Some(&rss_last)) =
        (rss.first(), rss.get(rss.len() / 2 - 1), rss.last())
    else {
        return;
    };
    let (Some(&heap_first), Some(&heap_last)) = (heap.first(), heap.last()) else {
        return;
    };
    let case = |what: &str| format!("{what}, {n} entities, {name}");
    let flat = |from: u64, to: u64| to as f64 <= from as f64 * FLAT_WITHIN;
    report.rows.push(Row::new(
        "memory",
        case("RSS at standby"),
        mb(figures.standby_rss),
        "MB",
    ));
    report.rows.push(Row::new(
        "memory",
        case("heap in use, a tenth of the entities touched"),
        mb(heap_first),
        "MB",
    ));
    report.rows.push(
        Row::new(
            "memory",
            case("heap in use, every entity touched"),
            mb(heap_last),
            "MB",
        )
        .against(mb(heap_first))
        .target(
            format!("<= {FLAT_WITHIN} of a tenth's"),
            flat(heap_first, heap_last),
        ),
    );
    report.rows.push(Row::new(
        "memory",
        case("RSS, a tenth of the entities touched"),
        mb(rss_first),
        "MB",
    ));
    report.rows.push(Row::new(
        "memory",
        case("RSS, half of the entities touched"),
        mb(rss_half),
        "MB",
    ));
    report.rows.push(
        Row::new(
            "memory",
            case("RSS, every entity touched"),
            mb(rss_last),
            "MB",
        )
        .against(mb(rss_half))
        .target(
            format!("<= {FLAT_WITHIN} of half-way's"),
            flat(rss_half, rss_last),
        ),
    );
    let kept = figures.cap.unwrap_or(0) + figures.dormant_budget.unwrap_or(0);
    report.rows.push(Row::new(
        "memory",
        case("heap in use per entity the budgets keep"),
        heap_last as f64 / kept.max(1) as f64,
        "bytes",
    ));
}

/// Runs one variant: a fresh server, the journal written, the child driven through its
/// three measuring points.
async fn measure(variant: Variant, n: usize) -> anyhow::Result<Figures> {
    let server = NatsServer::start().await.context("start nats-server")?;
    let control = server.connect().await?;
    let config = ShardConfig::builder(ENTITY_TYPE)
        .partitions(PARTITIONS)
        .node_id("provision")
        .build()?;
    load::provision(server.connect().await?, config).await?;
    let ids: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
    let codec = Codec::default();
    let event = if variant.state_bytes == 0 {
        BenchEvt::Stamped { at_ns: 1 }
    } else {
        BenchEvt::Filled {
            blob: vec![7; variant.state_bytes],
        }
    };
    let payload = Bytes::from(codec.encode(&event).context("encode an event")?);
    let events = ids.iter().map(|id| {
        let partition = jetshard::fnv1a_32(id.as_bytes()) % PARTITIONS;
        (partition, id.clone(), payload.clone())
    });
    load::write_events(control.clone(), ENTITY_TYPE, events).await?;

    let cap = if variant.bounded {
        Some((n / BOUNDED_DIVISOR).max(1))
    } else {
        variant.capped.then_some((n / CAP_DIVISOR).max(1))
    };
    let dormant_budget = variant.bounded.then_some((n / BOUNDED_DIVISOR).max(1));
    let passivate_after = if variant.passivated {
        PASSIVATE_AFTER
    } else {
        NEVER
    };
    let mut child = MemoryChild::start(&server.url(), cap, dormant_budget, passivate_after).await?;
    let mut figures = Figures {
        entities: n,
        cap,
        dormant_budget,
        standby_rss: child.rss().await?,
        ..Figures::default()
    };

    // One command per partition: every partition is acquired, every state rebuilt.
    let publisher = CommandPublisher::for_ids(control.clone(), ENTITY_TYPE, ids.clone());
    let mut window = AckWindow::default();
    for partition in 0..PARTITIONS {
        let index = ids
            .iter()
            .position(|id| jetshard::fnv1a_32(id.as_bytes()) % PARTITIONS == partition)
            .context("an entity in every partition")?;
        window
            .push(publisher.send_to(index, &BenchCmd::Touch).await?)
            .await?;
    }
    window.drain().await?;
    child
        .wait_for(Duration::from_secs(300), "every partition acquired", |s| {
            s.owned == PARTITIONS as usize && s.in_hand == 0 && s.applied >= u64::from(PARTITIONS)
        })
        .await?;
    figures.rebuilt_rss = child.rss().await?;
    figures.rebuilt_heap = child.heap().await?;

    // In waves, so that the figure holds the entities, not a backlog's transient buffers.
    let started = tokio::time::Instant::now();
    let mut touched = 0;
    let mut status = ChildStatus::default();
    let tenth = n.div_ceil(10);
    let mut next_sample = tenth;
    while touched < n {
        let wave = WAVE.min(n - touched);
        publisher
            .preload_range(touched, wave, &BenchCmd::Touch)
            .await?;
        touched += wave;
        let expected = touched as u64 + u64::from(PARTITIONS);
        status = child
            .wait_for(
                Duration::from_secs(120),
                "a wave of entities touched",
                |s| s.applied >= expected && s.in_hand == 0,
            )
            .await?;
        if variant.bounded && (touched >= next_sample || touched == n) {
            let rss = child.rss().await?;
            let heap = child.heap().await?;
            eprintln!(
                "memory: {touched} of {n} touched, RSS {} MB, heap in use {} MB, {} resident, {} dormant",
                rss / (1024 * 1024),
                heap / (1024 * 1024),
                status.resident,
                status.dormant
            );
            figures.rss_by_tenth.push(rss);
            figures.heap_by_tenth.push(heap);
            next_sample += tenth;
        }
    }
    figures.dormant_at_end = status.dormant;
    figures.touch_secs = started.elapsed().as_secs_f64();
    figures.peak_resident = child.peak_resident;
    figures.resident_at_end = status.resident;
    figures.resident_rss = child.rss().await?;
    figures.resident_heap = child.heap().await?;
    if cap.is_none() && !variant.passivated && status.resident < n {
        bail!("only {} of {n} entities are resident", status.resident);
    }
    if variant.passivated {
        let started = tokio::time::Instant::now();
        child
            .wait_for(Duration::from_secs(120), "every entity passivated", |s| {
                s.resident == 0
            })
            .await?;
        figures.passivate_secs = started.elapsed().as_secs_f64();
        figures.passivated_rss = child.rss().await?;
        figures.passivated_heap = child.heap().await?;
    }
    child.quit().await?;
    Ok(figures)
}

/// The child's status line.
#[derive(Debug, Clone, Copy, Default)]
struct ChildStatus {
    owned: usize,
    resident: usize,
    in_hand: usize,
    applied: u64,
    dormant: usize,
}

/// The parent's handle on a memory child: requests on its stdin, answers on its stdout.
struct MemoryChild {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    peak_resident: usize,
}

impl MemoryChild {
    async fn start(
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

    async fn rss(&mut self) -> anyhow::Result<u64> {
        let answer = self.ask("RSS").await?;
        answer.first().copied().context("an RSS figure")
    }

    async fn heap(&mut self) -> anyhow::Result<u64> {
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
    async fn wait_for(
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

    async fn quit(mut self) -> anyhow::Result<()> {
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
async fn ractor_baseline(n: usize) -> anyhow::Result<f64> {
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
