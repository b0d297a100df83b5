//! Streams for tests: a stream with a consumer as jetshard's partitions have, and waiting for a
//! freshly created stream to take writes from a given connection.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, PriorityPolicy, pull};
use async_nats::jetstream::{self, context::PublishErrorKind, stream};

use crate::Error;

/// The pause between two probes.
const PROBE_INTERVAL: Duration = Duration::from_millis(20);

/// How long one probe waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The stream a probe names: none is ever called this, so the stream refuses the probe.
const NO_SUCH_STREAM: &str = "JETSHARD_TESTKIT_NO_SUCH_STREAM";

/// The durable name of [`pinned_pull_consumer`]'s consumer.
pub const PINNED_CONSUMER: &str = "c";

/// The priority group of [`pinned_pull_consumer`]'s consumer: jetshard's own.
pub const PINNED_GROUP: &str = "owners";

/// Creates a stream `name` taking `subjects`, with one durable pull consumer
/// [`PINNED_CONSUMER`] (explicit acks) in the priority group [`PINNED_GROUP`] under the
/// `pinned_client` policy with a 30 s pin TTL, as jetshard's partitions are: for tests of
/// pinned pulls against the real server.
///
/// # Errors
///
/// [`Error::JetStream`] when the stream or the consumer could not be created.
pub async fn pinned_pull_consumer(
    context: &jetstream::Context,
    name: &str,
    subjects: &str,
) -> Result<stream::Stream, Error> {
    let stream = context
        .create_stream(stream::Config {
            name: name.to_owned(),
            subjects: vec![subjects.to_owned()],
            ..Default::default()
        })
        .await
        .map_err(failed(format!("create the stream {name}")))?;
    stream
        .create_consumer(pull::Config {
            durable_name: Some(PINNED_CONSUMER.to_owned()),
            ack_policy: AckPolicy::Explicit,
            priority_policy: PriorityPolicy::PinnedClient,
            priority_groups: vec![PINNED_GROUP.to_owned()],
            priority_timeout: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .map_err(failed(format!("create the pinned consumer of {name}")))?;
    Ok(stream)
}

/// What a failed JetStream request of `action` becomes.
fn failed<E>(action: String) -> impl FnOnce(E) -> Error
where
    E: std::error::Error + Send + Sync + 'static,
{
    move |e| Error::JetStream {
        action,
        source: Box::new(e),
    }
}

/// Waits until a publish to `subject` through `context`'s connection reaches the stream that
/// stores it, for at most `deadline`.
///
/// On a cluster, a stream's leader subscribes to the stream's subjects once elected, and that
/// interest reaches the other servers over their routes a little later: for a moment after
/// the stream is created, a client connected to another server gets "no responders" for a
/// JetStream publish (async-nats: `StreamNotFound`), and the server drops a core publish (an
/// atomic batch's staged message) silently. A test that writes to a new replicated stream at
/// once waits here first.
///
/// Each probe names another stream in `Nats-Expected-Stream`: the stream answers it with an
/// error and stores nothing, so the stream's sequences are as they were.
///
/// # Errors
///
/// [`Error::Timeout`] when no probe was answered by the stream within `deadline`;
/// [`Error::ProbeStored`] if the stream stored a probe instead of refusing it.
///
/// # Examples
///
/// ```no_run
/// # async fn example(cluster: jetshard_testkit::NatsCluster) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use async_nats::jetstream::{self, stream};
///
/// let js = jetstream::new(cluster.connect().await?);
/// js.create_stream(stream::Config {
///     name: "ORDERS".to_owned(),
///     subjects: vec!["orders.>".to_owned()],
///     num_replicas: 3,
///     ..Default::default()
/// })
/// .await?;
/// jetshard_testkit::wait_stream_writable(&js, "orders.1", Duration::from_secs(10)).await?;
/// js.publish("orders.1", "first".into()).await?.await?;
/// # Ok(())
/// # }
/// ```
pub async fn wait_stream_writable(
    context: &jetstream::Context,
    subject: &str,
    deadline: Duration,
) -> Result<(), Error> {
    let probes = async {
        loop {
            if let Some(answered) = probe(context, subject).await {
                return answered;
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    };
    tokio::time::timeout(deadline, probes)
        .await
        .unwrap_or_else(|_| {
            Err(Error::Timeout {
                what: format!("the stream of {subject} to answer a publish"),
                after: deadline,
            })
        })
}

/// One probe: `None` when it did not reach the stream.
async fn probe(context: &jetstream::Context, subject: &str) -> Option<Result<(), Error>> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(async_nats::header::NATS_EXPECTED_STREAM, NO_SUCH_STREAM);
    let ack = context
        .publish_with_headers(subject.to_owned(), headers, "probe".into())
        .await
        .ok()?;
    match tokio::time::timeout(PROBE_TIMEOUT, ack).await {
        Ok(Ok(_)) => Some(Err(Error::ProbeStored {
            subject: subject.to_owned(),
        })),
        // No responders: the stream's interest has not reached this server yet.
        Ok(Err(e)) if e.kind() == PublishErrorKind::StreamNotFound => None,
        Ok(Err(e)) if e.kind() == PublishErrorKind::TimedOut => None,
        // The stream's refusal: it was reached.
        Ok(Err(_)) => Some(Ok(())),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use async_nats::jetstream::stream;

    use super::*;
    use crate::{NatsCluster, NatsServer};

    async fn create(js: &jetstream::Context, replicas: usize) {
        js.create_stream(stream::Config {
            name: "T".to_owned(),
            subjects: vec!["t.>".to_owned()],
            num_replicas: replicas,
            ..Default::default()
        })
        .await
        .expect("create the stream");
    }

    async fn messages(js: &jetstream::Context) -> u64 {
        js.get_stream("T")
            .await
            .expect("the stream")
            .info()
            .await
            .expect("its info")
            .state
            .messages
    }

    #[tokio::test]
    async fn a_stream_is_writable_once_created_and_a_probe_stores_nothing() {
        let server = NatsServer::start().await.expect("start nats-server");
        let js = jetstream::new(server.connect().await.expect("connect"));
        create(&js, 1).await;
        wait_stream_writable(&js, "t.a", Duration::from_secs(10))
            .await
            .expect("writable");
        assert_eq!(messages(&js).await, 0);
        let seq = js
            .publish("t.a", "first".into())
            .await
            .expect("publish")
            .await
            .expect("stored")
            .sequence;
        assert_eq!(seq, 1);
    }

    #[tokio::test]
    async fn a_subject_no_stream_stores_is_never_writable() {
        let server = NatsServer::start().await.expect("start nats-server");
        let js = jetstream::new(server.connect().await.expect("connect"));
        create(&js, 1).await;
        let error = wait_stream_writable(&js, "u.a", Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(error, Error::Timeout { .. }), "{error:?}");
    }

    #[tokio::test]
    async fn on_a_cluster_every_node_s_client_can_write_once_it_waited() {
        let cluster = NatsCluster::start(3).await.expect("start the cluster");
        let js = jetstream::new(cluster.connect().await.expect("connect"));
        create(&js, 3).await;
        for node in cluster.nodes() {
            let js = jetstream::new(node.connect().await.expect("connect"));
            wait_stream_writable(&js, "t.a", Duration::from_secs(10))
                .await
                .expect("writable");
            js.publish("t.a", "r".into())
                .await
                .expect("publish")
                .await
                .expect("stored at once");
        }
        assert_eq!(messages(&js).await, 3);
    }
}
