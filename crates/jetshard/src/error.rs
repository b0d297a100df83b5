//! Typed errors. Every fallible public call says which of these it returns.

/// A boxed error from a lower layer (async-nats, ractor), kept as the source.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a string is not a valid [`EntityId`](crate::EntityId).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidId {
    /// The id is empty.
    #[error("entity id is empty")]
    Empty,
    /// The id is longer than [`MAX_ID_LEN`](crate::MAX_ID_LEN).
    #[error("entity id is {len} bytes long, the limit is {max}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The id holds a character that cannot stand in one subject token.
    #[error(
        "entity id {id:?} contains {found:?}: an id is one subject token (no '.', '*', '>', whitespace or control characters)"
    )]
    ForbiddenChar {
        /// The id.
        id: String,
        /// The first offending character.
        found: char,
    },
}

/// A value could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// Serialization failed.
    #[error("cannot encode: {0}")]
    Encode(String),
    /// The bytes are not a valid encoding; the text starts with the codec expected
    /// (`as bincode: ...`, `as json: ...`).
    #[error("cannot decode {0}")]
    Decode(String),
}

/// A configuration value is out of range; found when the config is built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {field}: {reason}")]
pub struct ConfigError {
    /// The builder setting at fault.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

/// Errors of the shard system and of sending commands.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An entity id is invalid; nothing was published.
    #[error(transparent)]
    InvalidId(#[from] InvalidId),
    /// An idempotency key is not usable; nothing was published.
    #[error(
        "idempotency key {key:?} is not valid: 1 to 128 bytes, no whitespace or control characters"
    )]
    InvalidKey {
        /// The key (cut at 128 characters).
        key: String,
    },
    /// A command could not be encoded; nothing was published.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// The command stream exists with another partition count than configured.
    #[error(
        "stream {stream} exists with {existing} partitions but {configured} are configured; the partition count of an entity type cannot change in place"
    )]
    PartitionMismatch {
        /// The command stream.
        stream: String,
        /// What the stream's subject transform says.
        existing: String,
        /// What the configuration says.
        configured: u32,
    },
    /// A stream was created with another setting that decides how its stored bytes are read
    /// (the codec, or the streams the journal is spread over) than configured: reading them
    /// with this configuration would misread them, or look for them where they are not.
    #[error(
        "stream {stream} was created with {setting} {stored}, but {configured} is configured; stored records are read only with the {setting} they were written with, so it cannot change in place"
    )]
    StoredSettingMismatch {
        /// The stream.
        stream: String,
        /// The setting (`codec`, or `journal_streams`: how many streams the journal is spread
        /// over).
        setting: &'static str,
        /// The value recorded with the stream.
        stored: String,
        /// The value configured.
        configured: String,
    },
    /// An encoded command is larger than the server accepts; nothing was published.
    #[error("the encoded command is {size} bytes, the server accepts at most {max}")]
    PayloadTooLarge {
        /// The encoded size.
        size: usize,
        /// The server's `max_payload`.
        max: usize,
    },
    /// A stream or consumer exists with a configuration jetshard cannot use.
    #[error("{what} exists with an incompatible configuration: {detail}")]
    Incompatible {
        /// The stream or consumer.
        what: String,
        /// The differing setting, with both values.
        detail: String,
    },
    /// No stream took a command: its publishes were answered "no responders" for `waited`
    /// (two seconds). Nothing was stored. The entity type's streams do not exist
    /// yet (a [`ShardSystem`](crate::ShardSystem) creates them when it starts), or the client's
    /// server has not heard of them.
    #[error(
        "no stream takes {subject} (no responders for {waited:?}); nothing was stored: start a shard system of this entity type first, it creates the streams"
    )]
    NoCommandStream {
        /// The command's subject.
        subject: String,
        /// How long the sender published again.
        waited: std::time::Duration,
    },
    /// A JetStream API call failed (server down, timeout, permission).
    #[error("JetStream: {context}")]
    JetStream {
        /// What was being done.
        context: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// The actor runtime refused to spawn an actor.
    #[error("cannot spawn the {what} actor")]
    Spawn {
        /// Which actor.
        what: &'static str,
        /// ractor's error.
        #[source]
        source: BoxError,
    },
    /// A command was stored but its outcome did not arrive in time; it will still be applied.
    #[error("command {command_seq} is stored, but no outcome arrived within {waited:?}")]
    NoOutcome {
        /// The command's stream sequence.
        command_seq: u64,
        /// How long the sender waited.
        waited: std::time::Duration,
    },
    /// No owner answered a state query in time: nobody owns the entity's partition, or it is
    /// changing hands (only the owner of the current generation answers).
    #[error("no owner answered the query of {entity} within {waited:?}")]
    NoAnswer {
        /// The entity.
        entity: String,
        /// How long the reader waited.
        waited: std::time::Duration,
    },
    /// The entity's partition was changing hands for as long as the reader waited: the process
    /// that handed it over said so, and no new owner answered yet. Ask again.
    #[error(
        "the partition of {entity} is changing hands (no new owner answered within {waited:?}): ask again"
    )]
    Moving {
        /// The entity.
        entity: String,
        /// How long the reader waited.
        waited: std::time::Duration,
    },
    /// The owner of the entity could not answer a state query.
    #[error("the query of {entity} was refused: {reason}")]
    QueryRefused {
        /// The entity.
        entity: String,
        /// Why.
        reason: String,
    },
    /// The shard system has stopped.
    #[error("the shard system has stopped")]
    Stopped,
}

impl Error {
    pub(crate) fn jetstream(context: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::JetStream {
            context: context.into(),
            source: source.into(),
        }
    }
}
