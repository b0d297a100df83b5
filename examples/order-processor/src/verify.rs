//! `verify`: holds the journal against every command ever sent.
//!
//! The example keeps its commands after acknowledgement (limits retention), so `ORDER_CMD` is a
//! complete record of what clients asked, and `ORDER_JOURNAL` of what the system did (and with
//! `--inventory`, `INVENTORY_CMD` and `INVENTORY_JOURNAL` the same for the inventory). `verify`
//! reads them (ordered consumers, from the start) and checks, for each entity type:
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

/// What one command should have left, per the model.
enum Expected<Ev> {
    Event(Decision<Ev>),
    DeadLetter,
    /// A timer's command dropped (not armed under its setting), and why.
    Nothing(String),
}

/// How an armed timer ended, for the words of a violation.
#[derive(Debug, Clone)]
enum Disarmed {
    Fired(u64),
    Cancelled(u64, &'static str),
    Replaced(u64),
}

impl fmt::Display for Disarmed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Disarmed::Fired(seq) => write!(f, "fired at command {seq} already"),
            Disarmed::Cancelled(seq, kind) => write!(f, "was cancelled by command {seq} ({kind})"),
            Disarmed::Replaced(seq) => write!(f, "was set again by command {seq}"),
        }
    }
}

/// One entity type replayed through its rules.
struct Replayed<R: Rules> {
    summary: Summary,
    /// The state of each entity at the end.
    states: BTreeMap<String, R::State>,
    /// The messages decided.
    sent: Sent,
    /// Armed timers at the end: (entity, name) -> set sequence.
    armed: BTreeMap<(String, String), u64>,
    timers: TimerSummary,
}

/// The outcomes found in a journal for each command: events and dead letters, by command seq.
#[derive(Default)]
struct Outcomes<Ev> {
    events: HashMap<u64, Vec<(u64, String, Option<Ev>)>>,
    dead: HashMap<u64, Vec<(u64, String)>>,
}

/// Checks the streams of the orders and (with `--inventory`) of the inventory, at `now_ms`
/// (unix ms: a timer due before it should have fired). See the module docs. Pure.
pub fn check(
    partitions: u32,
    features: &Features,
    orders: &Recorded,
    inventory: &Recorded,
    now_ms: u64,
) -> Report {
    let mut report = Report {
        features: *features,
        ..Report::default()
    };
    let mut violations = Vec::new();
    let mut unsettled = Vec::new();
    let o = replay::<Order>(
        partitions,
        features,
        orders,
        &mut violations,
        &mut unsettled,
    );
    let i = replay::<Inventory>(
        partitions,
        features,
        inventory,
        &mut violations,
        &mut unsettled,
    );
    check_timers(
        &o,
        orders,
        now_ms,
        &mut violations,
        &mut unsettled,
        &mut report,
    );
    report.stored_again = check_outbox(
        &[
            (order::ENTITY_TYPE, &o.sent, orders),
            (inventory::ENTITY_TYPE, &i.sent, inventory),
        ],
        &mut violations,
        &mut unsettled,
    );
    if features.inventory {
        check_saga(
            &o.states,
            &i.states,
            inventory,
            &mut violations,
            &mut unsettled,
        );
    }
    report.orders = o.summary;
    report.inventory = i.summary;
    report.violations = violations;
    report.unsettled = unsettled;
    report
}

/// Checks placement, outcomes, fencing and the sequential model of one entity type (1-4 of
/// the module docs), and returns what the model decided.
fn replay<R: Rules>(
    partitions: u32,
    features: &Features,
    recorded: &Recorded,
    violations: &mut Vec<String>,
    unsettled: &mut Vec<String>,
) -> Replayed<R>
where
    R::Event: PartialEq + fmt::Debug,
{
    let t = R::ENTITY_TYPE;
    let mut summary = Summary {
        commands: recorded.commands.len(),
        ..Summary::default()
    };
    let last_command = recorded.commands.iter().map(|c| c.seq).max().unwrap_or(0);
    let mut found = fences_and_outcomes::<R>(recorded, last_command, &mut summary, violations);

    let mut replayed = Replayed::<R> {
        summary: Summary::default(),
        states: BTreeMap::new(),
        sent: Vec::new(),
        armed: BTreeMap::new(),
        timers: TimerSummary::default(),
    };
    let mut disarmed: HashMap<(String, String, u64), Disarmed> = HashMap::new();
    let mut by_entity: BTreeMap<&str, Vec<&StoredCommand>> = BTreeMap::new();
    for command in &recorded.commands {
        by_entity.entry(&command.entity).or_default().push(command);
    }
    summary.entities = by_entity.len();
    for (id, mut list) in by_entity {
        list.sort_by_key(|c| c.seq);
        if let Ok(valid) = EntityId::new(id) {
            let home = partition_of(&valid, partitions);
            for c in list.iter().filter(|c| c.partition != home) {
                violations.push(format!(
                    "{t} command {} of {id} is stored in partition {}, but {id} belongs to partition {home}",
                    c.seq, c.partition
                ));
            }
        }
        let mut state = R::State::default();
        for command in list {
            let seq = command.seq;
            // A timer's command is decided only while its timer is armed under its setting.
            let stale = command.timer.as_ref().and_then(|(name, set_seq)| {
                let key = (id.to_owned(), name.clone());
                if replayed.armed.get(&key) == Some(set_seq) {
                    replayed.armed.remove(&key);
                    return None;
                }
                let why = match disarmed.get(&(id.to_owned(), name.clone(), *set_seq)) {
                    Some(how) => how.to_string(),
                    None => "was never set".to_owned(),
                };
                Some(format!(
                    "the timer {name:?} set by command {set_seq}, which {why}"
                ))
            });
            let firing = command.timer.is_some() && stale.is_none();
            let expected = match stale {
                Some(why) => Expected::Nothing(why),
                None => match Codec::Json.decode(&command.payload) {
                    Ok(decoded) => Expected::Event(R::decision(features, id, &state, decoded)),
                    Err(_) => Expected::DeadLetter,
                },
            };
            if command.timer.is_some() && !firing {
                replayed.timers.dropped += 1;
            }
            if firing {
                let (name, set_seq) = command.timer.clone().unwrap_or_default();
                disarmed.insert((id.to_owned(), name, set_seq), Disarmed::Fired(seq));
                replayed.timers.fired += 1;
            }
            let found_events = found.events.remove(&seq).unwrap_or_default();
            let found_dead = found.dead.remove(&seq).unwrap_or_default();
            for (at, other) in found_events
                .iter()
                .map(|(at, o, _)| (at, o))
                .chain(found_dead.iter().map(|(at, o)| (at, o)))
                .filter(|(_, o)| o.as_str() != id)
            {
                violations.push(format!(
                    "journal record {at} answers {t} command {seq} of {id} but is filed under {other}"
                ));
            }
            let got = match (&expected, found_events.as_slice(), found_dead.as_slice()) {
                (Expected::Event(want), [(_, _, got)], []) => {
                    if let Some(got) = got
                        && *got != want.event
                    {
                        violations.push(format!(
                            "{t} command {seq} of {id}: the rules say {:?}, the journal has {got:?}",
                            want.event
                        ));
                    }
                    got.as_ref()
                }
                (Expected::DeadLetter, [], [_]) | (Expected::Nothing(_), [], []) => None,
                (Expected::Event(_) | Expected::DeadLetter, [], []) => {
                    // Not decided yet, as far as the journal says: nothing of it happened.
                    unsettled.push(format!("{t} command {seq} of {id} has no outcome yet"));
                    continue;
                }
                (Expected::Nothing(why), found, _) => {
                    violations.push(format!(
                        "{t} command {seq} of {id} is {why}: it must not be decided, yet the journal has {:?}",
                        found.iter().map(|(at, _, e)| (at, e)).collect::<Vec<_>>()
                    ));
                    found.first().and_then(|(_, _, e)| e.as_ref())
                }
                (expected, found, dead) => {
                    let want = match expected {
                        Expected::Event(d) => format!("{:?}", d.event),
                        _ => "a dead letter".to_owned(),
                    };
                    violations.push(format!(
                        "{t} command {seq} of {id}: expected {want}, found {} event(s) {:?} and {} dead letter(s)",
                        found.len(),
                        found.iter().map(|(at, _, e)| (at, e)).collect::<Vec<_>>(),
                        dead.len()
                    ));
                    found.first().and_then(|(_, _, e)| e.as_ref())
                }
            };
            let Expected::Event(decision) = expected else {
                if let Some(got) = got {
                    R::apply(&mut state, got);
                }
                continue;
            };
            // Follow the journal, so that one divergence is reported once.
            R::apply(&mut state, got.unwrap_or(&decision.event));
            let kind = R::kind(&decision.event);
            for (index, message) in decision.messages.into_iter().enumerate() {
                replayed.sent.push((seq, index, message));
            }
            for timer in decision.timers {
                match timer {
                    Timer::Set { name, .. } => {
                        let key = (id.to_owned(), name.to_owned());
                        if let Some(old) = replayed.armed.insert(key, seq) {
                            disarmed.insert(
                                (id.to_owned(), name.to_owned(), old),
                                Disarmed::Replaced(seq),
                            );
                        }
                        replayed.timers.set += 1;
                    }
                    Timer::Cancel { name } => {
                        if let Some(old) = replayed.armed.remove(&(id.to_owned(), name.to_owned()))
                        {
                            disarmed.insert(
                                (id.to_owned(), name.to_owned(), old),
                                Disarmed::Cancelled(seq, kind),
                            );
                            replayed.timers.cancelled += 1;
                        }
                    }
                }
            }
        }
        replayed.states.insert(id.to_owned(), state);
    }
    let mut orphans: Vec<_> = found
        .events
        .into_iter()
        .flat_map(|(seq, f)| f.into_iter().map(move |(at, id, _)| (at, seq, id)))
        .chain(
            found
                .dead
                .into_iter()
                .flat_map(|(seq, f)| f.into_iter().map(move |(at, id)| (at, seq, id))),
        )
        .collect();
    orphans.sort();
    for (at, seq, id) in orphans {
        violations.push(format!(
            "journal record {at} of {t} {id} answers command {seq}, which was never sent"
        ));
    }
    replayed.summary = summary;
    replayed
}

/// Checks fencing (4 of the module docs) and gathers each command's outcomes.
fn fences_and_outcomes<R: Rules>(
    recorded: &Recorded,
    last_command: u64,
    summary: &mut Summary,
    violations: &mut Vec<String>,
) -> Outcomes<R::Event> {
    let t = R::ENTITY_TYPE;
    let mut latest_fence: HashMap<u32, u64> = HashMap::new();
    let mut found = Outcomes::<R::Event> {
        events: HashMap::new(),
        dead: HashMap::new(),
    };
    for record in &recorded.journal {
        let fence = latest_fence.get(&record.partition).copied().unwrap_or(0);
        match &record.kind {
            RecordKind::Fence(Ok(claim)) => {
                if record.generation != Some(fence + 1) {
                    violations.push(format!(
                        "{t} fence record {} of partition {} claims generation {:?} after generation {fence}",
                        record.seq, record.partition, record.generation
                    ));
                }
                if claim.partition != record.partition {
                    violations.push(format!(
                        "{t} fence record {} on partition {} names partition {}",
                        record.seq, record.partition, claim.partition
                    ));
                }
                latest_fence.insert(record.partition, claim.generation);
                summary
                    .generations
                    .entry(record.partition)
                    .or_default()
                    .push((claim.generation, claim.node.clone()));
                continue;
            }
            RecordKind::Fence(Err(e)) => {
                violations.push(format!(
                    "{t} fence record {} is unreadable: {e}",
                    record.seq
                ));
                continue;
            }
            _ => {}
        }
        if record.generation != Some(fence) {
            violations.push(format!(
                "{t} journal record {} of partition {} was written by generation {:?}, but the partition's latest fence before it is generation {fence}: a stale owner wrote",
                record.seq, record.partition, record.generation
            ));
        }
        match &record.kind {
            RecordKind::Event {
                entity,
                command_seq,
                payload,
            } => {
                let event = Codec::Json.decode::<R::Event>(payload).ok();
                match &event {
                    Some(e) => *summary.events.entry(R::kind(e)).or_default() += 1,
                    None => violations.push(format!(
                        "event {} of {entity} is not a {t} event: {}",
                        record.seq,
                        String::from_utf8_lossy(payload)
                    )),
                }
                match command_seq {
                    Some(seq) if *seq > last_command => {}
                    Some(seq) => found.events.entry(*seq).or_default().push((
                        record.seq,
                        entity.clone(),
                        event,
                    )),
                    None => violations.push(format!(
                        "event {} of {t} {entity} names no command",
                        record.seq
                    )),
                }
            }
            RecordKind::DeadLetter {
                entity,
                command_seq,
                ..
            } => {
                summary.dead_letters += 1;
                match command_seq {
                    Some(seq) if *seq > last_command => {}
                    Some(seq) => found
                        .dead
                        .entry(*seq)
                        .or_default()
                        .push((record.seq, entity.clone())),
                    None => violations.push(format!(
                        "dead letter {} of {t} {entity} names no command",
                        record.seq
                    )),
                }
            }
            RecordKind::Fence(_) | RecordKind::Timer { .. } | RecordKind::Outbox => {}
        }
    }
    found
}

/// The timer checks (7 of the module docs) on the orders' replay.
fn check_timers(
    orders: &Replayed<Order>,
    recorded: &Recorded,
    now_ms: u64,
    violations: &mut Vec<String>,
    unsettled: &mut Vec<String>,
    report: &mut Report,
) {
    let mut due: HashMap<(&str, &str, u64), u64> = HashMap::new();
    let mut fired: BTreeMap<(&str, &str, u64), Vec<u64>> = BTreeMap::new();
    for record in &recorded.journal {
        let RecordKind::Timer {
            entity,
            name,
            command_seq,
            op,
        } = &record.kind
        else {
            continue;
        };
        match op {
            TimerOp::Set { due_ms } => {
                if let Some(seq) = command_seq {
                    due.insert((entity, name, *seq), *due_ms);
                }
            }
            TimerOp::Fired { set_seq } => fired
                .entry((entity, name, *set_seq))
                .or_default()
                .push(record.seq),
            TimerOp::Cancel => {}
        }
    }
    for ((entity, name, set_seq), records) in fired {
        if records.len() > 1 {
            violations.push(format!(
                "the timer {name:?} of order {entity} set by command {set_seq} fired {} times (journal records {records:?})",
                records.len()
            ));
        }
    }
    let mut timers = orders.timers.clone();
    for ((entity, name), set_seq) in &orders.armed {
        let Some(due_ms) = due.get(&(entity.as_str(), name.as_str(), *set_seq)) else {
            unsettled.push(format!(
                "the timer {name:?} of order {entity} set by command {set_seq} has no set record (yet)"
            ));
            continue;
        };
        if *due_ms <= now_ms {
            unsettled.push(format!(
                "the timer {name:?} of order {entity} set by command {set_seq} was due {} ms ago and has not fired",
                now_ms - due_ms
            ));
        }
        timers.armed_due_ms.push(*due_ms);
    }
    timers.armed_due_ms.sort_unstable();
    report.timers = timers;
}

/// The messages a model decided: (command seq, index within the command, message).
type Sent = Vec<(u64, usize, Message)>;

/// The outbox check (5 of the module docs): `sources` are each entity type with the messages
/// its model sent and its own streams (where the messages to it are stored). Returns how many
/// messages were stored more than once.
fn check_outbox(
    sources: &[(&str, &Sent, &Recorded)],
    violations: &mut Vec<String>,
    unsettled: &mut Vec<String>,
) -> usize {
    // Every stored command that came from an outbox, by its msg id.
    let mut stored: HashMap<&str, Vec<(&str, &StoredCommand)>> = HashMap::new();
    for (t, _, recorded) in sources {
        for command in &recorded.commands {
            if let Some(id) = command.msg_id.as_deref().filter(|id| is_outbox_msg_id(id)) {
                stored.entry(id).or_default().push((t, command));
            }
        }
    }
    let mut stored_again = 0;
    for (t, sent, _) in sources {
        for (seq, index, message) in sent.iter() {
            let msg_id = format!("{t}:{seq}:out:{index}");
            let Some(copies) = stored.remove(msg_id.as_str()) else {
                unsettled.push(format!(
                    "message {index} of {t} command {seq} (to {} {}) is not stored",
                    message.entity_type(),
                    message.id()
                ));
                continue;
            };
            stored_again += copies.len() - 1;
            for (target, command) in copies {
                if target != message.entity_type()
                    || command.entity != message.id()
                    || command.payload[..] != message.body()[..]
                {
                    violations.push(format!(
                        "{target} command {} of {} ({msg_id}) is not the message {t} command {seq} sent: {message:?}",
                        command.seq, command.entity
                    ));
                }
            }
        }
    }
    let mut phantoms: Vec<_> = stored.into_iter().collect();
    phantoms.sort_by_key(|(id, _)| *id);
    for (msg_id, copies) in phantoms {
        for (target, command) in copies {
            violations.push(format!(
                "{target} command {} of {} claims to be outbox message {msg_id}, which no command sent",
                command.seq, command.entity
            ));
        }
    }
    stored_again
}

/// `<t>:<seq>:out:<i>`.
fn is_outbox_msg_id(id: &str) -> bool {
    let parts: Vec<&str> = id.split(':').collect();
    matches!(parts[..], [_, seq, "out", index] if seq.parse::<u64>().is_ok() && index.parse::<u64>().is_ok())
}

/// The saga checks (6 of the module docs), on the models' end states.
fn check_saga(
    orders: &BTreeMap<String, OrderState>,
    products: &BTreeMap<String, InventoryState>,
    inventory: &Recorded,
    violations: &mut Vec<String>,
    unsettled: &mut Vec<String>,
) {
    // No line reserved twice, by the journal as written.
    let mut reserved: BTreeMap<(String, u32), Vec<(u64, String)>> = BTreeMap::new();
    for record in &inventory.journal {
        if let RecordKind::Event {
            entity, payload, ..
        } = &record.kind
            && let Ok(InventoryEvent::Reserved { order, line, .. }) = Codec::Json.decode(payload)
        {
            reserved
                .entry((order, line))
                .or_default()
                .push((record.seq, entity.clone()));
        }
    }
    for ((order, line), records) in &reserved {
        if records.len() > 1 {
            violations.push(format!(
                "line {line} of order {order} was reserved {} times (inventory journal records {records:?})",
                records.len()
            ));
        }
    }
    // Every item answered; the holds are the reserved items of the orders still standing.
    let mut expected: BTreeMap<(String, u32), (String, u32)> = BTreeMap::new();
    for (id, order) in orders {
        for (line, item) in (0u32..).zip(&order.items) {
            if item.stock == Stock::Unconfirmed {
                unsettled.push(format!(
                    "line {line} of order {id} ({}) has no answer from the inventory",
                    item.sku
                ));
            }
        }
        if order.phase != Phase::Cancelled {
            for (line, item) in order.reserved() {
                expected.insert((id.clone(), line), (item.sku.clone(), item.qty));
            }
        }
    }
    for (sku, product) in products {
        let held: u32 = product.holds.iter().map(|h| h.qty).sum();
        if held > STOCK {
            violations.push(format!(
                "{sku} holds {held} units, more than its stock of {STOCK}"
            ));
        }
        for hold in &product.holds {
            let key = (hold.order.clone(), hold.line);
            match expected.remove(&key) {
                Some((want_sku, qty)) if want_sku == *sku && qty == hold.qty => {}
                Some(want) => violations.push(format!(
                    "{sku} holds {} of line {} of order {}, which reserved {want:?}",
                    hold.qty, hold.line, hold.order
                )),
                None => unsettled.push(format!(
                    "{sku} holds {} for line {} of order {}, which is cancelled or holds no such line: not released",
                    hold.qty, hold.line, hold.order
                )),
            }
        }
    }
    for ((order, line), (sku, qty)) in expected {
        unsettled.push(format!(
            "line {line} of order {order} is reserved ({qty} of {sku}), but {sku} does not hold it: lost"
        ));
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
        for stream in [commands, journal] {
            js.get_stream(*stream).await.map_err(|e| {
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
        for ((t, _, _), recorded) in types.iter().zip(&mut recorded) {
            recorded.journal = JournalReader::open(&js, t)
                .await?
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

fn unix_ms_now() -> u64 {
    u64::try_from(crate::nodes::unix_ms()).unwrap_or(u64::MAX)
}

/// Reads every command of an entity type's command stream.
async fn read_commands(
    js: &async_nats::jetstream::Context,
    stream: &str,
    entity_type: &str,
) -> anyhow::Result<Vec<StoredCommand>> {
    Ok(read_stream(js, stream, &format!("{entity_type}.cmd.>"))
        .await?
        .into_iter()
        .filter_map(|m| {
            // A wake-up carries nothing for any entity: its owner acknowledges it, no more.
            if m.headers.get(wire::HDR_WAKE).is_some() {
                return None;
            }
            let tokens: Vec<&str> = m.subject.split('.').collect();
            let [_, _, partition, entity] = tokens[..] else {
                return None;
            };
            let header = |name: &str| m.headers.get(name).map(|v| v.as_str().to_owned());
            let timer = header(wire::HDR_TIMER)
                .zip(header(wire::HDR_TIMER_SET).and_then(|s| s.trim().parse::<u64>().ok()));
            Some(StoredCommand {
                seq: m.seq,
                partition: partition.parse().ok()?,
                entity: entity.to_owned(),
                msg_id: header(wire::HDR_MSG_ID),
                timer,
                payload: m.payload,
            })
        })
        .collect())
}

/// Waits until no partition has commands pending or unacknowledged, until `deadline` at most.
/// Returns the partition count. Not being quiet in time is not an error: the commands still in
/// flight then show as missing outcomes.
async fn settle(admin: &Admin, deadline: Instant) -> anyhow::Result<u32> {
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
        if Instant::now() >= deadline {
            tracing::warn!(
                pending,
                unacked,
                "the partitions are not quiet in the settle time; checking anyway"
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

/// Reads every message of a command stream `stream` on `filter`, in order, with an ordered
/// consumer (journals are read with jetshard's [`JournalReader`]).
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

/// The checks' view of a record read with jetshard's [`JournalReader`]; `None` for what they
/// do not look at (snapshots, unpin records, subjects outside the contract, timer records
/// without their name or operation, a partition token that is not a number).
fn journal_record(record: jetshard::JournalRecord) -> Option<JournalRecord> {
    use jetshard::RecordKind as Read;
    let command_seq = record.command_seq;
    let kind = match record.kind {
        Read::Event {
            entity, payload, ..
        } => RecordKind::Event {
            entity,
            command_seq,
            payload,
        },
        Read::Fence(fence) => RecordKind::Fence(fence.map_err(|e| e.to_string())),
        Read::DeadLetter { entity, reason, .. } => RecordKind::DeadLetter {
            entity: entity.unwrap_or_default(),
            command_seq,
            reason: reason.unwrap_or_default(),
        },
        Read::Timer {
            entity, name, op, ..
        } => RecordKind::Timer {
            entity,
            name: name?,
            command_seq,
            op: op?,
        },
        Read::Outbox(_) => RecordKind::Outbox,
        _ => return None,
    };
    Some(JournalRecord {
        seq: record.seq,
        partition: record.partition?,
        generation: record.generation,
        kind,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::inventory::InventoryCommand;
    use crate::order::{OrderCommand, OrderEvent, PAYMENT_TIMER};
    use jetshard::Entity;

    const PARTITIONS: u32 = 4;
    /// "Now" for the checks; timers are due before or after it as a test needs.
    const NOW_MS: u64 = 1_000_000;
    const SAGA: Features = Features {
        inventory: true,
        payment_timeout: Some(Duration::from_secs(10)),
    };

    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    enum T {
        Order,
        Inventory,
    }

    /// Builds matching streams: commands, and journals as a correct system would write them.
    struct World {
        features: Features,
        orders: Recorded,
        inventory: Recorded,
        order_states: HashMap<String, OrderState>,
        inventory_states: HashMap<String, InventoryState>,
        generation: HashMap<(T, u32), u64>,
        /// Outbox messages decided and not delivered yet: (source, command seq, index, message).
        outbox: VecDeque<(T, u64, usize, Message)>,
        /// When a timer set now falls due.
        due_ms: u64,
    }

    impl World {
        fn new(features: Features) -> Self {
            let mut w = Self {
                features,
                orders: Recorded::default(),
                inventory: Recorded::default(),
                order_states: HashMap::new(),
                inventory_states: HashMap::new(),
                generation: HashMap::new(),
                outbox: VecDeque::new(),
                due_ms: NOW_MS + 60_000,
            };
            for p in 0..PARTITIONS {
                w.claim(T::Order, p, "a");
                w.claim(T::Inventory, p, "a");
            }
            w
        }

        fn recorded(&mut self, t: T) -> &mut Recorded {
            match t {
                T::Order => &mut self.orders,
                T::Inventory => &mut self.inventory,
            }
        }

        fn partition(id: &str) -> u32 {
            partition_of(&EntityId::new(id).unwrap(), PARTITIONS)
        }

        fn record(&mut self, t: T, partition: u32, kind: RecordKind) {
            let generation = self.generation.get(&(t, partition)).copied();
            let journal = &mut self.recorded(t).journal;
            journal.push(JournalRecord {
                seq: journal.len() as u64 + 1,
                partition,
                generation,
                kind,
            });
        }

        fn claim(&mut self, t: T, partition: u32, node: &str) {
            let generation = self.generation.entry((t, partition)).or_default();
            *generation += 1;
            let claim = FenceRecord::new(partition, *generation, node);
            self.record(t, partition, RecordKind::Fence(Ok(claim)));
        }

        /// Stores a command and returns its sequence, without processing it.
        fn store(
            &mut self,
            t: T,
            id: &str,
            body: &[u8],
            msg_id: Option<String>,
            timer: Option<(String, u64)>,
        ) -> u64 {
            let commands = &mut self.recorded(t).commands;
            let seq = commands.len() as u64 + 1;
            commands.push(StoredCommand {
                seq,
                partition: Self::partition(id),
                entity: id.to_owned(),
                payload: Bytes::copy_from_slice(body),
                msg_id,
                timer,
            });
            seq
        }

        fn event(&mut self, t: T, id: &str, seq: u64, payload: Vec<u8>) {
            let kind = RecordKind::Event {
                entity: id.to_owned(),
                command_seq: Some(seq),
                payload: payload.into(),
            };
            self.record(t, Self::partition(id), kind);
        }

        fn timer_record(&mut self, id: &str, seq: u64, op: TimerOp) {
            let kind = RecordKind::Timer {
                entity: id.to_owned(),
                name: PAYMENT_TIMER.to_owned(),
                command_seq: Some(seq),
                op,
            };
            self.record(T::Order, Self::partition(id), kind);
        }

        /// Processes a stored order command as jetshard would.
        fn decide_order(&mut self, id: &str, seq: u64, command: OrderCommand) {
            let state = self.order_states.entry(id.to_owned()).or_default();
            let decision = Order::decision(&self.features, id, state, command);
            Order::apply(state, &decision.event);
            self.event(
                T::Order,
                id,
                seq,
                Codec::Json.encode(&decision.event).unwrap(),
            );
            for timer in &decision.timers {
                let op = match timer {
                    Timer::Set { .. } => TimerOp::Set {
                        due_ms: self.due_ms,
                    },
                    Timer::Cancel { .. } => TimerOp::Cancel,
                };
                self.timer_record(id, seq, op);
            }
            for (i, m) in decision.messages.into_iter().enumerate() {
                self.outbox.push_back((T::Order, seq, i, m));
            }
        }

        fn decide_inventory(&mut self, sku: &str, seq: u64, command: InventoryCommand) {
            let state = self.inventory_states.entry(sku.to_owned()).or_default();
            let decision = Inventory::decision(state, command);
            Inventory::apply(state, &decision.event);
            let payload = Codec::Json.encode(&decision.event).unwrap();
            self.event(T::Inventory, sku, seq, payload);
            for (i, m) in decision.messages.into_iter().enumerate() {
                self.outbox.push_back((T::Inventory, seq, i, m));
            }
        }

        /// A client sends an order command; it is processed.
        fn order(&mut self, id: &str, command: OrderCommand) -> u64 {
            let seq = self.store(
                T::Order,
                id,
                &Codec::Json.encode(&command).unwrap(),
                None,
                None,
            );
            self.decide_order(id, seq, command);
            seq
        }

        /// Delivers the next outbox message and processes it.
        fn deliver_one(&mut self) {
            let Some((source, seq, index, message)) = self.outbox.pop_front() else {
                return;
            };
            let t = match source {
                T::Order => "order",
                T::Inventory => "inventory",
            };
            let msg_id = Some(format!("{t}:{seq}:out:{index}"));
            match message {
                Message::Inventory { sku, command } => {
                    let body = Codec::Json.encode(&command).unwrap();
                    let at = self.store(T::Inventory, &sku, &body, msg_id, None);
                    self.decide_inventory(&sku, at, command);
                }
                Message::Order { order, command } => {
                    let body = Codec::Json.encode(&command).unwrap();
                    let at = self.store(T::Order, &order, &body, msg_id, None);
                    self.decide_order(&order, at, command);
                }
            }
        }

        /// Delivers every outbox message, and those they cause.
        fn settle(&mut self) {
            while !self.outbox.is_empty() {
                self.deliver_one();
            }
        }

        /// The order's payment timer fires (set by command `set_seq`) and is processed.
        fn fire(&mut self, id: &str, set_seq: u64) -> u64 {
            let body = Codec::Json.encode(&OrderCommand::PaymentDue).unwrap();
            let timer = Some((PAYMENT_TIMER.to_owned(), set_seq));
            let msg_id = Some(format!("order:timer:{id}:{PAYMENT_TIMER}:{set_seq}"));
            let seq = self.store(T::Order, id, &body, msg_id, timer);
            self.decide_order(id, seq, OrderCommand::PaymentDue);
            self.timer_record(id, seq, TimerOp::Fired { set_seq });
            seq
        }

        fn malformed(&mut self, id: &str) -> u64 {
            let seq = self.store(T::Order, id, b"junk", None, None);
            let kind = RecordKind::DeadLetter {
                entity: id.to_owned(),
                command_seq: Some(seq),
                reason: "malformed".into(),
            };
            self.record(T::Order, Self::partition(id), kind);
            seq
        }

        fn check(&self) -> Report {
            check(
                PARTITIONS,
                &self.features,
                &self.orders,
                &self.inventory,
                NOW_MS,
            )
        }
    }

    fn place() -> OrderCommand {
        OrderCommand::Place {
            customer: "c".into(),
        }
    }

    fn add(sku: &str, qty: u32) -> OrderCommand {
        OrderCommand::AddItem {
            sku: sku.into(),
            qty,
            price_cents: 50,
        }
    }

    fn healthy() -> World {
        let mut w = World::new(Features::NONE);
        for o in ["o-1", "o-2", "o-3"] {
            w.order(o, place());
            w.order(o, add("s", 2));
        }
        w.malformed("o-2");
        w.order("o-1", OrderCommand::Ship);
        for p in 0..PARTITIONS {
            w.claim(T::Order, p, "b");
        }
        w.order("o-1", OrderCommand::Pay { amount_cents: 100 });
        w.order("o-1", OrderCommand::Ship);
        w
    }

    #[test]
    fn a_correct_journal_has_no_violation() {
        let report = healthy().check();
        assert!(report.violations.is_empty(), "{report}");
        assert!(report.unsettled.is_empty(), "{report}");
        assert_eq!(report.orders.commands, 10);
        assert_eq!(report.orders.entities, 3);
        assert_eq!(report.orders.dead_letters, 1);
        assert_eq!(report.orders.events["Rejected"], 1);
        assert_eq!(report.takeovers(), PARTITIONS as usize);
    }

    #[test]
    fn a_command_without_outcome_is_unsettled_then_a_violation() {
        let mut w = healthy();
        w.store(T::Order, "o-3", br#"{"type":"Cancel"}"#, None, None);
        let report = w.check();
        assert!(report.violations.is_empty(), "{report}");
        assert_eq!(report.unsettled.len(), 1, "{report}");
        let report = report.finish();
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("has no outcome yet"));
    }

    #[test]
    fn a_command_applied_twice_is_a_violation() {
        let mut w = healthy();
        let seq = w.order("o-3", OrderCommand::Cancel);
        w.event(
            T::Order,
            "o-3",
            seq,
            Codec::Json.encode(&OrderEvent::Cancelled).unwrap(),
        );
        let report = w.check();
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("found 2 event(s)"));
    }

    #[test]
    fn an_event_the_rules_would_not_give_is_a_violation_reported_once() {
        let mut w = healthy();
        let seq = w.store(T::Order, "o-3", br#"{"type":"Ship"}"#, None, None);
        // An unpaid order shipped (as if commands were applied out of order).
        w.event(
            T::Order,
            "o-3",
            seq,
            Codec::Json.encode(&OrderEvent::Shipped).unwrap(),
        );
        if let Some(state) = w.order_states.get_mut("o-3") {
            Order::apply(state, &OrderEvent::Shipped);
        }
        // The next command is decided on the state the journal gives (shipped): not an error.
        w.order("o-3", OrderCommand::Cancel);
        let report = w.check();
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("the rules say Rejected"));
    }

    #[test]
    fn an_event_for_another_order_or_a_command_never_sent_is_a_violation() {
        let mut w = healthy();
        let cancelled = Codec::Json.encode(&OrderEvent::Cancelled).unwrap();
        // Command 1 is o-1's.
        w.event(T::Order, "o-2", 1, cancelled.clone());
        let report = w.check();
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("filed under o-2")),
            "{report}"
        );
        let mut w = healthy();
        w.event(T::Order, "o-2", 0, cancelled);
        let report = w.check();
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("which was never sent"));
    }

    #[test]
    fn a_write_by_a_stale_generation_is_a_violation() {
        let mut w = healthy();
        let p = World::partition("o-3");
        // The partition moves on; then the old owner's write lands.
        w.claim(T::Order, p, "c");
        *w.generation.get_mut(&(T::Order, p)).unwrap() -= 1;
        w.order("o-3", OrderCommand::Cancel);
        let report = w.check();
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("a stale owner wrote"));
    }

    #[test]
    fn a_generation_skipped_or_claimed_twice_is_a_violation() {
        let mut w = healthy();
        w.claim(T::Order, 0, "c");
        *w.generation.get_mut(&(T::Order, 0)).unwrap() -= 1;
        w.claim(T::Order, 0, "d");
        let report = w.check();
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("claims generation"));
    }

    #[test]
    fn a_malformed_command_must_be_dead_lettered_not_answered() {
        let mut w = healthy();
        let seq = w.store(T::Order, "o-3", b"junk", None, None);
        let rejected = OrderEvent::Rejected {
            reason: "junk".into(),
        };
        w.event(T::Order, "o-3", seq, Codec::Json.encode(&rejected).unwrap());
        let report = w.check();
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("expected a dead letter"));
    }

    #[test]
    fn a_command_in_the_wrong_partition_is_a_violation() {
        let mut w = healthy();
        w.orders.commands[0].partition = (w.orders.commands[0].partition + 1) % PARTITIONS;
        let report = w.check();
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("belongs to partition")),
            "{report}"
        );
    }

    /// Orders through the saga and the payment timer: shipped, out of stock, cancelled with
    /// its reservation released, expired by its timer, and one still within its time.
    fn saga() -> World {
        let mut w = World::new(SAGA);
        w.order("ok", place());
        w.order("ok", add("s-1", 2));
        w.order("ok", add("s-2", 1));
        w.settle();
        w.order("ok", OrderCommand::Pay { amount_cents: 150 });
        w.order("ok", OrderCommand::Ship);

        w.order("big", place());
        w.order("big", add("s-1", 1));
        w.order("big", add("s-2", STOCK));
        w.settle();

        w.order("gone", place());
        w.order("gone", add("s-1", 1));
        w.settle();
        w.order("gone", OrderCommand::Cancel);
        w.settle();

        let set = w.order("late", place());
        w.order("late", add("s-3", 1));
        w.settle();
        w.fire("late", set);
        w.settle();

        w.order("open", place());
        w
    }

    #[test]
    fn a_correct_saga_with_timers_has_no_violation() {
        let w = saga();
        let report = w.check();
        assert!(report.violations.is_empty(), "{report}");
        assert!(report.unsettled.is_empty(), "{report}");
        assert_eq!(report.orders.count("Shipped"), 1, "{report}");
        assert_eq!(report.orders.count("ItemUnavailable"), 1, "{report}");
        assert_eq!(report.orders.count("Expired"), 1, "{report}");
        assert_eq!(report.inventory.count("Reserved"), 5, "{report}");
        assert_eq!(report.inventory.count("Released"), 3, "{report}");
        assert_eq!(report.timers.set, 5);
        assert_eq!(report.timers.fired, 1);
        assert_eq!(report.timers.cancelled, 3, "paid, out of stock, cancelled");
        assert_eq!(report.timers.armed_due_ms, [w.due_ms]);
        let holds: u32 = w.inventory_states["s-1"].holds.iter().map(|h| h.qty).sum();
        assert_eq!(holds, 2, "only the shipped order's");
    }

    #[test]
    fn a_reservation_made_twice_is_a_violation() {
        let mut w = saga();
        // The inventory takes a repeat of `ok`'s reservation of line 0 as a new one.
        let seq = w.store(
            T::Inventory,
            "s-1",
            br#"{"type":"Reserve","order":"ok","line":0,"qty":2}"#,
            None,
            None,
        );
        let again = InventoryEvent::Reserved {
            order: "ok".into(),
            line: 0,
            qty: 2,
        };
        w.event(
            T::Inventory,
            "s-1",
            seq,
            Codec::Json.encode(&again).unwrap(),
        );
        let report = w.check().finish();
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("line 0 of order ok was reserved 2 times")),
            "{report}"
        );
    }

    #[test]
    fn a_reservation_never_answered_or_a_message_lost_is_a_violation_once_settled() {
        let mut w = saga();
        w.order("open", add("s-4", 1));
        // The Reserve is never stored in INVENTORY_CMD.
        w.outbox.clear();
        let report = w.check();
        assert!(report.violations.is_empty(), "{report}");
        let report = report.finish();
        assert_eq!(report.violations.len(), 2, "{report}");
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("is not stored"))
        );
        assert!(report.violations.iter().any(|v| v.contains("no answer")));
    }

    #[test]
    fn a_hold_not_released_by_a_cancelled_order_is_a_violation_once_settled() {
        let mut w = saga();
        w.order("ok2", place());
        w.order("ok2", add("s-5", 1));
        w.settle();
        w.order("ok2", OrderCommand::Cancel);
        // The Release is stored, but the inventory never processes it.
        let (_, seq, index, message) = w.outbox.pop_front().unwrap();
        let Message::Inventory { sku, command } = message else {
            panic!("{message:?}");
        };
        let body = Codec::Json.encode(&command).unwrap();
        let msg_id = Some(format!("order:{seq}:out:{index}"));
        let at = w.store(T::Inventory, &sku, &body, msg_id, None);
        let report = w.check().finish();
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("holds 1 for line 0 of order ok2")),
            "{report}"
        );
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains(&format!("inventory command {at} of s-5 has no outcome"))),
            "{report}"
        );
    }

    #[test]
    fn a_message_no_command_sent_is_a_violation() {
        let mut w = saga();
        let body = br#"{"type":"Release","order":"ok","line":0}"#;
        let seq = w.store(
            T::Inventory,
            "s-1",
            body,
            Some("order:999:out:0".into()),
            None,
        );
        w.decide_inventory(
            "s-1",
            seq,
            InventoryCommand::Release {
                order: "ok".into(),
                line: 0,
            },
        );
        let report = w.check().finish();
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("claims to be outbox message order:999:out:0")),
            "{report}"
        );
    }

    #[test]
    fn a_timer_fired_after_payment_is_a_violation() {
        let mut w = saga();
        // `ok` paid, which cancelled its timer (set by its first command, 1); it fires anyway.
        let body = Codec::Json.encode(&OrderCommand::PaymentDue).unwrap();
        let timer = Some((PAYMENT_TIMER.to_owned(), 1));
        let seq = w.store(T::Order, "ok", &body, None, timer);
        let refused = OrderEvent::Rejected {
            reason: "order is Shipped, not open".into(),
        };
        w.event(T::Order, "ok", seq, Codec::Json.encode(&refused).unwrap());
        let report = w.check();
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(
            report.violations[0].contains("was cancelled by command")
                && report.violations[0].contains("(Paid)"),
            "{report}"
        );
    }

    #[test]
    fn a_timer_fired_twice_is_a_violation() {
        let mut w = saga();
        let set = w
            .orders
            .commands
            .iter()
            .find(|c| c.entity == "late")
            .unwrap()
            .seq;
        // The repeat is decided again (and the journal says it fired twice).
        let body = Codec::Json.encode(&OrderCommand::PaymentDue).unwrap();
        let seq = w.store(
            T::Order,
            "late",
            &body,
            None,
            Some((PAYMENT_TIMER.to_owned(), set)),
        );
        let refused = OrderEvent::Rejected {
            reason: "order is Cancelled, not open".into(),
        };
        w.event(T::Order, "late", seq, Codec::Json.encode(&refused).unwrap());
        w.timer_record("late", seq, TimerOp::Fired { set_seq: set });
        let report = w.check();
        assert_eq!(report.violations.len(), 2, "{report}");
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("fired at command"))
        );
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("fired 2 times"))
        );
    }

    #[test]
    fn a_repeated_timer_command_that_is_dropped_is_no_violation() {
        let mut w = saga();
        let set = w
            .orders
            .commands
            .iter()
            .find(|c| c.entity == "late")
            .unwrap()
            .seq;
        let body = Codec::Json.encode(&OrderCommand::PaymentDue).unwrap();
        w.store(
            T::Order,
            "late",
            &body,
            None,
            Some((PAYMENT_TIMER.to_owned(), set)),
        );
        let report = w.check();
        assert!(report.violations.is_empty(), "{report}");
        assert_eq!(report.timers.dropped, 1);
    }

    #[test]
    fn a_due_timer_that_never_fired_is_a_violation_once_settled() {
        let mut w = saga();
        w.due_ms = NOW_MS - 5_000;
        w.order("stuck", place());
        let report = w.check();
        assert!(report.violations.is_empty(), "{report}");
        let report = report.finish();
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("has not fired"), "{report}");
    }

    #[test]
    fn without_features_the_saga_commands_are_never_sent() {
        let mut w = World::new(Features::NONE);
        w.order("o-1", place());
        w.order("o-1", add("s-1", 1));
        assert!(w.outbox.is_empty());
        let report = w.check();
        assert!(report.violations.is_empty(), "{report}");
        assert!(report.unsettled.is_empty(), "{report}");
    }
}
