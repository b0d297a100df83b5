//! Configuration of one entity type's shard system, validated when built.
//!
//! [`ShardConfig`] holds the settings and the accessors the runtime reads; its builder's
//! setters are grouped by what they govern, one file each:
//!
//! | file | settings |
//! |---|---|
//! | `delivery.rs` | partitions, node id, the consumers (pin TTL, ack wait, deliveries, pulls), the streams (codec, retention, replicas, journal streams, duplicate window), write timeout and retry delay |
//! | `entities.rs` | entities in memory (passivation, the resident cap, the dormant budgets) and their snapshots |
//! | `fleet.rs` | the processes together: restart escalation, balancing, the crash watch, standbys |
//! | `compaction.rs` | background compaction and dead-letter retention |
//! | `validate.rs` | [`ShardConfigBuilder::build`]: every setting checked, the first out of range named |
//!
//! Each setter is written out, though most only store their value: its docs are the reference of
//! the setting, and a macro would save two lines a setter while hiding its signature from a
//! reader, from grep and from rustdoc's source view (and several setters do more than store).

mod compaction;
mod delivery;
mod entities;
mod fleet;
mod validate;

use std::time::Duration;

use crate::codec::Codec;

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
    pub(crate) command_retention: CommandRetention,
    pub(crate) replicas: usize,
    pub(crate) journal_streams: u32,
    pub(crate) spread_leaders: bool,
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
                command_retention: CommandRetention::default(),
                replicas: 1,
                journal_streams: 1,
                spread_leaders: true,
                duplicate_window: Duration::from_secs(10 * 60),
                passivate_after: Duration::from_secs(30),
                max_resident_entities: None,
                max_dormant_entities: Some(DEFAULT_MAX_DORMANT_ENTITIES),
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
                crash_probe_interval: Some(DEFAULT_CRASH_PROBE_INTERVAL),
                crash_watchers: 3,
                standbys: 2,
                compaction_interval: Some(DEFAULT_COMPACTION_INTERVAL),
                compaction_budget: 8,
                dead_letter_retention: Some(DEFAULT_DEAD_LETTER_RETENTION),
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
        self.command_retention
    }

    /// The number of streams the journal is spread over.
    pub fn journal_streams(&self) -> u32 {
        self.journal_streams
    }

    /// The names of this entity type's streams, subjects and consumers.
    pub fn names(&self) -> crate::wire::Names {
        crate::wire::Names::spread(&self.entity_type, self.journal_streams, self.partitions)
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

/// How often the crash watch probes, unless set (`crash_probe_interval`).
const DEFAULT_CRASH_PROBE_INTERVAL: Duration = Duration::from_millis(20);

/// How often background compaction sweeps, unless set (`compaction_interval`).
const DEFAULT_COMPACTION_INTERVAL: Duration = Duration::from_secs(30);

/// How long background compaction keeps a dead letter, unless set (`dead_letter_retention`).
const DEFAULT_DEAD_LETTER_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// How many dormant states a process keeps, unless set (`max_dormant_entities`).
const DEFAULT_MAX_DORMANT_ENTITIES: usize = 100_000;

/// An optional setting switched on (the one set, else `default`) or off (none): what the
/// builder's `compaction(on)`, `crash_detection(on)`, `dead_letter_expiry(on)` and
/// `dormant_entity_budget(on)` do.
fn switched<T>(value: Option<T>, on: bool, default: T) -> Option<T> {
    on.then(|| value.unwrap_or(default))
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
    fn an_interval_switched_on_keeps_the_one_set_and_off_clears_it() {
        let set = Duration::from_millis(500);
        let built = |b: ShardConfigBuilder| b.build().unwrap();
        let c = built(
            ShardConfig::builder("order")
                .compaction_interval(set)
                .compaction(true),
        );
        assert_eq!(c.compaction_interval, Some(set));
        let c = built(ShardConfig::builder("order").compaction(false));
        assert_eq!(c.compaction_interval, None);
        let c = built(
            ShardConfig::builder("order")
                .compaction(false)
                .compaction(true),
        );
        assert_eq!(c.compaction_interval, Some(DEFAULT_COMPACTION_INTERVAL));
        let c = built(
            ShardConfig::builder("order")
                .crash_probe_interval(set)
                .crash_detection(true),
        );
        assert_eq!(c.crash_probe_interval, Some(set));
        let c = built(
            ShardConfig::builder("order")
                .crash_detection(false)
                .crash_detection(true),
        );
        assert_eq!(c.crash_probe_interval, Some(DEFAULT_CRASH_PROBE_INTERVAL));
        let c = built(ShardConfig::builder("order").crash_detection(false));
        assert_eq!(c.crash_probe_interval, None);
    }

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
                ShardConfig::builder("order").journal_streams(0),
                "journal_streams",
            ),
            (
                ShardConfig::builder("order")
                    .partitions(4)
                    .journal_streams(5),
                "journal_streams",
            ),
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
