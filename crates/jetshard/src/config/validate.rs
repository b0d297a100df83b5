//! [`ShardConfigBuilder::build`]: every setting checked, the first one out of range named.

use std::time::Duration;

use super::{ShardConfig, ShardConfigBuilder};
use crate::error::ConfigError;
use crate::wire::is_valid_entity_type;

impl ShardConfigBuilder {
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
        if !(1..=c.partitions.min(256)).contains(&c.journal_streams) {
            return fail(
                "journal_streams",
                "must be in 1..=256 and at most the partition count",
            );
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
