//! The `Tally` test entity of the recovery, snapshot and dormant-state tests: its state shows
//! any lost, doubled or reordered event. With its helpers: a config, a start that waits until
//! every partition is owned, an entity's state as its actor holds it, and every entity's state
//! as a full replay of the journal gives it (the reference every check compares against).

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::Context;
use jetshard::wire::Names;
use jetshard::{
    CommandOutcome, CommandSender, Entity, EntityId, ShardConfig, ShardSystem, Snapshots,
};
use jetshard_testkit::history::{Record, read_journal};
use serde::{Deserialize, Serialize};

use crate::start_owning;

/// How long a test waits for a command's outcome.
pub const ASK: Duration = Duration::from_secs(10);

/// A test entity whose state shows any lost, doubled or reordered event: sums per key, a count
/// and an order-sensitive trail of every event.
pub struct Tally;

/// A command to a `Tally`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum TallyCmd {
    /// One event: `by` added to `key`.
    Add { key: u8, by: u32 },
    /// Several events, one atomic write.
    AddMany { by: Vec<u32> },
    /// Rejected, writing nothing.
    Refuse,
    /// Rejected with the state as JSON: the test's window on it.
    Get,
}

/// A `Tally`'s event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TallyEvt {
    /// `by` added to `key`.
    Added { key: u8, by: u32 },
}

/// A `Tally`'s state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TallyState {
    /// The sum of the `by`s per key.
    pub sums: BTreeMap<u8, u64>,
    /// Events applied.
    pub events: u64,
    /// An order-sensitive hash of every event.
    pub trail: u64,
}

impl Entity for Tally {
    type Command = TallyCmd;
    type Event = TallyEvt;
    type State = TallyState;
    type Rejection = String;

    fn decide(state: &TallyState, command: TallyCmd) -> Result<Vec<TallyEvt>, String> {
        match command {
            TallyCmd::Add { key, by } => Ok(vec![TallyEvt::Added { key, by }]),
            TallyCmd::AddMany { by } => Ok(by
                .into_iter()
                .enumerate()
                .map(|(i, by)| TallyEvt::Added { key: i as u8, by })
                .collect()),
            TallyCmd::Refuse => Err("refused".to_owned()),
            TallyCmd::Get => Err(serde_json::to_string(state).unwrap()),
        }
    }

    fn apply(state: &mut TallyState, event: &TallyEvt) {
        let TallyEvt::Added { key, by } = event;
        *state.sums.entry(*key).or_default() += u64::from(*by);
        state.events += 1;
        state.trail = state
            .trail
            .wrapping_mul(1_000_003)
            .wrapping_add(u64::from(*key) * 100_000 + u64::from(*by));
    }
    // No `snapshots()`: jetshard's default (on, `Snapshots::serde(1)`), which every test here
    // relies on.
}

/// `Tally` with snapshots opted out.
pub struct UnsnapshottedTally;

impl Entity for UnsnapshottedTally {
    type Command = TallyCmd;
    type Event = TallyEvt;
    type State = TallyState;
    type Rejection = String;

    fn decide(state: &TallyState, command: TallyCmd) -> Result<Vec<TallyEvt>, String> {
        Tally::decide(state, command)
    }

    fn apply(state: &mut TallyState, event: &TallyEvt) {
        Tally::apply(state, event);
    }

    fn snapshots() -> Option<Snapshots<TallyState>> {
        None
    }
}

/// How many of `ids` have a snapshot in `entity_type`'s journal.
pub async fn snapshots_of(
    js: &Context,
    entity_type: &str,
    partitions: u32,
    ids: &[String],
) -> usize {
    let names = Names::new(entity_type);
    let journal = js.get_stream(names.journal_stream(0)).await.unwrap();
    let mut found = 0;
    for id in ids {
        let id = EntityId::new(id).unwrap();
        let subject = names.snapshot_subject(jetshard::partition_of(&id, partitions), &id);
        found += usize::from(
            journal
                .get_last_raw_message_by_subject(&subject)
                .await
                .is_ok(),
        );
    }
    found
}

/// A config for a `Tally` type: JSON-encoded, retries after 50 ms, node `n1`.
pub fn config(entity_type: &str, partitions: u32) -> jetshard::ShardConfigBuilder {
    crate::config(entity_type, partitions, "n1")
        .codec(jetshard::Codec::Json)
        .retry_delay(Duration::from_millis(50))
}

/// The entity's state as its actor holds it (loaded however the owner loads it).
pub async fn state_of(sender: &CommandSender<Tally>, id: &str) -> TallyState {
    match sender
        .request_outcome(id, &TallyCmd::Get, ASK)
        .await
        .unwrap()
    {
        CommandOutcome::Rejected { reason, .. } => serde_json::from_str(&reason).unwrap(),
        other => panic!("Get of {id}: {other:?}"),
    }
}

/// Every entity's state as a full replay of the journal gives it: its events, in order.
pub async fn replayed(js: &Context, entity_type: &str) -> BTreeMap<String, TallyState> {
    let mut states: BTreeMap<String, TallyState> = BTreeMap::new();
    for record in read_journal(js, entity_type).await.unwrap() {
        if let Record::Event { entity, event, .. } = record {
            let event: TallyEvt = serde_json::from_slice(&event).unwrap();
            Tally::apply(states.entry(entity).or_default(), &event);
        }
    }
    states
}

/// Starts a `Tally` system and waits until it owns every partition.
pub async fn start(client: &async_nats::Client, config: &ShardConfig) -> ShardSystem {
    let sender = CommandSender::<Tally>::new(client.clone(), config);
    start_owning::<Tally>(client, config, async || {
        // A command wakes every partition's consumer: the pin is given with a delivery.
        for p in 0..config.partitions() {
            let id = crate::id_in("wake", p, config.partitions());
            sender.send(&id, &TallyCmd::Refuse).await.unwrap();
        }
    })
    .await
}

/// Sends `command` to `id` and asserts that it was applied.
pub async fn applied<E: Entity<Command = TallyCmd>>(
    sender: &CommandSender<E>,
    id: &str,
    command: &TallyCmd,
) {
    let outcome = sender.request_outcome(id, command, ASK).await.unwrap();
    assert!(
        matches!(outcome, CommandOutcome::Applied { .. }),
        "{id}: {outcome:?}"
    );
}
