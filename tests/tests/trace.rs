//! W3C trace context across processes: the test process sends a command under a trace, a
//! `ledger-node` child process runs it; the node's `command` span names the trace, and the
//! command's event in the journal and its outcome reply carry `traceparent` with the same trace
//! id and the command's span as their parent.

use std::time::Duration;

use futures::StreamExt;
use jetshard::wire::{HDR_REPLY_TO, HDR_TRACEPARENT, Names};
use jetshard::{CommandOutcome, EntityId, TraceParent, partition_of};
use jetshard_testkit::history::Ack;
use jetshard_testkit::wait_until;
use jetshard_tests::ledger::LedgerCmd;
use jetshard_tests::model::Op;
use jetshard_tests::node::Node;
use jetshard_tests::{Scenario, init_tracing};

const PARTITIONS: u32 = 2;

/// The node's log line of the command's end under `trace`: `span_id=<16 hex>` read from it.
fn span_of(log: &str, trace: &TraceParent) -> Option<String> {
    let trace_id = format!("trace_id={}", trace.trace_id());
    let parent_id = format!("parent_id={}", trace.parent_id());
    let line = log
        .lines()
        .find(|l| l.contains(&trace_id) && l.contains(&parent_id) && l.contains("command done"))?;
    let span = line.split("span_id=").nth(1)?.get(..16)?;
    Some(span.to_owned())
}

/// The `traceparent` of the last event of `entity` in the journal.
async fn event_traceparent(s: &Scenario, entity: &str) -> Option<TraceParent> {
    let names = Names::new("ledger");
    let id = EntityId::new(entity).expect("id");
    let subject = names.event_subject(partition_of(&id, PARTITIONS), &id);
    let journal = s.js.get_stream(names.journal_stream(0)).await.ok()?;
    let event = journal
        .get_last_raw_message_by_subject(&subject)
        .await
        .ok()?;
    TraceParent::parse(event.headers.get(HDR_TRACEPARENT)?.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commands_trace_reaches_the_nodes_span_its_events_and_its_outcome() {
    init_tracing();
    let mut s = Scenario::single(PARTITIONS).await;
    let logs = tempfile::tempdir().expect("temp dir");
    let log = logs.path().join("n1.log");
    let spec = s.node_spec(&[("RUST_LOG", "jetshard=debug")]);
    let mut options = s.node_options();
    options.log_file = Some(log.clone());
    let node = Node::start_with(&s.urls_from(0), "n1", &spec, &options).await;
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();

    // CommandSender::traced: the trace goes into the node's span and onto the event.
    let trace = TraceParent::new_root();
    let untraced = s.sender.clone();
    s.sender = untraced.traced(trace);
    s.send("traced", Op::Append(0)).await;
    s.sender = untraced;
    let mut span = None;
    wait_until(
        Duration::from_secs(20),
        "the node's span of the command",
        || {
            span = span_of(&read_log(), &trace);
            let found = span.is_some();
            async move { found }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
    let span = span.expect("span id");
    assert_ne!(span, trace.parent_id().to_string());
    let on_event = event_traceparent(&s, "traced")
        .await
        .expect("event traceparent");
    assert_eq!(on_event.trace_id(), trace.trace_id());
    assert_eq!(
        on_event.parent_id().to_string(),
        span,
        "the event's parent is the command's span"
    );

    // Any client: a raw publish with `traceparent` and `Jetshard-Reply-To`; the outcome comes
    // back under the command's span of the same trace.
    let caller = trace.child();
    let inbox = s.client.new_inbox();
    let mut replies = s.client.subscribe(inbox.clone()).await.expect("subscribe");
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(HDR_TRACEPARENT, caller.to_string());
    headers.insert(HDR_REPLY_TO, inbox.as_str());
    let payload = serde_json::to_vec(&LedgerCmd::Append { n: 1 }).expect("encode");
    let seq =
        s.js.publish_with_headers("ledger.cmd.traced", headers, payload.into())
            .await
            .expect("publish")
            .await
            .expect("stored")
            .sequence;
    s.history.record("traced", Op::Append(1), Ack::Acked(seq));
    let reply = tokio::time::timeout(Duration::from_secs(20), replies.next())
        .await
        .expect("an outcome in time")
        .expect("a reply");
    let outcome: CommandOutcome = serde_json::from_slice(&reply.payload).expect("outcome");
    assert!(
        matches!(outcome, CommandOutcome::Applied { events: 1, .. }),
        "{outcome:?}"
    );
    let on_reply = reply
        .headers
        .as_ref()
        .and_then(|h| h.get(HDR_TRACEPARENT))
        .and_then(|v| TraceParent::parse(v.as_str()))
        .expect("reply traceparent");
    assert_eq!(on_reply.trace_id(), trace.trace_id());
    assert_ne!(on_reply.parent_id(), caller.parent_id());
    let span = span_of(&read_log(), &caller).expect("the node's span of the raw command");
    assert_eq!(on_reply.parent_id().to_string(), span);
    let on_event = event_traceparent(&s, "traced")
        .await
        .expect("event traceparent");
    assert_eq!(
        on_event, on_reply,
        "the event and the reply share the command's span"
    );

    // An untraced command carries no trace.
    s.send("untraced", Op::Append(0)).await;
    s.check().await;
    assert_eq!(event_traceparent(&s, "untraced").await, None);
    drop(node);
}
