//! Reading the streams back from the server.

use super::*;

/// Reads every command of an entity type's command stream.
pub(super) async fn read_commands(
    js: &async_nats::jetstream::Context,
    stream: &str,
    entity_type: &str,
) -> anyhow::Result<Vec<StoredCommand>> {
    Ok(read_stream(js, stream, &format!("{entity_type}.cmd.>"))
        .await?
        .into_iter()
        .filter_map(|m| {
            // A wake-up carries nothing for any entity: its owner acknowledges it, no more.
            if m.headers.get(wire::HDR_WAKE).is_some() {
                return None;
            }
            let tokens: Vec<&str> = m.subject.split('.').collect();
            let [_, _, partition, entity] = tokens[..] else {
                return None;
            };
            let header = |name: &str| m.headers.get(name).map(|v| v.as_str().to_owned());
            let timer = header(wire::HDR_TIMER)
                .zip(header(wire::HDR_TIMER_SET).and_then(|s| s.trim().parse::<u64>().ok()));
            Some(StoredCommand {
                seq: m.seq,
                partition: partition.parse().ok()?,
                entity: entity.to_owned(),
                msg_id: header(wire::HDR_MSG_ID),
                timer,
                payload: m.payload,
            })
        })
        .collect())
}

/// Waits until no partition has commands pending or unacknowledged, until `deadline` at most.
/// Returns the partition count. Not being quiet in time is not an error: the commands still in
/// flight then show as missing outcomes.
pub(super) async fn settle(admin: &Admin, deadline: Instant) -> anyhow::Result<u32> {
    loop {
        let overview = admin
            .overview()
            .await
            .context("reading the partitions (is the server up, and has a node run?)")?;
        let pending: u64 = overview.iter().map(|p| p.pending).sum();
        let unacked: usize = overview.iter().map(|p| p.ack_pending).sum();
        if pending == 0 && unacked == 0 {
            return Ok(overview.len() as u32);
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                pending,
                unacked,
                "the partitions are not quiet in the settle time; checking anyway"
            );
            return Ok(overview.len() as u32);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One message read back from a stream.
pub(crate) struct ReadMessage {
    seq: u64,
    subject: String,
    headers: async_nats::HeaderMap,
    payload: Bytes,
}

/// Reads every message of a command stream `stream` on `filter`, in order, with an ordered
/// consumer (journals are read with jetshard's [`JournalReader`]).
pub(super) async fn read_stream(
    js: &async_nats::jetstream::Context,
    stream: &str,
    filter: &str,
) -> anyhow::Result<Vec<ReadMessage>> {
    let handle = js
        .get_stream_no_info(stream)
        .await
        .with_context(|| format!("open stream {stream}"))?;
    let consumer = handle
        .create_consumer(pull::OrderedConfig {
            filter_subject: filter.to_owned(),
            ..Default::default()
        })
        .await
        .with_context(|| format!("read {stream}"))?;
    let mut read = Vec::new();
    if consumer.cached_info().num_pending == 0 {
        return Ok(read);
    }
    let mut messages = consumer
        .messages()
        .await
        .with_context(|| format!("read {stream}"))?;
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .with_context(|| format!("reading {stream} stalled for 10 s"))?
            .with_context(|| format!("{stream} ended early"))?
            .map_err(|e| anyhow::anyhow!("read {stream}: {e}"))?;
        let info = message
            .info()
            .map_err(|e| anyhow::anyhow!("read {stream}: {e}"))?;
        let (seq, pending) = (info.stream_sequence, info.pending);
        read.push(ReadMessage {
            seq,
            subject: message.subject.to_string(),
            headers: message.headers.clone().unwrap_or_default(),
            payload: message.payload.clone(),
        });
        if pending == 0 {
            return Ok(read);
        }
    }
}

/// The checks' view of a record read with jetshard's [`JournalReader`]; `None` for what they
/// do not look at (snapshots, unpin records, subjects outside the contract, timer records
/// without their name or operation, a partition token that is not a number).
pub(super) fn journal_record(record: jetshard::JournalRecord) -> Option<JournalRecord> {
    use jetshard::RecordKind as Read;
    let command_seq = record.command_seq;
    let kind = match record.kind {
        Read::Event {
            entity, payload, ..
        } => RecordKind::Event {
            entity,
            command_seq,
            payload,
        },
        Read::Fence(fence) => RecordKind::Fence(fence.map_err(|e| e.to_string())),
        Read::DeadLetter { entity, reason, .. } => RecordKind::DeadLetter {
            entity: entity.unwrap_or_default(),
            command_seq,
            reason: reason.unwrap_or_default(),
        },
        Read::Timer {
            entity, name, op, ..
        } => RecordKind::Timer {
            entity,
            name: name?,
            command_seq,
            op: op?,
        },
        Read::Outbox(_) => RecordKind::Outbox,
        _ => return None,
    };
    Some(JournalRecord {
        seq: record.seq,
        partition: record.partition?,
        generation: record.generation,
        kind,
    })
}
