//! Sending commands: a plain JetStream publish to `<type>.cmd.<id>`.
//!
//! Nothing else is needed to send one; any NATS client can (docs/WIRE.md). This sender adds id
//! validation and encoding.

use std::marker::PhantomData;

use async_nats::Client;
use async_nats::jetstream::{self, Context};

use crate::codec::Codec;
use crate::config::ShardConfig;
use crate::entity::{Entity, EntityId};
use crate::error::Error;
use crate::wire::Names;

/// Publishes commands for one entity type.
pub struct CommandSender<E: Entity> {
    js: Context,
    names: Names,
    codec: Codec,
    _entity: PhantomData<fn() -> E>,
}

impl<E: Entity> Clone for CommandSender<E> {
    fn clone(&self) -> Self {
        Self {
            js: self.js.clone(),
            names: self.names.clone(),
            codec: self.codec,
            _entity: PhantomData,
        }
    }
}

impl<E: Entity> CommandSender<E> {
    /// A sender for the entity type and codec of `config`.
    pub fn new(client: Client, config: &ShardConfig) -> Self {
        Self {
            js: jetstream::new(client),
            names: Names::new(&config.entity_type),
            codec: config.codec,
            _entity: PhantomData,
        }
    }

    /// Publishes `command` for the entity `id` and waits until the command stream has stored
    /// it. Returns the command's stream sequence.
    ///
    /// # Errors
    /// [`Error::InvalidId`] or [`Error::Codec`] before anything is published; [`Error::JetStream`]
    /// if the stream did not confirm (then the command may or may not be stored).
    pub async fn send(&self, id: &str, command: &E::Command) -> Result<u64, Error> {
        let id = EntityId::new(id)?;
        let payload = self.codec.encode(command)?;
        let subject = self.names.command_subject(&id);
        let ack = self
            .js
            .publish(subject.clone(), payload.into())
            .await
            .map_err(|e| Error::jetstream(format!("publish to {subject}"), e))?
            .await
            .map_err(|e| Error::jetstream(format!("publish to {subject}"), e))?;
        Ok(ack.sequence)
    }
}
