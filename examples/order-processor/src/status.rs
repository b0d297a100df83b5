//! `status`: the partitions as the server sees them, from any process (no node needed), with
//! `jetshard::admin::Admin`.

use std::fmt::Write as _;

use anyhow::Context as _;
use async_nats::Client;
use jetshard::admin::{Admin, overview_table};

use crate::order::ENTITY_TYPE;

/// Prints one row per partition (the table `jetshard status` prints), and the dead letters.
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
    let mut out = overview_table(&overview);
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
