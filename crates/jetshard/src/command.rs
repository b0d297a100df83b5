//! Sending commands: a plain JetStream publish to `<type>.cmd.<id>`.
//!
//! Nothing else is needed to send one; any NATS client can (docs/WIRE.md). This sender adds id
//! validation and encoding.

use std::future::IntoFuture;
use std::marker::PhantomData;
use std::time::Duration;

use async_nats::jetstream::{self, Context};
use async_nats::{Client, HeaderMap};
use futures::StreamExt;

use crate::codec::Codec;
use crate::config::ShardConfig;
use crate::data::CommandOutcome;
use crate::entity::{Entity, EntityId};
use crate::error::Error;
use crate::reply::{Reply, ReplyBody};
use crate::trace::TraceParent;
use crate::wire::{HDR_MSG_ID, HDR_REPLY_TO, HDR_TRACEPARENT, Names};

/// The longest idempotency key [`CommandSender::send_with_key`] takes, in bytes.
pub const MAX_KEY_LEN: usize = 128;

/// How long a send publishes again while no stream takes its subject ("no responders"): the
/// streams of a new entity type, or a stream's interest still spreading to this client's
/// server of a cluster, before it is [`Error::NoCommandStream`]. Where a stream does hold the
/// subject, it is electing a leader (its leader's server died or froze): the send goes on
/// publishing for up to 30 s in all.
#[cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
pub const NO_STREAM_WAIT: Duration = Duration::from_secs(2);

/// The first pause between two publishes that no stream took; it doubles up to
/// [`NO_STREAM_MAX_PAUSE`].
const NO_STREAM_FIRST_PAUSE: Duration = Duration::from_millis(10);
const NO_STREAM_MAX_PAUSE: Duration = Duration::from_millis(250);

/// How long a keyed send waits for the stream's acknowledgement before it publishes again
/// under the same message id; it doubles up to [`KEYED_MAX_RESEND_AFTER`]. A publish forwarded
/// to a stream leader that froze or died is never answered, and the stream's next leader
/// stores only what is published again: waiting for the client's ack timeout (5 s) each time
/// would hold the command that long past the election.
const KEYED_FIRST_RESEND_AFTER: Duration = Duration::from_secs(1);
const KEYED_MAX_RESEND_AFTER: Duration = Duration::from_secs(2);

/// How long a keyed send publishes again before it waits out the client's ack timeout on its
/// last publish: longer than a stream leader's election and a frozen server's return (seconds
/// each), well within the command stream's duplicate window (2 minutes).
const KEYED_RESEND_WAIT: Duration = Duration::from_secs(30);

/// Publishes commands for one entity type.
pub struct CommandSender<E: Entity> {
    pub(crate) js: Context,
    pub(crate) names: Names,
    pub(crate) codec: Codec,
    /// The entity type's partition count (state queries are routed by partition).
    pub(crate) partitions: u32,
    trace: Option<TraceParent>,
    _entity: PhantomData<fn() -> E>,
}

impl<E: Entity> Clone for CommandSender<E> {
    fn clone(&self) -> Self {
        Self {
            js: self.js.clone(),
            names: self.names.clone(),
            codec: self.codec,
            partitions: self.partitions,
            trace: self.trace,
            _entity: PhantomData,
        }
    }
}

impl<E: Entity> CommandSender<E> {
    /// A sender for the entity type and codec of `config`.
    pub fn new(client: Client, config: &ShardConfig) -> Self {
        Self {
            js: jetstream::new(client),
            names: config.names(),
            codec: config.codec,
            partitions: config.partitions,
            trace: None,
            _entity: PhantomData,
        }
    }

    /// A sender whose commands carry the W3C trace context `trace` in a `traceparent` header
    /// (the caller's current span: its trace id and its span id as the parent). The entity's
    /// `command` span records `trace_id`, `parent_id` and a `span_id` of its own; the events the
    /// command writes and its outcome reply carry `traceparent` with that span as parent
    /// (docs/WIRE.md). Cheap: a copy of this sender.
    ///
    /// ```no_run
    /// # use jetshard::{CommandSender, Entity, TraceParent};
    /// # async fn run<E: Entity>(sender: CommandSender<E>, command: E::Command) -> Result<(), jetshard::Error> {
    /// // From the caller's tracing system, or a new trace:
    /// let trace = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    ///     .unwrap_or_else(TraceParent::new_root);
    /// sender.traced(trace).send("o-17", &command).await?;
    /// # Ok(()) }
    /// ```
    pub fn traced(&self, trace: TraceParent) -> Self {
        Self {
            trace: Some(trace),
            ..self.clone()
        }
    }

    /// Publishes `command` for the entity `id` and waits until the command stream has stored
    /// it. Returns the command's stream sequence.
    ///
    /// # Errors
    /// [`Error::InvalidId`], [`Error::Codec`] or [`Error::PayloadTooLarge`] before anything is
    /// published; [`Error::NoCommandStream`] if no stream took the command for
    /// two seconds (nothing is stored: the publish is made again meanwhile);
    /// [`Error::JetStream`] if the stream did not confirm (then the command may or may not be
    /// stored).
    pub async fn send(&self, id: &str, command: &E::Command) -> Result<u64, Error> {
        self.publish(id, command, HeaderMap::new()).await
    }

    /// Publishes `command` for the entity `id` under an idempotency `key`: publishing again
    /// with the same `id` and `key` (a retry after a timeout, or after a crash of the sender)
    /// stores no second command, as long as the retry comes within the command stream's
    /// duplicate window (2 minutes). Returns the command's stream sequence: the first one's, for
    /// a retry.
    ///
    /// Being safe to repeat, a keyed send repeats itself: a publish not acknowledged within a
    /// second (then every 2 s) is made again, for up to 30 s, so that a command published
    /// as the command stream's leader froze or died is stored by the next leader as soon as
    /// it is elected, rather than failing at the client's ack timeout.
    ///
    /// # Errors
    /// As [`send`](Self::send) (the stream did not confirm within 30 s and the client's ack
    /// timeout); [`Error::InvalidKey`] if `key` is empty, longer than [`MAX_KEY_LEN`] bytes, or
    /// holds whitespace or control characters.
    pub async fn send_with_key(
        &self,
        id: &str,
        key: &str,
        command: &E::Command,
    ) -> Result<u64, Error> {
        let mut headers = HeaderMap::new();
        headers.insert(HDR_MSG_ID, keyed_msg_id(id, key)?);
        self.publish(id, command, headers).await
    }

    /// As [`request`](Self::request), under an idempotency `key` (as
    /// [`send_with_key`](Self::send_with_key)): a caller whose request failed (a JetStream
    /// error: the command may or may not be stored; or [`Error::NoOutcome`]) retries with the
    /// same `id` and `key` and gets the command's own typed outcome if it is still to come, since
    /// every send under one key waits on one reply subject (derived from the entity type, `id`
    /// and `key`). [`Reply::Duplicate`] comes only to such a retry, when the command was stored
    /// by an earlier send and no answer came within `timeout`: it was answered before this
    /// retry listened.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use jetshard::{CommandSender, Entity, Reply};
    /// # async fn run<E: Entity>(sender: CommandSender<E>, command: E::Command) -> Result<(), jetshard::Error> {
    /// let reply = match sender.request_with_key("acc-17", "transfer-991", &command, Duration::from_secs(5)).await {
    ///     Ok(reply) => reply,
    ///     // Stored or not, a retry under the same key cannot apply it twice.
    ///     Err(_) => sender.request_with_key("acc-17", "transfer-991", &command, Duration::from_secs(5)).await?,
    /// };
    /// # let _ = reply;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`request`](Self::request) and [`send_with_key`](Self::send_with_key).
    pub async fn request_with_key(
        &self,
        id: &str,
        key: &str,
        command: &E::Command,
        timeout: Duration,
    ) -> Result<Reply<E>, Error> {
        let body = self.ask_keyed(id, key, command, timeout).await?;
        Ok(body.into_reply::<E>(self.codec)?)
    }

    /// As [`request_with_key`](Self::request_with_key), but the outcome untyped, as
    /// [`request_outcome`](Self::request_outcome) gives it.
    ///
    /// # Errors
    /// As [`request_with_key`](Self::request_with_key).
    pub async fn request_outcome_with_key(
        &self,
        id: &str,
        key: &str,
        command: &E::Command,
        timeout: Duration,
    ) -> Result<CommandOutcome, Error> {
        Ok(self.ask_keyed(id, key, command, timeout).await?.outcome)
    }

    async fn ask_keyed(
        &self,
        id: &str,
        key: &str,
        command: &E::Command,
        timeout: Duration,
    ) -> Result<ReplyBody, Error> {
        let msg_id = keyed_msg_id(id, key)?;
        let client = self.js.client();
        // One reply subject per (entity type, id, key), under the client's inbox prefix: a retry
        // listens where the stored command's owner answers.
        let prefix = client
            .new_inbox()
            .rsplit_once('.')
            .map_or_else(|| "_INBOX".to_owned(), |(prefix, _)| prefix.to_owned());
        let inbox = format!(
            "{prefix}.jetshard-key-{:016x}",
            fnv1a(&[
                self.names.entity_type.as_bytes(),
                id.as_bytes(),
                key.as_bytes()
            ])
        );
        let mut headers = HeaderMap::new();
        headers.insert(HDR_MSG_ID, msg_id);
        self.ask_on(inbox, id, command, timeout, headers).await
    }

    /// Publishes `command` and waits for its outcome in the entity's own types: the events it
    /// wrote, the entity's rejection, a duplicate, or a dead letter. The command's owner answers
    /// on a reply subject named in the `Jetshard-Reply-To` header (docs/WIRE.md).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use jetshard::{CommandSender, Entity, Reply};
    /// # async fn run<E: Entity>(sender: CommandSender<E>, command: E::Command) -> Result<(), jetshard::Error> {
    /// match sender.request("acc-17", &command, Duration::from_secs(5)).await? {
    ///     Reply::Applied { events, .. } => { /* the events, durable */ }
    ///     Reply::Rejected { rejection, .. } => { /* E::Rejection, as decide returned it */ }
    ///     _ => { /* a duplicate or a dead letter */ }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`send`](Self::send); [`Error::NoOutcome`] if no outcome came within `timeout` (the
    /// command is stored and will still be applied); [`Error::Codec`] if the reply's payloads do
    /// not decode as this entity type's events or rejection.
    pub async fn request(
        &self,
        id: &str,
        command: &E::Command,
        timeout: Duration,
    ) -> Result<Reply<E>, Error> {
        let body = self.ask(id, command, timeout).await?;
        Ok(body.into_reply::<E>(self.codec)?)
    }

    /// As [`request`](Self::request), but the outcome untyped: the event count and the
    /// rejection's text, as any NATS client reads it (docs/WIRE.md).
    ///
    /// # Errors
    /// As [`request`](Self::request).
    pub async fn request_outcome(
        &self,
        id: &str,
        command: &E::Command,
        timeout: Duration,
    ) -> Result<CommandOutcome, Error> {
        Ok(self.ask(id, command, timeout).await?.outcome)
    }

    async fn ask(
        &self,
        id: &str,
        command: &E::Command,
        timeout: Duration,
    ) -> Result<ReplyBody, Error> {
        let inbox = self.js.client().new_inbox();
        self.ask_on(inbox, id, command, timeout, HeaderMap::new())
            .await
    }

    /// Publishes `command` naming `inbox` as its reply subject and waits there for its outcome.
    /// A publish the stream answers as a duplicate (an idempotency key sent before) that gets no
    /// answer within `timeout` is a [`CommandOutcome::Duplicate`].
    async fn ask_on(
        &self,
        inbox: String,
        id: &str,
        command: &E::Command,
        timeout: Duration,
        mut headers: HeaderMap,
    ) -> Result<ReplyBody, Error> {
        let client = self.js.client();
        let mut answers = client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| Error::jetstream("subscribe for the outcome", e))?;
        headers.insert(HDR_REPLY_TO, inbox.as_str());
        let ack = self.publish_acked(id, command, headers).await?;
        let answer = tokio::time::timeout(timeout, answers.next())
            .await
            .ok()
            .flatten();
        let Some(answer) = answer else {
            if ack.duplicate {
                return Ok(ReplyBody::new(
                    CommandOutcome::Duplicate {
                        command_seq: ack.sequence,
                    },
                    None,
                ));
            }
            return Err(Error::NoOutcome {
                command_seq: ack.sequence,
                waited: timeout,
            });
        };
        serde_json::from_slice(&answer.payload).map_err(|e| Error::jetstream("read the outcome", e))
    }

    async fn publish(
        &self,
        id: &str,
        command: &E::Command,
        headers: HeaderMap,
    ) -> Result<u64, Error> {
        Ok(self.publish_acked(id, command, headers).await?.sequence)
    }

    async fn publish_acked(
        &self,
        id: &str,
        command: &E::Command,
        mut headers: HeaderMap,
    ) -> Result<jetstream::publish::PublishAck, Error> {
        let id = EntityId::new(id)?;
        if let Some(trace) = &self.trace {
            headers.insert(HDR_TRACEPARENT, trace.to_string());
        }
        let payload = self.codec.encode(command)?;
        let max = self.js.client().server_info().max_payload;
        if max > 0 && payload.len() > max {
            return Err(Error::PayloadTooLarge {
                size: payload.len(),
                max,
            });
        }
        let subject = self.names.command_subject(&id);
        let payload = bytes::Bytes::from(payload);
        let keyed = headers.get(HDR_MSG_ID).is_some();
        let started = tokio::time::Instant::now();
        let mut pause = NO_STREAM_FIRST_PAUSE;
        let mut resend_after = KEYED_FIRST_RESEND_AFTER;
        let mut resent = false;
        // A stream holds the subject but answers nothing: it is electing a leader.
        let mut electing = false;
        loop {
            let ack = self
                .js
                .publish_with_headers(subject.clone(), headers.clone(), payload.clone())
                .await
                .map_err(|e| Error::jetstream(format!("publish to {subject}"), e))?;
            let answer = if keyed && started.elapsed() + resend_after < KEYED_RESEND_WAIT {
                match tokio::time::timeout(resend_after, ack.into_future()).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        tracing::debug!(%subject, ?resend_after, "no acknowledgement yet; publishing again under the same message id");
                        resend_after = (resend_after * 2).min(KEYED_MAX_RESEND_AFTER);
                        resent = true;
                        continue;
                    }
                }
            } else {
                ack.await
            };
            match answer {
                // A duplicate after a publish of this send's own was made again may be that
                // one, stored late: not a sign of an earlier send.
                Ok(mut ack) => {
                    ack.duplicate &= !resent;
                    return Ok(ack);
                }
                // "No responders": no stream subscribes to the subject on this client's server,
                // so nothing was stored and the publish can be made again as it is.
                Err(e) if e.kind() == jetstream::context::PublishErrorKind::StreamNotFound => {
                    let waited = started.elapsed();
                    let wait = if waited < NO_STREAM_WAIT {
                        NO_STREAM_WAIT
                    } else {
                        electing = electing || self.stream_holds(&subject).await;
                        if electing {
                            KEYED_RESEND_WAIT
                        } else {
                            NO_STREAM_WAIT
                        }
                    };
                    if waited >= wait {
                        return Err(Error::NoCommandStream {
                            subject: subject.to_string(),
                            waited,
                        });
                    }
                    tracing::debug!(%subject, ?waited, electing, "no stream took the command yet; publishing again");
                    tokio::time::sleep(pause.min(wait - waited)).await;
                    pause = (pause * 2).min(NO_STREAM_MAX_PAUSE);
                }
                Err(e) => return Err(Error::jetstream(format!("publish to {subject}"), e)),
            }
        }
    }

    /// Whether a stream holds `subject` (as the server's meta leader says; a lookup that fails
    /// counts as one, the meta group may be electing too).
    async fn stream_holds(&self, subject: &str) -> bool {
        match self.js.stream_by_subject(subject.to_owned()).await {
            Ok(_) => true,
            Err(e) => e.kind() != jetstream::context::GetStreamByNameErrorKind::NotFound,
        }
    }
}

/// The `Nats-Msg-Id` of a command sent under an idempotency key.
fn keyed_msg_id(id: &str, key: &str) -> Result<String, Error> {
    if key.is_empty()
        || key.len() > MAX_KEY_LEN
        || key.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(Error::InvalidKey {
            key: key.chars().take(MAX_KEY_LEN).collect(),
        });
    }
    Ok(Names::keyed_command_msg_id(id, key))
}

/// FNV-1a over the parts, each followed by a 0 byte: stable across processes and versions.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in part.iter().chain(&[0u8]) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}
