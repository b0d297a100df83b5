//! The outbox: messages a command sends to other entities and subjects, published only after
//! its events are durable, at least once, and stored once by a JetStream target.
//!
//! `decide` collects them in an [`Effects`] (it stays a pure function: nothing is sent while it
//! runs). The entity actor then writes, in **one journal unit** (all or none, fenced like
//! events), the command's events and one outbox record per message on `<t>.out.<p>`. Once that
//! is durable it applies the events, publishes each message with
//! `Nats-Msg-Id: <t>:<command seq>:out:<index>`, and writes a *done* record for the command.
//!
//! A crash between the write and the done record leaves outbox records without a done record.
//! Every new owner of the partition reads `<t>.out.<p>` on acquisition and publishes those
//! again, then writes their done records: at least once, and a JetStream target that receives
//! the message again within its duplicate window (2 minutes by default) drops it by its msg id,
//! so it stores each message once. A target without a stream (a core subscriber) may see a
//! message twice.
//!
//! Architecture Invariant: an outbox message is published only after the journal holds the
//! outbox record of it (and so the events of its command); only this module publishes them.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::context::{Context, PublishErrorKind};
use async_nats::jetstream::stream::Stream;
use bytes::Bytes;
use futures::StreamExt;
use serde::Serialize;

use crate::codec::Codec;
use crate::entity::EntityId;
use crate::error::{CodecError, Error, InvalidId};
use crate::fence::header_u64;
use crate::journal::{self, JournalWriter, WriteError};
use crate::timer::{self, TimerChange};
use crate::wire::{HDR_COMMAND_SEQ, HDR_ENTITY, HDR_MSG_ID, HDR_OUTBOX_DONE, HDR_OUTBOX_TARGET};
use crate::wire::{Names, is_valid_entity_type};

/// How often a message is offered to the server before the command's outbox is left to the
/// next owner's recovery.
const PUBLISH_ATTEMPTS: u32 = 3;

/// What a command causes beyond its events: commands to other entities (of any type) and
/// messages to other subjects, sent once the events are durable.
///
/// Given to [`Entity::decide_with_effects`](crate::Entity::decide_with_effects); collecting
/// into it has no effect until jetshard has made the command's events durable, and nothing of
/// it is sent if the command is rejected.
///
/// ```
/// use jetshard::{Codec, Effects};
///
/// let mut effects = Effects::new(Codec::Json);
/// effects.command("inventory", "sku-1", &serde_json::json!({"type": "Reserve", "qty": 2}));
/// effects.publish("audit.orders", b"placed".to_vec());
/// assert_eq!(effects.len(), 2);
/// ```
#[derive(Debug)]
pub struct Effects {
    codec: Codec,
    entity: Option<EntityId>,
    messages: Vec<OutboxMessage>,
    timers: Vec<TimerChange>,
    error: Option<EffectError>,
}

/// Why an [`Effects`] cannot be sent: the command fails as if `decide` had panicked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EffectError {
    /// A command's target entity type is no valid entity type token.
    #[error("{0:?} is no entity type")]
    EntityType(String),
    /// A command's target id is invalid.
    #[error(transparent)]
    Id(#[from] InvalidId),
    /// A message's subject is empty or holds a wildcard or whitespace.
    #[error("{0:?} is no subject to publish to")]
    Subject(String),
    /// A command did not encode.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// A timer name is empty, longer than 64 bytes, or holds whitespace.
    #[error("{0:?} is no timer name")]
    TimerName(String),
}

/// One message to publish after the events are durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutboxMessage {
    pub(crate) subject: String,
    pub(crate) payload: Bytes,
}

impl Effects {
    /// Empty effects; commands are encoded with `codec` (the entity type's, when jetshard makes
    /// it).
    pub fn new(codec: Codec) -> Self {
        Self {
            codec,
            entity: None,
            messages: Vec::new(),
            timers: Vec::new(),
            error: None,
        }
    }

    /// Empty effects of the entity `id`: what jetshard gives
    /// [`decide_with_effects`](crate::Entity::decide_with_effects), so that a command can name
    /// its own entity as the address of a reply ([`entity_id`](Self::entity_id)).
    pub fn for_entity(codec: Codec, id: EntityId) -> Self {
        Self {
            entity: Some(id),
            ..Self::new(codec)
        }
    }

    /// The id of the entity whose command is being decided (`None` for effects made with
    /// [`new`](Self::new)): a saga step puts it in a command to another entity, which answers
    /// with a command back to `<type>.cmd.<id>`.
    pub fn entity_id(&self) -> Option<&EntityId> {
        self.entity.as_ref()
    }

    /// Arms the timer `name` of this entity: at `at` (whole milliseconds; at once if past), the
    /// entity receives `command` (an `E::Command` of its own type) through the normal path,
    /// once. Setting a name that is armed replaces it. See docs/guide.md, "Timers".
    pub fn set_timer(&mut self, name: &str, at: SystemTime, command: &impl Serialize) {
        if !timer::valid_name(name) {
            self.error
                .get_or_insert(EffectError::TimerName(name.to_owned()));
            return;
        }
        match self.codec.encode(command) {
            Ok(payload) => self.timers.push(TimerChange::Set {
                name: name.to_owned(),
                due_ms: timer::unix_ms(at),
                after: None,
                payload: payload.into(),
            }),
            Err(e) => {
                self.error.get_or_insert(e.into());
            }
        }
    }

    /// As [`set_timer`](Self::set_timer), due `after` the moment the command's records are
    /// written: `decide` stays free of clocks.
    pub fn set_timer_after(&mut self, name: &str, after: Duration, command: &impl Serialize) {
        self.set_timer(name, UNIX_EPOCH, command);
        if let Some(TimerChange::Set { after: slot, .. }) = self.timers.last_mut()
            && self.error.is_none()
        {
            *slot = Some(after);
        }
    }

    /// Disarms the timer `name` of this entity, if it is armed: it never fires.
    pub fn cancel_timer(&mut self, name: &str) {
        if !timer::valid_name(name) {
            self.error
                .get_or_insert(EffectError::TimerName(name.to_owned()));
            return;
        }
        self.timers.push(TimerChange::Cancel {
            name: name.to_owned(),
        });
    }

    /// Sends `command` to entity `id` of type `entity_type` (`<entity_type>.cmd.<id>`), encoded
    /// with this entity type's codec: the target type must use the same one.
    pub fn command(&mut self, entity_type: &str, id: &str, command: &impl Serialize) {
        let message = (|| {
            if !is_valid_entity_type(entity_type) {
                return Err(EffectError::EntityType(entity_type.to_owned()));
            }
            let id = EntityId::new(id)?;
            let payload = self.codec.encode(command)?;
            Ok(OutboxMessage {
                subject: Names::new(entity_type).command_subject(&id),
                payload: payload.into(),
            })
        })();
        self.push(message);
    }

    /// Publishes `payload` to `subject` (a stream's subject, or a core subject).
    pub fn publish(&mut self, subject: &str, payload: impl Into<Bytes>) {
        let valid = !subject.is_empty()
            && !subject.contains(['*', '>', ' ', '\t', '\r', '\n'])
            && !subject.starts_with('.')
            && !subject.ends_with('.');
        let message = if valid {
            Ok(OutboxMessage {
                subject: subject.to_owned(),
                payload: payload.into(),
            })
        } else {
            Err(EffectError::Subject(subject.to_owned()))
        };
        self.push(message);
    }

    /// How many messages and timer changes are collected.
    pub fn len(&self) -> usize {
        self.messages.len() + self.timers.len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn push(&mut self, message: Result<OutboxMessage, EffectError>) {
        match message {
            Ok(message) => self.messages.push(message),
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
    }

    /// The messages, or the first error collecting them.
    #[cfg(test)]
    pub(crate) fn into_messages(self) -> Result<Vec<OutboxMessage>, EffectError> {
        self.into_parts().map(|(messages, _)| messages)
    }

    /// The messages and timer changes, or the first error collecting them.
    pub(crate) fn into_parts(self) -> Result<(Vec<OutboxMessage>, Vec<TimerChange>), EffectError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok((self.messages, self.timers)),
        }
    }
}

/// `Nats-Msg-Id` of the `index`th outbox message of the command at `command_seq`.
pub(crate) fn msg_id(names: &Names, command_seq: u64, index: usize) -> String {
    format!("{}:{command_seq}:out:{index}", names.entity_type)
}

/// Publishes a command's outbox messages (each with its msg id), then records them as done.
/// On failure the command's records stay for the next owner's recovery.
pub(crate) async fn deliver(
    js: &Context,
    names: &Names,
    journal: &JournalWriter,
    entity: &str,
    command_seq: u64,
    messages: &[OutboxMessage],
) {
    for (index, message) in messages.iter().enumerate() {
        if let Err(e) = publish(js, names, command_seq, index, message).await {
            tracing::warn!(entity, cmd_seq = command_seq, index, error = %e, "outbox message not published; the next owner publishes it again");
            return;
        }
    }
    match journal.outbox_done(entity, command_seq).await {
        Ok(()) => {}
        Err(WriteError::Fenced { .. }) => {}
        Err(e) => {
            tracing::warn!(entity, cmd_seq = command_seq, error = %e, "outbox done record not written; the next owner publishes again (stored once by msg id)");
        }
    }
}

/// Publishes one outbox message, awaiting the stream's ack; a subject no stream listens on
/// counts as published (core NATS: at most once for those subscribers).
async fn publish(
    js: &Context,
    names: &Names,
    command_seq: u64,
    index: usize,
    message: &OutboxMessage,
) -> Result<(), Error> {
    let mut last = None;
    for attempt in 0..PUBLISH_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
        }
        let mut headers = HeaderMap::new();
        headers.insert(HDR_MSG_ID, msg_id(names, command_seq, index));
        let sent = js
            .publish_with_headers(message.subject.clone(), headers, message.payload.clone())
            .await;
        let ack = match sent {
            Ok(ack) => ack.await,
            Err(e) => {
                last = Some(Error::jetstream(
                    format!("publish to {}", message.subject),
                    e,
                ));
                continue;
            }
        };
        match ack {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == PublishErrorKind::StreamNotFound => return Ok(()),
            Err(e) => {
                last = Some(Error::jetstream(
                    format!("publish to {}", message.subject),
                    e,
                ))
            }
        }
    }
    Err(last.unwrap_or(Error::Stopped))
}

/// One command's outbox, read back.
#[derive(Default)]
struct Pending {
    entity: String,
    messages: BTreeMap<usize, OutboxMessage>,
    done: bool,
}

/// On acquisition: publishes again every outbox message of the partition whose command has no
/// done record, and records them done. Runs beside the owner's commands (the messages are
/// independent of them); ends when done or when the writer is fenced.
pub(crate) async fn recover(
    js: Context,
    journal_stream: Stream<()>,
    names: std::sync::Arc<Names>,
    partition: u32,
    writer: JournalWriter,
) {
    let subject = names.outbox_subject(partition);
    let pending = match read(&journal_stream, &subject).await {
        Ok(pending) => pending,
        Err(e) => {
            tracing::warn!(partition, error = %e, "outbox not recovered");
            return;
        }
    };
    let open: Vec<_> = pending.into_iter().filter(|(_, p)| !p.done).collect();
    if !open.is_empty() {
        tracing::info!(
            partition,
            generation = writer.generation(),
            commands = open.len(),
            "publishing the outbox of commands whose messages were not confirmed"
        );
    }
    for (command_seq, p) in open {
        let messages: Vec<_> = p.messages.into_values().collect();
        deliver(&js, &names, &writer, &p.entity, command_seq, &messages).await;
    }
}

/// Reads a partition's outbox records and done records, by command.
async fn read(journal: &Stream<()>, subject: &str) -> Result<BTreeMap<u64, Pending>, Error> {
    let mut pending: BTreeMap<u64, Pending> = BTreeMap::new();
    let end = journal::last_sequence(journal, subject).await?;
    if end == 0 {
        return Ok(pending);
    }
    let consumer = journal
        .create_consumer(pull::OrderedConfig {
            filter_subject: subject.to_owned(),
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(|e| Error::jetstream(format!("open a replay of {subject}"), e))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| Error::jetstream(format!("replay {subject}"), e))?;
    loop {
        let next = tokio::time::timeout(Duration::from_secs(30), messages.next())
            .await
            .map_err(|e| Error::jetstream(format!("replay {subject}: no message for 30 s"), e))?;
        let message = match next {
            Some(Ok(message)) => message,
            Some(Err(e)) => return Err(Error::jetstream(format!("replay {subject}"), e)),
            None => return Err(Error::jetstream(format!("replay {subject}"), "ended early")),
        };
        let seq = message
            .info()
            .map_err(|e| Error::jetstream(format!("replay {subject}"), e.to_string()))?
            .stream_sequence;
        if let Some(headers) = message.headers.as_ref()
            && let Some(command_seq) = header_u64(headers, HDR_COMMAND_SEQ)
        {
            let p = pending.entry(command_seq).or_default();
            if let Some(entity) = headers.get(HDR_ENTITY) {
                p.entity = entity.as_str().to_owned();
            }
            if headers.get(HDR_OUTBOX_DONE).is_some() {
                p.done = true;
            } else if let (Some(target), Some(index)) = (
                headers.get(HDR_OUTBOX_TARGET),
                header_u64(headers, crate::wire::HDR_OUTBOX_INDEX),
            ) {
                p.messages.insert(
                    usize::try_from(index).unwrap_or(usize::MAX),
                    OutboxMessage {
                        subject: target.as_str().to_owned(),
                        payload: message.payload.clone(),
                    },
                );
            }
        }
        if seq >= end {
            return Ok(pending);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effects_collect_commands_and_messages_and_keep_the_first_error() {
        let mut effects = Effects::new(Codec::Json);
        effects.command("inventory", "sku-1", &1u32);
        effects.publish("audit.x", b"a".to_vec());
        let messages = effects.into_messages().unwrap();
        assert_eq!(messages[0].subject, "inventory.cmd.sku-1");
        assert_eq!(&messages[0].payload[..], b"1");
        assert_eq!(messages[1].subject, "audit.x");

        let mut effects = Effects::new(Codec::Json);
        effects.command("Bad Type", "x", &1u32);
        effects.publish("a.*", b"".to_vec());
        assert!(matches!(
            effects.into_messages(),
            Err(EffectError::EntityType(_))
        ));
        let mut effects = Effects::new(Codec::Json);
        effects.publish("a.>", b"".to_vec());
        assert!(matches!(
            effects.into_messages(),
            Err(EffectError::Subject(_))
        ));
    }

    #[test]
    fn effects_made_for_an_entity_name_it() {
        let id = EntityId::new("o-1").unwrap();
        assert_eq!(
            Effects::for_entity(Codec::Json, id.clone()).entity_id(),
            Some(&id)
        );
        assert_eq!(Effects::new(Codec::Json).entity_id(), None);
    }

    #[test]
    fn outbox_msg_ids_name_the_source_command_and_index() {
        assert_eq!(msg_id(&Names::new("order"), 42, 1), "order:42:out:1");
    }
}
