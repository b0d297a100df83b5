//! The bare baseline: the JetStream work of jetshard's command path, written by hand with
//! async-nats and nothing else. No actors, no state, no framework.
//!
//! Per partition: a pull stream on the partition's consumer in the `owners` priority group
//! (`pinned_client`, as jetshard provisions it), and for every command one event published to
//! `<t>.evt.<p>.<id>` fenced (`Nats-Expected-Last-Subject-Sequence` and `-Subject` against the
//! partition's fence record) with a `Nats-Msg-Id` (and, unless [`BareSettings::server_headers_only`],
//! `Jetshard-Generation` and `Jetshard-Command-Seq`); the command is acknowledged once the event's publish is
//! acknowledged. Writes are pipelined: up to [`IN_FLIGHT`] per partition, whose
//! acknowledgements come back in publish order.
//!
//! It is the strongest naive loop we could write, not a copy of jetshard's settings. The
//! throughput scenario runs it as a user writing it by hand would ([`BareSettings::careful`]):
//! on streams and consumers of its own ([`provision_own`]), with only the server's headers,
//! pulling only while a pass runs (as the independent `bareloop`, `B-loop-pinned`,
//! docs/PERFORMANCE.md, starts its loop after the fill), and checks it against `bareloop` in
//! the same run. What made the difference against the first version of this loop, measured in
//! one run: consumers whose `max_ack_pending` ([`MAX_ACK_PENDING`]) exceeds the writes in
//! flight, so the server keeps the pull buffer full while the writes are pipelined (at 1024,
//! equal to the window, every acknowledgement waited for a delivery round trip), pulls of
//! [`PULL_BATCH`] with `expires` of [`PULL_EXPIRES`] and a heartbeat, and a JetStream context
//! that allows every partition's window in flight at once ([`ACKS_IN_FLIGHT`]; async-nats
//! allows 5,000 by default).
//!
//! Its settings are `settings.rs`'s, its drains by the throughput protocol `drain.rs`'s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use async_nats::HeaderMap;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, Context};
use futures::StreamExt;
use jetshard::wire::{
    HDR_COMMAND_SEQ, HDR_EXPECTED_SUBJECT, HDR_EXPECTED_SUBJECT_SEQ, HDR_GENERATION, HDR_MSG_ID,
    Names, PRIORITY_GROUP,
};
use jetshard::{Codec, Entity, EntityId, FenceRecord};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::JoinHandle;

use crate::entity::{BenchCmd, BenchEntity, BenchState};

mod drain;
mod settings;

pub use drain::drain_bare;
pub use settings::BareSettings;

/// Event writes in flight per partition (jetshard's default `max_ack_pending` is 1024 too).
pub const IN_FLIGHT: usize = 1024;

/// The `max_ack_pending` of the consumers the bare loop drains (provisioned by the harness):
/// well above [`IN_FLIGHT`], as `bareloop`'s.
pub const MAX_ACK_PENDING: u32 = 10_000;

/// Commands asked for per pull request (`bareloop`'s; jetshard's default `pull_batch` is 256).
const PULL_BATCH: usize = 500;

/// A pull request's `expires`: half jetshard's default pin TTL of 2 s, so the pin is refreshed
/// in time.
const PULL_EXPIRES: Duration = Duration::from_secs(1);

/// The pull requests' idle heartbeat.
const PULL_HEARTBEAT: Duration = Duration::from_millis(400);

/// Publish acknowledgements the JetStream context allows in flight: every partition's window.
const ACKS_IN_FLIGHT: usize = 65_536;

/// The server's code for a fenced write refused because another one naming the same subject
/// is in flight (clustered streams only).
const WRITE_IN_FLIGHT: u64 = 10164;
/// A clustered stream's refusal of a message id whose first write is proposed and not yet
/// applied (`duplicate message id is in process`): sent again once that write is applied, it is
/// answered as the duplicate it is.
const MSG_ID_IN_PROCESS: u64 = 10158;
/// How long a write refused with [`MSG_ID_IN_PROCESS`] waits before it is sent again.
const IN_PROCESS_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

/// A running bare loop over every partition of one entity type.
pub struct BareLoop {
    tasks: Vec<JoinHandle<anyhow::Result<()>>>,
    refused: Arc<AtomicU64>,
    pulling: watch::Sender<bool>,
    admin: Box<jetshard::admin::Admin>,
    partitions: u32,
}

impl BareLoop {
    /// Claims generation 1 of every partition (a fence record, as jetshard writes one), then
    /// starts one pull-and-write loop per partition. The streams and consumers must exist
    /// (see [`crate::load::provision`]; best with `max_ack_pending` [`MAX_ACK_PENDING`]).
    pub async fn start(
        client: async_nats::Client,
        entity_type: &str,
        partitions: u32,
    ) -> anyhow::Result<Self> {
        Self::start_with(client, entity_type, partitions, IN_FLIGHT).await
    }

    /// [`BareLoop::start`] with `settings`.
    pub async fn start_with_settings(
        client: async_nats::Client,
        entity_type: &str,
        partitions: u32,
        settings: BareSettings,
    ) -> anyhow::Result<Self> {
        Self::start_inner(client, entity_type, partitions, settings).await
    }

    /// [`BareLoop::start`] with at most `in_flight` event writes in flight per partition: 1 is
    /// the serialized loop, the fastest naive loop that does not collide on a clustered journal.
    /// A write the server refuses because another fenced write of its partition is in flight
    /// (10164, clustered journals only), or a resend that meets its first attempt still in process
    /// (10158), is counted ([`BareLoop::refused`]) and sent again until
    /// it is stored, as a naive loop would.
    pub async fn start_with(
        client: async_nats::Client,
        entity_type: &str,
        partitions: u32,
        in_flight: usize,
    ) -> anyhow::Result<Self> {
        let settings = BareSettings {
            in_flight,
            ..BareSettings::default()
        };
        Self::start_inner(client, entity_type, partitions, settings).await
    }

    async fn start_inner(
        client: async_nats::Client,
        entity_type: &str,
        partitions: u32,
        settings: BareSettings,
    ) -> anyhow::Result<Self> {
        let in_flight = if settings.in_flight == 0 {
            IN_FLIGHT
        } else {
            settings.in_flight
        };
        let js = jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(10))
            .max_ack_inflight(ACKS_IN_FLIGHT)
            .backpressure_on_inflight(true)
            .build(client);
        let names = Arc::new(Names::new(entity_type));
        let commands = js
            .get_stream_no_info(names.command_stream(0))
            .await
            .with_context(|| format!("open stream {}", names.command_stream(0)))?;
        let mut tasks = Vec::new();
        let refused = Arc::new(AtomicU64::new(0));
        let (pulling, pulls) = watch::channel(true);
        let admin = Box::new(jetshard::admin::Admin::new(js.client(), entity_type));
        for partition in 0..partitions {
            let fence_seq = claim(&js, &names, partition).await?;
            let consumer: PullConsumer = commands
                .get_consumer(&names.consumer(partition))
                .await
                .map_err(|e| anyhow!("open the consumer of partition {partition}: {e}"))?;
            let writer = PartitionWriter {
                js: js.clone(),
                names: names.clone(),
                partition,
                fence_seq: fence_seq.to_string(),
                fence_subject: names.fence_subject(partition),
                codec: Codec::default(),
                in_flight: in_flight.max(1),
                refused: refused.clone(),
                settings,
            };
            tasks.push(tokio::spawn(Arc::new(writer).run(consumer, pulls.clone())));
        }
        Ok(Self {
            tasks,
            refused,
            pulling,
            admin,
            partitions,
        })
    }

    /// With [`BareSettings::held`], stops pulling (`pulling == false`: every partition drops its
    /// pull stream and the pins are moved off, so that the next stream is pinned at its first
    /// delivery) or starts it again.
    pub async fn hold(&self, pulling: bool) -> anyhow::Result<()> {
        self.pulling.send_replace(pulling);
        if !pulling {
            for partition in 0..self.partitions {
                self.admin
                    .unpin(partition)
                    .await
                    .with_context(|| format!("unpin partition {partition}"))?;
            }
        }
        Ok(())
    }

    /// Event writes refused with 10164 or 10158 (and sent again) so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// An error if a partition loop has ended (they run until stopped).
    pub fn check(&self) -> anyhow::Result<()> {
        if self.tasks.iter().any(JoinHandle::is_finished) {
            return Err(anyhow!("a bare partition loop ended early"));
        }
        Ok(())
    }

    /// Stops every loop and reports the first error a loop ended with.
    pub async fn stop(self) -> anyhow::Result<()> {
        let mut first_error = None;
        for task in self.tasks {
            if task.is_finished() {
                if let Ok(Err(e)) = task.await {
                    first_error.get_or_insert(e);
                }
            } else {
                task.abort();
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Creates the streams and consumers a user writing this loop by hand would, with the names
/// jetshard gives them (so the harness's pre-load, pause and drain work unchanged): the command
/// stream as jetshard's (a work queue partitioned by the server's subject transform), one
/// pinned pull consumer per partition with `max_ack_pending` [`MAX_ACK_PENDING`], and a
/// journal of events and fence records only, with the server's defaults otherwise (a 2-minute
/// duplicate window; no atomic batches, roll-ups or direct gets, which the loop does not use).
pub async fn provision_own(
    client: &async_nats::Client,
    entity_type: &str,
    partitions: u32,
) -> anyhow::Result<()> {
    use async_nats::jetstream::consumer::{AckPolicy, PriorityPolicy, pull};
    use async_nats::jetstream::stream::{self, RetentionPolicy, StorageType, SubjectTransform};
    let js = jetstream::new(client.clone());
    let names = Names::new(entity_type);
    let commands = js
        .create_stream(stream::Config {
            name: names.command_stream(0).to_owned(),
            subjects: names.command_subjects(0),
            subject_transform: Some(SubjectTransform {
                source: names.command_subjects(0).remove(0),
                destination: names.command_transform_dest(partitions),
            }),
            retention: RetentionPolicy::WorkQueue,
            storage: StorageType::File,
            ..Default::default()
        })
        .await
        .context("create the command stream")?;
    js.create_stream(stream::Config {
        name: names.journal_stream(0).to_owned(),
        subjects: vec![
            format!("{entity_type}.evt.*.*"),
            format!("{entity_type}.fence.*"),
        ],
        retention: RetentionPolicy::Limits,
        storage: StorageType::File,
        ..Default::default()
    })
    .await
    .context("create the journal stream")?;
    for partition in 0..partitions {
        commands
            .create_consumer(pull::Config {
                durable_name: Some(names.consumer(partition)),
                filter_subject: names.partition_commands(partition),
                ack_policy: AckPolicy::Explicit,
                max_ack_pending: i64::from(MAX_ACK_PENDING),
                priority_policy: PriorityPolicy::PinnedClient,
                priority_groups: vec![PRIORITY_GROUP.to_owned()],
                priority_timeout: Duration::from_secs(2),
                ..Default::default()
            })
            .await
            .with_context(|| format!("create the consumer of partition {partition}"))?;
    }
    Ok(())
}

/// Writes generation 1's fence record of `partition`; returns its journal sequence.
async fn claim(js: &Context, names: &Names, partition: u32) -> anyhow::Result<u64> {
    let record = FenceRecord::new(partition, 1, "bare");
    let body = serde_json::to_vec(&record).context("encode a fence record")?;
    let publish = PublishMessage::build()
        .payload(body.into())
        .header(HDR_GENERATION, "1")
        .expected_last_subject_sequence(0);
    let ack = js
        .send_publish(names.fence_subject(partition), publish)
        .await
        .context("publish a fence record")?
        .await
        .context("claim generation 1")?;
    Ok(ack.sequence)
}

struct PartitionWriter {
    js: Context,
    names: Arc<Names>,
    partition: u32,
    fence_seq: String,
    fence_subject: String,
    codec: Codec,
    in_flight: usize,
    refused: Arc<AtomicU64>,
    settings: BareSettings,
}

impl PartitionWriter {
    async fn run(
        self: Arc<Self>,
        consumer: PullConsumer,
        mut pulling: watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let permits = Arc::new(Semaphore::new(self.in_flight));
        let (written, mut to_ack) = mpsc::unbounded_channel::<(
            PublishAckFuture,
            jetstream::Message,
            OwnedSemaphorePermit,
        )>();
        let writer = self.clone();
        let acker: JoinHandle<anyhow::Result<()>> = tokio::spawn(async move {
            while let Some((event_ack, command, permit)) = to_ack.recv().await {
                writer.confirm(event_ack, &command).await?;
                tracing::trace!(target: crate::stages::BARE_STAGE_TARGET, seq = seq_of(&command), "written");
                tracing::trace!(target: crate::stages::BARE_STAGE_TARGET, seq = seq_of(&command), "acking");
                command
                    .ack()
                    .await
                    .map_err(|e| anyhow!("acknowledge a command: {e}"))?;
                drop(permit);
            }
            Ok(())
        });
        let held = self.settings.held;
        'pulls: loop {
            if pulling.wait_for(|on| *on).await.is_err() {
                break;
            }
            let mut messages = consumer
                .stream()
                .max_messages_per_batch(PULL_BATCH)
                .expires(PULL_EXPIRES)
                .heartbeat(PULL_HEARTBEAT)
                .group(PRIORITY_GROUP)
                .messages()
                .await
                .context("start pulling")?;
            loop {
                let next = if held {
                    tokio::select! {
                        next = messages.next() => next,
                        _ = pulling.wait_for(|on| !*on) => continue 'pulls,
                    }
                } else {
                    messages.next().await
                };
                let Some(message) = next else { break 'pulls };
                let message = match message {
                    Ok(message) => message,
                    Err(e) => {
                        tracing::warn!(partition = self.partition, error = %e, "bare pull stream");
                        continue;
                    }
                };
                tracing::trace!(
                    target: crate::stages::BARE_STAGE_TARGET,
                    seq = seq_of(&message),
                    reply = message.reply.as_deref().unwrap_or(""),
                    "pulled"
                );
                let permit = permits
                    .clone()
                    .acquire_owned()
                    .await
                    .context("the write window")?;
                let event_ack = self.write_event(&message).await?;
                if written.send((event_ack, message, permit)).is_err() {
                    break 'pulls;
                }
            }
        }
        drop(written);
        acker.await.context("the acknowledging task")?
    }

    /// Waits for an event write's acknowledgement; a write refused for another in flight
    /// (10164) is counted and sent again until it is stored, and so is one whose resend met
    /// its first attempt still in process (10158, after a pause: the first is then applied and
    /// the resend answered as its duplicate).
    async fn confirm(
        &self,
        mut event_ack: PublishAckFuture,
        command: &jetstream::Message,
    ) -> anyhow::Result<()> {
        loop {
            match event_ack.await {
                Ok(_) => return Ok(()),
                Err(e) if server_error_code(&e) == Some(WRITE_IN_FLIGHT) => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    event_ack = self.write_event(command).await?;
                }
                Err(e) if server_error_code(&e) == Some(MSG_ID_IN_PROCESS) => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(IN_PROCESS_PAUSE).await;
                    event_ack = self.write_event(command).await?;
                }
                Err(e) => return Err(e).context("event write not acknowledged"),
            }
        }
    }

    /// Decides the command's event and publishes it, fenced; returns the pending publish ack.
    async fn write_event(&self, message: &jetstream::Message) -> anyhow::Result<PublishAckFuture> {
        let command_seq = message
            .info()
            .map_err(|e| anyhow!("read a delivery's sequence: {e}"))?
            .stream_sequence;
        let id = Names::entity_of_subject(&message.subject)
            .and_then(|id| EntityId::new(id).ok())
            .context("a command subject without a valid entity id")?;
        let command: BenchCmd = self
            .codec
            .decode(&message.payload)
            .context("decode a command")?;
        let events = BenchEntity::decide(&BenchState::default(), command)
            .map_err(|rejection| anyhow!("rejected: {rejection}"))?;
        let event = events
            .first()
            .context("the bench command decided no event")?;
        let payload: bytes::Bytes = self.codec.encode(event).context("encode an event")?.into();
        let mut headers = HeaderMap::new();
        if !self.settings.server_headers_only {
            headers.insert(HDR_GENERATION, "1");
        }
        headers.insert(HDR_EXPECTED_SUBJECT_SEQ, self.fence_seq.as_str());
        headers.insert(HDR_EXPECTED_SUBJECT, self.fence_subject.as_str());
        if !self.settings.server_headers_only {
            headers.insert(HDR_COMMAND_SEQ, command_seq.to_string());
        }
        headers.insert(HDR_MSG_ID, self.names.event_msg_id(command_seq, 0));
        let subject = self.names.event_subject(self.partition, &id);
        tracing::trace!(target: crate::stages::BARE_STAGE_TARGET, seq = command_seq, "writing");
        self.js
            .send_publish(
                subject,
                PublishMessage::build().payload(payload).headers(headers),
            )
            .await
            .context("publish an event")
    }
}

/// The JetStream error code behind a publish error, if the server answered with one.
fn server_error_code(error: &async_nats::jetstream::context::PublishError) -> Option<u64> {
    std::error::Error::source(error)?
        .downcast_ref::<async_nats::jetstream::Error>()
        .map(|e| e.error_code().0)
}

/// A delivery's stream sequence, for the stage events (`--latency-stages`); 0 if unreadable.
fn seq_of(message: &jetstream::Message) -> u64 {
    message.info().map_or(0, |info| info.stream_sequence)
}
