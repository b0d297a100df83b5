//! Reading a journal back and checking what the library promises about it.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use futures::StreamExt;

/// One record of a `<T>_JOURNAL` stream.
#[derive(Debug, Clone)]
pub struct Record {
    /// Journal sequence.
    pub seq: u64,
    /// Full subject.
    pub subject: String,
    /// `evt`, `fence` or `dlq`.
    pub kind: String,
    /// The partition token.
    pub partition: u32,
    /// The entity id (events only).
    pub entity: Option<String>,
    /// `Jetshard-Generation`.
    pub generation: u64,
    /// `Jetshard-Command-Seq`, if any.
    pub command_seq: Option<u64>,
    /// The body.
    pub payload: bytes::Bytes,
}

/// Reads the whole journal of `entity_type`, in order.
pub async fn read_journal(js: &jetstream::Context, entity_type: &str) -> Vec<Record> {
    let stream_name = format!("{}_JOURNAL", entity_type.to_ascii_uppercase());
    let stream = js.get_stream(&stream_name).await.expect("journal stream");
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: format!("{entity_type}.>"),
            ..Default::default()
        })
        .await
        .expect("ordered consumer");
    let mut records = Vec::new();
    if consumer.cached_info().num_pending == 0 {
        return records;
    }
    let mut messages = consumer.messages().await.expect("messages");
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("journal read stalled")
            .expect("journal ended")
            .expect("journal message");
        let info = message.info().expect("info");
        let (seq, pending) = (info.stream_sequence, info.pending);
        let headers = message.headers.clone().unwrap_or_default();
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.as_str().parse::<u64>().ok())
        };
        let tokens: Vec<&str> = message.subject.split('.').collect();
        records.push(Record {
            seq,
            subject: message.subject.to_string(),
            kind: tokens[1].to_owned(),
            partition: tokens[2].parse().expect("partition token"),
            entity: (tokens[1] == "evt").then(|| tokens[3].to_owned()),
            generation: header("Jetshard-Generation")
                .expect("every journal record carries its generation"),
            command_seq: header("Jetshard-Command-Seq"),
            payload: message.payload.clone(),
        });
        if pending == 0 {
            return records;
        }
    }
}

/// Checks the fencing invariant: every event and dead letter carries the generation of the
/// partition's latest fence record before it, and each partition's generations rise by one.
pub fn check_fencing(records: &[Record]) -> Result<(), String> {
    let mut latest: HashMap<u32, u64> = HashMap::new();
    for r in records {
        match r.kind.as_str() {
            "fence" => {
                let previous = latest.insert(r.partition, r.generation).unwrap_or(0);
                if r.generation != previous + 1 {
                    return Err(format!(
                        "partition {} fence at {} jumps from generation {previous} to {}",
                        r.partition, r.seq, r.generation
                    ));
                }
            }
            _ => {
                let fence = latest.get(&r.partition).copied().unwrap_or(0);
                if r.generation != fence {
                    return Err(format!(
                        "{} at seq {} has generation {} but the partition's latest fence is {fence}",
                        r.subject, r.seq, r.generation
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Per entity, the command sequences of its events, in journal order.
pub fn commands_by_entity(records: &[Record]) -> BTreeMap<String, Vec<u64>> {
    let mut by_entity: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.kind == "evt") {
        by_entity
            .entry(r.entity.clone().unwrap_or_default())
            .or_default()
            .push(r.command_seq.unwrap_or(0));
    }
    by_entity
}

/// Per entity, the `n` of each `Appended` event of the ledger, in journal order.
pub fn ledger_values(records: &[Record]) -> BTreeMap<String, Vec<u64>> {
    let mut by_entity: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.kind == "evt") {
        let crate::ledger::LedgerEvt::Appended { n } =
            serde_json::from_slice(&r.payload).expect("ledger event");
        by_entity
            .entry(r.entity.clone().unwrap_or_default())
            .or_default()
            .push(n);
    }
    by_entity
}

/// Waits (bounded) until the journal holds at least `events` events, and returns it.
pub async fn wait_for_events(
    js: &jetstream::Context,
    entity_type: &str,
    events: usize,
    within: Duration,
) -> Vec<Record> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let records = read_journal(js, entity_type).await;
        let found = records.iter().filter(|r| r.kind == "evt").count();
        if found >= events {
            return records;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "journal holds {found} of {events} events after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
