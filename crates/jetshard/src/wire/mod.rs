//! The wire contract (docs/WIRE.md): stream, subject, consumer and header names, for tools and
//! tests that read what jetshard writes.
//!
//! Architecture Invariant: every name jetshard puts on the wire is spelled in `wire/` and
//! nowhere else (`scripts/check-layers` fails on one spelled elsewhere).
//!
//! By domain: [`Names`] the subjects, streams and consumers of one entity type (`names`), its
//! message ids (`msg_id`) and what a snapshot covers (`covered`); header names and typed header
//! values (`header`); JetStream's own API subjects (`jetstream`); made-up tokens and
//! rendezvous keys (`token`); [`EntityId`](crate::EntityId) (`id`) and the partition of an id
//! (`partition`). All but `id` and `partition` are re-exported here: callers name
//! `crate::wire::…`.

mod covered;
mod header;
pub(crate) mod id;
mod jetstream;
mod msg_id;
mod names;
pub(crate) mod partition;
mod token;

pub(crate) use covered::Covered;
pub(crate) use header::{
    HDR_BATCH_COMMIT, HDR_BATCH_ID, HDR_BATCH_SEQUENCE, HDR_EARLIER, HDR_NUM_PENDING,
    HDR_PENDING_MESSAGES, HDR_PIN_ID, HDR_UNIT, HDR_UPTO_SEQUENCE, header_u64, origin_header,
};
pub use header::{
    HDR_COMMAND_SEQ, HDR_DELIVERIES, HDR_ENTITY, HDR_EVENT_VERSION, HDR_EXPECTED_SUBJECT,
    HDR_EXPECTED_SUBJECT_SEQ, HDR_GENERATION, HDR_LAST_OUTCOME, HDR_MSG_ID, HDR_ORIGIN,
    HDR_ORIGINS, HDR_OUTBOX_DONE, HDR_OUTBOX_INDEX, HDR_OUTBOX_TARGET, HDR_PREVIOUS, HDR_REASON,
    HDR_REPLAY_OF, HDR_REPLY_TO, HDR_ROLLUP, HDR_SNAPSHOT_UPTO, HDR_STATE_VERSION, HDR_TIMER,
    HDR_TIMER_DUE, HDR_TIMER_OP, HDR_TIMER_SET, HDR_TRACEPARENT, HDR_WAKE,
};
pub(crate) use jetstream::{
    ACK_PREFIX, ack_subject, direct_get_subject, pause_advisories, pull_request_subject,
    stream_leader_elected, stream_leader_stepdown, write_answers,
};
pub(crate) use msg_id::{
    DECIMAL_DIGITS, decimal, decimal_string, read_decimal, timer_record_msg_id,
};
pub(crate) use names::is_valid_entity_type;
pub(crate) use names::{METADATA_CODEC, METADATA_JOURNAL_STREAMS, METADATA_PARTITIONS};
pub use names::{Names, PRIORITY_GROUP};
pub(crate) use token::{standby_key, unique_token, watch_key};
