//! Builder settings of the streams, the consumers and a command's delivery: partitions, node
//! id, pin TTL, ack wait, deliveries, pulls, codec, retention, replicas, journal streams,
//! duplicate window, write timeout and retry delay.

use std::time::Duration;

use super::{CommandRetention, ShardConfigBuilder};
use crate::codec::Codec;

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
        self.config.command_retention = retention;
        self
    }

    /// Stream replicas: 1, 3 or 5 (default 1; use 3 on a clustered JetStream).
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.config.replicas = replicas;
        self
    }

    /// How many streams hold the journal (default 1, `<T>_JOURNAL`; at most the partition
    /// count): partition `p`'s records go to stream `<T>_JOURNAL_<k>`, `k = p % streams`, each
    /// a raft group of its own on a cluster, so that the journal's writes are led by as many
    /// servers as there are streams rather than one. Fixed for the life of the streams: it
    /// decides where stored records are read, and is recorded with the streams at their
    /// creation (a process configured otherwise is refused at start).
    pub fn journal_streams(mut self, streams: u32) -> Self {
        self.config.journal_streams = streams;
        self
    }

    /// Whether the owner of partition 0 keeps the leaders of a journal spread over several
    /// replicated streams spread over the servers (default on; a step-down towards the server
    /// leading the fewest while one leads two more, every 5 s at most, see
    /// docs/OPERATIONS.md). Off where an operator places leaders: the server itself elects a
    /// new stream's leader at random and never moves one back after a restart.
    pub fn spread_leaders(mut self, on: bool) -> Self {
        self.config.spread_leaders = on;
        self
    }

    /// The journal's de-duplication window (default 10 min); must cover a command's whole
    /// redelivery span, `ack_wait * max_deliver`.
    pub fn duplicate_window(mut self, window: Duration) -> Self {
        self.config.duplicate_window = window;
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
}
