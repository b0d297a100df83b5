//! `jetshard`: operate an entity type from the command line. The binary is a thin `main`
//! around [`parse`] and [`execute`]; tests call [`run`], which does both.
//!
//! ```text
//! jetshard --nats-url nats://127.0.0.1:4222 status order
//! jetshard --context orders-admin status order --json
//! jetshard pause order 3 --for-secs 600
//! jetshard resume order 3
//! jetshard unpin order 3
//! jetshard dead-letters order
//! jetshard dead-letters replay order 1234
//! jetshard dead-letters replay order --all          # or --from SEQ / --to SEQ
//! jetshard dead-letters purge order --partition 3 --upto 1234
//! ```
//!
//! Connecting: `--nats-url`, `--creds`, `--user`/`--password`, `--token`, `--nkey` (a seed
//! file), `--tls-ca`, `--tls-cert`/`--tls-key`, `--tls-first`, `--inbox-prefix`, each also
//! from the environment variable the `nats` CLI reads (`NATS_URL`, `NATS_CREDS`, ...), or
//! `--context NAME`: a context as the `nats` CLI saves it
//! (`~/.config/nats/context/NAME.json`, or a path to such a file). A flag wins over the context.

#![deny(missing_docs)]

mod command;
mod connection;
mod dead_letters;
mod describe;
mod report;

use std::io::Write;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use jetshard::admin::Admin;
use serde_json::json;

use crate::command::{Command, DeadLetterAction, DeadLetters};
use crate::connection::Connection;
use crate::dead_letters::dead_letters;
use crate::describe::describe;
use crate::report::{Report, STATUS_WAIT, state_report};

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "jetshard", version, about = "Operate jetshard entity types")]
pub struct Cli {
    #[command(flatten)]
    connection: Connection,
    /// Print JSON (one document) instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

/// Parses `args` (the first is the program name). A `clap::Error` is also how `--help` and
/// `--version` arrive: [`clap::Error::exit`] prints it where it belongs and exits with its
/// status (0 for help and version, 2 for a usage error).
///
/// # Errors
/// Help, version, or bad arguments.
pub fn parse<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Cli::try_parse_from(args)
}

/// Parses `args` and runs the command, writing its report to `out`: [`parse`], then
/// [`execute`].
///
/// # Errors
/// Bad arguments (help and version included), an unreachable server, or a failed request.
pub async fn run<I, T>(args: I, out: &mut impl Write) -> anyhow::Result<()>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    execute(parse(args)?, out).await
}

/// Connects and runs the command, writing its report to `out`.
///
/// # Errors
/// An unreadable context or credentials file, an unreachable server, or a failed request.
pub async fn execute(cli: Cli, out: &mut impl Write) -> anyhow::Result<()> {
    let settings = cli.connection.resolve()?;
    let client = settings.connect().await?;
    let report = match cli.command {
        Command::Status { entity_type } => {
            describe(&client, &entity_type).await?;
            let admin = Admin::new(client, &entity_type);
            let overview = admin.overview().await?;
            let running = admin.nodes(STATUS_WAIT).await?.len();
            Report::Status {
                entity_type,
                overview,
                running,
            }
        }
        Command::Pause {
            entity_type,
            partition,
            for_secs,
        } => {
            describe(&client, &entity_type).await?.check(partition)?;
            Admin::new(client, &entity_type)
                .pause(partition, Duration::from_secs(for_secs))
                .await?;
            Report::Done {
                text: format!("partition {partition} of {entity_type} paused for {for_secs} s"),
                json: json!({"entity_type": entity_type, "partition": partition,
                             "paused_for_secs": for_secs}),
            }
        }
        Command::Resume {
            entity_type,
            partition,
        } => {
            describe(&client, &entity_type).await?.check(partition)?;
            Admin::new(client, &entity_type).resume(partition).await?;
            Report::Done {
                text: format!("partition {partition} of {entity_type} resumed"),
                json: json!({"entity_type": entity_type, "partition": partition,
                             "resumed": true}),
            }
        }
        Command::Unpin {
            entity_type,
            partition,
        } => {
            describe(&client, &entity_type).await?.check(partition)?;
            Admin::new(client, &entity_type).unpin(partition).await?;
            Report::Done {
                text: format!("partition {partition} of {entity_type} unpinned"),
                json: json!({"entity_type": entity_type, "partition": partition,
                             "unpinned": true}),
            }
        }
        Command::Nodes {
            entity_type,
            wait_ms,
        } => {
            describe(&client, &entity_type).await?;
            Report::Nodes(
                Admin::new(client, &entity_type)
                    .nodes(Duration::from_millis(wait_ms))
                    .await?,
            )
        }
        Command::Get {
            entity_type,
            id,
            wait_ms,
        } => {
            let described = describe(&client, &entity_type).await?;
            let answer = Admin::new(client, &entity_type)
                .get(&id, Duration::from_millis(wait_ms))
                .await
                .with_context(|| format!("reading the state of {entity_type} {id}"))?;
            state_report(&entity_type, described.codec.as_deref(), answer)
        }
        Command::DeadLetters(DeadLetters {
            action,
            entity_type,
        }) => {
            let action = match (action, entity_type) {
                (Some(action), _) => action,
                (None, Some(entity_type)) => DeadLetterAction::List { entity_type },
                (None, None) => anyhow::bail!("dead-letters: name an entity type"),
            };
            let entity_type = match &action {
                DeadLetterAction::List { entity_type }
                | DeadLetterAction::Replay { entity_type, .. }
                | DeadLetterAction::Purge { entity_type, .. } => entity_type.clone(),
            };
            let described = describe(&client, &entity_type).await?;
            if let DeadLetterAction::Purge {
                partition: Some(partition),
                ..
            } = &action
            {
                described.check(*partition)?;
            }
            dead_letters(client, action).await?
        }
    };
    if cli.json {
        serde_json::to_writer_pretty(&mut *out, &report.json())?;
        writeln!(out)?;
    } else {
        report.write_text(out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_letters_lists_with_a_type_and_acts_with_a_subcommand() {
        let list = parse(["jetshard", "dead-letters", "order"]).unwrap();
        assert!(matches!(
            list.command,
            Command::DeadLetters(DeadLetters { action: None, entity_type: Some(ref t) }) if t == "order"
        ));
        let replay = parse(["jetshard", "dead-letters", "replay", "order", "17"]).unwrap();
        assert!(matches!(
            replay.command,
            Command::DeadLetters(DeadLetters {
                action: Some(DeadLetterAction::Replay { seq: Some(17), .. }),
                ..
            })
        ));
        let purge = parse([
            "jetshard",
            "dead-letters",
            "purge",
            "order",
            "--partition",
            "3",
            "--upto",
            "40",
        ])
        .unwrap();
        assert!(matches!(
            purge.command,
            Command::DeadLetters(DeadLetters {
                action: Some(DeadLetterAction::Purge {
                    partition: Some(3),
                    upto: Some(40),
                    ..
                }),
                ..
            })
        ));
        assert!(parse(["jetshard", "dead-letters"]).is_err());
    }

    #[test]
    fn json_is_accepted_after_any_subcommand() {
        for args in [
            &["jetshard", "status", "order", "--json"][..],
            &["jetshard", "--json", "pause", "order", "1"],
            &["jetshard", "dead-letters", "replay", "order", "3", "--json"],
        ] {
            assert!(parse(args.iter().copied()).unwrap().json, "{args:?}");
        }
    }
}
