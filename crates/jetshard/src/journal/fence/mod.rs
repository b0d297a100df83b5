//! Generations: the compare-and-set fence record that makes one owner's writes valid.
//!
//! When an owner takes a partition it publishes the next fence record on `<t>.fence.<p>`,
//! expecting the subject's last sequence to be the one it read. Two claimants can never both win
//! the same generation, and every later journal write is checked by the server against the
//! sequence of the fence record its writer won (see [`crate::journal`]).
//!
//! Architecture Invariant: only this module writes fence records.

mod in_hand;
mod record;

use async_nats::jetstream::context::{Context, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};

use crate::error::{BoxError, Error};
use crate::wire::{HDR_GENERATION, Names};

pub(crate) use in_hand::{InHand, claims_holding};
use in_hand::{hold, may_isolate, trial};
pub use record::{FenceRecord, FenceRecordError};
pub(crate) use record::{HeldRange, Trial};

/// The fence an owner holds: its generation and the journal sequence of its fence record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fence {
    pub(crate) generation: u64,
    pub(crate) seq: u64,
}

/// What a won claim tells: the fence, the commands in hand it found (see [`HeldRange`]), and
/// whether to run them in isolation.
#[derive(Debug)]
pub(crate) struct Claimed {
    pub(crate) fence: Fence,
    pub(crate) held: Vec<HeldRange>,
    pub(crate) trial: Option<Trial>,
}

/// Why a claim failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClaimError {
    /// Another node claimed the partition at each attempt.
    #[error("lost the generation race {attempts} times")]
    Contended { attempts: u32 },
    /// The server moved the claimant's pin on before the claim was published: another process
    /// is pinned, and may have claimed already (this claim would supersede it).
    #[error("the pin moved on before the claim")]
    PinLost,
    /// The last fence record is unreadable; the partition needs an operator.
    #[error("latest fence record at sequence {seq} is unreadable: {source}")]
    Corrupt { seq: u64, source: FenceRecordError },
    /// The server could not be asked or written.
    #[error(transparent)]
    Server(#[from] Error),
}

/// The latest fence record of a partition: `(sequence, record)`, or `None` before the first.
pub(crate) async fn latest(
    journal: &Stream<()>,
    names: &Names,
    partition: u32,
) -> Result<Option<(u64, FenceRecord)>, ClaimError> {
    let subject = names.fence_subject(partition);
    match journal.get_last_raw_message_by_subject(&subject).await {
        Ok(message) => {
            let record =
                FenceRecord::decode(&message.headers, &message.payload).map_err(|source| {
                    ClaimError::Corrupt {
                        seq: message.sequence,
                        source,
                    }
                })?;
            Ok(Some((message.sequence, record)))
        }
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => {
            Err(Error::jetstream(format!("read the last fence record on {subject}"), e).into())
        }
    }
}

/// The server's code for "wrong last sequence" from a clustered stream while another write
/// naming the same expected subject is in flight (not the fence's 10071): try again.
const IN_FLIGHT_COLLISION: u64 = 10164;

/// Who claims: this process's node id, incarnation and the pin it holds the partition under.
pub(crate) struct Claimant<'a> {
    pub(crate) node: &'a str,
    pub(crate) incarnation: &'a str,
    pub(crate) pin: &'a str,
    /// Whether the claimant still holds `pin`, asked right before each publish: a takeover
    /// slowed down (a read sent to a leader as it died waits for the request timeout) may
    /// outlast its pin, and its claim would then supersede the owner pinned since.
    pub(crate) pinned: &'a (dyn Fn() -> bool + Sync),
    /// Whether a previous owner's process is gone (the runtime's crash watch answers: a
    /// previous owner known dead is not probed for long again).
    pub(crate) liveness: &'a dyn Liveness,
    /// The latest fence record, if the claimant read it ahead ([`latest`]), side by side with
    /// its other reads: the first attempt uses it instead of reading it again. It may be
    /// stale by the publish: the publish expects the subject's last sequence to be the record's,
    /// so a record written since fails the attempt and the next one reads the latest again.
    /// A won claim's record was thus the latest at its publish, read ahead or not.
    pub(crate) read_ahead: Option<Option<(u64, FenceRecord)>>,
    /// Where the first command in hand (`InHand::head`) comes from when the claimant reads it
    /// side by side with the claim (the in-flight window): asked, and awaited, only by an
    /// attempt that may isolate (`may_isolate`: the head names the trial). `None`:
    /// `InHand::head` is known already.
    pub(crate) head: Option<&'a dyn PendingHead>,
}

/// The first command in hand, read by the claimant while it claims: a claim that may isolate
/// waits for it, any other claim does not need it.
pub(crate) trait PendingHead: Sync {
    /// The first command in hand of the partition that earlier owners held (`None`: none).
    fn head(&self) -> futures::future::BoxFuture<'_, Option<u64>>;
}

/// Whether the process of an incarnation is gone, as a claim needs to know. The runtime's crash
/// watch implements it; the journal sees only this narrow handle, never the runtime.
pub(crate) trait Liveness: Sync {
    /// Dead (true), or alive or unknown (false).
    fn is_gone<'a>(&'a self, incarnation: &'a str) -> futures::future::BoxFuture<'a, bool>;
}

/// Claims the next generation of `partition` for `claimant`, counting the commands `in_hand`
/// into the record.
pub(crate) async fn claim(
    js: &Context,
    journal: &Stream<()>,
    names: &Names,
    partition: u32,
    claimant: Claimant<'_>,
    in_hand: InHand,
) -> Result<Claimed, ClaimError> {
    let Claimant {
        node,
        incarnation,
        pin,
        pinned,
        liveness,
        mut read_ahead,
        head: mut head_source,
    } = claimant;
    let mut in_hand = in_hand;
    const ATTEMPTS: u32 = 6;
    let subject = names.fence_subject(partition);
    for attempt in 1..=ATTEMPTS {
        let read_at = std::time::Instant::now();
        let read = match read_ahead.take() {
            Some(read) => read,
            None => latest(journal, names, partition).await?,
        };
        let (previous_seq, previous) = match read {
            Some((seq, record)) => (seq, Some(record)),
            None => (0, None),
        };
        let probe_at = std::time::Instant::now();
        let generation = previous.as_ref().map_or(0, |r| r.generation) + 1;
        // Whether the previous owner died only counts the commands in hand: with none, the
        // probe (up to 20 ms when its process is gone and not known dead yet) is skipped.
        let died = match previous.as_ref().and_then(|r| r.incarnation.as_deref()) {
            Some(theirs) if theirs != incarnation && in_hand.counted.is_some() => {
                liveness.is_gone(theirs).await
            }
            _ => false,
        };
        let held = hold(
            previous.as_ref().map_or(&[][..], |r| &r.held),
            in_hand.counted,
            died,
        );
        if may_isolate(&held, in_hand.isolate_at)
            && let Some(source) = head_source.take()
        {
            // The trial names the first command in hand: wait for the read that finds it.
            in_hand.head = source.head().await;
        }
        let trial = trial(previous.and_then(|r| r.trial), &held, &in_hand, died);
        let record = FenceRecord {
            partition,
            generation,
            node: node.to_owned(),
            incarnation: Some(incarnation.to_owned()),
            pin: (!pin.is_empty()).then(|| pin.to_owned()),
            held,
            trial,
        };
        let body = serde_json::to_vec(&record)
            .map_err(|e| Error::jetstream("encode a fence record", e))?;
        let publish = PublishMessage::build()
            .payload(body.into())
            .header(HDR_GENERATION, generation.to_string())
            .expected_last_subject_sequence(previous_seq);
        if !pinned() {
            return Err(ClaimError::PinLost);
        }
        let publish_at = std::time::Instant::now();
        let result = async { js.send_publish(subject.clone(), publish).await?.await }.await;
        tracing::debug!(
            partition,
            generation,
            attempt,
            read_us = (probe_at - read_at).as_micros() as u64,
            probe_us = (publish_at - probe_at).as_micros() as u64,
            publish_us = publish_at.elapsed().as_micros() as u64,
            won = result.is_ok(),
            "fence claim attempt"
        );
        match result {
            Ok(ack) => {
                return Ok(Claimed {
                    fence: Fence {
                        generation,
                        seq: ack.sequence,
                    },
                    held: record.held,
                    trial: record.trial,
                });
            }
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => continue,
            Err(e) if crate::journal::server_error_code(&e) == Some(IN_FLIGHT_COLLISION) => {
                // A write of the previous owner naming the fence subject was in flight on a
                // clustered journal: read the latest record again and retry shortly.
                let delay = crate::retry::backoff(
                    std::time::Duration::from_millis(20),
                    u64::from(attempt),
                    std::time::Duration::from_millis(500),
                );
                tokio::time::sleep(delay).await;
                continue;
            }
            Err(e) => {
                let source: BoxError = Box::new(e);
                return Err(Error::JetStream {
                    context: format!("publish fence record {generation} on {subject}"),
                    source,
                }
                .into());
            }
        }
    }
    Err(ClaimError::Contended { attempts: ATTEMPTS })
}

#[cfg(test)]
mod tests {
    use super::*;
    use jetshard_testkit::NatsServer;

    /// Every previous owner is alive (no probe needed here).
    struct Alive;

    impl Liveness for Alive {
        fn is_gone<'a>(&'a self, _: &'a str) -> futures::future::BoxFuture<'a, bool> {
            Box::pin(async { false })
        }
    }

    async fn claim_with(
        js: &Context,
        journal: &Stream<()>,
        names: &Names,
        pinned: &(dyn Fn() -> bool + Sync),
    ) -> Result<Claimed, ClaimError> {
        let claimant = Claimant {
            node: "n1",
            incarnation: "i1",
            pin: "p1",
            pinned,
            liveness: &Alive,
            read_ahead: None,
            head: None,
        };
        let in_hand = InHand {
            counted: None,
            head: None,
            isolate_at: 2,
        };
        claim(js, journal, names, 0, claimant, in_hand).await
    }

    /// A claimant whose pin the server moved on publishes nothing: the owner pinned since may
    /// have claimed, and this claim would supersede it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claimant_that_lost_its_pin_claims_nothing() {
        let server = NatsServer::start().await.expect("start nats-server");
        let js = async_nats::jetstream::new(server.connect().await.expect("connect"));
        js.create_stream(async_nats::jetstream::stream::Config {
            name: "T".to_owned(),
            subjects: vec!["t.>".to_owned()],
            ..Default::default()
        })
        .await
        .expect("create the journal");
        let journal = crate::journal::server::open_stream(&js, "T")
            .await
            .expect("open it");
        let names = Names::new("t");

        let lost = claim_with(&js, &journal, &names, &|| false).await;
        assert!(matches!(lost, Err(ClaimError::PinLost)), "{lost:?}");
        assert_eq!(
            latest(&journal, &names, 0)
                .await
                .expect("read")
                .map(|(seq, _)| seq),
            None
        );

        let won = claim_with(&js, &journal, &names, &|| true)
            .await
            .expect("claimed under a pin it holds");
        assert_eq!(won.fence.generation, 1);
    }
}
