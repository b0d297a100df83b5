//! The model's state: partitions (pin, fence, journal, commands) and processes (owners, watches).

use crate::Phase;

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
    /// Ghost: the claimant kept the entities it held warm instead of loading them.
    pub warm: bool,
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
    /// What it kept in memory when it last lost its pin unfenced, for its next claim.
    pub warm: Option<Warm>,
}

/// The entity states an owner keeps when it steps down because its pin moved (`PinLost`; the
/// library's `StepDown::keeps_warm`, `owner/warm.rs`'s `Warm`), not after a fenced write or a
/// hand-off: what it knew applied and given up under `generation`. Its
/// next claim keeps them, not loading the entity from the journal, only if that claim wins
/// `generation + 1`: the claim is a compare-and-set on the latest fence record, so winning the
/// next generation proves that the record it superseded was this owner's and that no other
/// generation claimed, hence wrote, in between. An entity whose write was in doubt at the
/// step-down (sent, unanswered: it may be stored later) is not kept; with the model's one
/// entity per partition, nothing is kept then.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Warm {
    /// The generation it owned.
    pub generation: u8,
    /// Commands it knew applied.
    pub applied: u16,
    /// Commands it knew given up.
    pub given_up: u16,
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

pub(crate) fn bit(i: u8) -> u16 {
    1 << i
}

impl Partition {
    pub(crate) fn latest(&self) -> u8 {
        self.fence.len() as u8
    }

    pub(crate) fn has_record(&self, command: u8, dead_letter: bool) -> bool {
        self.journal
            .iter()
            .any(|r| r.command == command && r.dead_letter == dead_letter)
    }

    /// What the journal holds: the commands applied and the commands given up, as bits.
    pub(crate) fn known(&self) -> (u16, u16) {
        self.journal.iter().fold((0, 0), |(applied, given_up), r| {
            if r.dead_letter {
                (applied, given_up | bit(r.command))
            } else {
                (applied | bit(r.command), given_up)
            }
        })
    }

    pub(crate) fn settled(&self) -> bool {
        self.commands
            .iter()
            .all(|c| matches!(c.delivery, Delivery::Acked | Delivery::Terminated))
    }

    /// The next command to (re)deliver to the holder of pin `(process, id)`: the first not yet
    /// delivered, or one in hand under another pin (redelivered after its ack wait).
    pub(crate) fn deliverable(&self, holder: (u8, u8)) -> impl Iterator<Item = u8> + '_ {
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
    pub(crate) fn pulling(&self, process: u8) -> bool {
        let p = &self.processes[process as usize];
        p.alive && !p.stalled
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
    pub(crate) fn cmp_key(&self) -> impl Ord + '_ {
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
