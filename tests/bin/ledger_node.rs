//! A node process for multi-process tests: runs the `ledger` shard system until SIGTERM and
//! prints each ownership change on stdout, one line each:
//! `ACQUIRED <partition> <generation> <unix ms>` and `RELEASED <partition> <generation> <unix ms> <reason>`,
//! and `SERVER <name>` whenever the server it is connected to changes.
//!
//! Usage: `ledger-node <nats url[,url...]> <node id> <partitions> <pin ttl ms> <ack wait ms> [options]`.
//!
//! Options (all optional, each followed by its value):
//! `--replicas <1|3|5>`, `--journal-streams <n>`, `--write-timeout-ms <ms>`, `--max-deliver <n>`,
//! `--user <name> --password <secret>`, `--token <token>`, `--nkey <seed>`, `--creds <file>`,
//! `--tls-ca <file>`, `--tls-cert <file> --tls-key <file>`, `--inbox-prefix <prefix>`,
//! `--stock on` (also run the saga's `stock` entity type, same partitions, no ownership lines),
//! `--ignore-discovered on` (connect only to the servers given, not to those a cluster
//! advertises: a node behind TCP proxies stays behind them).

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jetshard::{OwnershipChange, ShardSystem};
use jetshard_tests::ledger::Ledger;
use jetshard_tests::ledger_config;
use jetshard_tests::stock::{Stock, stock_config};
use tokio::signal::unix::{SignalKind, signal};

/// The options after the positional arguments.
#[derive(Default)]
struct Options {
    replicas: Option<usize>,
    journal_streams: Option<u32>,
    write_timeout: Option<Duration>,
    max_deliver: Option<u32>,
    user: Option<String>,
    password: Option<String>,
    token: Option<String>,
    nkey: Option<String>,
    creds: Option<String>,
    tls_ca: Option<String>,
    tls_cert: Option<String>,
    tls_key: Option<String>,
    inbox_prefix: Option<String>,
    stock: bool,
    ignore_discovered: bool,
}

fn parse_options(args: &[String]) -> Options {
    let mut options = Options::default();
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
            .clone();
        let number =
            |v: &str| -> u64 { v.parse().unwrap_or_else(|_| usage(&format!("{flag} {v}"))) };
        match flag.as_str() {
            "--replicas" => options.replicas = Some(number(&value) as usize),
            "--journal-streams" => options.journal_streams = Some(number(&value) as u32),
            "--write-timeout-ms" => {
                options.write_timeout = Some(Duration::from_millis(number(&value)))
            }
            "--max-deliver" => options.max_deliver = Some(number(&value) as u32),
            "--user" => options.user = Some(value),
            "--password" => options.password = Some(value),
            "--token" => options.token = Some(value),
            "--nkey" => options.nkey = Some(value),
            "--creds" => options.creds = Some(value),
            "--tls-ca" => options.tls_ca = Some(value),
            "--tls-cert" => options.tls_cert = Some(value),
            "--tls-key" => options.tls_key = Some(value),
            "--inbox-prefix" => options.inbox_prefix = Some(value),
            "--stock" => options.stock = value == "on",
            "--ignore-discovered" => options.ignore_discovered = value == "on",
            other => usage(&format!("unknown option {other}")),
        }
    }
    options
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "ledger-node: {problem}\nusage: ledger-node <url[,url...]> <node> <partitions> <pin ttl ms> <ack wait ms> [options]"
    );
    std::process::exit(2);
}

async fn connect_options(options: &Options) -> async_nats::ConnectOptions {
    let mut connect = match (
        &options.user,
        &options.password,
        &options.token,
        &options.nkey,
    ) {
        (Some(user), Some(password), _, _) => {
            async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone())
        }
        (_, _, Some(token), _) => async_nats::ConnectOptions::with_token(token.clone()),
        (_, _, _, Some(seed)) => async_nats::ConnectOptions::with_nkey(seed.clone()),
        _ => match &options.creds {
            Some(path) => async_nats::ConnectOptions::with_credentials_file(path)
                .await
                .expect("credentials file"),
            None => async_nats::ConnectOptions::new(),
        },
    };
    if let Some(ca) = &options.tls_ca {
        connect = connect.add_root_certificates(ca.into()).require_tls(true);
    }
    if let (Some(cert), Some(key)) = (&options.tls_cert, &options.tls_key) {
        connect = connect.add_client_certificate(cert.into(), key.into());
    }
    if let Some(prefix) = &options.inbox_prefix {
        connect = connect.custom_inbox_prefix(prefix);
    }
    if options.ignore_discovered {
        connect = connect.ignore_discovered_servers();
    }
    connect.reconnect_delay_callback(|_| Duration::from_millis(100))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "jetshard=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args: Vec<String> = std::env::args().collect();
    let (url, node, partitions, pin_ttl_ms, ack_wait_ms) = match &args[..] {
        [_, url, node, partitions, pin_ttl_ms, ack_wait_ms, ..] => {
            (url, node, partitions, pin_ttl_ms, ack_wait_ms)
        }
        _ => usage("missing arguments"),
    };
    let options = parse_options(&args[6..]);
    let urls: Vec<&str> = url.split(',').collect();
    let client = connect_options(&options)
        .await
        .connect(urls.as_slice())
        .await
        .expect("connect");
    let partitions: u32 = partitions.parse().expect("partitions");
    let settings = |mut config: jetshard::ShardConfigBuilder| {
        config = config
            .pin_ttl(Duration::from_millis(pin_ttl_ms.parse().expect("pin ttl")))
            .ack_wait(Duration::from_millis(
                ack_wait_ms.parse().expect("ack wait"),
            ));
        if let Some(replicas) = options.replicas {
            config = config.replicas(replicas);
        }
        if let Some(streams) = options.journal_streams {
            config = config.journal_streams(streams);
        }
        if let Some(timeout) = options.write_timeout {
            config = config.write_timeout(timeout);
        }
        if let Some(max_deliver) = options.max_deliver {
            config = config.max_deliver(max_deliver);
        }
        config.build().expect("config")
    };
    let system =
        ShardSystem::start::<Ledger>(client.clone(), settings(ledger_config(partitions, node)))
            .await
            .expect("start");
    let stock = if options.stock {
        let config = settings(stock_config(partitions, node));
        Some(
            ShardSystem::start::<Stock>(client.clone(), config)
                .await
                .expect("start the stock"),
        )
    } else {
        None
    };
    let mut events = system.ownership_events();
    let mut terminate = signal(SignalKind::terminate()).expect("signal");
    let mut server_check = tokio::time::interval(Duration::from_millis(100));
    let mut server = String::new();
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
            _ = server_check.tick() => {
                let name = client.server_info().server_name;
                if name != server {
                    println!("SERVER {name}");
                    let _ = std::io::stdout().flush();
                    server = name;
                }
            }
            _ = terminate.recv() => break,
        }
    }
    // Both hand their partitions off at once.
    let stock = async {
        if let Some(stock) = stock {
            stock.shutdown().await.expect("shutdown the stock");
        }
    };
    let (_, ledger) = tokio::join!(stock, system.shutdown());
    ledger.expect("shutdown");
    println!("STOPPED");
}
