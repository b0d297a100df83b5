//! The group commit of one partition under one generation: every journal write of the
//! partition goes through its [`GroupCommit`], in one of two [`Mode`]s chosen by the stream's
//! replicas.
//!
//! - [`Mode::Batched`] (replicated streams): the task gathers the writes that are ready (the
//!   events of many commands, of many entities, and dead letters) into one atomic batch, keeps
//!   one batch in flight, and gathers the next while the server commits the previous. The fence
//!   is a compare-and-set against the partition's fence subject, named by every write, and a
//!   clustered stream refuses a write naming a subject that already has such a write in flight
//!   (error 10164): fenced writes of one partition cannot be pipelined there, and one after the
//!   other they reach ~1.5k writes/s. An atomic batch commits as one: hundreds of writes in one
//!   round trip, none in flight beside it. Two batches in flight side by side collide the same
//!   way (measured: a second one refused with 10164 in about half of the tries), so one it is.
//!   The fence is named by the batch's last message only (the commit): the server checks it
//!   when the batch commits and stores the batch all or none, so every write of the batch is
//!   fenced by it, and the staged messages are stored without the two fence headers
//!   (`committer.rs`, `unfenced`).
//! - [`Mode::Pipelined`] (a single server, R1): a command's single record goes on its own, all
//!   in flight side by side, published by the submitter's own task (no hop to the writer task). A single server never refuses them for being in flight together,
//!   and stores pipelined single writes with less CPU than the same records in batches
//!   (measured: docs/PERFORMANCE.md, "Write path"). A command of several records (an event with
//!   a timer or outbox record) must be an atomic batch, and a file-backed single server commits
//!   each atomic batch on its own, about 14 ms apart on a 2-core CI machine (measured: 64
//!   two-record batches side by side took 1.1 s each): those units are gathered, as
//!   `Batched` does, into one batch in flight, beside the single records.
//!
//! Architecture Invariant: a [`Unit`] (one command's records) is stored all or none, and its
//! submitter hears back only once the server has answered for it. Per-entity order follows: an

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::context::Context;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use crate::journal::server::WriteError;
use crate::telemetry::CommitMetrics;

pub(crate) use acks::Elections;
pub(crate) use committer::{CommitStats, Outgoing};
use committer::{Committer, Unit};

mod acks;
mod committer;
mod single;

/// How a partition's writes go to the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Every ready write in one atomic batch, one batch in flight.
    Batched,
    /// Each single record on its own, side by side; units of several records gathered into
    /// one atomic batch in flight beside them.
    Pipelined,
}

impl Mode {
    /// The mode for a journal of `replicas` replicas.
    pub(crate) fn for_replicas(replicas: usize) -> Self {
        if replicas > 1 {
            Mode::Batched
        } else {
            Mode::Pipelined
        }
    }
}

/// How a partition's group commits are run: the same for every generation of the partition.
#[derive(Clone)]
pub(crate) struct Settings {
    /// How its writes go to the server ([`Mode::for_replicas`]).
    pub(crate) mode: Mode,
    /// What its writes came to, kept across generations (the owner's status).
    pub(crate) stats: Arc<CommitStats>,
    pub(crate) metrics: CommitMetrics,
    /// A single record's write is reported unconfirmed when the server has not answered it
    /// within this.
    pub(crate) write_timeout: Duration,
    /// The elections of a new leader of the partition's journal stream seen by this process
    /// (`None` on one server): the writes in flight then are reported unconfirmed at once, not
    /// after the write timeout, since a leader that hands over may answer none of them; and a
    /// write sent just after one, unanswered for [`acks::UNSETTLED`], too.
    pub(crate) leader_elections: Option<Elections>,
}

/// The handle to a partition's group commit; the task ends when every handle is dropped.
#[derive(Clone)]
pub(crate) struct GroupCommit {
    units: mpsc::UnboundedSender<Unit>,
    client: async_nats::Client,
    /// [`Mode::Pipelined`]: a unit of one record is published by its submitter's own task,
    /// through the committer shared with the writer task, with no hop to that task and back
    /// (the hop cost a channel send, a task wake-up, a boxed future and a oneshot
    /// per command).
    direct: Option<Arc<Committer>>,
    /// The highest journal sequence a write of this generation was acknowledged at, or
    /// [`UNKNOWN`] once a write may be stored at a sequence it was not told.
    acked: Arc<AtomicU64>,
    /// Set once a write of this generation was given up before its answer ([`Self::in_doubt`]).
    doubt: Arc<AtomicBool>,
}

/// Sets the doubt it holds when dropped: a write whose answer never came
/// ([`GroupCommit::write`]).
struct Unanswered<'a>(Option<&'a AtomicBool>);

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some(doubt) = self.0 {
            doubt.store(true, Ordering::Release);
        }
    }
}

/// [`GroupCommit::acked`] is not known: a write was answered "stored before" (a duplicate: at
/// an unknown sequence) or not confirmed (it may be stored).
const UNKNOWN: u64 = u64::MAX;

impl GroupCommit {
    /// Starts the group commit of `partition` under `generation`.
    pub(crate) fn start(js: Context, partition: u32, generation: u64, settings: Settings) -> Self {
        let Settings {
            mode,
            stats,
            metrics,
            write_timeout,
            leader_elections,
        } = settings;
        // Unbounded, yet bounded: every entity actor has at most one unit waiting, and the
        // entities with work are bounded by the commands in hand.
        let (units, receiver) = mpsc::unbounded_channel();
        let client = js.client();
        let committer = Committer {
            js,
            generation,
            stats,
            metrics,
            acks: tokio::sync::OnceCell::new(),
            write_timeout,
            leader_elections,
        };
        let span = tracing::debug_span!("group_commit", partition, generation, ?mode);
        let committer = Arc::new(committer);
        let direct = match mode {
            Mode::Batched => {
                tokio::spawn(Arc::clone(&committer).run(receiver).instrument(span));
                None
            }
            Mode::Pipelined => {
                tokio::spawn(
                    Arc::clone(&committer)
                        .run_pipelined(receiver)
                        .instrument(span),
                );
                Some(committer)
            }
        };
        Self {
            units,
            client,
            direct,
            acked: Arc::default(),
            doubt: Arc::default(),
        }
    }

    /// The highest journal sequence a write of this generation was acknowledged at (0 before
    /// the first); `None` if a write may be stored beyond it (answered as a duplicate, or not
    /// confirmed): every record this writer stored is at or below it.
    pub(crate) fn acked(&self) -> Option<u64> {
        let acked = self.acked.load(Ordering::Acquire);
        (acked != UNKNOWN).then_some(acked)
    }

    /// Whether a write of this generation was given up before its answer (its submitter's
    /// future dropped): its records may still be stored, at any later time, after reads and
    /// writes made since, and whose they are is not known here (a write answered "not
    /// confirmed" is its submitter's to note: `JournalWriter::certain`). Never cleared: only
    /// the next generation's claim fences them out.
    pub(crate) fn in_doubt(&self) -> bool {
        self.doubt.load(Ordering::Acquire)
    }

    /// Makes `records` durable, all or none, as [`Self::write_unit`] does, and keeps
    /// [`Self::acked`] and [`Self::in_doubt`].
    pub(crate) async fn write(&self, records: Vec<Outgoing>) -> Result<u64, WriteError> {
        // A write given up before its answer (its submitter's future dropped) may be stored
        // as well: in doubt, unless answered.
        let mut unanswered = Unanswered(Some(&self.doubt));
        let written = self.write_unit(records).await;
        unanswered.0 = None;
        match &written {
            Ok(0) | Err(WriteError::Unconfirmed(_)) => self.acked.store(UNKNOWN, Ordering::Release),
            Ok(seq) => {
                // `UNKNOWN` is the largest value: a later write never clears it.
                self.acked.fetch_max(*seq, Ordering::AcqRel);
            }
            // Not stored.
            Err(_) => {}
        }
        written
    }

    /// Makes `records` durable, all or none; the journal sequence of the last (0 if the server
    /// had them already).
    ///
    /// A record over the server's `max_payload` is refused here: in a batch it would spoil the
    /// other commands' writes.
    pub(super) async fn write_unit(&self, records: Vec<Outgoing>) -> Result<u64, WriteError> {
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
        if let (Some(committer), [_]) = (&self.direct, records.as_slice()) {
            // Boxed apart: async-nats' JetStream publish future alone was 848 bytes (release;
            // the publish is now `Acks`', smaller). Within the command's future, which the
            // entity actor boxes, it made that allocation 1.4 KB:
            // over the largest request glibc serves from its small bins (1,000 bytes), so each
            // one first merged the free fast-bin chunks (`malloc_consolidate`, 13% of the
            // client's CPU). Two allocations under the limit cost less
            // (docs/PERFORMANCE.md).
            return Box::pin(committer.write_single(records)).await;
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

#[cfg(test)]
mod tests;
