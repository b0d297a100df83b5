//! Putting work in front of a system: provisioning, pre-loading commands with many publish
//! acknowledgements in flight, holding partitions back with consumer pause, and waiting for a
//! command stream to drain. A load offered at a fixed rate is in [`crate::offered`].

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::{Context as _, bail};
use async_nats::Subject;
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, Context};
use bytes::Bytes;
use jetshard::admin::Admin;
use jetshard::{Codec, ShardConfig, ShardSystem};
use tokio::time::Instant;

use crate::entity::{BenchCmd, BenchEntity, entity_id};

/// Publish acknowledgements a pre-load keeps in flight (the client allows 5000 per context).
pub const PUBLISH_WINDOW: usize = 4096;

/// How often a drain is checked while much is left: each check is a stream-info request the
/// server answers while it serves the drain, so it is not asked 200 times a second.
const DRAIN_POLL: Duration = Duration::from_millis(50);

/// How often it is checked near the end (under [`DRAIN_NEAR_END`] of the messages at the
/// start): bounds the resolution of drain times.
const DRAIN_POLL_NEAR_END: Duration = Duration::from_millis(2);

/// The fraction of the messages left at which [`DRAIN_POLL_NEAR_END`] takes over.
const DRAIN_NEAR_END: f64 = 0.05;

/// Pauses are this long; every pause is ended by a resume.
const PAUSE_FOR: Duration = Duration::from_secs(3600);

/// Creates an entity type's streams and consumers exactly as jetshard does, by starting a
/// shard system and stopping it again before anything is delivered.
pub async fn provision(client: async_nats::Client, config: ShardConfig) -> anyhow::Result<()> {
    let system = ShardSystem::start::<BenchEntity>(client, config)
        .await
        .context("provision the streams through a shard system")?;
    system
        .shutdown()
        .await
        .context("stop the provisioning system")
}

/// A core subscription on `<t>.evt.>`: every event of the entity type, as the journal stores it.
pub async fn subscribe_events(
    client: &async_nats::Client,
    entity_type: &str,
) -> anyhow::Result<async_nats::Subscriber> {
    client
        .subscribe(format!("{entity_type}.evt.>"))
        .await
        .context("subscribe to the journal's events")
}

/// Publishes commands to `<t>.cmd.<id>`, keeping many acknowledgements in flight.
pub struct CommandPublisher {
    js: Context,
    subjects: Vec<Subject>,
    codec: Codec,
}

impl CommandPublisher {
    /// A publisher for `entities` bench entities (`e0`, `e1`, ...) of `entity_type`.
    pub fn new(client: async_nats::Client, entity_type: &str, entities: usize) -> Self {
        Self::for_ids(
            client,
            entity_type,
            (0..entities).map(entity_id).collect::<Vec<_>>(),
        )
    }

    /// A publisher for the given entity ids of an entity type with one command stream.
    pub fn for_ids(client: async_nats::Client, entity_type: &str, ids: Vec<String>) -> Self {
        Self::for_names(client, &jetshard::wire::Names::new(entity_type), &ids)
    }

    /// A publisher for the given entity ids, on the subjects of `names`' layout.
    pub fn for_names(
        client: async_nats::Client,
        names: &jetshard::wire::Names,
        ids: &[String],
    ) -> Self {
        let subjects = ids
            .iter()
            .map(|id| {
                let id = jetshard::EntityId::new(id).expect("a bench entity id is valid");
                Subject::from(names.command_subject(&id))
            })
            .collect();
        Self {
            js: jetstream::new(client),
            subjects,
            codec: Codec::default(),
        }
    }

    /// How many entities it addresses.
    pub fn entities(&self) -> usize {
        self.subjects.len()
    }

    /// Publishes `count` commands round-robin over the entities and waits until the stream has
    /// stored every one. All carry the same `command`.
    pub async fn preload(&self, count: usize, command: &BenchCmd) -> anyhow::Result<()> {
        self.preload_range(0, count, command).await
    }

    /// Publishes one command to each of the entities `first..first + count` and waits until the
    /// stream has stored them.
    pub async fn preload_range(
        &self,
        first: usize,
        count: usize,
        command: &BenchCmd,
    ) -> anyhow::Result<()> {
        let payload = Bytes::from(self.codec.encode(command).context("encode a command")?);
        let mut window = AckWindow::default();
        for i in first..first + count {
            let subject = self.subjects[i % self.subjects.len()].clone();
            window
                .push(self.send(subject, payload.clone()).await?)
                .await?;
        }
        window.drain().await
    }

    /// Publishes one command to the `index`th entity and returns its acknowledgement future.
    pub async fn send_to(
        &self,
        index: usize,
        command: &BenchCmd,
    ) -> anyhow::Result<PublishAckFuture> {
        let payload = Bytes::from(self.codec.encode(command).context("encode a command")?);
        let subject = self.subjects[index % self.subjects.len()].clone();
        self.send(subject, payload).await
    }

    async fn send(&self, subject: Subject, payload: Bytes) -> anyhow::Result<PublishAckFuture> {
        self.js
            .send_publish(subject, PublishMessage::build().payload(payload))
            .await
            .context("publish a command")
    }
}

/// How long a publish that no stream took (its stream electing a leader, or moving one) is
/// published again before the run gives up, as `CommandSender` does.
const NO_STREAM_PATIENCE: Duration = Duration::from_secs(30);

/// A publish's acknowledgement, as a future that can be polled without waiting.
type Ack = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
            > + Send,
    >,
>;

/// Publish acknowledgements in flight, awaited in publish order once the window is full.
#[derive(Default)]
pub struct AckWindow {
    in_flight: VecDeque<InFlight>,
}

/// One publish in flight: its acknowledgement, and the message, if it is to be published
/// again when no stream took it (until `deadline`).
struct InFlight {
    ack: Ack,
    again: Option<(Context, Subject, Bytes)>,
    deadline: Instant,
}

impl AckWindow {
    /// Adds one; waits for the oldest while more than [`PUBLISH_WINDOW`] are in flight.
    pub async fn push(&mut self, ack: PublishAckFuture) -> anyhow::Result<()> {
        self.add(InFlight::new(ack, None)).await
    }

    /// Publishes `payload` to `subject` and adds it: if no stream takes it (a leader being
    /// elected or moved, as the library's spreading of the leaders does), it is published
    /// again (nothing was stored) for up to [`NO_STREAM_PATIENCE`].
    pub async fn publish(
        &mut self,
        js: &Context,
        subject: Subject,
        payload: Bytes,
    ) -> anyhow::Result<()> {
        let ack = js
            .publish(subject.clone(), payload.clone())
            .await
            .context("publish a command")?;
        let again = Some((js.clone(), subject, payload));
        self.add(InFlight::new(ack, again)).await
    }

    async fn add(&mut self, in_flight: InFlight) -> anyhow::Result<()> {
        self.in_flight.push_back(in_flight);
        // Those answered already, in publish order, at once: a publish no stream took goes
        // out again now, not once the window is full (4,096 publishes later: 14 s at 300
        // cmd/s, which a run would count as the command's latency).
        while let Some(front) = self.in_flight.front_mut() {
            let Some(answer) = futures::FutureExt::now_or_never(front.ack.as_mut()) else {
                break;
            };
            let Some(front) = self.in_flight.pop_front() else {
                break;
            };
            if let Some(again) = front.answered(answer, Duration::ZERO).await? {
                self.in_flight.push_front(again);
                break;
            }
        }
        while self.in_flight.len() > PUBLISH_WINDOW {
            if let Some(oldest) = self.in_flight.pop_front() {
                oldest.settle().await?;
            }
        }
        Ok(())
    }

    /// Waits for every acknowledgement.
    pub async fn drain(&mut self) -> anyhow::Result<()> {
        while let Some(oldest) = self.in_flight.pop_front() {
            oldest.settle().await?;
        }
        Ok(())
    }
}

impl InFlight {
    fn new(ack: PublishAckFuture, again: Option<(Context, Subject, Bytes)>) -> Self {
        Self {
            ack: std::future::IntoFuture::into_future(ack),
            again,
            deadline: Instant::now() + NO_STREAM_PATIENCE,
        }
    }

    /// Waits for the acknowledgement, publishing again (every 100 ms) while no stream takes it.
    async fn settle(mut self) -> anyhow::Result<()> {
        loop {
            let answer = self.ack.as_mut().await;
            match self.answered(answer, Duration::from_millis(100)).await? {
                None => return Ok(()),
                Some(again) => self = again,
            }
        }
    }

    /// What is left to wait for after `answer`: nothing once stored; the publish made again
    /// (after `pause`) if no stream took it and its patience lasts.
    async fn answered(
        self,
        answer: Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
        pause: Duration,
    ) -> anyhow::Result<Option<Self>> {
        let error = match answer {
            Ok(_) => return Ok(None),
            Err(e) => e,
        };
        let no_stream = error.kind() == jetstream::context::PublishErrorKind::StreamNotFound;
        let Some((js, subject, payload)) = self.again.filter(|_| no_stream) else {
            return Err(error).context("a publish was not acknowledged");
        };
        if Instant::now() >= self.deadline {
            return Err(error).context(format!(
                "a publish was not taken by any stream for {NO_STREAM_PATIENCE:?}"
            ));
        }
        tokio::time::sleep(pause).await;
        let ack = js
            .publish(subject.clone(), payload.clone())
            .await
            .context("publish a command again")?;
        Ok(Some(Self {
            ack: std::future::IntoFuture::into_future(ack),
            again: Some((js, subject, payload)),
            deadline: self.deadline,
        }))
    }
}

/// How long [`Gate::close`] waits for every consumer's leader to apply its pause.
const PAUSE_APPLIED_WITHIN: Duration = Duration::from_secs(10);

/// Holds an entity type's partitions back (consumer pause) and lets them go.
pub struct Gate {
    admin: Admin,
    js: Context,
    partitions: u32,
}

impl Gate {
    /// A gate over `partitions` partitions of `entity_type`.
    pub fn new(client: async_nats::Client, entity_type: &str, partitions: u32) -> Self {
        Self {
            admin: Admin::new(client.clone(), entity_type),
            js: jetstream::new(client),
            partitions,
        }
    }

    /// Pauses every partition's consumer, and waits until each consumer's leader has applied
    /// the pause: a clustered server answers a pause before it is applied (server source,
    /// `jsConsumerPauseRequest`), and commands pre-loaded meanwhile were delivered before the
    /// pass opened (R3: 3 of 24 acquisitions held 2-57 commands before it opened).
    pub async fn close(&self) -> anyhow::Result<()> {
        let pauses = (0..self.partitions).map(|p| self.admin.pause(p, PAUSE_FOR));
        for result in futures::future::join_all(pauses).await {
            result.context("pause a partition")?;
        }
        let names = self.admin.names().await.context("read the layout")?;
        let deadline = Instant::now() + PAUSE_APPLIED_WITHIN;
        for p in 0..self.partitions {
            let consumer = names.consumer(p);
            let stream = self
                .js
                .get_stream_no_info(names.command_stream(p))
                .await
                .context("open the command stream")?;
            loop {
                let info = stream
                    .consumer_info(&consumer)
                    .await
                    .with_context(|| format!("read consumer {consumer}"))?;
                if info.paused {
                    break;
                }
                if Instant::now() >= deadline {
                    bail!("consumer {consumer} not paused within {PAUSE_APPLIED_WITHIN:?}");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        Ok(())
    }

    /// Resumes every partition's consumer, all at once.
    pub async fn open(&self) -> anyhow::Result<()> {
        let resumes = (0..self.partitions).map(|p| self.admin.resume(p));
        for result in futures::future::join_all(resumes).await {
            result.context("resume a partition")?;
        }
        Ok(())
    }
}

/// How a wait for a drain ended.
#[derive(Debug, Clone, Copy)]
pub struct Drain {
    /// When the stream was first seen empty, or when the time box ended.
    pub at: Instant,
    /// Commands still in the stream then (0: drained).
    pub remaining: u64,
}

/// Waits until the work-queue command stream of `entity_type` holds no message (every command
/// acknowledged), for at most `time_box`.
pub async fn drain(
    client: &async_nats::Client,
    entity_type: &str,
    time_box: Duration,
) -> anyhow::Result<Drain> {
    drain_polling(client, entity_type, time_box, None).await
}

/// [`drain`] polling every `poll` throughout (`None`: every [`DRAIN_POLL`], every
/// [`DRAIN_POLL_NEAR_END`] near the end).
pub async fn drain_polling(
    client: &async_nats::Client,
    entity_type: &str,
    time_box: Duration,
    poll: Option<Duration>,
) -> anyhow::Result<Drain> {
    let js = jetstream::new(client.clone());
    let mut streams = Vec::new();
    for name in layout(client, entity_type).await?.command_streams() {
        let stream = js
            .get_stream_no_info(name)
            .await
            .with_context(|| format!("open stream {name}"))?;
        streams.push((name.clone(), stream));
    }
    let deadline = Instant::now() + time_box;
    let mut at_start = None;
    loop {
        let mut messages = 0;
        for (name, stream) in &streams {
            messages += loop {
                match stream.get_info().await {
                    Ok(info) => break info.state.messages,
                    // Under valgrind a request can time out while the server is fine: ask
                    // again until the time box is out (any other error fails at once).
                    Err(e)
                        if e.kind() == jetstream::context::RequestErrorKind::TimedOut
                            && Instant::now() < deadline =>
                    {
                        eprintln!("  read stream {name}: {e}; asking again");
                    }
                    Err(e) => return Err(e).with_context(|| format!("read stream {name}")),
                }
            };
        }
        let now = Instant::now();
        if messages == 0 || now >= deadline {
            return Ok(Drain {
                at: now,
                remaining: messages,
            });
        }
        let at_start = *at_start.get_or_insert(messages);
        let near_end = (messages as f64) < at_start as f64 * DRAIN_NEAR_END;
        tokio::time::sleep(if let Some(poll) = poll {
            poll
        } else if near_end {
            DRAIN_POLL_NEAR_END
        } else {
            DRAIN_POLL
        })
        .await;
    }
}

/// The names of `entity_type` as its streams record them (its layout: one command stream or
/// several), or one stream's where none exists yet.
pub async fn layout(
    client: &async_nats::Client,
    entity_type: &str,
) -> anyhow::Result<jetshard::wire::Names> {
    Admin::new(client.clone(), entity_type)
        .names()
        .await
        .with_context(|| format!("read the layout of {entity_type}"))
}

/// Like [`drain`], but a stream that does not drain in time is an error.
pub async fn wait_drained(
    client: &async_nats::Client,
    entity_type: &str,
    within: Duration,
) -> anyhow::Result<Instant> {
    let drained = drain(client, entity_type, within).await?;
    if drained.remaining > 0 {
        bail!(
            "the command stream of {entity_type} still holds {} commands after {within:?}",
            drained.remaining
        );
    }
    Ok(drained.at)
}

/// The `Stamp` command pre-loads carry: a realistic timestamp width, never read.
pub fn preload_command(bytes: usize) -> BenchCmd {
    BenchCmd::stamp_of_size(1_700_000_000_000_000_000, bytes)
}

/// Writes events straight into the journal of `entity_type`, as a previous owner would have
/// (generation 1, command sequence 0, so that every later command is new to the entity), with
/// many acknowledgements in flight. `events` yields `(partition, entity id, payload)`.
pub async fn write_events(
    client: async_nats::Client,
    entity_type: &str,
    events: impl IntoIterator<Item = (u32, String, Bytes)>,
) -> anyhow::Result<usize> {
    write_records(client, entity_type, events, false).await
}

/// [`write_events`]; with `first`, each event its entity's first record: as jetshard writes an
/// entity's first record, it says that none is before it (`Jetshard-Previous: 0`), so that a
/// load takes it from the batched read alone.
async fn write_records(
    client: async_nats::Client,
    entity_type: &str,
    events: impl IntoIterator<Item = (u32, String, Bytes)>,
    first: bool,
) -> anyhow::Result<usize> {
    let js = jetstream::new(client);
    let mut window = AckWindow::default();
    let mut written = 0;
    for (partition, id, payload) in events {
        let mut publish = PublishMessage::build()
            .payload(payload)
            .header(jetshard::wire::HDR_GENERATION, "1")
            .header(jetshard::wire::HDR_COMMAND_SEQ, "0");
        if first {
            publish = publish.header(jetshard::wire::HDR_PREVIOUS, "0");
        }
        let ack = js
            .send_publish(format!("{entity_type}.evt.{partition}.{id}"), publish)
            .await
            .context("publish an event")?;
        window.push(ack).await?;
        written += 1;
    }
    window.drain().await?;
    Ok(written)
}

/// `count` entity ids with the given prefix that live in `partition` of `partitions`.
pub fn ids_in_partition(
    prefix: &str,
    partition: u32,
    partitions: u32,
    count: usize,
) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .filter(|id| jetshard::test_support::fnv1a_32(id.as_bytes()) % partitions == partition)
        .take(count)
        .collect()
}

/// Gives every bench entity `e0..e<entities>` one event in the journal, so that an acquiring
/// owner rebuilds its state and its first command needs no journal read of its own.
///
/// With it, each entity's first command loads one record: its share of a batched read of its
/// last records, which shows its event as its only one (`Jetshard-Previous: 0`, as jetshard
/// writes an entity's first record); unbatched, one read (docs/PERFORMANCE.md, "Loading an entity").
pub async fn seed_entities(
    client: async_nats::Client,
    entity_type: &str,
    partitions: u32,
    entities: usize,
) -> anyhow::Result<usize> {
    let payload = Bytes::from(
        Codec::default()
            .encode(&crate::entity::BenchEvt::Stamped { at_ns: 0 })
            .context("encode an event")?,
    );
    let events = (0..entities).map(|i| {
        let id = entity_id(i);
        let partition = jetshard::test_support::fnv1a_32(id.as_bytes()) % partitions;
        (partition, id, payload.clone())
    });
    write_records(client, entity_type, events, true).await
}

/// Seeds `entities` entities of `entity_type` with an event each, sends each one command of
/// `command_bytes` and waits (2 min at most) until all are acknowledged: every entity has
/// history and, where a consumer runs, is resident. Returns the publisher of their commands.
pub async fn warm_entities(
    control: &async_nats::Client,
    entity_type: &str,
    partitions: u32,
    entities: usize,
    command_bytes: usize,
) -> anyhow::Result<CommandPublisher> {
    seed_entities(control.clone(), entity_type, partitions, entities).await?;
    let names = layout(control, entity_type).await?;
    let ids: Vec<String> = (0..entities).map(entity_id).collect();
    let publisher = CommandPublisher::for_names(control.clone(), &names, &ids);
    publisher
        .preload(entities, &preload_command(command_bytes))
        .await?;
    wait_drained(control, entity_type, Duration::from_secs(120)).await?;
    Ok(publisher)
}
