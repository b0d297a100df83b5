//! Scenario `overload`: does a stall at a sustainable rate leave the system serving below the
//! offered rate (metastability), or does the backlog drain?
//!
//! The compaction scenario's entity (an event and an outbox message per command, every tenth
//! arming a 50-ms timer, snapshots every 10 events) on one fresh server, offered
//! `--overload-rate` cmd/s open-loop for `--overload-secs`; at `--overload-stall-at` s the
//! server is frozen (SIGSTOP) for `--overload-stall-secs` s, then let go (SIGCONT).
//! Background compaction runs every `--overload-compaction-interval-secs` s (0: off).
//!
//! With `--overload-fault kill` the fault is a process's: the entity type runs in two node
//! processes (jetshard's balancing shares the partitions out), and at `--overload-stall-at` s
//! the one owning more of them is SIGKILLed; the other takes its partitions over, loading
//! their entities (each with the history the load gave it so far) as their commands come.
//! Then the completed rate in the 10 s after the kill is held against the offered rate.
//!
//! With `--overload-fault leader` the streams are R3 on a 3-server cluster, and at
//! `--overload-stall-at` s the journal stream's leader is frozen for `--overload-stall-secs` s.
//! The clients use another server (as a client of a healthy server would), and the time the
//! other two elect a new journal leader is taken from the stream's info; the backlog must
//! drain within 15 s of it. The frozen server may lead more (the command stream, consumers,
//! the meta group): what such a freeze does to a real cluster.
//!
//! Every 2 s it prints the commands completed in the window (events seen by a core
//! subscription on `<t>.evt.>`) and their latency (scheduled send -> event stored), the
//! backlog (commands offered by their schedule and not yet completed), and the command
//! consumers' state summed over the partitions (pending, in hand, redelivered) beside the
//! journal's size. At the end: when the backlog drained after the fault (the first window
//! from which every backlog is under a second of commands), or that it never did within the
//! run.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use jetshard::wire::Names;
use jetshard::{Codec, ShardConfig, ShardSystem};
use jetshard_testkit::NatsServer;
use serde::Serialize;
use serde_json::json;

mod resending;

use crate::Options;
use crate::compaction::{CompactionEntity, work};
use crate::entity::entity_id;
use crate::latency::{Stamps, offer};
use crate::node::{NodeArgs, NodeProcess};
use crate::report::{Report, Row};
use crate::server::Servers;
use crate::stats::{Summary, now_ns};

use resending::Resending;

const ENTITY_TYPE: &str = "ovl";

/// The fault the scenario injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
pub enum Fault {
    /// The server frozen (SIGSTOP) for `--overload-stall-secs`, then let go.
    Stall,
    /// The node process owning more partitions SIGKILLed; the other takes them over.
    Kill,
    /// R3 streams on 3 servers; the journal stream's leader frozen for `--overload-stall-secs`.
    Leader,
}

/// After a freeze of the journal's leader, the backlog is gone within this after the new
/// leader is elected, seconds.
const DRAIN_AFTER_LEADER_SECS: f64 = 15.0;

/// How often the journal's leader is asked for while it is frozen.
const LEADER_POLL: Duration = Duration::from_millis(100);

/// After a kill, the completed rate over this long is held against the offered rate.
const AFTER_KILL: f64 = 10.0;
/// ... at least this much of it.
const AFTER_KILL_SHARE: f64 = 0.8;

/// The backlog is gone within this after the resume, seconds: what the machine serves (tens of
/// thousands of commands a second) clears a 15-s backlog at 800 cmd/s in about a second.
const DRAIN_WITHIN_SECS: f64 = 10.0;

/// The p99 of the commands sent in the run's last 30 s, against those sent before the stall.
const P99_WITHIN: f64 = 2.0;

/// How often the run is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// One 2-s window.
#[derive(Debug, Clone, Copy, Serialize)]
struct Window {
    /// Seconds since the first scheduled send, at the window's end.
    secs: f64,
    completed: usize,
    p50_ms: f64,
    p99_ms: f64,
    /// Commands due by their schedule and not yet completed.
    backlog: i64,
    /// Summed over the partitions' consumers.
    pending: u64,
    ack_pending: usize,
    redelivered: usize,
    journal_messages: u64,
}

/// The scenario: one run, printed window by window; rows: the time to drain after the stall,
/// the completed rate in the 30 s after it, the latency before the stall and at the end.
pub async fn run(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    anyhow::ensure!(
        options.overload_rate > 0.0,
        "--overload-rate must be positive"
    );
    anyhow::ensure!(
        options.overload_stall_at + options.overload_stall_secs < options.overload_secs,
        "--overload-stall-at + --overload-stall-secs must end before --overload-secs"
    );
    let rate = options.overload_rate;
    let fault = options.overload_fault;
    let replicas = if fault == Fault::Leader { 3 } else { 1 };
    let builder = ShardConfig::builder(ENTITY_TYPE)
        .partitions(options.partitions)
        .node_id("bench")
        .codec(Codec::Json)
        .replicas(replicas)
        .snapshot_every(options.compaction_snapshot_every);
    let builder = match options.overload_compaction_interval_secs {
        0 => builder.compaction(false),
        secs => builder.compaction_interval(Duration::from_secs(secs)),
    };
    let config = builder.build()?;
    let names = config.names();
    // One server, or (a stalled leader) a 3-server cluster whose clients use a node that did
    // not lead the journal when its streams were made.
    let servers = Servers::start(fault == Fault::Leader).await?;
    let clients = match &servers {
        Servers::One(_) => 0,
        Servers::Three(cluster) => {
            // The streams first, so that the clients can keep off the journal's leader.
            ShardSystem::start::<CompactionEntity>(cluster.connect().await?, config.clone())
                .await
                .context("make the streams")?
                .shutdown()
                .await
                .context("stop the system that made the streams")?;
            let js = async_nats::jetstream::new(cluster.connect().await?);
            let leader = journal_leader(&js, &names)
                .await?
                .context("the journal has no leader")?;
            (0..cluster.nodes().len())
                .find(|i| cluster.node(*i).name() != Some(leader.as_str()))
                .context("every server leads the journal")?
        }
    };
    let server = servers.node(clients);
    let control = server.connect().await?;
    // A publish not acknowledged within `resend_after` is sent again (`Resending`). The
    // context holds one of its in-flight permits (5,000) for each acknowledgement awaited, one
    // dropped too until the ack timeout: longer than `resend_after`, the publishes sent again
    // after a lost leader would hold them all and block the next publish.
    let resend_after = Duration::from_millis(options.overload_resend_ms);
    let js = async_nats::jetstream::ContextBuilder::new()
        .timeout(Duration::from_secs(120))
        .ack_timeout(resend_after)
        .build(control.clone());
    let (system, nodes) = match fault {
        Fault::Stall | Fault::Leader => {
            let system = ShardSystem::start::<CompactionEntity>(server.connect().await?, config)
                .await
                .context("start the shard system")?;
            (Some(system), Vec::new())
        }
        Fault::Kill => (None, start_nodes(server, options).await?),
    };
    let stamps = Stamps::listen(&server.connect().await?, ENTITY_TYPE, Codec::Json).await?;
    let total = (rate * options.overload_secs as f64) as usize;
    let started_ns = now_ns();
    let windows = Arc::new(Mutex::new(Vec::<Window>::new()));
    eprintln!(
        "overload: {total} commands at {rate} cmd/s over {} entities, {} partitions, compaction {}, \
         {fault:?} at {} s for {} s",
        options.entities,
        options.partitions,
        match options.overload_compaction_interval_secs {
            0 => "off".to_owned(),
            secs => format!("every {secs} s"),
        },
        options.overload_stall_at,
        options.overload_stall_secs
    );
    let sampler = {
        let recorded = stamps.recorded();
        let windows = windows.clone();
        let js = js.clone();
        let names = names.clone();
        let partitions = options.partitions;
        tokio::spawn(async move {
            let mut seen = 0;
            let mut next = tokio::time::Instant::now() + SAMPLE_EVERY;
            loop {
                tokio::time::sleep_until(next).await;
                next += SAMPLE_EVERY;
                let secs = (now_ns().saturating_sub(started_ns)) as f64 / 1e9;
                let (window, received) = {
                    let recorded = recorded.lock().unwrap_or_else(PoisonError::into_inner);
                    let from = seen.min(recorded.len());
                    seen = recorded.len();
                    let window: Vec<f64> = recorded[from..]
                        .iter()
                        .map(|(_, ns)| *ns as f64 / 1e6)
                        .collect();
                    (Summary::of(&window), recorded.len())
                };
                let due = ((secs * rate) as usize).min(total);
                let mut w = Window {
                    secs,
                    completed: window.count,
                    p50_ms: window.p50,
                    p99_ms: window.p99,
                    backlog: due as i64 - received as i64,
                    pending: 0,
                    ack_pending: 0,
                    redelivered: 0,
                    journal_messages: 0,
                };
                // The server's view, each read bounded (during the stall nothing answers).
                let read = async {
                    let commands = js.get_stream_no_info(names.command_stream(0)).await.ok()?;
                    for p in 0..partitions {
                        let info = commands.consumer_info(names.consumer(p)).await.ok()?;
                        w.pending += info.num_pending;
                        w.ack_pending += info.num_ack_pending;
                        w.redelivered += info.num_redelivered;
                    }
                    let mut journal = js.get_stream(names.journal_stream(0)).await.ok()?;
                    w.journal_messages = journal.info().await.ok()?.state.messages;
                    Some(())
                };
                let server_view = tokio::time::timeout(SAMPLE_EVERY / 2, read)
                    .await
                    .ok()
                    .flatten()
                    .is_some();
                eprintln!(
                    "overload: {:>5.0} s  completed {:>6}  p50 {:>8.1} p99 {:>8.1} ms  backlog {:>7}  \
                     consumers: pending {:>7} in hand {:>5} redelivered {:>5}  journal {:>8}{}",
                    w.secs,
                    w.completed,
                    w.p50_ms,
                    w.p99_ms,
                    w.backlog,
                    w.pending,
                    w.ack_pending,
                    w.redelivered,
                    w.journal_messages,
                    if server_view {
                        ""
                    } else {
                        "  (server not answering)"
                    }
                );
                windows
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(w);
            }
        })
    };
    // The fault; what it gives back: the nodes still running, and when (seconds since the
    // first send) a new journal leader was elected after a freeze of the old one.
    let stall = {
        let at = Duration::from_secs(options.overload_stall_at);
        let length = Duration::from_secs(options.overload_stall_secs);
        let servers = &servers;
        let js = &js;
        let names = &names;
        let mut nodes = nodes;
        async move {
            tokio::time::sleep(at).await;
            let stalled = match (fault, servers) {
                (Fault::Kill, _) => {
                    let victim = (0..nodes.len())
                        .max_by_key(|i| nodes[*i].owned().len())
                        .context("no node")?;
                    let node = nodes.remove(victim);
                    eprintln!(
                        "overload: SIGKILL node {} owning partitions {:?}",
                        node.id(),
                        node.owned()
                    );
                    node.kill().await?;
                    return anyhow::Ok((nodes, None));
                }
                (Fault::Leader, Servers::Three(cluster)) => {
                    let leader = journal_leader(js, names)
                        .await?
                        .context("the journal has no leader")?;
                    eprintln!(
                        "overload: SIGSTOP the journal's leader {leader} for {} s",
                        length.as_secs()
                    );
                    let server = cluster
                        .node_by_name(&leader)
                        .context("the journal's leader is not one of the cluster's servers")?;
                    (server, Some(leader))
                }
                (_, servers) => {
                    eprintln!("overload: SIGSTOP nats-server for {} s", length.as_secs());
                    (servers.node(clients), None)
                }
            };
            let (server, leader) = stalled;
            let frozen_at = tokio::time::Instant::now();
            server.pause().context("SIGSTOP the server")?;
            let mut elected = None;
            if let Some(leader) = leader {
                while frozen_at.elapsed() < length {
                    tokio::time::sleep(LEADER_POLL).await;
                    let asked = tokio::time::timeout(LEADER_POLL * 5, journal_leader(js, names));
                    if let Ok(Ok(Some(new))) = asked.await
                        && new != leader
                    {
                        let secs = now_ns().saturating_sub(started_ns) as f64 / 1e9;
                        eprintln!(
                            "overload: {new} leads the journal, {:.1} s into the freeze",
                            frozen_at.elapsed().as_secs_f64()
                        );
                        elected = Some(secs);
                        break;
                    }
                }
            }
            tokio::time::sleep_until(frozen_at + length).await;
            server.resume().context("SIGCONT the server")?;
            eprintln!("overload: SIGCONT nats-server");
            anyhow::Ok((nodes, elected))
        }
    };
    let ids: Vec<String> = (0..options.entities).map(entity_id).collect();
    let one_stream = jetshard::wire::Names::new(ENTITY_TYPE);
    let load = async {
        let mut window = Resending::new(resend_after);
        offer(rate, total, async |i, at_ns| {
            let (subject, payload) = work(&one_stream, &ids, i, at_ns)?;
            window.push(&js, subject, payload, i).await
        })
        .await?;
        window.drain(&js).await
    };
    let (stalled, loaded) = tokio::join!(stall, load);
    let (survivors, elected) = stalled?;
    loaded?;
    // The backlog's drain after the load, bounded: a collapsed system may never finish it.
    stamps.wait_for(total, Duration::from_secs(60)).await;
    tokio::time::sleep(SAMPLE_EVERY).await;
    sampler.abort();
    let received = stamps.count();
    let recorded = stamps.stop();
    if let Some(system) = system {
        system.shutdown().await.context("shut the system down")?;
    }
    for node in survivors {
        node.terminate().await?;
    }
    let windows = windows
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let stall_end = (options.overload_stall_at + options.overload_stall_secs) as f64;
    let resumed = match fault {
        Fault::Stall => stall_end,
        Fault::Kill => options.overload_stall_at as f64,
        // No leader elected during the freeze: the old one is back at its end.
        Fault::Leader => elected.unwrap_or(stall_end),
    };
    let drained = drained_after(&windows, resumed, rate);
    let latency = |from_s: f64, to_s: f64| {
        let ms: Vec<f64> = recorded
            .iter()
            .filter(|(at, _)| {
                let s = at.saturating_sub(started_ns) as f64 / 1e9;
                s >= from_s && s < to_s
            })
            .map(|(_, ns)| *ns as f64 / 1e6)
            .collect();
        Summary::of(&ms)
    };
    let before = latency(10.0, options.overload_stall_at as f64);
    let end = options.overload_secs as f64;
    let last = latency(end - 30.0, end);
    // The completed rate after the fault, over this long, and the share of the offered rate
    // it must reach.
    let (span, share) = match fault {
        Fault::Stall | Fault::Leader => (30.0, 1.0),
        Fault::Kill => (AFTER_KILL, AFTER_KILL_SHARE),
    };
    let after: usize = windows
        .iter()
        .filter(|w| w.secs > resumed && w.secs <= resumed + span)
        .map(|w| w.completed)
        .sum();
    let after_rate = after as f64 / span;
    let what = match fault {
        Fault::Stall => format!(
            "SIGSTOP {} s at {} s",
            options.overload_stall_secs, options.overload_stall_at
        ),
        Fault::Kill => format!(
            "SIGKILL of the busier of 2 nodes at {} s",
            options.overload_stall_at
        ),
        Fault::Leader => format!(
            "R3, SIGSTOP of the journal's leader {} s at {} s",
            options.overload_stall_secs, options.overload_stall_at
        ),
    };
    let since = match (fault, elected) {
        (Fault::Stall, _) | (Fault::Leader, None) => "the resume",
        (Fault::Kill, _) => "the kill",
        (Fault::Leader, Some(_)) => "the new leader",
    };
    let drain_within = match fault {
        Fault::Leader => DRAIN_AFTER_LEADER_SECS,
        Fault::Stall | Fault::Kill => DRAIN_WITHIN_SECS,
    };
    let case = format!(
        "{rate} cmd/s over {} entities, {} partitions, compaction {}, {what}, publishes resent \
         after {} ms",
        options.entities,
        options.partitions,
        match options.overload_compaction_interval_secs {
            0 => "off".to_owned(),
            secs => format!("every {secs} s"),
        },
        options.overload_resend_ms
    );
    match drained {
        Some(secs) => eprintln!("overload: the backlog drained {secs:.0} s after {since}"),
        None => eprintln!("overload: the backlog never drained within the run"),
    }
    eprintln!(
        "overload: {received} of {total} events; completed in the {span} s after {since}: {after} \
         ({after_rate:.0} cmd/s, offered {rate}); commands sent before the fault p50 {:.1} p99 {:.1} ms, \
         in the last 30 s p50 {:.1} p99 {:.1} ms",
        before.p50, before.p99, last.p50, last.p99
    );
    report.rows.push(
        Row::new(
            "overload",
            format!("time to drain the backlog after {since}, {case}"),
            drained.unwrap_or(f64::INFINITY),
            "s",
        )
        .target(
            format!("<= {drain_within} s"),
            drained.is_some_and(|secs| secs <= drain_within),
        ),
    );
    report.rows.push(
        Row::new(
            "overload",
            format!("completed rate in the {span} s after {since}, {case}"),
            after_rate,
            "cmd/s",
        )
        .against(rate)
        .target(format!(">= {share} x offered"), after_rate >= share * rate),
    );
    report.rows.push(
        Row::new(
            "overload",
            format!("command p99, sent in the last 30 s, {case}"),
            last.p99,
            "ms",
        )
        .against(before.p99)
        .target(
            format!("<= {P99_WITHIN} x before the fault"),
            last.p99 <= P99_WITHIN * before.p99,
        ),
    );
    report.details.insert(
        "overload".to_owned(),
        json!({
            "case": case, "received": received, "total": total,
            "drained_after_resume_secs": drained, "new_leader_secs": elected,
            "before": before, "last_30s": last,
            "windows": windows,
        }),
    );
    Ok(())
}

/// Two node processes running the scenario's entity type, sharing the partitions out
/// (jetshard's balancing), once each owns some.
async fn start_nodes(server: &NatsServer, options: &Options) -> anyhow::Result<Vec<NodeProcess>> {
    let args = |id: &str| NodeArgs {
        overload_entity: Some(options.compaction_snapshot_every),
        compaction_interval_secs: options.overload_compaction_interval_secs,
        ..NodeArgs::new(
            server.url(),
            ENTITY_TYPE,
            id.to_owned(),
            options.partitions,
            2000,
        )
    };
    let mut nodes = Vec::new();
    for id in ["a", "b"] {
        nodes.push(NodeProcess::start(&args(id)).await?);
    }
    Ok(nodes)
}

/// The server leading the journal stream, as its info names it.
async fn journal_leader(
    js: &async_nats::jetstream::Context,
    names: &Names,
) -> anyhow::Result<Option<String>> {
    let journal = js
        .get_stream(names.journal_stream(0))
        .await
        .context("read the journal's info")?;
    Ok(journal
        .cached_info()
        .cluster
        .as_ref()
        .and_then(|c| c.leader.clone()))
}

/// Seconds after `resumed` until the backlog is under a second of commands at `rate` for good:
/// the first window after `resumed` from which every later one's is (a backlog that builds only
/// after the fault, as after a kill, counts); `None` if the run ends with more.
fn drained_after(windows: &[Window], resumed: f64, rate: f64) -> Option<f64> {
    let after: Vec<&Window> = windows.iter().filter(|w| w.secs > resumed).collect();
    let from = after
        .iter()
        .rposition(|w| (w.backlog as f64) >= rate)
        .map_or(0, |last_over| last_over + 1);
    after.get(from).map(|w| w.secs - resumed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(secs: f64, backlog: i64) -> Window {
        Window {
            secs,
            completed: 0,
            p50_ms: 0.0,
            p99_ms: 0.0,
            backlog,
            pending: 0,
            ack_pending: 0,
            redelivered: 0,
            journal_messages: 0,
        }
    }

    #[test]
    fn the_backlog_drains_at_the_window_from_which_it_stays_under_a_second_of_commands() {
        let windows = [
            window(10.0, 50),
            window(20.0, 9_000),
            window(30.0, 20_000),
            window(40.0, 1_500),
            window(50.0, 400),
        ];
        // Before the stall's end a short backlog does not count.
        assert_eq!(drained_after(&windows, 25.0, 1_000.0), Some(25.0));
        assert_eq!(drained_after(&windows, 55.0, 1_000.0), None);
        assert_eq!(drained_after(&windows[..4], 25.0, 1_000.0), None);
        // A backlog that builds only after the fault (a kill): drained once it is gone.
        let windows = [
            window(10.0, 50),
            window(26.0, 200),
            window(30.0, 5_000),
            window(40.0, 300),
            window(50.0, 100),
        ];
        assert_eq!(drained_after(&windows, 25.0, 1_000.0), Some(15.0));
        // Never over: the first window after the fault.
        assert_eq!(drained_after(&windows[..2], 25.0, 1_000.0), Some(1.0));
    }
}
