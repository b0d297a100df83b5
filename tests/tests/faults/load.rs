//! The load: publishes recorded in the history, retried under their message id, and the wait
//! until every partition consumer has drained.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, context::Context, message::PublishMessage};
use jetshard_testkit::history::{Ack, History};
use jetshard_testkit::wait_until;
use jetshard_tests::describe_consumers;
use jetshard_tests::ledger::LedgerCmd;
use jetshard_tests::model::Op;
use serde::Serialize;
use tokio::task::JoinHandle;

/// How long one publish may wait for the stream's acknowledgement before it is sent again.
pub(super) const PUBLISH_TIMEOUT: Duration = Duration::from_secs(2);

/// Publishes `op` to `subject` (an entity's, [`jetshard_tests::ledger_command_subject`]) with
/// the message id `msg_id` and waits for the stream's acknowledgement, sending it again (same
/// id, so the stream stores it once) until `give_up`.
pub async fn publish(
    js: &Context,
    subject: &str,
    payload: Vec<u8>,
    msg_id: &str,
    give_up: Duration,
    retries: &AtomicU64,
) -> Ack {
    let deadline = Instant::now() + give_up;
    loop {
        let message = PublishMessage::build()
            .payload(payload.clone().into())
            .message_id(msg_id);
        let attempt = async { js.send_publish(subject.to_owned(), message).await?.await };
        match tokio::time::timeout(PUBLISH_TIMEOUT, attempt).await {
            Ok(Ok(ack)) => return Ack::Acked(ack.sequence),
            Ok(Err(_)) | Err(_) => {
                retries.fetch_add(1, Ordering::Relaxed);
                if Instant::now() >= deadline {
                    return Ack::Unknown;
                }
                // Deliberate: a short pause before sending again while the server is away.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// JSON, as `ledger_config` sets the codec.
pub fn encode(command: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(command).expect("encode")
}

/// Continuous load: one task per entity publishes `Push { n }` with rising `n`, one command in
/// flight per entity, recording each in the history.
pub struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<History<Op>>>,
    /// Publishes that had to be sent again.
    pub retries: Arc<AtomicU64>,
    /// Commands acknowledged so far.
    pub acked: Arc<AtomicU64>,
}

impl Load {
    /// Starts publishing to every entity in `entities` of a ledger of `partitions`, pausing
    /// `interval` between two commands of one entity. An unconfirmed publish is sent again for
    /// up to `give_up`.
    pub fn start(
        client: async_nats::Client,
        partitions: u32,
        entities: &[String],
        interval: Duration,
        give_up: Duration,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let retries = Arc::new(AtomicU64::new(0));
        let acked = Arc::new(AtomicU64::new(0));
        let tasks = entities
            .iter()
            .map(|entity| {
                let js = jetstream::ContextBuilder::new()
                    .timeout(PUBLISH_TIMEOUT)
                    .build(client.clone());
                let (entity, stop, retries, acked) =
                    (entity.clone(), stop.clone(), retries.clone(), acked.clone());
                tokio::spawn(async move {
                    let mut history = History::new();
                    let mut n = 0;
                    let subject = jetshard_tests::ledger_command_subject(&entity, partitions);
                    while !stop.load(Ordering::Relaxed) {
                        let payload = encode(&LedgerCmd::Push { n });
                        let msg_id = format!("{entity}:{n}");
                        let ack = publish(&js, &subject, payload, &msg_id, give_up, &retries).await;
                        if matches!(ack, Ack::Acked(_)) {
                            acked.fetch_add(1, Ordering::Relaxed);
                        }
                        history.record(entity.clone(), Op::Push(n), ack);
                        n += 1;
                        // Deliberate: the load's pace, not a wait for a condition.
                        tokio::time::sleep(interval).await;
                    }
                    history
                })
            })
            .collect();
        Load {
            stop,
            tasks,
            retries,
            acked,
        }
    }

    /// Stops publishing and returns the history.
    pub async fn finish(self) -> History<Op> {
        self.stop.store(true, Ordering::Relaxed);
        let mut history = History::new();
        for task in self.tasks {
            history.extend(task.await.expect("load task"));
        }
        history
    }
}

/// Waits (bounded) until no partition consumer has a command pending or unacknowledged, then
/// returns how many messages the command stream still holds (it should hold none; a clustered
/// work-queue stream has been seen to keep a few acknowledged ones).
pub async fn wait_consumers_drained(
    js: &Context,
    partitions: u32,
    within: Duration,
) -> Result<u64, String> {
    let drained = wait_until(within, "every partition consumer to drain", || async {
        let names = jetshard_tests::ledger_names(js).await;
        for partition in 0..partitions {
            let Ok(stream) = js.get_stream_no_info(names.command_stream(partition)).await else {
                return false;
            };
            match stream.consumer_info(format!("ledger-p{partition}")).await {
                Ok(info) if info.num_pending == 0 && info.num_ack_pending == 0 => {}
                _ => return false,
            }
        }
        true
    })
    .await;
    if let Err(e) = drained {
        return Err(format!("{e}\n{}", describe_consumers(js).await));
    }
    let left = || async {
        let mut left = 0u64;
        for name in jetshard_tests::ledger_command_streams(js).await {
            left = left.saturating_add(match js.get_stream(name).await {
                Ok(mut stream) => stream.info().await.map_or(u64::MAX, |i| i.state.messages),
                Err(_) => u64::MAX,
            });
        }
        left
    };
    // The stream removes acknowledged commands a moment after the consumer records the ack.
    let _ = wait_until(
        Duration::from_secs(5),
        "the command stream to empty",
        || async { left().await == 0 },
    )
    .await;
    let left = left().await;
    Ok(left)
}
