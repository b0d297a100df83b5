//! Builder settings of background compaction and of dead letters' retention.

use std::time::Duration;

use super::{
    DEFAULT_COMPACTION_INTERVAL, DEFAULT_DEAD_LETTER_RETENTION, ShardConfigBuilder, switched,
};

impl ShardConfigBuilder {
    /// How often each owner compacts its partition in the background (default 30 s): it
    /// purges what the journal shows no live state needs (an entity's events, timer records
    /// and older snapshots its latest snapshot covers, the outbox records of confirmed
    /// messages, the timer records of timers no longer armed, dead letters past
    /// [`dead_letter_retention`]), by the rules of [`Admin::compact`], off the command path,
    /// its purges paced (spread over 80% of the interval, at most [`compaction_budget`] per
    /// 100 ms, a pause of 4 times each purge's time after it; faster only when a sweep would
    /// not otherwise be done within the interval, 4 purges at a time once past it). Each partition sweeps at its own phase of
    /// the interval, on a fixed schedule (a sweep past its interval delays the next), and plans
    /// what was written up to 2 s (at most an interval) before it: between sweeps the journal
    /// also holds about an interval of writes. Each sweep reads the snapshots written since
    /// the last one, and the partition's outbox and timer records (bounded by what is live,
    /// once compacted). Must be at least 100 ms.
    ///
    /// [`dead_letter_retention`]: Self::dead_letter_retention
    /// [`compaction_budget`]: Self::compaction_budget
    /// [`Admin::compact`]: crate::admin::Admin::compact
    pub fn compaction_interval(mut self, interval: Duration) -> Self {
        self.config.compaction_interval = Some(interval);
        self
    }

    /// Whether owners compact their partitions in the background (default on, see
    /// [`compaction_interval`](Self::compaction_interval)). Off: the journal grows until an
    /// operator runs [`Admin::compact`](crate::admin::Admin::compact).
    pub fn compaction(mut self, on: bool) -> Self {
        self.config.compaction_interval = switched(
            self.config.compaction_interval,
            on,
            DEFAULT_COMPACTION_INTERVAL,
        );
        self
    }

    /// How many purge requests an owner's background compaction sends per 100 ms at most
    /// (default 8; at least 1), one at a time: a sweep spreads its purges over 80% of its
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
    /// age (see [`Admin::purge_dead_letters`](crate::admin::Admin::purge_dead_letters)).
    pub fn dead_letter_retention(mut self, retention: Duration) -> Self {
        self.config.dead_letter_retention = Some(retention);
        self
    }

    /// Whether the background compaction purges dead letters past their
    /// [`dead_letter_retention`](Self::dead_letter_retention) (default on). Off: dead letters
    /// are kept until an operator purges them
    /// ([`Admin::purge_dead_letters`](crate::admin::Admin::purge_dead_letters)).
    pub fn dead_letter_expiry(mut self, on: bool) -> Self {
        self.config.dead_letter_retention = switched(
            self.config.dead_letter_retention,
            on,
            DEFAULT_DEAD_LETTER_RETENTION,
        );
        self
    }
}
