//! The independent baseline, `bareloop` (a hand-written async-nats command loop, not part of
//! this project), run as a child process beside the bench's own bare loop so that both are measured
//! in the same minutes: its `B-loop-pinned` figure (pinned pull consumers, one fenced event
//! with `Nats-Msg-Id` per command, 1,024 writes in flight per partition, the command acked
//! after its event) is what the bench's bare loop is checked against (within 10%).
//!
//! The binary is named by `--bareloop <path>` or `BARELOOP_BIN`; it starts its own
//! `nats-server` (`NATS_SERVER_BIN`) and kills it by its pid when done.

use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, bail};
use serde::Serialize;

/// One `RESULT` line of `bareloop`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Figure {
    /// Commands per second.
    pub rate: f64,
    /// Server CPU microseconds per command.
    pub server_us: f64,
    /// Client CPU microseconds per command.
    pub client_us: f64,
}

/// Runs `bareloop --n <commands> --only B` and returns its `B-loop-pinned` figure.
pub fn run_pinned(binary: &Path, commands: usize) -> anyhow::Result<Figure> {
    let output = Command::new(binary)
        .args(["--n", &commands.to_string(), "--only", "B"])
        .output()
        .with_context(|| format!("run {}", binary.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "{} failed ({}): {}",
            binary.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
    stdout
        .lines()
        .find_map(|line| parse(line, "B-loop-pinned"))
        .with_context(|| format!("no B-loop-pinned RESULT line in: {stdout}"))
}

/// Parses `RESULT <name> n=.. secs=.. rate=.. srv_cpu=.. cli_cpu=.. srv_us/msg=.. cli_us/msg=..`.
fn parse(line: &str, name: &str) -> Option<Figure> {
    let mut words = line.split_whitespace();
    if words.next()? != "RESULT" || words.next()? != name {
        return None;
    }
    // `key= value` pairs may have spaces after the `=` (right-aligned numbers).
    let rest: Vec<&str> = words.collect();
    let rest = rest.join(" ");
    let field = |key: &str| -> Option<f64> {
        let at = rest.find(&format!("{key}="))? + key.len() + 1;
        rest[at..].split_whitespace().next()?.parse().ok()
    };
    Some(Figure {
        rate: field("rate")?,
        server_us: field("srv_us/msg")?,
        client_us: field("cli_us/msg")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_line_is_parsed() {
        let line = "RESULT B-loop-pinned    n=100000  secs=  3.962 rate=   25234 srv_cpu=  4.27 cli_cpu=  1.40 srv_us/msg= 42.7 cli_us/msg= 14.0";
        let figure = parse(line, "B-loop-pinned").expect("parsed");
        assert_eq!(figure.rate, 25234.0);
        assert_eq!(figure.server_us, 42.7);
        assert_eq!(figure.client_us, 14.0);
        assert!(parse(line, "A-loop").is_none());
    }
}
