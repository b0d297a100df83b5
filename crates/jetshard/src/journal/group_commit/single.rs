//! The [`Committer`]'s single-record write: a command's one record published on its own and
//! answered on the writer's reply subscription ([`Acks`]), on a single server straight from the
//! submitter's task ([`GroupCommit::write_unit`](super::GroupCommit::write_unit)).

use std::sync::atomic::Ordering;

use futures::FutureExt;
use futures::future::Either;

use super::acks::{Acks, PublishAnswer};
use super::committer::{
    Committer, Outgoing, Refusal, Unit, WRONG_LAST_SEQUENCE, WRONG_LAST_SEQUENCE_IN_FLIGHT,
};
use crate::journal::server::WriteError;

impl Committer {
    /// Commits a unit of one record: a plain publish, its headers moved rather than copied.
    pub(super) async fn commit_single(&self, unit: Unit) {
        let _ = unit.answer.send(self.write_single(unit.records).await);
    }

    /// Publishes the one record of `records` (none: nothing to store) and answers as
    /// [`GroupCommit::write`] does.
    ///
    /// Not an `async fn`, and built of combinators: on a single server this future is part of
    /// every command's (boxed apart), and an `async fn` would hold its argument (the records)
    /// beside the publish.
    pub(super) fn write_single(
        &self,
        mut records: Vec<Outgoing>,
    ) -> impl Future<Output = Result<u64, WriteError>> + Send + use<'_> {
        let Some(record) = records.pop() else {
            return Either::Left(std::future::ready(Ok(0)));
        };
        Either::Right(
            self.publish_one(record)
                .map(move |published| match published {
                    Ok(seq) => {
                        self.committed(1);
                        Ok(seq)
                    }
                    // Its message id is known: it was stored.
                    Err(Refusal::Duplicate) => Ok(0),
                    Err(refusal) => Err(self.error_of(&refusal)),
                }),
        )
    }

    /// Counts a stored batch of `records` records.
    pub(super) fn committed(&self, records: usize) {
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats
            .records
            .fetch_add(records as u64, Ordering::Relaxed);
        self.metrics.records.record(records as f64);
    }

    /// What a refusal means to a unit's submitter.
    pub(super) fn error_of(&self, refusal: &Refusal) -> WriteError {
        match refusal {
            Refusal::Fenced => WriteError::Fenced {
                generation: self.generation,
            },
            Refusal::Unconfirmed(e) => WriteError::Unconfirmed(e.clone().into()),
            Refusal::Refused(e) => WriteError::Refused(e.clone()),
            // One unit, all or none: its message ids are known, so it was stored.
            Refusal::Duplicate => unreachable!("a duplicate is answered as stored"),
        }
    }

    /// Publishes one record on its own, answered on the writer's own reply subscription
    /// ([`Acks`]: no request of async-nats's per record). Not retried here (its headers are
    /// moved into the publish): a refusal for a write in flight (10164, a clustered stream while
    /// the owner changes) is counted and reported unconfirmed, and its entity writes it again.
    ///
    /// Not an `async fn`, for the reasons given at [`Self::write_single`]; the first publish
    /// of the writer, which subscribes, is boxed apart.
    pub(super) fn publish_one(
        &self,
        record: Outgoing,
    ) -> impl Future<Output = Result<u64, Refusal>> + Send + use<'_> {
        let Some(acks) = self.acks.get() else {
            return Either::Right(Box::pin(async move {
                let acks = self
                    .acks
                    .get_or_try_init(|| {
                        Acks::start(
                            self.js.client(),
                            self.write_timeout,
                            self.leader_elections.clone(),
                        )
                    })
                    .await
                    .map_err(Refusal::Unconfirmed)?;
                let answer = acks
                    .publish(record.subject, record.headers, record.payload)
                    .await;
                self.refusal_of(answer)
            }));
        };
        Either::Left(
            acks.publish(record.subject, record.headers, record.payload)
                .map(|answer| self.refusal_of(answer)),
        )
    }

    /// What the server's answer to a single publish means.
    pub(super) fn refusal_of(&self, answer: PublishAnswer) -> Result<u64, Refusal> {
        match answer {
            PublishAnswer::Stored(seq) => Ok(seq),
            PublishAnswer::Refused {
                code: WRONG_LAST_SEQUENCE,
                ..
            } => Err(Refusal::Fenced),
            PublishAnswer::Refused { code, description } => {
                if code == WRONG_LAST_SEQUENCE_IN_FLIGHT {
                    self.conflict();
                }
                Err(Refusal::Unconfirmed(description))
            }
            PublishAnswer::TooLarge(e) => Err(Refusal::Refused(e)),
            PublishAnswer::Unconfirmed(e) => Err(Refusal::Unconfirmed(e)),
        }
    }

    /// Counts a refusal for a fenced write already in flight (10164).
    pub(super) fn conflict(&self) {
        self.stats.conflicts.fetch_add(1, Ordering::Relaxed);
        self.metrics.conflicts.increment(1);
    }
}
