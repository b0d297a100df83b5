//! `verify`: holds the journal against every command ever sent.
//!
//! The example keeps its commands after acknowledgement (limits retention), so `ORDER_CMD` is a
//! complete record of what clients asked. Its owners compact `ORDER_JOURNAL` as the library
//! does by default (what a snapshot covers, confirmed outbox records and spent timer records
//! are purged), so each node also keeps `ORDER_JOURNAL_COPY`, a mirror of the journal that
//! keeps what is purged: a complete record of what the system did ([`keep_journal_copy`]; with
//! `--inventory`, `INVENTORY_CMD` and `INVENTORY_JOURNAL_COPY` the same for the inventory).
//! `verify` waits until each copy holds its journal's last record, reads them (ordered
//! consumers, from the start) and checks, for each entity type:
//!
//! 1. **Placement**: every command is stored in the partition `jetshard::partition_of` gives
//!    its entity id.
//! 2. **Exactly one outcome per command**: one event carrying its `Jetshard-Command-Seq`, or,
//!    for a body that is not a command, one dead-letter record; never both, never two. No event
//!    or dead letter refers to a command that does not exist, or to another entity's command.
//! 3. **Sequential model**: each entity's commands, replayed in stream order through the pure
//!    rules ([`Rules::decision`] / `Entity::apply`, with the nodes' [`Features`]), produce
//!    exactly the events in the journal. After a mismatch the model follows the journal, so one
//!    fault is reported once.
//! 4. **Fencing**: in each partition, fence generations rise by one, and every event, dead
//!    letter, timer and outbox record carries the generation of the partition's latest fence
//!    record before it: no write of a stale owner landed.
//!
//! With the features on, also:
//!
//! 5. **Outbox**: every message a decided command sends (the model knows which) is stored once
//!    in its target's command stream, under `Nats-Msg-Id: <t>:<seq>:out:<i>`, with the body the
//!    rules give; no stored command claims to be a message that no command sent.
//! 6. **Saga** (`--inventory`): no order line is reserved twice; every item an order added was
//!    answered by the inventory; at the end, the inventory holds exactly the reserved items of
//!    the orders that are not cancelled (none lost, none leaked), and no product more than its
//!    stock.
//! 7. **Timers** (`--payment-timeout`): a timer's command (`Jetshard-Timer`) leaves an event
//!    only while the model has that timer armed under that set sequence: a timer that fires
//!    twice, or after it was cancelled (by a payment), is a violation, and so is one due that
//!    never fired. The journal holds at most one `fired` record per timer setting.
//!
//! Wake-ups (commands with the header `Jetshard-Wake`, which jetshard sends to a partition
//! whose owner is gone so that a standby takes it and fires its timers) carry nothing for any
//! entity and are skipped.
//!
//! It assumes the command streams still hold every command (no `max_age` or size limits have
//! removed any). It first waits (bounded) until no partition has commands pending or
//! unacknowledged; what can still complete after that (a command without an outcome yet, a
//! message not yet delivered, a reservation not yet answered, a timer due but not fired) is
//! *unsettled*: `run` reads again until nothing is, or the settle time is up, when the rest
//! become violations. Journal records that answer commands newer than the last one read (sent
//! while it was reading) are left out.
//!
//! The reading is separate from the checking ([`check`] is pure), so the checks are unit-tested
//! on hand-made journals below.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::Client;
use async_nats::jetstream::consumer::pull;
use bytes::Bytes;
use futures::StreamExt;
use jetshard::admin::Admin;
use jetshard::{Codec, EntityId, FenceRecord, JournalReader, partition_of, wire};

use crate::inventory::{self, Inventory, InventoryEvent, InventoryState, STOCK};
use crate::order::{self, Order, OrderState, Phase, Stock};
use crate::rules::{Decision, Features, Message, Rules, Timer};

mod check;
mod effects;
mod read;
#[cfg(test)]
mod tests;

pub use check::check;
use check::*;
use effects::*;
use read::*;

/// A command as stored in a command stream (`ORDER_CMD`, `INVENTORY_CMD`).
#[derive(Debug, Clone)]
pub struct StoredCommand {
    /// Its stream sequence.
    pub seq: u64,
    /// The partition token of its stored subject `<t>.cmd.<p>.<id>`.
    pub partition: u32,
    /// The entity id.
    pub entity: String,
    /// The body as published.
    pub payload: Bytes,
    /// `Nats-Msg-Id`, if it had one.
    pub msg_id: Option<String>,
    /// A timer's command: the timer's name and set sequence (`Jetshard-Timer`,
    /// `Jetshard-Timer-Set`).
    pub timer: Option<(String, u64)>,
}

/// A record of a journal stream.
#[derive(Debug, Clone)]
pub struct JournalRecord {
    /// Its stream sequence.
    pub seq: u64,
    /// The partition token of its subject.
    pub partition: u32,
    /// `Jetshard-Generation`.
    pub generation: Option<u64>,
    /// What it is.
    pub kind: RecordKind,
}

/// The kinds of journal records.
#[derive(Debug, Clone)]
pub enum RecordKind {
    /// `<t>.evt.<p>.<id>`.
    Event {
        /// The entity id.
        entity: String,
        /// `Jetshard-Command-Seq`.
        command_seq: Option<u64>,
        /// The body.
        payload: Bytes,
    },
    /// `<t>.fence.<p>`: the claim of a generation.
    Fence(Result<FenceRecord, String>),
    /// `<t>.dlq.<p>[.<id>]`: a command given up.
    DeadLetter {
        /// `Jetshard-Entity`.
        entity: String,
        /// `Jetshard-Command-Seq`.
        command_seq: Option<u64>,
        /// `Jetshard-Reason`.
        reason: String,
    },
    /// `<t>.tmr.<p>.<id>`: a timer set, cancelled or fired.
    Timer {
        /// The entity id.
        entity: String,
        /// `Jetshard-Timer`.
        name: String,
        /// `Jetshard-Command-Seq`: the command that wrote it (for a set, the set sequence).
        command_seq: Option<u64>,
        /// `Jetshard-Timer-Op` and its details.
        op: TimerOp,
    },
    /// `<t>.out.<p>`: an outbox message or done record (checked for fencing only).
    Outbox,
}

/// What a timer record says (decoded by jetshard's journal reader).
pub use jetshard::journal_reader::TimerOp;

/// One entity type's streams, as read.
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    /// Its command stream.
    pub commands: Vec<StoredCommand>,
    /// Its journal stream.
    pub journal: Vec<JournalRecord>,
}

/// What `verify` found about one entity type.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Commands read.
    pub commands: usize,
    /// Distinct entities among them.
    pub entities: usize,
    /// Journal events by `type`.
    pub events: BTreeMap<&'static str, usize>,
    /// Dead-letter records.
    pub dead_letters: usize,
    /// Per partition, the generations claimed and by which node, in order.
    pub generations: BTreeMap<u32, Vec<(u64, String)>>,
}

impl Summary {
    /// Partitions claimed more than once: the takeovers, whatever caused them.
    pub fn takeovers(&self) -> usize {
        self.generations
            .values()
            .map(|g| g.len().saturating_sub(1))
            .sum()
    }

    /// Events of one `type`.
    pub fn count(&self, kind: &str) -> usize {
        self.events.get(kind).copied().unwrap_or(0)
    }
}

/// What became of the timers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimerSummary {
    /// Settings (a timer set, or set again).
    pub set: usize,
    /// Timer commands decided: fired.
    pub fired: usize,
    /// Armed timers disarmed by a command.
    pub cancelled: usize,
    /// Timer commands dropped as not armed (a repeat, or a timer cancelled meanwhile).
    pub dropped: usize,
    /// Due times of the timers still armed, unix ms.
    pub armed_due_ms: Vec<u64>,
}

/// What `verify` found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The features checked.
    pub features: Features,
    /// The orders.
    pub orders: Summary,
    /// The inventory (`--inventory`).
    pub inventory: Summary,
    /// Outbox messages stored more than once (a repeat after the duplicate window).
    pub stored_again: usize,
    /// The timers (`--payment-timeout`).
    pub timers: TimerSummary,
    /// Everything that breaks a promise; empty when all is well.
    pub violations: Vec<String>,
    /// What is not done yet but may still complete (see the module docs).
    pub unsettled: Vec<String>,
}

impl Report {
    /// Order partitions claimed more than once.
    pub fn takeovers(&self) -> usize {
        self.orders.takeovers()
    }

    /// Counts what is still unsettled as violations: the settle time is up.
    pub fn finish(mut self) -> Self {
        let unsettled = std::mem::take(&mut self.unsettled);
        self.violations.extend(
            unsettled
                .into_iter()
                .map(|u| format!("not done in the settle time: {u}")),
        );
        self
    }
}

fn write_summary(f: &mut fmt::Formatter<'_>, s: &Summary, what: &str) -> fmt::Result {
    let events: usize = s.events.values().sum();
    let by_kind: Vec<String> = s
        .events
        .iter()
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect();
    writeln!(f, "{what}events: {events} ({})", by_kind.join(", "))?;
    writeln!(f, "{what}dead letters (terminated): {}", s.dead_letters)?;
    for (partition, generations) in &s.generations {
        let chain: Vec<String> = generations
            .iter()
            .map(|(generation, node)| format!("g{generation} {node}"))
            .collect();
        writeln!(f, "{what}partition {partition}: {}", chain.join(" -> "))?;
    }
    writeln!(f, "{what}takeovers: {}", s.takeovers())
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.orders;
        writeln!(f, "commands: {} for {} orders", o.commands, o.entities)?;
        write_summary(f, o, "")?;
        if self.features.inventory {
            let i = &self.inventory;
            writeln!(
                f,
                "inventory commands: {} for {} products",
                i.commands, i.entities
            )?;
            write_summary(f, i, "inventory ")?;
            writeln!(
                f,
                "saga: {} items reserved, {} out of stock, {} released; orders cancelled by an item out of stock: {}; outbox messages stored twice: {}",
                i.count("Reserved"),
                i.count("OutOfStock"),
                i.count("Released"),
                o.count("ItemUnavailable"),
                self.stored_again
            )?;
        }
        if self.features.payment_timeout.is_some() {
            let t = &self.timers;
            writeln!(
                f,
                "timers: {} set, {} fired (orders expired: {}), {} cancelled, {} dropped as not armed, {} armed",
                t.set,
                t.fired,
                o.count("Expired"),
                t.cancelled,
                t.dropped,
                t.armed_due_ms.len()
            )?;
        }
        for violation in self.violations.iter().take(50) {
            writeln!(f, "VIOLATION: {violation}")?;
        }
        if self.violations.len() > 50 {
            writeln!(f, "... and {} more", self.violations.len() - 50)?;
        }
        for unsettled in self.unsettled.iter().take(10) {
            writeln!(f, "unsettled: {unsettled}")?;
        }
        write!(f, "violations: {}", self.violations.len())
    }
}

/// Options of a verification against a server.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// How long to wait for everything to settle: every partition quiet (nothing pending,
    /// nothing unacknowledged), and nothing unsettled (see the module docs).
    pub settle: Duration,
    /// The features the nodes ran with.
    pub features: Features,
}

/// Waits (bounded) until the system is quiet, reads the streams and [`check`]s them; reads and
/// checks again while something is unsettled or an armed timer falls due within the settle
/// time, until the settle time is up.
///
/// # Errors
/// If the streams cannot be read. Violations are in the report, not errors.
pub async fn run(client: Client, options: &VerifyOptions) -> anyhow::Result<Report> {
    let js = async_nats::jetstream::new(client.clone());
    let mut types = vec![(
        order::ENTITY_TYPE,
        order::COMMAND_STREAM,
        order::JOURNAL_STREAM,
    )];
    if options.features.inventory {
        types.push((
            inventory::ENTITY_TYPE,
            inventory::COMMAND_STREAM,
            inventory::JOURNAL_STREAM,
        ));
    }
    for (_, commands, journal) in &types {
        for stream in [
            commands.to_string(),
            journal.to_string(),
            journal_copy(journal),
        ] {
            js.get_stream(&stream).await.map_err(|e| {
                anyhow::anyhow!(
                    "stream {stream}: {e} (start a node with these features first: it creates the streams)"
                )
            })?;
        }
    }
    let deadline = Instant::now() + options.settle;
    let deadline_ms = unix_ms_now() + u64::try_from(options.settle.as_millis()).unwrap_or(u64::MAX);
    loop {
        let mut partitions = 0;
        for (t, _, _) in &types {
            partitions = settle(&Admin::new(client.clone(), t), deadline).await?;
        }
        // Commands first, then journals: every record read answers a command read, or is left
        // out as newer.
        let mut recorded = Vec::new();
        for (t, commands, _) in &types {
            recorded.push(Recorded {
                commands: read_commands(&js, commands, t).await?,
                journal: Vec::new(),
            });
        }
        for ((t, _, journal), recorded) in types.iter().zip(&mut recorded) {
            let copy = caught_up_copy(&js, journal).await?;
            recorded.journal = JournalReader::new(copy, t)
                .all()
                .await?
                .into_iter()
                .filter_map(journal_record)
                .collect();
        }
        let mut recorded = recorded.into_iter();
        let orders = recorded.next().unwrap_or_default();
        let inventory = recorded.next().unwrap_or_default();
        let mut report = check(
            partitions,
            &options.features,
            &orders,
            &inventory,
            unix_ms_now(),
        );
        if partitions == 0 {
            report
                .violations
                .push("no partition consumers found".to_owned());
        }
        let timer_due = report
            .timers
            .armed_due_ms
            .first()
            .is_some_and(|due| *due <= deadline_ms);
        if (report.unsettled.is_empty() && !timer_due) || Instant::now() >= deadline {
            return Ok(report.finish());
        }
        tracing::info!(
            unsettled = report.unsettled.len(),
            timer_due,
            "not settled yet; reading again"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The copy of `journal` that `verify` reads: `<journal>_COPY`.
pub fn journal_copy(journal: &str) -> String {
    format!("{journal}_COPY")
}

/// Creates the copy of the journal stream `journal` unless it is there: a mirror, which keeps
/// what the owners' compaction purges from the journal (`Nats-Rollup` allowed: a snapshot rolls
/// up the older snapshots of its entity, there as in the journal). A node of the example calls
/// it once its shard system has started the journal, before the owners' first compaction.
///
/// # Errors
/// If the server refuses the stream.
pub async fn keep_journal_copy(
    js: &async_nats::jetstream::Context,
    journal: &str,
) -> anyhow::Result<()> {
    let config = async_nats::jetstream::stream::Config {
        name: journal_copy(journal),
        mirror: Some(async_nats::jetstream::stream::Source {
            name: journal.to_owned(),
            ..Default::default()
        }),
        allow_rollup: true,
        storage: async_nats::jetstream::stream::StorageType::File,
        ..Default::default()
    };
    js.get_or_create_stream(config)
        .await
        .with_context(|| format!("create {}", journal_copy(journal)))?;
    Ok(())
}

/// The copy of `journal`, once it holds the journal's last record (within 20 s).
async fn caught_up_copy(
    js: &async_nats::jetstream::Context,
    journal: &str,
) -> anyhow::Result<async_nats::jetstream::stream::Stream<()>> {
    let last = |name: String| async move {
        let mut stream = js.get_stream(&name).await?;
        anyhow::Ok(stream.info().await?.state.last_sequence)
    };
    let target = last(journal.to_owned()).await?;
    let copy = journal_copy(journal);
    let deadline = Instant::now() + Duration::from_secs(20);
    while last(copy.clone()).await? < target {
        if Instant::now() >= deadline {
            anyhow::bail!("{copy} did not catch up with {journal}'s record {target} within 20 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(js.get_stream_no_info(copy).await?)
}

fn unix_ms_now() -> u64 {
    u64::try_from(crate::nodes::unix_ms()).unwrap_or(u64::MAX)
}
