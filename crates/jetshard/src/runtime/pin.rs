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
//! or not, besides those that keep `batch` commands requested.
//!
//! What is still requested is counted over all open pull requests together ([`Requested`]),
//! never per request: the server hands a consumer's messages to its open requests in turn (a
//! request that still wants more goes to the back of its queue), and a status ending a request
//! says how many it had not been given (`Nats-Pending-Messages`). Which request a message
//! answered cannot be told, so a count per request drifts; the sum does not.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::Context;
use async_nats::{Client, StatusCode, Subject};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::trace::CommandTrace;
use crate::wire::{
    HDR_PENDING_MESSAGES, HDR_PIN_ID, HDR_REPLY_TO, HDR_TRACEPARENT, PRIORITY_GROUP,
};

/// A command delivered to this process, with the pin it came under.
#[derive(Debug)]
pub(crate) struct Delivery {
    pub(crate) pin: Arc<str>,
    /// The stored subject, `<t>.cmd.<p>.<id>`.
    pub(crate) subject: Subject,
    /// Where acknowledgements go (`$JS.ACK...`).
    pub(crate) reply: Subject,
    pub(crate) payload: Bytes,
    /// The command's sequence in the command stream.
    pub(crate) seq: u64,
    /// How often it has been delivered, this time included.
    pub(crate) deliveries: u64,
    /// Where the client wants the outcome (`Jetshard-Reply-To`).
    pub(crate) respond_to: Option<Subject>,
    /// The consumer's commands not delivered yet, as the server counted at this delivery.
    pub(crate) pending: u64,
    /// The command's trace context, if it came with a valid `traceparent`.
    pub(crate) trace: Option<Box<CommandTrace>>,
    /// Which timer fired, if it is a timer's command (`Jetshard-Timer`).
    pub(crate) timer: Option<crate::data::timers::Firing>,
    /// A wake-up (`Jetshard-Wake`, see [`wake`]): acknowledged, routed to no entity.
    pub(crate) wake: bool,
}

/// Whether a stored command is a wake-up (see [`wake`]).
pub(crate) fn is_wake(headers: Option<&async_nats::HeaderMap>) -> bool {
    headers.is_some_and(|h| h.get(crate::wire::HDR_WAKE).is_some())
}

/// Sends a wake-up to `partition`: a command for no entity, so that the server pins a standby
/// at once although no command of an entity is waiting (a partition is owned only while it
/// has a command to deliver). The new owner reads the partition's armed timers on acquisition
/// and fires those due; the wake-up itself is acknowledged and routed nowhere. Sent after a
/// dead owner's partition is unpinned (`crash.rs`) and by an owner that lets its partition go
/// with timers armed: otherwise those timers would wait for the partition's next command.
pub(crate) async fn wake(
    js: &async_nats::jetstream::Context,
    names: &crate::wire::Names,
    partition: u32,
    partitions: u32,
) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(crate::wire::HDR_WAKE, "1");
    let subject = names.wake_subject(partition, partitions);
    let stored = match js
        .publish_with_headers(subject, headers, Bytes::new())
        .await
    {
        Ok(ack) => ack.await.map(drop).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match stored {
        Ok(()) => tracing::debug!(partition, "woke the partition"),
        Err(e) => {
            tracing::warn!(partition, error = %e, "wake-up not sent; the partition's timers wait for its next command");
        }
    }
}

/// The `Jetshard-Reply-To` subject of a command, if it has a valid one.
pub(crate) fn respond_to(headers: Option<&async_nats::HeaderMap>) -> Option<Subject> {
    let subject = headers?.get(HDR_REPLY_TO)?.as_str();
    let valid = !subject.is_empty() && !subject.contains(['*', '>', ' ', '\t', '\r', '\n']);
    valid.then(|| Subject::from(subject))
}

/// The trace context of a command with a valid `traceparent` header.
pub(crate) fn trace_of(headers: Option<&async_nats::HeaderMap>) -> Option<Box<CommandTrace>> {
    CommandTrace::of(headers?.get(HDR_TRACEPARENT)?.as_str())
}

/// Reads the stream sequence and delivery count from a `$JS.ACK` reply subject, in either
/// layout (ADR-15): `<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>`,
/// or with `<domain>.<account hash>.` in front and optional tokens after.
pub(crate) fn ack_info(reply: &str) -> Option<AckInfo> {
    let tokens: Vec<&str> = reply
        .strip_prefix(crate::wire::ACK_PREFIX)?
        .split('.')
        .collect();
    let first = match tokens.len() {
        7 => 2,
        n if n >= 9 => 4,
        _ => return None,
    };
    Some(AckInfo {
        deliveries: tokens[first].parse().ok()?,
        stream_seq: tokens[first + 1].parse().ok()?,
        consumer_seq: tokens[first + 2].parse().ok()?,
        pending: tokens
            .get(first + 4)
            .and_then(|t| t.parse().ok())
            .unwrap_or(0),
    })
}

/// What a `$JS.ACK` reply subject tells of a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AckInfo {
    pub(crate) stream_seq: u64,
    pub(crate) deliveries: u64,
    /// The consumer's delivery counter: it rises by one with every delivery, so a jump means a
    /// delivery to this process was lost on the way (a dropped connection).
    pub(crate) consumer_seq: u64,
    /// The consumer's pending count after this delivery: commands stored and not delivered yet.
    pub(crate) pending: u64,
}

/// What the pull loop tells its owner.
pub(crate) enum PinSignal {
    /// A command was delivered.
    Delivered(Delivery),
    /// The server refused a pull carrying `pin`: another process holds the partition now.
    Lost { pin: Arc<str> },
    /// A delivery under `pin` never arrived (the consumer's delivery counter jumped): later
    /// commands must not overtake it.
    Gap { pin: Arc<str> },
    /// Pulling is paused and no pull request of this loop without the pin id is open at the
    /// server any more: an unpin cannot pin this process again (the open pulls that carry the
    /// pin id are ended with 423 by the unpin). Deliveries to those may still arrive until then.
    Idle,
    /// The loop has ended (its subscription closed, or the client failed): nothing more will be
    /// delivered here until a new loop is started.
    Ended { reason: String },
}

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
}

impl Drop for PullLoop {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts pulling `consumer` on `stream`. `sink` receives the signals; when it returns `false`
/// (the owner is gone) the loop ends.
pub(crate) fn start(
    js: Context,
    stream: &str,
    consumer: &str,
    settings: PullSettings,
    sink: impl Fn(PinSignal) -> bool + Send + Sync + 'static,
) -> PullLoop {
    let request_subject = crate::wire::pull_request_subject(stream, consumer);
    let consumer = consumer.to_owned();
    let (paused, paused_rx) = watch::channel(false);
    let (forget, forget_rx) = watch::channel(None);
    let task = tokio::spawn(async move {
        let signals = Signals {
            paused: paused_rx,
            forget: forget_rx,
        };
        let reason = match run(js, request_subject, settings, signals, &sink).await {
            Ok(Ended::OwnerGone) => return,
            Ok(Ended::SubscriptionClosed) => "its subscription closed".to_owned(),
            Err(e) => e.to_string(),
        };
        tracing::error!(consumer = %consumer, %reason, "pull loop ended");
        sink(PinSignal::Ended { reason });
    });
    PullLoop {
        task,
        paused,
        forget,
    }
}

/// What the owner tells a running loop.
struct Signals {
    paused: watch::Receiver<bool>,
    forget: watch::Receiver<Option<Arc<str>>>,
}

/// Why a loop ended without an error.
enum Ended {
    /// The owner is gone: nobody to tell.
    OwnerGone,
    SubscriptionClosed,
}

/// The messages this loop's open pull requests still ask for, summed over all of them.
///
/// Exact while the connection holds: a request adds its batch, every delivery takes one, and a
/// status that ends a request takes what the server says that request had not been given. A
/// request the server fills ends without a status, and the deliveries have already taken its
/// whole batch. Requests lost with a connection end without either; no request outlives its
/// `expires` at the server, so once the newest is older than that (plus a margin) nothing can
/// still be open, and the count starts again from zero.
#[derive(Debug, Default)]
struct Requested {
    messages: u64,
    /// When the newest request was sent.
    last_sent: Option<Instant>,
}

impl Requested {
    fn sent(&mut self, batch: u32, now: Instant) {
        self.messages += u64::from(batch);
        self.last_sent = Some(now);
    }

    fn delivered(&mut self) {
        self.messages = self.messages.saturating_sub(1);
    }

    /// A status ended one request: `pending` is what it had not been given (from the status's
    /// `Nats-Pending-Messages`); a status without one refused the request before delivering
    /// anything (`batch`).
    fn ended(&mut self, pending: Option<u64>, batch: u32) {
        let undelivered = pending.unwrap_or(u64::from(batch));
        self.messages = self.messages.saturating_sub(undelivered);
    }

    /// Forgets requests that cannot be open any more: once the newest was sent `forget_after`
    /// ago, every one has expired at the server, answered or lost.
    fn expire(&mut self, now: Instant, forget_after: Duration) {
        if self
            .last_sent
            .is_some_and(|sent| now >= sent + forget_after)
        {
            self.messages = 0;
        }
    }

    /// No request of this loop can still deliver.
    fn is_empty(&self) -> bool {
        self.messages == 0
    }

    /// Whether to send another request now: when at most half a batch is still asked for, or
    /// when the newest request is `expires` old (the pin lives only on fresh requests).
    fn wants_pull(&self, batch: u32, expires: Duration, now: Instant) -> bool {
        self.messages <= u64::from(batch / 2)
            || self.last_sent.is_none_or(|sent| now >= sent + expires)
    }

    /// When the loop must wake to refresh its pull (running), or to notice that its requests
    /// have all ended (paused).
    fn wake_at(&self, paused: bool, expires: Duration, forget_after: Duration) -> Option<Instant> {
        let sent = self.last_sent?;
        match paused {
            false => Some(sent + expires),
            true if self.messages > 0 => Some(sent + forget_after),
            true => None,
        }
    }
}

/// `Nats-Pending-Messages` of a status, if it has one.
fn pending_of(headers: Option<&async_nats::HeaderMap>) -> Option<u64> {
    headers?
        .get(HDR_PENDING_MESSAGES)?
        .as_str()
        .trim()
        .parse()
        .ok()
}

async fn run(
    js: Context,
    request_subject: String,
    settings: PullSettings,
    signals: Signals,
    sink: &(impl Fn(PinSignal) -> bool + Sync),
) -> Result<Ended, async_nats::Error> {
    let Signals {
        mut paused,
        mut forget,
    } = signals;
    let client: Client = js.client();
    let inbox = client.new_inbox();
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
    // The consumer sequence of the last delivery under `last_pin`.
    let mut last_pin: Option<Arc<str>> = None;
    let mut last_consumer_seq: Option<u64> = None;

    loop {
        let now = Instant::now();
        requested.expire(now, forget_after);
        let reconnected = client.statistics().connects.load(Ordering::Relaxed);
        if reconnected != connects {
            // The old connection's requests may be gone without a word (the server drops a
            // request nobody listens to): count afresh. One that survived costs a spare pull.
            connects = reconnected;
            requested = Requested::default();
        }
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
                if !sink(PinSignal::Idle) {
                    return Ok(Ended::OwnerGone);
                }
            }
        } else {
            idle_reported = false;
        }
        if !is_paused && requested.wants_pull(settings.batch, expires, now) {
            let body = pull_request(settings.batch, expires, pin.as_deref());
            client
                .publish_with_reply(request_subject.clone(), inbox.clone(), body.into())
                .await?;
            requested.sent(settings.batch, now);
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

        let message = tokio::select! {
            message = subscription.next() => match message {
                Some(message) => message,
                None => return Ok(Ended::SubscriptionClosed),
            },
            () = tokio::time::sleep_until(wake_at) => continue,
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
        };
        match message.status {
            None | Some(StatusCode::OK) => {
                requested.delivered();
                let delivered_pin = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(HDR_PIN_ID))
                    .map(|v| v.as_str());
                if let Some(delivered_pin) = delivered_pin
                    && pin.as_deref() != Some(delivered_pin)
                {
                    tracing::debug!(pin = delivered_pin, "pinned");
                    pin = Some(Arc::from(delivered_pin));
                }
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
                if pin != last_pin {
                    last_pin = pin.clone();
                    last_consumer_seq = None;
                }
                if let (Some(last), Some(pin)) = (last_consumer_seq, &pin)
                    && consumer_seq > last + 1
                {
                    tracing::warn!(from = last, to = consumer_seq, "deliveries lost in transit");
                    if !sink(PinSignal::Gap { pin: pin.clone() }) {
                        return Ok(Ended::OwnerGone);
                    }
                }
                last_consumer_seq =
                    Some(last_consumer_seq.map_or(consumer_seq, |l| l.max(consumer_seq)));
                let respond_to = respond_to(message.headers.as_ref());
                let trace = trace_of(message.headers.as_ref());
                let timer = crate::data::timers::firing_of(message.headers.as_ref());
                let delivery = Delivery {
                    timer,
                    wake: is_wake(message.headers.as_ref()),
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
                if !sink(PinSignal::Delivered(delivery)) {
                    return Ok(Ended::OwnerGone);
                }
            }
            Some(StatusCode::IDLE_HEARTBEAT) => {}
            Some(StatusCode::PIN_ID_MISMATCH) => {
                requested.ended(pending_of(message.headers.as_ref()), settings.batch);
                if let Some(lost) = pin.take() {
                    tracing::debug!(pin = %lost, "pin lost");
                    if !sink(PinSignal::Lost { pin: lost }) {
                        return Ok(Ended::OwnerGone);
                    }
                }
            }
            Some(StatusCode::TIMEOUT) | Some(StatusCode::NOT_FOUND) => {
                requested.ended(pending_of(message.headers.as_ref()), settings.batch);
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
    use std::collections::VecDeque;

    use super::*;

    #[test]
    fn ack_subjects_of_both_layouts_are_read() {
        let info = |stream_seq, deliveries, consumer_seq, pending| {
            Some(AckInfo {
                stream_seq,
                deliveries,
                consumer_seq,
                pending,
            })
        };
        assert_eq!(
            ack_info("$JS.ACK.C.p0.1.15.5.1795319414023821828.9"),
            info(15, 1, 5, 9)
        );
        assert_eq!(
            ack_info("$JS.ACK.C.p0.3.15.5.1795319414023821828.0"),
            info(15, 3, 5, 0)
        );
        assert_eq!(
            ack_info("$JS.ACK._.ACCHASH.C.p0.2.16.5.1795319414023821828.0.tok"),
            info(16, 2, 5, 0)
        );
        assert_eq!(
            ack_info("$JS.ACK._.ACCHASH.C.p0.2.16.5.1795319414023821828.0"),
            info(16, 2, 5, 0)
        );
        for bad in [
            "",
            "$JS.ACK.",
            "$JS.ACK.C.p0.x.15.5.1.0",
            "other.C.p0.1.15.5.1.0",
            "$JS.ACK.a.b.c",
        ] {
            assert_eq!(ack_info(bad), None, "{bad}");
        }
    }

    const EXPIRES: Duration = Duration::from_millis(500);

    /// The warm-pass stall of issue 11: two open requests served in turn, the older expiring
    /// partly served. Counting per request (deliveries taken from the oldest, a status ending
    /// the oldest) left 5 messages counted that nobody would deliver; a few such rounds and
    /// the loop believed half a batch was on its way, and pulled only once per `expires`.
    #[test]
    fn requests_served_in_turn_are_counted_exactly() {
        let now = Instant::now();
        let mut requested = Requested::default();
        requested.sent(10, now); // A
        (0..5).for_each(|_| requested.delivered());
        assert!(requested.wants_pull(10, EXPIRES, now), "half a batch left");
        requested.sent(10, now); // B
        // In turn: A gets 2 more (3 left), B gets 2 (8 left).
        (0..4).for_each(|_| requested.delivered());
        assert!(!requested.wants_pull(10, EXPIRES, now));
        requested.ended(Some(3), 10); // A expires
        assert_eq!(requested.messages, 8, "what B still asks for");
        // A backlog fills B, which ends without a status.
        (0..8).for_each(|_| requested.delivered());
        assert!(requested.is_empty());
        assert!(requested.wants_pull(10, EXPIRES, now));
    }

    /// The count equals the sum of what the server's open requests still ask for, whatever
    /// order they are served and ended in (a pseudo-random schedule of the server's rules).
    #[test]
    fn the_count_follows_the_servers_requests_through_any_schedule() {
        const BATCH: u32 = 16;
        let now = Instant::now();
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut random = move |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % n
        };
        let mut requested = Requested::default();
        // The server's waiting queue: what each open request still asks for.
        let mut server: VecDeque<u64> = VecDeque::new();
        for _ in 0..100_000 {
            match random(4) {
                0 if requested.wants_pull(BATCH, EXPIRES, now) => {
                    requested.sent(BATCH, now);
                    server.push_back(u64::from(BATCH));
                }
                1 | 2 => {
                    // A message to the first request, which then goes to the back.
                    if let Some(mut first) = server.pop_front() {
                        first -= 1;
                        requested.delivered();
                        if first > 0 {
                            server.push_back(first);
                        }
                    }
                }
                _ => {
                    // The oldest request expires, or a request is refused outright.
                    if random(2) == 0 {
                        if let Some(oldest) = server.pop_front() {
                            requested.ended(Some(oldest), BATCH);
                        }
                    } else if requested.wants_pull(BATCH, EXPIRES, now) {
                        requested.sent(BATCH, now);
                        requested.ended(None, BATCH);
                    }
                }
            }
            assert_eq!(requested.messages, server.iter().sum::<u64>());
        }
    }

    #[test]
    fn requests_lost_unanswered_are_forgotten_once_they_must_have_expired() {
        let now = Instant::now();
        let forget_after = EXPIRES + Duration::from_secs(1);
        let mut requested = Requested::default();
        assert_eq!(requested.wake_at(true, EXPIRES, forget_after), None);
        requested.sent(10, now);
        assert_eq!(
            requested.wake_at(false, EXPIRES, forget_after),
            Some(now + EXPIRES)
        );
        assert_eq!(
            requested.wake_at(true, EXPIRES, forget_after),
            Some(now + forget_after)
        );
        requested.expire(now + EXPIRES, forget_after);
        assert!(!requested.is_empty());
        assert!(
            requested.wants_pull(10, EXPIRES, now + EXPIRES),
            "stale: refresh the pin"
        );
        requested.expire(now + forget_after, forget_after);
        assert!(requested.is_empty());
        assert_eq!(requested.wake_at(true, EXPIRES, forget_after), None);
    }

    #[test]
    fn a_status_names_what_its_request_had_not_been_given() {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(HDR_PENDING_MESSAGES, "7");
        assert_eq!(pending_of(Some(&headers)), Some(7));
        assert_eq!(pending_of(Some(&async_nats::HeaderMap::new())), None);
        assert_eq!(pending_of(None), None);
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
