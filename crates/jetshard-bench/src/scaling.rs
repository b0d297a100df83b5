//! Scenario 6, scaling: the throughput protocol of [`crate::drain`] at several partition
//! counts (jetshard and the bare loop, each in this process), and with 1, 2 and 3 node
//! processes sharing 8 partitions.
//!
//! With several processes every node is started before the backlog is released; the server
//! pins each partition to whichever node's pull it serves first, and jetshard's balancing
//! (on, as by default) then moves partitions between the nodes. How many acquisitions each
//! node made is reported with the figures.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use crate::Options;
use crate::drain::{self, DrainSpec, Pass};
use crate::node::{NodeArgs, NodeProcess};
use crate::report::{Report, Row};
use crate::throughput;

/// The longest one pass may take; a pass cut short reports the rate of what it drained.
const PASS_TIME_BOX: Duration = Duration::from_secs(15);

/// Partitions of the multi-process runs.
const PROCESS_PARTITIONS: u32 = 8;

/// Scenario 6.
pub async fn run(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let mut details = serde_json::Map::new();
    for &partitions in &options.scaling_partitions {
        let spec = DrainSpec::new(options, partitions, options.scaling_commands, PASS_TIME_BOX);
        eprintln!("scaling: {partitions} partitions, bare loop");
        let bare = crate::bare::drain_bare(spec).await;
        eprintln!("scaling: {partitions} partitions, jetshard");
        let jetshard = throughput::drain_jetshard(spec).await;
        let (bare, jetshard) = match (bare, jetshard) {
            (Ok(bare), Ok(jetshard)) => (bare, jetshard),
            (bare, jetshard) => {
                // One failed run does not cost the figures of the others.
                let error = bare.err().or(jetshard.err()).map(|e| format!("{e:#}"));
                eprintln!("scaling: {partitions} partitions failed: {error:?}");
                details.insert(format!("partitions_{partitions}_error"), json!(error));
                continue;
            }
        };
        for (pass, name) in [(1, "warm"), (0, "cold")] {
            let (Some(bare_pass), Some(jetshard_pass)) =
                (bare.passes.get(pass), jetshard.passes.get(pass))
            else {
                continue;
            };
            if pass == 1 {
                report.rows.push(Row::new(
                    "scaling",
                    format!(
                        "bare loop, {name}, {partitions} partitions{}",
                        time_boxed(bare_pass)
                    ),
                    bare_pass.rate,
                    "cmd/s",
                ));
            }
            report.rows.push(
                Row::new(
                    "scaling",
                    format!(
                        "jetshard, {name}, {partitions} partitions{}",
                        time_boxed(jetshard_pass)
                    ),
                    jetshard_pass.rate,
                    "cmd/s",
                )
                .against(bare_pass.rate),
            );
        }
        details.insert(
            format!("partitions_{partitions}"),
            json!({ "spec": spec, "bare": bare, "jetshard": jetshard }),
        );
    }
    for &processes in &options.scaling_processes {
        eprintln!("scaling: {processes} node processes, {PROCESS_PARTITIONS} partitions");
        // A third pass: balancing moves partitions between the nodes during the first two.
        let spec = DrainSpec {
            passes: 3,
            ..DrainSpec::new(
                options,
                PROCESS_PARTITIONS,
                options.scaling_commands,
                PASS_TIME_BOX,
            )
        };
        let (passes, split, releases, acquisitions) = match drain_processes(spec, processes).await {
            Ok(done) => done,
            Err(e) => {
                // One failed run does not cost the figures of the others.
                eprintln!("scaling: {processes} processes failed: {e:#}");
                details.insert(
                    format!("processes_{processes}_error"),
                    json!(format!("{e:#}")),
                );
                continue;
            }
        };
        let split_text = split
            .values()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join("+");
        for (pass, name) in [(0, "cold"), (1, "warm"), (2, "third pass")] {
            let Some(measured) = passes.get(pass) else {
                continue;
            };
            report.rows.push(Row::new(
                "scaling",
                format!(
                    "jetshard, {name}, {processes} process(es), {PROCESS_PARTITIONS} partitions, acquisitions per node {split_text}{}",
                    time_boxed(measured)
                ),
                measured.rate,
                "cmd/s",
            ));
        }
        details.insert(
            format!("processes_{processes}"),
            json!({
                "spec": spec,
                "passes": passes,
                "acquisitions_per_node": split,
                "releases_per_node": releases,
                "acquisitions": acquisitions,
            }),
        );
    }
    report
        .details
        .insert("scaling".to_owned(), serde_json::Value::Object(details));
    Ok(())
}

/// The passes, acquisitions per node, releases (partition, reason) per node, and each
/// acquisition (partition, rebuilt events, milliseconds) per node.
type ProcessRun = (
    Vec<Pass>,
    BTreeMap<String, usize>,
    BTreeMap<String, Vec<(u32, String)>>,
    BTreeMap<String, Vec<(u32, u64, u64)>>,
);

/// Runs the throughput protocol against `processes` node processes; returns the passes and
/// how many partitions each node acquired.
async fn drain_processes(spec: DrainSpec, processes: usize) -> anyhow::Result<ProcessRun> {
    let server = crate::server::nats_server().await?;
    let control = server.connect().await?;
    let mut nodes = Vec::new();
    for i in 0..processes {
        let args = NodeArgs::new(
            server.url(),
            "bench",
            format!("n{i}"),
            spec.partitions,
            2000,
        );
        nodes.push(NodeProcess::start(&args).await?);
    }
    crate::load::seed_entities(control.clone(), "bench", spec.partitions, spec.entities).await?;
    let pids: Vec<u32> = server.pid().into_iter().collect();
    let passes = drain::timed_passes(&pids, &control, spec, || Ok(())).await;
    let split = nodes
        .iter()
        .map(|n| (n.id().to_owned(), n.acquisitions().len()))
        .collect();
    let releases: BTreeMap<String, Vec<(u32, String)>> = nodes
        .iter()
        .map(|n| (n.id().to_owned(), n.releases()))
        .collect();
    // (partition, rebuilt events, acquisition ms) of every acquisition, per node.
    let acquisitions: BTreeMap<String, Vec<(u32, u64, u64)>> = nodes
        .iter()
        .map(|n| {
            let lines = n
                .acquisitions()
                .iter()
                .map(|a| (a.partition, a.rebuilt_events, a.elapsed_ms))
                .collect();
            (n.id().to_owned(), lines)
        })
        .collect();
    for node in nodes {
        node.kill().await?;
    }
    Ok((passes?, split, releases, acquisitions))
}

/// A note for a pass cut short by its time box.
fn time_boxed(pass: &Pass) -> &'static str {
    if pass.complete { "" } else { " (time-boxed)" }
}
