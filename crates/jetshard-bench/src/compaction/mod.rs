//! Scenario `compaction`: a journal bounded by live state.
//!
//! (a) A long run compressed in time: `--compaction-commands` commands at
//! `--compaction-rate` cmd/s over `--entities` entities, each command writing an event and an
//! outbox message, every tenth arming a timer that fires 50 ms later (its command writes the
//! `fired` record); snapshots every `--compaction-snapshot-every` events. The journal's
//! messages and bytes are sampled every 2 s, and each command's latency (scheduled send ->
//! event stored, seen by a core subscription on `<t>.evt.>`, as in the latency scenario) is
//! recorded. Run twice on fresh servers: background compaction off (the baseline), then on.
//!
//! (b) The acquisition's timer read: 1,000 entities, one timer armed each, after (i) nothing
//! else, (ii) 100,000 timers set and cancelled before (compaction off), (iii) the same,
//! compacted; the three journals side by side, read in alternated rounds. Figures: the timer
//! records left and the time to read them with a new owner's filter (`<t>.tmr.<p>.*`, one
//! ordered consumer per partition, the 8 in turn) and with one consumer over `<t>.tmr.>`.

mod entity;
mod long_run;
mod split;
mod timers;

use serde_json::json;

use crate::Options;
use crate::report::{Report, Row, Worse};

pub(crate) use entity::work;
pub use entity::{CompactionCmd, CompactionEntity};
use long_run::{LongRun, long_run};
use timers::timer_reads;

/// The scenario.
pub async fn run(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let mut details = serde_json::Map::new();
    if options.compaction_rounds > 0 {
        long_runs(options, report, &mut details).await?;
    }
    let reads = if options.compaction_timer_reads {
        timer_reads(report).await?
    } else {
        Vec::new()
    };
    details.insert("timer_reads".to_owned(), json!(reads));
    report
        .details
        .insert("compaction".to_owned(), serde_json::Value::Object(details));
    Ok(())
}

/// (a), `--compaction-rounds` rounds of compaction off then on, each on a fresh server.
async fn long_runs(
    options: &Options,
    report: &mut Report,
    details: &mut serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        options.compaction_interval_secs > 0,
        "--compaction-interval-secs must be at least 1"
    );
    anyhow::ensure!(
        matches!(options.compaction_replicas, 1 | 3),
        "--compaction-replicas is 1 or 3, not {}",
        options.compaction_replicas
    );
    let mut runs = Vec::new();
    for round in 0..options.compaction_rounds {
        let sides: &[bool] = if options.compaction_baseline {
            &[false, true]
        } else {
            &[true]
        };
        for &compaction in sides {
            eprintln!(
                "compaction round {}/{}: long run, compaction {}, {} commands at {} cmd/s over {} entities, R{}",
                round + 1,
                options.compaction_rounds,
                if compaction { "on" } else { "off" },
                options.compaction_commands,
                options.compaction_rate,
                options.entities,
                options.compaction_replicas
            );
            runs.push(long_run(options, compaction).await?);
        }
    }
    let bound = options.entities as u64 * (u64::from(options.compaction_snapshot_every) + 2);
    let case = |what: &str| {
        format!(
            "{what}, {} commands at {} cmd/s over {} entities, snapshot every {}, sweep every {} s, R{}",
            options.compaction_commands,
            options.compaction_rate,
            options.entities,
            options.compaction_snapshot_every,
            options.compaction_interval_secs,
            options.compaction_replicas
        )
    };
    let side = |on: bool| runs.iter().filter(move |r| r.compaction == on);
    let last = |r: &LongRun| r.samples.last().map_or(0, |s| s.messages) as f64;
    // After warm-up: the second half of the run.
    let max_after_warm_up = |r: &LongRun| {
        let half = r.samples.len() / 2;
        r.samples[half..]
            .iter()
            .map(|s| s.messages)
            .max()
            .unwrap_or(0) as f64
    };
    let over_rounds = |what: &str, on: bool, f: &dyn Fn(&LongRun) -> f64| {
        let rounds: Vec<f64> = side(on).map(f).collect();
        Row::over_rounds("compaction", case(what), &rounds, "", Worse::Higher)
    };
    let at_end = over_rounds("journal messages at the end, compaction on", true, &last);
    let met = at_end.worst <= bound as f64;
    let at_end = Row {
        unit: "msgs",
        ..at_end
    };
    let at_end = match options.compaction_baseline {
        true => at_end.against(over_rounds("", false, &last).value),
        false => at_end,
    };
    report.rows.push(at_end.target(
        format!("<= entities x (snapshot every + 2) = {bound} + in flight"),
        met,
    ));
    let warm = over_rounds(
        "journal messages, max over the second half, compaction on",
        true,
        &max_after_warm_up,
    );
    report.rows.push(Row {
        unit: "msgs",
        ..warm
    });
    let p99 = over_rounds("command p99, compaction on", true, &|r| r.latency.p99);
    if !options.compaction_baseline {
        report.rows.push(Row { unit: "ms", ..p99 });
        details.insert("long_runs".to_owned(), serde_json::to_value(&runs)?);
        return Ok(());
    }
    // What compaction costs the machine: the servers' and the client's CPU per command, on
    // against off (on a machine whose cores the servers share, what the latency pays for).
    let servers = |r: &LongRun| r.server_cpu_us;
    let client = |r: &LongRun| r.client_cpu_us;
    for (what, cpu) in [
        (
            "servers' CPU per command, compaction on",
            &servers as &dyn Fn(&LongRun) -> f64,
        ),
        ("client CPU per command, compaction on", &client),
    ] {
        let row = over_rounds(what, true, cpu);
        let off = over_rounds("", false, cpu).value;
        report.rows.push(Row { unit: "us", ..row }.against(off));
    }
    let p99_off = over_rounds("", false, &|r| r.latency.p99).value;
    let met = p99.value <= p99_off * 1.1;
    report.rows.push(
        Row { unit: "ms", ..p99 }
            .against(p99_off)
            .target("<= +10% over compaction off (medians of the rounds)", met),
    );
    details.insert("long_runs".to_owned(), serde_json::to_value(&runs)?);
    Ok(())
}
