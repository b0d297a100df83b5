//! JetStream's own API and reply subjects that jetshard addresses without async-nats: the ack
//! prefix, the pull request, direct gets, the answers to a journal writer's publishes, the
//! consumers' pause advisories, a stream leader's step-down and its election.

/// The prefix of a JetStream ack reply subject (`$JS.ACK.…`, ADR-15).
pub(crate) const ACK_PREFIX: &str = "$JS.ACK.";

/// An ack subject for the delivery of stream sequence `seq` by `consumer` of `stream`, in the
/// classic layout (ADR-15: `<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>` after the
/// prefix), whoever it was delivered to. The server reads only the stream sequence of an
/// explicit acknowledgement (the delivery it acknowledges is looked up by it), so the other
/// numbers are placeholders (`tests/tests/nats_facts.rs`).
pub(crate) fn ack_subject(stream: &str, consumer: &str, seq: u64) -> String {
    format!("{ACK_PREFIX}{stream}.{consumer}.1.{seq}.{seq}.0.0")
}

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

/// The JetStream API request (after `$JS.API.`) that asks `stream`'s leader to step down.
pub(crate) fn stream_leader_stepdown(stream: &str) -> String {
    format!("STREAM.LEADER.STEPDOWN.{stream}")
}

/// The advisory the server publishes when `stream` has elected a new leader.
pub(crate) fn stream_leader_elected(stream: &str) -> String {
    format!("$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.{stream}")
}

/// What the pause advisories of every consumer of `stream` are published on: the server says
/// there when a consumer is paused, resumed by API, or its pause ends (`paused` in the body;
/// the consumer's name is the last token).
pub(crate) fn pause_advisories(stream: &str) -> String {
    format!("$JS.EVENT.ADVISORY.CONSUMER.PAUSE.{stream}.*")
}
