//! `demo`: failover, shown end to end on one machine in well under a minute.
//!
//! 1. Starts its own `nats-server` (JetStream, store in a temporary directory), found as the
//!    tests find it (`NATS_SERVER_BIN`, the repository's `.tools/`, `PATH`).
//! 2. Starts three `order-processor node` child processes (this same binary), with the
//!    features on: `--inventory` (orders reserve their items from the inventory entities, a
//!    saga through the outbox) and `--payment-timeout` (an unpaid order is cancelled by a
//!    durable timer).
//! 3. Loads orders at a steady rate. Part way through, strikes the node that owns the most
//!    partitions with a [`Fault`] (SIGKILL by default), and shows which node took which
//!    partition, under which generation, and how long after the fault.
//! 4. Lets the load finish, runs [`verify`] (which also waits for the saga to settle and the
//!    timers due to fire), prints a summary, and stops the remaining nodes gracefully. Exits
//!    non-zero on any violation.
//!
//! Every wait is bounded, and every child is killed when the demo ends, however it ends.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use jetshard_testkit::NatsServer;

use crate::load::{self, LoadOptions, LoadReport};
use crate::nodes::{NodeProcess, NodeSettings, unix_ms};
use crate::rules::Features;
use crate::verify::{self, VerifyOptions};

/// What happens to the node that owns the most partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// SIGKILL: a crash. Its connection closes with it: the others find its liveness subject
    /// without responders within milliseconds and unpin its partitions, without waiting for
    /// the pin TTL.
    Kill,
    /// SIGSTOP, then SIGCONT once the others took over: a stalled process (GC pause, frozen
    /// VM) that comes back believing it still owns its partitions, and must be fenced.
    Stop,
    /// SIGTERM: a graceful shutdown. It drains, acknowledges and unpins, so the others take
    /// over at once.
    Term,
}

impl Fault {
    fn signal(self) -> &'static str {
        match self {
            Fault::Kill => "SIGKILL",
            Fault::Stop => "SIGSTOP",
            Fault::Term => "SIGTERM",
        }
    }
}

/// How the demo runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Orders to load.
    pub orders: u32,
    /// Commands per second.
    pub rate: u32,
    /// The node settings.
    pub settings: NodeSettings,
    /// The share of the load published before the fault, in percent.
    pub fault_at_percent: u64,
    /// The fault.
    pub fault: Fault,
    /// With a port P: node-a, node-b and node-c serve `/metrics`, `/healthz` and `/readyz` on
    /// 127.0.0.1:P, P+1 and P+2 (`node --metrics-addr`).
    pub metrics_port: Option<u16>,
    /// The features the nodes run with.
    pub features: Features,
}

/// The `node` (and `verify`) flags of `features`.
pub fn feature_args(features: &Features) -> Vec<String> {
    let mut args = Vec::new();
    if features.inventory {
        args.push("--inventory".to_owned());
    }
    if let Some(timeout) = features.payment_timeout {
        args.push("--payment-timeout".to_owned());
        args.push(format!("{}ms", timeout.as_millis()));
    }
    args
}

/// What the demo measured.
#[derive(Debug, Clone)]
pub struct DemoOutcome {
    /// The verification report.
    pub report: verify::Report,
    /// Per partition taken over after the fault: (new node, generation, time from the fault).
    pub takeovers: BTreeMap<u32, (String, u64, Duration)>,
}

/// Where the node logs of a demo go; kept after the demo for reading.
pub fn logs_dir() -> PathBuf {
    std::env::temp_dir().join(format!("order-processor-demo-{}", std::process::id()))
}

/// How often the demo's owners compact their partitions: jetshard's default is 30 s, longer
/// than the demo runs; at 5 s its journals are compacted while it runs, and `verify` reads the
/// copies that keep every record.
const DEMO_COMPACTION_INTERVAL: Duration = Duration::from_secs(5);

/// When something happened, from the demo's start.
struct Clock(Instant);

impl Clock {
    fn stamp(&self) -> String {
        format!("[{:>5.1}s]", self.0.elapsed().as_secs_f64())
    }
}

/// The fault as it was done.
struct Struck {
    victim: usize,
    at_ms: u128,
    partitions: Vec<u32>,
}

/// Runs the demo and prints its story on stdout.
///
/// # Errors
/// If the server or a node cannot be started, or a bounded wait runs out. Violations are in
/// the outcome's report, not errors.
pub async fn run(options: DemoOptions) -> anyhow::Result<DemoOutcome> {
    let clock = Clock(Instant::now());
    let settings = &options.settings;
    println!(
        "jetshard demo: 3 nodes, {} partitions, pin TTL {} ms, ack wait {} ms, compaction every {} s, fault {}",
        settings.partitions,
        settings.pin_ttl.as_millis(),
        settings.ack_wait.as_millis(),
        DEMO_COMPACTION_INTERVAL.as_secs(),
        options.fault.signal()
    );
    let features = &options.features;
    if features.inventory {
        println!(
            "  --inventory: every item an order adds is reserved from its product's inventory entity ({} units each)",
            crate::inventory::STOCK
        );
    }
    if let Some(timeout) = features.payment_timeout {
        println!(
            "  --payment-timeout {} ms: an order not paid in time is cancelled by a durable timer",
            timeout.as_millis()
        );
    }

    let server = NatsServer::start()
        .await
        .context("start nats-server (run scripts/install-nats-server, or set NATS_SERVER_BIN)")?;
    let client = server.connect().await?;
    println!("{} nats-server on {}", clock.stamp(), server.url());

    let logs = logs_dir();
    std::fs::create_dir_all(&logs).with_context(|| format!("create {}", logs.display()))?;
    let exe = std::env::current_exe().context("find this program")?;
    let mut nodes = Vec::new();
    for (index, id) in (0u16..).zip(["node-a", "node-b", "node-c"]) {
        let log = logs.join(format!("{id}.log"));
        let mut extra = feature_args(features);
        extra.extend([
            "--compaction-interval-ms".to_owned(),
            DEMO_COMPACTION_INTERVAL.as_millis().to_string(),
        ]);
        if let Some(port) = options.metrics_port {
            let addr = format!("127.0.0.1:{}", port.saturating_add(index));
            println!("{} {id}: http://{addr}/metrics", clock.stamp());
            extra.extend(["--metrics-addr".to_owned(), addr]);
        }
        let node = NodeProcess::spawn_with(&exe, &server.url(), id, settings, &log, &extra)?;
        nodes.push(node);
    }
    for node in &mut nodes {
        node.wait_ready(Duration::from_secs(30)).await?;
    }
    println!(
        "{} node-a, node-b, node-c ready (their logs: {}/node-*.log)",
        clock.stamp(),
        logs.display()
    );

    let load_options = LoadOptions {
        orders: options.orders,
        rate: Some(options.rate),
        concurrency: 64,
        seed: 1,
        prefix: load::run_prefix(),
    };
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} commands {per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let say = |line: String| bar.suspend(|| println!("{line}"));
    say(format!(
        "{} loading {} orders at {} commands/s",
        clock.stamp(),
        options.orders,
        options.rate
    ));
    let mut loading = {
        let (client, load_options, bar) = (client.clone(), load_options.clone(), bar.clone());
        tokio::spawn(async move { load::run(client, &load_options, &bar).await })
    };

    let mut struck: Option<Struck> = None;
    let mut thawed = false;
    let mut releases_shown = 0;
    let mut takeovers = BTreeMap::new();
    let mut load_report: Option<LoadReport> = None;
    let mut load_done_at = None;
    let bound = settings.pin_ttl + settings.ack_wait + Duration::from_secs(20);
    loop {
        tokio::select! {
            done = &mut loading, if load_report.is_none() => {
                load_report = Some(done.context("load task")??);
                load_done_at = Some(Instant::now());
            }
            _ = tokio::time::sleep(Duration::from_millis(25)) => {}
        }
        if load_done_at.is_some_and(|t| t.elapsed() > bound) {
            bar.finish_and_clear();
            anyhow::bail!("no takeover within {bound:?} after the load ended");
        }
        let Some(fault) = &struck else {
            let published = bar.position();
            let length = bar.length().unwrap_or(0);
            let owners: Vec<Vec<u32>> = nodes.iter().map(NodeProcess::owned).collect();
            let owned: usize = owners.iter().map(Vec::len).sum();
            let due = length > 0 && published * 100 >= length * options.fault_at_percent;
            if !(due && owned as u32 >= settings.partitions) && load_report.is_none() {
                continue;
            }
            let listing: Vec<String> = nodes
                .iter()
                .zip(&owners)
                .map(|(n, o)| format!("{} {o:?}", n.id))
                .collect();
            say(format!("{} owners: {}", clock.stamp(), listing.join(", ")));
            let victim = (0..nodes.len())
                .max_by_key(|i| (owners[*i].len(), std::cmp::Reverse(*i)))
                .unwrap_or(0);
            let at_ms = unix_ms();
            match options.fault {
                Fault::Kill => nodes[victim].kill().await?,
                Fault::Stop => nodes[victim].freeze()?,
                Fault::Term => nodes[victim].request_stop()?,
            }
            say(format!(
                "{} {} {} (owner of partitions {:?}) after {published} of {length} commands",
                clock.stamp(),
                options.fault.signal(),
                nodes[victim].id,
                owners[victim]
            ));
            struck = Some(Struck {
                victim,
                at_ms,
                partitions: owners[victim].clone(),
            });
            continue;
        };
        for node in nodes.iter().filter(|n| n.id != nodes[fault.victim].id) {
            for (partition, generation, at_ms) in node.acquired_since(fault.at_ms) {
                if !fault.partitions.contains(&partition) || takeovers.contains_key(&partition) {
                    continue;
                }
                let after = Duration::from_millis(at_ms.saturating_sub(fault.at_ms) as u64);
                say(format!(
                    "{} partition {partition} taken over by {} as generation {generation}, {:.2} s after the {}",
                    clock.stamp(),
                    node.id,
                    after.as_secs_f64(),
                    options.fault.signal()
                ));
                takeovers.insert(partition, (node.id.clone(), generation, after));
            }
        }
        let all_taken = takeovers.len() == fault.partitions.len();
        if options.fault == Fault::Stop && all_taken && !thawed {
            nodes[fault.victim].thaw()?;
            thawed = true;
            say(format!(
                "{} SIGCONT {}: it resumes with the commands it held, as the owner it no longer is",
                clock.stamp(),
                nodes[fault.victim].id
            ));
        }
        let mut stepped_down = true;
        if thawed {
            let released = nodes[fault.victim].released();
            for (partition, generation, reason) in released.iter().skip(releases_shown) {
                say(format!(
                    "{} {} stepped down from partition {partition} generation {generation}: {reason}",
                    clock.stamp(),
                    nodes[fault.victim].id
                ));
            }
            releases_shown = released.len();
            stepped_down = fault
                .partitions
                .iter()
                .all(|p| released.iter().any(|(r, _, _)| r == p));
        }
        if let Some(report) = &load_report
            && all_taken
            && stepped_down
        {
            bar.finish_and_clear();
            println!(
                "{} load done: {} commands published ({} malformed bodies, {} unconfirmed) in {:.1} s",
                clock.stamp(),
                report.published,
                report.malformed,
                report.failed,
                report.elapsed.as_secs_f64()
            );
            break;
        }
    }

    println!(
        "{} verifying: waiting for every partition to drain (and the saga to settle, the timers due to fire), then reading the streams",
        clock.stamp()
    );
    let settle = settings.ack_wait * 2
        + features.payment_timeout.unwrap_or_default()
        + Duration::from_secs(20);
    let verify_options = VerifyOptions {
        settle,
        features: *features,
    };
    let report = verify::run(client.clone(), &verify_options).await?;
    println!("{report}");
    println!("{}", journal_sizes(&client, features).await?);

    let mut stopped = Vec::new();
    for (i, node) in nodes.iter_mut().enumerate() {
        if options.fault == Fault::Kill && struck.as_ref().is_some_and(|s| s.victim == i) {
            continue;
        }
        let graceful = node.terminate(Duration::from_secs(20)).await;
        let how = if graceful {
            "stopped gracefully"
        } else {
            "killed"
        };
        stopped.push(format!("{} {how}", node.id));
    }
    println!("{} {}", clock.stamp(), stopped.join(", "));

    let load_report = load_report.unwrap_or_default();
    let times: Vec<Duration> = takeovers.values().map(|(_, _, t)| *t).collect();
    println!();
    println!("summary");
    let orders = &report.orders;
    println!(
        "  commands:          {} published ({} malformed), {} order commands checked",
        load_report.published, load_report.malformed, orders.commands
    );
    println!(
        "  outcomes:          {} events, {} dead letters",
        orders.events.values().sum::<usize>(),
        orders.dead_letters
    );
    if features.inventory {
        let inventory = &report.inventory;
        println!(
            "  saga:              {} items reserved, {} out of stock ({} orders cancelled for it), {} released; {} inventory commands",
            inventory.count("Reserved"),
            inventory.count("OutOfStock"),
            orders.count("ItemUnavailable"),
            inventory.count("Released"),
            inventory.commands
        );
    }
    if features.payment_timeout.is_some() {
        let timers = &report.timers;
        println!(
            "  timers:            {} set, {} fired ({} unpaid orders expired), {} cancelled by payment or cancellation",
            timers.set,
            timers.fired,
            orders.count("Expired"),
            timers.cancelled
        );
    }
    if let Some(fault) = &struck {
        println!(
            "  fault:             {} {} (partitions {:?})",
            options.fault.signal(),
            nodes[fault.victim].id,
            fault.partitions
        );
    }
    println!(
        "  takeovers:         {} after the fault ({} order generations claimed in all)",
        takeovers.len(),
        orders.generations.values().map(Vec::len).sum::<usize>()
    );
    if let (Some(min), Some(max)) = (times.iter().min(), times.iter().max()) {
        println!(
            "  time to take over: {:.0} ms to {:.0} ms after the {} (pin TTL {:.2} s)",
            min.as_secs_f64() * 1000.0,
            max.as_secs_f64() * 1000.0,
            options.fault.signal(),
            settings.pin_ttl.as_secs_f64()
        );
    }
    println!("  violations:        {}", report.violations.len());
    println!("  node logs:         {}", logs.display());
    drop(server);
    Ok(DemoOutcome { report, takeovers })
}

/// What the owners' compaction left in each journal, against the copy that keeps every record.
async fn journal_sizes(client: &async_nats::Client, features: &Features) -> anyhow::Result<String> {
    let js = async_nats::jetstream::new(client.clone());
    let mut journals = vec![crate::order::JOURNAL_STREAM];
    if features.inventory {
        journals.push(crate::inventory::JOURNAL_STREAM);
    }
    let mut lines = Vec::new();
    for journal in journals {
        let messages = |name: String| {
            let js = js.clone();
            async move { anyhow::Ok(js.get_stream(&name).await?.info().await?.state.messages) }
        };
        let live = messages(journal.to_owned()).await?;
        let copy = messages(verify::journal_copy(journal)).await?;
        lines.push(format!(
            "{journal}: {live} records after compaction; its copy, which verify read, {copy}"
        ));
    }
    Ok(lines.join("\n"))
}
