//! The [`Admin`] handle and what it reads of partitions and nodes: overview, pause and resume,
//! moving a pin, queries.

use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::{self, Context};
use futures::StreamExt;

use crate::error::Error;
use crate::journal::fence;
use crate::journal::server::{Streams, recorded_names, stream_info};
use crate::query::{self, QueryAnswer};
use crate::status::NodeStatus;
use crate::wire::{Names, PRIORITY_GROUP};

/// One partition as the server sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionOverview {
    /// The partition.
    pub partition: u32,
    /// The latest generation claimed (0 if never owned).
    pub generation: u64,
    /// The node that claimed it.
    pub owner: Option<String>,
    /// Whether the server has a pinned client for the partition now.
    pub pinned: bool,
    /// Commands not yet delivered.
    pub pending: u64,
    /// Commands delivered and not yet acknowledged.
    pub ack_pending: usize,
    /// Commands delivered more than once.
    pub redelivered: usize,
    /// Pull requests waiting (owner and standbys).
    pub waiting: usize,
    /// Whether the partition's consumer is paused, and for how much longer.
    pub paused: Option<Duration>,
}

/// `overview` as a text table, a header and a row per partition (a paused partition shows the
/// whole seconds of its pause that are left): what `jetshard status` prints.
pub fn overview_table(overview: &[PartitionOverview]) -> String {
    let mut table = format!(
        "{:>9}  {:<24} {:>10}  {:<6} {:>8} {:>11} {:>11} {:>7} {:>7}\n",
        "partition",
        "owner",
        "generation",
        "pinned",
        "pending",
        "ack pending",
        "redelivered",
        "waiting",
        "paused"
    );
    for p in overview {
        table += &format!(
            "{:>9}  {:<24} {:>10}  {:<6} {:>8} {:>11} {:>11} {:>7} {:>7}\n",
            p.partition,
            p.owner.as_deref().unwrap_or("-"),
            p.generation,
            if p.pinned { "yes" } else { "no" },
            p.pending,
            p.ack_pending,
            p.redelivered,
            p.waiting,
            p.paused
                .map_or_else(|| "no".to_owned(), |d| format!("{}s", d.as_secs())),
        );
    }
    table
}

/// Administration of one entity type.
#[derive(Clone)]
pub struct Admin {
    pub(super) js: Context,
    pub(super) names: Names,
}

impl Admin {
    /// Administration of `entity_type` over `client`.
    pub fn new(client: Client, entity_type: &str) -> Self {
        Self {
            js: jetstream::new(client),
            names: Names::new(entity_type),
        }
    }

    /// The entity type's names as its streams record them: one command stream, or its commands
    /// and journal spread over several ([`Names::is_spread`]), and its partition count
    /// ([`Names::partitions`]; 0 if no command stream exists).
    ///
    /// # Errors
    /// [`Error::JetStream`] if a command stream cannot be read.
    pub async fn names(&self) -> Result<Names, Error> {
        recorded_names(&self.js, &self.names.entity_type).await
    }

    /// The command streams and the journal's streams, with the names their layout gives.
    pub(super) async fn streams(&self) -> Result<(Streams, Streams, Names), Error> {
        let names = self.names().await?;
        // `stream_info` fails for a stream that does not exist, so an entity type that was
        // never started is an error rather than an empty overview.
        for name in names
            .command_streams()
            .iter()
            .chain(names.journal_streams())
        {
            stream_info(&self.js, name).await?;
        }
        let commands = Streams::open(&self.js, names.command_streams()).await?;
        let journals = Streams::open(&self.js, names.journal_streams()).await?;
        Ok((commands, journals, names))
    }

    /// Every partition, as the server sees it now.
    ///
    /// # Errors
    /// [`Error::JetStream`] if a stream or consumer cannot be read.
    pub async fn overview(&self) -> Result<Vec<PartitionOverview>, Error> {
        let (commands, journals, names) = self.streams().await?;
        let mut overview = Vec::new();
        for partition in 0.. {
            let consumer = self.names.consumer(partition);
            let info = match commands.of(partition).consumer_info(&consumer).await {
                Ok(info) => info,
                // Past the last partition.
                Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => break,
                Err(e) => return Err(Error::jetstream(format!("read consumer {consumer}"), e)),
            };
            let latest = fence::latest(journals.of(partition), &names, partition)
                .await
                .map_err(|e| {
                    Error::jetstream(
                        format!("read fence of partition {partition}"),
                        e.to_string(),
                    )
                })?;
            overview.push(PartitionOverview {
                partition,
                generation: latest.as_ref().map_or(0, |(_, r)| r.generation),
                owner: latest.map(|(_, r)| r.node),
                pinned: info
                    .priority_groups
                    .iter()
                    .any(|g| g.pinned_client_id.is_some()),
                pending: info.num_pending,
                ack_pending: info.num_ack_pending,
                redelivered: info.num_redelivered,
                waiting: info.num_waiting,
                paused: info
                    .paused
                    .then(|| info.pause_remaining.unwrap_or_default()),
            });
        }
        Ok(overview)
    }

    /// Reads entity `id`'s current state from its owner (see [`CommandSender::get`]; here
    /// untyped, for tools: the state as the entity type encoded it). The partition count is
    /// read from the command stream's subject transform.
    ///
    /// [`CommandSender::get`]: crate::CommandSender::get
    ///
    /// # Errors
    /// [`Error::JetStream`] if the command stream cannot be read; otherwise as
    /// [`CommandSender::get`].
    pub async fn get(&self, id: &str, timeout: Duration) -> Result<QueryAnswer, Error> {
        let names = self.names().await?;
        let partitions = names.partitions();
        if partitions == 0 {
            return Err(Error::jetstream(
                format!("read the partition count of {}", names.command_stream(0)),
                "no command stream records it",
            ));
        }
        query::ask(&self.js.client(), &self.names, partitions, id, timeout).await
    }

    /// Pauses delivery of a partition's commands for `duration` (they queue up); the pause
    /// survives server restarts.
    ///
    /// # Errors
    /// [`Error::JetStream`] if the server refuses.
    pub async fn pause(&self, partition: u32, duration: Duration) -> Result<(), Error> {
        let (commands, ..) = self.streams().await?;
        let until = time::OffsetDateTime::now_utc() + duration;
        commands
            .of(partition)
            .pause_consumer(&self.names.consumer(partition), until)
            .await
            .map_err(|e| Error::jetstream(format!("pause partition {partition}"), e))?;
        Ok(())
    }

    /// Resumes a paused partition.
    ///
    /// # Errors
    /// [`Error::JetStream`] if the server refuses.
    pub async fn resume(&self, partition: u32) -> Result<(), Error> {
        let (commands, ..) = self.streams().await?;
        commands
            .of(partition)
            .resume_consumer(&self.names.consumer(partition))
            .await
            .map_err(|e| Error::jetstream(format!("resume partition {partition}"), e))?;
        Ok(())
    }

    /// Moves a partition's pin to a standby now. The previous owner is fenced as soon as the
    /// new one claims its generation.
    ///
    /// # Errors
    /// [`Error::JetStream`] if the server refuses.
    pub async fn unpin(&self, partition: u32) -> Result<(), Error> {
        let (commands, ..) = self.streams().await?;
        commands
            .of(partition)
            .unpin_consumer(&self.names.consumer(partition), PRIORITY_GROUP)
            .await
            .map_err(|e| Error::jetstream(format!("unpin partition {partition}"), e))
    }

    /// What every running process of the entity type says of its partitions (asked on
    /// `<t>.status`; the answers that come within `wait`), node ids in order. Quarantined
    /// entities are in [`PartitionStatus::quarantined`](crate::PartitionStatus::quarantined).
    ///
    /// # Errors
    /// [`Error::JetStream`] if the request cannot be sent.
    pub async fn nodes(&self, wait: Duration) -> Result<Vec<NodeStatus>, Error> {
        let client = self.js.client();
        let inbox = client.new_inbox();
        let mut answers = client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| Error::jetstream("subscribe for status answers", e))?;
        client
            .publish_with_reply(self.names.status_subject(), inbox, Default::default())
            .await
            .map_err(|e| Error::jetstream("ask for status", e))?;
        let mut nodes = Vec::new();
        let until = tokio::time::Instant::now() + wait;
        while let Ok(Some(answer)) = tokio::time::timeout_at(until, answers.next()).await {
            if let Ok(node) = serde_json::from_slice::<NodeStatus>(&answer.payload) {
                nodes.push(node);
            }
        }
        nodes.sort_by(|a, b| a.node.cmp(&b.node));
        Ok(nodes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overview_table_has_a_row_per_partition_and_shows_a_pause_in_seconds() {
        let partition = |partition, paused| PartitionOverview {
            partition,
            generation: 3,
            owner: Some("node-a".into()),
            pinned: true,
            pending: 7,
            ack_pending: 2,
            redelivered: 1,
            waiting: 1,
            paused,
        };
        let table = overview_table(&[
            partition(0, None),
            partition(1, Some(Duration::from_millis(59_900))),
        ]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(lines[0].starts_with("partition  owner"), "{table}");
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(cells, ["0", "node-a", "3", "yes", "7", "2", "1", "1", "no"]);
        assert!(lines[2].ends_with(" 59s"), "{table}");
    }
}
