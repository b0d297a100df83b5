//! JetStream's own API and reply subjects that jetshard addresses without async-nats: the ack
//! prefix, the pull request, direct gets, and the answers to a journal writer's publishes.

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
