//! Configuration of one entity type's shard system, validated when built.

use std::time::Duration;

use crate::codec::Codec;
use crate::error::ConfigError;
use crate::wire::is_valid_entity_type;

/// How the command stream keeps commands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommandRetention {
    /// A command is deleted once acknowledged (JetStream work-queue retention).
    #[default]
    WorkQueue,
    /// Commands are kept by the stream's limits after acknowledgement (an audit trail).
    Limits,
}

/// The validated configuration of one entity type's shard system.
///
/// Built with [`ShardConfig::builder`]; every setting has a default suited to a small cluster.
#[derive(Clone, Debug)]
pub struct ShardConfig {
    pub(crate) entity_type: String,
    pub(crate) partitions: u32,
    pub(crate) node_id: String,
    pub(crate) pin_ttl: Duration,
    pub(crate) ack_wait: Duration,
    pub(crate) max_deliver: u32,
    pub(crate) max_ack_pending: u32,
    pub(crate) pull_batch: u32,
    pub(crate) codec: Codec,
    pub(crate) retention: CommandRetention,
    pub(crate) replicas: usize,
    pub(crate) duplicate_window: Duration,
    pub(crate) passivate_after: Duration,
    pub(crate) max_resident_entities: Option<usize>,
    pub(crate) max_dormant_entities: Option<usize>,
    pub(crate) max_dormant_bytes: Option<usize>,
    pub(crate) snapshot_every: Option<u32>,
    pub(crate) snapshot_on_passivation: bool,
    pub(crate) retry_delay: Duration,
    pub(crate) write_timeout: Duration,
    pub(crate) max_entity_restarts: u32,
    pub(crate) restart_window: Duration,
    pub(crate) max_owner_restarts: u32,
    pub(crate) owner_restart_window: Duration,
    pub(crate) balance: bool,
    pub(crate) crash_probe_interval: Option<Duration>,
    pub(crate) crash_watchers: usize,
    pub(crate) standbys: usize,
    pub(crate) compaction_interval: Option<Duration>,
    pub(crate) compaction_budget: u32,
    pub(crate) dead_letter_retention: Option<Duration>,
}

impl ShardConfig {
    /// Starts a builder for the entity type `entity_type`: a lowercase token (`order`,
    /// `sensor-reading`) that names its streams, subjects and consumers.
    pub fn builder(entity_type: impl Into<String>) -> ShardConfigBuilder {
        ShardConfigBuilder {
            config: ShardConfig {
                entity_type: entity_type.into(),
                partitions: 8,
                node_id: default_node_id(),
                pin_ttl: Duration::from_secs(2),
                ack_wait: Duration::from_secs(10),
                max_deliver: 5,
                max_ack_pending: 1024,
                pull_batch: 256,
                codec: Codec::default(),
                retention: CommandRetention::default(),
                replicas: 1,
                duplicate_window: Duration::from_secs(10 * 60),
                passivate_after: Duration::from_secs(30),
                max_resident_entities: None,
                max_dormant_entities: Some(100_000),
                max_dormant_bytes: None,
                snapshot_every: Some(100),
                snapshot_on_passivation: true,
                retry_delay: Duration::from_millis(250),
                write_timeout: Duration::from_secs(10),
                max_entity_restarts: 20,
                restart_window: Duration::from_secs(10),
                max_owner_restarts: 10,
                owner_restart_window: Duration::from_secs(60),
                balance: true,
                crash_probe_interval: Some(Duration::from_millis(20)),
                crash_watchers: 3,
                standbys: 2,
                compaction_interval: Some(Duration::from_secs(30)),
                compaction_budget: 8,
                dead_letter_retention: Some(Duration::from_secs(7 * 24 * 3600)),
            },
        }
    }

    /// The entity type token.
    pub fn entity_type(&self) -> &str {
        &self.entity_type
    }

    /// The number of partitions.
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// This process's node id, written into fence records.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The codec of commands and events.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// How long a partition's pin outlives its holder's last pull.
    pub fn pin_ttl(&self) -> Duration {
        self.pin_ttl
    }

    /// How long a delivered command may stay unacknowledged before it is redelivered.
    pub fn ack_wait(&self) -> Duration {
        self.ack_wait
    }

    /// How often a command is delivered before it is given up.
    pub fn max_deliver(&self) -> u32 {
        self.max_deliver
    }

    /// The command stream's retention.
    pub fn command_retention(&self) -> CommandRetention {
        self.retention
    }

    /// The names of this entity type's streams, subjects and consumers.
    pub fn names(&self) -> crate::wire::Names {
        crate::wire::Names::new(&self.entity_type)
    }

    /// How long a pull request waits at the server: a third of the pin TTL, so that a fresh pull
    /// carrying the pin id reaches the server well before the pin could expire.
    pub(crate) fn pull_expires(&self) -> Duration {
        (self.pin_ttl / 3).max(Duration::from_millis(50))
    }
}

/// Builds a [`ShardConfig`]; [`build`](Self::build) validates it.
#[derive(Clone, Debug)]
#[must_use]
pub struct ShardConfigBuilder {
    config: ShardConfig,
}

impl ShardConfigBuilder {
    /// Number of partitions (1..=4096; default 8). Fixed for the life of the streams.
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.config.partitions = partitions;
        self
    }

    /// This process's node id (default: `<hostname>-<pid>`); shown in fence records and logs.
    pub fn node_id(mut self, node_id: impl Into<String>) -> Self {
        self.config.node_id = node_id.into();
        self
    }

    /// Pin TTL: how long after the owner's last pull the server moves a partition to a standby
    /// (the consumer's `priority_timeout`; default 2 s, at least 300 ms).
    pub fn pin_ttl(mut self, ttl: Duration) -> Self {
        self.config.pin_ttl = ttl;
        self
    }

    /// Ack wait: how long a delivered command may go unacknowledged before the server
    /// redelivers it (default 10 s). Owners extend it for commands that wait their turn.
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.config.ack_wait = ack_wait;
        self
    }

    /// How often a command is delivered before it is given up (terminated and dead-lettered)
    /// (default 5, at least 1): a command that fails on a delivery whose count (the server's,
    /// takeovers included) has reached this is given up. The server itself never gives a
    /// command up (the consumers' own `max_deliver` is unlimited), so nothing is dropped
    /// without a dead letter.
    pub fn max_deliver(mut self, max_deliver: u32) -> Self {
        self.config.max_deliver = max_deliver;
        self
    }

    /// Unacknowledged commands a partition may hold at once (default 1024).
    pub fn max_ack_pending(mut self, max_ack_pending: u32) -> Self {
        self.config.max_ack_pending = max_ack_pending;
        self
    }

    /// Commands asked for in one pull request (default 256).
    pub fn pull_batch(mut self, batch: u32) -> Self {
        self.config.pull_batch = batch;
        self
    }

    /// The codec of commands and events (default bincode).
    pub fn codec(mut self, codec: Codec) -> Self {
        self.config.codec = codec;
        self
    }

    /// Retention of the command stream (default work-queue).
    pub fn command_retention(mut self, retention: CommandRetention) -> Self {
        self.config.retention = retention;
        self
    }

    /// Stream replicas: 1, 3 or 5 (default 1; use 3 on a clustered JetStream).
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.config.replicas = replicas;
        self
    }

    /// The journal's de-duplication window (default 10 min); must cover a command's whole
    /// redelivery span, `ack_wait * max_deliver`.
    pub fn duplicate_window(mut self, window: Duration) -> Self {
        self.config.duplicate_window = window;
        self
    }

    /// An entity with no command for this long is passivated (default 30 s): its actor stops
    /// and hands its state back to the partition's owner, which keeps it in a compact map
    /// (tens of bytes beyond the state, against kilobytes for a live actor) until the entity's
    /// next command starts a new actor with it.
    ///
    /// Passivation frees the actor only, never the state: every entity of a partition this
    /// process owns stays in memory, passivated or not (unlike Akka, where a passivated entity
    /// leaves memory). Memory is bounded by the entities owned, not by the active ones.
    pub fn passivate_after(mut self, idle: Duration) -> Self {
        self.config.passivate_after = idle;
        self
    }

    /// A cap on live entity actors in this process, over all its partitions (default none).
    /// Past it, the least recently active idle entities are passivated (down to 90 % of the
    /// cap); an entity with commands in hand is never passivated, so the cap can be exceeded by
    /// the entities busy at once.
    pub fn max_resident_entities(mut self, cap: usize) -> Self {
        self.config.max_resident_entities = Some(cap);
        self
    }

    /// A budget of entity states kept in memory without an actor (passivated, "dormant"), in
    /// this process over all its partitions (default 100 000). Past it, each owner drops its
    /// least recently used dormant states (down to 90 % of the budget); a dropped entity is
    /// loaded again from the journal (its latest snapshot and the records after it) on its next
    /// command. So memory is set by the entities in use, not by every entity the partitions have
    /// seen. `None` ([`unbounded_dormant_entities`](Self::unbounded_dormant_entities)): keep them
    /// all.
    pub fn max_dormant_entities(mut self, budget: usize) -> Self {
        self.config.max_dormant_entities = Some(budget);
        self
    }

    /// A budget of dormant states in bytes, in this process over all its partitions (default
    /// none: only [`max_dormant_entities`](Self::max_dormant_entities) bounds them). A dormant
    /// state is kept encoded (the entity type's codec) and decoded when the entity's next actor
    /// starts, so what it holds is known: one allocation of its encoding, its id and about 8
    /// bytes of sequences, plus its share of the owner's hash set, counted at 39 bytes (the
    /// table right after it grew; [`PartitionStatus::dormant_bytes`](crate::PartitionStatus::dormant_bytes)
    /// shows the sum). Both budgets apply, and past either one each owner drops its least
    /// recently used states (down to 90 % of it). At least 1024 bytes.
    pub fn max_dormant_bytes(mut self, bytes: usize) -> Self {
        self.config.max_dormant_bytes = Some(bytes);
        self
    }

    /// Keeps every dormant state in memory (no [`max_dormant_entities`](Self::max_dormant_entities)).
    pub fn unbounded_dormant_entities(mut self) -> Self {
        self.config.max_dormant_entities = None;
        self
    }

    /// Writes a snapshot of an entity's state after every `events` events it wrote since its
    /// last one (default 100), unless the entity type opted out ([`Entity::snapshots`]); 0: no
    /// periodic snapshots. Each snapshot is one more fenced journal write, of the whole state.
    ///
    /// [`Entity::snapshots`]: crate::Entity::snapshots
    pub fn snapshot_every(mut self, events: u32) -> Self {
        self.config.snapshot_every = (events > 0).then_some(events);
        self
    }

    /// Whether an entity writes a snapshot of its state when it is passivated and when its
    /// partition is released or handed off, if it wrote events since its last one (default on;
    /// not for entity types that opted out, [`Entity::snapshots`]).
    ///
    /// [`Entity::snapshots`]: crate::Entity::snapshots
    pub fn snapshot_on_passivation(mut self, on: bool) -> Self {
        self.config.snapshot_on_passivation = on;
        self
    }

    /// Base delay of a command's retry after a failure (default 250 ms; doubled per delivery).
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.config.retry_delay = delay;
        self
    }

    /// How long a journal write may wait for the server's acknowledgement (default 10 s).
    pub fn write_timeout(mut self, timeout: Duration) -> Self {
        self.config.write_timeout = timeout;
        self
    }

    /// Escalation: if entity actors of one partition crash more than `restarts` times within
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
        self.config.crash_probe_interval = match on {
            true => self
                .config
                .crash_probe_interval
                .or(Some(Duration::from_millis(20))),
            false => None,
        };
        self
    }

    /// How often each owner compacts its partition in the background (default 30 s): it
    /// purges what the journal shows no live state needs (an entity's events, timer records
    /// and older snapshots its latest snapshot covers, the outbox records of confirmed
    /// messages, the timer records of timers no longer armed, dead letters past
    /// [`dead_letter_retention`]), by the rules of [`Admin::compact`], off the command path,
    /// its purges paced (spread over half the interval, at most [`compaction_budget`] per
    /// 100 ms, a pause of 4 times each purge's time after it; faster only when a sweep would
    /// not otherwise be done within the interval, 4 purges at a time once past it). Each partition sweeps at its own phase of
    /// the interval. Each sweep reads the snapshots written since
    /// the last one, and the partition's outbox and timer records (bounded by what is live,
    /// once compacted). Must be at least 100 ms.
    ///
    /// [`dead_letter_retention`]: Self::dead_letter_retention
    /// [`compaction_budget`]: Self::compaction_budget
    /// [`Admin::compact`]: crate::Admin::compact
    pub fn compaction_interval(mut self, interval: Duration) -> Self {
        self.config.compaction_interval = Some(interval);
        self
    }

    /// Whether owners compact their partitions in the background (default on, see
    /// [`compaction_interval`](Self::compaction_interval)). Off: the journal grows until an
    /// operator runs [`Admin::compact`](crate::Admin::compact).
    pub fn compaction(mut self, on: bool) -> Self {
        self.config.compaction_interval = match on {
            true => self
                .config
                .compaction_interval
                .or(Some(Duration::from_secs(30))),
            false => None,
        };
        self
    }

    /// How many purge requests an owner's background compaction sends per 100 ms at most
    /// (default 8; at least 1), one at a time: a sweep spreads its purges over half its
    /// interval, so this caps only a sweep with more than the budget allows in that time. A
    /// sweep that would not be done within its interval at this rate sends faster, so that
    /// the journal stays bounded at any write rate (one purge per entity snapshotted since
    /// the last sweep).
    pub fn compaction_budget(mut self, purges_per_tick: u32) -> Self {
        self.config.compaction_budget = purges_per_tick;
        self
    }

    /// How long the background compaction keeps a dead letter (default 7 days; above zero).
    /// A dead letter whose command is above its partition's ack floor is kept whatever its
    /// age (see [`Admin::purge_dead_letters`](crate::Admin::purge_dead_letters)).
    pub fn dead_letter_retention(mut self, retention: Duration) -> Self {
        self.config.dead_letter_retention = Some(retention);
        self
    }

    /// Keeps dead letters until an operator purges them
    /// ([`Admin::purge_dead_letters`](crate::Admin::purge_dead_letters)).
    pub fn keep_dead_letters(mut self) -> Self {
        self.config.dead_letter_retention = None;
        self
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first setting out of range.
    pub fn build(self) -> Result<ShardConfig, ConfigError> {
        let c = self.config;
        let fail = |field, reason: &str| {
            Err(ConfigError {
                field,
                reason: reason.to_owned(),
            })
        };
        if !is_valid_entity_type(&c.entity_type) {
            return fail(
                "entity_type",
                "must be a lowercase token: a letter, then letters, digits, '-' or '_', at most 32",
            );
        }
        if !(1..=4096).contains(&c.partitions) {
            return fail("partitions", "must be in 1..=4096");
        }
        if c.node_id.is_empty() || c.node_id.len() > 128 {
            return fail("node_id", "must be 1 to 128 bytes");
        }
        if c.pin_ttl < Duration::from_millis(300) {
            return fail("pin_ttl", "must be at least 300 ms");
        }
        if c.crash_probe_interval
            .is_some_and(|i| i < Duration::from_millis(5) || i > c.pin_ttl)
        {
            return fail("crash_probe_interval", "must be in 5 ms..=pin_ttl");
        }
        if !(1..=64).contains(&c.crash_watchers) {
            return fail("crash_watchers", "must be in 1..=64");
        }
        if !(1..=64).contains(&c.standbys) {
            return fail("standbys", "must be in 1..=64");
        }
        if c.ack_wait < Duration::from_millis(500) {
            return fail("ack_wait", "must be at least 500 ms");
        }
        if c.max_deliver == 0 {
            return fail("max_deliver", "must be at least 1");
        }
        if c.max_resident_entities == Some(0) {
            return fail("max_resident_entities", "must be at least 1");
        }
        if c.max_dormant_entities == Some(0) {
            return fail("max_dormant_entities", "must be at least 1");
        }
        if c.max_dormant_bytes.is_some_and(|bytes| bytes < 1024) {
            return fail("max_dormant_bytes", "must be at least 1024");
        }
        if c.compaction_interval
            .is_some_and(|i| i < Duration::from_millis(100))
        {
            return fail("compaction_interval", "must be at least 100 ms");
        }
        if c.compaction_budget == 0 {
            return fail("compaction_budget", "must be at least 1");
        }
        if c.dead_letter_retention.is_some_and(|r| r.is_zero()) {
            return fail("dead_letter_retention", "must be above zero");
        }
        if c.max_ack_pending == 0 || c.pull_batch == 0 {
            return fail(
                "max_ack_pending",
                "max_ack_pending and pull_batch must be at least 1",
            );
        }
        if ![1, 3, 5].contains(&c.replicas) {
            return fail("replicas", "must be 1, 3 or 5");
        }
        if c.duplicate_window < c.ack_wait.saturating_mul(c.max_deliver) {
            return fail(
                "duplicate_window",
                "must be at least ack_wait * max_deliver",
            );
        }
        // Each zero duration names its own builder setting (the windows are the second
        // argument of the escalation settings).
        for (field, duration, reason) in [
            ("passivate_after", c.passivate_after, "must be above zero"),
            ("write_timeout", c.write_timeout, "must be above zero"),
            (
                "max_entity_restarts",
                c.restart_window,
                "the window must be above zero",
            ),
            (
                "max_owner_restarts",
                c.owner_restart_window,
                "the window must be above zero",
            ),
        ] {
            if duration.is_zero() {
                return fail(field, reason);
            }
        }
        Ok(c)
    }
}

fn default_node_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".to_owned());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let c = ShardConfig::builder("order").build().unwrap();
        assert_eq!(c.partitions(), 8);
        assert!(c.pull_expires() < c.pin_ttl() / 2);
    }

    #[test]
    fn out_of_range_settings_name_the_field() {
        let cases = [
            (ShardConfig::builder("Order"), "entity_type"),
            (ShardConfig::builder("order").partitions(0), "partitions"),
            (
                ShardConfig::builder("order").pin_ttl(Duration::from_millis(10)),
                "pin_ttl",
            ),
            (ShardConfig::builder("order").max_deliver(0), "max_deliver"),
            (
                ShardConfig::builder("order").max_dormant_entities(0),
                "max_dormant_entities",
            ),
            (
                ShardConfig::builder("order").max_dormant_bytes(1023),
                "max_dormant_bytes",
            ),
            (ShardConfig::builder("order").replicas(2), "replicas"),
            (
                ShardConfig::builder("order").compaction_interval(Duration::from_millis(10)),
                "compaction_interval",
            ),
            (
                ShardConfig::builder("order").compaction_budget(0),
                "compaction_budget",
            ),
            (
                ShardConfig::builder("order").dead_letter_retention(Duration::ZERO),
                "dead_letter_retention",
            ),
            (
                ShardConfig::builder("order").duplicate_window(Duration::from_secs(1)),
                "duplicate_window",
            ),
        ];
        for (builder, field) in cases {
            assert_eq!(builder.build().unwrap_err().field, field);
        }
    }

    #[test]
    fn a_zero_duration_names_its_own_setting() {
        let cases = [
            (
                ShardConfig::builder("order").passivate_after(Duration::ZERO),
                "passivate_after",
            ),
            (
                ShardConfig::builder("order").write_timeout(Duration::ZERO),
                "write_timeout",
            ),
            (
                ShardConfig::builder("order").max_entity_restarts(3, Duration::ZERO),
                "max_entity_restarts",
            ),
            (
                ShardConfig::builder("order").max_owner_restarts(3, Duration::ZERO),
                "max_owner_restarts",
            ),
        ];
        for (builder, field) in cases {
            let error = builder.build().unwrap_err();
            assert_eq!(error.field, field, "{error}");
            assert!(error.reason.contains("above zero"), "{error}");
        }
    }
}
