//! Every feature at once: the traffic of timers, the saga, keyed requests and queries beside
//! the load, and the journal's mirror a schedule with a compaction is judged on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, context::Context};
use jetshard_testkit::history::{Ack, History};
use jetshard_tests::model::Op;
use tokio::task::JoinHandle;

use super::{PUBLISH_TIMEOUT, Rng, encode, publish};

/// The mirror of `LEDGER_JOURNAL` a schedule with a compaction reads its history from: the
/// compaction purges events the snapshots cover, the mirror keeps them (a mirror of each
/// stream of a spread journal, `jetshard_tests::copy_names`).
pub const JOURNAL_COPY: &str = "LEDGER_JOURNAL_COPY";

/// Creates [`JOURNAL_COPY`] (with `replicas`) once the journal exists.
pub async fn start_journal_copy(js: &Context, replicas: usize) {
    let journals = jetshard_tests::ledger_journals(js).await;
    jetshard_tests::copy_journal(js, JOURNAL_COPY, &journals, replicas).await;
}

/// Waits (bounded) until [`JOURNAL_COPY`] holds everything the journal held when called.
pub async fn wait_journal_copied(js: &Context, within: Duration) -> Result<(), String> {
    let journals = jetshard_tests::ledger_journals(js).await;
    jetshard_tests::wait_copied(js, JOURNAL_COPY, &journals, within).await
}

/// The stock entities of a schedule.
pub fn stocks(seed: u64) -> Vec<String> {
    (0..2).map(|k| format!("st{seed}-{k}")).collect()
}

/// The traffic of every feature beside the [`Load`]'s pushes, each recorded for the checkers:
/// durable timers armed and some disarmed (`Arm`, `Disarm`: the timer fires `Fire` into the
/// entity), orders of a saga through the outbox to the `stock` entity type and back (`Order`,
/// answered by `Settle`), keyed requests that retry under the same key
/// (`request_with_key`), and state queries of the load's entities.
pub struct Features {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<History<Op>>>,
    queries: JoinHandle<Vec<(String, Vec<u64>)>>,
    /// Publishes and keyed requests sent again.
    pub retries: Arc<AtomicU64>,
    /// Keyed requests answered.
    pub keyed: Arc<AtomicU64>,
    /// Answers to keyed requests that break a promise (a rejection, a dead letter, other events).
    pub bad_replies: Arc<std::sync::Mutex<Vec<String>>>,
    /// The stock entities the orders go to.
    pub stocks: Vec<String>,
    partitions: u32,
}

/// What [`Features`] leave for [`verify`].
pub struct FeatureRun {
    /// The history of their commands (merge it into the load's).
    pub history: History<Op>,
    /// Query answers: entity, state.
    pub answers: Vec<(String, Vec<u64>)>,
    /// Keyed requests answered.
    pub keyed: u64,
    /// Broken promises in keyed answers.
    pub bad_replies: Vec<String>,
    /// The stock entities.
    pub stocks: Vec<String>,
    /// Partitions (for the stock's sender).
    pub partitions: u32,
    /// Whether the nodes compacted the journal in the background (set by the world): a purge
    /// may then have outrun the journal's mirror.
    pub compacting: bool,
}

/// A client's sender of ledger commands (and state queries) for a ledger of `partitions`.
pub fn ledger_sender(
    client: async_nats::Client,
    partitions: u32,
) -> jetshard::CommandSender<jetshard_tests::ledger::Ledger> {
    let config = jetshard_tests::ledger_config(partitions, "chaos-client")
        .build()
        .expect("config");
    jetshard::CommandSender::new(client, &config)
}

impl Features {
    /// Starts the traffic for the schedule `seed`; queries ask the load's `queried` entities.
    pub fn start(
        client: async_nats::Client,
        seed: u64,
        partitions: u32,
        queried: &[String],
    ) -> Features {
        let stop = Arc::new(AtomicBool::new(false));
        let retries = Arc::new(AtomicU64::new(0));
        let keyed = Arc::new(AtomicU64::new(0));
        let bad_replies = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stocks = stocks(seed);
        let js = jetstream::ContextBuilder::new()
            .timeout(PUBLISH_TIMEOUT)
            .build(client.clone());
        let sender = ledger_sender(client.clone(), partitions);
        let give_up = Duration::from_secs(20);
        let mut tasks = Vec::new();
        // Timers: each armed under its own name, about a third disarmed before or after due.
        for k in 0..2u64 {
            let (js, stop, retries) = (js.clone(), stop.clone(), retries.clone());
            let entity = format!("tm{seed}-{k}");
            let subject = jetshard_tests::ledger_command_subject(&entity, partitions);
            let mut rng = Rng::new(seed.wrapping_mul(31).wrapping_add(k));
            tasks.push(tokio::spawn(async move {
                let mut history = History::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("t{i}");
                    let op = Op::Arm {
                        name: name.clone(),
                        n: i,
                        after_ms: 200 + rng.below(2300),
                    };
                    let payload = encode(&op.command().expect("a command"));
                    let id = format!("{entity}:arm{i}");
                    let ack = publish(&js, &subject, payload, &id, give_up, &retries).await;
                    history.record(entity.clone(), op, ack);
                    if rng.chance(35) {
                        // Deliberate: the cancel comes before or after the timer is due.
                        tokio::time::sleep(rng.millis(50, 1500)).await;
                        let op = Op::Disarm { name };
                        let payload = encode(&op.command().expect("a command"));
                        let id = format!("{entity}:disarm{i}");
                        let ack = publish(&js, &subject, payload, &id, give_up, &retries).await;
                        history.record(entity.clone(), op, ack);
                    }
                    i += 1;
                    // Deliberate: the timers' pace.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                history
            }));
        }
        // The saga: orders to the two stocks, 1 to 3 units each.
        for k in 0..2u64 {
            let (js, stop, retries) = (js.clone(), stop.clone(), retries.clone());
            let entity = format!("or{seed}-{k}");
            let subject = jetshard_tests::ledger_command_subject(&entity, partitions);
            let stocks = stocks.clone();
            tasks.push(tokio::spawn(async move {
                let mut history = History::new();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let op = Op::Order {
                        order: i,
                        stock: stocks[((i + k) % 2) as usize].clone(),
                        qty: 1 + i % 3,
                        reply_to: entity.clone(),
                    };
                    let payload = encode(&op.command().expect("a command"));
                    let id = format!("{entity}:order{i}");
                    let ack = publish(&js, &subject, payload, &id, give_up, &retries).await;
                    history.record(entity.clone(), op, ack);
                    i += 1;
                    // Deliberate: the orders' pace.
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                history
            }));
        }
        // Keyed requests: each retried under its key until it is answered.
        {
            let (sender, stop, retries) = (sender.clone(), stop.clone(), retries.clone());
            let (keyed, bad_replies) = (keyed.clone(), bad_replies.clone());
            let entity = format!("ky{seed}");
            tasks.push(tokio::spawn(async move {
                let mut history = History::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let command = jetshard_tests::ledger::LedgerCmd::Push { n };
                    let key = format!("k{n}");
                    let deadline = Instant::now() + give_up;
                    let ack = loop {
                        let answer = sender
                            .request_with_key(&entity, &key, &command, Duration::from_secs(2))
                            .await;
                        match answer {
                            Ok(reply) => {
                                keyed.fetch_add(1, Ordering::Relaxed);
                                let want = [jetshard_tests::ledger::LedgerEvt::Appended { n }];
                                match &reply {
                                    jetshard::Reply::Applied { events, .. }
                                        if events[..] == want[..] => {}
                                    jetshard::Reply::Duplicate { .. } => {}
                                    other => bad_replies.lock().unwrap().push(format!(
                                        "{entity}: keyed Push {n} answered {other:?}"
                                    )),
                                }
                                break Ack::Acked(reply.command_seq());
                            }
                            Err(_) if Instant::now() < deadline => {
                                retries.fetch_add(1, Ordering::Relaxed);
                                // Deliberate: a short pause before asking again.
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                            Err(_) => break Ack::Unknown,
                        }
                    };
                    history.record(entity.clone(), Op::Push(n), ack);
                    n += 1;
                    // Deliberate: the keyed requests' pace.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                history
            }));
        }
        // Queries of the load's entities.
        let queries = {
            let stop = stop.clone();
            let queried = queried.to_vec();
            let mut rng = Rng::new(seed.wrapping_add(7));
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let entity = rng.pick(&queried);
                    if let Ok(snapshot) = sender.get(&entity, Duration::from_secs(1)).await {
                        answers.push((entity, snapshot.state));
                    }
                    // Deliberate: the queries' pace.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                answers
            })
        };
        Features {
            stop,
            tasks,
            queries,
            retries,
            keyed,
            bad_replies,
            stocks,
            partitions,
        }
    }

    /// Stops the traffic and returns what the checkers need.
    pub async fn finish(self) -> FeatureRun {
        self.stop.store(true, Ordering::Relaxed);
        let mut history = History::new();
        for task in self.tasks {
            history.extend(task.await.expect("feature task"));
        }
        let answers = self.queries.await.expect("query task");
        FeatureRun {
            history,
            answers,
            keyed: self.keyed.load(Ordering::Relaxed),
            bad_replies: self.bad_replies.lock().unwrap().clone(),
            stocks: self.stocks,
            partitions: self.partitions,
            compacting: false,
        }
    }
}
