//! [`Effects`]: what a command causes beyond its events (commands to other entities, messages,
//! timers), collected while `decide` runs and sent by the runtime once the events are durable.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Serialize;

use crate::codec::Codec;
use crate::data::timers::{TimerChange, unix_ms, valid_name};
use crate::error::{CodecError, InvalidId};
use crate::wire::id::EntityId;
use crate::wire::{Names, is_valid_entity_type};

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
        if !valid_name(name) {
            self.error
                .get_or_insert(EffectError::TimerName(name.to_owned()));
            return;
        }
        match self.codec.encode(command) {
            Ok(payload) => self.timers.push(TimerChange::Set {
                name: name.to_owned(),
                due_ms: unix_ms(at),
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
        if !valid_name(name) {
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
}
