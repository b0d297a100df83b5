//! The group commit of one partition under one generation: every journal write of the
//! partition goes through one task, which gathers the writes that are ready (the events of
//! many commands, of many entities, and dead letters) into one atomic batch, keeps one batch in
//! flight, and gathers the next while the server commits the previous.
//!
//! Why: the fence is a compare-and-set against the partition's fence subject, named by every
//! write. A clustered (replicated) stream refuses a write naming a subject that already has such
//! a write in flight (error 10164), so fenced writes of one partition cannot be pipelined there;
//! one after the other they reach ~1.5k writes/s. An atomic batch carries the fence on every
//! message and commits as one: hundreds of writes in one round trip, and none in flight beside
//! it. On a single server it also saves the server an acknowledgement per write.
//!
//! Architecture Invariant: a [`Unit`] (one command's records) is stored all or none, and its
//! submitter hears back only once the server has answered for it. Per-entity order follows: an
//! entity actor submits its next command's records only after the answer for the last.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::context::{Context, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use crate::journal::{WriteError, server_error_code, unique_token};
use crate::retry::backoff;
use crate::telemetry::CommitMetrics;
use crate::wire::{HDR_BATCH_COMMIT, HDR_BATCH_ID, HDR_BATCH_SEQUENCE};

/// The server's limit on messages in one atomic batch (`jetstream.limits.batch.max_msgs`).
pub(crate) const MAX_BATCH_MESSAGES: usize = 1000;

/// At most this many bytes go into one batch (a unit larger than this goes alone): a batch is
/// one entry of the stream's replication log, and a smaller one keeps a commit's latency low.
const MAX_BATCH_BYTES: usize = 4 << 20;

/// Room left in a message for the batch headers added to it.
const BATCH_HEADERS_LEN: usize = 128;

/// How often a batch refused for a reason that means "not stored, try again" is retried before
/// its writes are reported unconfirmed.
const MAX_ATTEMPTS: u64 = 8;

/// The server's error codes a batch is retried on: nothing of it was stored.
const WRONG_LAST_SEQUENCE_IN_FLIGHT: u64 = 10164;
const BATCH_INCOMPLETE: u64 = 10176;
const TOO_MANY_BATCHES_IN_FLIGHT: u64 = 10210;
/// One message id of the batch was stored before: the whole batch is refused.
const BATCH_DUPLICATE: u64 = 10201;

/// One journal record to write.
pub(crate) struct Outgoing {
    pub(crate) subject: String,
    pub(crate) headers: HeaderMap,
    pub(crate) payload: Bytes,
}

impl Outgoing {
    /// Its size on the wire, as the client weighs it against the server's `max_payload`, with
    /// room for the batch headers.
    pub(crate) fn wire_len(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(name, values)| {
                values
                    .iter()
                    .map(|v| AsRef::<str>::as_ref(name).len() + v.as_str().len() + 4)
                    .sum::<usize>()
            })
            .sum();
        headers + 12 + BATCH_HEADERS_LEN + self.payload.len()
    }
}

/// The records of one command (its events, or its dead letter): stored all or none.
struct Unit {
    records: Vec<Outgoing>,
    bytes: usize,
    /// The journal sequence of the unit's last record (0 if the server answered that it had
    /// them already).
    answer: oneshot::Sender<Result<u64, WriteError>>,
}

/// What the partition's writes came to, read by its owner for its status.
#[derive(Debug, Default)]
pub(crate) struct CommitStats {
    /// Batches committed.
    pub(crate) batches: AtomicU64,
    /// Records in them.
    pub(crate) records: AtomicU64,
    /// Batches refused with 10164 (a fenced write already in flight on the fence subject): never
    /// in steady state; retried.
    pub(crate) conflicts: AtomicU64,
}

/// The handle to a partition's group commit; the task ends when every handle is dropped.
#[derive(Clone)]
pub(crate) struct GroupCommit {
    units: mpsc::UnboundedSender<Unit>,
    client: async_nats::Client,
}

impl GroupCommit {
    /// Starts the group commit of `partition` under `generation`.
    pub(crate) fn start(
        js: Context,
        partition: u32,
        generation: u64,
        stats: Arc<CommitStats>,
        metrics: CommitMetrics,
    ) -> Self {
        // Unbounded, yet bounded: every entity actor has at most one unit waiting, and the
        // entities with work are bounded by the commands in hand.
        let (units, receiver) = mpsc::unbounded_channel();
        let client = js.client();
        let committer = Committer {
            js,
            generation,
            stats,
            metrics,
        };
        let span = tracing::debug_span!("group_commit", partition, generation);
        tokio::spawn(committer.run(receiver).instrument(span));
        Self { units, client }
    }

    /// Makes `records` durable, all or none; the journal sequence of the last (0 if the server
    /// had them already).
    ///
    /// A record over the server's `max_payload` is refused here: in a batch it would spoil the
    /// other commands' writes.
    pub(crate) async fn write(&self, records: Vec<Outgoing>) -> Result<u64, WriteError> {
        let max_payload = self.client.max_payload();
        let mut bytes = 0;
        for record in &records {
            let len = record.wire_len();
            if len > max_payload {
                return Err(WriteError::Refused(format!(
                    "a record of {len} bytes is over the server's max_payload of {max_payload}"
                )));
            }
            bytes += len;
        }
        let (answer, answered) = oneshot::channel();
        let unit = Unit {
            records,
            bytes,
            answer,
        };
        if self.units.send(unit).is_err() {
            return Err(WriteError::Unconfirmed(
                "the partition's writer stopped".into(),
            ));
        }
        answered.await.unwrap_or_else(|_| {
            Err(WriteError::Unconfirmed(
                "the partition's writer stopped".into(),
            ))
        })
    }
}

/// Why a batch was not stored.
enum Refusal {
    /// The fence moved: every write of this generation is refused from now on.
    Fenced,
    /// A message id of the batch was stored before.
    Duplicate,
    /// Not confirmed (timeout, connection, leader change); may be stored.
    Unconfirmed(String),
    /// Can never be stored as it is.
    Refused(String),
}

struct Committer {
    js: Context,
    generation: u64,
    stats: Arc<CommitStats>,
    metrics: CommitMetrics,
}

impl Committer {
    async fn run(self, mut receiver: mpsc::UnboundedReceiver<Unit>) {
        let mut next = None;
        loop {
            let first = match next.take() {
                Some(unit) => unit,
                None => match receiver.recv().await {
                    Some(unit) => unit,
                    None => return,
                },
            };
            // Everything that queued up while the last batch committed, within the limits.
            let mut records = first.records.len();
            let mut bytes = first.bytes;
            let mut batch = vec![first];
            while let Ok(unit) = receiver.try_recv() {
                if records + unit.records.len() > MAX_BATCH_MESSAGES
                    || bytes + unit.bytes > MAX_BATCH_BYTES
                {
                    next = Some(unit);
                    break;
                }
                records += unit.records.len();
                bytes += unit.bytes;
                batch.push(unit);
            }
            self.commit(batch).await;
        }
    }

    /// Commits `batch` and answers each of its units.
    async fn commit(&self, batch: Vec<Unit>) {
        let records: Vec<&Outgoing> = batch.iter().flat_map(|u| &u.records).collect();
        let outcome = self.store(&records).await;
        drop(records);
        match outcome {
            Ok(last) => {
                self.stats.batches.fetch_add(1, Ordering::Relaxed);
                let total: usize = batch.iter().map(|u| u.records.len()).sum();
                self.stats
                    .records
                    .fetch_add(total as u64, Ordering::Relaxed);
                self.metrics.records.record(total as f64);
                // A batch is stored in one piece, in order: the unit's last record is as far
                // from the batch's last as the records after it.
                let mut after = total;
                for unit in batch {
                    after -= unit.records.len();
                    let seq = if last == 0 {
                        0
                    } else {
                        last.saturating_sub(after as u64)
                    };
                    let _ = unit.answer.send(Ok(seq));
                }
            }
            Err(Refusal::Duplicate) if batch.len() > 1 => {
                // Some command of the batch was stored before (a retry after a lost answer):
                // each on its own, so that one known command does not hold up the others.
                tracing::debug!(
                    units = batch.len(),
                    "batch holds a known message id; one by one"
                );
                for unit in batch {
                    Box::pin(self.commit(vec![unit])).await;
                }
            }
            // One command, all or none: its message ids are known, so it was stored.
            Err(Refusal::Duplicate) => {
                for unit in batch {
                    let _ = unit.answer.send(Ok(0));
                }
            }
            Err(refusal) => {
                for unit in batch {
                    let error = match &refusal {
                        Refusal::Fenced => WriteError::Fenced {
                            generation: self.generation,
                        },
                        Refusal::Unconfirmed(e) => WriteError::Unconfirmed(e.clone().into()),
                        Refusal::Refused(e) => WriteError::Refused(e.clone()),
                        Refusal::Duplicate => unreachable!("answered above"),
                    };
                    let _ = unit.answer.send(Err(error));
                }
            }
        }
    }

    /// Stores `records` in one piece; the journal sequence of the last. Retries what was
    /// refused without being stored (a write in flight on the fence subject, too many batches
    /// in flight).
    async fn store(&self, records: &[&Outgoing]) -> Result<u64, Refusal> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let refusal = match self.publish(records).await {
                Ok(seq) => return Ok(seq),
                Err(refusal) => refusal,
            };
            let retry = match refusal {
                Attempt::Retry(code, e) => {
                    if code == WRONG_LAST_SEQUENCE_IN_FLIGHT {
                        self.stats.conflicts.fetch_add(1, Ordering::Relaxed);
                        self.metrics.conflicts.increment(1);
                    }
                    tracing::debug!(code, attempt, error = %e, "batch not stored; retrying");
                    e
                }
                Attempt::Final(refusal) => return Err(refusal),
            };
            if attempt >= MAX_ATTEMPTS {
                return Err(Refusal::Unconfirmed(retry));
            }
            let wait = backoff(
                Duration::from_millis(2),
                attempt,
                Duration::from_millis(200),
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// One attempt: a plain publish for one record, an atomic batch for more.
    async fn publish(&self, records: &[&Outgoing]) -> Result<u64, Attempt> {
        let last = records.len() - 1;
        let batch_id = (last > 0).then(unique_token);
        for (index, record) in records.iter().enumerate() {
            let mut headers = record.headers.clone();
            if let Some(batch_id) = &batch_id {
                headers.insert(HDR_BATCH_ID, batch_id.as_str());
                headers.insert(HDR_BATCH_SEQUENCE, (index + 1).to_string());
                if index < last {
                    // Staged by the server; only the commit is answered.
                    self.js
                        .client()
                        .publish_with_headers(
                            record.subject.clone(),
                            headers,
                            record.payload.clone(),
                        )
                        .await
                        .map_err(|e| match e.kind() {
                            async_nats::client::PublishErrorKind::MaxPayloadExceeded => {
                                Attempt::Final(Refusal::Refused(e.to_string()))
                            }
                            _ => Attempt::Final(Refusal::Unconfirmed(e.to_string())),
                        })?;
                    continue;
                }
                headers.insert(HDR_BATCH_COMMIT, "1");
            }
            let message = PublishMessage::build()
                .payload(record.payload.clone())
                .headers(headers);
            let ack = self
                .js
                .send_publish(record.subject.clone(), message)
                .await
                .map_err(|e| match e.kind() {
                    PublishErrorKind::MaxPayloadExceeded => {
                        Attempt::Final(Refusal::Refused(e.to_string()))
                    }
                    _ => Attempt::Final(Refusal::Unconfirmed(e.to_string())),
                })?;
            return match ack.await {
                Ok(ack) => Ok(ack.sequence),
                Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {
                    Err(Attempt::Final(Refusal::Fenced))
                }
                Err(e) => match server_error_code(&e) {
                    Some(BATCH_DUPLICATE) => Err(Attempt::Final(Refusal::Duplicate)),
                    Some(
                        code @ (WRONG_LAST_SEQUENCE_IN_FLIGHT
                        | BATCH_INCOMPLETE
                        | TOO_MANY_BATCHES_IN_FLIGHT),
                    ) => Err(Attempt::Retry(code, e.to_string())),
                    _ => Err(Attempt::Final(Refusal::Unconfirmed(e.to_string()))),
                },
            };
        }
        unreachable!("a batch holds at least one record")
    }
}

/// What one attempt came to.
enum Attempt {
    /// Not stored, for a reason that may pass: the server's code and what it said.
    Retry(u64, String),
    Final(Refusal),
}
