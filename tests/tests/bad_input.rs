//! Bad input through the ledger: payloads that do not decode, ids that are not one token and
//! handlers that always panic. Each shows the clear error (or the dead letter), that nothing
//! else was lost or held up, and, after a restart of the node, that every partition is acquired
//! again and serves: the worst failures appear only at the next takeover.
//!
//! The rest of the bad input: payloads over the server's `max_payload`
//! (`tests/tests/max_payload.rs`), hostile payloads against the default codec
//! (`tests/tests/hostile_codec.rs`), fuzzed framework records (`tests/tests/fuzz.rs`). Bad
//! records and handlers that kill processes: `tests/tests/poison.rs`,
//! `tests/tests/deadly_commands.rs`.
//!
//! Covered elsewhere, not repeated here: a partition-count mismatch with existing streams and a
//! server that is down at start (`tests/tests/topology.rs`).

use std::time::Duration;

use async_nats::jetstream;
use jetshard::admin::Admin;
use jetshard::{Error, InvalidId};
use jetshard_tests::ledger::LedgerCmd;
use jetshard_tests::model::Op;
use jetshard_tests::{Scenario, counts, init_tracing};

/// A command as JSON, the ledger's codec, as a foreign client would publish it.
fn encode(command: &LedgerCmd) -> Vec<u8> {
    serde_json::to_vec(command).expect("encode")
}

async fn stream_messages(js: &jetstream::Context, stream: &str) -> u64 {
    js.get_stream(stream)
        .await
        .expect("stream")
        .info()
        .await
        .expect("info")
        .state
        .messages
}

/// Payloads that are no ledger command, each a different way of being wrong.
fn garbage() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("empty", Vec::new()),
        ("binary", vec![0xff, 0xfe, 0x00, 0x01, 0x80]),
        ("truncated json", b"{\"Push\":{\"n\":".to_vec()),
        ("wrong field type", b"{\"Push\":{\"n\":\"seven\"}}".to_vec()),
        ("unknown variant", b"{\"Explode\":{}}".to_vec()),
        ("json null", b"null".to_vec()),
        ("trailing bytes", b"{\"Push\":{\"n\":1}} {}".to_vec()),
        (
            "invalid utf-8 in a string",
            b"{\"Push\":{\"n\":\"\xc3\x28\"}}".to_vec(),
        ),
        // Far deeper than serde_json's recursion limit: an error, not a stack overflow.
        (
            "deep nesting",
            [vec![b'['; 20_000], vec![b']'; 20_000]].concat(),
        ),
        (
            "number overflow",
            b"{\"Push\":{\"n\":18446744073709551616}}".to_vec(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_payloads_are_terminated_counted_and_never_block_their_partition() {
    init_tracing();
    let mut s = Scenario::single(2).await;
    // The streams exist; the commands wait for an owner, so it gets them in one batch.
    s.provision().await;

    // Every entity gets good commands with garbage between them, in both partitions.
    let entities = ["g0", "g1", "g2", "g3"];
    let garbage = garbage();
    let mut n = 0;
    for (_, payload) in &garbage {
        for entity in entities {
            s.send_raw(entity, encode(&LedgerCmd::Push { n }), Op::Push(n))
                .await;
            s.send_raw(entity, payload.clone(), Op::Garbage).await;
        }
        n += 1;
    }
    for entity in entities {
        s.send_raw(entity, encode(&LedgerCmd::Push { n }), Op::Push(n))
            .await;
    }
    let system = s.system("n1").await;

    let report = s.check_within(Duration::from_secs(30)).await;
    let bad = (garbage.len() * entities.len()) as u64;
    assert_eq!(report.summary().dead_letters as u64, bad, "{report}");

    // Counted by the owners, and visible to an operator with the payload and the reason.
    let c = counts(&system).await;
    assert_eq!(c.dead_lettered, bad, "{c:?}");
    assert_eq!(c.applied, (n + 1) * entities.len() as u64, "{c:?}");
    let letters = Admin::new(s.client.clone(), "ledger")
        .dead_letters()
        .await
        .unwrap();
    assert_eq!(letters.len() as u64, bad);
    for letter in &letters {
        assert_eq!(letter.deliveries, 1, "terminated at once: {letter:?}");
        assert!(letter.reason.starts_with("malformed"), "{letter:?}");
        assert!(
            garbage.iter().any(|(_, g)| g[..] == letter.payload[..]),
            "the dead letter keeps the payload as published"
        );
    }
    let system = s.restart_serves(system, "n2").await;
    s.check().await;
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_that_are_not_one_token_are_a_typed_error_at_publish_and_nothing_is_stored() {
    init_tracing();
    let s = Scenario::single(2).await;
    let system = s.system("n1").await;
    let (js, sender) = (&s.js, &s.sender);
    let command = LedgerCmd::Push { n: 0 };

    let too_long = "x".repeat(jetshard::MAX_ID_LEN + 1);
    for id in [
        "",
        "a.b",
        "a*",
        ">",
        "a b",
        "tab\there",
        "line\nbreak",
        "\u{7}",
        ".",
        "a.>",
        &too_long,
    ] {
        let error = sender.send(id, &command).await.expect_err(id);
        match &error {
            Error::InvalidId(InvalidId::Empty) => assert_eq!(id, ""),
            Error::InvalidId(InvalidId::TooLong { len, max }) => {
                assert_eq!((*len, *max), (too_long.len(), jetshard::MAX_ID_LEN));
            }
            Error::InvalidId(InvalidId::ForbiddenChar { id: bad, .. }) => assert_eq!(bad, id),
            other => panic!("{id:?}: not an id error: {other:?}"),
        }
        assert!(error.to_string().contains("entity id"), "{error}");
    }
    // A foreign client publishing an id of two tokens reaches no stream at all.
    let refused = js.publish("ledger.cmd.a.b", "{}".into()).await;
    let refused = match refused {
        Ok(ack) => ack.await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(refused.is_err(), "a two-token id was stored");

    assert_eq!(stream_messages(js, "LEDGER_CMD").await, 0);
    assert_eq!(stream_messages(js, "LEDGER_JOURNAL").await, 0);
    // The sender still works for a good id.
    let mut s = s;
    s.send("ok", Op::Push(0)).await;
    let system = s.restart_serves(system, "n2").await;
    s.check().await;
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_command_for_an_over_long_id_is_terminated_and_reported_as_a_dead_letter() {
    init_tracing();
    let mut s = Scenario::single(1).await;
    let system = s.system("n1").await;

    // One subject token to the server, but longer than an entity id may be.
    let long = "y".repeat(jetshard::MAX_ID_LEN + 44);
    let push = encode(&LedgerCmd::Push { n: 0 });
    s.send_raw("before", push.clone(), Op::Push(0)).await;
    // Not a command the entity can take: the checker expects it dead-lettered.
    let bad = s.send_raw(&long, push.clone(), Op::Garbage).await;
    s.send_raw("after", push, Op::Push(0)).await;

    // The partition moves on: every command worked through, and the over-long one has its
    // dead letter (the check panics with the report otherwise).
    let report = s.check_within(Duration::from_secs(10)).await;
    let letters = Admin::new(s.client.clone(), "ledger")
        .dead_letters()
        .await
        .unwrap();
    let counted = counts(&system).await.dead_lettered;
    // Its dead letter names an id no entity can have: the next acquisition skips it.
    let system = s.restart_serves(system, "n2").await;
    s.check().await;
    system.shutdown().await.unwrap();
    // An operator can see what was thrown away, as for any other command given up.
    assert!(
        report.is_ok() && counted == 1,
        "the command {bad:?} for a {}-byte id was terminated without a dead-letter record \
         (counted as dead-lettered: {counted}; dead letters: {letters:?})\n{report}",
        long.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_always_panics_is_dead_lettered_after_max_deliver_and_its_partition_moves_on()
 {
    init_tracing();
    let mut s = Scenario::single(2).await;
    let system = s.system_with(s.config("n1").max_deliver(3)).await;

    let entities = ["p0", "p1", "p2", "p3", "p4", "p5"];
    for entity in entities {
        for op in [Op::Push(0), Op::Panic, Op::Push(1)] {
            let command = op.command().unwrap();
            s.send_raw(entity, encode(&command), op).await;
        }
    }
    // Bystanders in the same partitions keep going while the panics are retried.
    for n in 0..20 {
        for entity in ["q0", "q1"] {
            s.send_raw(entity, encode(&LedgerCmd::Push { n }), Op::Push(n))
                .await;
        }
    }

    s.check_within(Duration::from_secs(60)).await;
    let letters = Admin::new(s.client.clone(), "ledger")
        .dead_letters()
        .await
        .unwrap();
    assert_eq!(letters.len(), entities.len(), "{letters:?}");
    for letter in &letters {
        assert_eq!(letter.deliveries, 3, "{letter:?}");
        assert!(letter.reason.contains("panicked"), "{letter:?}");
    }
    let system = s.restart_serves(system, "n2").await;
    s.check().await;
    system.shutdown().await.unwrap();
}
