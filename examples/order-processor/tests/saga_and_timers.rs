//! Three `order-processor node` processes with both features on (`--inventory`,
//! `--payment-timeout`) against a real server: while orders load, and their reservations and
//! timers are in flight, the node owning the most partitions is SIGKILLed. `verify` then finds
//! every command answered once, every outbox message stored once, no item reserved twice or
//! lost, and every timer fired once and never after a payment; `get` reads an order's state.

mod common;

use std::time::{Duration, Instant};

use jetshard_testkit::NatsServer;
use order_processor::demo::feature_args;
use order_processor::rules::Features;

/// The number after `prefix` on the report line that starts with `line`.
fn number(report: &str, line: &str, prefix: &str) -> usize {
    let text = report
        .lines()
        .find(|l| l.starts_with(line))
        .unwrap_or_else(|| panic!("no {line:?} line in\n{report}"));
    let after = &text[text.find(prefix).expect(prefix) + prefix.len()..];
    after
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {prefix:?} in {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_saga_and_the_timers_hold_through_a_sigkill() {
    let started = Instant::now();
    let server = NatsServer::start().await.expect("nats-server");
    let url = server.url();
    let logs = tempfile::tempdir().expect("temp dir");
    let features = Features {
        inventory: true,
        payment_timeout: Some(Duration::from_secs(3)),
    };
    let flags = feature_args(&features);
    let mut nodes = common::start_three(&url, logs.path(), &flags).await;

    // About 2,000 commands over 8 s, besides the reservations, their answers and the timers.
    let load = common::start_load(&url, &["--orders", "400", "--rate", "250", "--prefix", "t"]);

    let (victim, killed_parts, survivors) = common::kill_the_busiest(&mut nodes).await;

    common::finish_load(load).await;

    let mut args = vec!["verify", "--nats-url", &url, "--settle-secs", "60"];
    args.extend(flags.iter().map(String::as_str));
    let (verified, report) = common::output(&args, Duration::from_secs(120)).await;
    eprintln!(
        "killed {} (partitions {killed_parts:?})\n{report}",
        nodes.0[victim].id
    );
    assert!(verified.success(), "verify found violations:\n{report}");
    assert!(report.contains("violations: 0"), "{report}");
    assert!(report.contains("takeovers: "), "{report}");
    assert!(number(&report, "saga: ", "saga: ") > 0, "{report}");
    assert!(number(&report, "timers: ", "timers: ") > 0, "{report}");
    // Abandoned orders (about one in twelve) are never paid: their timers fire.
    assert!(number(&report, "timers: ", "set, ") > 0, "{report}");

    // A state query, answered by the order's owner.
    let get = ["get", "--nats-url", &url, "t-0"];
    let (got, answer) = common::output(&get, Duration::from_secs(30)).await;
    assert!(got.success(), "get failed: {answer}");
    assert!(answer.starts_with("t-0 (partition "), "{answer}");
    assert!(answer.contains("phase: "), "{answer}");

    for node in survivors {
        nodes.0[node].terminate(Duration::from_secs(20)).await;
    }
    eprintln!("test took {:?}", started.elapsed());
}
