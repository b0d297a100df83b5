//! `order-processor`: the jetshard example's command line. See the library docs
//! (`src/lib.rs`) for what each command shows.

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use order_processor::rules::Features;
use order_processor::{demo, load, node, nodes, status, verify};

/// The flags that turn on the rules' features; `node` and `verify` take the same.
#[derive(clap::Args, Debug, Clone, Copy)]
struct FeatureFlags {
    /// Run the `inventory` entity type too: orders reserve their items from it (a saga);
    /// every node must agree.
    #[arg(long)]
    inventory: bool,
    /// Cancel an order not paid this long after it was placed (a durable timer), e.g. `30s`,
    /// `500ms`, `2m`; every node must agree.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    payment_timeout: Option<Duration>,
}

impl From<FeatureFlags> for Features {
    fn from(flags: FeatureFlags) -> Features {
        Features {
            inventory: flags.inventory,
            payment_timeout: flags.payment_timeout,
        }
    }
}

/// `250ms`, `30s`, `2m`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: a number and a unit (ms, s, m)"))?;
    let duration = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        _ => return Err(format!("{text:?}: the unit must be ms, s or m")),
    };
    if duration.is_zero() {
        return Err(format!("{text:?}: must be more than 0"));
    }
    Ok(duration)
}

#[derive(Parser)]
#[command(
    name = "order-processor",
    about = "jetshard example: an order processor on several nodes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs one node until SIGINT or SIGTERM (then drains, acknowledges and unpins).
    Node {
        /// The NATS server, or the servers of a cluster, comma-separated.
        #[arg(long, value_name = "URLS")]
        nats_url: String,
        /// This node's id, shown in fence records and logs [default: <hostname>-<pid>].
        #[arg(long)]
        node_id: Option<String>,
        /// Partitions; every node must agree.
        #[arg(long, default_value_t = 8)]
        partitions: u32,
        /// Pin TTL in milliseconds; every node must agree.
        #[arg(long, default_value_t = 2000)]
        pin_ttl_ms: u64,
        /// Ack wait in milliseconds; every node must agree.
        #[arg(long, default_value_t = 5000)]
        ack_wait_ms: u64,
        /// Stream replicas (3 on a clustered JetStream); every node must agree.
        #[arg(long, default_value_t = 1)]
        replicas: usize,
        /// How often the owners compact their partitions, in milliseconds [default: jetshard's,
        /// 30 s].
        #[arg(long)]
        compaction_interval_ms: Option<u64>,
        /// How often the node logs its status, in milliseconds.
        #[arg(long, default_value_t = 5000)]
        report_every_ms: u64,
        /// Serve Prometheus metrics at /metrics, and /healthz and /readyz, on HOST:PORT.
        #[arg(long, value_name = "HOST:PORT")]
        metrics_addr: Option<String>,
        #[command(flatten)]
        features: FeatureFlags,
    },
    /// Publishes a realistic mix of commands for N orders, with a progress bar.
    Load {
        /// The NATS server, or the servers of a cluster, comma-separated.
        #[arg(long, value_name = "URLS")]
        nats_url: String,
        /// How many orders.
        #[arg(long)]
        orders: u32,
        /// Commands per second over all orders [default: as fast as the server confirms].
        #[arg(long)]
        rate: Option<u32>,
        /// Orders in flight at once.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Seed of the order scripts.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Prefix of the order ids [default: a new one per run].
        #[arg(long)]
        prefix: Option<String>,
    },
    /// Prints, per partition: owner node, generation, pending, ack pending, paused.
    Status {
        /// The NATS server, or the servers of a cluster, comma-separated.
        #[arg(long, value_name = "URLS")]
        nats_url: String,
    },
    /// Prints an order's current state, as its owner holds it (a state query: answered only by
    /// the owner of the partition's current generation).
    Get {
        /// The NATS server, or the servers of a cluster, comma-separated.
        #[arg(long, value_name = "URLS")]
        nats_url: String,
        /// The order id.
        order: String,
        /// How long to wait for the owner, in milliseconds.
        #[arg(long, default_value_t = 3000)]
        wait_ms: u64,
    },
    /// Checks the journal against every command sent; exits 1 on a violation.
    Verify {
        /// The NATS server, or the servers of a cluster, comma-separated.
        #[arg(long, value_name = "URLS")]
        nats_url: String,
        /// How long to wait for the partitions to drain before checking, in seconds.
        #[arg(long, default_value_t = 30)]
        settle_secs: u64,
        /// The features the nodes ran with: their flags.
        #[command(flatten)]
        features: FeatureFlags,
    },
    /// Starts a server and three nodes, loads orders, kills a node, verifies.
    Demo {
        /// Orders to load.
        #[arg(long, default_value_t = 800)]
        orders: u32,
        /// Commands per second.
        #[arg(long, default_value_t = 400)]
        rate: u32,
        /// Partitions.
        #[arg(long, default_value_t = 8)]
        partitions: u32,
        /// Pin TTL in milliseconds.
        #[arg(long, default_value_t = 2000)]
        pin_ttl_ms: u64,
        /// Ack wait in milliseconds.
        #[arg(long, default_value_t = 5000)]
        ack_wait_ms: u64,
        /// What happens to the node owning the most partitions.
        #[arg(long, value_enum, default_value_t = demo::Fault::Kill)]
        fault: demo::Fault,
        /// Serve each node's /metrics, /healthz and /readyz on 127.0.0.1:PORT, PORT+1, PORT+2.
        #[arg(long, value_name = "PORT")]
        metrics_port: Option<u16>,
        /// The nodes' payment timeout (the demo runs them with `--inventory` and this).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "3s")]
        payment_timeout: Duration,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_filter = match cli.command {
        Command::Node { .. } => "info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match run(cli.command).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn connect(urls: &str) -> anyhow::Result<async_nats::Client> {
    order_processor::connect(urls, async_nats::ConnectOptions::new()).await
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Node {
            nats_url,
            node_id,
            partitions,
            pin_ttl_ms,
            ack_wait_ms,
            replicas,
            compaction_interval_ms,
            report_every_ms,
            metrics_addr,
            features,
        } => {
            let node_id = match node_id {
                Some(id) => id,
                None => order_processor::order::shard_config()
                    .build()?
                    .node_id()
                    .to_owned(),
            };
            node::run(node::NodeOptions {
                nats_url,
                node_id,
                partitions,
                pin_ttl: Duration::from_millis(pin_ttl_ms),
                ack_wait: Duration::from_millis(ack_wait_ms),
                replicas,
                compaction_interval: compaction_interval_ms.map(Duration::from_millis),
                report_every: Duration::from_millis(report_every_ms.max(100)),
                metrics_addr,
                features: features.into(),
            })
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Load {
            nats_url,
            orders,
            rate,
            concurrency,
            seed,
            prefix,
        } => {
            let client = connect(&nats_url).await?;
            let options = load::LoadOptions {
                orders,
                rate,
                concurrency,
                seed,
                prefix: prefix.unwrap_or_else(load::run_prefix),
            };
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{bar:40} {pos}/{len} commands {per_sec} {eta}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            let report = load::run(client, &options, &bar).await?;
            bar.finish_and_clear();
            println!(
                "published {} commands for {} orders ({} malformed bodies) in {:.1} s; {} unconfirmed, {} skipped; order ids {}-*",
                report.published,
                report.orders,
                report.malformed,
                report.elapsed.as_secs_f64(),
                report.failed,
                report.skipped,
                options.prefix
            );
            Ok(if report.failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Status { nats_url } => {
            let client = connect(&nats_url).await?;
            print!("{}", status::run(client).await?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Get {
            nats_url,
            order,
            wait_ms,
        } => {
            let client = connect(&nats_url).await?;
            let answer = jetshard::admin::Admin::new(client, order_processor::order::ENTITY_TYPE)
                .get(&order, Duration::from_millis(wait_ms))
                .await?;
            let state: order_processor::order::OrderState = serde_json::from_slice(&answer.state)?;
            println!(
                "{order} (partition {}, generation {}, last command {}): {state:?}",
                answer.partition, answer.generation, answer.last_command_seq
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify {
            nats_url,
            settle_secs,
            features,
        } => {
            let client = connect(&nats_url).await?;
            let options = verify::VerifyOptions {
                settle: Duration::from_secs(settle_secs),
                features: features.into(),
            };
            let report = verify::run(client, &options).await?;
            println!("{report}");
            Ok(if report.violations.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Demo {
            orders,
            rate,
            partitions,
            pin_ttl_ms,
            ack_wait_ms,
            fault,
            metrics_port,
            payment_timeout,
        } => {
            let options = demo::DemoOptions {
                orders,
                rate,
                settings: nodes::NodeSettings {
                    partitions,
                    pin_ttl: Duration::from_millis(pin_ttl_ms),
                    ack_wait: Duration::from_millis(ack_wait_ms),
                },
                fault_at_percent: 35,
                fault,
                metrics_port,
                features: Features {
                    inventory: true,
                    payment_timeout: Some(payment_timeout),
                },
            };
            // Interrupted, the demo is dropped: its node processes and its server are killed.
            let outcome = tokio::select! {
                outcome = demo::run(options) => outcome?,
                _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted"),
            };
            Ok(if outcome.report.violations.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_with_a_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["", "5", "s", "1h", "0s", "-1s", "1.5s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
