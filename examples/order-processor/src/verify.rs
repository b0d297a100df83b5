//! `verify`: holds the journal against every command ever sent.
//!
//! The example keeps its commands after acknowledgement (limits retention), so `ORDER_CMD` is a
//! complete record of what clients asked, and `ORDER_JOURNAL` of what the system did. `verify`
//! reads both (ordered consumers, from the start) and checks:
//!
//! 1. **Placement**: every command is stored in the partition `jetshard::partition_of` gives
//!    its order id.
//! 2. **Exactly one outcome per command**: one event carrying its `Jetshard-Command-Seq`, or,
//!    for a body that is not a command, one dead-letter record; never both, never two. No event
//!    or dead letter refers to a command that does not exist, or to another order's command.
//! 3. **Sequential model**: each order's commands, replayed in stream order through the pure
//!    rules ([`Order::decide`] / [`Order::apply`]), produce exactly the events in the journal.
//!    After a mismatch the model follows the journal, so one fault is reported once.
//! 4. **Fencing**: in each partition, fence generations rise by one, and every event and dead
//!    letter carries the generation of the partition's latest fence record before it: no write
//!    of a stale owner landed.
//!
//! It assumes `ORDER_CMD` still holds every command (no `max_age` or size limits have removed
//! any), and a quiet system: it first waits (bounded) until no partition has commands pending
//! or unacknowledged. Journal records that answer commands newer than the last one it read (sent
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
use jetshard::{Codec, Entity, EntityId, FenceRecord, partition_of, wire};

use crate::order::{COMMAND_STREAM, ENTITY_TYPE, JOURNAL_STREAM, Order, OrderEvent, OrderState};

/// A command as stored in `ORDER_CMD`.
#[derive(Debug, Clone)]
pub struct StoredCommand {
    /// Its stream sequence.
    pub seq: u64,
    /// The partition token of its stored subject `order.cmd.<p>.<id>`.
    pub partition: u32,
    /// The order id.
    pub order: String,
    /// The body as published.
    pub payload: Bytes,
}

/// A record of `ORDER_JOURNAL`.
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
    /// `order.evt.<p>.<id>`.
    Event {
        /// The order id.
        order: String,
        /// `Jetshard-Command-Seq`.
        command_seq: Option<u64>,
        /// The body.
        payload: Bytes,
    },
    /// `order.fence.<p>`: the claim of a generation.
    Fence(Result<FenceRecord, String>),
    /// `order.dlq.<p>`: a command given up.
    DeadLetter {
        /// `Jetshard-Entity`.
        order: String,
        /// `Jetshard-Command-Seq`.
        command_seq: Option<u64>,
        /// `Jetshard-Reason`.
        reason: String,
    },
}

/// What `verify` found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Commands read from `ORDER_CMD`.
    pub commands: usize,
    /// Distinct orders among them.
    pub orders: usize,
    /// Journal events by `type`.
    pub events: BTreeMap<&'static str, usize>,
    /// Dead-letter records.
    pub dead_letters: usize,
    /// Per partition, the generations claimed and by which node, in order.
    pub generations: BTreeMap<u32, Vec<(u64, String)>>,
    /// Everything that breaks a promise; empty when all is well.
    pub violations: Vec<String>,
}

impl Report {
    /// Partitions claimed more than once: the takeovers, whatever caused them.
    pub fn takeovers(&self) -> usize {
        self.generations
            .values()
            .map(|g| g.len().saturating_sub(1))
            .sum()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let events: usize = self.events.values().sum();
        writeln!(f, "commands: {} for {} orders", self.commands, self.orders)?;
        let by_kind: Vec<String> = self
            .events
            .iter()
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect();
        writeln!(f, "events: {events} ({})", by_kind.join(", "))?;
        writeln!(f, "dead letters (terminated): {}", self.dead_letters)?;
        for (partition, generations) in &self.generations {
            let chain: Vec<String> = generations
                .iter()
                .map(|(generation, node)| format!("g{generation} {node}"))
                .collect();
            writeln!(f, "partition {partition}: {}", chain.join(" -> "))?;
        }
        writeln!(f, "takeovers: {}", self.takeovers())?;
        for violation in self.violations.iter().take(50) {
            writeln!(f, "VIOLATION: {violation}")?;
        }
        if self.violations.len() > 50 {
            writeln!(f, "... and {} more", self.violations.len() - 50)?;
        }
        write!(f, "violations: {}", self.violations.len())
    }
}

/// What one command should have left, per the model.
enum Expected {
    Event(OrderEvent),
    DeadLetter,
}

/// Checks the journal against the commands (see the module docs). Pure.
pub fn check(partitions: u32, commands: &[StoredCommand], journal: &[JournalRecord]) -> Report {
    let mut report = Report {
        commands: commands.len(),
        ..Report::default()
    };
    let mut violations = Vec::new();
    let last_command = commands.iter().map(|c| c.seq).max().unwrap_or(0);

    // Fencing, and the outcomes of each command.
    let mut latest_fence: HashMap<u32, u64> = HashMap::new();
    let mut events: HashMap<u64, Vec<(u64, String, Option<OrderEvent>)>> = HashMap::new();
    let mut dead: HashMap<u64, Vec<(u64, String)>> = HashMap::new();
    for record in journal {
        let fence = latest_fence.get(&record.partition).copied().unwrap_or(0);
        match &record.kind {
            RecordKind::Fence(Ok(claim)) => {
                if record.generation != Some(fence + 1) {
                    violations.push(format!(
                        "fence record {} of partition {} claims generation {:?} after generation {fence}",
                        record.seq, record.partition, record.generation
                    ));
                }
                if claim.partition != record.partition {
                    violations.push(format!(
                        "fence record {} on partition {} names partition {}",
                        record.seq, record.partition, claim.partition
                    ));
                }
                latest_fence.insert(record.partition, claim.generation);
                report
                    .generations
                    .entry(record.partition)
                    .or_default()
                    .push((claim.generation, claim.node.clone()));
                continue;
            }
            RecordKind::Fence(Err(e)) => {
                violations.push(format!("fence record {} is unreadable: {e}", record.seq));
                continue;
            }
            _ => {}
        }
        if record.generation != Some(fence) {
            violations.push(format!(
                "journal record {} of partition {} was written by generation {:?}, but the partition's latest fence before it is generation {fence}: a stale owner wrote",
                record.seq, record.partition, record.generation
            ));
        }
        match &record.kind {
            RecordKind::Event {
                order,
                command_seq,
                payload,
            } => {
                let event = Codec::Json.decode::<OrderEvent>(payload).ok();
                match &event {
                    Some(e) => *report.events.entry(e.kind()).or_default() += 1,
                    None => violations.push(format!(
                        "event {} of {order} is not an order event: {}",
                        record.seq,
                        String::from_utf8_lossy(payload)
                    )),
                }
                match command_seq {
                    Some(seq) if *seq > last_command => {}
                    Some(seq) => {
                        events
                            .entry(*seq)
                            .or_default()
                            .push((record.seq, order.clone(), event))
                    }
                    None => {
                        violations.push(format!("event {} of {order} names no command", record.seq))
                    }
                }
            }
            RecordKind::DeadLetter {
                order, command_seq, ..
            } => {
                report.dead_letters += 1;
                match command_seq {
                    Some(seq) if *seq > last_command => {}
                    Some(seq) => dead
                        .entry(*seq)
                        .or_default()
                        .push((record.seq, order.clone())),
                    None => violations.push(format!(
                        "dead letter {} of {order} names no command",
                        record.seq
                    )),
                }
            }
            RecordKind::Fence(_) => {}
        }
    }

    // Each order's commands in stream order, through the model.
    let mut by_order: BTreeMap<&str, Vec<&StoredCommand>> = BTreeMap::new();
    for command in commands {
        by_order.entry(&command.order).or_default().push(command);
    }
    report.orders = by_order.len();
    for (order, mut list) in by_order {
        list.sort_by_key(|c| c.seq);
        if let Ok(id) = EntityId::new(order) {
            let home = partition_of(&id, partitions);
            for c in list.iter().filter(|c| c.partition != home) {
                violations.push(format!(
                    "command {} of {order} is stored in partition {}, but {order} belongs to partition {home}",
                    c.seq, c.partition
                ));
            }
        }
        let mut state = OrderState::default();
        for command in list {
            let seq = command.seq;
            let expected = match Codec::Json.decode(&command.payload) {
                Ok(decoded) => match Order::decide(&state, decoded) {
                    Ok(mut decided) if decided.len() == 1 => decided.pop().map(Expected::Event),
                    Ok(_) => None,
                },
                Err(_) => Some(Expected::DeadLetter),
            };
            let found_events = events.remove(&seq).unwrap_or_default();
            let found_dead = dead.remove(&seq).unwrap_or_default();
            for (at, other) in found_events
                .iter()
                .map(|(at, o, _)| (at, o))
                .chain(found_dead.iter().map(|(at, o)| (at, o)))
                .filter(|(_, o)| o.as_str() != order)
            {
                violations.push(format!(
                    "journal record {at} answers command {seq} of {order} but is filed under {other}"
                ));
            }
            match (expected, found_events.as_slice(), found_dead.as_slice()) {
                (Some(Expected::Event(want)), [(_, _, got)], []) => {
                    match got {
                        Some(got) if *got == want => {}
                        Some(got) => violations.push(format!(
                            "command {seq} of {order}: the rules say {want:?}, the journal has {got:?}"
                        )),
                        None => {}
                    }
                    // Follow the journal, so that one divergence is reported once.
                    Order::apply(&mut state, got.as_ref().unwrap_or(&want));
                }
                (Some(Expected::DeadLetter), [], [_]) => {}
                (expected, found, dead) => {
                    let want = match &expected {
                        Some(Expected::Event(e)) => format!("{e:?}"),
                        Some(Expected::DeadLetter) => "a dead letter".to_owned(),
                        None => "one event".to_owned(),
                    };
                    violations.push(format!(
                        "command {seq} of {order}: expected {want}, found {} event(s) {:?} and {} dead letter(s)",
                        found.len(),
                        found.iter().map(|(at, _, e)| (at, e)).collect::<Vec<_>>(),
                        dead.len()
                    ));
                    if let Some(Expected::Event(want)) = expected {
                        match found.first() {
                            Some((_, _, Some(got))) => Order::apply(&mut state, got),
                            _ => Order::apply(&mut state, &want),
                        }
                    }
                }
            }
        }
    }
    let mut orphans: Vec<_> =
        events
            .into_iter()
            .flat_map(|(seq, found)| {
                found
                    .into_iter()
                    .map(move |(at, order, _)| (at, seq, order))
            })
            .chain(dead.into_iter().flat_map(|(seq, found)| {
                found.into_iter().map(move |(at, order)| (at, seq, order))
            }))
            .collect();
    orphans.sort();
    for (at, seq, order) in orphans {
        violations.push(format!(
            "journal record {at} of {order} answers command {seq}, which was never sent"
        ));
    }
    report.violations = violations;
    report
}

/// Options of a verification against a server.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// How long to wait for every partition to be quiet (nothing pending, nothing
    /// unacknowledged) before checking.
    pub settle: Duration,
}

/// Waits (bounded) until the system is quiet, reads both streams and [`check`]s them.
///
/// # Errors
/// If the streams cannot be read. Violations are in the report, not errors.
pub async fn run(client: Client, options: &VerifyOptions) -> anyhow::Result<Report> {
    crate::order::require_streams(&async_nats::jetstream::new(client.clone())).await?;
    let admin = Admin::new(client.clone(), ENTITY_TYPE);
    let partitions = settle(&admin, options.settle).await?;
    let js = async_nats::jetstream::new(client);
    let commands = read_stream(&js, COMMAND_STREAM, &format!("{ENTITY_TYPE}.cmd.>"))
        .await?
        .into_iter()
        .filter_map(|m| {
            let tokens: Vec<&str> = m.subject.split('.').collect();
            let [_, _, partition, order] = tokens[..] else {
                return None;
            };
            Some(StoredCommand {
                seq: m.seq,
                partition: partition.parse().ok()?,
                order: order.to_owned(),
                payload: m.payload,
            })
        })
        .collect::<Vec<_>>();
    let journal = read_stream(&js, JOURNAL_STREAM, &format!("{ENTITY_TYPE}.>"))
        .await?
        .into_iter()
        .filter_map(journal_record)
        .collect::<Vec<_>>();
    let mut report = check(partitions, &commands, &journal);
    if partitions == 0 {
        report
            .violations
            .push("no partition consumers found".to_owned());
    }
    Ok(report)
}

/// Waits until no partition has commands pending or unacknowledged, for at most `within`.
/// Returns the partition count. Not being quiet in time is not an error: the commands still in
/// flight then show as missing outcomes.
async fn settle(admin: &Admin, within: Duration) -> anyhow::Result<u32> {
    let started = Instant::now();
    loop {
        let overview = admin
            .overview()
            .await
            .context("reading the partitions (is the server up, and has a node run?)")?;
        let pending: u64 = overview.iter().map(|p| p.pending).sum();
        let unacked: usize = overview.iter().map(|p| p.ack_pending).sum();
        if pending == 0 && unacked == 0 {
            return Ok(overview.len() as u32);
        }
        if started.elapsed() >= within {
            tracing::warn!(
                pending,
                unacked,
                "the partitions are not quiet after {within:?}; checking anyway"
            );
            return Ok(overview.len() as u32);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One message read back from a stream.
pub(crate) struct ReadMessage {
    seq: u64,
    subject: String,
    headers: async_nats::HeaderMap,
    payload: Bytes,
}

/// Reads every message of `stream` on `filter`, in order, with an ordered consumer.
async fn read_stream(
    js: &async_nats::jetstream::Context,
    stream: &str,
    filter: &str,
) -> anyhow::Result<Vec<ReadMessage>> {
    let handle = js
        .get_stream_no_info(stream)
        .await
        .with_context(|| format!("open stream {stream}"))?;
    let consumer = handle
        .create_consumer(pull::OrderedConfig {
            filter_subject: filter.to_owned(),
            ..Default::default()
        })
        .await
        .with_context(|| format!("read {stream}"))?;
    let mut read = Vec::new();
    if consumer.cached_info().num_pending == 0 {
        return Ok(read);
    }
    let mut messages = consumer
        .messages()
        .await
        .with_context(|| format!("read {stream}"))?;
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .with_context(|| format!("reading {stream} stalled for 10 s"))?
            .with_context(|| format!("{stream} ended early"))?
            .map_err(|e| anyhow::anyhow!("read {stream}: {e}"))?;
        let info = message
            .info()
            .map_err(|e| anyhow::anyhow!("read {stream}: {e}"))?;
        let (seq, pending) = (info.stream_sequence, info.pending);
        read.push(ReadMessage {
            seq,
            subject: message.subject.to_string(),
            headers: message.headers.clone().unwrap_or_default(),
            payload: message.payload.clone(),
        });
        if pending == 0 {
            return Ok(read);
        }
    }
}

fn journal_record(m: ReadMessage) -> Option<JournalRecord> {
    let header = |name: &str| {
        m.headers
            .get(name)
            .and_then(|v| v.as_str().trim().parse::<u64>().ok())
    };
    let tokens: Vec<&str> = m.subject.split('.').collect();
    let partition = tokens.get(2)?.parse().ok()?;
    let kind = match tokens[1] {
        "evt" => RecordKind::Event {
            order: (*tokens.get(3)?).to_owned(),
            command_seq: header(wire::HDR_COMMAND_SEQ),
            payload: m.payload.clone(),
        },
        "fence" => RecordKind::Fence(
            FenceRecord::decode(&m.headers, &m.payload).map_err(|e| e.to_string()),
        ),
        "dlq" => RecordKind::DeadLetter {
            order: m
                .headers
                .get(wire::HDR_ENTITY)
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default(),
            command_seq: header(wire::HDR_COMMAND_SEQ),
            reason: m
                .headers
                .get(wire::HDR_REASON)
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default(),
        },
        _ => return None,
    };
    Some(JournalRecord {
        seq: m.seq,
        partition,
        generation: header(wire::HDR_GENERATION),
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::order::OrderCommand;

    const PARTITIONS: u32 = 4;

    /// Builds matching streams: commands, and a journal as a correct system would write it.
    struct World {
        commands: Vec<StoredCommand>,
        journal: Vec<JournalRecord>,
        seq: u64,
        states: HashMap<String, OrderState>,
        generation: HashMap<u32, u64>,
    }

    impl World {
        fn new() -> Self {
            Self {
                commands: vec![],
                journal: vec![],
                seq: 0,
                states: HashMap::new(),
                generation: HashMap::new(),
            }
        }

        fn partition(order: &str) -> u32 {
            partition_of(&EntityId::new(order).unwrap(), PARTITIONS)
        }

        fn claim(&mut self, partition: u32, node: &str) {
            let generation = self.generation.entry(partition).or_default();
            *generation += 1;
            self.journal.push(JournalRecord {
                seq: self.journal.len() as u64 + 1,
                partition,
                generation: Some(*generation),
                kind: RecordKind::Fence(Ok(FenceRecord::new(partition, *generation, node))),
            });
        }

        /// Sends a command and returns its sequence, without processing it.
        fn send(&mut self, order: &str, body: &[u8]) -> u64 {
            self.seq += 1;
            self.commands.push(StoredCommand {
                seq: self.seq,
                partition: Self::partition(order),
                order: order.to_owned(),
                payload: Bytes::copy_from_slice(body),
            });
            self.seq
        }

        fn event(&mut self, order: &str, seq: u64, event: &OrderEvent) {
            let partition = Self::partition(order);
            self.journal.push(JournalRecord {
                seq: self.journal.len() as u64 + 1,
                partition,
                generation: self.generation.get(&partition).copied(),
                kind: RecordKind::Event {
                    order: order.to_owned(),
                    command_seq: Some(seq),
                    payload: Codec::Json.encode(event).unwrap().into(),
                },
            });
        }

        /// Sends a command and processes it as jetshard would.
        fn process(&mut self, order: &str, command: OrderCommand) -> u64 {
            let seq = self.send(order, &Codec::Json.encode(&command).unwrap());
            let state = self.states.entry(order.to_owned()).or_default();
            let Ok(events) = Order::decide(state, command);
            for event in &events {
                Order::apply(state, event);
            }
            for event in events {
                self.event(order, seq, &event);
            }
            seq
        }

        fn malformed(&mut self, order: &str) -> u64 {
            let seq = self.send(order, b"junk");
            let partition = Self::partition(order);
            self.journal.push(JournalRecord {
                seq: self.journal.len() as u64 + 1,
                partition,
                generation: self.generation.get(&partition).copied(),
                kind: RecordKind::DeadLetter {
                    order: order.to_owned(),
                    command_seq: Some(seq),
                    reason: "malformed".into(),
                },
            });
            seq
        }

        fn check(&self) -> Report {
            check(PARTITIONS, &self.commands, &self.journal)
        }
    }

    fn healthy() -> World {
        let mut w = World::new();
        for p in 0..PARTITIONS {
            w.claim(p, "a");
        }
        for o in ["o-1", "o-2", "o-3"] {
            w.process(
                o,
                OrderCommand::Place {
                    customer: "c".into(),
                },
            );
            w.process(
                o,
                OrderCommand::AddItem {
                    sku: "s".into(),
                    qty: 2,
                    price_cents: 50,
                },
            );
        }
        w.malformed("o-2");
        w.process("o-1", OrderCommand::Ship);
        for p in 0..PARTITIONS {
            w.claim(p, "b");
        }
        w.process("o-1", OrderCommand::Pay { amount_cents: 100 });
        w.process("o-1", OrderCommand::Ship);
        w
    }

    #[test]
    fn a_correct_journal_has_no_violation() {
        let report = healthy().check();
        assert!(report.violations.is_empty(), "{report}");
        assert_eq!(report.commands, 10);
        assert_eq!(report.orders, 3);
        assert_eq!(report.dead_letters, 1);
        assert_eq!(report.events["Rejected"], 1);
        assert_eq!(report.takeovers(), PARTITIONS as usize);
    }

    #[test]
    fn a_command_without_outcome_is_a_violation() {
        let mut w = healthy();
        w.send("o-3", br#"{"type":"Cancel"}"#);
        let report = w.check();
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("found 0 event(s)"));
    }

    #[test]
    fn a_command_applied_twice_is_a_violation() {
        let mut w = healthy();
        let seq = w.process("o-3", OrderCommand::Cancel);
        w.event("o-3", seq, &OrderEvent::Cancelled);
        let report = w.check();
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("found 2 event(s)"));
    }

    #[test]
    fn an_event_the_rules_would_not_give_is_a_violation_reported_once() {
        let mut w = healthy();
        let seq = w.send("o-3", br#"{"type":"Ship"}"#);
        // An unpaid order shipped (as if commands were applied out of order).
        w.event("o-3", seq, &OrderEvent::Shipped);
        if let Some(state) = w.states.get_mut("o-3") {
            Order::apply(state, &OrderEvent::Shipped);
        }
        // The next command is decided on the state the journal gives (shipped): not an error.
        w.process("o-3", OrderCommand::Cancel);
        let report = w.check();
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("the rules say Rejected"));
    }

    #[test]
    fn an_event_for_another_order_or_a_command_never_sent_is_a_violation() {
        let mut w = healthy();
        // Command 1 is o-1's.
        w.event("o-2", 1, &OrderEvent::Cancelled);
        let report = w.check();
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("filed under o-2")),
            "{report}"
        );
        let mut w = healthy();
        w.event("o-2", 0, &OrderEvent::Cancelled);
        let report = w.check();
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("which was never sent"));
    }

    #[test]
    fn a_write_by_a_stale_generation_is_a_violation() {
        let mut w = healthy();
        let p = World::partition("o-3");
        // The partition moves on; then the old owner's write lands.
        w.claim(p, "c");
        *w.generation.get_mut(&p).unwrap() -= 1;
        w.process("o-3", OrderCommand::Cancel);
        let report = w.check();
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("a stale owner wrote"));
    }

    #[test]
    fn a_generation_skipped_or_claimed_twice_is_a_violation() {
        let mut w = healthy();
        w.claim(0, "c");
        *w.generation.get_mut(&0).unwrap() -= 1;
        w.claim(0, "d");
        let report = w.check();
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("claims generation"));
    }

    #[test]
    fn a_malformed_command_must_be_dead_lettered_not_answered() {
        let mut w = healthy();
        let seq = w.send("o-3", b"junk");
        w.event(
            "o-3",
            seq,
            &OrderEvent::Rejected {
                reason: "junk".into(),
            },
        );
        let report = w.check();
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("expected a dead letter"));
    }

    #[test]
    fn a_command_in_the_wrong_partition_is_a_violation() {
        let mut w = healthy();
        w.commands[0].partition = (w.commands[0].partition + 1) % PARTITIONS;
        let report = w.check();
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("belongs to partition")),
            "{report}"
        );
    }
}
