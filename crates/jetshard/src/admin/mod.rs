//! Operating an entity type from any process: who owns which partition, backlogs, pause and
//! resume, moving a pin, dead letters (listed, replayed, purged). Reads and asks the server;
//! needs no running system.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::stream::Stream;
use async_nats::jetstream::{self, Context};
use futures::StreamExt;

use crate::error::Error;
use crate::journal::fence;
use crate::journal_reader::{JournalReader, RecordKind};
use crate::query::{self, QueryAnswer};
use crate::status::NodeStatus;
use crate::wire::{HDR_ENTITY, HDR_GENERATION, Names, PRIORITY_GROUP};
use crate::wire::{HDR_MSG_ID, HDR_REPLAY_OF, HDR_SNAPSHOT_UPTO};

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

/// What [`Admin::replay`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Replayed {
    /// The dead letter's journal sequence.
    pub dead_letter_seq: u64,
    /// The entity the command is for.
    pub entity: String,
    /// The new command's sequence in the command stream.
    pub command_seq: u64,
    /// The command stream had it already: this dead letter was replayed before, within the
    /// stream's duplicate window, and nothing new was stored (`command_seq` is the earlier one).
    pub duplicate: bool,
}

/// Which dead letters [`Admin::purge_dead_letters`] removes: by default every one of the entity
/// type; narrowed to one partition and to those up to a journal sequence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[must_use]
pub struct DeadLetterPurge {
    partition: Option<u32>,
    up_to: Option<u64>,
}

impl DeadLetterPurge {
    /// Every dead letter of the entity type.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only those of `partition`.
    pub fn partition(mut self, partition: u32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Only those at journal sequence `seq` or below.
    pub fn up_to(mut self, seq: u64) -> Self {
        self.up_to = Some(seq);
        self
    }
}

/// What [`Admin::purge_dead_letters`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Purged {
    /// Dead letters removed.
    pub purged: u64,
    /// Dead letters selected but kept: their command is above its partition's ack floor and
    /// could be handled again without them. Purge again once the partition has caught up.
    pub kept: u64,
}

/// What [`Admin::compact`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Compacted {
    /// Snapshots read (one per entity that has one).
    pub snapshots: u64,
    /// Records removed (events, and timer records): each covered by its entity's snapshot.
    pub purged: u64,
}

/// The journal record named for a replay is not a dead letter of the entity type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("journal record {seq} is on {subject}, not a dead letter of this entity type")]
#[non_exhaustive]
pub struct NotADeadLetter {
    /// The journal sequence asked for.
    pub seq: u64,
    /// The record's subject.
    pub subject: String,
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
        let name = &self.names.command_stream;
        let mut stream = self
            .js
            .get_stream(name)
            .await
            .map_err(|e| Error::jetstream(format!("open stream {name}"), e))?;
        let info = stream
            .info()
            .await
            .map_err(|e| Error::jetstream(format!("read stream {name}"), e))?;
        let partitions = info
            .config
            .subject_transform
            .as_ref()
            .and_then(|t| partitions_of_transform(&t.destination))
            .ok_or_else(|| {
                Error::jetstream(
                    format!("read the partition count of {name}"),
                    "the stream has no partition() subject transform",
                )
            })?;
        query::ask(&self.js.client(), &self.names, partitions, id, timeout).await
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
        // `<t>.dlq.<p>.<id>`, and `<t>.dlq.<p>` (no valid id, or written before per-entity
        // subjects).
        let records = JournalReader::new(journal, &self.names.entity_type)
            .dead_letters()
            .await?;
        Ok(records
            .into_iter()
            .filter_map(|record| match record.kind {
                RecordKind::DeadLetter {
                    entity,
                    deliveries,
                    reason,
                    payload,
                } => Some(DeadLetter {
                    seq: record.seq,
                    partition: Names::partition_of_dead_letter(&record.subject).unwrap_or(0),
                    entity: entity.unwrap_or_default(),
                    command_seq: record.command_seq.unwrap_or(0),
                    deliveries: deliveries.unwrap_or(0),
                    reason: reason.unwrap_or_default(),
                    generation: record.generation.unwrap_or(0),
                    payload,
                }),
                _ => None,
            })
            .collect())
    }

    /// Sends the command of the dead letter at journal sequence `dead_letter_seq` again, as a
    /// new command: its payload, as published, to `<t>.cmd.<entity>`, with the header
    /// `Jetshard-Replay-Of: <dead_letter_seq>` and the `Nats-Msg-Id` `<t>:replay:<seq>`, so a
    /// second replay within the command stream's duplicate window (the server's default, 2
    /// min) is stored once. The dead letter stays in the journal.
    ///
    /// The command takes its turn after everything its entity received since: it is decided
    /// against the entity's state as it is now, not as it was when the command was given up.
    ///
    /// # Errors
    /// [`Error::JetStream`] if the record cannot be read (for instance there is none at that
    /// sequence), if it is not a dead letter of this entity type (the source is a
    /// [`NotADeadLetter`]), or if the command stream does not confirm the command;
    /// [`Error::InvalidId`] if the dead letter's entity id cannot name a command subject.
    pub async fn replay(&self, dead_letter_seq: u64) -> Result<Replayed, Error> {
        let (_, journal) = self.streams().await?;
        let context = || format!("replay dead letter {dead_letter_seq}");
        let record = journal
            .get_raw_message(dead_letter_seq)
            .await
            .map_err(|e| Error::jetstream(context(), e))?;
        if !self.names.is_dead_letter(&record.subject) {
            return Err(Error::jetstream(
                context(),
                NotADeadLetter {
                    seq: dead_letter_seq,
                    subject: record.subject.to_string(),
                },
            ));
        }
        let entity = record
            .headers
            .get(HDR_ENTITY)
            .map(|v| v.as_str())
            .unwrap_or_default();
        let id = crate::EntityId::new(entity)?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            HDR_MSG_ID,
            self.names.replay_msg_id(dead_letter_seq).as_str(),
        );
        headers.insert(HDR_REPLAY_OF, dead_letter_seq.to_string().as_str());
        let subject = self.names.command_subject(&id);
        let ack = self
            .js
            .publish_with_headers(subject.clone(), headers, record.payload)
            .await
            .map_err(|e| Error::jetstream(format!("publish to {subject}"), e))?
            .await
            .map_err(|e| Error::jetstream(format!("publish to {subject}"), e))?;
        Ok(Replayed {
            dead_letter_seq,
            entity: id.as_str().to_owned(),
            command_seq: ack.sequence,
            duplicate: ack.duplicate,
        })
    }

    /// Bounds the journal: removes every event that its entity's latest snapshot covers (each
    /// entity's events up to the snapshot's `Jetshard-Snapshot-Upto`), and the timer records it
    /// covers (no timer was armed when it was written), over all partitions or one. Entities without a snapshot, dead letters (see [`purge_dead_letters`]) and fence
    /// records are kept. Safe while owners run: an owner loads an entity from its latest
    /// snapshot and the records after it, never from records the snapshot covers.
    ///
    /// After it, a snapshot is the only record of the history it covers, so
    /// - the entity type's code must keep reading its snapshots: a change of the state's
    ///   encoding (a new [`Snapshots`](crate::Snapshots) version) would load such entities from
    ///   the events left, without the history before;
    /// - readers of the journal (projections, audits) must have read the events before they
    ///   go, or start from the snapshots. docs/OPERATIONS.md, "Bounding the journal".
    ///
    /// [`purge_dead_letters`]: Self::purge_dead_letters
    ///
    /// # Errors
    /// [`Error::JetStream`] if the journal cannot be read or the server refuses a purge.
    pub async fn compact(&self, partition: Option<u32>) -> Result<Compacted, Error> {
        let (_, journal) = self.streams().await?;
        let filter = match partition {
            Some(p) => self.names.partition_snapshots(p),
            None => self.names.all_snapshots(),
        };
        let consumer = journal
            .create_consumer(jetstream::consumer::pull::OrderedConfig {
                filter_subject: filter.clone(),
                headers_only: true,
                ..Default::default()
            })
            .await
            .map_err(|e| Error::jetstream(format!("read {filter}"), e))?;
        let mut done = Compacted::default();
        if consumer.cached_info().num_pending == 0 {
            return Ok(done);
        }
        let mut covered = Vec::new();
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| Error::jetstream(format!("read {filter}"), e))?;
        while let Ok(Some(next)) =
            tokio::time::timeout(Duration::from_secs(10), messages.next()).await
        {
            let message = next.map_err(|e| Error::jetstream(format!("read {filter}"), e))?;
            let pending = message
                .info()
                .map_err(|e| Error::jetstream(format!("read {filter}"), e.to_string()))?
                .pending;
            let headers = message.headers.clone().unwrap_or_default();
            let upto = crate::wire::header_u64(&headers, HDR_SNAPSHOT_UPTO);
            let written = crate::wire::header_u64(&headers, HDR_GENERATION).is_some();
            // `<t>.snap.<p>.<id>` -> `<t>.evt.<p>.<id>` and `<t>.tmr.<p>.<id>`.
            let subjects = self.names.covered_by_snapshot(&message.subject);
            if let (Some(upto), true, Some([events, timers])) = (upto, written, subjects) {
                done.snapshots += 1;
                covered.push((events, upto));
                // No snapshot is written while its entity has a timer armed: the timer records
                // it covers are of timers that fired or were cancelled.
                covered.push((timers, upto));
            }
            if pending == 0 {
                break;
            }
        }
        for (events, upto) in covered {
            let purged = journal
                .purge()
                .filter(events.clone())
                .sequence(upto + 1)
                .await
                .map_err(|e| Error::jetstream(format!("purge {events}"), e))?;
            done.purged += purged.purged;
        }
        Ok(done)
    }

    /// Removes the dead letters `which` selects from the journal, except those whose command
    /// could still come back; returns how many went and how many stayed.
    ///
    /// A dead letter is also what tells a new owner that its command is done with: on
    /// acquisition, an entity's last handled command is the highest command sequence among its
    /// events and dead letters, and a new owner reads every command above its partition's ack
    /// floor back from the stream (the previous owner's in-flight window). So a dead letter is
    /// kept while its command is above the ack floor of its partition's consumer (its
    /// termination has not reached the server, or, with limits retention, older commands of
    /// the partition are still unacknowledged): purged, that command would be handled again.
    /// Below the floor a command never comes back, and its dead letter is only a report.
    /// docs/OPERATIONS.md, "Dead letters", has the whole argument.
    ///
    /// # Errors
    /// [`Error::JetStream`] if the journal or a consumer cannot be read, or the server refuses
    /// the purge.
    pub async fn purge_dead_letters(&self, which: DeadLetterPurge) -> Result<Purged, Error> {
        let (commands, journal) = self.streams().await?;
        // Dead letters written after this are not looked at, so not purged.
        let last = self
            .js
            .get_stream(&self.names.journal_stream)
            .await
            .map_err(|e| Error::jetstream(format!("read {}", self.names.journal_stream), e))?
            .cached_info()
            .state
            .last_sequence;
        let letters = self.dead_letters().await?;
        // The list is read in journal order: whatever lies beyond its last record (none after
        // `last`, unless the read ended early) was not looked at.
        let Some(examined) = letters.iter().map(|l| l.seq).max() else {
            return Ok(Purged::default());
        };
        let up_to = which.up_to.unwrap_or(u64::MAX).min(last).min(examined);
        let mut by_partition: BTreeMap<u32, Vec<DeadLetter>> = BTreeMap::new();
        for letter in letters {
            if letter.seq <= up_to && which.partition.is_none_or(|p| p == letter.partition) {
                by_partition
                    .entry(letter.partition)
                    .or_default()
                    .push(letter);
            }
        }
        let mut done = Purged::default();
        for (partition, letters) in by_partition {
            let consumer = self.names.consumer(partition);
            let floor = commands
                .consumer_info(&consumer)
                .await
                .map_err(|e| Error::jetstream(format!("read consumer {consumer}"), e))?
                .ack_floor
                .stream_sequence;
            // Purge below the first dead letter whose command may come back (all of them if
            // none may); the server's purge takes everything below its `seq`.
            let below = letters
                .iter()
                .filter(|l| l.command_seq > floor)
                .map(|l| l.seq)
                .min()
                .unwrap_or(up_to.saturating_add(1));
            let going = letters.iter().filter(|l| l.seq < below).count() as u64;
            done.kept += letters.len() as u64 - going;
            if going == 0 {
                continue;
            }
            // Both subjects a partition's dead letters are on: each entity's, and the one of
            // dead letters that name no valid entity.
            for filter in [
                self.names.partition_entities_dead_letters(partition),
                self.names.partition_dead_letters(partition),
            ] {
                let purged = journal
                    .purge()
                    .filter(filter.clone())
                    .sequence(below)
                    .await
                    .map_err(|e| Error::jetstream(format!("purge {filter}"), e))?;
                done.purged += purged.purged;
            }
        }
        Ok(done)
    }
}

/// The `N` of a `...{{partition(N,1)}}...` subject transform destination.
fn partitions_of_transform(destination: &str) -> Option<u32> {
    let (_, rest) = destination.split_once("partition(")?;
    let (n, _) = rest.split_once(',')?;
    n.trim().parse().ok().filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_partition_count_is_read_from_the_transform() {
        let names = Names::new("order");
        assert_eq!(
            partitions_of_transform(&names.command_transform_dest(12)),
            Some(12)
        );
        assert_eq!(partitions_of_transform("order.cmd.{{wildcard(1)}}"), None);
    }
}
