//! A node process for multi-process tests: runs the `ledger` shard system until SIGTERM and
//! prints each ownership change on stdout, one line each:
//! `ACQUIRED <partition> <generation> <unix ms>` and `RELEASED <partition> <generation> <unix ms> <reason>`.
//!
//! Usage: `ledger-node <nats url> <node id> <partitions> <pin ttl ms> <ack wait ms>`.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jetshard::{OwnershipChange, ShardSystem};
use jetshard_tests::ledger::Ledger;
use jetshard_tests::ledger_config;
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "jetshard=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().collect();
    let [_, url, node, partitions, pin_ttl_ms, ack_wait_ms] = &args[..] else {
        eprintln!("usage: ledger-node <url> <node> <partitions> <pin ttl ms> <ack wait ms>");
        std::process::exit(2);
    };
    let client = async_nats::ConnectOptions::new()
        .reconnect_delay_callback(|_| Duration::from_millis(100))
        .connect(url.as_str())
        .await
        .expect("connect");
    let config = ledger_config(partitions.parse().expect("partitions"), node)
        .pin_ttl(Duration::from_millis(pin_ttl_ms.parse().expect("pin ttl")))
        .ack_wait(Duration::from_millis(
            ack_wait_ms.parse().expect("ack wait"),
        ))
        .build()
        .expect("config");
    let system = ShardSystem::start::<Ledger>(client, config)
        .await
        .expect("start");
    let mut events = system.ownership_events();
    let mut terminate = signal(SignalKind::terminate()).expect("signal");
    println!("READY");
    loop {
        tokio::select! {
            event = events.recv() => {
                let Ok(event) = event else { continue };
                let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
                match event.change {
                    OwnershipChange::Acquired => println!("ACQUIRED {} {} {now}", event.partition, event.generation),
                    OwnershipChange::Released { reason } => println!("RELEASED {} {} {now} {reason}", event.partition, event.generation),
                    _ => {}
                }
                let _ = std::io::stdout().flush();
            }
            _ = terminate.recv() => break,
        }
    }
    system.shutdown().await.expect("shutdown");
    println!("STOPPED");
}
