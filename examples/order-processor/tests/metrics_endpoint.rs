//! `order-processor node --metrics-addr`: a node child process against a real server serves
//! the jetshard series at `/metrics` while orders load, `/healthz` at once, and `/readyz` with
//! every partition serving once it has acquired them.

use std::process::Stdio;
use std::time::Duration;

use jetshard_testkit::{NatsServer, wait_until};
use order_processor::nodes::{NodeProcess, NodeSettings};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_order-processor");

/// `GET path` over HTTP/1.0 on a raw connection: the status code and the body.
async fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((status, body.to_owned()))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

/// The value of one series (name and labels exactly as rendered), if present.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// The `jetshard_*` series named in `text`, without the `_bucket`, `_sum`, `_count` of
/// histograms.
fn series_named(text: &str) -> std::collections::BTreeSet<String> {
    text.match_indices("jetshard_")
        .map(|(at, _)| {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(&name)
                .to_owned()
        })
        .collect()
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("local addr").port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_serves_its_metrics_and_turns_ready_once_it_serves_its_partitions() {
    let server = NatsServer::start().await.expect("nats-server");
    let url = server.url();
    let logs = tempfile::tempdir().expect("temp dir");
    let addr = format!("127.0.0.1:{}", free_port());
    let settings = NodeSettings {
        partitions: 2,
        pin_ttl: Duration::from_millis(1000),
        ack_wait: Duration::from_millis(3000),
    };
    let log = logs.path().join("a.log");
    let extra = ["--metrics-addr".to_owned(), addr.clone()];
    let mut node = NodeProcess::spawn_with(BIN.as_ref(), &url, "a", &settings, &log, &extra)
        .expect("spawn node");
    node.wait_ready(Duration::from_secs(30))
        .await
        .expect("node ready");

    assert_eq!(get(&addr, "/healthz").await, Some((200, "ok\n".to_owned())));
    assert_eq!(get(&addr, "/nowhere").await.map(|(s, _)| s), Some(404));
    // No command yet, so no pin: the node pulls both partitions as a standby and serves none.
    let (status, body) = get(&addr, "/readyz").await.expect("readyz");
    assert_eq!((status, body.as_str()), (200, "ready\nserving \n"));
    let metrics = get(&addr, "/metrics").await.expect("metrics").1;
    let owned = "jetshard_partition_owned{entity_type=\"order\",partition=\"0\"}";
    assert_eq!(sample(&metrics, owned), Some(0.0), "{metrics}");

    let load = tokio::process::Command::new(BIN)
        .args(["load", "--nats-url", &url, "--orders", "40"])
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .status();
    let loaded = tokio::time::timeout(Duration::from_secs(60), load)
        .await
        .expect("load in time")
        .expect("load ran");
    assert!(loaded.success(), "load: {loaded}");

    // Acquired: both partitions serving.
    wait_until(
        Duration::from_secs(20),
        "both partitions serving",
        || async { get(&addr, "/readyz").await == Some((200, "ready\nserving 0,1\n".to_owned())) },
    )
    .await
    .expect("ready");

    let applied = |metrics: &str| -> f64 {
        (0..2)
            .filter_map(|p| {
                sample(
                    metrics,
                    &format!(
                        "jetshard_commands_total{{entity_type=\"order\",partition=\"{p}\",outcome=\"applied\"}}"
                    ),
                )
            })
            .sum()
    };
    // The gauges follow the owners' upkeep tick (under a second here).
    let owned = |metrics: &str, p: u32| {
        sample(
            metrics,
            &format!("jetshard_partition_owned{{entity_type=\"order\",partition=\"{p}\"}}"),
        )
    };
    wait_until(Duration::from_secs(20), "commands counted", || async {
        get(&addr, "/metrics").await.is_some_and(|(_, m)| {
            // Every partition has written (the assertions below ask each one), not only the
            // total: the first partition to be acquired can reach 40 alone.
            applied(&m) >= 40.0
                && (0..2).all(|p| {
                    owned(&m, p) == Some(1.0)
                        && sample(
                            &m,
                            &format!(
                                "jetshard_journal_write_seconds_count{{entity_type=\"order\",partition=\"{p}\"}}"
                            ),
                        )
                        .unwrap_or(0.0)
                            > 0.0
                })
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", node.log_tail(40)));

    let (status, metrics) = get(&addr, "/metrics").await.expect("metrics");
    assert_eq!(status, 200);
    for p in 0..2 {
        let labels = format!("entity_type=\"order\",partition=\"{p}\"");
        let value =
            |name: &str, extra: &str| sample(&metrics, &format!("{name}{{{labels}{extra}}}"));
        assert_eq!(
            value("jetshard_partition_owned", ""),
            Some(1.0),
            "{metrics}"
        );
        assert_eq!(
            value("jetshard_acquisitions_total", ",outcome=\"acquired\""),
            Some(1.0),
            "{metrics}"
        );
        assert!(
            value("jetshard_decide_seconds_count", "").unwrap_or(0.0) > 0.0,
            "{metrics}"
        );
        assert!(
            value("jetshard_journal_write_seconds_count", "").unwrap_or(0.0) > 0.0,
            "{metrics}"
        );
        // One per entity loaded from the journal (entities load on their first command).
        assert!(
            value("jetshard_replay_seconds_count", "").unwrap_or(0.0) >= 1.0,
            "{metrics}"
        );
        assert!(
            value("jetshard_entities", ",state=\"resident\"").is_some(),
            "{metrics}"
        );
        assert!(
            value("jetshard_pending_commands", "").is_some(),
            "{metrics}"
        );
        assert!(
            value("jetshard_ack_pending_commands", "").is_some(),
            "{metrics}"
        );
    }
    assert!(
        metrics.contains("# TYPE jetshard_commands_total counter"),
        "{metrics}"
    );
    assert!(
        metrics.contains("# TYPE jetshard_decide_seconds histogram"),
        "{metrics}"
    );
    // The load sends one malformed body per 100 commands or so; the node dead-letters it.
    assert!(metrics.contains("outcome=\"dead_lettered\"}"), "{metrics}");

    // The docs list every series the node exports, and the dashboard shows only series that
    // exist (step-downs are registered at the first one).
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let exported = series_named(&metrics);
    let operations = std::fs::read_to_string(manifest.join("../../docs/OPERATIONS.md"))
        .expect("docs/OPERATIONS.md");
    let documented = series_named(&operations);
    let undocumented: Vec<_> = exported.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/OPERATIONS.md: {undocumented:?}"
    );
    let dashboard = std::fs::read_to_string(manifest.join("grafana/jetshard.json"))
        .expect("grafana/jetshard.json");
    let shown = series_named(&dashboard);
    let unknown: Vec<_> = shown
        .iter()
        .filter(|name| !exported.contains(*name) && *name != "jetshard_step_downs_total")
        .collect();
    assert!(
        unknown.is_empty(),
        "the dashboard shows series nobody exports: {unknown:?}"
    );
    assert!(exported.len() >= 14, "{exported:?}");

    assert!(
        node.terminate(Duration::from_secs(20)).await,
        "node stopped"
    );
}
