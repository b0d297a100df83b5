//! Scenario `overload`: does a stall at a sustainable rate leave the system serving below the
//! offered rate (metastability), or does the backlog drain?
//!
//! The compaction scenario's entity (an event and an outbox message per command, every tenth
//! arming a 50-ms timer, snapshots every 10 events) on one fresh server, offered
//! `--overload-rate` cmd/s open-loop for `--overload-secs`; at `--overload-stall-at` s the
//! server is frozen (SIGSTOP) for `--overload-stall-secs` s, then let go (SIGCONT).
//! Background compaction runs every `--overload-compaction-interval-secs` s (0: off).
//!
//! Every 2 s it prints the commands completed in the window (events seen by a core
//! subscription on `<t>.evt.>`) and their latency (scheduled send -> event stored), the
//! backlog (commands offered by their schedule and not yet completed), and the command
//! consumers' state summed over the partitions (pending, in hand, redelivered) beside the
//! journal's size. At the end: when the backlog drained after the stall (the first window
//! whose backlog is under a second of commands), or that it never did within the run.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use jetshard::{Codec, ShardConfig, ShardSystem};
use jetshard_testkit::NatsServer;
use serde::Serialize;
use serde_json::json;

use crate::Options;
use crate::compaction::{CompactionEntity, publish_work};
use crate::entity::entity_id;
use crate::latency::{Stamps, offer};
use crate::load::AckWindow;
use crate::report::{Report, Row};
use crate::stats::{Summary, now_ns};

const ENTITY_TYPE: &str = "ovl";

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
    let server = NatsServer::start().await.context("start nats-server")?;
    let control = server.connect().await?;
    // Publishes wait through the stall instead of failing after the default ack timeout.
    let js = async_nats::jetstream::ContextBuilder::new()
        .timeout(Duration::from_secs(120))
        .ack_timeout(Duration::from_secs(120))
        .build(control.clone());
    let builder = ShardConfig::builder(ENTITY_TYPE)
        .partitions(options.partitions)
        .node_id("bench")
        .codec(Codec::Json)
        .snapshot_every(options.compaction_snapshot_every);
    let builder = match options.overload_compaction_interval_secs {
        0 => builder.compaction(false),
        secs => builder.compaction_interval(Duration::from_secs(secs)),
    };
    let config = builder.build()?;
    let names = config.names();
    let system = ShardSystem::start::<CompactionEntity>(server.connect().await?, config)
        .await
        .context("start the shard system")?;
    let stamps = Stamps::listen(&server.connect().await?, ENTITY_TYPE, Codec::Json).await?;
    let total = (rate * options.overload_secs as f64) as usize;
    let started_ns = now_ns();
    let windows = Arc::new(Mutex::new(Vec::<Window>::new()));
    eprintln!(
        "overload: {total} commands at {rate} cmd/s over {} entities, {} partitions, compaction {}, \
         server stalled at {} s for {} s",
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
                    let commands = js.get_stream_no_info(names.command_stream()).await.ok()?;
                    for p in 0..partitions {
                        let info = commands.consumer_info(names.consumer(p)).await.ok()?;
                        w.pending += info.num_pending;
                        w.ack_pending += info.num_ack_pending;
                        w.redelivered += info.num_redelivered;
                    }
                    let mut journal = js.get_stream(names.journal_stream()).await.ok()?;
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
    let stall = {
        let at = Duration::from_secs(options.overload_stall_at);
        let length = Duration::from_secs(options.overload_stall_secs);
        let server = &server;
        async move {
            tokio::time::sleep(at).await;
            eprintln!("overload: SIGSTOP nats-server for {} s", length.as_secs());
            server.pause().context("SIGSTOP the server")?;
            tokio::time::sleep(length).await;
            server.resume().context("SIGCONT the server")?;
            eprintln!("overload: SIGCONT nats-server");
            anyhow::Ok(())
        }
    };
    let ids: Vec<String> = (0..options.entities).map(entity_id).collect();
    let load = async {
        let mut window = AckWindow::default();
        offer(rate, total, async |i, at_ns| {
            let ack = publish_work(&js, ENTITY_TYPE, &ids, i, at_ns).await?;
            window.push(ack).await
        })
        .await?;
        window.drain().await
    };
    let (stalled, loaded) = tokio::join!(stall, load);
    stalled?;
    loaded?;
    // The backlog's drain after the load, bounded: a collapsed system may never finish it.
    stamps.wait_for(total, Duration::from_secs(60)).await;
    tokio::time::sleep(SAMPLE_EVERY).await;
    sampler.abort();
    let received = stamps.count();
    let recorded = stamps.stop();
    system.shutdown().await.context("shut the system down")?;
    let windows = windows
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let resumed = (options.overload_stall_at + options.overload_stall_secs) as f64;
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
    let after: usize = windows
        .iter()
        .filter(|w| w.secs > resumed && w.secs <= resumed + 30.0)
        .map(|w| w.completed)
        .sum();
    let case = format!(
        "{rate} cmd/s over {} entities, {} partitions, compaction {}, SIGSTOP {} s at {} s",
        options.entities,
        options.partitions,
        match options.overload_compaction_interval_secs {
            0 => "off".to_owned(),
            secs => format!("every {secs} s"),
        },
        options.overload_stall_secs,
        options.overload_stall_at
    );
    match drained {
        Some(secs) => eprintln!("overload: the backlog drained {secs:.0} s after the resume"),
        None => eprintln!("overload: the backlog never drained within the run"),
    }
    eprintln!(
        "overload: {received} of {total} events; completed in the 30 s after the resume: {after} \
         ({:.0} cmd/s, offered {rate}); commands sent before the stall p50 {:.1} p99 {:.1} ms, \
         in the last 30 s p50 {:.1} p99 {:.1} ms",
        after as f64 / 30.0,
        before.p50,
        before.p99,
        last.p50,
        last.p99
    );
    report.rows.push(
        Row::new(
            "overload",
            format!("time to drain the backlog after the resume, {case}"),
            drained.unwrap_or(f64::INFINITY),
            "s",
        )
        .target("drains (finite)", drained.is_some()),
    );
    report.rows.push(
        Row::new(
            "overload",
            format!("completed rate in the 30 s after the resume, {case}"),
            after as f64 / 30.0,
            "cmd/s",
        )
        .against(rate),
    );
    report.rows.push(
        Row::new(
            "overload",
            format!("command p99, sent in the last 30 s, {case}"),
            last.p99,
            "ms",
        )
        .against(before.p99),
    );
    report.details.insert(
        "overload".to_owned(),
        json!({
            "case": case, "received": received, "total": total,
            "drained_after_resume_secs": drained, "before": before, "last_30s": last,
            "windows": windows,
        }),
    );
    Ok(())
}

/// Seconds after `resumed` until the first window whose backlog is under a second of commands
/// at `rate`; `None` if none is.
fn drained_after(windows: &[Window], resumed: f64, rate: f64) -> Option<f64> {
    windows
        .iter()
        .find(|w| w.secs > resumed && (w.backlog as f64) < rate)
        .map(|w| w.secs - resumed)
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
    fn the_backlog_drains_at_the_first_window_under_a_second_of_commands_after_the_resume() {
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
    }
}
