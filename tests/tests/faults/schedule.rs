//! Faults and the schedules drawn from a seed: which faults, on which node or partition, when
//! and for how long.

use std::time::Duration;

use super::{LEADERS, Rng, Victim};

/// Node processes of a schedule (one slot each).
pub const NODES: usize = 3;

/// A fault, with its target chosen by the seed: a partition (the fault hits its owner at that
/// moment) or, when nobody owns it, the slot `fallback`.
#[derive(Clone, Debug)]
pub enum Fault {
    /// SIGKILL the owner; a new node starts in its slot after `restart_after`.
    Kill {
        /// Whose owner.
        partition: u32,
        /// The slot when nobody owns it.
        fallback: usize,
        /// How long the slot stays empty.
        restart_after: Duration,
    },
    /// SIGSTOP the owner for `hold` (longer than the pin TTL), then SIGCONT.
    Freeze {
        /// Whose owner.
        partition: u32,
        /// The slot when nobody owns it.
        fallback: usize,
        /// How long it stays frozen.
        hold: Duration,
    },
    /// Stop the single server (SIGKILL if `crash`, else SIGTERM), start it again on its store
    /// after `down`.
    ServerRestart {
        /// SIGKILL rather than SIGTERM.
        crash: bool,
        /// How long the server stays down.
        down: Duration,
    },
    /// SIGKILL a server of the R3 cluster (a leader, or the owner's server), start it again
    /// on its store after `down`, wait until the cluster has healed.
    ServerKill {
        /// Which server.
        victim: Victim,
        /// The partition whose consumer's leader or owner's server it is.
        partition: u32,
        /// How long the server stays down.
        down: Duration,
    },
    /// Drop every connection of the owner at its proxies and refuse new ones for `hold`.
    Cut {
        /// Whose owner.
        partition: u32,
        /// The slot when nobody owns it.
        fallback: usize,
        /// How long.
        hold: Duration,
    },
    /// Like `Cut`, but shorter than the pin TTL: the owner reconnects and keeps its pin,
    /// while whatever was in flight through the proxy is gone.
    Blip {
        /// Whose owner.
        partition: u32,
        /// The slot when nobody owns it.
        fallback: usize,
        /// How long.
        hold: Duration,
    },
    /// Stop forwarding the owner's traffic, connection kept, for `hold`.
    Stall {
        /// Whose owner.
        partition: u32,
        /// The slot when nobody owns it.
        fallback: usize,
        /// How long.
        hold: Duration,
    },
    /// SIGTERM the owner during load; a new node starts in its slot after `restart_after`.
    Terminate {
        /// Whose owner.
        partition: u32,
        /// The slot when nobody owns it.
        fallback: usize,
        /// How long the slot stays empty.
        restart_after: Duration,
    },
    /// `Admin::compact` of the ledger's journal during load (the history is read from its
    /// mirror, which keeps what the compaction purges).
    Compact,
    /// A rolling restart: every node in turn SIGTERMed (hand-off) and started again.
    RollingRestart,
}

/// The kinds of fault a schedule draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Kind {
    Kill,
    Freeze,
    ServerRestart,
    /// A kill of the R3 cluster's server that `Victim` names.
    ServerKill(Victim),
    Cut,
    Blip,
    Stall,
    Terminate,
    Compact,
    RollingRestart,
}

/// The kinds of the mixed one-server schedules, drawn one fault at a time (every-feature
/// schedules add a compaction and rolling restarts).
pub const MIXED: &[Kind] = &[
    Kind::Kill,
    Kind::Freeze,
    Kind::ServerRestart,
    Kind::Cut,
    Kind::Blip,
    Kind::Stall,
    Kind::Terminate,
];

/// The faults of a node or of its connection, which an R3 schedule draws from.
pub const NODE_FAULTS: [Kind; 7] = [
    Kind::Kill,
    Kind::Freeze,
    Kind::Cut,
    Kind::Blip,
    Kind::Stall,
    Kind::Terminate,
    Kind::RollingRestart,
];

impl Fault {
    /// A fault of `kind` with its target and timings drawn from `rng`, for a pin TTL of 1 s
    /// (a freeze outlasts it, a blip does not; [`cluster_schedule`] lengthens the freezes for
    /// its 1.5 s).
    pub fn random(kind: Kind, rng: &mut Rng, partitions: u32) -> Fault {
        let partition = rng.below(u64::from(partitions)) as u32;
        let fallback = rng.below(NODES as u64) as usize;
        match kind {
            Kind::Kill => Fault::Kill {
                partition,
                fallback,
                restart_after: rng.millis(200, 2500),
            },
            Kind::Freeze => Fault::Freeze {
                partition,
                fallback,
                hold: rng.millis(1500, 4000),
            },
            Kind::ServerRestart => Fault::ServerRestart {
                crash: rng.chance(50),
                down: rng.millis(100, 2000),
            },
            Kind::ServerKill(victim) => Fault::ServerKill {
                victim,
                partition,
                down: rng.millis(500, 4000),
            },
            Kind::Cut => Fault::Cut {
                partition,
                fallback,
                hold: rng.millis(300, 3000),
            },
            Kind::Blip => Fault::Blip {
                partition,
                fallback,
                hold: rng.millis(30, 300),
            },
            Kind::Stall => Fault::Stall {
                partition,
                fallback,
                hold: rng.millis(1200, 4000),
            },
            Kind::Terminate => Fault::Terminate {
                partition,
                fallback,
                restart_after: rng.millis(200, 2000),
            },
            Kind::Compact => Fault::Compact,
            Kind::RollingRestart => Fault::RollingRestart,
        }
    }
}

/// A one-server schedule: 2 to `faults` faults, each after a pause; with `Kind::Compact`
/// among `kinds`, exactly one compaction among them, at a random place.
pub fn schedule(seed: u64, kinds: &[Kind], faults: u64, partitions: u32) -> Vec<(Duration, Fault)> {
    let mut rng = Rng::new(seed);
    let count = 2 + rng.below(faults.max(2) - 1);
    let drawn: Vec<Kind> = kinds
        .iter()
        .copied()
        .filter(|k| *k != Kind::Compact)
        .collect();
    let mut plan: Vec<(Duration, Fault)> = (0..count)
        .map(|_| {
            let kind = rng.pick(&drawn);
            (
                rng.millis(300, 2000),
                Fault::random(kind, &mut rng, partitions),
            )
        })
        .collect();
    if kinds.contains(&Kind::Compact) {
        let at = rng.below(plan.len() as u64 + 1) as usize;
        plan.insert(at, (rng.millis(300, 2000), Fault::Compact));
    }
    plan
}

/// An R3 schedule: a leader kill and a second server kill (a leader or the owner's server;
/// down 250-2000 ms),
/// `node_faults` faults of distinct kinds drawn from [`NODE_FAULTS`] (so each kind is in
/// `node_faults` of 7 seeds), and one compaction, in a random order, each after a pause.
pub fn cluster_schedule(seed: u64, node_faults: usize, partitions: u32) -> Vec<(Duration, Fault)> {
    let mut rng = Rng::new(seed);
    let mut kinds = vec![
        Kind::ServerKill(rng.pick(&LEADERS)),
        Kind::ServerKill(rng.pick(&[LEADERS[0], LEADERS[1], LEADERS[2], Victim::OwnersServer])),
    ];
    let mut node_kinds = NODE_FAULTS.to_vec();
    rng.shuffle(&mut node_kinds);
    kinds.extend(node_kinds.into_iter().take(node_faults));
    kinds.push(Kind::Compact);
    rng.shuffle(&mut kinds);
    kinds
        .into_iter()
        .map(|kind| {
            let pause = rng.millis(200, 1000);
            let fault = match Fault::random(kind, &mut rng, partitions) {
                // Past the cluster's pin TTL of 1.5 s.
                Fault::Freeze {
                    partition,
                    fallback,
                    hold,
                } => Fault::Freeze {
                    partition,
                    fallback,
                    hold: hold + Duration::from_millis(1000),
                },
                // Elections take the time: a shorter outage keeps a seed near 40 s.
                Fault::ServerKill {
                    victim,
                    partition,
                    down,
                } => Fault::ServerKill {
                    victim,
                    partition,
                    down: down / 2,
                },
                fault => fault,
            };
            (pause, fault)
        })
        .collect()
}
