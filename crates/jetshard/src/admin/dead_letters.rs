//! Dead letters: listed, replayed as new commands, purged (what the [`Admin`] does with them).

use std::collections::BTreeMap;

use crate::error::Error;
use crate::journal::server::stream_info;
use crate::journal_reader::{JournalReader, RecordKind};
use crate::wire::{HDR_ENTITY, Names};
use crate::wire::{HDR_MSG_ID, HDR_REPLAY_OF};

use super::handle::Admin;

/// A command given up by its partition: undecodable, or failing at every delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Sequence of the record in its partition's journal stream (with the partition, what
    /// names it to [`Admin::replay`]).
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
    /// The dead letter's partition.
    pub partition: u32,
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

/// The journal record named for a replay is not a dead letter of the entity type's partition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("journal record {seq} is on {subject}, not a dead letter of this partition")]
#[non_exhaustive]
pub struct NotADeadLetter {
    /// The journal sequence asked for.
    pub seq: u64,
    /// The record's subject.
    pub subject: String,
}

impl Admin {
    /// Every dead-letter record in the journal, oldest first.
    ///
    /// # Errors
    /// [`Error::JetStream`] if the journal cannot be read.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, Error> {
        let (_, journals, names) = self.streams().await?;
        // `<t>.dlq.<p>.<id>`, and `<t>.dlq.<p>` (no valid id, or written before per-entity
        // subjects).
        let records = JournalReader::of(journals, names).dead_letters().await?;
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

    /// Sends the command of `partition`'s dead letter at journal sequence `dead_letter_seq`
    /// again, as a new command: its payload, as published, to `<t>.cmd.<entity>`, with the
    /// header `Jetshard-Replay-Of: <dead_letter_seq>` and the `Nats-Msg-Id` `<t>:replay:<seq>`
    /// (`<t>:replay:<p>:<seq>` in a journal spread over several streams), so a second replay
    /// within the command stream's duplicate window (the server's default, 2 min) is stored
    /// once. The dead letter stays in the journal.
    ///
    /// The command takes its turn after everything its entity received since: it is decided
    /// against the entity's state as it is now, not as it was when the command was given up.
    ///
    /// # Errors
    /// [`Error::JetStream`] if the record cannot be read (for instance there is none at that
    /// sequence), if it is not a dead letter of this entity type (the source is a
    /// [`NotADeadLetter`]), or if the command stream does not confirm the command;
    /// [`Error::InvalidId`] if the dead letter's entity id cannot name a command subject.
    pub async fn replay(&self, partition: u32, dead_letter_seq: u64) -> Result<Replayed, Error> {
        let (_, journals, names) = self.streams().await?;
        let context = || format!("replay dead letter {dead_letter_seq} of partition {partition}");
        let record = journals
            .of(partition)
            .get_raw_message(dead_letter_seq)
            .await
            .map_err(|e| Error::jetstream(context(), e))?;
        if !names.is_dead_letter(&record.subject)
            || Names::partition_of_dead_letter(&record.subject) != Some(partition)
        {
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
            names.replay_msg_id(partition, dead_letter_seq).as_str(),
        );
        headers.insert(HDR_REPLAY_OF, dead_letter_seq.to_string().as_str());
        let subject = names.command_subject(&id);
        let ack = self
            .js
            .publish_with_headers(subject.clone(), headers, record.payload)
            .await
            .map_err(|e| Error::jetstream(format!("publish to {subject}"), e))?
            .await
            .map_err(|e| Error::jetstream(format!("publish to {subject}"), e))?;
        Ok(Replayed {
            partition,
            dead_letter_seq,
            entity: id.as_str().to_owned(),
            command_seq: ack.sequence,
            duplicate: ack.duplicate,
        })
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
        let (commands, journals, names) = self.streams().await?;
        // Dead letters written after this are not looked at, so not purged.
        let mut last = Vec::with_capacity(journals.all().len());
        for name in names.journal_streams() {
            last.push(stream_info(&self.js, name).await?.state.last_sequence);
        }
        let letters = self.dead_letters().await?;
        // Each stream's list is read in its order: whatever lies beyond its last record (none
        // after `last`, unless the read ended early) was not looked at.
        let mut examined = vec![0; last.len()];
        for letter in &letters {
            let stream = names.journal_index(letter.partition);
            examined[stream] = examined[stream].max(letter.seq);
        }
        let up_to = |partition: u32| {
            let stream = names.journal_index(partition);
            which
                .up_to
                .unwrap_or(u64::MAX)
                .min(last[stream])
                .min(examined[stream])
        };
        let mut by_partition: BTreeMap<u32, Vec<DeadLetter>> = BTreeMap::new();
        for letter in letters {
            if letter.seq <= up_to(letter.partition)
                && which.partition.is_none_or(|p| p == letter.partition)
            {
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
                .of(partition)
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
                .unwrap_or(up_to(partition).saturating_add(1));
            let going = letters.iter().filter(|l| l.seq < below).count() as u64;
            done.kept += letters.len() as u64 - going;
            if going == 0 {
                continue;
            }
            // Both subjects a partition's dead letters are on: each entity's, and the one of
            // dead letters that name no valid entity.
            for filter in [
                names.partition_entities_dead_letters(partition),
                names.partition_dead_letters(partition),
            ] {
                let purged = journals
                    .of(partition)
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
