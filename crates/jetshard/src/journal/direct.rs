//! One direct get answered by several messages (`{"seq","next_by_subj","batch"}`,
//! `{"multi_last",..}`): the request, its messages in the order they came, and how the answer
//! ended. Any replica of the stream may answer (the server gives a client's request to one at
//! random, `tests/tests/nats_facts.rs`); what an answer proves is the caller's to judge.

use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream::message::StreamMessage;
use bytes::Bytes;
use futures::StreamExt;

use crate::wire::{HDR_NUM_PENDING, HDR_UPTO_SEQUENCE, direct_get_subject};

/// How long one answer may take, all its messages together.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(5);

/// `204 EOB`: the answer's last message, with its headers.
const END_OF_BATCH: u16 = 204;
/// `404`: nothing on the filter at or past the sequence asked.
const NOT_FOUND: u16 = 404;

/// How an answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// With its end-of-batch message.
    Batch {
        /// How many more messages on the filter the answering replica holds past those sent
        /// (`Nats-Num-Pending`).
        pending: Option<u64>,
        /// The answering replica's last stream sequence (`Nats-UpTo-Sequence`, sent when the
        /// request named none).
        upto: Option<u64>,
    },
    /// "Not found": nothing on the filter (at or past the sequence asked).
    NotFound,
}

/// A direct get's answer.
#[derive(Debug)]
pub(crate) struct DirectAnswer {
    /// Its messages, as they came.
    pub(crate) messages: Vec<StreamMessage>,
    pub(crate) ended: Ended,
}

/// Sends `body` as a direct get of `stream` and collects the answer; `Err` (why) when it failed
/// or did not end in time: within [`TIMEOUT`] in all, and, if a `silence` is given, with no
/// more than it between two of its messages (a replica stalled while its peers still count it
/// a subscriber sends nothing; one that answers sends its messages back to back).
pub(crate) async fn ask(
    client: &Client,
    stream: &str,
    body: Bytes,
    silence: Option<Duration>,
) -> Result<DirectAnswer, String> {
    let inbox = client.new_inbox();
    let mut answers = client
        .subscribe(inbox.clone())
        .await
        .map_err(|e| e.to_string())?;
    client
        .publish_with_reply(direct_get_subject(stream), inbox, body)
        .await
        .map_err(|e| e.to_string())?;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let mut messages = Vec::new();
    loop {
        let wait = silence.map_or(deadline, |s| deadline.min(tokio::time::Instant::now() + s));
        let message = match tokio::time::timeout_at(wait, answers.next()).await {
            Ok(Some(message)) => message,
            Ok(None) => return Err("the subscription ended".to_owned()),
            Err(_) if wait < deadline => return Err(format!("silent for {silence:?}")),
            Err(_) => return Err(format!("no whole answer in {TIMEOUT:?}")),
        };
        let ended = match message.status.map(|s| s.as_u16()) {
            None => {
                messages.push(StreamMessage::try_from(message).map_err(|e| e.to_string())?);
                continue;
            }
            Some(END_OF_BATCH) => {
                let header = |name: &str| {
                    message
                        .headers
                        .as_ref()
                        .and_then(|h| h.get(name))
                        .and_then(|v| v.as_str().parse::<u64>().ok())
                };
                Ended::Batch {
                    pending: header(HDR_NUM_PENDING),
                    upto: header(HDR_UPTO_SEQUENCE),
                }
            }
            Some(NOT_FOUND) => Ended::NotFound,
            Some(status) => {
                let description = message.description.unwrap_or_default();
                return Err(format!("{status} {description}"));
            }
        };
        return Ok(DirectAnswer { messages, ended });
    }
}
