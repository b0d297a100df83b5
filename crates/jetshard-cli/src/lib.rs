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

mod connection;

use std::io::Write;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use jetshard::NodeStatus;
use jetshard::admin::{Admin, DeadLetter, DeadLetterPurge, PartitionOverview, Replayed};
use serde_json::{Value, json};

use crate::connection::Connection;

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

#[derive(Debug, Subcommand)]
enum Command {
    /// Per partition: owner node, generation, pinned, pending, ack pending, redelivered,
    /// waiting pulls, paused.
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
    /// The running processes of an entity type, as they answer on `<t>.status`: the
    /// partitions each owns, and the entities it holds quarantined (their journal cannot be
    /// read back; docs/OPERATIONS.md, "Poison").
    Nodes {
        /// The entity type.
        entity_type: String,
        /// How long to wait for the processes' answers, in milliseconds.
        #[arg(long, default_value_t = 1000)]
        wait_ms: u64,
    },
    /// An entity's current state, answered by the owner of its partition (only under the
    /// current generation, after the commands acknowledged before the query). A state encoded as
    /// JSON is shown as JSON.
    Get {
        /// The entity type.
        entity_type: String,
        /// The entity id.
        id: String,
        /// How long to wait for the owner's answer, in milliseconds.
        #[arg(long, default_value_t = 3000)]
        wait_ms: u64,
    },
    /// List commands that were given up (`dead-letters <type>`), replay one, or purge them.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    DeadLetters(DeadLetters),
}

#[derive(Debug, Args)]
struct DeadLetters {
    #[command(subcommand)]
    action: Option<DeadLetterAction>,
    /// The entity type whose dead letters to list.
    #[arg(required = true)]
    entity_type: Option<String>,
}

#[derive(Debug, Subcommand)]
enum DeadLetterAction {
    /// List the dead letters, oldest first (the same as `dead-letters <type>`).
    List {
        /// The entity type.
        entity_type: String,
    },
    /// Send dead letters' commands again, each as a new command to its entity (stored once
    /// even if replayed twice within the command stream's duplicate window): one (`SEQ`), all
    /// (`--all`), or those in a range of journal sequences (`--from`, `--to`, inclusive).
    #[command(
        override_usage = "jetshard dead-letters replay <ENTITY_TYPE> (<SEQ> | --all | [--from <SEQ>] [--to <SEQ>])"
    )]
    Replay {
        /// The entity type.
        entity_type: String,
        /// The dead letter's journal sequence (`seq` in the list).
        #[arg(required_unless_present_any = ["all", "from", "to"], conflicts_with_all = ["all", "from", "to"])]
        seq: Option<u64>,
        /// Every dead letter of the entity type, oldest first.
        #[arg(long, conflicts_with_all = ["from", "to"])]
        all: bool,
        /// Those at this journal sequence or after.
        #[arg(long)]
        from: Option<u64>,
        /// Those at this journal sequence or before.
        #[arg(long)]
        to: Option<u64>,
    },
    /// Remove dead letters from the journal, except those whose command is not acknowledged
    /// yet (see docs/OPERATIONS.md).
    Purge {
        /// The entity type.
        entity_type: String,
        /// Only this partition's.
        #[arg(long)]
        partition: Option<u32>,
        /// Only those at this journal sequence or below.
        #[arg(long)]
        upto: Option<u64>,
    },
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

/// How long `status` waits for running processes to answer.
const STATUS_WAIT: Duration = Duration::from_millis(500);

/// What the command stream of an entity type says of it.
struct Described {
    entity_type: String,
    /// From the stream's partition transform.
    partitions: Option<u32>,
    /// The codec recorded with the stream (`jetshard.codec`), if any.
    codec: Option<String>,
}

impl Described {
    /// Refuses a partition the entity type does not have, in words.
    fn check(&self, partition: u32) -> anyhow::Result<()> {
        match self.partitions {
            Some(n) if partition >= n => anyhow::bail!(
                "partition {partition} is out of range: {} has {n} partitions (0 to {})",
                self.entity_type,
                n - 1
            ),
            _ => Ok(()),
        }
    }
}

/// Reads the entity type's command stream; an entity type with none is an error in words.
async fn describe(
    client: &jetshard::async_nats::Client,
    entity_type: &str,
) -> anyhow::Result<Described> {
    use jetshard::async_nats::jetstream;
    let names = jetshard::wire::Names::new(entity_type);
    let name = names.command_stream();
    let js = jetstream::new(client.clone());
    let mut stream = match js.get_stream(name).await {
        Ok(stream) => stream,
        Err(e) => match e.kind() {
            jetstream::context::GetStreamErrorKind::JetStream(err)
                if err.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND =>
            {
                anyhow::bail!(
                    "unknown entity type {entity_type:?}: its command stream {name} does not exist on this server (no node of that type has started here; types are lowercase tokens such as `order`)"
                )
            }
            _ => return Err(e).with_context(|| format!("looking up stream {name}")),
        },
    };
    let info = stream
        .info()
        .await
        .with_context(|| format!("reading stream {name}"))?;
    let partitions = info
        .config
        .subject_transform
        .as_ref()
        .and_then(|t| t.destination.split_once("partition("))
        .and_then(|(_, rest)| rest.split_once(','))
        .and_then(|(n, _)| n.parse().ok());
    Ok(Described {
        entity_type: entity_type.to_owned(),
        partitions,
        codec: info.config.metadata.get("jetshard.codec").cloned(),
    })
}

/// The report of a state query: the state as JSON when the entity type's codec is JSON; else
/// its bytes, saying which codec they are in and that this tool cannot decode them.
fn state_report(entity_type: &str, codec: Option<&str>, answer: jetshard::QueryAnswer) -> Report {
    let hex: String = answer.state.iter().map(|b| format!("{b:02x}")).collect();
    let decoded = match codec {
        Some("json") | None => serde_json::from_slice::<Value>(&answer.state).ok(),
        Some(_) => None,
    };
    let codec_name = codec.unwrap_or("unknown (not recorded)");
    let shown = match &decoded {
        Some(state) => serde_json::to_string_pretty(state).unwrap_or_default(),
        None => format!(
            "{} bytes encoded with codec {codec_name}, which this tool cannot decode without the entity's Rust types (use CommandSender::get); hex: {hex}",
            answer.state.len()
        ),
    };
    let mut text = format!(
        "{entity_type} {} (partition {}, generation {}, last command {}):\n{shown}",
        answer.entity, answer.partition, answer.generation, answer.last_command_seq,
    );
    let new = answer.last_command_seq == 0;
    if new {
        text += &format!(
            "\nno command has reached {} yet: this is the initial state of an entity that may never have existed",
            answer.entity
        );
    }
    Report::Done {
        text,
        json: json!({"entity_type": entity_type, "entity": answer.entity,
                     "partition": answer.partition, "generation": answer.generation,
                     "last_command_seq": answer.last_command_seq, "new": new,
                     "codec": codec, "state": decoded,
                     "state_hex": if decoded.is_none() { Some(hex) } else { None }}),
    }
}

async fn dead_letters(
    client: jetshard::async_nats::Client,
    action: DeadLetterAction,
) -> anyhow::Result<Report> {
    Ok(match action {
        DeadLetterAction::List { entity_type } => {
            let letters = Admin::new(client, &entity_type).dead_letters().await?;
            Report::DeadLetters {
                entity_type,
                letters,
            }
        }
        DeadLetterAction::Replay {
            entity_type,
            seq: Some(seq),
            ..
        } => {
            let replayed = Admin::new(client, &entity_type)
                .replay(seq)
                .await
                .with_context(|| format!("replaying dead letter {seq} of {entity_type}"))?;
            Report::Replayed(replayed)
        }
        DeadLetterAction::Replay {
            entity_type,
            seq: None,
            from,
            to,
            ..
        } => {
            let admin = Admin::new(client, &entity_type);
            let letters = admin.dead_letters().await?;
            let mut replayed = Vec::new();
            for letter in letters.iter().filter(|l| {
                from.is_none_or(|from| l.seq >= from) && to.is_none_or(|to| l.seq <= to)
            }) {
                replayed.push(admin.replay(letter.seq).await.with_context(|| {
                    format!("replaying dead letter {} of {entity_type}", letter.seq)
                })?);
            }
            Report::ReplayedMany {
                entity_type,
                replayed,
            }
        }
        DeadLetterAction::Purge {
            entity_type,
            partition,
            upto,
        } => {
            let mut which = DeadLetterPurge::all();
            if let Some(partition) = partition {
                which = which.partition(partition);
            }
            if let Some(upto) = upto {
                which = which.up_to(upto);
            }
            let done = Admin::new(client, &entity_type)
                .purge_dead_letters(which)
                .await?;
            let mut text = format!("purged {} dead letters of {entity_type}", done.purged);
            if done.kept > 0 {
                text += &format!(
                    "; kept {}: their commands are not acknowledged yet and would be handled \
                     again without them (purge again once the partition has caught up)",
                    done.kept
                );
            }
            Report::Done {
                text,
                json: json!({"entity_type": entity_type, "partition": partition,
                             "upto": upto, "purged": done.purged, "kept": done.kept}),
            }
        }
    })
}

/// What a command has to say, in text or JSON.
enum Report {
    Status {
        entity_type: String,
        overview: Vec<PartitionOverview>,
        /// How many processes of the type answered.
        running: usize,
    },
    Nodes(Vec<NodeStatus>),
    DeadLetters {
        entity_type: String,
        letters: Vec<DeadLetter>,
    },
    Replayed(Replayed),
    ReplayedMany {
        entity_type: String,
        replayed: Vec<Replayed>,
    },
    Done {
        text: String,
        json: Value,
    },
}

fn replayed_json(r: &Replayed) -> Value {
    json!({
        "dead_letter_seq": r.dead_letter_seq,
        "entity": r.entity,
        "command_seq": r.command_seq,
        "duplicate": r.duplicate,
    })
}

impl Report {
    fn json(&self) -> Value {
        match self {
            Report::Status { overview, .. } => overview
                .iter()
                .map(|p| {
                    json!({
                        "partition": p.partition,
                        "owner": p.owner,
                        "generation": p.generation,
                        "pinned": p.pinned,
                        "pending": p.pending,
                        "ack_pending": p.ack_pending,
                        "redelivered": p.redelivered,
                        "waiting": p.waiting,
                        "paused": p.paused.is_some(),
                        "pause_remaining_secs": p.paused.map(|d| d.as_secs_f64()),
                    })
                })
                .collect(),
            Report::DeadLetters { letters, .. } => letters
                .iter()
                .map(|l| {
                    json!({
                        "seq": l.seq,
                        "partition": l.partition,
                        "entity": l.entity,
                        "command_seq": l.command_seq,
                        "deliveries": l.deliveries,
                        "generation": l.generation,
                        "reason": l.reason,
                        "payload": std::str::from_utf8(&l.payload).ok(),
                        "payload_base64": base64(&l.payload),
                    })
                })
                .collect(),
            Report::Nodes(nodes) => serde_json::to_value(nodes).unwrap_or_default(),
            Report::Replayed(r) => replayed_json(r),
            Report::ReplayedMany { replayed, .. } => replayed.iter().map(replayed_json).collect(),
            Report::Done { json, .. } => json.clone(),
        }
    }

    fn write_text(&self, out: &mut impl Write) -> std::io::Result<()> {
        match self {
            Report::Status {
                entity_type,
                overview,
                running,
            } => {
                writeln!(
                    out,
                    "{:>9}  {:<24} {:>10}  {:<6} {:>8} {:>11} {:>11} {:>7} {:>7}",
                    "partition",
                    "owner",
                    "generation",
                    "pinned",
                    "pending",
                    "ack pending",
                    "redelivered",
                    "waiting",
                    "paused"
                )?;
                for p in overview {
                    writeln!(
                        out,
                        "{:>9}  {:<24} {:>10}  {:<6} {:>8} {:>11} {:>11} {:>7} {:>7}",
                        p.partition,
                        p.owner.as_deref().unwrap_or("-"),
                        p.generation,
                        if p.pinned { "yes" } else { "no" },
                        p.pending,
                        p.ack_pending,
                        p.redelivered,
                        p.waiting,
                        p.paused
                            .map_or_else(|| "no".to_owned(), |d| format!("{}s", d.as_secs())),
                    )?;
                }
                if *running == 0 {
                    writeln!(
                        out,
                        "no process of {entity_type} is running (none answered within {} ms): \
                         the owners shown are the last ones, and commands wait until one starts",
                        STATUS_WAIT.as_millis()
                    )?;
                }
            }
            Report::Nodes(nodes) => {
                for node in nodes {
                    let owned: Vec<String> = node
                        .partitions
                        .iter()
                        .filter_map(|p| p.generation.map(|g| format!("{} (gen {g})", p.partition)))
                        .collect();
                    writeln!(
                        out,
                        "{}: owns {}",
                        node.node,
                        if owned.is_empty() {
                            "nothing".to_owned()
                        } else {
                            owned.join(", ")
                        }
                    )?;
                    for p in &node.partitions {
                        for q in &p.quarantined {
                            writeln!(
                                out,
                                "  quarantined: partition {} entity {} at journal seq {}: {}",
                                p.partition, q.entity, q.journal_seq, q.reason
                            )?;
                        }
                    }
                }
                if nodes.is_empty() {
                    writeln!(out, "no process answered")?;
                }
            }
            Report::DeadLetters {
                entity_type,
                letters,
            } => {
                if letters.is_empty() {
                    writeln!(out, "no dead letters of {entity_type}")?;
                }
                for l in letters {
                    writeln!(
                        out,
                        "seq {} partition {} entity {} command {} deliveries {} generation {} \
                         payload {}: {}",
                        l.seq,
                        l.partition,
                        l.entity,
                        l.command_seq,
                        l.deliveries,
                        l.generation,
                        payload_text(&l.payload),
                        l.reason
                    )?;
                }
            }
            Report::Replayed(r) if r.duplicate => writeln!(
                out,
                "dead letter {} was replayed before, as command {} of entity {}: not sent again",
                r.dead_letter_seq, r.command_seq, r.entity
            )?,
            Report::Replayed(r) => writeln!(
                out,
                "dead letter {} replayed as command {} of entity {}",
                r.dead_letter_seq, r.command_seq, r.entity
            )?,
            Report::ReplayedMany {
                entity_type,
                replayed,
            } => {
                for r in replayed {
                    Report::Replayed(r.clone()).write_text(out)?;
                }
                let again = replayed.iter().filter(|r| r.duplicate).count();
                writeln!(
                    out,
                    "{} dead letters of {entity_type} replayed{}",
                    replayed.len() - again,
                    if again > 0 {
                        format!(", {again} not sent again (replayed before)")
                    } else {
                        String::new()
                    }
                )?;
            }
            Report::Done { text, .. } => writeln!(out, "{text}")?,
        }
        Ok(())
    }
}

/// A payload on one line: quoted and escaped if it is text (the first 120 characters), its
/// size if it is not.
fn payload_text(payload: &[u8]) -> String {
    const SHOWN: usize = 120;
    match std::str::from_utf8(payload) {
        Ok(text) if text.chars().count() > SHOWN => {
            let shown: String = text.chars().take(SHOWN).collect();
            format!("{:?}... ({} bytes)", shown, payload.len())
        }
        Ok(text) => format!("{text:?}"),
        Err(_) => format!("({} bytes, not UTF-8)", payload.len()),
    }
}

/// Standard base64 with padding (RFC 4648), for binary payloads in JSON.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_rfc_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn payloads_show_as_one_line() {
        assert_eq!(payload_text(b"{\"a\":\n1}"), r#""{\"a\":\n1}""#);
        assert_eq!(payload_text(&[0xff, 0x00]), "(2 bytes, not UTF-8)");
        assert!(payload_text(&[b'x'; 500]).ends_with("... (500 bytes)"));
    }

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
