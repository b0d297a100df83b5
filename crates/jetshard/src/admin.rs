//! Operating an entity type from any process: who owns which partition, backlogs, pause and
//! resume, moving a pin, dead letters. Reads and asks the server; needs no running system.

use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::stream::Stream;
use async_nats::jetstream::{self, Context};
use futures::StreamExt;

use crate::error::Error;
use crate::fence;
use crate::status::NodeStatus;
use crate::wire::{
    HDR_COMMAND_SEQ, HDR_DELIVERIES, HDR_ENTITY, HDR_GENERATION, HDR_REASON, Names, PRIORITY_GROUP,
};

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

/// A command given up by its partition: undecodable, or failing at every delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Journal sequence of the record.
    pub seq: u64,
    /// The partition.
    pub partition: u32,
    /// The entity id.
    pub entity: String,
    /// The command's sequence in the command stream.
    pub command_seq: u64,
    /// How often it had been delivered.
    pub deliveries: u64,
    /// Why it was given up.
    pub reason: String,
    /// The generation that gave it up.
    pub generation: u64,
    /// The command's payload, as published.
    pub payload: bytes::Bytes,
}

/// Administration of one entity type.
#[derive(Clone)]
pub struct Admin {
    js: Context,
    names: Names,
}

impl Admin {
    /// Administration of `entity_type` over `client`.
    pub fn new(client: Client, entity_type: &str) -> Self {
        Self {
            js: jetstream::new(client),
            names: Names::new(entity_type),
        }
    }

    async fn streams(&self) -> Result<(Stream<()>, Stream<()>), Error> {
        let open = |name: String| async move {
            // `get_stream` (with info) fails for a stream that does not exist, so an entity
            // type that was never started is an error rather than an empty overview.
            self.js
                .get_stream(&name)
                .await
                .map_err(|e| Error::jetstream(format!("open stream {name}"), e))?;
            self.js
                .get_stream_no_info(&name)
                .await
                .map_err(|e| Error::jetstream(format!("open stream {name}"), e))
        };
        Ok((
            open(self.names.command_stream.clone()).await?,
            open(self.names.journal_stream.clone()).await?,
        ))
    }

    /// Every partition, as the server sees it now.
    ///
    /// # Errors
    /// [`Error::JetStream`] if a stream or consumer cannot be read.
    pub async fn overview(&self) -> Result<Vec<PartitionOverview>, Error> {
        let (commands, journal) = self.streams().await?;
        let mut overview = Vec::new();
        for partition in 0.. {
            let consumer = self.names.consumer(partition);
            let info = match commands.consumer_info(&consumer).await {
                Ok(info) => info,
                // Past the last partition.
                Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => break,
                Err(e) => return Err(Error::jetstream(format!("read consumer {consumer}"), e)),
            };
            let latest = fence::latest(&journal, &self.names, partition)
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

    /// Pauses delivery of a partition's commands for `duration` (they queue up); the pause
    /// survives server restarts.
    ///
    /// # Errors
    /// [`Error::JetStream`] if the server refuses.
    pub async fn pause(&self, partition: u32, duration: Duration) -> Result<(), Error> {
        let (commands, _) = self.streams().await?;
        let until = time::OffsetDateTime::now_utc() + duration;
        commands
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
        let (commands, _) = self.streams().await?;
        commands
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
        let (commands, _) = self.streams().await?;
        commands
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

    /// Every dead-letter record in the journal, oldest first.
    ///
    /// # Errors
    /// [`Error::JetStream`] if the journal cannot be read.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, Error> {
        let (_, journal) = self.streams().await?;
        let filter = format!("{}.dlq.*", self.names.entity_type);
        let consumer = journal
            .create_consumer(jetstream::consumer::pull::OrderedConfig {
                filter_subject: filter.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| Error::jetstream(format!("read {filter}"), e))?;
        let mut letters = Vec::new();
        if consumer.cached_info().num_pending == 0 {
            return Ok(letters);
        }
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| Error::jetstream(format!("read {filter}"), e))?;
        while let Ok(Some(next)) =
            tokio::time::timeout(Duration::from_secs(10), messages.next()).await
        {
            let message = next.map_err(|e| Error::jetstream(format!("read {filter}"), e))?;
            let info = message
                .info()
                .map_err(|e| Error::jetstream(format!("read {filter}"), e.to_string()))?;
            let (seq, pending) = (info.stream_sequence, info.pending);
            let headers = message.headers.clone().unwrap_or_default();
            let text = |name: &str| {
                headers
                    .get(name)
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default()
            };
            letters.push(DeadLetter {
                seq,
                partition: message
                    .subject
                    .rsplit('.')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0),
                entity: text(HDR_ENTITY),
                command_seq: fence::header_u64(&headers, HDR_COMMAND_SEQ).unwrap_or(0),
                deliveries: fence::header_u64(&headers, HDR_DELIVERIES).unwrap_or(0),
                reason: text(HDR_REASON),
                generation: fence::header_u64(&headers, HDR_GENERATION).unwrap_or(0),
                payload: message.payload.clone(),
            });
            if pending == 0 {
                break;
            }
        }
        Ok(letters)
    }
}
