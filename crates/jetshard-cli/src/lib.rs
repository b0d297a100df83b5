//! `jetshard`: operate an entity type from the command line. The binary is a thin `main`
//! around [`run`], which tests call directly.
//!
//! ```text
//! jetshard --nats-url nats://127.0.0.1:4222 status order
//! jetshard pause order 3 --for-secs 600
//! jetshard resume order 3
//! jetshard unpin order 3
//! jetshard dead-letters order
//! ```

#![deny(missing_docs)]

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use jetshard::admin::Admin;

/// The command line.
#[derive(Parser)]
#[command(name = "jetshard", version, about = "Operate jetshard entity types")]
pub struct Cli {
    /// NATS server URL(s), comma-separated.
    #[arg(
        long,
        global = true,
        default_value = "nats://127.0.0.1:4222",
        env = "NATS_URL"
    )]
    nats_url: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Per partition: owner node, generation, pinned, pending, ack pending, paused.
    Status {
        /// The entity type, e.g. `order`.
        entity_type: String,
    },
    /// Pause delivery of a partition's commands (they queue up).
    Pause {
        /// The entity type.
        entity_type: String,
        /// The partition.
        partition: u32,
        /// How long.
        #[arg(long, default_value_t = 3600)]
        for_secs: u64,
    },
    /// Resume a paused partition.
    Resume {
        /// The entity type.
        entity_type: String,
        /// The partition.
        partition: u32,
    },
    /// Move a partition to a standby process now.
    Unpin {
        /// The entity type.
        entity_type: String,
        /// The partition.
        partition: u32,
    },
    /// List commands that were given up.
    DeadLetters {
        /// The entity type.
        entity_type: String,
    },
}

/// Parses `args` (the first is the program name) and runs the command, writing its report to
/// `out`.
///
/// # Errors
/// Bad arguments, an unreachable server, or a failed request.
pub async fn run<I, T>(args: I, out: &mut impl Write) -> anyhow::Result<()>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::try_parse_from(args)?;
    let client = async_nats::connect(&cli.nats_url)
        .await
        .with_context(|| format!("connecting to {}", cli.nats_url))?;
    match cli.command {
        Command::Status { entity_type } => {
            let overview = Admin::new(client, &entity_type).overview().await?;
            writeln!(
                out,
                "{:>9}  {:<24} {:>10}  {:<6} {:>8} {:>11} {:>7}",
                "partition", "owner", "generation", "pinned", "pending", "ack pending", "paused"
            )?;
            for p in overview {
                writeln!(
                    out,
                    "{:>9}  {:<24} {:>10}  {:<6} {:>8} {:>11} {:>7}",
                    p.partition,
                    p.owner.as_deref().unwrap_or("-"),
                    p.generation,
                    if p.pinned { "yes" } else { "no" },
                    p.pending,
                    p.ack_pending,
                    p.paused
                        .map_or_else(|| "no".to_owned(), |d| format!("{}s", d.as_secs())),
                )?;
            }
        }
        Command::Pause {
            entity_type,
            partition,
            for_secs,
        } => {
            Admin::new(client, &entity_type)
                .pause(partition, Duration::from_secs(for_secs))
                .await?;
            writeln!(
                out,
                "partition {partition} of {entity_type} paused for {for_secs} s"
            )?;
        }
        Command::Resume {
            entity_type,
            partition,
        } => {
            Admin::new(client, &entity_type).resume(partition).await?;
            writeln!(out, "partition {partition} of {entity_type} resumed")?;
        }
        Command::Unpin {
            entity_type,
            partition,
        } => {
            Admin::new(client, &entity_type).unpin(partition).await?;
            writeln!(out, "partition {partition} of {entity_type} unpinned")?;
        }
        Command::DeadLetters { entity_type } => {
            for letter in Admin::new(client, &entity_type).dead_letters().await? {
                writeln!(
                    out,
                    "seq {} partition {} entity {} command {} deliveries {} generation {}: {}",
                    letter.seq,
                    letter.partition,
                    letter.entity,
                    letter.command_seq,
                    letter.deliveries,
                    letter.generation,
                    letter.reason
                )?;
            }
        }
    }
    Ok(())
}
