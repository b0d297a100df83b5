//! The last record of every subject of many entities, in one direct get (`multi_last`): what a
//! pull burst's new entities are loaded from together.
//!
//! Any replica of the journal may answer a direct get, and a follower holds a prefix of the
//! stream, possibly short of the leader's. The server ends the answer with the last sequence of
//! its own stream (`Nats-UpTo-Sequence`) when the request names none: the answer is complete
//! for every record at or below it. So an answer is taken only if that reaches the caller's
//! watermark (a sequence every record it needs is at or below); otherwise it is asked again
//! a little later (another replica may answer, or the same one have caught up) and at last
//! given up.

use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream::message::StreamMessage;

use super::direct::{self, Ended};
use crate::error::Error;

/// The most messages a `multi_last` direct get answers with (the server's limit).
pub(crate) const MAX_MESSAGES: usize = 1024;

/// How often a request whose answer is short of the watermark is sent again.
const ATTEMPTS: usize = 3;

/// The wait before the second ask (twice as long before the third).
const RETRY_AFTER: Duration = Duration::from_millis(20);

/// The request's body: serialized straight from the filters (a `serde_json::Value` would copy
/// each of them first).
#[derive(serde::Serialize)]
struct MultiLast<'a> {
    multi_last: &'a [String],
    batch: usize,
}

/// The last record of each subject matching the filters, as of `upto`.
#[derive(Debug)]
pub(crate) struct LastRecords {
    /// The answering replica's last stream sequence: every record at or below it is accounted.
    pub(crate) upto: u64,
    pub(crate) messages: Vec<StreamMessage>,
}

/// The last record of every subject matching `filters` (wildcards allowed) in `stream`, read
/// with one direct get (counted in `requests`), complete for every record at or below
/// `watermark`; `None` if no answer
/// reached it in [`ATTEMPTS`] (a replica far behind), or the answer did not fit one reply.
///
/// `filters` must match at least one record at or below `watermark` (a partition's fence
/// subject, say): the server answers "no results" without its last sequence, which proves
/// nothing.
pub(crate) async fn last_records(
    client: &Client,
    stream: &str,
    filters: &[String],
    watermark: u64,
    requests: &mut u64,
) -> Result<Option<LastRecords>, Error> {
    let body = serde_json::to_vec(&MultiLast {
        multi_last: filters,
        batch: MAX_MESSAGES,
    })
    .map_err(|e| Error::jetstream(format!("read the last records of {stream}"), e))?;
    let body = bytes::Bytes::from(body);
    for attempt in 1..=ATTEMPTS {
        *requests += 1;
        let answer = ask(client, stream, body.clone()).await?;
        match answer {
            Some(answer) if answer.upto >= watermark => return Ok(Some(answer)),
            Some(answer) => tracing::debug!(
                stream,
                attempt,
                upto = answer.upto,
                watermark,
                "multi_last answer from a replica behind the watermark; asked again"
            ),
            None => return Ok(None),
        }
        if attempt < ATTEMPTS {
            // A replica behind is usually milliseconds behind, and the same one may answer
            // again (each request goes to a replica chosen at random: `nats_facts.rs`): give
            // it that time.
            tokio::time::sleep(RETRY_AFTER * attempt as u32).await;
        }
    }
    Ok(None)
}

/// One `multi_last` request and its answer; `None` if it proves nothing (no results, or more
/// than one reply holds).
async fn ask(
    client: &Client,
    stream: &str,
    body: bytes::Bytes,
) -> Result<Option<LastRecords>, Error> {
    let answer = direct::ask(client, stream, body, None)
        .await
        .map_err(|e| Error::jetstream(format!("read the last records of {stream}"), e))?;
    Ok(match answer.ended {
        Ended::Batch {
            upto: Some(upto),
            pending,
        } if pending.is_none_or(|p| p == 0) => Some(LastRecords {
            upto,
            messages: answer.messages,
        }),
        Ended::Batch { .. } | Ended::NotFound => None,
    })
}

#[cfg(test)]
mod tests {
    use async_nats::jetstream::{self, Context, stream};
    use jetshard_testkit::{NatsCluster, NatsServer};

    use super::*;

    /// A journal like jetshard's (direct gets allowed), `replicas` of it.
    async fn journal(js: &Context, replicas: usize) {
        js.create_stream(stream::Config {
            name: "T".to_owned(),
            subjects: vec!["t.>".to_owned()],
            allow_direct: true,
            num_replicas: replicas,
            ..Default::default()
        })
        .await
        .expect("create the stream");
        jetshard_testkit::wait_stream_writable(js, "t.fence.0", Duration::from_secs(30))
            .await
            .expect("the stream takes writes");
    }

    /// Stores each subject's record in turn, with a header naming its place; the last sequence.
    async fn store(js: &Context, subjects: &[&str]) -> u64 {
        let mut last = 0;
        for (i, subject) in subjects.iter().enumerate() {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Place", i.to_string());
            last = js
                .publish_with_headers(subject.to_string(), headers, "r".into())
                .await
                .expect("publish")
                .await
                .expect("stored")
                .sequence;
        }
        last
    }

    const HISTORY: [&str; 10] = [
        "t.fence.0",
        "t.evt.0.a",
        "t.evt.0.a",
        "t.snap.0.a",
        "t.tmr.0.a",
        "t.evt.0.b",
        "t.dlq.0.b",
        "t.evt.0.c",
        "t.evt.1.a",
        "t.evt.0.a",
    ];

    fn filters() -> Vec<String> {
        ["t.*.0.a", "t.*.0.b", "t.*.0.nobody", "t.fence.0"]
            .map(str::to_owned)
            .to_vec()
    }

    /// `(subject, sequence, place header)` of each message, sorted by sequence.
    fn seen(answer: &LastRecords) -> Vec<(String, u64, String)> {
        let mut seen: Vec<_> = answer
            .messages
            .iter()
            .map(|m| {
                let place = m.headers.get("Place").map(|v| v.as_str().to_owned());
                (m.subject.to_string(), m.sequence, place.unwrap_or_default())
            })
            .collect();
        seen.sort_by_key(|(_, seq, _)| *seq);
        seen
    }

    fn expected() -> Vec<(String, u64, String)> {
        // The last record of each subject matching a filter (sequences from 1).
        [
            ("t.fence.0", 1),
            ("t.snap.0.a", 4),
            ("t.tmr.0.a", 5),
            ("t.evt.0.b", 6),
            ("t.dlq.0.b", 7),
            ("t.evt.0.a", 10),
        ]
        .map(|(s, seq)| (s.to_owned(), seq, (seq - 1).to_string()))
        .to_vec()
    }

    /// A server whose journal holds [`HISTORY`]; a client; the last sequence.
    async fn one_server_with_history() -> (NatsServer, async_nats::Client, u64) {
        let server = NatsServer::start().await.expect("start nats-server");
        let client = server.connect().await.expect("connect");
        let js = jetstream::new(client.clone());
        journal(&js, 1).await;
        let last = store(&js, &HISTORY).await;
        (server, client, last)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn one_request_answers_the_last_record_of_every_subject_of_each_entity() {
        let (_server, client, last) = one_server_with_history().await;
        let mut requests = 0;
        let answer = last_records(&client, "T", &filters(), last, &mut requests)
            .await
            .expect("read")
            .expect("complete");
        assert_eq!(answer.upto, last);
        assert_eq!(seen(&answer), expected());
        assert_eq!(requests, 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_answer_short_of_the_watermark_is_asked_again_and_then_refused() {
        let (_server, client, last) = one_server_with_history().await;
        // As a replica that has not got the last record yet answers.
        let mut requests = 0;
        let answer = last_records(&client, "T", &filters(), last + 1, &mut requests)
            .await
            .expect("read");
        assert!(answer.is_none(), "{answer:?}");
        assert_eq!(requests, ATTEMPTS as u64);
        // Nothing matching at all: "no results" carries no last sequence, so proves nothing.
        let nothing = ["t.*.0.nobody".to_owned()];
        let answer = last_records(&client, "T", &nothing, 0, &mut requests)
            .await
            .expect("read");
        assert!(answer.is_none(), "{answer:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_journal_without_direct_gets_fails_the_read_at_once() {
        let server = NatsServer::start().await.expect("start nats-server");
        let client = server.connect().await.expect("connect");
        let js = jetstream::new(client.clone());
        js.create_stream(stream::Config {
            name: "T".to_owned(),
            subjects: vec!["t.>".to_owned()],
            ..Default::default()
        })
        .await
        .expect("create the stream");
        let last = store(&js, &HISTORY).await;
        let started = std::time::Instant::now();
        let mut requests = 0;
        let answer = last_records(&client, "T", &filters(), last, &mut requests).await;
        // No responders: each entity then loads alone, through the API.
        assert!(answer.is_err(), "{answer:?}");
        assert!(
            started.elapsed() < direct::TIMEOUT,
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_a_cluster_every_replica_answers_complete_up_to_its_own_last_sequence() {
        let cluster = NatsCluster::start(3).await.expect("start the cluster");
        let js = jetstream::new(cluster.connect().await.expect("connect"));
        journal(&js, 3).await;
        let last = store(&js, &HISTORY).await;
        // A client on each server (a server prefers its own replica's queue subscription for
        // the direct get, when it has one).
        for node in cluster.nodes() {
            let client = node.connect().await.expect("connect");
            let client = &client;
            jetshard_testkit::wait_until(Duration::from_secs(30), "a complete answer", || async {
                let mut requests = 0;
                let answer = last_records(client, "T", &filters(), last, &mut requests)
                    .await
                    .expect("read");
                // Whatever is taken is right: it is complete up to the watermark.
                if let Some(answer) = &answer {
                    assert!(answer.upto >= last);
                    assert_eq!(seen(answer), expected());
                }
                answer.is_some()
            })
            .await
            .expect("every replica catches up");
        }
    }
}
