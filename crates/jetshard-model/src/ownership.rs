//! The protocol as a `stateright` model: its initial states, actions, transitions and properties.

use stateright::{Model, Property};

use crate::state::bit;
use crate::step::{OwnerStep, WatchStep, deliver};
use crate::*;

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
            warm: None,
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
        for proc in &mut s.processes {
            for (owner, part) in proc.owners.iter_mut().zip(&s.partitions) {
                // A dead process's memory is gone (a crash, or a command that kills its owner).
                if !proc.alive {
                    owner.warm = None;
                }
                // A refused pin that has moved on leaves a standby (`Refused` pulls without a
                // pin id; one step of its own in the library, none here: nothing can tell them
                // apart).
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
            Property::always(THE_LATEST_OWNER_KNOWS_THE_JOURNAL, |_, s: &State| {
                s.partitions.iter().enumerate().all(|(p, part)| {
                    s.processes.iter().all(|proc| {
                        let owner = &proc.owners[p];
                        match owner.phase {
                            Phase::Owning { seq, .. } | Phase::Releasing { seq, .. }
                                if seq == part.latest() =>
                            {
                                (owner.applied, owner.given_up) == part.known()
                            }
                            _ => true,
                        }
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
            Property::sometimes(A_WARM_RECLAIM, |_, s: &State| {
                // A warm claim after a record stored under an earlier generation: what it kept
                // was not nothing.
                s.partitions.iter().any(|part| {
                    part.fence
                        .iter()
                        .any(|f| f.warm && part.journal.iter().any(|r| r.generation < f.generation))
                })
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
/// Property: an owner whose fence record is the latest knows exactly what the journal holds
/// (the commands applied and given up): it never runs a command on a view of the journal that
/// lacks a stored record of the partition. Only the latest generation's writes can be stored,
/// and a stale view makes it apply a command again or run one already given up.
pub const THE_LATEST_OWNER_KNOWS_THE_JOURNAL: &str =
    "the latest generation's owner knows what the journal holds";
/// Reachable: a process re-claims a partition it stepped down from and keeps the entities it held
/// warm (one with a record in the journal), instead of loading them.
pub const A_WARM_RECLAIM: &str = "an owner re-claims warm, keeping what it knew";
/// Property: each claim is unpinned by a crash watch at most once.
pub const ONE_WATCH_UNPIN_PER_CLAIM: &str = "at most one crash-watch unpin per claim";
/// Property (liveness): every behaviour ends with every command acknowledged or given up, so
/// every partition with work was owned until its work was done.
pub const EVERY_PARTITION_WITH_WORK_OWNED: &str =
    "every partition with work is eventually owned and its commands settled";
