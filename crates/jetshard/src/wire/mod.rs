//! The wire contract (docs/WIRE.md): stream, subject, consumer and header names, for tools and
//! tests that read what jetshard writes.
//!
//! Architecture Invariant: every name jetshard puts on the wire is spelled here and nowhere else.

use async_nats::HeaderMap;
use async_nats::header::IntoHeaderName;

use id::EntityId;
use partition::fnv1a_32;

pub(crate) mod id;
pub(crate) mod partition;

/// The priority group every partition consumer uses.
pub const PRIORITY_GROUP: &str = "owners";

/// Header on every journal write: the writer's generation.
pub const HDR_GENERATION: &str = "Jetshard-Generation";
/// Header on every event: the stream sequence of the command that caused it.
pub const HDR_COMMAND_SEQ: &str = "Jetshard-Command-Seq";
/// Header on every event: the version of the event type's encoding it was written with
/// (`Entity::EVENT_VERSION`); absent on events written before versions were recorded (read as 1).
pub const HDR_EVENT_VERSION: &str = "Jetshard-Event-Version";
/// Header on a dead-letter record: the entity id.
pub const HDR_ENTITY: &str = "Jetshard-Entity";
/// Header on a dead-letter record: why the command was given up.
pub const HDR_REASON: &str = "Jetshard-Reason";
/// Header on a dead-letter record: how often the command had been delivered.
pub const HDR_DELIVERIES: &str = "Jetshard-Deliveries";
/// Header a client may set on a command: where to send its outcome (a `CommandOutcome`, JSON).
pub const HDR_REPLY_TO: &str = "Jetshard-Reply-To";
/// W3C trace context (`00-<trace id>-<parent id>-<flags>`): a client may set it on a command;
/// the command's events and its outcome reply carry it with the command's own span as parent.
pub const HDR_TRACEPARENT: &str = "traceparent";
/// Server header naming the pin of a delivered message.
pub const HDR_PIN_ID: &str = "Nats-Pin-Id";
/// Server header of a status that ends a pull request (`408`, `409`, `423`): how many of the
/// messages it asked for it had not been given.
pub const HDR_PENDING_MESSAGES: &str = "Nats-Pending-Messages";
/// Server header of the status that ends a batched direct get (`204 EOB`): the last sequence of
/// the answering replica's stream when the request named no `up_to_seq`, so the answer is
/// complete for every record at or below it.
pub const HDR_UPTO_SEQUENCE: &str = "Nats-UpTo-Sequence";
/// Server header of the status that ends a batched direct get: how many matching messages the
/// answer left out (its `batch` was too small).
pub const HDR_NUM_PENDING: &str = "Nats-Num-Pending";
/// Server header of the compare-and-set: the expected last sequence of a subject.
pub const HDR_EXPECTED_SUBJECT_SEQ: &str = "Nats-Expected-Last-Subject-Sequence";
/// Server header of the compare-and-set: the subject whose last sequence is checked.
pub const HDR_EXPECTED_SUBJECT: &str = "Nats-Expected-Last-Subject-Sequence-Subject";
/// Server header of an atomic batch (a command's several events): the batch id.
pub const HDR_BATCH_ID: &str = "Nats-Batch-Id";
/// Server header of an atomic batch: the message's place in it, from 1.
pub const HDR_BATCH_SEQUENCE: &str = "Nats-Batch-Sequence";
/// Server header of an atomic batch: set to `1` on its last message.
pub const HDR_BATCH_COMMIT: &str = "Nats-Batch-Commit";
/// Server header for de-duplication.
pub const HDR_MSG_ID: &str = "Nats-Msg-Id";
/// Server header of a roll-up: `sub` keeps only the message just stored on its subject (a
/// snapshot replaces the entity's previous one).
pub const HDR_ROLLUP: &str = "Nats-Rollup";
/// Header on a snapshot: the version of the state's encoding (`Snapshots::version`).
pub const HDR_STATE_VERSION: &str = "Jetshard-State-Version";
/// Header on a snapshot: the journal sequence of the last record of the entity it covers.
pub const HDR_SNAPSHOT_UPTO: &str = "Jetshard-Snapshot-Upto";
/// Header on an entity's record (event, timer record, dead letter) that is its command's only
/// record: a journal sequence every earlier record of the entity (snapshots aside) is at or
/// below. So the records between it and this one are none, and an entity whose last records
/// (`multi_last`) chain down this way past its snapshot loads without reading its tail. Only the
/// entity's actor writes on its subjects, and only while it knows (its `Seed::tail`).
pub const HDR_PREVIOUS: &str = "Jetshard-Previous";
/// Header on a snapshot: what the entity's last command came to (`applied <events>`,
/// `rejected <reason>`, `dead_lettered <reason>`), told again to a redelivery of it.
pub const HDR_LAST_OUTCOME: &str = "Jetshard-Last-Outcome";
/// Header on a command an operator replayed from a dead letter (`Admin::replay`): the dead
/// letter's journal sequence. Its `Nats-Msg-Id` is `<t>:replay:<that sequence>`, so a second
/// replay within the command stream's duplicate window is stored once.
pub const HDR_REPLAY_OF: &str = "Jetshard-Replay-Of";

/// Header on an outbox record (`<t>.out.<p>`): the subject its message is published to.
pub const HDR_OUTBOX_TARGET: &str = "Jetshard-Outbox-Target";
/// Header on an outbox record: the message's place among its command's messages, from 0.
pub const HDR_OUTBOX_INDEX: &str = "Jetshard-Outbox-Index";
/// Header on an outbox message (`<type>:<partition>:<command seq>:<index>` of the command that
/// sent it) and on the events it produced at its target (`#<type hash>:<partition>:<seq>:<index>`):
/// the target entity remembers it and answers a copy of the message as a duplicate.
pub const HDR_ORIGIN: &str = "Jetshard-Origin";
/// Header on a snapshot: the origins of the outbox messages the entity remembers having applied
/// (see [`HDR_ORIGIN`]), separated by spaces; absent when there are none.
pub const HDR_ORIGINS: &str = "Jetshard-Origins";
/// Header on an outbox *done* record: every message of the command (`Jetshard-Command-Seq`) was
/// published.
pub const HDR_OUTBOX_DONE: &str = "Jetshard-Outbox-Done";

/// Header on a timer record (on `<t>.evt.<p>.<id>`, not an event): `set`, `cancel` or `fired`.
pub const HDR_TIMER_OP: &str = "Jetshard-Timer-Op";
/// Header on a timer record and on a fired timer's command: the timer's name.
pub const HDR_TIMER: &str = "Jetshard-Timer";
/// Header on a `set` timer record: when it is due, unix milliseconds.
pub const HDR_TIMER_DUE: &str = "Jetshard-Timer-Due";
/// Header on a `fired` timer record and on a fired timer's command: the command sequence that
/// set the timer.
pub const HDR_TIMER_SET: &str = "Jetshard-Timer-Set";
/// Header of a wake-up: a command that carries nothing for any entity, sent to a partition
/// whose owner is gone so that the server pins a standby (a partition is owned only while it
/// has a command to deliver), which then fires the partition's due timers.
pub const HDR_WAKE: &str = "Jetshard-Wake";

/// All names of one entity type, computed once.
#[derive(Debug, Clone)]
pub struct Names {
    /// `<t>`: the lowercase entity type token.
    pub(crate) entity_type: String,
    /// `<T>_CMD`.
    pub(crate) command_stream: String,
    /// `<T>_JOURNAL`.
    pub(crate) journal_stream: String,
}

impl Names {
    /// The names of entity type `entity_type` (not validated here: see
    /// [`ShardConfig::builder`](crate::ShardConfig::builder)).
    pub fn new(entity_type: &str) -> Self {
        let upper = entity_type.to_ascii_uppercase().replace('-', "_");
        Self {
            entity_type: entity_type.to_owned(),
            command_stream: format!("{upper}_CMD"),
            journal_stream: format!("{upper}_JOURNAL"),
        }
    }

    /// The entity type token, `<t>`.
    pub fn entity_type(&self) -> &str {
        &self.entity_type
    }

    /// The command stream, `<T>_CMD`.
    pub fn command_stream(&self) -> &str {
        &self.command_stream
    }

    /// The journal stream, `<T>_JOURNAL`.
    pub fn journal_stream(&self) -> &str {
        &self.journal_stream
    }

    /// Where clients publish a command: `<t>.cmd.<id>`.
    pub fn command_subject(&self, id: &EntityId) -> String {
        format!("{}.cmd.{id}", self.entity_type)
    }

    /// The command stream's subjects: `<t>.cmd.*`.
    pub fn command_subjects(&self) -> String {
        format!("{}.cmd.*", self.entity_type)
    }

    /// The subject transform's destination for `n` partitions.
    pub fn command_transform_dest(&self, partitions: u32) -> String {
        format!(
            "{}.cmd.{{{{partition({partitions},1)}}}}.{{{{wildcard(1)}}}}",
            self.entity_type
        )
    }

    /// A partition's stored commands: `<t>.cmd.<p>.*`.
    pub fn partition_commands(&self, partition: u32) -> String {
        format!("{}.cmd.{partition}.*", self.entity_type)
    }

    /// Where a reader asks the owner for an entity's state (core NATS request/reply, see
    /// docs/WIRE.md): `<t>.query.<p>.<id>`.
    pub fn query_subject(&self, partition: u32, id: &EntityId) -> String {
        format!("{}.query.{partition}.{id}", self.entity_type)
    }

    /// Where a partition's owners listen for state queries: `<t>.query.<p>.*`.
    pub fn partition_queries(&self, partition: u32) -> String {
        format!("{}.query.{partition}.*", self.entity_type)
    }

    /// A partition's durable consumer: `<t>-p<p>`.
    pub fn consumer(&self, partition: u32) -> String {
        format!("{}-p{partition}", self.entity_type)
    }

    /// Every subject of the entity type (`<t>.>`): the whole journal, to a reader.
    pub fn all_subjects(&self) -> String {
        format!("{}.>", self.entity_type)
    }

    /// The subjects of one partition's journal records, of every kind (`<t>.*.<p>` and
    /// `<t>.*.<p>.*`).
    pub fn partition_subjects(&self, partition: u32) -> Vec<String> {
        let t = &self.entity_type;
        vec![format!("{t}.*.{partition}"), format!("{t}.*.{partition}.*")]
    }

    /// The journal stream's subjects.
    pub fn journal_subjects(&self) -> Vec<String> {
        let t = &self.entity_type;
        vec![
            format!("{t}.evt.*.*"),
            format!("{t}.fence.*"),
            format!("{t}.dlq.*"),
            format!("{t}.dlq.*.*"),
            format!("{t}.snap.*.*"),
            format!("{t}.out.*"),
            format!("{t}.tmr.*.*"),
            format!("{t}.unpin.*"),
        ]
    }

    /// An entity's events: `<t>.evt.<p>.<id>`.
    pub fn event_subject(&self, partition: u32, id: &EntityId) -> String {
        format!("{}.evt.{partition}.{id}", self.entity_type)
    }

    /// All events of a partition: `<t>.evt.<p>.*`.
    pub fn partition_events(&self, partition: u32) -> String {
        format!("{}.evt.{partition}.*", self.entity_type)
    }

    /// A partition's fence records: `<t>.fence.<p>`.
    pub fn fence_subject(&self, partition: u32) -> String {
        format!("{}.fence.{partition}", self.entity_type)
    }

    /// Every partition's fence records: `<t>.fence.*` (a core subscription there sees each
    /// claim as it is published, whether it wins or not).
    pub fn fence_subjects(&self) -> String {
        format!("{}.fence.*", self.entity_type)
    }

    /// Where a dead letter of `entity` goes: `<t>.dlq.<p>.<id>` when `entity` is a valid id
    /// (so that loading one entity reads its own dead letters only), else `<t>.dlq.<p>` (a
    /// command whose subject held no valid id; dead letters written before per-entity subjects
    /// are there too).
    pub fn dead_letter_subject(&self, partition: u32, entity: &str) -> String {
        match EntityId::new(entity) {
            Ok(id) => self.entity_dead_letters(partition, &id),
            Err(_) => self.partition_dead_letters(partition),
        }
    }

    /// The dead letters of one entity: `<t>.dlq.<p>.<id>`.
    pub fn entity_dead_letters(&self, partition: u32, id: &EntityId) -> String {
        format!("{}.dlq.{partition}.{id}", self.entity_type)
    }

    /// A partition's dead letters that name no valid entity (and those written before
    /// per-entity subjects): `<t>.dlq.<p>`.
    pub fn partition_dead_letters(&self, partition: u32) -> String {
        format!("{}.dlq.{partition}", self.entity_type)
    }

    /// Every dead letter of the entity type: `<t>.dlq.>`.
    pub fn all_dead_letters(&self) -> String {
        format!("{}.dlq.>", self.entity_type)
    }

    /// The partition of a dead letter's subject (`<t>.dlq.<p>` or `<t>.dlq.<p>.<id>`).
    pub fn partition_of_dead_letter(subject: &str) -> Option<u32> {
        subject.split('.').nth(2)?.parse().ok()
    }

    /// The latest snapshot of an entity's state: `<t>.snap.<p>.<id>` (one message per
    /// subject: each snapshot rolls the previous one up).
    pub fn snapshot_subject(&self, partition: u32, id: &EntityId) -> String {
        format!("{}.snap.{partition}.{id}", self.entity_type)
    }

    /// All snapshots of a partition: `<t>.snap.<p>.*`.
    pub fn partition_snapshots(&self, partition: u32) -> String {
        format!("{}.snap.{partition}.*", self.entity_type)
    }

    /// An entity's timer records (set, cancel, fired): `<t>.tmr.<p>.<id>`. Apart from its events,
    /// so that a new owner finds the partition's armed timers without reading its events.
    pub fn timer_subject(&self, partition: u32, id: &EntityId) -> String {
        format!("{}.tmr.{partition}.{id}", self.entity_type)
    }

    /// All timer records of a partition: `<t>.tmr.<p>.*`.
    pub fn partition_timers(&self, partition: u32) -> String {
        format!("{}.tmr.{partition}.*", self.entity_type)
    }

    /// A partition's outbox records and their done records: `<t>.out.<p>`.
    pub fn outbox_subject(&self, partition: u32) -> String {
        format!("{}.out.{partition}", self.entity_type)
    }

    /// Where the processes of the entity type say how many partitions they own: `<t>.nodes`.
    pub fn membership_subject(&self) -> String {
        format!("{}.nodes", self.entity_type)
    }

    /// Where the processes of the entity type answer status requests (core NATS request/reply,
    /// one answer per process: a `NodeStatus`, JSON): `<t>.status`.
    pub fn status_subject(&self) -> String {
        format!("{}.status", self.entity_type)
    }

    /// Where the process of `incarnation` answers while it runs (core NATS request/reply, an
    /// empty answer): `<t>.alive.<incarnation>`.
    pub fn alive_subject(&self, incarnation: &str) -> String {
        format!("{}.alive.{incarnation}", self.entity_type)
    }

    /// The command subject of a wake-up of `partition` (of `partitions`): `<t>.cmd.<id>`, for
    /// the first id `jetshard-wake-<k>` that hashes to the partition. Its header
    /// ([`HDR_WAKE`]) tells the owner to acknowledge it and route it nowhere.
    pub fn wake_subject(&self, partition: u32, partitions: u32) -> String {
        let id = (0u64..)
            .map(|k| format!("jetshard-wake-{k}"))
            .find(|id| fnv1a_32(id.as_bytes()) % partitions.max(1) == partition)
            .unwrap_or_default();
        format!("{}.cmd.{id}", self.entity_type)
    }

    /// Where a crash watch records that it unpins a dead owner's partition: `<t>.unpin.<p>`
    /// (one record per fence record found dead, deduplicated by [`Names::unpin_msg_id`], rolled
    /// up: only the latest is kept).
    pub fn unpin_subject(&self, partition: u32) -> String {
        format!("{}.unpin.{partition}", self.entity_type)
    }

    /// `Nats-Msg-Id` of the unpin record for the fence record at `fence_seq`: the first watch
    /// to store it unpins; every other watch that found the same owner dead is told
    /// "duplicate" and leaves the pin alone.
    pub fn unpin_msg_id(&self, partition: u32, fence_seq: u64) -> String {
        format!("{}:unpin:{partition}:{fence_seq}", self.entity_type)
    }

    /// `Nats-Msg-Id` of the `index`th event of the command at `command_seq`.
    pub fn event_msg_id(&self, command_seq: u64, index: usize) -> String {
        use std::fmt::Write;
        // Sized up front (two numbers of up to 20 digits): `format!` would start this one from
        // an empty string and grow it, an allocation more for every event written.
        let mut id = String::with_capacity(self.entity_type.len() + 42);
        let _ = write!(id, "{}:{command_seq}:{index}", self.entity_type);
        id
    }

    /// `Nats-Msg-Id` of the `index`th outbox record of the command at `command_seq`.
    pub(crate) fn outbox_record_msg_id(&self, command_seq: u64, index: usize) -> String {
        format!("{}:out-record:{command_seq}:{index}", self.entity_type)
    }

    /// `Nats-Msg-Id` of the outbox *done* record of the command at `command_seq`.
    pub(crate) fn outbox_done_msg_id(&self, command_seq: u64) -> String {
        format!("{}:out-done:{command_seq}", self.entity_type)
    }

    /// `Nats-Msg-Id` of the `index`th outbox message (as published) of the command at
    /// `command_seq`.
    pub(crate) fn outbox_msg_id(&self, command_seq: u64, index: usize) -> String {
        format!("{}:{command_seq}:out:{index}", self.entity_type)
    }

    /// `Nats-Msg-Id` of the dead letter of the command at `command_seq`.
    pub(crate) fn dead_letter_msg_id(&self, command_seq: u64) -> String {
        format!("{}:dlq:{command_seq}", self.entity_type)
    }

    /// `Nats-Msg-Id` of a dead letter's command published again (`jetshard dlq replay`).
    pub(crate) fn replay_msg_id(&self, dead_letter_seq: u64) -> String {
        format!("{}:replay:{dead_letter_seq}", self.entity_type)
    }

    /// `Nats-Msg-Id` of a timer's command, as published when it fires.
    pub(crate) fn timer_fired_msg_id(&self, entity: &EntityId, name: &str, set_seq: u64) -> String {
        format!("{}:timer:{entity}:{name}:{set_seq}", self.entity_type)
    }

    /// `Nats-Msg-Id` of a command sent with an idempotency key.
    pub(crate) fn keyed_command_msg_id(id: &str, key: &str) -> String {
        format!("{id}:{key}")
    }

    /// Whether `subject` is one of this type's dead-letter subjects (`<t>.dlq.…`).
    pub(crate) fn is_dead_letter(&self, subject: &str) -> bool {
        subject
            .strip_prefix(self.entity_type.as_str())
            .is_some_and(|rest| rest.starts_with(".dlq."))
    }

    /// The subjects a snapshot on `snapshot_subject` (`<t>.snap.<p>.<id>`) covers; `None` if
    /// it is not a snapshot subject of this type.
    pub(crate) fn covered_by_snapshot(&self, snapshot_subject: &str) -> Option<Covered> {
        let t = &self.entity_type;
        let rest = snapshot_subject.strip_prefix(&format!("{t}.snap."))?;
        Some(Covered {
            records: format!("{t}.*.{rest}"),
            each: [
                format!("{t}.evt.{rest}"),
                format!("{t}.tmr.{rest}"),
                snapshot_subject.to_owned(),
            ],
            dead_letters: format!("{t}.dlq.{rest}"),
        })
    }

    /// The dead letters of a partition's entities (each on `<t>.dlq.<p>.<id>`).
    pub(crate) fn partition_entities_dead_letters(&self, partition: u32) -> String {
        format!("{}.dlq.{partition}.*", self.entity_type)
    }

    /// Every record of one entity (`<t>.*.<p>.<id>`: its events, dead letters, timer records
    /// and snapshots, the journal's only four-token subjects).
    pub(crate) fn entity_records(&self, partition: u32, id: &EntityId) -> String {
        format!("{}.*.{partition}.{id}", self.entity_type)
    }

    /// Whether `subject` is a snapshot's (`<t>.snap.<p>.<id>`), of any entity type.
    pub(crate) fn is_snapshot_subject(subject: &str) -> bool {
        subject.split('.').nth(1) == Some("snap")
    }

    /// The entity id at the end of a stored command or event subject.
    pub fn entity_of_subject(subject: &str) -> Option<&str> {
        subject.rsplit('.').next()
    }
}

/// What an entity's snapshot covers, as subjects of the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Covered {
    /// Every record of the entity (`<t>.*.<p>.<id>`): its events, timer records, snapshots
    /// and dead letters (the journal's only four-token subjects).
    pub(crate) records: String,
    /// The same without its dead letters, one subject each: its events (`<t>.evt.<p>.<id>`),
    /// timer records (`<t>.tmr.<p>.<id>`) and snapshots (`<t>.snap.<p>.<id>`).
    pub(crate) each: [String; 3],
    /// Its dead letters (`<t>.dlq.<p>.<id>`), which go by their own retention.
    pub(crate) dead_letters: String,
}

/// `Nats-Msg-Id` of the `index`th timer record (a set, a cancel, or the `fired` record) of the
/// command at `command_seq`.
pub(crate) fn timer_record_msg_id(entity_type: &str, command_seq: u64, index: usize) -> String {
    format!("{entity_type}:{command_seq}:timer:{index}")
}

/// The `Jetshard-Origin` header of the `index`th outbox message of the command at `command_seq`
/// of `entity_type`'s `partition`: `<type>:<partition>:<command seq>:<index>`
/// (`data::origin::Origin::parse` reads it back).
pub(crate) fn origin_header(
    entity_type: &str,
    partition: u32,
    command_seq: u64,
    index: usize,
) -> String {
    format!("{entity_type}:{partition}:{command_seq}:{index}")
}

/// The prefix of a JetStream ack reply subject (`$JS.ACK.…`, ADR-15).
pub(crate) const ACK_PREFIX: &str = "$JS.ACK.";

/// The subject a pull request for `consumer` of `stream` is sent to.
pub(crate) fn pull_request_subject(stream: &str, consumer: &str) -> String {
    format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}")
}

/// What a journal writer subscribes to for the answers to its publishes (`<inbox>.*`), and the
/// prefix of each publish's reply subject (`<inbox>.`, then the publish's number).
pub(crate) fn write_answers(inbox: &str) -> (String, String) {
    (format!("{inbox}.*"), format!("{inbox}."))
}

/// The subject direct gets of `stream` are sent to (any replica answers).
pub(crate) fn direct_get_subject(stream: &str) -> String {
    format!("$JS.API.DIRECT.GET.{stream}")
}

/// Whether `s` is a valid entity type token: lowercase ASCII letters, digits, `-` and `_`,
/// starting with a letter, at most 32 bytes.
pub(crate) fn is_valid_entity_type(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && s.len() <= 32
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// Reads a header as a decimal `u64`.
pub(crate) fn header_u64(headers: &HeaderMap, name: impl IntoHeaderName) -> Option<u64> {
    headers
        .get(name)
        .and_then(|v| v.as_str().trim().parse().ok())
}

/// A unique token (batch ids, incarnations): the process id, a clock reading and a counter, in
/// hex (a valid subject token).
pub(crate) fn unique_token() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{:x}{:x}{:x}",
        std::process::id(),
        nanos,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The rendezvous-hashing key under which processes rank themselves as watchers of the node
/// `node` (the crash watch): every process of a fleet must spell it alike.
pub(crate) fn watch_key(node: &str) -> String {
    format!("watch:{node}")
}

/// The rendezvous-hashing key under which processes rank themselves as standbys of
/// `partition`: every process of a fleet must spell it alike.
pub(crate) fn standby_key(partition: u32) -> String {
    format!("p{partition}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_covers_its_entity_s_records_but_not_its_dead_letters() {
        let n = Names::new("order");
        let id = EntityId::new("o-1").unwrap();
        let covered = n.covered_by_snapshot(&n.snapshot_subject(3, &id)).unwrap();
        assert_eq!(covered.records, "order.*.3.o-1");
        assert_eq!(
            covered.each,
            [
                n.event_subject(3, &id),
                n.timer_subject(3, &id),
                n.snapshot_subject(3, &id)
            ]
        );
        assert_eq!(covered.dead_letters, n.entity_dead_letters(3, &id));
        assert!(n.covered_by_snapshot(&n.event_subject(3, &id)).is_none());
        // The journal's four-token subjects are exactly an entity's records: what
        // `records` matches besides `each` is its dead letters.
        let four_tokens: Vec<String> = n
            .journal_subjects()
            .into_iter()
            .filter(|s| s.split('.').count() == 4)
            .collect();
        assert_eq!(
            four_tokens,
            [
                "order.evt.*.*",
                "order.dlq.*.*",
                "order.snap.*.*",
                "order.tmr.*.*"
            ]
        );
    }

    #[test]
    fn names_follow_the_wire_contract() {
        let n = Names::new("order");
        let id = EntityId::new("o-1").unwrap();
        assert_eq!(n.command_stream, "ORDER_CMD");
        assert_eq!(n.journal_stream, "ORDER_JOURNAL");
        assert_eq!(n.command_subject(&id), "order.cmd.o-1");
        assert_eq!(
            n.command_transform_dest(8),
            "order.cmd.{{partition(8,1)}}.{{wildcard(1)}}"
        );
        assert_eq!(n.partition_commands(3), "order.cmd.3.*");
        assert_eq!(n.consumer(3), "order-p3");
        assert_eq!(n.event_subject(3, &id), "order.evt.3.o-1");
        assert_eq!(n.fence_subject(3), "order.fence.3");
        assert_eq!(n.dead_letter_subject(3, "o-1"), "order.dlq.3.o-1");
        assert_eq!(n.dead_letter_subject(3, "a.b"), "order.dlq.3");
        assert_eq!(Names::partition_of_dead_letter("order.dlq.3.o-1"), Some(3));
        assert_eq!(Names::partition_of_dead_letter("order.dlq.3"), Some(3));
        assert_eq!(n.snapshot_subject(3, &id), "order.snap.3.o-1");
        assert_eq!(n.event_msg_id(42, 1), "order:42:1");
        assert_eq!(Names::entity_of_subject("order.evt.3.o-1"), Some("o-1"));
    }

    #[test]
    fn entity_types_are_lowercase_tokens() {
        assert!(is_valid_entity_type("order"));
        assert!(is_valid_entity_type("sensor-2_b"));
        for bad in ["", "Order", "2x", "a.b", "a b", "a*"] {
            assert!(!is_valid_entity_type(bad), "{bad:?}");
        }
    }
}
