//! Where a command's latency goes, in one run (`--latency-stages`): jetshard's stage trace
//! events (`jetshard::test_support::COMMAND_STAGE_TARGET`, field `seq`) and the bare loop's own
//! ([`BARE_STAGE_TARGET`]) are recorded with [`now_ns`] while [`record`] is on; the latency
//! scenario joins them by partition and command sequence with the command's scheduled send
//! time and the moment its event reached the listener, and prints each stage's p50/p99 beside
//! the total.
//!
//! A command sequence names a command only within its command stream, and the spread layout
//! has several: a mark is joined by (partition, sequence). The partition of a mark is read
//! from the delivery's `$JS.ACK` subject (`pulled`) or from the enclosing span's `partition`
//! field (the entity actor's `command` span: `started` to `written`); the owner's `routed` and
//! `acking` carry neither, and are joined only where their sequence names one command seen.
//!
//! The server's own moment, the command stored in its stream, is read from the delivery's
//! `$JS.ACK` subject (its timestamp token, unix ns, the server's clock) and put on
//! [`now_ns`]'s clock through the offset between the two clocks taken when recording starts
//! (one machine: one clock, so the offset is the same for both).
//!
//! The stage callsites' interest is rebuilt whenever recording starts or stops: with it off
//! (every other scenario, and the latency scenario without the flag) they are disabled as
//! under any default filter, and nothing is visited or stored.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::subscriber::Interest;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::DynFilterFn;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use crate::stats::{Summary, now_ns};

/// The target of the bare loop's stage events (the same messages and fields as jetshard's).
pub const BARE_STAGE_TARGET: &str = "jetshard_bench::bare::stage";

/// The stages a command passes, in order. `Stored` and `Seen` are not trace events: the
/// server's timestamp and the listener's receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Stage {
    /// Stored in the command stream (the server's timestamp).
    Stored,
    /// Delivered to the pull loop.
    Pulled,
    /// Taken by the owner and queued for (or cast to) its entity's actor.
    Routed,
    /// The entity actor started the command.
    Started,
    /// Its entity's load began (the entity's first command only).
    Loading,
    /// Its entity's load ended.
    Loaded,
    /// The fenced write of its events is about to be published.
    Writing,
    /// The write's answer came back.
    Written,
    /// The event reached the bench's core subscription.
    Seen,
    /// The acknowledgement of the command is being sent.
    Acking,
}

impl Stage {
    fn of_message(message: &str) -> Option<Stage> {
        Some(match message {
            "pulled" => Stage::Pulled,
            "routed" => Stage::Routed,
            "started" => Stage::Started,
            "loading" => Stage::Loading,
            "loaded" => Stage::Loaded,
            "writing" => Stage::Writing,
            "written" => Stage::Written,
            "acking" => Stage::Acking,
            _ => return None,
        })
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// How many [`Stage`]s there are.
pub(crate) const STAGES: usize = 10;

/// One stage event: (`now_ns`, command sequence, stage, partition). The partition is
/// [`UNKNOWN`] on the owner's marks (see the module's text).
pub(crate) type Mark = (u64, u64, Stage, u32);

/// The partition of a mark that carries none.
pub(crate) const UNKNOWN: u32 = u32::MAX;

/// A batched load's one read (`batch read` events).
#[derive(Debug, Clone, Copy)]
// Read by `pass_stages` only (the `profiling` feature).
#[cfg_attr(not(feature = "profiling"), allow(dead_code))]
pub(crate) struct BatchRead {
    /// When its answer came (`now_ns`).
    pub(crate) at: u64,
    pub(crate) partition: u32,
    pub(crate) entities: u64,
    pub(crate) records: u64,
    /// Waited for a load permit, ns.
    pub(crate) permit_ns: u64,
    /// From the request to the answer, ns.
    pub(crate) read_ns: u64,
}

/// The events of no command: batched reads, and pull requests (`now_ns`, partition).
#[derive(Debug, Default)]
pub(crate) struct Others {
    pub(crate) reads: Vec<BatchRead>,
    pub(crate) pulls: Vec<(u64, u32)>,
}

static RECORDING: AtomicBool = AtomicBool::new(false);
/// Unix ns minus `now_ns` when recording started.
static CLOCK_OFFSET: AtomicU64 = AtomicU64::new(0);
static MARKS: Mutex<Vec<Mark>> = Mutex::new(Vec::new());
static OTHERS: Mutex<Others> = Mutex::new(Others {
    reads: Vec::new(),
    pulls: Vec::new(),
});

/// Starts (`true`) or stops recording; starting drops what was recorded before.
pub fn record(on: bool) {
    if on {
        MARKS.lock().unwrap_or_else(PoisonError::into_inner).clear();
        *OTHERS.lock().unwrap_or_else(PoisonError::into_inner) = Others::default();
        CLOCK_OFFSET.store(clock_offset(), Ordering::Relaxed);
    }
    RECORDING.store(on, Ordering::Release);
    // The stage callsites are enabled only while recording: asked again now.
    tracing::callsite::rebuild_interest_cache();
}

/// Whether stages are recorded now.
pub fn recording() -> bool {
    RECORDING.load(Ordering::Acquire)
}

/// Stops recording and takes what was recorded.
pub(crate) fn take() -> (Vec<Mark>, Others) {
    record(false);
    let marks = std::mem::take(&mut *MARKS.lock().unwrap_or_else(PoisonError::into_inner));
    let others = std::mem::take(&mut *OTHERS.lock().unwrap_or_else(PoisonError::into_inner));
    (marks, others)
}

/// The partition of a consumer named `<type>-p<partition>`.
fn partition_of_consumer(consumer: &str) -> Option<u32> {
    consumer.rsplit_once("-p")?.1.parse().ok()
}

/// The partition of the consumer a `$JS.ACK` subject names, in either layout (ADR-15).
fn ack_partition(reply: &str) -> Option<u32> {
    let tokens: Vec<&str> = reply.strip_prefix("$JS.ACK.")?.split('.').collect();
    let consumer = match tokens.len() {
        7 => tokens.get(1)?,
        n if n >= 9 => tokens.get(3)?,
        _ => return None,
    };
    partition_of_consumer(consumer)
}

/// Unix ns minus [`now_ns`], from the closest of a few readings.
fn clock_offset() -> u64 {
    let mut best: Option<(u64, u64)> = None;
    for _ in 0..16 {
        let before = now_ns();
        let unix = unix_ns();
        let after = now_ns();
        let gap = after - before;
        if best.is_none_or(|(g, _)| gap < g) {
            best = Some((gap, unix.saturating_sub(before + gap / 2)));
        }
    }
    best.map_or(0, |(_, offset)| offset)
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The timestamp token of a `$JS.ACK` subject (unix ns), in either layout (ADR-15).
fn ack_timestamp(reply: &str) -> Option<u64> {
    let tokens: Vec<&str> = reply.strip_prefix("$JS.ACK.")?.split('.').collect();
    let first = match tokens.len() {
        7 => 2,
        n if n >= 9 => 4,
        _ => return None,
    };
    tokens.get(first + 3)?.parse().ok()
}

/// The layer that records stage events, and its filter (asked only at the stage callsites).
pub fn layer<S>() -> impl Layer<S> + Send + Sync
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    // The stage events, and the library's spans that carry a partition (for the events in
    // them that do not).
    let wanted = |meta: &tracing::Metadata<'_>| {
        let target = meta.target();
        target == jetshard::test_support::COMMAND_STAGE_TARGET
            || target == BARE_STAGE_TARGET
            || (meta.is_span()
                && target.starts_with("jetshard::")
                && meta.fields().field("partition").is_some())
    };
    StageLayer.with_filter(
        DynFilterFn::new(move |meta, _| wanted(meta) && recording()).with_callsite_filter(
            move |meta| {
                if wanted(meta) && recording() {
                    Interest::always()
                } else {
                    Interest::never()
                }
            },
        ),
    )
}

struct StageLayer;

/// A span's `partition` field, kept in its extensions.
struct SpanPartition(u32);

impl<S> Layer<S> for StageLayer
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let (Some(partition), Some(span)) = (fields.partition, ctx.span(id)) {
            span.extensions_mut().insert(SpanPartition(partition));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let at = now_ns();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let partition = fields
            .partition
            .or_else(|| {
                ctx.event_scope(event)?
                    .find_map(|span| span.extensions().get::<SpanPartition>().map(|p| p.0))
            })
            .unwrap_or(UNKNOWN);
        match fields.message.as_str() {
            "batch read" => {
                let read = BatchRead {
                    at,
                    partition,
                    entities: fields.entities,
                    records: fields.records,
                    permit_ns: fields.permit_us * 1000,
                    read_ns: fields.read_us * 1000,
                };
                OTHERS
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .reads
                    .push(read);
                return;
            }
            "pull" => {
                OTHERS
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .pulls
                    .push((at, partition));
                return;
            }
            _ => {}
        }
        let Some(stage) = Stage::of_message(&fields.message) else {
            return;
        };
        let mut marks = MARKS.lock().unwrap_or_else(PoisonError::into_inner);
        marks.push((at, fields.seq, stage, partition));
        if let Some(stored) = fields.stored_unix_ns {
            let offset = CLOCK_OFFSET.load(Ordering::Relaxed);
            marks.push((
                stored.saturating_sub(offset),
                fields.seq,
                Stage::Stored,
                partition,
            ));
        }
    }
}

#[derive(Default)]
struct Fields {
    seq: u64,
    message: String,
    stored_unix_ns: Option<u64>,
    partition: Option<u32>,
    entities: u64,
    records: u64,
    permit_us: u64,
    read_us: u64,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "seq" => self.seq = value,
            "partition" => self.partition = u32::try_from(value).ok(),
            "entities" => self.entities = value,
            "records" => self.records = value,
            "permit_us" => self.permit_us = value,
            "read_us" => self.read_us = value,
            _ => {}
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "reply" => {
                self.stored_unix_ns = ack_timestamp(value);
                self.partition = ack_partition(value);
            }
            // A pull request's subject: `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`.
            "subject" => {
                self.partition = value.rsplit('.').next().and_then(partition_of_consumer);
            }
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

/// A command as the listener saw it: (partition, command sequence, scheduled send `now_ns`,
/// received `now_ns`).
pub type Seen = (u32, u64, u64, u64);

/// One stage step's distribution, ms.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// `from -> to`.
    pub name: String,
    /// Over the commands that have both marks.
    pub summary: Summary,
}

impl Step {
    /// One line: the step, its p50, p99 and p999, and how many commands it has.
    pub fn describe(&self) -> String {
        format!(
            "{:<20} p50 {:>8.2} ms  p99 {:>8.2} ms  p999 {:>8.2} ms  (n {})",
            self.name, self.summary.p50, self.summary.p99, self.summary.p999, self.summary.count
        )
    }
}

/// The steps reported, in order: (from, to). `None` as `from` is the scheduled send.
const STEPS: [(Option<Stage>, Stage); 9] = [
    (None, Stage::Stored),
    (Some(Stage::Stored), Stage::Pulled),
    (Some(Stage::Pulled), Stage::Routed),
    (Some(Stage::Routed), Stage::Started),
    (Some(Stage::Started), Stage::Writing),
    (Some(Stage::Writing), Stage::Written),
    (Some(Stage::Writing), Stage::Seen),
    (Some(Stage::Written), Stage::Acking),
    (None, Stage::Seen),
];

/// Takes the marks recorded (recording stops) and splits the latency of the commands `seen`
/// whose scheduled send is at or after `from_ns` by step. Steps without marks (the bare loop
/// has no owner or actor) are left out.
pub fn split(seen: &[Seen], from_ns: u64) -> Vec<Step> {
    let (marks, _) = take();
    join(seen, marks, from_ns)
}

/// [`split`] on the `marks` given.
fn join(seen: &[Seen], marks: Vec<Mark>, from_ns: u64) -> Vec<Step> {
    let mut by_command: HashMap<(u32, u64), [Option<u64>; STAGES]> =
        HashMap::with_capacity(seen.len());
    // The partition of the one command seen with a sequence (`None`: several).
    let mut of_seq: HashMap<u64, Option<u32>> = HashMap::with_capacity(seen.len());
    for &(partition, seq, at, received) in seen {
        of_seq
            .entry(seq)
            .and_modify(|p| *p = p.filter(|p| *p == partition))
            .or_insert(Some(partition));
        if at >= from_ns {
            let mut stages = [None; STAGES];
            stages[Stage::Seen.index()] = Some(received);
            by_command.insert((partition, seq), stages);
        }
    }
    for (at, seq, stage, partition) in marks {
        let partition = match partition {
            UNKNOWN => match of_seq.get(&seq) {
                Some(Some(partition)) => *partition,
                _ => continue,
            },
            known => known,
        };
        if let Some(stages) = by_command.get_mut(&(partition, seq)) {
            // The first mark of each stage: a redelivery's later ones are not this latency.
            stages[stage.index()].get_or_insert(at);
        }
    }
    let scheduled: HashMap<(u32, u64), u64> = seen
        .iter()
        .map(|&(partition, seq, at, _)| ((partition, seq), at))
        .collect();
    STEPS
        .iter()
        .filter_map(|&(from, to)| {
            let samples: Vec<f64> = by_command
                .iter()
                .filter_map(|(command, stages)| {
                    let start = match from {
                        None => scheduled.get(command).copied(),
                        Some(stage) => stages[stage.index()],
                    }?;
                    let end = stages[to.index()]?;
                    Some(end as f64 / 1e6 - start as f64 / 1e6)
                })
                .collect();
            (!samples.is_empty()).then(|| Step {
                name: format!(
                    "{} -> {:?}",
                    from.map_or("Scheduled".to_owned(), |s| format!("{s:?}")),
                    to
                ),
                summary: Summary::of(&samples),
            })
        })
        .collect()
}

/// The partition in an event's subject (`<type>.evt.<partition>.<id>`).
pub fn partition_of_event_subject(subject: &str) -> Option<u32> {
    subject.split('.').nth(2)?.parse().ok()
}

/// The command sequence in an event's `Nats-Msg-Id` (`<type>:<command seq>:<index>`).
pub fn command_seq_of_msg_id(msg_id: &str) -> Option<u64> {
    msg_id.split(':').nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_timestamp_is_read_in_both_ack_layouts() {
        assert_eq!(
            ack_timestamp("$JS.ACK.s.c.1.42.7.1700000000123.3"),
            Some(1_700_000_000_123)
        );
        assert_eq!(
            ack_timestamp("$JS.ACK.dom.hash.s.c.1.42.7.1700000000123.3.rnd"),
            Some(1_700_000_000_123)
        );
        assert_eq!(ack_timestamp("$JS.ACK.s.c.1.42"), None);
    }

    #[test]
    fn the_partition_is_read_from_the_consumer_in_both_ack_layouts() {
        assert_eq!(
            ack_partition("$JS.ACK.s.bench-p3.1.42.7.1700000000123.3"),
            Some(3)
        );
        assert_eq!(
            ack_partition("$JS.ACK.dom.hash.s.my-type-p12.1.42.7.1700000000123.3.rnd"),
            Some(12)
        );
        assert_eq!(ack_partition("$JS.ACK.s.c.1.42.7.1700000000123.3"), None);
    }

    #[test]
    fn the_partition_is_read_from_an_event_subject() {
        assert_eq!(partition_of_event_subject("lat.evt.12.e7"), Some(12));
        assert_eq!(partition_of_event_subject("lat.evt"), None);
    }

    #[test]
    fn a_mark_is_joined_to_the_command_of_its_partition_and_sequence() {
        const MS: u64 = 1_000_000;
        // Sequence 7 in two partitions' command streams; 9 in one only.
        let marks = vec![
            (105 * MS, 7, Stage::Stored, 1),
            (110 * MS, 7, Stage::Pulled, 1),
            (105 * MS, 7, Stage::Stored, 2),
            (150 * MS, 7, Stage::Pulled, 2),
            (135 * MS, 7, Stage::Routed, UNKNOWN),
            (120 * MS, 9, Stage::Pulled, 1),
            (125 * MS, 9, Stage::Routed, UNKNOWN),
        ];
        let seen = [
            (1, 7, 100 * MS, 200 * MS),
            (2, 7, 100 * MS, 300 * MS),
            (1, 9, 100 * MS, 400 * MS),
        ];
        let steps = join(&seen, marks, 0);
        let step = |name: &str| steps.iter().find(|s| s.name == name).map(|s| &s.summary);
        let stored_to_pulled = step("Stored -> Pulled").expect("joined");
        assert_eq!(stored_to_pulled.count, 2);
        assert_eq!(stored_to_pulled.max, 45.0);
        // The owner's mark of sequence 7 names two commands: left out; 9's is joined.
        let pulled_to_routed = step("Pulled -> Routed").expect("joined");
        assert_eq!(pulled_to_routed.count, 1);
        assert_eq!(pulled_to_routed.max, 5.0);
    }

    #[test]
    fn the_command_sequence_is_read_from_an_event_id() {
        assert_eq!(command_seq_of_msg_id("lat:1234:0"), Some(1234));
        assert_eq!(command_seq_of_msg_id("lat"), None);
    }
}
