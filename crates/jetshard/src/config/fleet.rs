//! Builder settings of the processes together: restart escalation, balancing, the crash watch
//! and standbys.

use std::time::Duration;

use super::{DEFAULT_CRASH_PROBE_INTERVAL, ShardConfigBuilder, switched};

impl ShardConfigBuilder {
    /// `window`, the owner gives the partition up (default 20 in 10 s).
    pub fn max_entity_restarts(mut self, restarts: u32, window: Duration) -> Self {
        self.config.max_entity_restarts = restarts;
        self.config.restart_window = window;
        self
    }

    /// Escalation: if partition owners of this system fail more than `restarts` times within
    /// `window`, the system itself fails, which its supervisor sees (default 10 in 60 s).
    /// Each failed owner is restarted as a standby after a second.
    pub fn max_owner_restarts(mut self, restarts: u32, window: Duration) -> Self {
        self.config.max_owner_restarts = restarts;
        self.config.owner_restart_window = window;
        self
    }

    /// Whether this process hands partitions off to processes that own fewer, so that the
    /// processes of an entity type share the partitions evenly (default on). Off: a partition
    /// stays with whichever process the server pinned until that process stops or stalls.
    pub fn balance(mut self, balance: bool) -> Self {
        self.config.balance = balance;
        self
    }

    /// How often this process asks each process that owns partitions whether it is still
    /// there (default 20 ms; a request on `<t>.alive.<incarnation>` per owning process). A
    /// process found gone ("no responders" twice, 20 ms apart) has its partitions unpinned at
    /// once, so a standby takes them over in milliseconds instead of after the pin TTL. A probe
    /// that times out counts for nothing: a stalled owner keeps its pin until the TTL.
    pub fn crash_probe_interval(mut self, interval: Duration) -> Self {
        self.config.crash_probe_interval = Some(interval);
        self
    }

    /// How many other processes watch each owning process for a crash (default 3). Each
    /// process probes only the owners it is chosen to watch (rendezvous hashing over the
    /// processes heard on `<t>.nodes`), so the probes a process sends do not grow with the
    /// fleet: about `watchers / crash_probe_interval` requests a second (150 at the defaults),
    /// whatever the number of processes. More watchers make it likelier that one survives an
    /// owner that dies with others at once; an owner whose watchers all die with it moves
    /// after the pin TTL, as without a watch.
    pub fn crash_watchers(mut self, watchers: usize) -> Self {
        self.config.crash_watchers = watchers;
        self
    }

    /// How many processes stand by for each partition besides its owner (default 2): they keep
    /// a pull waiting on its consumer, so the server pins one of them within a millisecond when
    /// the owner's pin is taken away (a crash found by the watch, a hand-off). The others do
    /// not pull it, so a partition costs the same pulls in a fleet of 3 and of 300. Chosen by
    /// rendezvous hashing over the processes heard on `<t>.nodes` (every one, in a fleet of
    /// `standbys + 1` or fewer, and while balancing is off); see `balance.rs` for what happens
    /// when they all die.
    pub fn standbys(mut self, standbys: usize) -> Self {
        self.config.standbys = standbys;
        self
    }

    /// Whether this process watches for crashed owners (default on; see
    /// [`crash_probe_interval`](Self::crash_probe_interval)). Off: a crashed owner's partitions
    /// move after the pin TTL, unless another process watches.
    pub fn crash_detection(mut self, on: bool) -> Self {
        self.config.crash_probe_interval = switched(
            self.config.crash_probe_interval,
            on,
            DEFAULT_CRASH_PROBE_INTERVAL,
        );
        self
    }
}
