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

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::Context;
use async_nats::{Client, StatusCode, Subject};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::trace::CommandTrace;
use crate::wire::{HDR_PIN_ID, HDR_REPLY_TO, HDR_TRACEPARENT, PRIORITY_GROUP};

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
    let tokens: Vec<&str> = reply.strip_prefix("$JS.ACK.")?.split('.').collect();
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
    let request_subject = format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}");
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

/// A pull request still open at the server, as far as this loop knows.
struct OpenPull {
    sent: Instant,
    remaining: u32,
    /// Whether it carried the pin id: when the pin is cleared, the server ends such a pull
    /// with 423 at once, so only pulls without it could pin this process again.
    with_pin: bool,
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
    let mut open: VecDeque<OpenPull> = VecDeque::new();
    let mut idle_reported = false;
    // The consumer sequence of the last delivery under `last_pin`.
    let mut last_pin: Option<Arc<str>> = None;
    let mut last_consumer_seq: Option<u64> = None;

    loop {
        let now = Instant::now();
        while open.front().is_some_and(|p| now >= p.sent + forget_after) {
            open.pop_front();
        }
        if let Some(forgotten) = forget.borrow_and_update().as_ref()
            && pin.as_ref() == Some(forgotten)
        {
            tracing::debug!(pin = %forgotten, "pin forgotten");
            pin = None;
        }
        let is_paused = *paused.borrow_and_update();
        if is_paused {
            // The next pull, after the pause, asks afresh.
            pin = None;
            if open.iter().all(|p| p.with_pin) && !idle_reported {
                idle_reported = true;
                if !sink(PinSignal::Idle) {
                    return Ok(Ended::OwnerGone);
                }
            }
        } else {
            idle_reported = false;
        }
        let requested: u32 = open.iter().map(|p| p.remaining).sum();
        let newest_is_fresh = open.back().is_some_and(|p| now < p.sent + expires);
        if !is_paused && (requested <= settings.batch / 2 || !newest_is_fresh) {
            let body = pull_request(settings.batch, expires, pin.as_deref());
            client
                .publish_with_reply(request_subject.clone(), inbox.clone(), body.into())
                .await?;
            open.push_back(OpenPull {
                sent: now,
                remaining: settings.batch,
                with_pin: pin.is_some(),
            });
        }
        // Running: wake to refresh the pull (and so the pin). Paused: wake when the oldest open
        // pull must have ended, or not at all.
        let wake_at = if is_paused {
            open.front()
                .map_or(now + Duration::from_secs(3600), |p| p.sent + forget_after)
        } else {
            open.back().map_or(now, |p| p.sent + expires)
        };

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
                if let Some(front) = open.front_mut() {
                    front.remaining = front.remaining.saturating_sub(1);
                    if front.remaining == 0 {
                        open.pop_front();
                    }
                }
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
                let delivery = Delivery {
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
                open.pop_front();
                if let Some(lost) = pin.take() {
                    tracing::debug!(pin = %lost, "pin lost");
                    if !sink(PinSignal::Lost { pin: lost }) {
                        return Ok(Ended::OwnerGone);
                    }
                }
            }
            Some(StatusCode::TIMEOUT) | Some(StatusCode::NOT_FOUND) => {
                open.pop_front();
            }
            Some(status) => {
                open.pop_front();
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
