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
//! The **bounded** variant is the memory target: every entity is known (it has an event
//! in the journal), a hundredth of them may be resident (`max_resident_entities`) and as many
//! dormant (`max_dormant_entities`), and traffic moves over all of them (one `Touch` each, in
//! waves). RSS and glibc's heap in use are sampled after every tenth of the entities: the heap
//! must stay flat (the last sample within 10% of the one at a tenth), RSS bounded (the last
//! within 10% of the one half-way: glibc keeps freed pages for a while), and the heap is given
//! per entity the budgets keep (resident or dormant).
//!
//! `measure.rs` drives one variant from the parent; `child.rs` is the child process (and the
//! parent's handle on it) and the ractor baseline.

mod child;
mod measure;

pub use child::run_child;

use std::time::Duration;

use clap::Args;
use serde::Serialize;
use serde_json::json;

use crate::Options;
use crate::entity::BenchState;
use crate::report::{Report, Row};

use child::ractor_baseline;
use measure::measure;

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

/// The target for an idle resident entity beyond its state.
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
        // Fewer than two samples (a run of one wave) has no half-way point: no rows.
        (rss.first(), (rss.len() / 2).checked_sub(1).and_then(|i| rss.get(i)), rss.last())
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
