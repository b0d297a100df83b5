//! Answers to the server and to clients: acknowledgements (confirmed or not), unpinning, and
//! replies to a command's `Jetshard-Reply-To`.

use std::time::Duration;

use async_nats::client::traits::Publisher;
use async_nats::jetstream::message::AckKind;
use async_nats::message::OutboundMessage;
use async_nats::{Client, Subject};

use super::shared::Shared;
use crate::data::CommandOutcome;
use crate::reply::{Detail, ReplyBody};
use crate::trace::TraceParent;
use crate::wire::{HDR_TRACEPARENT, PRIORITY_GROUP};

/// Asks the server to move the pin at once instead of after the TTL; whether it did.
pub(super) async fn unpin(shared: &Shared, partition: u32) -> bool {
    let consumer = shared.names.consumer(partition);
    match shared
        .commands(partition)
        .unpin_consumer(&consumer, PRIORITY_GROUP)
        .await
    {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(partition, error = %e, "unpin failed; the pin moves after its TTL");
            false
        }
    }
}

/// Acknowledges one delivery (any kind): a core publish to its reply subject.
///
/// Published as a whole message ([`Publisher::publish_message`]), which takes the subject as
/// it is: `Client::publish` clones it first, and the first clone of a subject the client read
/// off the wire (every delivery's reply) allocates. Checked and sent the same way.
pub(super) async fn acknowledge(client: &Client, partition: u32, reply: Subject, kind: AckKind) {
    let ack = OutboundMessage {
        subject: reply,
        reply: None,
        payload: kind.into(),
        headers: None,
    };
    if let Err(e) = client.publish_message(ack).await {
        tracing::warn!(partition, error = %e, "acknowledgement not sent; the server will redeliver");
    }
}

/// Acknowledges one delivery and waits (bounded) for the server to confirm it.
pub(super) async fn acknowledge_confirmed(
    client: &Client,
    partition: u32,
    reply: Subject,
    kind: AckKind,
    timeout: Duration,
) {
    let request = client.request(reply, kind.into());
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(partition, error = %e, "acknowledgement not confirmed"),
        Err(_) => tracing::warn!(partition, "acknowledgement not confirmed in time"),
    }
}

/// Tells a client the outcome of its command (best effort: the outcome is in the journal),
/// under the command's span if it was traced.
pub(super) async fn respond(
    client: &Client,
    to: Subject,
    outcome: CommandOutcome,
    detail: Option<&Detail>,
    trace: Option<TraceParent>,
) {
    let Ok(body) = serde_json::to_vec(&ReplyBody::new(outcome, detail)) else {
        return;
    };
    let sent = match trace {
        Some(trace) => {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(HDR_TRACEPARENT, trace.to_string());
            client.publish_with_headers(to, headers, body.into()).await
        }
        None => client.publish(to, body.into()).await,
    };
    if let Err(e) = sent {
        tracing::debug!(error = %e, "outcome reply not sent");
    }
}
