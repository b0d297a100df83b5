//! What one purge costs the server, part (c) of the compaction scenario
//! (`--compaction-purge-cost true`): the capacity of background compaction.
//!
//! A fresh server and a plain stream (file storage, server defaults) holding `records`
//! messages written round-robin over `entities` entities, on subjects of the journal's shape
//! (`pc.evt.0.<id>`): each entity's records are spread over the whole stream, as an entity's
//! records between two snapshots are spread over everything the partition wrote meanwhile.
//! Then up to 500 entities are purged one request at a time, each below the sequence of its
//! record three quarters of the way along (as a snapshot's purge takes the records it covers),
//! with the filter compaction sends (`pc.*.0.<id>`, every record kind of the entity) or the
//! literal events subject. Of the last two cases, one purges the same share of every entity with one request
//! on the partition's filter (`pc.evt.0.*`), what a purge by partition would do where it is
//! safe; the others delete the same records as the entity cases one by one by sequence, with
//! `no_erase` (what a compaction deleting records by their carried sequences would send) at three journal
//! sizes, and once with the server's default secure erase. Figures:
//! requests/s (one at a time) and the server's CPU per request and per record removed,
//! from `/proc` (the server's own CPU time over the requests).

use std::time::Instant;

use anyhow::Context as _;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use serde::Serialize;

use crate::cpu::CpuMeter;
use crate::load::AckWindow;
use crate::report::{Report, Row};

const STREAM: &str = "PURGECOST";
/// Each record's payload, about an event's.
const PAYLOAD: usize = 120;
/// The entities purged (or whose records are deleted) per case, at most.
const PURGES: u64 = 500;

/// Which filter a purge names (or none: deletes by sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Filter {
    /// `pc.*.0.<id>`: every record of one entity (what compaction sends).
    Entity,
    /// `pc.evt.0.<id>`: one entity's events.
    Literal,
    /// `pc.evt.0.*`: every entity of the partition, one request.
    Partition,
    /// No purge: each record deleted by its sequence (`STREAM.MSG.DELETE` with `no_erase`),
    /// what compaction sends for the records a snapshot carries.
    Delete,
    /// The same deletes without `no_erase` (the server's default, and async-nats'
    /// `delete_message`): each record's bytes overwritten in its block.
    Erase,
}

/// One case: the stream's shape and the filter.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Case {
    /// Messages in the stream.
    pub records: u64,
    /// Entities they are spread over, round-robin.
    pub entities: u64,
    /// The filter each purge names.
    pub filter: Filter,
}

/// What a case's purges cost.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Cost {
    /// The case.
    pub case: Case,
    /// Requests sent (purges, or deletes).
    pub requests: u64,
    /// Messages they removed.
    pub purged: u64,
    /// Wall time of the requests, one at a time.
    pub secs: f64,
    /// The server's CPU over the requests, seconds.
    pub server_secs: f64,
}

impl Cost {
    /// Requests per second, one at a time.
    pub fn requests_per_sec(&self) -> f64 {
        self.requests as f64 / self.secs
    }

    /// The server's CPU per request, microseconds.
    pub fn server_us_per_request(&self) -> f64 {
        self.server_secs * 1e6 / self.requests as f64
    }

    /// The server's CPU per message removed, microseconds.
    pub fn server_us_per_record(&self) -> f64 {
        self.server_secs * 1e6 / self.purged.max(1) as f64
    }
}

/// The cases: the cost against the span of an entity's records (the stream's size, for
/// round-robin writes) and against the records each purge removes, by filter.
pub const CASES: [Case; 10] = [
    Case {
        records: 100_000,
        entities: 100,
        filter: Filter::Entity,
    },
    Case {
        records: 100_000,
        entities: 10_000,
        filter: Filter::Entity,
    },
    Case {
        records: 100_000,
        entities: 10_000,
        filter: Filter::Literal,
    },
    Case {
        records: 20_000,
        entities: 2_000,
        filter: Filter::Entity,
    },
    Case {
        records: 200_000,
        entities: 10_000,
        filter: Filter::Entity,
    },
    Case {
        records: 100_000,
        entities: 10_000,
        filter: Filter::Partition,
    },
    Case {
        records: 100_000,
        entities: 10_000,
        filter: Filter::Delete,
    },
    Case {
        records: 20_000,
        entities: 2_000,
        filter: Filter::Delete,
    },
    Case {
        records: 200_000,
        entities: 10_000,
        filter: Filter::Delete,
    },
    Case {
        records: 100_000,
        entities: 10_000,
        filter: Filter::Erase,
    },
];

/// One request of a case.
enum Request {
    /// Purge `filter` below journal sequence `below`.
    Purge { filter: String, below: u64 },
    /// Delete the message at this sequence (and overwrite its bytes, if `erase`).
    Delete { seq: u64, erase: bool },
}

/// Runs one case on a fresh server.
pub async fn measure(case: Case) -> anyhow::Result<Cost> {
    let server = crate::server::nats_server().await?;
    let js = jetstream::new(server.connect().await?);
    let stream = js
        .create_stream(stream::Config {
            name: STREAM.to_owned(),
            subjects: vec!["pc.>".to_owned()],
            ..Default::default()
        })
        .await
        .context("create the stream")?;
    let payload = Bytes::from(vec![b'x'; PAYLOAD]);
    let mut window = AckWindow::default();
    for k in 0..case.records {
        let subject = format!("pc.evt.0.e{}", k % case.entities);
        window
            .push(js.publish(subject, payload.clone()).await?)
            .await?;
    }
    window.drain().await?;
    // Record `j` of entity `i` is at sequence `1 + i + j * entities` (a fresh stream).
    let per_entity = case.records / case.entities;
    let keep_from = per_entity * 3 / 4;
    let count = case.entities.min(PURGES);
    let purged_entities = (0..count).map(|n| n * case.entities / count);
    let requests: Vec<Request> = match case.filter {
        Filter::Partition => vec![Request::Purge {
            filter: "pc.evt.0.*".to_owned(),
            below: 1 + keep_from * case.entities,
        }],
        Filter::Entity => purged_entities
            .map(|i| Request::Purge {
                filter: format!("pc.*.0.e{i}"),
                below: 1 + i + keep_from * case.entities,
            })
            .collect(),
        Filter::Literal => purged_entities
            .map(|i| Request::Purge {
                filter: format!("pc.evt.0.e{i}"),
                below: 1 + i + keep_from * case.entities,
            })
            .collect(),
        Filter::Delete | Filter::Erase => {
            let erase = case.filter == Filter::Erase;
            purged_entities
                .flat_map(|i| {
                    (0..keep_from).map(move |j| Request::Delete {
                        seq: 1 + i + j * case.entities,
                        erase,
                    })
                })
                .collect()
        }
    };
    let pids: Vec<u32> = server.pid().into_iter().collect();
    let meter = CpuMeter::start(&pids);
    let started = Instant::now();
    let mut purged = 0;
    for request in &requests {
        purged += match request {
            Request::Purge { filter, below } => {
                stream
                    .purge()
                    .filter(filter.clone())
                    .sequence(*below)
                    .await
                    .with_context(|| format!("purge {filter} below {below}"))?
                    .purged
            }
            Request::Delete { seq, erase } => {
                let answer: serde_json::Value = js
                    .request(
                        format!("STREAM.MSG.DELETE.{STREAM}"),
                        &serde_json::json!({ "seq": seq, "no_erase": !erase }),
                    )
                    .await
                    .with_context(|| format!("delete {seq}"))?;
                anyhow::ensure!(answer["success"] == true, "delete {seq}: {answer}");
                1
            }
        };
    }
    let secs = started.elapsed().as_secs_f64();
    let spent = meter.spent();
    Ok(Cost {
        case,
        requests: requests.len() as u64,
        purged,
        secs,
        server_secs: spent.server_secs,
    })
}

/// Runs every case; adds their rows to `report`.
pub async fn run(report: &mut Report) -> anyhow::Result<Vec<Cost>> {
    let mut costs = Vec::new();
    for case in CASES {
        eprintln!(
            "compaction: purge cost, {} records over {} entities, {:?} filter",
            case.records, case.entities, case.filter
        );
        let cost = measure(case).await?;
        eprintln!(
            "  {} requests removed {} records in {:.2} s: {:.0} requests/s, server {:.0} us per request, {:.1} us per record",
            cost.requests,
            cost.purged,
            cost.secs,
            cost.requests_per_sec(),
            cost.server_us_per_request(),
            cost.server_us_per_record()
        );
        let shape = format!(
            "{} records over {} entities, {:?} filter",
            case.records, case.entities, case.filter
        );
        push_rows(
            report,
            &shape,
            [
                ("requests/s, one at a time", cost.requests_per_sec(), "/s"),
                ("server CPU per request", cost.server_us_per_request(), "us"),
                (
                    "server CPU per record purged",
                    cost.server_us_per_record(),
                    "us",
                ),
            ],
        );
        costs.push(cost);
    }
    Ok(costs)
}

/// Adds a case's figures to `report`, as `purge cost, <shape>: <what>` rows.
pub(crate) fn push_rows<const N: usize>(
    report: &mut Report,
    shape: &str,
    figures: [(&str, f64, &'static str); N],
) {
    for (what, value, unit) in figures {
        report.rows.push(Row::new(
            "compaction",
            format!("purge cost, {shape}: {what}"),
            value,
            unit,
        ));
    }
}
