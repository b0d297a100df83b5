//! Scenario 2, latency: from publishing a command to its event being stored, at a fixed offered
//! rate (by default half of jetshard's warm drain rate measured in the same run).
//!
//! Every command carries its *scheduled* send time (this process's monotonic clock); its event
//! carries it on. A core subscription on `<t>.evt.>` receives each event as the journal
//! stream stores it, and the latency is receipt time minus scheduled time, so a generator that
//! falls behind shows up in the figures instead of hiding (no coordinated omission). Every
//! entity has an event in the journal and is made resident first; the first second of load is a
//! warm-up, not recorded. The bare loop runs the same load on its own fresh server first, as
//! the baseline. Rounds alternate the two (`--latency-rounds`); the figures are the medians of
//! the rounds' percentiles and the largest maximum.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use jetshard::{Codec, ShardConfig, ShardSystem};
use serde::Serialize;
use serde_json::json;

use crate::Options;
use crate::bare::BareLoop;
use crate::drain::DrainSpec;
use crate::entity::{BenchCmd, BenchEntity, BenchEvt};
use crate::load::{self, AckWindow};
use crate::report::{Report, Row, Worse};
use crate::stages;
use crate::stats::{Summary, now_ns};
use crate::throughput::{self, Measured};

const ENTITY_TYPE: &str = "lat";

/// Load before the measured window.
const WARM_UP: Duration = Duration::from_secs(1);

/// How long the last events may take to arrive after the load stops.
const SETTLE: Duration = Duration::from_secs(20);

/// Scenario 2.
pub async fn run(
    options: &Options,
    measured: Option<Measured>,
    report: &mut Report,
) -> anyhow::Result<()> {
    let rate = match (options.latency_rate, measured) {
        (Some(rate), _) => rate,
        (None, Some(measured)) => measured.jetshard_warm / 2.0,
        (None, None) => {
            eprintln!("latency: measuring the warm maximum first");
            let spec = DrainSpec {
                pull_batch: options.pull_batch,
                max_ack_pending: options.max_ack_pending,
                ..DrainSpec::new(
                    options,
                    options.partitions,
                    50_000,
                    std::time::Duration::from_secs(60),
                )
            };
            let run = throughput::drain_jetshard(spec).await?;
            run.passes.last().map_or(1000.0, |p| p.rate) / 2.0
        }
    };
    let rate = rate.max(1.0);
    let mut details = serde_json::Map::new();
    let mut runs: Vec<(Side, SideFigures)> = Vec::new();
    for round in 0..options.latency_rounds {
        for side in [Side::Bare, Side::Jetshard] {
            eprintln!(
                "latency round {}/{}: {}, {rate:.0} cmd/s for {} s",
                round + 1,
                options.latency_rounds,
                side.name(),
                options.latency_secs
            );
            let measured = measure(side, options, rate).await?;
            if measured.received < measured.commands {
                eprintln!(
                    "latency: {}: only {} of {} events arrived",
                    side.name(),
                    measured.received,
                    measured.commands
                );
            }
            runs.push((side, measured));
        }
    }
    let mut bare_p99 = None;
    for side in [Side::Bare, Side::Jetshard] {
        let of_side: Vec<&SideFigures> = runs
            .iter()
            .filter(|(s, _)| *s == side)
            .map(|(_, m)| m)
            .collect();
        let case = |what: &str| {
            format!(
                "{}, {what}, {rate:.0} cmd/s offered, {} partitions, {} entities",
                side.name(),
                options.partitions,
                options.entities
            )
        };
        let over_rounds = |what: &str, f: fn(&Summary) -> f64| {
            let rounds: Vec<f64> = of_side.iter().map(|m| f(&m.summary)).collect();
            Row::over_rounds("latency", case(what), &rounds, "ms", Worse::Higher)
        };
        let p99_row = over_rounds("p99", |s| s.p99);
        let p99 = p99_row.value;
        report.rows.push(over_rounds("p50", |s| s.p50));
        report.rows.push(match bare_p99 {
            Some(baseline) => p99_row.against(baseline),
            None => p99_row,
        });
        report.rows.push(over_rounds("p999", |s| s.p999));
        report.rows.push(over_rounds("max", |s| s.max));
        if side == Side::Bare {
            bare_p99 = Some(p99);
        }
        details.insert(side.name().to_owned(), serde_json::to_value(&of_side)?);
    }
    details.insert("rate".to_owned(), json!(rate));
    report
        .details
        .insert("latency".to_owned(), serde_json::Value::Object(details));
    Ok(())
}

/// Who consumes the commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Bare,
    Jetshard,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Bare => "bare loop",
            Side::Jetshard => "jetshard",
        }
    }
}

/// What one side measured.
#[derive(Debug, Serialize)]
struct SideFigures {
    commands: usize,
    received: usize,
    offered_rate: f64,
    summary: Summary,
    /// The largest latency of each second of the measured window, ms: periodic stalls show
    /// as a pattern here.
    max_per_second_ms: Vec<f64>,
    /// The latency split by stage, in one run (`--latency-stages`; empty without it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stages: Vec<stages::Step>,
}

/// A fresh server, the consumer side running with every entity seeded and warmed up, then
/// `rate` commands/s for the warm-up and the measured window.
async fn measure(side: Side, options: &Options, rate: f64) -> anyhow::Result<SideFigures> {
    let server = crate::server::nats_server().await?;
    let control = server.connect().await?;
    let config = ShardConfig::builder(ENTITY_TYPE)
        .partitions(options.partitions)
        .node_id("bench")
        .build()?;
    let consumer = match side {
        Side::Jetshard => Consumer::Jetshard(Box::new(
            ShardSystem::start::<BenchEntity>(server.connect().await?, config)
                .await
                .context("start the shard system")?,
        )),
        Side::Bare => {
            load::provision(server.connect().await?, config).await?;
            Consumer::Bare(
                BareLoop::start(server.connect().await?, ENTITY_TYPE, options.partitions).await?,
            )
        }
    };
    let publisher = load::warm_entities(
        &control,
        ENTITY_TYPE,
        options.partitions,
        options.entities,
        options.command_bytes,
    )
    .await?;

    let stamps = Stamps::listen(&server.connect().await?, ENTITY_TYPE, Codec::default()).await?;
    let total_secs = WARM_UP.as_secs_f64() + options.latency_secs as f64;
    let total = (rate * total_secs) as usize;
    if options.latency_stages {
        stages::record(true);
    }
    let mut processes = vec![("bench", std::process::id())];
    processes.extend(server.pid().map(|pid| ("nats-server", pid)));
    let sched = crate::runqueue::Sampled::start(&processes);
    let offered = offer_stamped(&publisher, rate, total, options.command_bytes).await?;
    if options.latency_stages {
        // Over the warm-up and the window, as a share of one core (2 on this machine).
        eprintln!("latency cpu: {}: {}", side.name(), sched.report());
    }
    // Some events may never come (a lost subscription message); the figures say how many.
    stamps.wait_for(total, SETTLE).await;
    let received = stamps.count();
    if received < total {
        // The command stream is a work queue and a command is acked only once its event is
        // durable: an empty stream means the missing events were dropped on their way to the
        // listener, not lost.
        let acked = load::wait_drained(&control, ENTITY_TYPE, Duration::from_secs(1)).await;
        eprintln!(
            "latency: {}: {} events missing at the listener; every command acked: {}",
            side.name(),
            total - received,
            acked.is_ok()
        );
    }
    let seen = stamps.seen();
    let recorded = stamps.stop();
    consumer.stop().await?;

    let warm_up_end = offered.started_ns + WARM_UP.as_nanos() as u64;
    let stages = if options.latency_stages {
        stages::split(&seen, warm_up_end)
    } else {
        Vec::new()
    };
    for step in &stages {
        eprintln!("latency stages: {:>9}: {}", side.name(), step.describe());
    }
    let measured: Vec<(u64, u64)> = recorded
        .into_iter()
        .filter(|(at, _)| *at >= warm_up_end)
        .collect();
    let samples: Vec<f64> = measured.iter().map(|(_, l)| *l as f64 / 1e6).collect();
    let mut max_per_second_ms = vec![0.0_f64; options.latency_secs as usize + 1];
    for (at, latency) in &measured {
        let second = ((at - warm_up_end) / 1_000_000_000) as usize;
        if let Some(max) = max_per_second_ms.get_mut(second) {
            *max = max.max(*latency as f64 / 1e6);
        }
    }
    Ok(SideFigures {
        commands: total,
        received,
        offered_rate: total as f64 / offered.secs,
        summary: Summary::of(&samples),
        max_per_second_ms,
        stages,
    })
}

/// The running consumer side.
enum Consumer {
    Jetshard(Box<ShardSystem>),
    Bare(BareLoop),
}

impl Consumer {
    async fn stop(self) -> anyhow::Result<()> {
        match self {
            Consumer::Jetshard(system) => system.shutdown().await.context("shut the system down"),
            Consumer::Bare(bare) => bare.stop().await,
        }
    }
}

/// The latencies of stamped events (`BenchEvt::Stamped`), each taken when a core subscription
/// on `<t>.evt.>` receives it as the journal stores it: (scheduled send, ns; latency, ns).
pub(crate) struct Stamps {
    recorded: Arc<Mutex<Vec<(u64, u64)>>>,
    /// While stages are recorded: each event's partition and command sequence too.
    seen: Arc<Mutex<Vec<stages::Seen>>>,
    collector: tokio::task::JoinHandle<()>,
}

impl Stamps {
    /// Subscribes on `client` to the events of `entity_type`, decoded with `codec`.
    pub(crate) async fn listen(
        client: &async_nats::Client,
        entity_type: &str,
        codec: Codec,
    ) -> anyhow::Result<Self> {
        let mut events = load::subscribe_events(client, entity_type).await?;
        let recorded = Arc::new(Mutex::new(Vec::new()));
        let sink = recorded.clone();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen_sink = seen.clone();
        let collector = tokio::spawn(async move {
            while let Some(message) = events.next().await {
                let received = now_ns();
                if let Ok(BenchEvt::Stamped { at_ns } | BenchEvt::Padded { at_ns, .. }) =
                    codec.decode(&message.payload)
                {
                    sink.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((at_ns, received.saturating_sub(at_ns)));
                    if stages::recording()
                        && let Some(seq) = message
                            .headers
                            .as_ref()
                            .and_then(|h| h.get(jetshard::wire::HDR_MSG_ID))
                            .and_then(|id| stages::command_seq_of_msg_id(id.as_str()))
                    {
                        let partition = stages::partition_of_event_subject(&message.subject)
                            .unwrap_or(stages::UNKNOWN);
                        seen_sink
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push((partition, seq, at_ns, received));
                    }
                }
            }
        });
        Ok(Self {
            recorded,
            seen,
            collector,
        })
    }

    /// Events received so far.
    pub(crate) fn count(&self) -> usize {
        self.recorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Waits (at most `within`) until `total` events have come.
    pub(crate) async fn wait_for(&self, total: usize, within: Duration) {
        let _ = jetshard_testkit::wait_until(within, "every event to arrive", || async {
            self.count() >= total
        })
        .await;
    }

    /// What is received so far, shared: (scheduled send, ns; latency, ns), in arrival order.
    pub(crate) fn recorded(&self) -> Arc<Mutex<Vec<(u64, u64)>>> {
        self.recorded.clone()
    }

    /// The events received while stages were recorded: (partition, command sequence,
    /// scheduled send, received).
    pub(crate) fn seen(&self) -> Vec<stages::Seen> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops listening; what was received.
    pub(crate) fn stop(self) -> Vec<(u64, u64)> {
        self.collector.abort();
        std::mem::take(&mut *self.recorded.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// When an offered load ran.
pub(crate) struct Offered {
    /// The scheduled send time of command 0 (`stats::now_ns`).
    pub(crate) started_ns: u64,
    /// How long sending took, s.
    pub(crate) secs: f64,
}

/// Offers `total` stamped commands of `bytes` at `rate`/s through `publisher` ([`offer`]) and
/// waits until the stream has stored them all.
pub(crate) async fn offer_stamped(
    publisher: &load::CommandPublisher,
    rate: f64,
    total: usize,
    bytes: usize,
) -> anyhow::Result<Offered> {
    let mut window = AckWindow::default();
    let offered = offer(rate, total, async |i, at_ns| {
        let ack = publisher
            .send_to(i, &BenchCmd::stamp_of_size(at_ns, bytes))
            .await?;
        window.push(ack).await
    })
    .await?;
    window.drain().await?;
    Ok(offered)
}

/// Offers `total` commands at `rate`/s: `send(i, at_ns)` at each one's scheduled time
/// (`at_ns` on `stats::now_ns`'s clock), late ones at once, so that a generator that falls
/// behind shows in the latencies (no coordinated omission).
pub(crate) async fn offer(
    rate: f64,
    total: usize,
    mut send: impl AsyncFnMut(usize, u64) -> anyhow::Result<()>,
) -> anyhow::Result<Offered> {
    let started_ns = now_ns();
    let started = tokio::time::Instant::now();
    let interval_ns = 1e9 / rate.max(1e-3);
    for i in 0..total {
        let offset = Duration::from_nanos((i as f64 * interval_ns) as u64);
        let due = started + offset;
        if due > tokio::time::Instant::now() {
            tokio::time::sleep_until(due).await;
        }
        send(i, started_ns + offset.as_nanos() as u64).await?;
    }
    Ok(Offered {
        started_ns,
        secs: started.elapsed().as_secs_f64(),
    })
}
