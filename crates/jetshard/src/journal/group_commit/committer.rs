//! The partition's [`Committer`], what every write of the partition goes through: the records
//! and units it takes, its stats, and its batch path (all writes in [`Mode::Batched`], the units
//! of several records in [`Mode::Pipelined`]). Its single-record path is in `single.rs`.
//!
//! [`Mode::Batched`]: super::Mode::Batched
//! [`Mode::Pipelined`]: super::Mode::Pipelined

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::context::{Context, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};

use crate::journal::server::{MAX_BATCH_MESSAGES, WriteError, server_error_code};
use crate::retry::backoff;
use crate::telemetry::CommitMetrics;
use crate::wire::unique_token;
use crate::wire::{
    HDR_BATCH_COMMIT, HDR_BATCH_ID, HDR_BATCH_SEQUENCE, HDR_EXPECTED_SUBJECT,
    HDR_EXPECTED_SUBJECT_SEQ,
};

use super::acks::Acks;

/// At most this many bytes go into one batch (a unit larger than this goes alone): a batch is
/// one entry of the stream's replication log, and a smaller one keeps a commit's latency low.
const MAX_BATCH_BYTES: usize = 4 << 20;

/// Room left in a message for the batch headers added to it.
const BATCH_HEADERS_LEN: usize = 128;

/// How often a batch refused for a reason that means "not stored, try again" is retried before
/// its writes are reported unconfirmed.
const MAX_ATTEMPTS: u64 = 8;

/// The fence moved: a newer generation's fence record is the partition's latest.
pub(super) const WRONG_LAST_SEQUENCE: u64 = 10071;
/// The server's error codes a batch is retried on: nothing of it was stored.
pub(super) const WRONG_LAST_SEQUENCE_IN_FLIGHT: u64 = 10164;
const BATCH_INCOMPLETE: u64 = 10176;
const TOO_MANY_BATCHES_IN_FLIGHT: u64 = 10210;
/// One message id of the batch was stored before: the whole batch is refused.
const BATCH_DUPLICATE: u64 = 10201;

/// One journal record to write.
pub(crate) struct Outgoing {
    pub(crate) subject: async_nats::Subject,
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
pub(super) struct Unit {
    pub(super) records: Vec<Outgoing>,
    pub(super) bytes: usize,
    /// The journal sequence of the unit's last record (0 if the server answered that it had
    /// them already).
    pub(super) answer: oneshot::Sender<Result<u64, WriteError>>,
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

/// What a partition's writes go through: its writer task's, and on a single server each
/// submitter's own single-record publish.
pub(super) struct Committer {
    pub(super) js: Context,
    pub(super) generation: u64,
    pub(super) stats: Arc<CommitStats>,
    pub(super) metrics: CommitMetrics,
    /// The answers to single-record publishes ([`Self::publish_one`]), subscribed on the
    /// first.
    pub(super) acks: tokio::sync::OnceCell<Acks>,
    /// How long a single-record publish waits for its answer.
    pub(super) write_timeout: Duration,
    /// The journal stream's leader elections ([`super::Settings::leader_elections`]).
    pub(super) leader_elections: Option<super::acks::Elections>,
}

/// Why a batch was not stored.
pub(super) enum Refusal {
    /// The fence moved: every write of this generation is refused from now on.
    Fenced,
    /// A message id of the batch was stored before.
    Duplicate,
    /// Not confirmed (timeout, connection, leader change); may be stored.
    Unconfirmed(String),
    /// Can never be stored as it is.
    Refused(String),
}

/// Takes from `waiting` the units of the next batch, oldest first, within the batch limits.
fn next_batch(waiting: &mut std::collections::VecDeque<Unit>) -> Vec<Unit> {
    let (mut records, mut bytes) = (0, 0);
    let mut batch = Vec::new();
    while let Some(unit) = waiting.front() {
        let full = records + unit.records.len() > MAX_BATCH_MESSAGES
            || bytes + unit.bytes > MAX_BATCH_BYTES;
        if full && !batch.is_empty() {
            break;
        }
        records += unit.records.len();
        bytes += unit.bytes;
        batch.extend(waiting.pop_front());
    }
    batch
}

impl Committer {
    /// [`Mode::Pipelined`]: single records in flight side by side, as they come; the units of
    /// several records gathered into one atomic batch in flight at a time.
    pub(super) async fn run_pipelined(
        self: Arc<Self>,
        mut receiver: mpsc::UnboundedReceiver<Unit>,
    ) {
        // Single records in flight (each a small future: one publish and its answer), and the
        // one batch of several-record units.
        let mut singles = FuturesUnordered::new();
        let mut batch = FuturesUnordered::new();
        let mut waiting = std::collections::VecDeque::new();
        let mut open = true;
        while open || !singles.is_empty() || !batch.is_empty() || !waiting.is_empty() {
            if batch.is_empty() && !waiting.is_empty() {
                batch.push(self.commit(next_batch(&mut waiting)));
                continue;
            }
            tokio::select! {
                unit = receiver.recv(), if open => match unit {
                    Some(unit) if unit.records.len() > 1 => waiting.push_back(unit),
                    Some(unit) => singles.push(self.commit_single(unit)),
                    None => open = false,
                },
                Some(()) = singles.next(), if !singles.is_empty() => {}
                Some(()) = batch.next(), if !batch.is_empty() => {}
            }
        }
    }

    /// [`Mode::Batched`]: everything ready in one atomic batch, one batch in flight.
    pub(super) async fn run(self: Arc<Self>, mut receiver: mpsc::UnboundedReceiver<Unit>) {
        let mut in_flight = FuturesUnordered::new();
        let mut next = None;
        loop {
            if !in_flight.is_empty() {
                in_flight.next().await;
                continue;
            }
            let first = match next.take() {
                Some(unit) => unit,
                None => tokio::select! {
                    unit = receiver.recv() => match unit {
                        Some(unit) => unit,
                        None => break,
                    },
                    Some(()) = in_flight.next(), if !in_flight.is_empty() => continue,
                },
            };
            // Everything that queued up while the last batch committed, within the limits.
            let mut records = first.records.len();
            let mut bytes = first.bytes;
            let mut batch = vec![first];
            while records < MAX_BATCH_MESSAGES {
                let Ok(unit) = receiver.try_recv() else { break };
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
            in_flight.push(self.commit(batch));
        }
        while in_flight.next().await.is_some() {}
    }

    /// Commits `batch` and answers each of its units.
    async fn commit(&self, mut batch: Vec<Unit>) {
        // How many records each unit holds (a record may be moved out below).
        let sizes: Vec<usize> = batch.iter().map(|u| u.records.len()).collect();
        let started = std::time::Instant::now();
        let outcome = if let [unit] = batch.as_mut_slice()
            && let [_] = unit.records.as_slice()
        {
            // One record: a plain publish, its headers moved rather than copied.
            let record = unit.records.pop().expect("one record");
            self.publish_one(record).await.map(|seq| (seq, 1))
        } else {
            let records: Vec<&Outgoing> = batch.iter().flat_map(|u| &u.records).collect();
            let total = records.len();
            self.store(&records).await.map(|seq| (seq, total))
        };
        match outcome {
            Ok((last, total)) => {
                tracing::debug!(
                    records = total,
                    us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
                    "committed"
                );
                self.committed(total);
                // A batch is stored in one piece, in order: the unit's last record is as far
                // from the batch's last as the records after it.
                let mut after = total;
                for (unit, size) in batch.into_iter().zip(sizes) {
                    after -= size;
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
                    let _ = unit.answer.send(Err(self.error_of(&refusal)));
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
                        self.conflict();
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

    /// One attempt: an atomic batch (of one command's records, or of several commands'). Every
    /// message but the last is staged by the server unanswered; the last commits the batch.
    async fn publish(&self, records: &[&Outgoing]) -> Result<u64, Attempt> {
        let Some((last, staged)) = records.split_last() else {
            return Ok(0);
        };
        let batch_id = unique_token();
        let unconfirmed = |e: String| Attempt::Final(Refusal::Unconfirmed(e));
        let refused = |e: String| Attempt::Final(Refusal::Refused(e));
        for (index, record) in staged.iter().enumerate() {
            let mut headers = unfenced(&record.headers);
            headers.insert(HDR_BATCH_ID, batch_id.as_str());
            headers.insert(HDR_BATCH_SEQUENCE, (index + 1).to_string());
            self.js
                .client()
                .publish_with_headers(record.subject.clone(), headers, record.payload.clone())
                .await
                .map_err(|e| match e.kind() {
                    async_nats::client::PublishErrorKind::MaxPayloadExceeded => {
                        refused(e.to_string())
                    }
                    _ => unconfirmed(e.to_string()),
                })?;
        }
        let mut headers = last.headers.clone();
        headers.insert(HDR_BATCH_ID, batch_id.as_str());
        headers.insert(HDR_BATCH_SEQUENCE, records.len().to_string());
        headers.insert(HDR_BATCH_COMMIT, "1");
        let message = PublishMessage::build()
            .payload(last.payload.clone())
            .headers(headers);
        // Elections from here on: a leader that hands over with the commit in flight may never
        // answer it, and the partition's next commits wait behind it.
        let mut elections = self.leader_elections.clone();
        if let Some(elections) = &mut elections {
            elections.borrow_and_update();
        }
        let unsettled = super::acks::unsettled(elections.as_ref());
        let ack = self
            .js
            .send_publish(last.subject.clone(), message)
            .await
            .map_err(|e| match e.kind() {
                PublishErrorKind::MaxPayloadExceeded => refused(e.to_string()),
                _ => unconfirmed(e.to_string()),
            })?;
        let answer = tokio::select! {
            answer = ack => answer,
            () = super::acks::elected(&mut elections) => {
                return Err(unconfirmed("the journal stream elected a new leader".to_owned()));
            }
            () = super::acks::until(unsettled) => {
                return Err(unconfirmed(super::acks::UNSETTLED_ERROR.to_owned()));
            }
        };
        match answer {
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
                _ => Err(unconfirmed(e.to_string())),
            },
        }
    }
}

/// A staged message's headers: the record's own without the fence's compare-and-set, which the
/// batch's last message carries for the whole batch (the server checks it when the batch
/// commits, and the batch is stored all or none).
fn unfenced(headers: &HeaderMap) -> HeaderMap {
    let mut staged = HeaderMap::new();
    for (name, values) in headers.iter() {
        let n: &str = name.as_ref();
        if n == HDR_EXPECTED_SUBJECT_SEQ || n == HDR_EXPECTED_SUBJECT {
            continue;
        }
        for value in values {
            staged.append(name.clone(), value.clone());
        }
    }
    staged
}

/// What one attempt came to.
enum Attempt {
    /// Not stored, for a reason that may pass: the server's code and what it said.
    Retry(u64, String),
    Final(Refusal),
}
