//! `status`: the partitions as the server sees them, from any process (no node needed), with
//! `jetshard::admin::Admin`.

use std::fmt::Write as _;

use anyhow::Context as _;
use async_nats::Client;
use jetshard::admin::{Admin, PartitionOverview};

use crate::order::ENTITY_TYPE;

/// Prints one row per partition, and the dead-letter count.
///
/// # Errors
/// If the streams or consumers cannot be read (no server, or no node has run yet).
pub async fn run(client: Client) -> anyhow::Result<String> {
    crate::order::require_streams(&async_nats::jetstream::new(client.clone())).await?;
    let admin = Admin::new(client, ENTITY_TYPE);
    let overview = admin
        .overview()
        .await
        .context("reading the partitions (has a node run yet?)")?;
    let dead_letters = admin.dead_letters().await.context("reading dead letters")?;
    let mut out = table(&overview);
    let _ = writeln!(out, "dead letters: {}", dead_letters.len());
    for letter in dead_letters.iter().rev().take(5).rev() {
        let _ = writeln!(
            out,
            "  partition {} {} command {}: {} ({})",
            letter.partition,
            letter.entity,
            letter.command_seq,
            letter.reason,
            String::from_utf8_lossy(&letter.payload)
        );
    }
    Ok(out)
}

/// The table of [`run`].
pub fn table(overview: &[PartitionOverview]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>9}  {:<16} {:>10}  {:<6} {:>8} {:>11} {:>11} {:>7}  paused",
        "partition",
        "owner",
        "generation",
        "pinned",
        "pending",
        "ack pending",
        "redelivered",
        "waiting",
    );
    for p in overview {
        let paused = match p.paused {
            Some(left) => format!("yes ({:.1} s left)", left.as_secs_f64()),
            None => "no".to_owned(),
        };
        let _ = writeln!(
            out,
            "{:>9}  {:<16} {:>10}  {:<6} {:>8} {:>11} {:>11} {:>7}  {}",
            p.partition,
            p.owner.as_deref().unwrap_or("-"),
            p.generation,
            if p.pinned { "yes" } else { "no" },
            p.pending,
            p.ack_pending,
            p.redelivered,
            p.waiting,
            paused
        );
    }
    out
}
