//! The pinned pull loop of one partition in one process.
//!
//! async-nats's pull streams track a pin but hide the moments it is gained and lost, so this loop
//! speaks the pull protocol on the core client. It keeps pull requests outstanding for the
//! partition's consumer in the `owners` priority group, carrying the pin id once the server has
//! pinned this process, and reports to the owner:
//! - every delivered command, tagged with the pin it was delivered under;
//! - the loss of the pin (a `423` answer to a pull carrying the id).
//!
//! A pinned client keeps its pin only by pulling: deliveries and acks do not refresh it. So a new
//! pull request goes out whenever the newest one is `expires` old (a third of the pin TTL), busy
//! or not, besides those that keep `batch` commands requested, and at once when the consumer
//! was resumed ([`resumed`]: the server does not serve the open ones then).
//!
//! What is still requested is counted over all open pull requests together ([`Requested`]),
//! never per request: the server hands a consumer's messages to its open requests in turn (a
//! request that still wants more goes to the back of its queue), and a status ending a request
//! says how many it had not been given (`Nats-Pending-Messages`). Which request a message
//! answered cannot be told, so a count per request drifts; the sum does not.

mod delivery;
mod requested;
pub(crate) mod resumed;
mod tail;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::client::traits::Publisher;
use async_nats::jetstream::Context;
use async_nats::jetstream::stream::Stream;
use async_nats::message::OutboundMessage;
use async_nats::{Client, StatusCode, Subject};
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::wire::PRIORITY_GROUP;

use delivery::{AckInfo, ack_info};
pub(crate) use delivery::{Delivery, is_wake, respond_to, trace_of, try_wake, wake};
use requested::{Requested, pending_of};
use tail::TailCheck;

/// What the pull loop tells its owner.
pub(crate) enum PinSignal {
    /// Commands were delivered, in the order the server sent them: every delivery that had
    /// arrived by the time the loop looked (one message to the owner per burst, not per
    /// command; at most [`MAX_DELIVERIES_PER_SIGNAL`]).
    Delivered(Vec<Delivery>),
    /// The server refused a pull carrying `pin`: another process holds the partition now.
    Lost { pin: Arc<str> },
    /// A delivery under `pin` never arrived (the consumer's delivery counter jumped): later
    /// commands must not overtake it.
    Gap { pin: Arc<str> },
    /// The last deliveries under `pin` never arrived, and nothing after them ([`tail`]): the
    /// consumer said twice it had delivered past what this loop received.
    TailLost { pin: Arc<str> },
    /// Pulling is paused and no pull request of this loop without the pin id is open at the
    /// server any more: an unpin cannot pin this process again (the open pulls that carry the
    /// pin id are ended with 423 by the unpin). Deliveries to those may still arrive until then.
    Idle,
    /// The loop has ended (its subscription closed, or the client failed): nothing more will be
    /// delivered here until a new loop is started.
    Ended { reason: String },
}

/// At most this many deliveries go to the owner in one [`PinSignal::Delivered`].
pub(crate) const MAX_DELIVERIES_PER_SIGNAL: usize = 256;

/// The first wait before pulling again after a `503` (no responders: the consumer has no
/// leader, as while its replicas elect one, or does not exist); doubled at each further `503`
/// up to [`NO_RESPONDERS_MAX_WAIT`]. Pulling on at once, a loop sent 200-430 pulls a second
/// for the ~5 s of an election (the `cluster` suite's logs): each process, for each
/// partition whose consumer lost its leader.
const NO_RESPONDERS_FIRST_WAIT: Duration = Duration::from_millis(10);

/// The longest wait between pulls answered `503`: what a consumer's new leader may wait for
/// this loop's first pull.
const NO_RESPONDERS_MAX_WAIT: Duration = Duration::from_millis(250);

/// How the loop pulls.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PullSettings {
    pub(crate) batch: u32,
    pub(crate) expires: Duration,
}

/// A running pull loop; dropping it stops the loop and its subscription.
pub(crate) struct PullLoop {
    task: JoinHandle<()>,
    paused: watch::Sender<bool>,
    forget: watch::Sender<Option<Arc<str>>>,
    /// The last pin the server said this loop no longer holds (a pull carrying it refused).
    lost: watch::Receiver<Option<Arc<str>>>,
}

impl PullLoop {
    /// Stops (or resumes) sending pull requests. Once paused and every open request has ended,
    /// the loop reports [`PinSignal::Idle`]; it resumes without a pin id.
    pub(crate) fn pause(&self, paused: bool) {
        self.paused.send_replace(paused);
    }

    /// Pulls on without the pin id `pin` (if the loop still holds it): the server's pin then
    /// lapses after its TTL, whoever asks to unpin it, and the partition is pinned afresh.
    pub(crate) fn forget_pin(&self, pin: Arc<str>) {
        self.forget.send_replace(Some(pin));
    }

    /// Whether the server has moved `pin` on: a pull carrying it was refused. Known here as
    /// soon as the loop hears it, before the owner reads its [`PinSignal::Lost`] (which waits
    /// while the owner is busy taking the partition).
    pub(crate) fn lost(&self, pin: &str) -> bool {
        self.lost.borrow().as_deref() == Some(pin)
    }
}

impl Drop for PullLoop {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts pulling `consumer` on `stream` (`commands`, to ask the consumer what it delivered
/// after a fault: [`tail`]). `resumed` changes when the consumer is resumed
/// ([`resumed::Resumes::watch`]): the loop then pulls at once. `sink` receives the signals; when
/// it returns `false` (the owner is gone) the loop ends.
pub(crate) fn start(
    js: Context,
    commands: Stream<()>,
    stream: &str,
    consumer: &str,
    settings: PullSettings,
    resumed: watch::Receiver<()>,
    sink: impl Fn(PinSignal) -> bool + Send + Sync + 'static,
) -> PullLoop {
    let request_subject = crate::wire::pull_request_subject(stream, consumer);
    let consumer = consumer.to_owned();
    let tail = TailCheck::new(commands, consumer.clone());
    let (paused, paused_rx) = watch::channel(false);
    let (forget, forget_rx) = watch::channel(None);
    let (lost_tx, lost) = watch::channel(None);
    let span = tracing::debug_span!("pull_loop", consumer = %consumer);
    let task = tokio::spawn(tracing::Instrument::instrument(
        async move {
            let signals = Signals {
                paused: paused_rx,
                forget: forget_rx,
                resumed,
                lost: lost_tx,
            };
            let reason = match run(js, request_subject, settings, signals, tail, &sink).await {
                Ok(Ended::OwnerGone) => return,
                Ok(Ended::SubscriptionClosed) => "its subscription closed".to_owned(),
                Err(e) => e.to_string(),
            };
            tracing::error!(consumer = %consumer, %reason, "pull loop ended");
            sink(PinSignal::Ended { reason });
        },
        span,
    ));
    PullLoop {
        task,
        paused,
        forget,
        lost,
    }
}

/// What the owner tells a running loop (and the process, of its consumer's resumes), and the
/// pin the loop tells it is lost (read at once, not queued behind the owner's work).
struct Signals {
    paused: watch::Receiver<bool>,
    forget: watch::Receiver<Option<Arc<str>>>,
    resumed: watch::Receiver<()>,
    lost: watch::Sender<Option<Arc<str>>>,
}

/// Why a loop ended without an error.
enum Ended {
    /// The owner is gone: nobody to tell.
    OwnerGone,
    SubscriptionClosed,
}

async fn run(
    js: Context,
    request_subject: String,
    settings: PullSettings,
    signals: Signals,
    mut tail: TailCheck,
    sink: &(impl Fn(PinSignal) -> bool + Sync),
) -> Result<Ended, async_nats::Error> {
    let Signals {
        mut paused,
        mut forget,
        mut resumed,
        lost: lost_pin,
    } = signals;
    // The consumer was resumed since the last pull: pull at once, whatever is still requested
    // (the server serves none of the open requests until a new one arrives).
    let mut resumed_since = false;
    // Whether resumes can still be told (their sender is the process's).
    let mut resumes_told = true;
    let client: Client = js.client();
    // Subjects once, each pull a share of them: a `String` is copied into a new subject at
    // every publish.
    let inbox = Subject::from(client.new_inbox());
    let request_subject = Subject::from(request_subject);
    let mut subscription = client.subscribe(inbox.clone()).await?;
    let expires = settings.expires;
    // A pull the server has not answered by then was lost with a connection: forget it.
    let forget_after = expires + Duration::from_secs(1);
    let mut pin: Option<Arc<str>> = None;
    let mut requested = Requested::default();
    // When the newest pull without the pin id was sent.
    let mut unpinned_sent: Option<Instant> = None;
    let mut connects = client.statistics().connects.load(Ordering::Relaxed);
    let mut idle_reported = false;
    // After a `503`: no pull before `until`; the next wait, if the next pull is refused too.
    let mut refused: Option<(Instant, Duration)> = None;
    // The consumer sequence of the last delivery under `last_pin`.
    let mut last_pin: Option<Arc<str>> = None;
    let mut last_consumer_seq: Option<u64> = None;
    // When the consumer last answered anything (a delivery or a status): a pull is answered by
    // its expiry, so a longer silence means the way to the consumer's leader is broken.
    let mut last_heard = Instant::now();
    // Deliveries received and not yet handed to the owner: sent once no further message is
    // ready (or the batch is full), and always before any other signal, so that the owner sees
    // everything in the order the server sent it.
    let mut delivered: Vec<Delivery> = Vec::new();
    // How many the last burst held: the next burst's vector is allocated that large at its
    // first delivery. Grown from empty, a burst of n reallocates about log2(n) times, each
    // block larger (`pin::run` under `malloc_consolidate`); none is kept while idle.
    // (An atomic, not a `Cell`: the loop's future is sent between threads.)
    let last_burst = std::sync::atomic::AtomicUsize::new(0);
    let flush = |delivered: &mut Vec<Delivery>| {
        if delivered.is_empty() {
            return true;
        }
        last_burst.store(delivered.len(), Ordering::Relaxed);
        sink(PinSignal::Delivered(std::mem::take(delivered)))
    };

    loop {
        let now = Instant::now();
        requested.expire(now, forget_after);
        let reconnected = client.statistics().connects.load(Ordering::Relaxed);
        if reconnected != connects {
            // The old connection's requests may be gone without a word (the server drops a
            // request nobody listens to): count afresh. One that survived costs a spare pull.
            connects = reconnected;
            requested = Requested::default();
            // And deliveries with them.
            tail.suspect(now, "reconnected");
        }
        if pin.is_some() && now >= last_heard + forget_after {
            last_heard = now;
            tail.suspect(now, "no answer from the consumer");
        }
        tail.ask_if_due(now);
        if let Some(forgotten) = forget.borrow_and_update().as_ref()
            && pin.as_ref() == Some(forgotten)
        {
            tracing::debug!(pin = %forgotten, "pin forgotten");
            pin = None;
        }
        // Every pause is answered with `Idle` once its pulls have ended, even one asked for
        // while paused already: a stop during the cool-down after a hand-off waits for it.
        if paused.has_changed().unwrap_or(false) {
            idle_reported = false;
        }
        let is_paused = *paused.borrow_and_update();
        if is_paused {
            // The next pull, after the pause, asks afresh.
            pin = None;
            // Only a pull without the pin id could pin this process again after an unpin: the
            // server ends the open pulls that carry it with 423 when the pin is cleared.
            let unpinned_open = unpinned_sent.is_some_and(|sent| now < sent + forget_after);
            if (requested.is_empty() || !unpinned_open) && !idle_reported {
                idle_reported = true;
                if !flush(&mut delivered) || !sink(PinSignal::Idle) {
                    return Ok(Ended::OwnerGone);
                }
            }
        } else {
            idle_reported = false;
        }
        let held_back = refused.is_some_and(|(until, _)| now < until);
        if !is_paused
            && !held_back
            && (resumed_since || requested.wants_pull(settings.batch, expires, now))
        {
            resumed_since = false;
            let body = pull_request(settings.batch, expires, pin.as_deref());
            let pull = OutboundMessage {
                subject: request_subject.clone(),
                reply: Some(inbox.clone()),
                payload: body.into(),
                headers: None,
            };
            let sent = client.publish_message(pull).await;
            if let Err(e) = sent {
                // What was delivered is the owner's before the loop ends.
                flush(&mut delivered);
                return Err(e.into());
            }
            requested.sent(settings.batch, now);
            tracing::trace!(target: crate::telemetry::STAGE_TARGET, subject = request_subject.as_str(), "pull");
            if pin.is_none() {
                unpinned_sent = Some(now);
            }
        }
        // Running: wake to refresh the pull (and so the pin). Paused: wake when every open
        // pull must have ended, or not at all.
        let mut wake_at = requested
            .wake_at(is_paused, expires, forget_after)
            .unwrap_or(now + Duration::from_secs(3600));
        if is_paused && let Some(sent) = unpinned_sent.filter(|s| now < *s + forget_after) {
            // Idle once the last pull without the pin id has ended.
            wake_at = wake_at.min(sent + forget_after);
        }
        if let Some((until, _)) = refused.filter(|(until, _)| now < *until) {
            wake_at = wake_at.min(until);
        }
        if let Some(at) = tail.wake_at() {
            wake_at = wake_at.min(at);
        }
        if pin.is_some() {
            wake_at = wake_at.min(last_heard + forget_after);
        }

        // A message already here is taken at once, into the same batch of deliveries.
        let ready = if delivered.len() < MAX_DELIVERIES_PER_SIGNAL {
            subscription.next().now_or_never()
        } else {
            None
        };
        let message = match ready {
            Some(Some(message)) => message,
            Some(None) => {
                if !flush(&mut delivered) {
                    return Ok(Ended::OwnerGone);
                }
                return Ok(Ended::SubscriptionClosed);
            }
            None => {
                if !flush(&mut delivered) {
                    return Ok(Ended::OwnerGone);
                }
                tokio::select! {
                message = subscription.next() => match message {
                    Some(message) => message,
                    None => return Ok(Ended::SubscriptionClosed),
                },
                () = tokio::time::sleep_until(wake_at) => continue,
                answer = async { tail.asked().expect("polled only while asked").await }, if tail.asked().is_some() => {
                    let received = last_consumer_seq.filter(|_| last_pin == pin);
                    let finding = tail.answered(answer.ok().flatten(), pin.as_deref(), received, Instant::now());
                    if finding == tail::TailFinding::Lost
                        && let Some(pin) = &pin
                        && !sink(PinSignal::TailLost { pin: pin.clone() })
                    {
                        return Ok(Ended::OwnerGone);
                    }
                    continue;
                }
                changed = paused.changed() => {
                    if changed.is_err() {
                        return Ok(Ended::OwnerGone);
                    }
                    idle_reported = false;
                    continue;
                }
                changed = forget.changed() => {
                    if changed.is_err() {
                        return Ok(Ended::OwnerGone);
                    }
                    continue;
                }
                changed = resumed.changed(), if resumes_told => {
                    match changed {
                        Ok(()) => {
                            tracing::debug!("consumer resumed: pulling at once");
                            resumed_since = true;
                        }
                        Err(_) => resumes_told = false,
                    }
                    continue;
                }
                    }
            }
        };
        last_heard = Instant::now();
        if message.status != Some(StatusCode::NO_RESPONDERS) {
            // The consumer answered: it has a leader.
            refused = None;
        }
        match message.status {
            None | Some(StatusCode::OK) => {
                // One pass over the headers; the readers below look up only a command that
                // carries one of theirs.
                let delivery::Scanned {
                    pin: delivered_pin,
                    command_headers,
                } = delivery::scan(message.headers.as_ref());
                if let Some(delivered_pin) = delivered_pin
                    && pin.as_deref() != Some(delivered_pin)
                {
                    if pin.is_none()
                        && let Some(sent) = unpinned_sent
                    {
                        // Its other pulls without the pin id wait to their expiry now.
                        requested.pinned(settings.batch, sent, forget_after);
                    }
                    tracing::debug!(pin = delivered_pin, requested = ?requested, "pinned");
                    pin = Some(Arc::from(delivered_pin));
                }
                requested.delivered();
                let Some(reply) = message.reply else { continue };
                let Some(AckInfo {
                    stream_seq: seq,
                    deliveries,
                    consumer_seq,
                    pending,
                }) = ack_info(&reply)
                else {
                    tracing::warn!(%reply, "delivery with an unreadable ack subject");
                    continue;
                };
                tracing::trace!(target: crate::telemetry::STAGE_TARGET, seq, reply = reply.as_str(), "pulled");
                if pin != last_pin {
                    last_pin = pin.clone();
                    last_consumer_seq = None;
                }
                if let (Some(last), Some(pin)) = (last_consumer_seq, &pin)
                    && consumer_seq > last + 1
                {
                    tracing::warn!(from = last, to = consumer_seq, "deliveries lost in transit");
                    if !flush(&mut delivered) || !sink(PinSignal::Gap { pin: pin.clone() }) {
                        return Ok(Ended::OwnerGone);
                    }
                }
                last_consumer_seq =
                    Some(last_consumer_seq.map_or(consumer_seq, |l| l.max(consumer_seq)));
                let respond_to = respond_to(command_headers);
                let trace = trace_of(command_headers);
                let timer = crate::data::timers::firing_of(command_headers);
                let delivery = Delivery {
                    origin: crate::data::origin::origin_of(command_headers),
                    timer,
                    wake: is_wake(command_headers),
                    respond_to,
                    pin: pin.clone().unwrap_or_else(|| Arc::from("")),
                    subject: message.subject,
                    reply,
                    payload: message.payload,
                    seq,
                    deliveries,
                    pending,
                    trace,
                };
                if delivered.capacity() == 0 {
                    delivered.reserve(
                        last_burst
                            .load(Ordering::Relaxed)
                            .clamp(1, MAX_DELIVERIES_PER_SIGNAL),
                    );
                }
                delivered.push(delivery);
            }
            Some(StatusCode::IDLE_HEARTBEAT) => {}
            Some(StatusCode::PIN_ID_MISMATCH) => {
                requested.ended(pending_of(message.headers.as_ref()), settings.batch);
                if let Some(lost) = pin.take() {
                    tracing::debug!(pin = %lost, "pin lost");
                    lost_pin.send_replace(Some(lost.clone()));
                    if !flush(&mut delivered) || !sink(PinSignal::Lost { pin: lost }) {
                        return Ok(Ended::OwnerGone);
                    }
                }
            }
            Some(StatusCode::TIMEOUT) | Some(StatusCode::NOT_FOUND) => {
                requested.ended(pending_of(message.headers.as_ref()), settings.batch);
                tracing::trace!(?requested, "pull request ended");
            }
            Some(StatusCode::NO_RESPONDERS) => {
                requested.ended(None, settings.batch);
                let wait = refused.map_or(NO_RESPONDERS_FIRST_WAIT, |(_, next)| next);
                refused = Some((
                    Instant::now() + wait,
                    (wait * 2).min(NO_RESPONDERS_MAX_WAIT),
                ));
                tracing::warn!(
                    ?wait,
                    "pull request ended: no responders; pulling again after a wait"
                );
                // The consumer's leader is gone, and what it delivered last may be too.
                if pin.is_some() {
                    tail.suspect(Instant::now(), "the consumer has no leader");
                }
            }
            Some(status) => {
                requested.ended(pending_of(message.headers.as_ref()), settings.batch);
                tracing::warn!(%status, description = ?message.description, "pull request ended");
            }
        }
    }
}

fn pull_request(batch: u32, expires: Duration, pin: Option<&str>) -> String {
    let expires = expires.as_nanos();
    match pin {
        Some(pin) => format!(
            r#"{{"batch":{batch},"expires":{expires},"group":"{PRIORITY_GROUP}","id":"{pin}"}}"#
        ),
        None => format!(r#"{{"batch":{batch},"expires":{expires},"group":"{PRIORITY_GROUP}"}}"#),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// A consumer with no responders (no leader, or none at all) answers every pull `503` at
    /// once: the loop waits before each next pull, and pulls on once the consumer is there.
    #[tokio::test]
    async fn a_consumer_without_responders_is_pulled_again_only_after_a_wait() {
        assert_eq!(jetshard_testkit::PINNED_GROUP, PRIORITY_GROUP);
        let server = jetshard_testkit::NatsServer::start()
            .await
            .expect("nats-server");
        let client = async_nats::connect(server.url()).await.expect("connect");
        let js = async_nats::jetstream::new(client.clone());
        let delivered = Arc::new(AtomicUsize::new(0));
        let seen = delivered.clone();
        let (_resumes, resumed) = watch::channel(());
        let sent = || client.statistics().out_messages.load(Ordering::Relaxed);
        let before = sent();
        let settings = PullSettings {
            batch: 8,
            expires: Duration::from_millis(500),
        };
        let consumer = jetshard_testkit::PINNED_CONSUMER;
        let _pulls = start(
            js.clone(),
            js.get_stream_no_info("later").await.expect("stream handle"),
            "later",
            consumer,
            settings,
            resumed,
            move |signal| {
                if let PinSignal::Delivered(commands) = signal {
                    seen.fetch_add(commands.len(), Ordering::Relaxed);
                }
                true
            },
        );
        // The measured interval, not a wait for an event: what the loop sends in one second.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let pulls = sent() - before;
        // 10 + 20 + 40 + 80 + 160 + 250 + 250 + 250 ms: 9 pulls in the second at the most.
        assert!(
            (2..=12).contains(&pulls),
            "{pulls} pulls in a second of 503s"
        );
        jetshard_testkit::pinned_pull_consumer(&js, "later", "later.>")
            .await
            .expect("the pinned consumer");
        js.publish("later.a", "one".into())
            .await
            .expect("publish")
            .await
            .expect("stored");
        let deadline = Instant::now() + Duration::from_secs(10);
        while delivered.load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < deadline, "never delivered");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[test]
    fn pull_requests_carry_the_group_and_the_pin_once_pinned() {
        let standby: serde_json::Value =
            serde_json::from_str(&pull_request(10, Duration::from_millis(500), None)).unwrap();
        assert_eq!(standby["group"], "owners");
        assert_eq!(standby["expires"], 500_000_000);
        assert!(standby.get("id").is_none());
        let pinned: serde_json::Value =
            serde_json::from_str(&pull_request(10, Duration::from_millis(500), Some("abc")))
                .unwrap();
        assert_eq!(pinned["id"], "abc");
        assert_eq!(pinned["batch"], 10);
    }
}
