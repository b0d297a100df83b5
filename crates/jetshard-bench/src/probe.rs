//! Reads jetshard's `acquired partition` log line, which carries what no API exposes yet: how
//! many events an acquisition replayed and how long it took.
//!
//! jetshard emits the line from `owner::acquire` with the fields `partition`, `generation`,
//! `rebuilt_events`, `recovered` and `elapsed_ms` (elapsed from the first delivery under the
//! new pin to the state being rebuilt: claim, replay and in-flight recovery). This executable
//! subscribes to it with a [`tracing_subscriber::Layer`]; libraries only emit.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::prelude::*;

/// The message of jetshard's acquisition log line.
const ACQUIRED_MESSAGE: &str = "acquired partition";

/// One acquisition, as the log line told it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Acquisition {
    /// The partition.
    pub partition: u32,
    /// The generation claimed.
    pub generation: u64,
    /// Events replayed into state.
    pub rebuilt_events: u64,
    /// In-flight commands of the previous owner recovered.
    pub recovered: u64,
    /// The replay alone, in milliseconds.
    pub replay_ms: u64,
    /// Claim + replay + recovery, in milliseconds.
    pub elapsed_ms: u64,
    /// When the line was emitted, unix milliseconds.
    pub at_unix_ms: u64,
}

/// Every acquisition this process saw, shared with the layer that records them.
#[derive(Clone, Default)]
pub struct AcquisitionLog {
    seen: Arc<Mutex<Vec<Acquisition>>>,
}

impl AcquisitionLog {
    /// The acquisitions so far.
    pub fn all(&self) -> Vec<Acquisition> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The latest acquisition of `partition`, if any.
    pub fn latest(&self, partition: u32) -> Option<Acquisition> {
        self.all()
            .into_iter()
            .rev()
            .find(|a| a.partition == partition)
    }

    fn push(&self, acquisition: Acquisition) {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(acquisition);
    }
}

/// Installs the process's tracing subscriber: jetshard's warnings and errors (or `RUST_LOG`) to
/// stderr, and every acquisition line to `on_acquired`. Call once, first thing.
pub fn install(on_acquired: impl Fn(Acquisition) + Send + Sync + 'static) {
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        );
    let probe = AcquisitionLayer {
        on_acquired: Box::new(on_acquired),
    }
    // Static per-callsite interest: jetshard's debug spans stay disabled, as under a
    // production `info` filter.
    .with_filter(
        tracing_subscriber::filter::Targets::new()
            .with_target("jetshard::runtime::owner", tracing::Level::INFO),
    );
    let purges = PurgeLayer.with_filter(tracing_subscriber::filter::Targets::new().with_target(
        jetshard::test_support::COMPACTION_PURGE_TARGET,
        tracing::Level::TRACE,
    ));
    // A second install (the bench target calling the harness twice) keeps the first.
    let _ = tracing_subscriber::registry()
        .with(stderr)
        .with(probe)
        .with(purges)
        .with(crate::stages::layer())
        .try_init();
}

/// Installs the subscriber with a log that collects acquisitions in memory.
pub fn install_collecting() -> AcquisitionLog {
    let log = AcquisitionLog::default();
    let sink = log.clone();
    install(move |acquisition| sink.push(acquisition));
    log
}

struct AcquisitionLayer {
    on_acquired: Box<dyn Fn(Acquisition) + Send + Sync>,
}

impl<S: tracing::Subscriber> Layer<S> for AcquisitionLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        if !fields.is_acquired {
            return;
        }
        (self.on_acquired)(Acquisition {
            partition: u32::try_from(fields.partition).unwrap_or(u32::MAX),
            generation: fields.generation,
            rebuilt_events: fields.rebuilt_events,
            recovered: fields.recovered,
            replay_ms: fields.replay_ms,
            elapsed_ms: fields.elapsed_ms,
            at_unix_ms: unix_ms(),
        });
    }
}

#[derive(Default)]
struct Fields {
    is_acquired: bool,
    message: String,
    partition: u64,
    generation: u64,
    rebuilt_events: u64,
    recovered: u64,
    replay_ms: u64,
    elapsed_ms: u64,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "partition" => self.partition = value,
            "generation" => self.generation = value,
            "rebuilt_events" => self.rebuilt_events = value,
            "recovered" => self.recovered = value,
            "replay_ms" => self.replay_ms = value,
            "elapsed_ms" => self.elapsed_ms = value,
            _ => {}
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.record_u64(field, u64::try_from(value).unwrap_or(0));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.is_acquired = value == ACQUIRED_MESSAGE;
            value.clone_into(&mut self.message);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
            self.is_acquired = self.message == ACQUIRED_MESSAGE;
        }
    }
}

/// Unix time in milliseconds.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A purge request's start or end, as jetshard's compaction traced it
/// (`jetshard::test_support::COMPACTION_PURGE_TARGET`): (`stats::now_ns`, partition, whether it is the start).
pub type PurgeMark = (u64, u32, bool);

static PURGE_MARKS: Mutex<Vec<PurgeMark>> = Mutex::new(Vec::new());

/// Takes the purge marks recorded so far (in emission order), leaving none.
pub fn take_purge_marks() -> Vec<PurgeMark> {
    std::mem::take(&mut *PURGE_MARKS.lock().unwrap_or_else(PoisonError::into_inner))
}

struct PurgeLayer;

impl<S: tracing::Subscriber> Layer<S> for PurgeLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let at = crate::stats::now_ns();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let start = fields.message == "purge sent";
        PURGE_MARKS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((
                at,
                u32::try_from(fields.partition).unwrap_or(u32::MAX),
                start,
            ));
    }
}
