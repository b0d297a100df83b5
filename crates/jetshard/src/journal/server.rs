//! What the server accepts and answers: its limit on one atomic batch, its error codes, and why
//! a journal write did not happen.

use async_nats::jetstream::context::GetStreamErrorKind;

use crate::error::{BoxError, Error};
use crate::wire::{METADATA_JOURNAL_STREAMS, Names};

/// The server's limit on messages in one atomic batch (`jetstream.limits.batch.max_msgs`).
pub(crate) const MAX_BATCH_MESSAGES: usize = 1000;

/// Why a journal write did not happen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    /// The partition has a newer generation: this writer is stale and must stop.
    #[error("fenced: generation {generation} is no longer the partition's latest")]
    Fenced { generation: u64 },
    /// The server did not confirm the write (timeout, leader change, connection loss). The
    /// write may or may not be stored; a retry with the same message ids is safe.
    #[error("journal write not confirmed: {0}")]
    Unconfirmed(#[source] BoxError),
    /// The write can never succeed as it is (an event over the server's `max_payload`): a
    /// retry would fail the same way.
    #[error("journal write refused: {0}")]
    Refused(String),
    /// More events than one atomic batch can hold.
    #[error(
        "a command decided {events} events; at most {MAX_EVENTS_PER_COMMAND} fit one atomic write"
    )]
    TooManyEvents { events: usize },
}

/// The server's limit on messages in one atomic batch: a command's events are one unit.
pub(crate) const MAX_EVENTS_PER_COMMAND: usize = MAX_BATCH_MESSAGES;

/// Opens stream `name` without reading its info ([`Error::JetStream`] if it cannot).
pub(crate) async fn open_stream(
    js: &async_nats::jetstream::Context,
    name: &str,
) -> Result<async_nats::jetstream::stream::Stream<()>, Error> {
    js.get_stream_no_info(name)
        .await
        .map_err(|e| Error::jetstream(format!("open stream {name}"), e))
}

/// Stream `name` as the server has it now: its config and state ([`Error::JetStream`] if it
/// does not exist or cannot be read).
pub(crate) async fn stream_info(
    js: &async_nats::jetstream::Context,
    name: &str,
) -> Result<async_nats::jetstream::stream::Info, Error> {
    let mut stream = js
        .get_stream(name)
        .await
        .map_err(|e| Error::jetstream(format!("open stream {name}"), e))?;
    stream
        .info()
        .await
        .cloned()
        .map_err(|e| Error::jetstream(format!("read stream {name}"), e))
}

/// The streams of an entity type's journal or of its commands, opened, in the order of
/// [`Names::journal_streams`] or [`Names::command_streams`]: partition `p`'s records or
/// commands are in stream `p % n`.
#[derive(Clone)]
pub(crate) struct Streams(Vec<async_nats::jetstream::stream::Stream<()>>);

impl Streams {
    /// Opens every stream of `names` (in order), without reading their info.
    pub(crate) async fn open(
        js: &async_nats::jetstream::Context,
        names: &[String],
    ) -> Result<Self, Error> {
        let mut streams = Vec::with_capacity(names.len());
        for name in names {
            streams.push(open_stream(js, name).await?);
        }
        Ok(Self(streams))
    }

    /// One stream holding the whole journal (or a mirror of it).
    pub(crate) fn one(stream: async_nats::jetstream::stream::Stream<()>) -> Self {
        Self(vec![stream])
    }

    /// The stream holding `partition`'s records or commands.
    pub(crate) fn of(&self, partition: u32) -> &async_nats::jetstream::stream::Stream<()> {
        &self.0[partition as usize % self.0.len()]
    }

    /// Every stream, in order.
    pub(crate) fn all(&self) -> &[async_nats::jetstream::stream::Stream<()>] {
        &self.0
    }
}

/// The names of entity type `entity_type` as its streams record them: one command stream
/// (`<T>_CMD`, the partition count in its subject transform) with the journal in the streams
/// its metadata names (one where it records none: written before journals could be spread),
/// or a spread layout (`<T>_CMD_0` ... , the stream count and the partition count in their
/// metadata); one stream of unknown partition count where neither exists (a journal read on
/// its own).
///
/// # Errors
/// [`Error::JetStream`] if a command stream cannot be read.
pub(crate) async fn recorded_names(
    js: &async_nats::jetstream::Context,
    entity_type: &str,
) -> Result<Names, Error> {
    for name in Names::first_command_streams(entity_type) {
        let Some(info) = stream_info_if_any(js, &name).await? else {
            continue;
        };
        let streams = (info.config.metadata.get(METADATA_JOURNAL_STREAMS))
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        let partitions = Names::recorded_partitions(&info.config).unwrap_or(0);
        return Ok(Names::spread(entity_type, streams, partitions));
    }
    Ok(Names::new(entity_type))
}

/// The info of stream `name`, `None` if it does not exist.
pub(crate) async fn stream_info_if_any(
    js: &async_nats::jetstream::Context,
    name: &str,
) -> Result<Option<async_nats::jetstream::stream::Info>, Error> {
    match js.get_stream(name).await {
        Ok(mut stream) => stream
            .info()
            .await
            .cloned()
            .map(Some)
            .map_err(|e| Error::jetstream(format!("read stream {name}"), e)),
        Err(e) => match e.kind() {
            GetStreamErrorKind::JetStream(err)
                if err.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND =>
            {
                Ok(None)
            }
            _ => Err(Error::jetstream(format!("look up stream {name}"), e)),
        },
    }
}

/// The JetStream error code behind a publish error, if the server answered with one.
pub(crate) fn server_error_code(
    error: &async_nats::jetstream::context::PublishError,
) -> Option<u64> {
    std::error::Error::source(error)?
        .downcast_ref::<async_nats::jetstream::Error>()
        .map(|e| e.error_code().0)
}
