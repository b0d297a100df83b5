//! The overload scenario's producer: it sends a command again when its acknowledgement does
//! not come, as a producer facing a frozen stream leader must.

use std::collections::VecDeque;
use std::future::IntoFuture as _;
use std::pin::Pin;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::publish::PublishAck;
use tokio::time::Instant;

use super::ENTITY_TYPE;
use crate::load::PUBLISH_WINDOW;

/// How long a publish answered "no stream" (a leader being elected) waits to be sent again.
const NO_STREAM_PAUSE: Duration = Duration::from_millis(100);

/// How many times a command is published before the run gives up.
const PUBLISH_ATTEMPTS: usize = 300;

/// Commands published and not yet acknowledged, in publish order, each with what it takes to
/// publish it again: a publish forwarded to a frozen stream leader is lost with it, and one made
/// while a leader is elected is answered "no stream"; a producer sends it again, after its
/// acknowledgement's timeout (the client's default) or a pause, under the same message id so
/// that the command stream stores it once. On one server a frozen
/// server answers every publish after it resumes: the first attempt is acknowledged.
pub(super) struct Resending {
    in_flight: VecDeque<InFlight>,
    /// How long a publish waits for its acknowledgement before it is sent again.
    resend_after: Duration,
}

/// A command published and not yet acknowledged.
struct InFlight {
    ack: Pin<Box<dyn Future<Output = Result<PublishAck, PublishError>> + Send>>,
    /// When it is sent again if not acknowledged by then.
    resend_at: Instant,
    attempts: usize,
    subject: String,
    payload: bytes::Bytes,
    id: String,
}

impl InFlight {
    async fn publish(
        &mut self,
        js: &async_nats::jetstream::Context,
        resend_after: Duration,
    ) -> anyhow::Result<()> {
        let publish = PublishMessage::build()
            .payload(self.payload.clone())
            .message_id(self.id.as_str());
        let ack = js
            .send_publish(self.subject.clone(), publish)
            .await
            .context("publish a command")?;
        self.ack = Box::pin(ack.into_future());
        self.resend_at = Instant::now() + resend_after;
        self.attempts += 1;
        Ok(())
    }
}

impl Resending {
    pub(super) fn new(resend_after: Duration) -> Self {
        Self {
            in_flight: VecDeque::new(),
            resend_after,
        }
    }

    /// Publishes the `i`-th command; waits for the oldest while more than [`PUBLISH_WINDOW`]
    /// are in flight.
    pub(super) async fn push(
        &mut self,
        js: &async_nats::jetstream::Context,
        subject: String,
        payload: bytes::Bytes,
        i: usize,
    ) -> anyhow::Result<()> {
        let mut command = InFlight {
            ack: Box::pin(std::future::pending()),
            resend_at: Instant::now(),
            attempts: 0,
            subject,
            payload,
            id: format!("{ENTITY_TYPE}-{i}"),
        };
        command.publish(js, self.resend_after).await?;
        self.in_flight.push_back(command);
        while self.in_flight.len() > PUBLISH_WINDOW {
            self.settle_oldest(js).await?;
        }
        Ok(())
    }

    /// Waits until every command is acknowledged.
    pub(super) async fn drain(
        &mut self,
        js: &async_nats::jetstream::Context,
    ) -> anyhow::Result<()> {
        while !self.in_flight.is_empty() {
            self.settle_oldest(js).await?;
        }
        Ok(())
    }

    /// Waits for the oldest's acknowledgement; at its deadline, sends again every command
    /// past its own (all lost with the same leader, found out at once, not one by one).
    async fn settle_oldest(&mut self, js: &async_nats::jetstream::Context) -> anyhow::Result<()> {
        loop {
            let Some(oldest) = self.in_flight.front_mut() else {
                return Ok(());
            };
            match tokio::time::timeout_at(oldest.resend_at, &mut oldest.ack).await {
                Ok(Ok(_)) => {
                    self.in_flight.pop_front();
                    return Ok(());
                }
                // No stream leader to take it yet (one is being elected): every command in
                // flight is sent again, after a pause; those stored already are acknowledged
                // as duplicates.
                Ok(Err(error)) if error.kind() == PublishErrorKind::StreamNotFound => {
                    tokio::time::sleep(NO_STREAM_PAUSE).await;
                    self.send_again(js, |_| true).await?;
                }
                Ok(Err(error)) if error.kind() != PublishErrorKind::TimedOut => {
                    return Err(error).context("a publish was refused");
                }
                Ok(Err(_)) | Err(_) => {
                    let now = Instant::now();
                    self.send_again(js, |command| command.resend_at <= now)
                        .await?;
                }
            }
        }
    }

    /// Sends again every command in flight that `due` picks.
    async fn send_again(
        &mut self,
        js: &async_nats::jetstream::Context,
        due: impl Fn(&InFlight) -> bool,
    ) -> anyhow::Result<()> {
        for command in self.in_flight.iter_mut().filter(|c| due(c)) {
            anyhow::ensure!(
                command.attempts < PUBLISH_ATTEMPTS,
                "a publish was not acknowledged in {PUBLISH_ATTEMPTS} attempts"
            );
            command.publish(js, self.resend_after).await?;
        }
        Ok(())
    }
}
