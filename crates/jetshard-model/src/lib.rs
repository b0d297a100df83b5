//! A model of jetshard's partition ownership protocol, checked with
//! [`stateright`](https://docs.rs/stateright): claim (a fence record published with a
//! compare-and-set), the server's pin (assigned on a delivery, kept by pulls, lapsing after its
//! TTL, moved by an unpin), the crash watch's verdict and its unpin record, hand-off,
//! group-committed fenced writes, acknowledgements, redeliveries and the delivery count that
//! decides when a failing command is given up. Processes crash and stall.
//!
//! What each part stands for in the library, what the model leaves out and how to run it:
//! `docs/MODEL.md`. The checks are the crate's tests (`cargo test -p jetshard-model`).

#![deny(missing_docs)]

use stateright::{Model, Property};

/// Deliberate bugs, each the removal of one safeguard of the protocol. The tests show that each
/// one breaks a property (the checker finds a counterexample).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Bugs {
    /// A claim publishes its fence record without the expected-last-sequence check
    /// (`fence::claim` without `expected_last_subject_sequence`).
    pub claim_without_cas: bool,
    /// The crash watch unpins without first storing the deduplicated unpin record
    /// (`crash::unpin_if_still_owned` without `first_to_unpin`).
    pub unpin_without_record: bool,
    /// A command is acknowledged as soon as its events are sent, not once they are stored.
    pub ack_before_durable: bool,
    /// Journal writes carry no fence headers: the server stores them whatever the latest fence.
    pub write_without_fence: bool,
}

/// How many isolated owners in a row must have died with a command first in hand before it is
/// given up (`settle::ISOLATED_DEATHS`; `tests/drift.rs` holds the two equal).
pub const ISOLATED_DEATHS: u8 = 2;

/// The bounds of one model: how many processes, partitions and commands, and which faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Config {
    /// Processes (2-3 is what the tests check).
    pub processes: u8,
    /// Partitions (1-2).
    pub partitions: u8,
    /// Commands per partition, all for one entity (applied in order), published up front.
    pub commands: u8,
    /// A command (partition, index) that fails every time it runs, to be given up.
    pub failing: Option<(u8, u8)>,
    /// A command (partition, index) that kills the process that runs it (it is given up once
    /// claims have counted it in hand at `max_deliver` deaths, in isolation: `fence::Trial`).
    pub poison: Option<(u8, u8)>,
    /// Deliveries (takeovers included) after which a failing command is given up.
    pub max_deliver: u8,
    /// Process crashes (SIGKILL: the process is gone for good).
    pub crashes: u8,
    /// Process stalls (SIGSTOP: no step of its own, no pull, its connection stays; SIGCONT later).
    pub stalls: u8,
    /// Hand-offs (an owner releasing a partition to balance the processes).
    pub hand_offs: u8,
    /// Safeguards removed.
    pub bugs: Bugs,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            processes: 2,
            partitions: 1,
            commands: 2,
            failing: None,
            poison: None,
            max_deliver: 2,
            crashes: 1,
            stalls: 1,
            hand_offs: 1,
            bugs: Bugs::default(),
        }
    }
}

/// Where a process's owner of one partition stands. The library's phases (`owner/phase.rs`,
/// `Phase`) are the same but for `Acquiring`, which the library spends inside `Standby` (the
/// owner awaits its claim there): see [`Phase::code_name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Pulling without a pin id; the first delivery under a pin makes it acquire.
    Standby,
    /// Claiming a generation under `pin`; `read`: the fence sequence it read (the claim's
    /// expected last sequence), `None` before the read.
    Acquiring {
        /// The pin it was delivered under.
        pin: u8,
        /// The latest fence record's sequence, once read.
        read: Option<u8>,
        /// The command whose delivery pinned it, if that was its first delivery (`first_new`
        /// in `acquire::claim`): from it on, nothing was in hand at an earlier owner.
        first_new: Option<u8>,
    },
    /// Owns the partition under generation `generation`, whose fence record is at `seq`.
    Owning {
        /// The generation.
        generation: u8,
        /// Its fence record's sequence (what every write expects).
        seq: u8,
        /// The pin.
        pin: u8,
    },
    /// Handing off: no new command started; once no write is in flight, it unpins itself.
    Releasing {
        /// The generation.
        generation: u8,
        /// Its fence record's sequence.
        seq: u8,
        /// The pin.
        pin: u8,
    },
    /// Stepped down under `pin` (pin lost, or fenced): will not acquire under it again.
    Refused {
        /// The refused pin.
        pin: u8,
    },
    /// After a hand-off: not pulling, so the partition goes to another process.
    CoolingDown,
}

impl Phase {
    /// The library's name of this phase (`owner/phase.rs`, `enum Phase`).
    pub fn code_name(&self) -> &'static str {
        match self {
            Phase::Standby | Phase::Acquiring { .. } => "Standby",
            Phase::Owning { .. } => "Owning",
            Phase::Releasing { .. } => "Releasing",
            Phase::Refused { .. } => "Refused",
            Phase::CoolingDown => "CoolingDown",
        }
    }

    /// One value of every phase (for the drift test).
    pub fn all() -> [Phase; 6] {
        [
            Phase::Standby,
            Phase::Acquiring {
                pin: 0,
                read: None,
                first_new: None,
            },
            Phase::Owning {
                generation: 0,
                seq: 0,
                pin: 0,
            },
            Phase::Releasing {
                generation: 0,
                seq: 0,
                pin: 0,
            },
            Phase::Refused { pin: 0 },
            Phase::CoolingDown,
        ]
    }

    fn pulls_under(&self, id: u8) -> bool {
        match *self {
            Phase::Acquiring { pin, .. }
            | Phase::Owning { pin, .. }
            | Phase::Releasing { pin, .. } => pin == id,
            _ => false,
        }
    }
}

/// The library's reasons to step down (`owner/settle.rs`, `enum StepDown`) that the model
/// takes: the pin moved away (`PinLost`), a write refused by the fence (`Fenced`), a hand-off
/// (`HandedOff`).
pub const STEP_DOWNS_MODELLED: &[&str] = &["PinLost", "Fenced", "HandedOff"];

/// The reasons to step down the model leaves out, and why (see docs/MODEL.md).
pub const STEP_DOWNS_LEFT_OUT: &[(&str, &str)] = &[
    (
        "PinMoved",
        "a delivery under another pin of the same process: one pin per process at a time here",
    ),
    (
        "DeliveriesLost",
        "deliveries are never lost in transit here: the step down it causes is a PinLost's",
    ),
    (
        "CrashLoop",
        "entity actors are not modelled: a step down like PinLost",
    ),
    (
        "PullLoopEnded",
        "the pull loop does not end but with its process (a crash)",
    ),
    (
        "Released",
        "a graceful stop is a hand-off followed by a process that never pulls again",
    ),
];

/// Where a command stands at the server (the partition's consumer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// Not delivered yet.
    Waiting,
    /// Delivered to `process` under `pin`, not acknowledged.
    InHand {
        /// The process it was delivered to.
        process: u8,
        /// The pin it was delivered under.
        pin: u8,
    },
    /// Acknowledged.
    Acked,
    /// Terminated (given up, after its dead letter).
    Terminated,
}

/// A command of a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Command {
    /// At the server.
    pub delivery: Delivery,
    /// The server's delivery count.
    pub delivered: u8,
    /// Ghost: how often it was in hand at some owner (each delivery, and each recovery from the
    /// stream by a new owner).
    pub in_hand: u8,
}

/// A fence record (`<t>.fence.<p>`); its sequence is its index + 1.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FenceRecord {
    /// The generation it starts.
    pub generation: u8,
    /// The claimant.
    pub process: u8,
    /// The pin the claimant held.
    pub pin: u8,
    /// Per command, how many claims in a row found it in hand after the previous owner died.
    pub held: Vec<u8>,
    /// The trial (`fence::Trial`): the first command in hand, and how many owners in a row
    /// died with it first in hand (set once a command was in hand at `min(max_deliver, 2)`
    /// claims after deaths).
    pub trial: Option<(u8, u8)>,
}

/// A journal record: a command's events, or its dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Record {
    /// The command.
    pub command: u8,
    /// The writer's generation.
    pub generation: u8,
    /// The writer.
    pub process: u8,
    /// A dead letter (the command given up), not events.
    pub dead_letter: bool,
}

/// A journal write in flight (a group-committed batch holding one command's records).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Write {
    /// The record.
    pub record: Record,
    /// The fence sequence it expects (`Nats-Expected-Last-Subject-Sequence` on `fence.<p>`).
    pub expects: u8,
}

/// One partition: its server side (consumer, pin, fence records, journal) and ghosts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Partition {
    /// The commands, in stream order.
    pub commands: Vec<Command>,
    /// The pin: `(process, pin id)`.
    pub pin: Option<(u8, u8)>,
    /// Pin ids handed out so far.
    pub pins: u8,
    /// The fence records, oldest first.
    pub fence: Vec<FenceRecord>,
    /// The journal (events and dead letters).
    pub journal: Vec<Record>,
    /// Writes sent and not yet answered.
    pub in_flight: Vec<Write>,
    /// Fence sequences whose unpin record is stored (`<t>.unpin.<p>`, deduplicated).
    pub unpin_records: Vec<u8>,
    /// Ghost: unpins by crash watches, per fence sequence (index = sequence).
    pub watch_unpins: Vec<u8>,
    /// Ghost: a write stored although a newer fence record existed.
    pub stale_write: bool,
    /// Ghost: a crash watch's unpin took the pin from a process other than the dead owner it
    /// found (the pin lapsed and moved between its check and its unpin).
    pub unpinned_the_living: bool,
}

/// A process's owner of one partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner {
    /// Its phase.
    pub phase: Phase,
    /// Commands it knows applied (events in the journal), as loaded after its claim and written
    /// since.
    pub applied: u16,
    /// Commands it knows given up (dead letters in the journal).
    pub given_up: u16,
    /// A write of its own is in flight.
    pub writing: bool,
    /// A write of its own was refused by the fence.
    pub fenced: bool,
}

/// The crash watch of one process, for one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Watch {
    /// The fence sequence found dead, and whether its unpin record is stored (it unpins next).
    pub found: Option<(u8, bool)>,
    /// The last fence sequence it dealt with (each claim once).
    pub done: u8,
}

/// A process.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Process {
    /// Not crashed.
    pub alive: bool,
    /// Stopped (SIGSTOP).
    pub stalled: bool,
    /// Its owner of each partition.
    pub owners: Vec<Owner>,
    /// Its crash watch, per partition.
    pub watches: Vec<Watch>,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The processes.
    pub processes: Vec<Process>,
    /// The partitions.
    pub partitions: Vec<Partition>,
    /// Crashes left.
    pub crashes: u8,
    /// Stalls left.
    pub stalls: u8,
    /// Hand-offs left.
    pub hand_offs: u8,
}

/// One step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The server pins an idle partition to a puller and delivers a command to it.
    Pin(u8, u8),
    /// The server delivers (or redelivers, an ack wait later) command `.1` to the pinned process.
    Deliver(u8, u8),
    /// The pin lapses: its holder has not pulled under it for the TTL.
    PinLapses(u8),
    /// The server answers a write in flight (`.1`: its index): stored, or refused by the fence.
    Store(u8, u8),
    /// A process's owner takes one step (`(process, partition)`).
    Owner(u8, u8),
    /// An owner's pull under its pin is refused (423): the pin has moved; it steps down.
    PinLost(u8, u8),
    /// An owner starts a hand-off.
    HandOff(u8, u8),
    /// A crash watch takes one step (`(process, partition)`).
    Watch(u8, u8),
    /// SIGKILL.
    Crash(u8),
    /// SIGSTOP.
    Stall(u8),
    /// SIGCONT.
    Resume(u8),
}

/// The protocol under one [`Config`].
#[derive(Debug, Clone)]
pub struct Ownership {
    /// The bounds and bugs.
    pub config: Config,
}

impl Ownership {
    /// The model of `config`.
    pub fn new(config: Config) -> Self {
        Self { config }
    }
}

fn bit(i: u8) -> u16 {
    1 << i
}

impl Partition {
    fn latest(&self) -> u8 {
        self.fence.len() as u8
    }

    fn has_record(&self, command: u8, dead_letter: bool) -> bool {
        self.journal
            .iter()
            .any(|r| r.command == command && r.dead_letter == dead_letter)
    }

    fn settled(&self) -> bool {
        self.commands
            .iter()
            .all(|c| matches!(c.delivery, Delivery::Acked | Delivery::Terminated))
    }

    /// The next command to (re)deliver to the holder of pin `(process, id)`: the first not yet
    /// delivered, or one in hand under another pin (redelivered after its ack wait).
    fn deliverable(&self, holder: (u8, u8)) -> impl Iterator<Item = u8> + '_ {
        let first_waiting = self
            .commands
            .iter()
            .position(|c| c.delivery == Delivery::Waiting);
        self.commands
            .iter()
            .enumerate()
            .filter(move |(i, c)| match c.delivery {
                Delivery::Waiting => Some(*i) == first_waiting,
                Delivery::InHand { process, pin } => (process, pin) != holder,
                _ => false,
            })
            .map(|(i, _)| i as u8)
    }
}

impl State {
    fn pulling(&self, process: u8) -> bool {
        let p = &self.processes[process as usize];
        p.alive && !p.stalled
    }
}

impl Model for Ownership {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let c = &self.config;
        let owner = Owner {
            phase: Phase::Standby,
            applied: 0,
            given_up: 0,
            writing: false,
            fenced: false,
        };
        vec![State {
            processes: (0..c.processes)
                .map(|_| Process {
                    alive: true,
                    stalled: false,
                    owners: vec![owner.clone(); c.partitions as usize],
                    watches: vec![Watch::default(); c.partitions as usize],
                })
                .collect(),
            partitions: (0..c.partitions)
                .map(|_| Partition {
                    commands: vec![
                        Command {
                            delivery: Delivery::Waiting,
                            delivered: 0,
                            in_hand: 0,
                        };
                        c.commands as usize
                    ],
                    pin: None,
                    pins: 0,
                    fence: Vec::new(),
                    journal: Vec::new(),
                    in_flight: Vec::new(),
                    unpin_records: Vec::new(),
                    watch_unpins: vec![0],
                    stale_write: false,
                    unpinned_the_living: false,
                })
                .collect(),
            crashes: c.crashes,
            stalls: c.stalls,
            hand_offs: c.hand_offs,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let n = self.config.processes;
        for (pi, part) in s.partitions.iter().enumerate() {
            let p = pi as u8;
            match part.pin {
                None => {
                    // A command waits (or waits for redelivery): the server pins a puller that
                    // pulls without a pin id (not an owner, which pulls under its old pin).
                    if part.deliverable((u8::MAX, u8::MAX)).next().is_some() {
                        for q in 0..n {
                            let phase = s.processes[q as usize].owners[pi].phase;
                            if s.pulling(q)
                                && matches!(phase, Phase::Standby | Phase::Refused { .. })
                            {
                                actions.push(Action::Pin(p, q));
                            }
                        }
                    }
                }
                Some((q, id)) => {
                    let holder = &s.processes[q as usize];
                    if s.pulling(q)
                        && let Some(c) = part.deliverable((q, id)).next()
                    {
                        actions.push(Action::Deliver(p, c));
                    }
                    let pulls = s.pulling(q) && {
                        let phase = holder.owners[pi].phase;
                        // A process refusing an older pin pulls without a pin id, as a standby.
                        match phase {
                            Phase::Standby => true,
                            Phase::Refused { pin } => pin != id,
                            _ => phase.pulls_under(id),
                        }
                    };
                    if !pulls {
                        actions.push(Action::PinLapses(p));
                    }
                }
            }
            for w in 0..part.in_flight.len() {
                actions.push(Action::Store(p, w as u8));
            }
            for q in 0..n {
                if !s.pulling(q) {
                    continue;
                }
                let owner = &s.processes[q as usize].owners[pi];
                if self.owner_step(s, q, p).is_some() {
                    actions.push(Action::Owner(q, p));
                }
                if let Phase::Owning { pin, .. } = owner.phase
                    && part.pin != Some((q, pin))
                {
                    actions.push(Action::PinLost(q, p));
                }
                if s.hand_offs > 0 && matches!(owner.phase, Phase::Owning { .. }) {
                    actions.push(Action::HandOff(q, p));
                }
                if self.watch_step(s, q, p).is_some() {
                    actions.push(Action::Watch(q, p));
                }
            }
        }
        for q in 0..n {
            let proc = &s.processes[q as usize];
            if !proc.alive {
                continue;
            }
            // At least one process stays up: every partition with work can be owned again.
            let alive = s.processes.iter().filter(|p| p.alive).count();
            if s.crashes > 0 && alive > 1 {
                actions.push(Action::Crash(q));
            }
            if proc.stalled {
                actions.push(Action::Resume(q));
            } else if s.stalls > 0 {
                actions.push(Action::Stall(q));
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::Pin(p, q) => {
                let part = &mut s.partitions[p as usize];
                part.pins += 1;
                let id = part.pins;
                part.pin = Some((q, id));
                let c = part.deliverable((q, id)).next()?;
                deliver(part, c, (q, id));
                let first_new = (part.commands[c as usize].delivered == 1).then_some(c);
                // The delivery under a new pin starts an acquisition, which reads the latest
                // fence record first (one step: nothing else can tell them apart).
                let read = Some(part.latest());
                s.processes[q as usize].owners[p as usize].phase = Phase::Acquiring {
                    pin: id,
                    read,
                    first_new,
                };
            }
            Action::Deliver(p, c) => {
                let part = &mut s.partitions[p as usize];
                let holder = part.pin?;
                deliver(part, c, holder);
            }
            Action::PinLapses(p) => s.partitions[p as usize].pin = None,
            Action::Store(p, w) => {
                let bugs = self.config.bugs;
                let part = &mut s.partitions[p as usize];
                let write = part.in_flight.remove(w as usize);
                let current = write.expects == part.latest();
                if current || bugs.write_without_fence {
                    part.stale_write |= !current;
                    part.journal.push(write.record);
                }
                let r = write.record;
                let owner = &mut s.processes[r.process as usize].owners[p as usize];
                // The answer reaches the owner only if it still waits for it (same generation).
                let same = matches!(owner.phase,
                    Phase::Owning { seq, .. } | Phase::Releasing { seq, .. } if seq == write.expects);
                if same {
                    owner.writing = false;
                    if current || bugs.write_without_fence {
                        if r.dead_letter {
                            owner.given_up |= bit(r.command);
                        } else {
                            owner.applied |= bit(r.command);
                        }
                    } else {
                        owner.fenced = true;
                    }
                }
            }
            Action::Owner(q, p) => {
                let step = self.owner_step(&s, q, p)?;
                self.take_owner_step(&mut s, q, p, step);
            }
            Action::PinLost(q, p) => {
                self.take_owner_step(&mut s, q, p, OwnerStep::StepDown);
            }
            Action::HandOff(q, p) => {
                s.hand_offs -= 1;
                let owner = &mut s.processes[q as usize].owners[p as usize];
                if let Phase::Owning {
                    generation,
                    seq,
                    pin,
                } = owner.phase
                {
                    owner.phase = Phase::Releasing {
                        generation,
                        seq,
                        pin,
                    };
                }
            }
            Action::Watch(q, p) => {
                let step = self.watch_step(&s, q, p)?;
                let part = &mut s.partitions[p as usize];
                let watch = &mut s.processes[q as usize].watches[p as usize];
                match step {
                    WatchStep::Found(seq) => {
                        watch.found = Some((seq, self.config.bugs.unpin_without_record));
                        watch.done = seq;
                    }
                    WatchStep::StoreRecord(seq) => {
                        if part.unpin_records.contains(&seq) {
                            // Another watch stored it first: it unpins, this one does not.
                            watch.found = None;
                        } else {
                            part.unpin_records.push(seq);
                            watch.found = Some((seq, true));
                        }
                    }
                    WatchStep::Unpin(seq) => {
                        let dead = part.fence[seq as usize - 1].process;
                        part.unpinned_the_living |= part.pin.is_some_and(|(q, _)| q != dead);
                        part.pin = None;
                        part.watch_unpins[seq as usize] += 1;
                        watch.found = None;
                    }
                }
            }
            Action::Crash(q) => {
                s.crashes -= 1;
                let proc = &mut s.processes[q as usize];
                proc.alive = false;
                proc.stalled = false;
            }
            Action::Stall(q) => {
                s.stalls -= 1;
                s.processes[q as usize].stalled = true;
            }
            Action::Resume(q) => s.processes[q as usize].stalled = false,
        }
        // A refused pin that has moved on leaves a standby (`Refused` pulls without a pin id;
        // one step of its own in the library, none here: nothing can tell them apart).
        for proc in &mut s.processes {
            for (owner, part) in proc.owners.iter_mut().zip(&s.partitions) {
                if let Phase::Refused { pin } = owner.phase
                    && part.pin.is_none_or(|(_, id)| id != pin)
                {
                    owner.phase = Phase::Standby;
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ONE_WRITER_PER_GENERATION, |_, s: &State| {
                s.partitions.iter().all(|part| {
                    part.journal.iter().all(|a| {
                        part.journal
                            .iter()
                            .all(|b| a.generation != b.generation || a.process == b.process)
                    })
                })
            }),
            Property::always(ONLY_THE_LATEST_FENCE_WRITES, |_, s: &State| {
                s.partitions.iter().all(|part| !part.stale_write)
            }),
            Property::always(NO_ACKNOWLEDGED_COMMAND_LOST, |_, s: &State| {
                s.partitions.iter().all(|part| {
                    part.commands
                        .iter()
                        .enumerate()
                        .all(|(i, c)| match c.delivery {
                            Delivery::Acked => part.has_record(i as u8, false),
                            Delivery::Terminated => part.has_record(i as u8, true),
                            _ => true,
                        })
                })
            }),
            Property::always(NO_COMMAND_APPLIED_TWICE, |_, s: &State| {
                s.partitions.iter().all(|part| {
                    (0..part.commands.len()).all(|i| {
                        part.journal
                            .iter()
                            .filter(|r| r.command == i as u8 && !r.dead_letter)
                            .count()
                            <= 1
                    })
                })
            }),
            Property::always(
                GIVEN_UP_ONLY_AFTER_MAX_DELIVER,
                |m: &Ownership, s: &State| {
                    s.partitions.iter().all(|part| {
                        part.journal.iter().filter(|r| r.dead_letter).all(|r| {
                            part.commands[r.command as usize].in_hand >= m.config.max_deliver
                        }) && part
                            .journal
                            .iter()
                            .all(|r| !(r.dead_letter && part.has_record(r.command, false)))
                    })
                },
            ),
            Property::always(NO_INNOCENT_COMMAND_GIVEN_UP, |m: &Ownership, s: &State| {
                s.partitions.iter().enumerate().all(|(p, part)| {
                    part.journal.iter().filter(|r| r.dead_letter).all(|r| {
                        let which = Some((p as u8, r.command));
                        m.config.failing == which || m.config.poison == which
                    })
                })
            }),
            Property::always(ONE_WATCH_UNPIN_PER_CLAIM, |_, s: &State| {
                s.partitions
                    .iter()
                    .all(|part| part.watch_unpins.iter().all(|&n| n <= 1))
            }),
            Property::eventually(EVERY_PARTITION_WITH_WORK_OWNED, |_, s: &State| {
                s.partitions.iter().all(Partition::settled)
            }),
            Property::sometimes("a command is given up", |_, s: &State| {
                s.partitions
                    .iter()
                    .any(|part| part.journal.iter().any(|r| r.dead_letter))
            }),
            Property::sometimes("a crash watch unpins", |_, s: &State| {
                s.partitions
                    .iter()
                    .any(|part| part.watch_unpins.iter().any(|&n| n > 0))
            }),
            Property::sometimes(WATCH_UNPINS_THE_LIVING, |_, s: &State| {
                s.partitions.iter().any(|part| part.unpinned_the_living)
            }),
            Property::sometimes("a write is fenced", |_, s: &State| {
                s.processes
                    .iter()
                    .any(|p| p.owners.iter().any(|o| o.fenced))
            }),
        ]
    }
}

/// Property: every journal record of one generation was written by one process.
pub const ONE_WRITER_PER_GENERATION: &str = "no two processes write in one generation";
/// Property: the server stores a write only while its fence record is the latest.
pub const ONLY_THE_LATEST_FENCE_WRITES: &str = "only the latest generation's writes are stored";
/// Property: an acknowledged command's events (a terminated command's dead letter) are stored.
pub const NO_ACKNOWLEDGED_COMMAND_LOST: &str = "no acknowledged command lost";
/// Property: a command's events are stored once.
pub const NO_COMMAND_APPLIED_TWICE: &str = "no command applied twice";
/// Property: a dead letter only for a command in hand at least `max_deliver` times (and never
/// for one applied).
pub const GIVEN_UP_ONLY_AFTER_MAX_DELIVER: &str =
    "a command is given up only after max_deliver deliveries";
/// Property: only a command that fails or kills its owners is given up.
pub const NO_INNOCENT_COMMAND_GIVEN_UP: &str = "no innocent command given up";
/// Reachable (a known, harmless race): a crash watch checks that the consumer is pinned to the
/// dead owner's pin, the pin lapses and goes to a standby, and the watch's unpin (which names no
/// pin) takes it from that standby. It costs one more takeover; the fence keeps it safe.
pub const WATCH_UNPINS_THE_LIVING: &str = "a crash watch unpins a process it did not find dead";
/// Property: each claim is unpinned by a crash watch at most once.
pub const ONE_WATCH_UNPIN_PER_CLAIM: &str = "at most one crash-watch unpin per claim";
/// Property (liveness): every behaviour ends with every command acknowledged or given up, so
/// every partition with work was owned until its work was done.
pub const EVERY_PARTITION_WITH_WORK_OWNED: &str =
    "every partition with work is eventually owned and its commands settled";

fn deliver(part: &mut Partition, c: u8, (process, pin): (u8, u8)) {
    let cmd = &mut part.commands[c as usize];
    cmd.delivery = Delivery::InHand { process, pin };
    cmd.delivered += 1;
    cmd.in_hand += 1;
}

/// What an owner does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OwnerStep {
    /// Read the latest fence record (`fence::latest`).
    ReadFence,
    /// Publish the claim, expecting the sequence read (`fence::claim`).
    Claim,
    /// A write was fenced (or the pin moved: `Action::PinLost`): step down, refusing the pin.
    StepDown,
    /// Run the head command: write its events (or its dead letter), or nak it.
    Run(u8),
    /// Acknowledge (or terminate) the head command, its records stored.
    Settle(u8),
    /// Hand-off: nothing in flight, unpin and cool down.
    Unpin,
    /// Cool-down over.
    Rejoin,
}

/// What a crash watch does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WatchStep {
    /// The latest claim names a dead process whose pin holds.
    Found(u8),
    /// Store the unpin record of that claim (deduplicated by its sequence).
    StoreRecord(u8),
    /// Unpin.
    Unpin(u8),
}

impl Ownership {
    fn owner_step(&self, s: &State, q: u8, p: u8) -> Option<OwnerStep> {
        let part = &s.partitions[p as usize];
        let owner = &s.processes[q as usize].owners[p as usize];
        match owner.phase {
            // Pinned, a standby acquires at once (see `Action::Pin`); a refused pin lapses.
            Phase::Standby | Phase::Refused { .. } => None,
            Phase::Acquiring { read: None, .. } => Some(OwnerStep::ReadFence),
            Phase::Acquiring { read: Some(_), .. } => Some(OwnerStep::Claim),
            Phase::CoolingDown => Some(OwnerStep::Rejoin),
            Phase::Releasing { pin, .. } => {
                (!owner.writing || part.pin != Some((q, pin))).then_some(OwnerStep::Unpin)
            }
            Phase::Owning { pin, seq, .. } => {
                // A refused write tells at once; a moved pin only at the next pull (`PinLost`):
                // until then the owner runs what it has in hand.
                if owner.fenced {
                    return Some(OwnerStep::StepDown);
                }
                if owner.writing {
                    return None;
                }
                let head =
                    part.commands.iter().position(|c| {
                        !matches!(c.delivery, Delivery::Acked | Delivery::Terminated)
                    })? as u8;
                let cmd = &part.commands[head as usize];
                if cmd.delivered == 0 {
                    return None;
                }
                let mine = cmd.delivery == Delivery::InHand { process: q, pin };
                if owner.applied & bit(head) != 0 || owner.given_up & bit(head) != 0 {
                    // Its outcome is durable: acknowledged once it is delivered here again.
                    return mine.then_some(OwnerStep::Settle(head));
                }
                let failing = self.config.failing == Some((p, head));
                let deliveries = self.deliveries(part, head, (q, pin), seq);
                // A failing command recovered from the stream (delivered to an earlier owner)
                // waits for its redelivery here, to be counted and nak'ed, or given up.
                if failing && !mine && deliveries < self.config.max_deliver {
                    return None;
                }
                Some(OwnerStep::Run(head))
            }
        }
    }

    /// The delivery count the owner goes by: the server's count if the command was delivered to
    /// it, the claims that found it in hand (and this run) if it was recovered from the stream
    /// (`acquire::claim`: `claims_holding + 1`).
    /// `seq`: the owner's own fence record, whose counts it took at its claim.
    fn deliveries(&self, part: &Partition, c: u8, (q, pin): (u8, u8), seq: u8) -> u8 {
        let cmd = &part.commands[c as usize];
        let claims = part.fence[seq as usize - 1].held[c as usize].saturating_add(1);
        if cmd.delivery == (Delivery::InHand { process: q, pin }) {
            cmd.delivered.max(claims)
        } else {
            claims
        }
    }

    fn take_owner_step(&self, s: &mut State, q: u8, p: u8, step: OwnerStep) {
        let bugs = self.config.bugs;
        let max_deliver = self.config.max_deliver;
        let failing = self.config.failing;
        let poison = self.config.poison;
        let alive: Vec<bool> = s.processes.iter().map(|p| p.alive).collect();
        let part = &mut s.partitions[p as usize];
        let owner = &mut s.processes[q as usize].owners[p as usize];
        match step {
            OwnerStep::ReadFence => {
                if let Phase::Acquiring { pin, first_new, .. } = owner.phase {
                    owner.phase = Phase::Acquiring {
                        pin,
                        read: Some(part.latest()),
                        first_new,
                    };
                }
            }
            OwnerStep::Claim => {
                let Phase::Acquiring {
                    pin,
                    read: Some(read),
                    first_new,
                } = owner.phase
                else {
                    return;
                };
                if read != part.latest() && !bugs.claim_without_cas {
                    // Wrong last sequence: read again and retry.
                    owner.phase = Phase::Acquiring {
                        pin,
                        read: None,
                        first_new,
                    };
                    return;
                }
                let previous = read.checked_sub(1).map(|i| &part.fence[i as usize]);
                let generation = previous.map_or(0, |r| r.generation) + 1;
                // The claim counts the commands in hand once more if their owner died (the
                // probe's "no responders"; a stalled process answers nothing: not dead).
                let died = previous.is_some_and(|r| !alive[r.process as usize]);
                // Counted: the consumer's in-hand window, up to the delivery that pinned this
                // owner if that was a first one (`acquire::claim`'s `counted`).
                let commands = &part.commands;
                let counted = |i: usize| {
                    matches!(commands[i].delivery, Delivery::InHand { .. })
                        && first_new.is_none_or(|f| i < f as usize)
                };
                let held: Vec<u8> = part
                    .commands
                    .iter()
                    .enumerate()
                    .map(|(i, _)| {
                        if counted(i) {
                            previous.map_or(0, |r| r.held[i]) + u8::from(died)
                        } else {
                            0
                        }
                    })
                    .collect();
                // `fence::trial`: the head of what earlier owners held, once a command was
                // counted at `isolate_at` claims; its runs count the isolated owners that died
                // with it first in hand.
                let isolate_at = max_deliver.clamp(1, 2);
                let head = (0..part.commands.len()).find(|&i| counted(i));
                let trial = head.and_then(|head| {
                    let suspect = held.iter().any(|&h| h >= isolate_at);
                    if !suspect || held[head] == 0 {
                        return None;
                    }
                    let more = u8::from(died);
                    let runs = match previous.and_then(|r| r.trial) {
                        Some((c, runs)) if c as usize == head => runs + more,
                        Some(_) => more,
                        None => 0,
                    };
                    Some((head as u8, runs))
                });
                part.fence.push(FenceRecord {
                    generation,
                    process: q,
                    pin,
                    held,
                    trial,
                });
                part.watch_unpins.push(0);
                let seq = part.latest();
                // The commands earlier owners held are recovered from the stream: in hand here.
                for c in &mut part.commands {
                    if matches!(c.delivery, Delivery::InHand { process, pin: id } if (process, id) != (q, pin))
                    {
                        c.in_hand += 1;
                    }
                }
                // Entities are loaded after the claim: what the journal holds now.
                owner.applied = 0;
                owner.given_up = 0;
                for r in &part.journal {
                    if r.dead_letter {
                        owner.given_up |= bit(r.command);
                    } else {
                        owner.applied |= bit(r.command);
                    }
                }
                owner.writing = false;
                owner.fenced = false;
                owner.phase = Phase::Owning {
                    generation,
                    seq,
                    pin,
                };
            }
            OwnerStep::StepDown => {
                if let Phase::Owning { pin, .. } = owner.phase {
                    owner.phase = Phase::Refused { pin };
                    owner.writing = false;
                }
            }
            OwnerStep::Run(c) => {
                let Phase::Owning {
                    generation,
                    seq,
                    pin,
                } = owner.phase
                else {
                    return;
                };
                let deliveries = self.deliveries(part, c, (q, pin), seq);
                let mine =
                    part.commands[c as usize].delivery == Delivery::InHand { process: q, pin };
                // `settle::suspect`: the trial's command, after an isolated owner died running
                // it, past max_deliver: given up before it runs.
                let suspect = part.fence[seq as usize - 1].trial.is_some_and(|(t, runs)| {
                    t == c && runs >= ISOLATED_DEATHS && deliveries > max_deliver
                });
                if !suspect && poison == Some((p, c)) {
                    // It kills its process.
                    let proc = &mut s.processes[q as usize];
                    proc.alive = false;
                    return;
                }
                let is_failing = failing == Some((p, c)) || suspect;
                if is_failing && !suspect && deliveries < max_deliver {
                    // It failed: nak'ed, redelivered at once.
                    if mine {
                        deliver(part, c, (q, pin));
                    }
                    return;
                }
                let record = Record {
                    command: c,
                    generation,
                    process: q,
                    dead_letter: is_failing,
                };
                part.in_flight.push(Write {
                    record,
                    expects: seq,
                });
                owner.writing = true;
                if bugs.ack_before_durable && mine {
                    part.commands[c as usize].delivery = if is_failing {
                        Delivery::Terminated
                    } else {
                        Delivery::Acked
                    };
                }
            }
            OwnerStep::Settle(c) => {
                let cmd = &mut part.commands[c as usize];
                cmd.delivery = if owner.given_up & bit(c) != 0 {
                    Delivery::Terminated
                } else {
                    Delivery::Acked
                };
            }
            OwnerStep::Unpin => {
                if let Phase::Releasing { pin, .. } = owner.phase
                    && part.pin == Some((q, pin))
                {
                    part.pin = None;
                }
                owner.phase = Phase::CoolingDown;
                owner.writing = false;
            }
            OwnerStep::Rejoin => owner.phase = Phase::Standby,
        }
    }

    fn watch_step(&self, s: &State, q: u8, p: u8) -> Option<WatchStep> {
        let part = &s.partitions[p as usize];
        let watch = &s.processes[q as usize].watches[p as usize];
        match watch.found {
            Some((seq, false)) => Some(WatchStep::StoreRecord(seq)),
            // Like the library, it does not look again between its check and its unpin.
            Some((seq, true)) => Some(WatchStep::Unpin(seq)),
            None => {
                let seq = part.latest();
                let record = part.fence.last()?;
                let dead = !s.processes[record.process as usize].alive;
                (seq > watch.done
                    && record.process != q
                    && dead
                    && part.pin == Some((record.process, record.pin)))
                .then_some(WatchStep::Found(seq))
            }
        }
    }
}

impl State {
    /// The state with its processes renumbered in a canonical order (sorted by what they hold,
    /// which names no process), every reference to a process renumbered alike: a state
    /// symmetric to this one, for the checker's symmetry reduction (processes are
    /// interchangeable; only their numbering tells them apart).
    pub fn representative(&self) -> State {
        let mut order: Vec<usize> = (0..self.processes.len()).collect();
        order.sort_by(|&a, &b| {
            self.processes[a]
                .cmp_key()
                .cmp(&self.processes[b].cmp_key())
        });
        // new[old] = the old process's new number.
        let mut new = vec![0u8; order.len()];
        for (n, &old) in order.iter().enumerate() {
            new[old] = n as u8;
        }
        let map = |q: u8| new[q as usize];
        let mut s = self.clone();
        s.processes = order
            .iter()
            .map(|&old| self.processes[old].clone())
            .collect();
        for part in &mut s.partitions {
            part.pin = part.pin.map(|(q, id)| (map(q), id));
            for c in &mut part.commands {
                if let Delivery::InHand { process, pin } = c.delivery {
                    c.delivery = Delivery::InHand {
                        process: map(process),
                        pin,
                    };
                }
            }
            for r in &mut part.fence {
                r.process = map(r.process);
            }
            for r in &mut part.journal {
                r.process = map(r.process);
            }
            for w in &mut part.in_flight {
                w.record.process = map(w.record.process);
            }
        }
        s
    }
}

impl Process {
    fn cmp_key(&self) -> impl Ord + '_ {
        (
            self.alive,
            self.stalled,
            self.owners
                .iter()
                .map(|o| format!("{o:?}"))
                .collect::<Vec<_>>(),
            self.watches
                .iter()
                .map(|w| (w.found, w.done))
                .collect::<Vec<_>>(),
        )
    }
}
