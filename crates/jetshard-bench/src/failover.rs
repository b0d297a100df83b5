//! Scenario 4, failover: from SIGKILL (or SIGSTOP) of the owning process to the first command
//! processed by the new owner, at each pin TTL.
//!
//! Per pin TTL and signal, on a fresh server (nodes run with balancing off, so the owner keeps
//! every partition when a standby joins): a load of [`OFFERED_RATE`] commands/s over
//! [`PARTITIONS`] partitions runs throughout. Node `n0` (a child process) owns every
//! partition, node `n1` stands by. Each trial signals the owner and waits, per partition, for
//! the first journal event of a newer generation (a core subscription on `<t>.evt.>` reads
//! each event's `Jetshard-Generation`): that command was processed by the new owner. The
//! victim is then killed and reaped, a fresh standby started, and the new owner is the next
//! trial's victim. Each trial gives one sample per partition.
//!
//! Partition 0 holds [`HISTORY_EVENTS`] events of history (written into the journal before the
//! first node starts, as earlier owners would have), so that the takeover's cost of reading
//! history shows.
//!
//! Targets: after SIGKILL p99 <= [`KILL_TARGET_MS`], whatever the pin TTL and the
//! history: the survivors see the owner's `<t>.alive.<incarnation>` get "no responders" and
//! unpin its partitions. After SIGSTOP p99 <= pin TTL + 300 ms + rebuild time, with
//! the rebuild time taken from the new owner's own `acquired partition` line (the largest in the
//! series): a stalled owner still answers nothing, so it keeps its pin until the TTL.
//!
//! The rolling deploy (module [`rolling`]) runs after the trials.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use futures::StreamExt;
use jetshard::{Codec, ShardConfig};
use serde::Serialize;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::Options;
use crate::entity::BenchEvt;
use crate::load;
use crate::node::{NodeArgs, NodeProcess};
use crate::offered::{OfferedLoad, Stamp};
use crate::probe::unix_ms;
use crate::report::{Report, Row};
use crate::stats::{Summary, now_ns};

pub(crate) const ENTITY_TYPE: &str = "fail";
/// Partitions of the failover system.
pub const PARTITIONS: u32 = 8;
/// Commands/s offered throughout.
pub const OFFERED_RATE: u64 = 200;
/// Entities the load goes to.
const ENTITIES: usize = 64;
/// How long a trial may take beyond the pin TTL before it is declared failed.
const TRIAL_TIMEOUT: Duration = Duration::from_secs(20);
/// Events of history in partition 0 before the first node starts.
pub const HISTORY_EVENTS: usize = 200_000;
/// Entities the history is spread over.
const HISTORY_ENTITIES: usize = 20_000;
/// Target after SIGKILL: p99 of the time to the new owner's first command, ms.
pub const KILL_TARGET_MS: f64 = 100.0;

#[path = "rolling.rs"]
pub mod rolling;

/// The fault a trial injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Fault {
    /// The process dies; its connection closes.
    Kill,
    /// The process freezes with its connection open.
    Stop,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "SIGKILL",
            Fault::Stop => "SIGSTOP",
        }
    }
}

/// One partition's takeover in one trial.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// The trial.
    pub trial: usize,
    /// The partition.
    pub partition: u32,
    /// Signal -> first event of the new generation, ms.
    pub first_event_ms: f64,
    /// How long that event's command waited because of the fault, ms: from the signal, or
    /// from its send if it was sent after the signal (the load sends a partition a command
    /// every 40 ms on average, so the first one after a takeover may come well after it).
    pub command_wait_ms: Option<f64>,
    /// Signal -> the new owner's `acquired partition` line, ms (its clock, unix ms).
    pub acquired_ms: Option<f64>,
    /// The new owner's claim + replay + recovery, ms.
    pub rebuild_ms: Option<u64>,
    /// Events it replayed.
    pub rebuilt_events: Option<u64>,
}

/// Scenario 4.
pub async fn run(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let mut details = serde_json::Map::new();
    // `--failover-trials 0`: the rolling deploy alone.
    let ttls = if options.failover_trials == 0 {
        &[][..]
    } else {
        &options.pin_ttls_ms[..]
    };
    for &ttl_ms in ttls {
        for fault in [Fault::Kill, Fault::Stop] {
            eprintln!(
                "failover: {} trials, {}, pin TTL {ttl_ms} ms",
                options.failover_trials,
                fault.name()
            );
            let pause = Duration::from_millis(options.failover_pause_ms);
            let samples = trials(ttl_ms, fault, options.failover_trials, pause).await?;
            let first_event: Vec<f64> = samples.iter().map(|s| s.first_event_ms).collect();
            let summary = Summary::of(&first_event);
            let rebuild_ms = samples
                .iter()
                .filter_map(|s| s.rebuild_ms)
                .max()
                .unwrap_or(0);
            let (bound, target) = match fault {
                Fault::Kill => (KILL_TARGET_MS, format!("<= {KILL_TARGET_MS:.0} ms")),
                Fault::Stop => {
                    let bound = ttl_ms as f64 + 300.0 + rebuild_ms as f64;
                    (bound, format!("<= TTL + 300 + rebuild ({bound:.0} ms)"))
                }
            };
            let case = |what: &str| {
                format!(
                    "{} -> first command of new owner, pin TTL {ttl_ms} ms, {what}",
                    fault.name()
                )
            };
            // Every row is over all samples; the worst is the slowest sample.
            let over_samples = |what: &str, value: f64| {
                Row::new("failover", case(what), value, "ms").worst_of(summary.max, summary.count)
            };
            report.rows.push(over_samples("p50", summary.p50));
            report
                .rows
                .push(over_samples("p99", summary.p99).target(target, summary.p99 <= bound));
            report.rows.push(over_samples("max", summary.max));
            let waits: Vec<f64> = samples.iter().filter_map(|s| s.command_wait_ms).collect();
            let waited = Summary::of(&waits);
            eprintln!(
                "failover: {} at TTL {ttl_ms} ms: first command p50 {:.0} p99 {:.0} ms; its \
                 wait from the signal or its send p50 {:.0} p99 {:.0} ms",
                fault.name(),
                summary.p50,
                summary.p99,
                waited.p50,
                waited.p99
            );
            report.rows.push(
                Row::new(
                    "failover",
                    case("its command's wait (from the signal or its send), p99"),
                    waited.p99,
                    "ms",
                )
                .worst_of(waited.max, waited.count),
            );
            details.insert(
                format!("{}_ttl_{ttl_ms}", fault.name()),
                json!({ "summary_ms": summary, "max_rebuild_ms": rebuild_ms, "samples": samples }),
            );
        }
    }
    eprintln!("failover: rolling deploy of 3 nodes");
    let rolled = rolling::run(report, !options.rolling_without_snapshots).await?;
    details.insert("rolling".to_owned(), rolled);
    report
        .details
        .insert("failover".to_owned(), serde_json::Value::Object(details));
    Ok(())
}

/// Creates the streams and writes [`HISTORY_EVENTS`] events of [`HISTORY_ENTITIES`] entities
/// into partition 0's journal.
async fn write_history(client: async_nats::Client, ttl_ms: u64) -> anyhow::Result<()> {
    let config = ShardConfig::builder(ENTITY_TYPE)
        .partitions(PARTITIONS)
        .node_id("provisioner")
        .pin_ttl(Duration::from_millis(ttl_ms))
        .balance(false)
        .build()
        .context("failover configuration")?;
    load::provision(client.clone(), config).await?;
    let ids = load::ids_in_partition("h", 0, PARTITIONS, HISTORY_ENTITIES);
    let payload = Bytes::from(
        Codec::default()
            .encode(&BenchEvt::Stamped { at_ns: 0 })
            .context("encode an event")?,
    );
    let events = (0..HISTORY_EVENTS).map(|i| (0, ids[i % ids.len()].clone(), payload.clone()));
    load::write_events(client, ENTITY_TYPE, events).await?;
    Ok(())
}

/// Per partition, when each generation's first event was seen.
pub(crate) type FirstSeen = Arc<Mutex<HashMap<u32, HashMap<u64, FirstEvent>>>>;

/// A generation's first event seen.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FirstEvent {
    /// When it was seen.
    pub(crate) at: Instant,
    /// ... in unix ns.
    pub(crate) at_ns: u64,
    /// When its command was sent, unix ns (as the command carries it).
    pub(crate) sent_ns: Option<u64>,
}

/// Runs `count` trials of one fault at one pin TTL on a fresh server.
async fn trials(
    ttl_ms: u64,
    fault: Fault,
    count: usize,
    pause: Duration,
) -> anyhow::Result<Vec<Sample>> {
    let server = crate::server::nats_server().await?;
    write_history(server.connect().await?, ttl_ms).await?;
    let node_args = |id: usize| NodeArgs {
        // The owner keeps every partition: each trial moves them all at once.
        balance: false,
        ..NodeArgs::new(
            server.url(),
            ENTITY_TYPE,
            format!("n{id}"),
            PARTITIONS,
            ttl_ms,
        )
    };
    let mut owner = NodeProcess::start(&node_args(0)).await?;

    let seen: FirstSeen = Arc::default();
    let watcher = watch_generations(server.connect().await?, seen.clone()).await?;
    let load = offer_load(server.connect().await?);

    let all_owned = |node: &NodeProcess| node.owned().len() == PARTITIONS as usize;
    jetshard_testkit::wait_until(
        Duration::from_secs(30),
        "n0 to own every partition",
        || async { all_owned(&owner) },
    )
    .await?;
    let mut standby = NodeProcess::start(&node_args(1)).await?;
    let mut samples = Vec::new();
    let js = async_nats::jetstream::new(server.connect().await?);
    let mut in_hand_at_last_kill: Vec<u64> = Vec::new();
    let result = async {
        for trial in 0..count {
            // The commands the last takeover found in hand are acknowledged once it has
            // applied them: a crash before that finds them in hand at a second takeover in a
            // row, and the owner after it isolates (owner/isolate.rs), which is not what this
            // measures. Wait until each consumer's ack floor has passed what was delivered when
            // the last takeover was complete.
            wait_recovered_acknowledged(&js, &in_hand_at_last_kill).await?;
            if trial > 0 {
                // The spacing asked for (`--failover-pause-ms`), itself what is compared.
                tokio::time::sleep(pause).await;
            }
            let before = latest_generations(&seen);
            if before.len() < PARTITIONS as usize {
                bail!("trial {trial}: not every partition has written an event yet");
            }
            let signalled = Instant::now();
            let signalled_unix = unix_ms();
            let signalled_ns = now_ns();
            match fault {
                Fault::Kill => owner.signal(libc::SIGKILL)?,
                Fault::Stop => owner.signal(libc::SIGSTOP)?,
            }
            let limit = Duration::from_millis(ttl_ms) + TRIAL_TIMEOUT;
            let what = format!("trial {trial}: every partition to write under a new generation");
            jetshard_testkit::wait_until(limit, &what, || async {
                taken_over(&seen, &before).len() == PARTITIONS as usize
            })
            .await?;
            let taken = taken_over(&seen, &before);
            let acquisitions = standby.acquisitions();
            for (partition, first_event) in taken {
                let acquired = acquisitions
                    .iter()
                    .find(|a| a.partition == partition && a.at_unix_ms >= signalled_unix);
                samples.push(Sample {
                    trial,
                    partition,
                    first_event_ms: first_event.at.duration_since(signalled).as_secs_f64() * 1000.0,
                    command_wait_ms: first_event.sent_ns.map(|sent| {
                        first_event.at_ns.saturating_sub(sent.max(signalled_ns)) as f64 / 1e6
                    }),
                    acquired_ms: acquired
                        .map(|a| a.at_unix_ms.saturating_sub(signalled_unix) as f64),
                    rebuild_ms: acquired.map(|a| a.elapsed_ms),
                    rebuilt_events: acquired.map(|a| a.rebuilt_events),
                });
            }
            // Everything in hand at the claims just made (the recovered commands included).
            in_hand_at_last_kill = delivered(&js).await?;
            // The victim (stopped or dead) goes for good; a fresh standby takes its place.
            let fresh = NodeProcess::start(&node_args(trial + 2)).await?;
            let victim = std::mem::replace(&mut owner, std::mem::replace(&mut standby, fresh));
            victim.kill().await?;
            jetshard_testkit::wait_until(
                Duration::from_secs(30),
                "the new owner to own every partition",
                || async { all_owned(&owner) },
            )
            .await?;
        }
        Ok(())
    }
    .await;
    load.abort();
    watcher.abort();
    owner.kill().await?;
    standby.kill().await?;
    result.map(|()| samples)
}

/// Each partition consumer's last delivered command-stream sequence.
pub(crate) async fn delivered(js: &async_nats::jetstream::Context) -> anyhow::Result<Vec<u64>> {
    let names = jetshard::wire::Names::new(ENTITY_TYPE);
    let stream = js
        .get_stream_no_info(names.command_stream(0))
        .await
        .context("open the command stream")?;
    let mut delivered = Vec::new();
    for partition in 0..PARTITIONS {
        let info = stream
            .consumer_info(names.consumer(partition))
            .await
            .context("read a partition consumer")?;
        delivered.push(info.delivered.stream_sequence);
    }
    Ok(delivered)
}

/// Waits (bounded) until each partition consumer's ack floor is at or past `delivered`.
pub(crate) async fn wait_recovered_acknowledged(
    js: &async_nats::jetstream::Context,
    delivered: &[u64],
) -> anyhow::Result<()> {
    if delivered.is_empty() {
        return Ok(());
    }
    let names = jetshard::wire::Names::new(ENTITY_TYPE);
    let stream = js
        .get_stream_no_info(names.command_stream(0))
        .await
        .context("open the command stream")?;
    jetshard_testkit::wait_until(
        Duration::from_secs(60),
        "the recovered commands to be acknowledged",
        || async {
            for (partition, last) in delivered.iter().enumerate() {
                match stream.consumer_info(names.consumer(partition as u32)).await {
                    Ok(info) if info.ack_floor.stream_sequence >= *last => {}
                    _ => return false,
                }
            }
            true
        },
    )
    .await?;
    Ok(())
}

/// Subscribes to every event of the journal and records when each partition's generations
/// first wrote.
pub(crate) async fn watch_generations(
    client: async_nats::Client,
    seen: FirstSeen,
) -> anyhow::Result<JoinHandle<()>> {
    let mut events = load::subscribe_events(&client, ENTITY_TYPE).await?;
    Ok(tokio::spawn(async move {
        while let Some(message) = events.next().await {
            let received = FirstEvent {
                at: Instant::now(),
                at_ns: now_ns(),
                sent_ns: match Codec::default().decode(&message.payload) {
                    Ok(BenchEvt::Stamped { at_ns } | BenchEvt::Padded { at_ns, .. }) => Some(at_ns),
                    _ => None,
                },
            };
            let partition = message
                .subject
                .split('.')
                .nth(2)
                .and_then(|p| p.parse::<u32>().ok());
            let generation = message
                .headers
                .as_ref()
                .and_then(|h| h.get("Jetshard-Generation"))
                .and_then(|g| g.as_str().parse::<u64>().ok());
            if let (Some(partition), Some(generation)) = (partition, generation) {
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(partition)
                    .or_default()
                    .entry(generation)
                    .or_insert(received);
            }
        }
    }))
}

/// The newest generation seen per partition.
pub(crate) fn latest_generations(seen: &FirstSeen) -> HashMap<u32, u64> {
    seen.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter_map(|(p, gens)| gens.keys().max().map(|g| (*p, *g)))
        .collect()
}

/// Per partition with a generation newer than in `before`, its first event.
pub(crate) fn taken_over(seen: &FirstSeen, before: &HashMap<u32, u64>) -> HashMap<u32, FirstEvent> {
    seen.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter_map(|(p, gens)| {
            let old = before.get(p).copied().unwrap_or(0);
            gens.iter()
                .filter(|(g, _)| **g > old)
                .map(|(_, first)| *first)
                .min_by_key(|first| first.at)
                .map(|first| (*p, first))
        })
        .collect()
}

/// Offers `OFFERED_RATE` commands/s round-robin over `ENTITIES` entities, each stamped with
/// its send time, until aborted.
pub(crate) fn offer_load(client: async_nats::Client) -> OfferedLoad {
    OfferedLoad::start(
        client,
        ENTITY_TYPE,
        ENTITIES,
        OFFERED_RATE,
        Stamp::Sent,
        "failover load",
    )
}
