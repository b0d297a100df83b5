//! Metrics, through the [`metrics`] facade: jetshard emits, the application installs a recorder
//! (an exporter) before it starts its shard systems; without one, every handle is a no-op.
//!
//! Every series is named here and listed in docs/OPERATIONS.md ("Metrics"). Names and labels
//! follow Prometheus conventions: `snake_case`, a `jetshard_` prefix, `_total` on counters,
//! base units (`_seconds`). Every series of a partition carries `entity_type` and `partition`.
//!
//! The handles of a partition are registered once, when its owner starts: the path of a command
//! builds no label and allocates nothing for its metrics.

use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Label, counter, gauge, histogram};

/// Commands settled, by `outcome`: `applied`, `rejected`, `dead_lettered`, `duplicate`.
/// The target of the trace events that mark a command's way through a process (field `seq`:
/// the command's stream sequence; the message names the stage: `pulled` (field `reply`, the
/// delivery's `$JS.ACK` subject, whose timestamp is the server's), `routed`, `started`,
/// `loading` and `loaded` around the entity's load, on its first command only, `writing`,
/// `written`, `acking`). Besides, events of no command: `pull` (a pull request sent, field
/// `subject`), `batch read` (a batched load's one read: fields `partition`, `entities`,
/// `records`, `permit_us` waited for a load permit, `read_us` from request to answer).
/// Disabled by default filters: for a tool that splits a command's latency by stage in one run
/// (the bench's `--latency-stages` and `--pass-stages`).
#[cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
pub const STAGE_TARGET: &str = "jetshard::command::stage";

pub(crate) const COMMANDS: &str = "jetshard_commands_total";
/// Events written to the journal by applied commands.
pub(crate) const EVENTS_WRITTEN: &str = "jetshard_events_written_total";
/// Journal writes the server did not confirm (retried without spending a delivery).
pub(crate) const UNCONFIRMED_WRITES: &str = "jetshard_unconfirmed_writes_total";
/// Time in the entity's `decide`.
pub(crate) const DECIDE_SECONDS: &str = "jetshard_decide_seconds";
/// Time from handing a command's records to the group commit to the server's acknowledgement
/// of the batch holding them.
pub(crate) const JOURNAL_WRITE_SECONDS: &str = "jetshard_journal_write_seconds";
/// Events per command written (stored all or none).
pub(crate) const JOURNAL_BATCH_EVENTS: &str = "jetshard_journal_batch_events";
/// Records per group commit of a partition's journal writes (one atomic batch).
pub(crate) const JOURNAL_COMMIT_RECORDS: &str = "jetshard_journal_commit_records";
/// Group commits refused because a fenced write was already in flight on the partition's fence
/// subject (10164 on a clustered stream): retried; never expected in steady state.
pub(crate) const JOURNAL_WRITE_CONFLICTS: &str = "jetshard_journal_write_conflicts_total";
/// Acquisitions of a partition by this process, by `outcome`: `acquired`, `failed`.
pub(crate) const ACQUISITIONS: &str = "jetshard_acquisitions_total";
/// Time loading one entity from the journal on its first command (its latest snapshot and its
/// records after it); an acquisition no longer replays the partition.
pub(crate) const REPLAY_SECONDS: &str = "jetshard_replay_seconds";
/// Time of a snapshot write, to the server's acknowledgement.
pub(crate) const SNAPSHOT_SECONDS: &str = "jetshard_snapshot_write_seconds";
/// Time of a whole acquisition: in-hand read, claim, recovery of the in-flight window.
pub(crate) const ACQUIRE_SECONDS: &str = "jetshard_acquire_seconds";
/// Times this process stopped owning a partition, by `reason`.
pub(crate) const STEP_DOWNS: &str = "jetshard_step_downs_total";
/// Deliveries that came under another pin than the one before.
pub(crate) const PIN_CHANGES: &str = "jetshard_pin_changes_total";
/// Entities of a partition this process owns, by `state`: `resident`, `dormant`, `quarantined`.
pub(crate) const ENTITIES: &str = "jetshard_entities";
/// Commands stored and not delivered yet, as the server counted at the last delivery.
pub(crate) const PENDING_COMMANDS: &str = "jetshard_pending_commands";
/// Commands delivered to this process and not acknowledged yet.
pub(crate) const ACK_PENDING_COMMANDS: &str = "jetshard_ack_pending_commands";
/// Whether this process owns the partition (1) or not (0).
pub(crate) const OWNED: &str = "jetshard_partition_owned";
/// Background compaction sweeps of a partition, by `outcome`: `done`, `late` (past its
/// interval), `failed`.
pub(crate) const COMPACTION_SWEEPS: &str = "jetshard_compaction_sweeps_total";
/// Purge requests background compaction sent.
pub(crate) const COMPACTION_PURGES: &str = "jetshard_compaction_purges_total";
/// Journal records those purges removed.
pub(crate) const COMPACTION_REMOVED: &str = "jetshard_compaction_removed_records_total";
/// The server's time for one purge request (request to answer).
pub(crate) const COMPACTION_PURGE_SECONDS: &str = "jetshard_compaction_purge_seconds";

/// The handles the entity actors of one partition share (through their `EntityContext`).
#[derive(Clone)]
pub(crate) struct CommandMetrics {
    pub(crate) decide_seconds: Histogram,
    pub(crate) write_seconds: Histogram,
    pub(crate) batch_events: Histogram,
    pub(crate) replay_seconds: Histogram,
    pub(crate) snapshot_seconds: Histogram,
}

/// The handles of a partition's group commit.
#[derive(Clone)]
pub(crate) struct CommitMetrics {
    pub(crate) records: Histogram,
    pub(crate) conflicts: Counter,
}

/// One partition's handles in this process, registered once by its owner.
pub(crate) struct PartitionMetrics {
    labels: Vec<Label>,
    pub(crate) applied: Counter,
    pub(crate) rejected: Counter,
    pub(crate) dead_lettered: Counter,
    pub(crate) duplicate: Counter,
    pub(crate) events_written: Counter,
    pub(crate) unconfirmed_writes: Counter,
    pub(crate) acquired: Counter,
    pub(crate) acquisition_failed: Counter,
    pub(crate) acquire_seconds: Histogram,
    pub(crate) pin_changes: Counter,
    pub(crate) resident: Gauge,
    pub(crate) dormant: Gauge,
    pub(crate) quarantined: Gauge,
    pub(crate) pending: Gauge,
    pub(crate) ack_pending: Gauge,
    pub(crate) owned: Gauge,
    pub(crate) command: CommandMetrics,
    pub(crate) commit: CommitMetrics,
}

impl PartitionMetrics {
    pub(crate) fn new(entity_type: &str, partition: u32) -> Self {
        let labels = vec![
            Label::new("entity_type", entity_type.to_owned()),
            Label::new("partition", partition.to_string()),
        ];
        let with = |key: &'static str, value: &'static str| {
            let mut all = labels.clone();
            all.push(Label::from_static_parts(key, value));
            all
        };
        Self {
            applied: counter!(COMMANDS, with("outcome", "applied")),
            rejected: counter!(COMMANDS, with("outcome", "rejected")),
            dead_lettered: counter!(COMMANDS, with("outcome", "dead_lettered")),
            duplicate: counter!(COMMANDS, with("outcome", "duplicate")),
            events_written: counter!(EVENTS_WRITTEN, labels.clone()),
            unconfirmed_writes: counter!(UNCONFIRMED_WRITES, labels.clone()),
            acquired: counter!(ACQUISITIONS, with("outcome", "acquired")),
            acquisition_failed: counter!(ACQUISITIONS, with("outcome", "failed")),
            acquire_seconds: histogram!(ACQUIRE_SECONDS, labels.clone()),
            pin_changes: counter!(PIN_CHANGES, labels.clone()),
            resident: gauge!(ENTITIES, with("state", "resident")),
            dormant: gauge!(ENTITIES, with("state", "dormant")),
            quarantined: gauge!(ENTITIES, with("state", "quarantined")),
            pending: gauge!(PENDING_COMMANDS, labels.clone()),
            ack_pending: gauge!(ACK_PENDING_COMMANDS, labels.clone()),
            owned: gauge!(OWNED, labels.clone()),
            command: CommandMetrics {
                decide_seconds: histogram!(DECIDE_SECONDS, labels.clone()),
                write_seconds: histogram!(JOURNAL_WRITE_SECONDS, labels.clone()),
                batch_events: histogram!(JOURNAL_BATCH_EVENTS, labels.clone()),
                replay_seconds: histogram!(REPLAY_SECONDS, labels.clone()),
                snapshot_seconds: histogram!(SNAPSHOT_SECONDS, labels.clone()),
            },
            commit: CommitMetrics {
                records: histogram!(JOURNAL_COMMIT_RECORDS, labels.clone()),
                conflicts: counter!(JOURNAL_WRITE_CONFLICTS, labels.clone()),
            },
            labels,
        }
    }

    /// Counts a step-down (rare: registered on the spot).
    pub(crate) fn step_down(&self, reason: &'static str) {
        let mut labels = self.labels.clone();
        labels.push(Label::from_static_parts("reason", reason));
        counter!(STEP_DOWNS, labels).increment(1);
    }

    /// The partition's entities and commands in hand while owned; zeros when not (so that a
    /// sum over processes counts each partition once).
    pub(crate) fn set_load(&self, load: Option<Load>) {
        let load = load.unwrap_or_default();
        self.owned.set(if load.owned { 1.0 } else { 0.0 });
        self.resident.set(load.resident as f64);
        self.dormant.set(load.dormant as f64);
        self.quarantined.set(load.quarantined as f64);
        self.ack_pending.set(load.ack_pending as f64);
        if !load.owned {
            self.pending.set(0.0);
        }
    }
}

/// What the gauges of an owned partition show.
#[derive(Default, Clone, Copy)]
pub(crate) struct Load {
    pub(crate) owned: bool,
    pub(crate) resident: usize,
    pub(crate) dormant: usize,
    pub(crate) quarantined: usize,
    pub(crate) ack_pending: usize,
}

/// Records a duration in seconds.
pub(crate) fn record(histogram: &Histogram, elapsed: Duration) {
    histogram.record(elapsed.as_secs_f64());
}
