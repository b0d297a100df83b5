//! The server's answers to one writer's single-record publishes, read on a subscription of the
//! writer's own.
//!
//! async-nats's JetStream publish makes a request of every message: a new inbox name (two
//! strings), a reply subject built from it (two more, each made a `Subject` with one more
//! allocation), an entry keyed by a `String` in the client's request map, and an answer parsed
//! into a `PublishAck` that holds the stream's name: about seven allocations per command, on the
//! command path of every single-record write. Here the writer subscribes once to
//! `<inbox>.*`, names each publish's reply `<inbox>.<n>` (cut from a shared buffer: no
//! allocation of its own), and reads each answer in place: the sequence it was stored at, or the
//! server's error code.
//! The publish itself, its headers (the fence) and what the server checks are unchanged.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_nats::client::traits::Publisher;
use async_nats::message::OutboundMessage;
use async_nats::{Client, HeaderMap, StatusCode, Subject};
use bytes::{Bytes, BytesMut};
use futures::{FutureExt, StreamExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// When the journal stream last elected a new leader, as this process heard it (`None`: not
/// since the process started); each election changes it.
pub(crate) type Elections = tokio::sync::watch::Receiver<Option<Instant>>;

/// How long a write sent just after the journal stream elected a new leader (within this long
/// of it) may wait for its answer: a publish that reaches the servers while the leadership
/// changes hands may be dropped by all of them (none leads it yet), and no later election
/// answers it. It is then reported unconfirmed (its entity writes it again), not after the
/// whole write timeout.
pub(super) const UNSETTLED: Duration = Duration::from_secs(2);

/// What a write given up after [`UNSETTLED`] is told.
pub(super) const UNSETTLED_ERROR: &str =
    "no answer within 2 s to a write sent as the journal stream's new leader took over";

/// When a write sent now stops waiting for its answer, if the journal stream elected a new
/// leader less than [`UNSETTLED`] ago; `None` otherwise.
pub(super) fn unsettled(elections: Option<&Elections>) -> Option<Instant> {
    let elected = (*elections?.borrow())?;
    let now = Instant::now();
    (now.duration_since(elected) < UNSETTLED).then(|| now + UNSETTLED)
}

/// Resolves at `deadline`; never without one.
pub(super) async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Resolves when `elections` sees a new leader elected: never without a receiver, nor once its
/// sender is gone.
pub(super) async fn elected(elections: &mut Option<Elections>) {
    if let Some(elections) = elections
        && elections.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// What the server answered one publish.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum PublishAnswer {
    /// Stored at this journal sequence (or stored before, as a duplicate of its message id: the
    /// sequence it was stored at then).
    Stored(u64),
    /// Refused by the server: its JetStream error code and what it said.
    Refused { code: u64, description: String },
    /// Over the server's `max_payload`: never sent.
    TooLarge(String),
    /// No answer that says whether it was stored (timeout, connection loss, no stream).
    Unconfirmed(String),
}

/// The writers waiting for an answer, by the number their reply subject ends with, and the
/// buffer reply subjects are cut from.
#[derive(Default)]
struct Inner {
    /// Keyed by this writer's own publish numbers (no sender chooses them): foldhash, not
    /// SipHash, for the insert and the removal of every write.
    waiting: HashMap<u64, oneshot::Sender<PublishAnswer>, foldhash::fast::RandomState>,
    /// Reply subjects are written here and split off, so that each is a share of one
    /// allocation: async-nats clones a publish's reply subject (to validate it), and the first
    /// clone of a subject that owns its bytes allocates.
    replies: BytesMut,
}

type Waiting = Arc<Mutex<Inner>>;

/// Room for this many bytes of reply subjects is allocated at a time: within glibc's small bins
/// (a larger request consolidates the fast bins first), about 20 reply subjects.
const REPLY_BUFFER: usize = 960;

/// One writer's answers: its reply subscription and who waits for what. The subscription and
/// its reader end when this is dropped.
pub(super) struct Acks {
    client: Client,
    /// `<inbox>.`: each publish's reply subject is this and its number.
    prefix: Bytes,
    next: AtomicU64,
    /// Shared with the reader task only (the writer's own answers: no actor state).
    waiting: Waiting,
    timeout: Duration,
    /// The journal stream's elections: a write sent just after one waits at most
    /// [`UNSETTLED`].
    elections: Option<Elections>,
    reader: JoinHandle<()>,
}

impl Drop for Acks {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// The map, even after a panic elsewhere while it was held (it holds senders and bytes only).
fn lock(waiting: &Waiting) -> MutexGuard<'_, Inner> {
    waiting.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A writer waiting for its answer: forgotten when it stops waiting (answered, timed out, or
/// dropped), so an answer that never comes leaves nothing behind.
struct Wait<'a> {
    waiting: &'a Waiting,
    number: u64,
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        lock(self.waiting).waiting.remove(&self.number);
    }
}

impl Acks {
    /// Subscribes to the writer's reply subjects. Publishes made after this returns are
    /// answered on the subscription (the client sends the subscription to the server first).
    /// The writes waiting when `leader_elections` changes are answered unconfirmed at once.
    pub(super) async fn start(
        client: Client,
        timeout: Duration,
        leader_elections: Option<Elections>,
    ) -> Result<Self, String> {
        let (answers, prefix) = crate::wire::write_answers(&client.new_inbox());
        let subscription = client
            .subscribe(answers)
            .await
            .map_err(|e| format!("cannot subscribe to the write answers: {e}"))?;
        let waiting = Waiting::default();
        let elections = leader_elections.clone();
        let reader = tokio::spawn(read(subscription, Arc::clone(&waiting), leader_elections));
        Ok(Self {
            client,
            prefix: Bytes::from(prefix),
            next: AtomicU64::new(0),
            waiting,
            timeout,
            elections,
            reader,
        })
    }

    /// Publishes one record with a reply subject of this writer's and waits (at most the write
    /// timeout) for the server's answer.
    ///
    /// Not an `async fn`: its future is part of every single write's, which is allocated per
    /// command, and an `async fn` would hold its arguments beside the publish they are moved
    /// into (this future must stay within glibc's small bins: `GroupCommit::write_unit`).
    pub(super) fn publish(
        &self,
        subject: Subject,
        headers: HeaderMap,
        payload: Bytes,
    ) -> impl Future<Output = PublishAnswer> + Send + use<'_> {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let (sender, answer) = oneshot::channel();
        let reply = {
            let mut inner = lock(&self.waiting);
            inner.waiting.insert(number, sender);
            reply_subject(&mut inner.replies, &self.prefix, number)
        };
        let wait = Wait {
            waiting: &self.waiting,
            number,
        };
        let timeout = match unsettled(self.elections.as_ref()) {
            Some(_) => self.timeout.min(UNSETTLED),
            None => self.timeout,
        };
        // The write timeout covers the publish too: a client whose command channel is full
        // (its connection stalled) does not hold the write past it. Published as a whole
        // message: `publish_with_reply_and_headers` clones the subject and the reply first (to
        // check them), a clone and a drop of each per write; the subject is checked
        // the same way here, the reply is this writer's own.
        let message = OutboundMessage {
            subject,
            reply: Some(reply),
            payload,
            headers: Some(headers),
        };
        let publish = self
            .client
            .publish_message(message)
            .then(move |sent| answered(sent, wait, answer));
        tokio::time::timeout(timeout, publish).map(move |done| {
            done.unwrap_or_else(|_| {
                PublishAnswer::Unconfirmed(format!("no answer within {timeout:?}"))
            })
        })
    }
}

/// The answer to a publish `sent`, once it comes.
async fn answered(
    sent: Result<(), async_nats::client::PublishError>,
    _wait: Wait<'_>,
    answer: oneshot::Receiver<PublishAnswer>,
) -> PublishAnswer {
    if let Err(e) = sent {
        return match e.kind() {
            async_nats::client::PublishErrorKind::MaxPayloadExceeded => {
                PublishAnswer::TooLarge(e.to_string())
            }
            _ => PublishAnswer::Unconfirmed(e.to_string()),
        };
    }
    answer.await.unwrap_or_else(|_| {
        PublishAnswer::Unconfirmed("the reader of write answers stopped".to_owned())
    })
}

/// `<prefix><number>`, split off `buffer` (a new buffer when it has no room left).
fn reply_subject(buffer: &mut BytesMut, prefix: &[u8], number: u64) -> Subject {
    // The prefix and up to 20 digits.
    let needed = prefix.len() + 20;
    if buffer.capacity() - buffer.len() < needed {
        *buffer = BytesMut::with_capacity(REPLY_BUFFER.max(needed));
    }
    buffer.extend_from_slice(prefix);
    buffer.extend_from_slice(crate::wire::decimal(
        number,
        &mut [0; crate::wire::DECIMAL_DIGITS],
    ));
    let reply = buffer.split().freeze();
    // The inbox and the digits are ASCII.
    Subject::from_utf8(reply).unwrap_or_else(|_| Subject::from_static(""))
}

/// Hands each answer to the writer waiting for it, until the subscription ends; when the
/// journal stream elects a new leader, answers every write waiting then unconfirmed (the
/// leader that handed over may answer none of them, and each would wait its whole timeout).
async fn read(
    mut subscription: async_nats::Subscriber,
    waiting: Waiting,
    mut leader_elections: Option<Elections>,
) {
    loop {
        let message = tokio::select! {
            message = subscription.next() => message,
            () = elected(&mut leader_elections) => {
                let waiting: Vec<_> = lock(&waiting).waiting.drain().collect();
                for (_, sender) in waiting {
                    let _ = sender.send(PublishAnswer::Unconfirmed(
                        "the journal stream elected a new leader".to_owned(),
                    ));
                }
                continue;
            }
        };
        let Some(message) = message else {
            return;
        };
        let subject = message.subject.as_bytes();
        let last = subject
            .iter()
            .rposition(|byte| *byte == b'.')
            .map_or(subject, |dot| &subject[dot + 1..]);
        let number = crate::wire::read_decimal(last);
        // None: answered too late (the writer stopped waiting), or not an answer of ours.
        let Some(sender) = number.and_then(|n| lock(&waiting).waiting.remove(&n)) else {
            continue;
        };
        let _ = sender.send(answer_of(message.status, &message.payload));
    }
}

/// What an answer says: a status (no stream listens: "no responders"), or the JetStream
/// publish acknowledgement (its sequence) or error, read without copying the stream's name.
fn answer_of(status: Option<StatusCode>, payload: &[u8]) -> PublishAnswer {
    match status {
        None | Some(StatusCode::OK) => {}
        Some(StatusCode::NO_RESPONDERS) => {
            return PublishAnswer::Unconfirmed(
                "no responders: no stream stores the subject".to_owned(),
            );
        }
        Some(status) => {
            return PublishAnswer::Unconfirmed(format!("answered with status {status}"));
        }
    }
    if let Some(seq) = plain_ack(payload) {
        return PublishAnswer::Stored(seq);
    }
    #[derive(serde::Deserialize)]
    struct PublishAck {
        seq: Option<u64>,
        error: Option<ApiError>,
    }
    #[derive(serde::Deserialize)]
    struct ApiError {
        #[serde(default)]
        err_code: u64,
        #[serde(default)]
        description: String,
    }
    match serde_json::from_slice::<PublishAck>(payload) {
        Ok(PublishAck {
            error: Some(error), ..
        }) => PublishAnswer::Refused {
            code: error.err_code,
            description: format!("{} (error code {})", error.description, error.err_code),
        },
        Ok(PublishAck {
            seq: Some(seq),
            error: None,
        }) => PublishAnswer::Stored(seq),
        Ok(PublishAck {
            seq: None,
            error: None,
        }) => PublishAnswer::Unconfirmed("an answer without a sequence".to_owned()),
        Err(e) => PublishAnswer::Unconfirmed(format!("an unreadable answer: {e}")),
    }
}

/// The sequence of an answer of exactly the form the server gives a stored write,
/// `{"stream":"<name>","seq":<digits>}`, read without serde_json (~1,100 instructions a write);
/// `None` for any other form (a duplicate, an error, a domain, an escaped name),
/// which [`answer_of`] reads with serde_json.
fn plain_ack(payload: &[u8]) -> Option<u64> {
    let rest = payload.strip_prefix(br#"{"stream":""#)?;
    let quote = rest.iter().position(|byte| *byte == b'"')?;
    if rest[..quote].contains(&b'\\') {
        return None;
    }
    let digits = rest[quote..]
        .strip_prefix(br#"","seq":"#)?
        .strip_suffix(b"}")?;
    crate::wire::read_decimal(digits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_write_sent_just_after_an_election_waits_at_most_unsettled() {
        let (elect, elections) = tokio::sync::watch::channel(None);
        assert_eq!(unsettled(None), None, "one server: no elections");
        assert_eq!(unsettled(Some(&elections)), None, "no election yet");
        elect.send_replace(Some(Instant::now()));
        tokio::time::advance(Duration::from_millis(1_500)).await;
        let deadline = unsettled(Some(&elections)).expect("1.5 s after an election");
        assert_eq!(deadline, Instant::now() + UNSETTLED);
        let waited = Instant::now();
        until(Some(deadline)).await;
        assert_eq!(waited.elapsed(), UNSETTLED);
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(unsettled(Some(&elections)), None, "settled 2 s after it");
        let never = tokio::time::timeout(Duration::from_secs(60), until(None)).await;
        assert!(never.is_err(), "no deadline: never");
    }

    #[test]
    fn answers_are_read_as_the_server_writes_them() {
        assert_eq!(
            answer_of(None, br#"{"stream":"J","seq":42}"#),
            PublishAnswer::Stored(42)
        );
        assert_eq!(
            answer_of(None, br#"{"stream":"J","seq":7,"duplicate":true}"#),
            PublishAnswer::Stored(7)
        );
        assert_eq!(
            answer_of(
                None,
                br#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"}}"#
            ),
            PublishAnswer::Refused {
                code: 10071,
                description: "wrong last sequence: 5 (error code 10071)".to_owned()
            }
        );
        assert!(matches!(
            answer_of(Some(StatusCode::NO_RESPONDERS), b""),
            PublishAnswer::Unconfirmed(_)
        ));
        assert!(matches!(
            answer_of(None, b"{}"),
            PublishAnswer::Unconfirmed(_)
        ));
        assert!(matches!(
            answer_of(None, b"not json"),
            PublishAnswer::Unconfirmed(_)
        ));
    }

    #[test]
    fn a_plain_answer_is_read_without_serde_json_as_serde_json_reads_it() {
        assert_eq!(plain_ack(br#"{"stream":"J","seq":42}"#), Some(42));
        assert_eq!(
            plain_ack(br#"{"stream":"orders-journal","seq":18446744073709551615}"#),
            Some(u64::MAX)
        );
        for other in [
            &br#"{"stream":"J","seq":7,"duplicate":true}"#[..],
            br#"{"stream":"J","domain":"hub","seq":7}"#,
            br#"{"stream":"J\"x","seq":7}"#,
            br#"{"stream":"J","seq":}"#,
            br#"{"stream":"J","seq":-1}"#,
            br#"{"stream":"J","seq":7} "#,
            br#"{"error":{"code":400,"err_code":10071,"description":"x"}}"#,
        ] {
            assert_eq!(plain_ack(other), None, "{}", String::from_utf8_lossy(other));
        }
        // Every form still reads as before (serde_json where the plain read declines).
        assert_eq!(
            answer_of(None, br#"{"stream":"J","domain":"hub","seq":7}"#),
            PublishAnswer::Stored(7)
        );
    }

    #[test]
    fn reply_subjects_are_cut_whole_from_a_shared_buffer() {
        let mut buffer = BytesMut::new();
        let replies: Vec<Subject> = [0, 9, 10, 99, 100, 12_345, u64::MAX]
            .into_iter()
            .map(|number| reply_subject(&mut buffer, b"_INBOX.abc.", number))
            .collect();
        for (reply, number) in replies.iter().zip([0, 9, 10, 99, 100, 12_345, u64::MAX]) {
            assert_eq!(
                reply.as_str(),
                ["_INBOX.abc.", &number.to_string()].concat()
            );
        }
        // Many more than one buffer holds: each still whole.
        for number in 0..1_000u64 {
            let reply = reply_subject(&mut buffer, b"_INBOX.abc.", number);
            assert_eq!(
                reply.as_str(),
                ["_INBOX.abc.", &number.to_string()].concat()
            );
        }
    }

    /// A new reply buffer is a request glibc serves from its small bins
    /// ([`crate::test_alloc::SMALL_ALLOCATION`]): at 4 KiB it was one of the warm pass's large allocations.
    #[test]
    fn a_reply_buffer_is_a_small_allocation() {
        let mut buffer = BytesMut::new();
        let prefix = b"_INBOX.rNnBpLIHRvT4o8mj2Kd6ZH.";
        reply_subject(&mut buffer, prefix, u64::MAX);
        let allocated = buffer.capacity() + prefix.len() + 20;
        assert!(
            allocated <= crate::test_alloc::SMALL_ALLOCATION,
            "a reply buffer is {allocated} bytes"
        );
    }
}
