//! What the server accepts and answers: its limit on one atomic batch, its error codes, and why
//! a journal write did not happen.

use crate::error::{BoxError, Error};

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

/// The JetStream error code behind a publish error, if the server answered with one.
pub(crate) fn server_error_code(
    error: &async_nats::jetstream::context::PublishError,
) -> Option<u64> {
    std::error::Error::source(error)?
        .downcast_ref::<async_nats::jetstream::Error>()
        .map(|e| e.error_code().0)
}
