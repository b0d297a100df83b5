//! Header names, of jetshard's own headers (`Jetshard-…`) and of the server's it sets or reads
//! (`Nats-…`), and the typed reads and writes of header values.

use async_nats::HeaderMap;
use async_nats::header::IntoHeaderName;

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
pub(crate) const HDR_PIN_ID: &str = "Nats-Pin-Id";
/// Server header of a status that ends a pull request (`408`, `409`, `423`): how many of the
/// messages it asked for it had not been given.
pub(crate) const HDR_PENDING_MESSAGES: &str = "Nats-Pending-Messages";
/// Server header of the status that ends a batched direct get (`204 EOB`): the last sequence of
/// the answering replica's stream when the request named no `up_to_seq`, so the answer is
/// complete for every record at or below it.
pub(crate) const HDR_UPTO_SEQUENCE: &str = "Nats-UpTo-Sequence";
/// Server header of the status that ends a batched direct get: how many matching messages the
/// answer left out (its `batch` was too small).
pub(crate) const HDR_NUM_PENDING: &str = "Nats-Num-Pending";
/// Server header of the compare-and-set: the expected last sequence of a subject.
pub const HDR_EXPECTED_SUBJECT_SEQ: &str = "Nats-Expected-Last-Subject-Sequence";
/// Server header of the compare-and-set: the subject whose last sequence is checked.
pub const HDR_EXPECTED_SUBJECT: &str = "Nats-Expected-Last-Subject-Sequence-Subject";
/// Server header of an atomic batch (a command's several events): the batch id.
pub(crate) const HDR_BATCH_ID: &str = "Nats-Batch-Id";
/// Server header of an atomic batch: the message's place in it, from 1.
pub(crate) const HDR_BATCH_SEQUENCE: &str = "Nats-Batch-Sequence";
/// Server header of an atomic batch: set to `1` on its last message.
pub(crate) const HDR_BATCH_COMMIT: &str = "Nats-Batch-Commit";
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
/// record of the entity: a journal sequence every earlier record of the entity (snapshots
/// aside) is at or below. So the records between it and this one are none: an entity whose
/// last records (`multi_last`) chain down this way past its snapshot loads without reading its
/// tail, and any other follows the chain back record by record (`journal/chain/`), never
/// through the records of other entities. Only the entity's actor writes on its subjects, and
/// only while it knows (its `Seed::tail`).
pub const HDR_PREVIOUS: &str = "Jetshard-Previous";
/// Header on the last record of a command that wrote several records of its entity (events,
/// timer records): `<k> <s>`, the command's `k` records of the entity being the `k` journal
/// sequences up to this one (a command's records are stored in one piece, the entity's last),
/// and `s` a sequence every earlier record of the entity is at or below, as
/// [`HDR_PREVIOUS`] says of a command's only record. Readers that do not know it read the
/// entity's tail as before.
pub(crate) const HDR_UNIT: &str = "Jetshard-Unit";
/// Header on a record that carries a link ([`HDR_PREVIOUS`] or [`HDR_UNIT`]): where the
/// entity's commands before the one its link names ended, newest first, as the gaps between
/// their last records' journal sequences (`<g1> <g2> ...`: the first at the link's sequence
/// minus `g1`, the next `g2` below that), back to the entity's snapshot and at most
/// `journal::chain::EARLIER` of them. A hint only: a load reads those records all at once
/// instead of one link after another, and still trusts each record's own link alone.
/// Readers that do not know it follow the links one by one.
pub(crate) const HDR_EARLIER: &str = "Jetshard-Earlier";
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

/// Reads a header as a decimal `u64`.
pub(crate) fn header_u64(headers: &HeaderMap, name: impl IntoHeaderName) -> Option<u64> {
    headers
        .get(name)
        .and_then(|v| v.as_str().trim().parse().ok())
}
