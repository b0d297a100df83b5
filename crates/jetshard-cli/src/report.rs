//! What a command has to say, as text or as one JSON document.

use std::io::Write;
use std::time::Duration;

use jetshard::NodeStatus;
use jetshard::admin::{self, DeadLetter, PartitionOverview, Replayed};
use serde_json::{Value, json};

/// How long `status` waits for running processes to answer.
pub(crate) const STATUS_WAIT: Duration = Duration::from_millis(500);

/// The report of a state query: the state as JSON when the entity type's codec is JSON; else
/// its bytes, saying which codec they are in and that this tool cannot decode them.
pub(crate) fn state_report(
    entity_type: &str,
    codec: Option<&str>,
    answer: jetshard::QueryAnswer,
) -> Report {
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

/// What a command has to say, in text or JSON.
pub(crate) enum Report {
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
        "partition": r.partition,
        "dead_letter_seq": r.dead_letter_seq,
        "entity": r.entity,
        "command_seq": r.command_seq,
        "duplicate": r.duplicate,
    })
}

impl Report {
    pub(crate) fn json(&self) -> Value {
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

    pub(crate) fn write_text(&self, out: &mut impl Write) -> std::io::Result<()> {
        match self {
            Report::Status {
                entity_type,
                overview,
                running,
            } => {
                write!(out, "{}", admin::overview_table(overview))?;
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
}
