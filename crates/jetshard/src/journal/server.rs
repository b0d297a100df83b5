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

/// The streams of an entity type's journal, opened, in the order of
/// [`Names::journal_streams`]: partition `p`'s records are in stream `p % n`.
#[derive(Clone)]
pub(crate) struct Journals(Vec<async_nats::jetstream::stream::Stream<()>>);

impl Journals {
    /// Opens every journal stream `names` names, without reading their info.
    pub(crate) async fn open(
        js: &async_nats::jetstream::Context,
        names: &Names,
    ) -> Result<Self, Error> {
        let mut streams = Vec::with_capacity(names.journal_streams().len());
        for name in names.journal_streams() {
            streams.push(open_stream(js, name).await?);
        }
        Ok(Self(streams))
    }

    /// One stream holding the whole journal (or a mirror of it).
    pub(crate) fn one(stream: async_nats::jetstream::stream::Stream<()>) -> Self {
        Self(vec![stream])
    }

    /// The stream holding `partition`'s records.
    pub(crate) fn of(&self, partition: u32) -> &async_nats::jetstream::stream::Stream<()> {
        &self.0[partition as usize % self.0.len()]
    }

    /// Every stream, in order.
    pub(crate) fn all(&self) -> &[async_nats::jetstream::stream::Stream<()>] {
        &self.0
    }
}

/// The names of entity type `entity_type` as its streams record them: the journal spread over
/// the streams the command stream's metadata names, for the partition count its subject
/// transform names; one stream, `<T>_JOURNAL`, where the command stream records none (written
/// before journals could be spread) or does not exist (a journal read on its own).
///
/// # Errors
/// [`Error::JetStream`] if the command stream cannot be read.
pub(crate) async fn recorded_names(
    js: &async_nats::jetstream::Context,
    entity_type: &str,
) -> Result<Names, Error> {
    let names = Names::new(entity_type);
    let info =
        match js.get_stream(names.command_stream()).await {
            Ok(mut stream) => stream.info().await.cloned().map_err(|e| {
                Error::jetstream(format!("read stream {}", names.command_stream()), e)
            })?,
            Err(e) => match e.kind() {
                GetStreamErrorKind::JetStream(err)
                    if err.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND =>
                {
                    return Ok(names);
                }
                _ => {
                    return Err(Error::jetstream(
                        format!("look up stream {}", names.command_stream()),
                        e,
                    ));
                }
            },
        };
    let streams = info
        .config
        .metadata
        .get(METADATA_JOURNAL_STREAMS)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let partitions = info
        .config
        .subject_transform
        .as_ref()
        .and_then(|t| Names::partitions_of_transform(&t.destination))
        .unwrap_or(0);
    Ok(Names::spread(entity_type, streams, partitions))
}

/// The JetStream error code behind a publish error, if the server answered with one.
pub(crate) fn server_error_code(
    error: &async_nats::jetstream::context::PublishError,
) -> Option<u64> {
    std::error::Error::source(error)?
        .downcast_ref::<async_nats::jetstream::Error>()
        .map(|e| e.error_code().0)
}
