//! The checks of one entity type's streams: placement, one outcome per command, the sequential model, fencing (1-4 of the module docs).

use super::*;

/// What one command should have left, per the model.
pub(super) enum Expected<Ev> {
    Event(Decision<Ev>),
    DeadLetter,
    /// A timer's command dropped (not armed under its setting), and why.
    Nothing(String),
}

/// How an armed timer ended, for the words of a violation.
#[derive(Debug, Clone)]
pub(super) enum Disarmed {
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
pub(super) struct Replayed<R: Rules> {
    pub(super) summary: Summary,
    /// The state of each entity at the end.
    pub(super) states: BTreeMap<String, R::State>,
    /// The messages decided.
    pub(super) sent: Sent,
    /// Armed timers at the end: (entity, name) -> set sequence.
    pub(super) armed: BTreeMap<(String, String), u64>,
    pub(super) timers: TimerSummary,
}

/// The outcomes found in a journal for each command: events and dead letters, by command seq.
#[derive(Default)]
pub(super) struct Outcomes<Ev> {
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
pub(super) fn replay<R: Rules>(
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
pub(super) fn fences_and_outcomes<R: Rules>(
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
