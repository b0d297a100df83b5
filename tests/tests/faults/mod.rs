//! What the fault-injection suites (`chaos.rs`, `cluster.rs`) share: seeds and their random
//! choices, a load generator that records the history, node processes by slot, and the
//! reporting of a run. The ledger's model and the journal check are `jetshard_tests::model`.
//!
//! A schedule is a function of its seed: which faults, on which node or partition, when and for
//! how long. The real processes and the server then run in real time, so a seed replays the same
//! schedule, not the same interleaving.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, context::Context, message::PublishMessage};
use jetshard_testkit::history;
use jetshard_testkit::history::{Ack, History, Violation};
use jetshard_testkit::wait_until;
use jetshard_tests::describe_consumers;
use jetshard_tests::ledger::LedgerCmd;
use jetshard_tests::model::{
    LedgerModel, Op, check_effects, check_journal, check_query_answers, client_outcomes,
    journal_excerpt, read_ledger, read_stock,
};
use jetshard_tests::node::{Node, NodeOptions, NodeSpec};
use serde::Serialize;
use tokio::task::JoinHandle;

// ---------------------------------------------------------------------------------------------
// Seeds

/// A small deterministic generator (SplitMix64): the same seed gives the same choices.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5DEE_CE66_D1A4_F00D)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// A duration between `low` and `high` milliseconds.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high - low + 1))
    }

    /// One of `items`.
    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize].clone()
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// The seeds a scenario runs: `JETSHARD_SEED=<s>` runs that one; otherwise `JETSHARD_SEEDS`
/// (default `default_count`) seeds from `JETSHARD_SEED_BASE` (default `default_base`).
pub fn seeds(default_base: u64, default_count: u64) -> Vec<u64> {
    let var = |name: &str| {
        std::env::var(name).ok().map(|v| {
            v.trim()
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        })
    };
    if let Some(seed) = var("JETSHARD_SEED") {
        return vec![seed];
    }
    let base = var("JETSHARD_SEED_BASE").unwrap_or(default_base);
    let count = var("JETSHARD_SEEDS").unwrap_or(default_count);
    (base..base + count).collect()
}

/// Schedules of one process-wide suite run one at a time: each starts a server and several
/// node processes, and two at once on a 2-core machine would starve each other's pin TTLs.
pub async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    // A tokio mutex: held across awaits, and not poisoned by a failed schedule.
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

// ---------------------------------------------------------------------------------------------
// Load

/// How long one publish may wait for the stream's acknowledgement before it is sent again.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(2);

/// Publishes `op` for `entity` with the message id `msg_id` and waits for the stream's
/// acknowledgement, sending it again (same id, so the stream stores it once) until `give_up`.
pub async fn publish(
    js: &Context,
    entity: &str,
    payload: Vec<u8>,
    msg_id: &str,
    give_up: Duration,
    retries: &AtomicU64,
) -> Ack {
    let deadline = Instant::now() + give_up;
    loop {
        let message = PublishMessage::build()
            .payload(payload.clone().into())
            .message_id(msg_id);
        let attempt = async {
            js.send_publish(format!("ledger.cmd.{entity}"), message)
                .await?
                .await
        };
        match tokio::time::timeout(PUBLISH_TIMEOUT, attempt).await {
            Ok(Ok(ack)) => return Ack::Acked(ack.sequence),
            Ok(Err(_)) | Err(_) => {
                retries.fetch_add(1, Ordering::Relaxed);
                if Instant::now() >= deadline {
                    return Ack::Unknown;
                }
                // Deliberate: a short pause before sending again while the server is away.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// JSON, as `ledger_config` sets the codec.
pub fn encode(command: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(command).expect("encode")
}

/// Continuous load: one task per entity publishes `Push { n }` with rising `n`, one command in
/// flight per entity, recording each in the history.
pub struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<History<Op>>>,
    /// Publishes that had to be sent again.
    pub retries: Arc<AtomicU64>,
    /// Commands acknowledged so far.
    pub acked: Arc<AtomicU64>,
}

impl Load {
    /// Starts publishing to every entity in `entities`, pausing `interval` between two commands
    /// of one entity. An unconfirmed publish is sent again for up to `give_up`.
    pub fn start(
        client: async_nats::Client,
        entities: &[String],
        interval: Duration,
        give_up: Duration,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let retries = Arc::new(AtomicU64::new(0));
        let acked = Arc::new(AtomicU64::new(0));
        let tasks = entities
            .iter()
            .map(|entity| {
                let js = jetstream::ContextBuilder::new()
                    .timeout(PUBLISH_TIMEOUT)
                    .build(client.clone());
                let (entity, stop, retries, acked) =
                    (entity.clone(), stop.clone(), retries.clone(), acked.clone());
                tokio::spawn(async move {
                    let mut history = History::new();
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let payload = encode(&LedgerCmd::Push { n });
                        let msg_id = format!("{entity}:{n}");
                        let ack = publish(&js, &entity, payload, &msg_id, give_up, &retries).await;
                        if matches!(ack, Ack::Acked(_)) {
                            acked.fetch_add(1, Ordering::Relaxed);
                        }
                        history.record(entity.clone(), Op::Push(n), ack);
                        n += 1;
                        // Deliberate: the load's pace, not a wait for a condition.
                        tokio::time::sleep(interval).await;
                    }
                    history
                })
            })
            .collect();
        Load {
            stop,
            tasks,
            retries,
            acked,
        }
    }

    /// Stops publishing and returns the history.
    pub async fn finish(self) -> History<Op> {
        self.stop.store(true, Ordering::Relaxed);
        let mut history = History::new();
        for task in self.tasks {
            history.extend(task.await.expect("load task"));
        }
        history
    }
}

/// Waits (bounded) until no partition consumer has a command pending or unacknowledged, then
/// returns how many messages the command stream still holds (it should hold none; a clustered
/// work-queue stream has been seen to keep a few acknowledged ones).
pub async fn wait_consumers_drained(
    js: &Context,
    partitions: u32,
    within: Duration,
) -> Result<u64, String> {
    let drained = wait_until(within, "every partition consumer to drain", || async {
        let Ok(stream) = js.get_stream_no_info("LEDGER_CMD").await else {
            return false;
        };
        for partition in 0..partitions {
            match stream.consumer_info(format!("ledger-p{partition}")).await {
                Ok(info) if info.num_pending == 0 && info.num_ack_pending == 0 => {}
                _ => return false,
            }
        }
        true
    })
    .await;
    if let Err(e) = drained {
        return Err(format!("{e}\n{}", describe_consumers(js).await));
    }
    let left = || async {
        match js.get_stream("LEDGER_CMD").await {
            Ok(mut stream) => stream.info().await.map_or(u64::MAX, |i| i.state.messages),
            Err(_) => u64::MAX,
        }
    };
    // The stream removes acknowledged commands a moment after the consumer records the ack.
    let _ = wait_until(
        Duration::from_secs(5),
        "the command stream to empty",
        || async { left().await == 0 },
    )
    .await;
    let left = left().await;
    Ok(left)
}

// ---------------------------------------------------------------------------------------------
// Nodes

/// One place for a node process; a node killed or stopped there can be started again under a
/// new id (`a1`, `a2`, ...).
pub struct Slot {
    /// `a`, `b`, `c`...
    pub name: String,
    /// How often a node was started here.
    pub incarnation: u32,
    /// The node, if one was started and not yet removed.
    pub node: Option<Node>,
    /// Whether it is frozen (SIGSTOP).
    pub paused: bool,
    /// The servers it connects to.
    pub urls: String,
}

/// The node processes of one schedule.
pub struct Nodes {
    /// The slots.
    pub slots: Vec<Slot>,
    spec: NodeSpec,
    args: Vec<String>,
    logs: tempfile::TempDir,
}

impl Nodes {
    /// The settings every node runs with.
    pub fn spec(&self) -> &NodeSpec {
        &self.spec
    }

    /// Starts one node per entry of `urls` (its server list).
    pub async fn start(urls: Vec<String>, spec: NodeSpec, args: Vec<String>) -> Nodes {
        let mut logs = tempfile::Builder::new()
            .prefix("jetshard-nodes-")
            .tempdir()
            .expect("log dir");
        if std::env::var_os("JETSHARD_KEEP_LOGS").is_some() {
            // For a replay: the nodes' whole logs, kept after the test.
            logs.disable_cleanup(true);
            eprintln!("node logs kept in {}", logs.path().display());
        }
        let mut nodes = Nodes {
            slots: urls
                .into_iter()
                .enumerate()
                .map(|(i, urls)| Slot {
                    name: ((b'a' + i as u8) as char).to_string(),
                    incarnation: 0,
                    node: None,
                    paused: false,
                    urls,
                })
                .collect(),
            spec,
            args,
            logs,
        };
        // The first node provisions the streams alone; the others then start side by side.
        nodes.spawn(0);
        nodes.wait_ready(0).await;
        for slot in 1..nodes.slots.len() {
            nodes.spawn(slot);
        }
        for slot in 1..nodes.slots.len() {
            nodes.wait_ready(slot).await;
        }
        nodes
    }

    fn log_path(&self, id: &str) -> PathBuf {
        self.logs.path().join(format!("{id}.log"))
    }

    fn spawn(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        s.incarnation += 1;
        let id = format!("{}{}", s.name, s.incarnation);
        let options = NodeOptions {
            args: self.args.clone(),
            log_file: Some(self.logs.path().join(format!("{id}.log"))),
        };
        s.node = Some(Node::spawn(&s.urls, &id, &self.spec, &options));
        s.paused = false;
    }

    async fn wait_ready(&self, slot: usize) {
        let node = self.slots[slot].node.as_ref().expect("node");
        if let Err(e) = wait_until(Duration::from_secs(30), "node ready", || async {
            node.printed("READY")
        })
        .await
        {
            panic!("{e}: {}", self.log_tail(&node.id, 40));
        }
    }

    /// Starts a new node in `slot` (whose node is gone) and waits until it runs.
    pub async fn restart(&mut self, slot: usize) {
        self.spawn(slot);
        self.wait_ready(slot).await;
    }

    /// The node in `slot`, if it runs and is not frozen.
    pub fn live(&mut self, slot: usize) -> Option<&Node> {
        let s = &mut self.slots[slot];
        if s.paused {
            return None;
        }
        let node = s.node.as_mut()?;
        node.is_running().then_some(&*node)
    }

    /// The slot of the live node that owns `partition` by its own account.
    pub fn owner_of(&mut self, partition: u32) -> Option<usize> {
        (0..self.slots.len()).find(|&slot| {
            self.live(slot)
                .is_some_and(|n| n.owned().contains(&partition))
        })
    }

    /// The slots of live nodes.
    pub fn live_slots(&mut self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&slot| self.live(slot).is_some())
            .collect()
    }

    /// SIGKILL.
    pub async fn kill(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        if let Some(node) = s.node.as_mut() {
            if s.paused {
                node.resume();
            }
            node.kill().await;
        }
        s.paused = false;
    }

    /// SIGTERM and wait (bounded) for the graceful exit.
    pub async fn terminate(&mut self, slot: usize) {
        if let Some(node) = self.slots[slot].node.as_mut() {
            node.terminate().await;
        }
    }

    /// SIGSTOP.
    pub fn pause(&mut self, slot: usize) {
        if let Some(node) = &self.slots[slot].node {
            node.pause();
            self.slots[slot].paused = true;
        }
    }

    /// SIGCONT.
    pub fn resume(&mut self, slot: usize) {
        if let Some(node) = &self.slots[slot].node
            && self.slots[slot].paused
        {
            node.resume();
            self.slots[slot].paused = false;
        }
    }

    /// Thaws frozen nodes and starts a node in every slot whose node is gone.
    pub async fn recover(&mut self) {
        for slot in 0..self.slots.len() {
            self.resume(slot);
            let running = self.slots[slot].node.as_mut().is_some_and(Node::is_running);
            if !running {
                self.restart(slot).await;
            }
        }
    }

    /// Waits (bounded) until every partition is owned by some live node.
    pub async fn wait_all_owned(
        &mut self,
        partitions: u32,
        within: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            if (0..partitions).all(|p| self.owner_of(p).is_some()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("not every partition owned after {within:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last `lines` lines of a node's log.
    pub fn log_tail(&self, id: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path(id)).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Every log line of every node that contains `needle`, prefixed with the node's id.
    pub fn grep_logs(&self, needle: &str, limit: usize) -> String {
        let mut found = Vec::new();
        for slot in &self.slots {
            for incarnation in 1..=slot.incarnation {
                let id = format!("{}{incarnation}", slot.name);
                let text = std::fs::read_to_string(self.log_path(&id)).unwrap_or_default();
                found.extend(
                    text.lines()
                        .filter(|l| l.contains(needle))
                        .map(|l| format!("{id}: {l}")),
                );
            }
        }
        found.sort_by(|a, b| {
            a.split_once(": ")
                .map(|x| x.1)
                .cmp(&b.split_once(": ").map(|x| x.1))
        });
        found.truncate(limit);
        found.join("\n")
    }

    /// Copies every node's whole log to a directory that outlives the test (for a failed
    /// schedule) and returns its path.
    pub fn keep_logs(&self, seed: u64) -> String {
        let dir = std::env::temp_dir().join(format!(
            "jetshard-failed-seed-{seed}-{}",
            std::process::id()
        ));
        let copied = std::fs::create_dir_all(&dir).and_then(|()| {
            for entry in std::fs::read_dir(self.logs.path())? {
                let entry = entry?;
                std::fs::copy(entry.path(), dir.join(entry.file_name()))?;
            }
            Ok(())
        });
        match copied {
            Ok(()) => dir.display().to_string(),
            Err(e) => format!("(not kept: {e})"),
        }
    }

    /// Every node's ownership lines and the tail of its log, for a failure message.
    pub fn describe(&self) -> String {
        let mut text = String::new();
        for slot in &self.slots {
            for incarnation in 1..=slot.incarnation {
                let id = format!("{}{incarnation}", slot.name);
                let _ = writeln!(text, "---- node {id} log tail:\n{}", self.log_tail(&id, 25));
            }
            if let Some(node) = &slot.node {
                let lines: Vec<String> = node.lines().into_iter().map(|l| l.text).collect();
                let _ = writeln!(text, "---- node {} stdout: {}", node.id, lines.join(" | "));
            }
        }
        text
    }
}

// ---------------------------------------------------------------------------------------------
// Reporting

/// Figures of one schedule.
#[derive(Debug, Default, Clone)]
pub struct Figures {
    /// Commands in the history.
    pub commands: usize,
    /// Of those unknown.
    pub unknown: usize,
    /// Publishes sent again.
    pub retries: u64,
    /// Faults injected.
    pub faults: usize,
    /// Violations found.
    pub violations: usize,
    /// Dead letters.
    pub dead_letters: usize,
    /// Fence records (acquisitions).
    pub fences: usize,
    /// Timers armed, fired, cancelled before they fired.
    pub timers: (usize, usize, usize),
    /// Orders, reserved, refused.
    pub orders: (usize, usize, usize),
    /// Keyed requests answered.
    pub keyed: u64,
    /// Query answers.
    pub queries: usize,
}

/// Totals over a test's schedules, printed when the test ends (seen with `--nocapture`).
#[derive(Debug, Default)]
pub struct Totals {
    schedules: usize,
    figures: Figures,
    faults: BTreeMap<String, usize>,
}

impl Totals {
    /// Adds one schedule.
    pub fn add(&mut self, figures: &Figures, faults: &[String]) {
        self.schedules += 1;
        let t = &mut self.figures;
        t.commands += figures.commands;
        t.unknown += figures.unknown;
        t.retries += figures.retries;
        t.faults += figures.faults;
        t.violations += figures.violations;
        t.dead_letters += figures.dead_letters;
        t.fences += figures.fences;
        for fault in faults {
            let kind = fault
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
            *self.faults.entry(kind).or_default() += 1;
        }
    }

    /// One line of totals.
    pub fn line(&self, test: &str) -> String {
        let f = &self.figures;
        format!(
            "TOTALS {test}: {} schedules, {} commands ({} unknown, {} publishes re-sent), {} faults injected {:?}, {} fence records, {} dead letters, {} violations",
            self.schedules,
            f.commands,
            f.unknown,
            f.retries,
            f.faults,
            self.faults,
            f.fences,
            f.dead_letters,
            f.violations
        )
    }
}

/// One schedule of a test, for its messages.
#[derive(Clone, Copy, Debug)]
pub struct Run<'a> {
    /// The test file (`chaos`, `cluster`).
    pub file: &'a str,
    /// The test.
    pub test: &'a str,
    /// The seed.
    pub seed: u64,
}

/// Ends a schedule: waits (bounded by `within`) until no partition consumer holds a command,
/// checks the journal against `history`, and panics with everything needed to debug a failure
/// (the replay line, the report, the journal of the entities it names, the node log lines of
/// the first commands it names, every node's log tail). With `features` (a schedule with every
/// feature on) it also waits (bounded) until every armed timer fired and every order was
/// answered, reads the ledger's history from [`JOURNAL_COPY`] (a compaction purged the
/// journal), and checks the timers, the saga, the stock's state (queried), the query answers
/// and the keyed answers. Returns the schedule's figures and how many acknowledged commands
/// the command stream still holds.
#[allow(clippy::too_many_arguments)]
pub async fn verify(
    js: &Context,
    nodes: &Nodes,
    run: Run<'_>,
    history: &History<Op>,
    injected: &[String],
    retries: u64,
    within: Duration,
    features: Option<FeatureRun>,
) -> (Figures, u64) {
    let Run { file, test, seed } = run;
    let drained = wait_consumers_drained(js, nodes.spec().partitions, within).await;
    let mut history = history.clone();
    let mut extra = Vec::new();
    let mut effects = None;
    let report = match &features {
        None => check_journal(js, &history).await,
        Some(features) => {
            history.extend(features.history.clone());
            // Timers due and answers on their way: wait until nothing is pending.
            let mut last = None;
            let deadline = Instant::now() + within;
            let settled = loop {
                let read = async {
                    wait_journal_copied(js, Duration::from_secs(30)).await?;
                    let ledger = read_ledger(js, Some(JOURNAL_COPY)).await?;
                    let stock = read_stock(js).await?;
                    Ok::<_, String>((ledger, stock))
                };
                match read.await {
                    Ok((ledger, stock)) => {
                        let report = check_effects(&ledger, &stock);
                        let done = report.pending.is_empty();
                        last = Some((ledger, report));
                        if done {
                            break Ok(());
                        }
                    }
                    Err(e) => extra.push(format!("reading the journals: {e}")),
                }
                if Instant::now() >= deadline {
                    break Err(());
                }
                // Polling the journals: timers are due, answers on their way.
                tokio::time::sleep(Duration::from_millis(500)).await;
            };
            if last.is_some() {
                // Reads that failed before one succeeded were the server coming back.
                extra.clear();
            }
            extra.truncate(3);
            match last {
                Some((ledger, report)) => {
                    if settled.is_err() {
                        extra.extend(report.pending.iter().take(10).map(|p| format!("lost: {p}")));
                    }
                    extra.extend(report.violations.iter().take(20).cloned());
                    extra.extend(check_query_answers(&ledger, &features.answers));
                    extra.extend(features.bad_replies.iter().cloned());
                    let config =
                        jetshard_tests::stock::stock_config(features.partitions, "chaos-client")
                            .build()
                            .expect("config");
                    let sender: jetshard::CommandSender<jetshard_tests::stock::Stock> =
                        jetshard::CommandSender::new(js.client(), &config);
                    for stock in &features.stocks {
                        let units = report.stock_units.get(stock).copied().unwrap_or(0);
                        match sender.get(stock, Duration::from_secs(20)).await {
                            Ok(s) if s.state.reserved == units => {}
                            Ok(s) => extra.push(format!(
                                "stock {stock}: its state says {} units reserved, its journal {units}",
                                s.state.reserved
                            )),
                            Err(e) => extra.push(format!("stock {stock}: query failed: {e}")),
                        }
                    }
                    let history_report =
                        history::check(&LedgerModel, &history, &client_outcomes(&ledger));
                    effects = Some(report);
                    history_report
                }
                None => {
                    extra.push("the journals could not be read".to_owned());
                    check_journal(js, &history).await
                }
            }
        }
    };
    let summary = report.summary();
    let mut figures = Figures {
        commands: summary.commands,
        unknown: summary.unknown,
        retries,
        faults: injected.len(),
        violations: report.violations().len() + extra.len(),
        dead_letters: summary.dead_letters,
        fences: summary.fences,
        ..Figures::default()
    };
    if let (Some(effects), Some(features)) = (&effects, &features) {
        figures.timers = (
            effects.timers_set,
            effects.timers_fired,
            effects.timers_cancelled,
        );
        figures.orders = (effects.orders, effects.reserved, effects.refused);
        figures.keyed = features.keyed;
        figures.queries = features.answers.len();
    }
    eprintln!("seed {seed}: {report}\n  faults: {injected:#?}");
    if drained.is_err() || !report.is_ok() || !extra.is_empty() {
        let mut traces = String::new();
        for violation in report.violations().iter().take(3) {
            if let Violation::Lost { command_seq, .. }
            | Violation::Duplicated { command_seq, .. }
            | Violation::Reordered { command_seq, .. } = violation
            {
                traces += &format!(
                    "node log lines of command {command_seq}:\n{}\n",
                    nodes.grep_logs(&format!("cmd_seq={command_seq}"), 40)
                );
            }
        }
        panic!(
            "{test} seed {seed} failed\n{}\nthe nodes' whole logs: {}\ndrained: {drained:?}\n{report}\ntimers, saga, queries, keyed answers: {extra:#?}\n{}\n{traces}faults: {injected:#?}\n{}",
            replay_hint(file, test, seed),
            nodes.keep_logs(seed),
            journal_excerpt(js, &report, 3).await,
            nodes.describe()
        );
    }
    (figures, drained.unwrap_or_default())
}

/// One progress line of a soak (`scripts/soak` reads it): `SOAK <file> <test> seed=<s> ...`.
pub fn soak_line(
    run: Run<'_>,
    took: Duration,
    figures: &Figures,
    injected: &[String],
    partitions: u32,
) -> String {
    let kinds: Vec<&str> = injected
        .iter()
        .filter_map(|f| f.split_whitespace().next())
        .collect();
    format!(
        "SOAK {} {} seed={} secs={:.1} commands={} unknown={} faults={} kinds={} takeovers={} timers={}/{}/{} orders={}/{}/{} keyed={} queries={} dead_letters={} violations={}",
        run.file,
        run.test,
        run.seed,
        took.as_secs_f64(),
        figures.commands,
        figures.unknown,
        figures.faults,
        if kinds.is_empty() {
            "-".to_owned()
        } else {
            kinds.join(",")
        },
        figures.fences.saturating_sub(partitions as usize),
        figures.timers.0,
        figures.timers.1,
        figures.timers.2,
        figures.orders.0,
        figures.orders.1,
        figures.orders.2,
        figures.keyed,
        figures.queries,
        figures.dead_letters,
        figures.violations
    )
}

/// The line that tells how to run one seed again.
pub fn replay_hint(test_file: &str, test: &str, seed: u64) -> String {
    format!(
        "replay: JETSHARD_SEED={seed} cargo test -p jetshard-tests --test {test_file} {test} -- --nocapture"
    )
}

// ---------------------------------------------------------------------------------------------
// Every feature at once

/// The mirror of `LEDGER_JOURNAL` a schedule with a compaction reads its history from: the
/// compaction purges events the snapshots cover, the mirror keeps them.
pub const JOURNAL_COPY: &str = "LEDGER_JOURNAL_COPY";

/// Creates [`JOURNAL_COPY`] (with `replicas`) once the journal exists.
pub async fn start_journal_copy(js: &Context, replicas: usize) {
    let config = jetstream::stream::Config {
        name: JOURNAL_COPY.to_owned(),
        mirror: Some(jetstream::stream::Source {
            name: "LEDGER_JOURNAL".to_owned(),
            ..Default::default()
        }),
        num_replicas: replicas,
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    };
    wait_until(Duration::from_secs(30), "the journal's mirror", || async {
        js.get_or_create_stream(config.clone()).await.is_ok()
    })
    .await
    .expect("create the journal's mirror");
}

/// Waits (bounded) until [`JOURNAL_COPY`] holds everything the journal held when called.
pub async fn wait_journal_copied(js: &Context, within: Duration) -> Result<(), String> {
    let last = |name: &'static str| async move {
        match js.get_stream(name).await {
            Ok(mut stream) => stream.info().await.ok().map(|i| i.state.last_sequence),
            Err(_) => None,
        }
    };
    let target = wait_for(within, || async { last("LEDGER_JOURNAL").await })
        .await
        .ok_or("the journal's last sequence unreadable")?;
    wait_until(within, "the journal's mirror to catch up", || async {
        last(JOURNAL_COPY).await.is_some_and(|seq| seq >= target)
    })
    .await
    .map_err(|e| e.to_string())
}

/// Polls `read` until it returns something, up to `within`.
async fn wait_for<T, F, Fut>(within: Duration, mut read: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = read().await {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The stock entities of a schedule.
pub fn stocks(seed: u64) -> Vec<String> {
    (0..2).map(|k| format!("st{seed}-{k}")).collect()
}

/// The traffic of every feature beside the [`Load`]'s pushes, each recorded for the checkers:
/// durable timers armed and some disarmed (`Arm`, `Disarm`: the timer fires `Fire` into the
/// entity), orders of a saga through the outbox to the `stock` entity type and back (`Order`,
/// answered by `Settle`), keyed requests that retry under the same key
/// (`request_with_key`), and state queries of the load's entities.
pub struct Features {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<History<Op>>>,
    queries: JoinHandle<Vec<(String, Vec<u64>)>>,
    /// Publishes and keyed requests sent again.
    pub retries: Arc<AtomicU64>,
    /// Keyed requests answered.
    pub keyed: Arc<AtomicU64>,
    /// Answers to keyed requests that break a promise (a rejection, a dead letter, other events).
    pub bad_replies: Arc<std::sync::Mutex<Vec<String>>>,
    /// The stock entities the orders go to.
    pub stocks: Vec<String>,
    partitions: u32,
}

/// What [`Features`] leave for [`verify`].
pub struct FeatureRun {
    /// The history of their commands (merge it into the load's).
    pub history: History<Op>,
    /// Query answers: entity, state.
    pub answers: Vec<(String, Vec<u64>)>,
    /// Keyed requests answered.
    pub keyed: u64,
    /// Broken promises in keyed answers.
    pub bad_replies: Vec<String>,
    /// The stock entities.
    pub stocks: Vec<String>,
    /// Partitions (for the stock's sender).
    pub partitions: u32,
}

impl Features {
    /// Starts the traffic for the schedule `seed`; queries ask the load's `queried` entities.
    pub fn start(
        client: async_nats::Client,
        seed: u64,
        partitions: u32,
        queried: &[String],
    ) -> Features {
        let stop = Arc::new(AtomicBool::new(false));
        let retries = Arc::new(AtomicU64::new(0));
        let keyed = Arc::new(AtomicU64::new(0));
        let bad_replies = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stocks = stocks(seed);
        let js = jetstream::ContextBuilder::new()
            .timeout(PUBLISH_TIMEOUT)
            .build(client.clone());
        let config = jetshard_tests::ledger_config(partitions, "chaos-client")
            .build()
            .expect("config");
        let sender: jetshard::CommandSender<jetshard_tests::ledger::Ledger> =
            jetshard::CommandSender::new(client.clone(), &config);
        let give_up = Duration::from_secs(20);
        let mut tasks = Vec::new();
        // Timers: each armed under its own name, about a third disarmed before or after due.
        for k in 0..2u64 {
            let (js, stop, retries) = (js.clone(), stop.clone(), retries.clone());
            let entity = format!("tm{seed}-{k}");
            let mut rng = Rng::new(seed.wrapping_mul(31).wrapping_add(k));
            tasks.push(tokio::spawn(async move {
                let mut history = History::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("t{i}");
                    let op = Op::Arm {
                        name: name.clone(),
                        n: i,
                        after_ms: 200 + rng.below(2300),
                    };
                    let payload = encode(&op.command().expect("a command"));
                    let id = format!("{entity}:arm{i}");
                    let ack = publish(&js, &entity, payload, &id, give_up, &retries).await;
                    history.record(entity.clone(), op, ack);
                    if rng.chance(35) {
                        // Deliberate: the cancel comes before or after the timer is due.
                        tokio::time::sleep(rng.millis(50, 1500)).await;
                        let op = Op::Disarm { name };
                        let payload = encode(&op.command().expect("a command"));
                        let id = format!("{entity}:disarm{i}");
                        let ack = publish(&js, &entity, payload, &id, give_up, &retries).await;
                        history.record(entity.clone(), op, ack);
                    }
                    i += 1;
                    // Deliberate: the timers' pace.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                history
            }));
        }
        // The saga: orders to the two stocks, 1 to 3 units each.
        for k in 0..2u64 {
            let (js, stop, retries) = (js.clone(), stop.clone(), retries.clone());
            let entity = format!("or{seed}-{k}");
            let stocks = stocks.clone();
            tasks.push(tokio::spawn(async move {
                let mut history = History::new();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let op = Op::Order {
                        order: i,
                        stock: stocks[((i + k) % 2) as usize].clone(),
                        qty: 1 + i % 3,
                        reply_to: entity.clone(),
                    };
                    let payload = encode(&op.command().expect("a command"));
                    let id = format!("{entity}:order{i}");
                    let ack = publish(&js, &entity, payload, &id, give_up, &retries).await;
                    history.record(entity.clone(), op, ack);
                    i += 1;
                    // Deliberate: the orders' pace.
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                history
            }));
        }
        // Keyed requests: each retried under its key until it is answered.
        {
            let (sender, stop, retries) = (sender.clone(), stop.clone(), retries.clone());
            let (keyed, bad_replies) = (keyed.clone(), bad_replies.clone());
            let entity = format!("ky{seed}");
            tasks.push(tokio::spawn(async move {
                let mut history = History::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let command = jetshard_tests::ledger::LedgerCmd::Push { n };
                    let key = format!("k{n}");
                    let deadline = Instant::now() + give_up;
                    let ack = loop {
                        let answer = sender
                            .request_with_key(&entity, &key, &command, Duration::from_secs(2))
                            .await;
                        match answer {
                            Ok(reply) => {
                                keyed.fetch_add(1, Ordering::Relaxed);
                                let want = [jetshard_tests::ledger::LedgerEvt::Appended { n }];
                                match &reply {
                                    jetshard::Reply::Applied { events, .. }
                                        if events[..] == want[..] => {}
                                    jetshard::Reply::Duplicate { .. } => {}
                                    other => bad_replies.lock().unwrap().push(format!(
                                        "{entity}: keyed Push {n} answered {other:?}"
                                    )),
                                }
                                break Ack::Acked(reply.command_seq());
                            }
                            Err(_) if Instant::now() < deadline => {
                                retries.fetch_add(1, Ordering::Relaxed);
                                // Deliberate: a short pause before asking again.
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                            Err(_) => break Ack::Unknown,
                        }
                    };
                    history.record(entity.clone(), Op::Push(n), ack);
                    n += 1;
                    // Deliberate: the keyed requests' pace.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                history
            }));
        }
        // Queries of the load's entities.
        let queries = {
            let stop = stop.clone();
            let queried = queried.to_vec();
            let mut rng = Rng::new(seed.wrapping_add(7));
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let entity = rng.pick(&queried);
                    if let Ok(snapshot) = sender.get(&entity, Duration::from_secs(1)).await {
                        answers.push((entity, snapshot.state));
                    }
                    // Deliberate: the queries' pace.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                answers
            })
        };
        Features {
            stop,
            tasks,
            queries,
            retries,
            keyed,
            bad_replies,
            stocks,
            partitions,
        }
    }

    /// Stops the traffic and returns what the checkers need.
    pub async fn finish(self) -> FeatureRun {
        self.stop.store(true, Ordering::Relaxed);
        let mut history = History::new();
        for task in self.tasks {
            history.extend(task.await.expect("feature task"));
        }
        let answers = self.queries.await.expect("query task");
        FeatureRun {
            history,
            answers,
            keyed: self.keyed.load(Ordering::Relaxed),
            bad_replies: self.bad_replies.lock().unwrap().clone(),
            stocks: self.stocks,
            partitions: self.partitions,
        }
    }
}
