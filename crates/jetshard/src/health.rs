//! Health of a shard system in this process: [`ShardSystem::health`](crate::ShardSystem::health).
//!
//! Each owner posts its phase on a board (one atomic per partition) whenever it handles a
//! message, and before an acquisition, which it carries out inside one message: asking for
//! health never waits on an owner, even one busy rebuilding its partition. [`Health::judge`]
//! turns the phases into a verdict; it is pure, and unit-tested.
//!
//! Health is about this process: a partition another process owns (this one pulling as a
//! standby, or cooling down after a hand-off) is fine here, as long as this process can reach
//! the server. A process whose connection is down is [`Health::Disconnected`], whatever its
//! owners last posted: a standby that cannot reach the server cannot take a partition over.

use std::sync::atomic::{AtomicU8, Ordering};

/// Where one partition's owner in this process stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PartitionHealth {
    /// The owner has not started yet.
    Starting,
    /// Pulling as a standby: another process owns it, or nobody yet (no command came).
    Standby,
    /// Claiming, replaying the journal and recovering the commands in hand.
    Acquiring,
    /// Owned and serving commands.
    Serving,
    /// Owned, running the commands earlier owners held one at a time (a command may have
    /// killed a process, docs/OPERATIONS.md "Poison").
    Isolating,
    /// Stepped down or failed to acquire under the current pin: waiting for it to move.
    Refused,
    /// Handing the partition over (shutdown or balancing): finishing the commands in hand.
    Releasing,
    /// Handed off: not pulling for a while, so that another process takes it.
    CoolingDown,
    /// The owner failed; the system starts a new one shortly.
    Restarting,
}

impl PartitionHealth {
    const ALL: [PartitionHealth; 9] = [
        PartitionHealth::Starting,
        PartitionHealth::Standby,
        PartitionHealth::Acquiring,
        PartitionHealth::Serving,
        PartitionHealth::Isolating,
        PartitionHealth::Refused,
        PartitionHealth::Releasing,
        PartitionHealth::CoolingDown,
        PartitionHealth::Restarting,
    ];

    /// Whether this process serves what it should of the partition.
    pub fn is_fine(self) -> bool {
        matches!(
            self,
            PartitionHealth::Serving | PartitionHealth::Standby | PartitionHealth::CoolingDown
        )
    }

    /// The `snake_case` name (as in JSON and in `/readyz` of the example).
    pub fn as_str(self) -> &'static str {
        match self {
            PartitionHealth::Starting => "starting",
            PartitionHealth::Standby => "standby",
            PartitionHealth::Acquiring => "acquiring",
            PartitionHealth::Serving => "serving",
            PartitionHealth::Isolating => "isolating",
            PartitionHealth::Refused => "refused",
            PartitionHealth::Releasing => "releasing",
            PartitionHealth::CoolingDown => "cooling_down",
            PartitionHealth::Restarting => "restarting",
        }
    }

    fn index(self) -> u8 {
        Self::ALL.iter().position(|p| *p == self).unwrap_or(0) as u8
    }

    fn from_index(index: u8) -> Self {
        Self::ALL
            .get(usize::from(index))
            .copied()
            .unwrap_or(PartitionHealth::Starting)
    }
}

impl std::fmt::Display for PartitionHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The health of a shard system in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Health {
    /// Every partition this process owns is serving (possibly none: the others are standbys).
    Ready {
        /// The partitions it owns and serves.
        serving: Vec<u32>,
    },
    /// Some partitions are not as they should be: each with its owner's phase.
    Degraded {
        /// The partitions at fault, in order.
        partitions: Vec<(u32, PartitionHealth)>,
    },
    /// The process's connection to the server is down (the client is reconnecting): it can
    /// neither serve a partition nor take one over, whatever it owns. It says so before any
    /// owner notices, and says it of a process that owns nothing too: a readiness probe then
    /// holds a rolling deploy until the new process can reach the server.
    Disconnected,
    /// The shard system has stopped (shut down, or failed beyond its restart budget).
    Stopped,
}

impl Health {
    /// The verdict on the phases of a running system's owners (index = partition), when its
    /// connection to the server is up (`connected`); [`Health::Disconnected`] otherwise.
    pub fn judge(connected: bool, phases: &[PartitionHealth]) -> Health {
        if !connected {
            return Health::Disconnected;
        }
        let partitions: Vec<(u32, PartitionHealth)> = (0u32..)
            .zip(phases.iter().copied())
            .filter(|(_, phase)| !phase.is_fine())
            .collect();
        if partitions.is_empty() {
            let serving = (0u32..)
                .zip(phases)
                .filter(|(_, phase)| **phase == PartitionHealth::Serving)
                .map(|(partition, _)| partition)
                .collect();
            return Health::Ready { serving };
        }
        Health::Degraded { partitions }
    }

    /// Whether it is [`Health::Ready`].
    pub fn is_ready(&self) -> bool {
        matches!(self, Health::Ready { .. })
    }
}

/// The owners' phases, one slot per partition.
pub(crate) struct HealthBoard {
    phases: Vec<AtomicU8>,
}

impl HealthBoard {
    pub(crate) fn new(partitions: u32) -> Self {
        let starting = PartitionHealth::Starting.index();
        Self {
            phases: (0..partitions).map(|_| AtomicU8::new(starting)).collect(),
        }
    }

    pub(crate) fn set(&self, partition: u32, phase: PartitionHealth) {
        if let Some(slot) = self.phases.get(partition as usize) {
            slot.store(phase.index(), Ordering::Relaxed);
        }
    }

    pub(crate) fn phases(&self) -> Vec<PartitionHealth> {
        self.phases
            .iter()
            .map(|slot| PartitionHealth::from_index(slot.load(Ordering::Relaxed)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PartitionHealth::*;

    #[test]
    fn serving_and_standby_partitions_are_ready() {
        assert_eq!(
            Health::judge(true, &[Serving, Standby, CoolingDown, Serving]),
            Health::Ready {
                serving: vec![0, 3]
            }
        );
    }

    #[test]
    fn a_process_owning_nothing_is_ready() {
        assert!(Health::judge(true, &[Standby, Standby]).is_ready());
    }

    #[test]
    fn a_process_that_cannot_reach_its_server_is_not_ready_whatever_it_owns() {
        assert_eq!(
            Health::judge(false, &[Standby, Standby]),
            Health::Disconnected
        );
        assert_eq!(Health::judge(false, &[Serving]), Health::Disconnected);
        assert!(!Health::Disconnected.is_ready());
    }

    #[test]
    fn acquiring_refused_isolating_releasing_starting_and_restarting_are_degraded() {
        let phases = [
            Serving, Acquiring, Refused, Isolating, Releasing, Starting, Restarting,
        ];
        assert_eq!(
            Health::judge(true, &phases),
            Health::Degraded {
                partitions: vec![
                    (1, Acquiring),
                    (2, Refused),
                    (3, Isolating),
                    (4, Releasing),
                    (5, Starting),
                    (6, Restarting),
                ]
            }
        );
    }

    #[test]
    fn the_board_reads_back_every_phase() {
        let board = HealthBoard::new(PartitionHealth::ALL.len() as u32);
        assert!(board.phases().iter().all(|p| *p == Starting));
        for (partition, phase) in (0u32..).zip(PartitionHealth::ALL) {
            board.set(partition, phase);
        }
        assert_eq!(board.phases(), PartitionHealth::ALL.to_vec());
        board.set(99, Serving);
    }
}
