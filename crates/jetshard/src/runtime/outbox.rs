//! The outbox: messages a command sends to other entities and subjects, published only after
//! its events are durable, at least once, and stored once by a JetStream target.
//!
//! `decide` collects them in an [`Effects`] (it stays a pure function: nothing is sent while it
//! runs). The entity actor then writes, in **one journal unit** (all or none, fenced like
//! events), the command's events and one outbox record per message on `<t>.out.<p>`. Once that
//! is durable it applies the events, publishes each message with
//! `Nats-Msg-Id: <t>:<command seq>:out:<index>` and `Jetshard-Origin:
//! <t>:<partition>:<command seq>:<index>`, and writes a *done* record for the command.
//!
//! A crash between the write and the done record leaves outbox records without a done record.
//! Every new owner of the partition reads `<t>.out.<p>` on acquisition and publishes those
//! again, then writes their done records: at least once, and a JetStream target that receives
//! the message again within its duplicate window (2 minutes by default) drops it by its msg id,
//! so it stores each message once. Not across a restart of the target's server: a work-queue
//! command stream's window is rebuilt from the commands it still holds, so a message already
//! consumed is stored again; a jetshard target entity remembers the origin of each message it
//! applied and answers the copy as a duplicate (`data/origin.rs`). A target without a stream (a
//! core subscriber) may see a message twice. "No responders" to a publish counts as published only when the server says
//! no stream listens on the subject: a clustered stream answers it too while it elects a
//! leader, and the message is offered again (15 s in all) and else left to recovery. A recovery
//! runs on every acquisition and, started by the owner at once, whenever a command's messages
//! were not all published (`EntityReport::OutboxUndelivered`); it reads the outbox again and
//! publishes what has no done record, every 2 s until it has, or until its writer is fenced.
//!
//! Architecture Invariant: an outbox message is published only after the journal holds the
//! outbox record of it (and so the events of its command); only this module publishes them.

use std::collections::BTreeMap;

use async_nats::HeaderMap;
use async_nats::jetstream::context::{Context, GetStreamByNameErrorKind, PublishErrorKind};
use async_nats::jetstream::stream::Stream;

use crate::EntityId;
use crate::data::OutboxMessage;
use crate::error::Error;
use crate::journal::server::recorded_names;
use crate::journal::{self, JournalWriter, Scan, WriteError};
use crate::retry;
use crate::wire::Names;
use crate::wire::header_u64;
use crate::wire::{
    HDR_COMMAND_SEQ, HDR_ENTITY, HDR_MSG_ID, HDR_ORIGIN, HDR_OUTBOX_DONE, HDR_OUTBOX_TARGET,
};

/// The layouts of the spread entity types this process's outbox sent commands to, learned once
/// each (a layout is fixed for the life of its streams): a command to one of them goes to its
/// spread subject at once, not after a refused publish and two lookups.
#[derive(Default)]
pub(crate) struct Routes(std::sync::Mutex<std::collections::HashMap<String, Names>>);

impl Routes {
    /// Where a command recorded for `<entity_type>.cmd.<id>` goes, if its type is known spread.
    fn spread_subject(&self, entity_type: &str, id: &EntityId) -> Option<String> {
        let routes = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        routes
            .get(entity_type)
            .map(|names| names.command_subject(id))
    }

    fn learn(&self, names: Names) {
        let mut routes = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        routes.insert(names.entity_type().to_owned(), names);
    }
}

/// `Nats-Msg-Id` of the `index`th outbox message of the command at `command_seq` of
/// `partition`.
pub(crate) fn msg_id(names: &Names, partition: u32, command_seq: u64, index: usize) -> String {
    names.outbox_msg_id(partition, command_seq, index)
}

/// Publishes a command's outbox messages (each with its msg id), then records them as done.
/// Whether that is over: done, or fenced (a newer owner recovers them); on another failure the
/// command's records stay for a recovery.
pub(crate) async fn deliver(
    js: &Context,
    names: &Names,
    routes: &Routes,
    journal: &JournalWriter,
    entity: &str,
    command_seq: u64,
    messages: &[OutboxMessage],
) -> bool {
    for (index, message) in messages.iter().enumerate() {
        let origin = crate::wire::origin_header(
            names.entity_type(),
            journal.partition(),
            command_seq,
            index,
        );
        let msg_id = msg_id(names, journal.partition(), command_seq, index);
        if let Err(e) = publish(js, names, routes, &msg_id, &origin, message).await {
            tracing::warn!(entity, cmd_seq = command_seq, index, error = %e, "outbox message not published; a recovery publishes it again");
            return false;
        }
    }
    match journal.outbox_done(entity, command_seq).await {
        Ok(()) | Err(WriteError::Fenced { .. }) => true,
        Err(e) => {
            tracing::warn!(entity, cmd_seq = command_seq, error = %e, "outbox done record not written; a recovery publishes again (stored once by msg id)");
            false
        }
    }
}

/// The pause before a recovery reads the outbox again, after a read or a publish failed (a
/// journal or target leader's election, a server away).
const RECOVERY_PAUSE: std::time::Duration = std::time::Duration::from_secs(2);

/// Publishes one outbox message, awaiting the stream's ack, with the publish patience
/// ([`retry::with_publish_patience`]); a subject no stream listens on counts as published (core
/// NATS: at most once for those subscribers).
///
/// A command to an entity is recorded as `<t>.cmd.<id>` (what one command stream takes). To an
/// entity type whose commands are spread over several streams it goes to `<t>.cmd.<p>.<id>`
/// instead: at once for this entity type, whose layout is known, and for another already
/// learned ([`Routes`]); else once no stream takes the one-stream form, from the layout its
/// streams record.
async fn publish(
    js: &Context,
    names: &Names,
    routes: &Routes,
    msg_id: &str,
    origin: &str,
    message: &OutboxMessage,
) -> Result<(), Error> {
    let known = Names::command_target(&message.subject).and_then(|(entity_type, id)| {
        let id = EntityId::new(id).ok()?;
        if entity_type == names.entity_type() {
            names.is_spread().then(|| names.command_subject(&id))
        } else {
            routes.spread_subject(entity_type, &id)
        }
    });
    let subject = known.as_deref().unwrap_or(&message.subject);
    if publish_to(js, msg_id, origin, subject, message).await? {
        return Ok(());
    }
    let Some((entity_type, id)) = Names::command_target(subject) else {
        return Ok(());
    };
    // Read with the publish's patience: the target's command stream may be electing a leader,
    // and a stream's info is its leader's to give.
    let target = retry::with_publish_patience(|| recorded_names(js, entity_type)).await?;
    let Ok(id) = EntityId::new(id) else {
        return Ok(());
    };
    if target.is_spread() {
        let spread = target.command_subject(&id);
        routes.learn(target);
        publish_to(js, msg_id, origin, &spread, message).await?;
    }
    Ok(())
}

/// Publishes `message` to `subject` as [`publish`] does (with `msg_id`, and `origin` as its
/// origin); whether a stream stored it (`false`:
/// none listens on the subject).
async fn publish_to(
    js: &Context,
    msg_id: &str,
    origin: &str,
    subject: &str,
    message: &OutboxMessage,
) -> Result<bool, Error> {
    retry::with_publish_patience(|| async {
        let mut headers = HeaderMap::new();
        headers.insert(HDR_MSG_ID, msg_id);
        headers.insert(HDR_ORIGIN, origin);
        let failed = |e| Error::jetstream(format!("publish to {subject}"), e);
        let ack = js
            .publish_with_headers(subject.to_owned(), headers, message.payload.clone())
            .await
            .map_err(failed)?
            .await;
        match ack {
            Ok(_) => Ok(true),
            // "No responders": either no stream listens on the subject (a core subscriber's
            // subject: published, at most once), or the stream that does has no leader now (a
            // clustered stream's election). Counting the second as published lost the message
            // (seen in the cluster's chaos schedule: a saga's answer never arrived).
            Err(e) if e.kind() == PublishErrorKind::StreamNotFound => {
                match js.stream_by_subject(subject.to_owned()).await {
                    Err(lookup) if lookup.kind() == GetStreamByNameErrorKind::NotFound => Ok(false),
                    Ok(stream) => Err(Error::jetstream(
                        format!("publish to {subject} (stream {stream})"),
                        e,
                    )),
                    Err(lookup) => Err(Error::jetstream(format!("publish to {subject}"), lookup)),
                }
            }
            Err(e) => Err(failed(e)),
        }
    })
    .await
}

/// One command's outbox, read back.
#[derive(Default)]
struct Pending {
    entity: String,
    messages: BTreeMap<usize, OutboxMessage>,
    done: bool,
}

/// On acquisition: publishes again every outbox message of the partition whose command has no
/// done record, and records them done. Runs beside the owner's commands (the messages are
/// independent of them); ends when done or when the writer is fenced. A read or a publish that
/// fails (after its own patience) is tried again, the outbox read afresh, every
/// [`RECOVERY_PAUSE`]: the next owner may be long in coming, and a message left unpublished
/// meanwhile is an answer a saga waits for.
pub(crate) async fn recover(
    js: Context,
    journal_stream: Stream<()>,
    names: std::sync::Arc<Names>,
    routes: std::sync::Arc<Routes>,
    partition: u32,
    writer: JournalWriter,
) {
    let subject = names.outbox_subject(partition);
    let mut announced = false;
    loop {
        let pending = match read(&journal_stream, &subject).await {
            Ok(pending) => pending,
            Err(e) => {
                tracing::warn!(partition, error = %e, "outbox not read; reading it again");
                tokio::time::sleep(RECOVERY_PAUSE).await;
                continue;
            }
        };
        let open: Vec<_> = pending.into_iter().filter(|(_, p)| !p.done).collect();
        if !open.is_empty() && !announced {
            announced = true;
            tracing::info!(
                partition,
                generation = writer.generation(),
                commands = open.len(),
                "publishing the outbox of commands whose messages were not confirmed"
            );
        }
        let mut over = true;
        for (command_seq, p) in open {
            let messages: Vec<_> = p.messages.into_values().collect();
            let entity = &p.entity;
            over &= deliver(
                &js,
                &names,
                &routes,
                &writer,
                entity,
                command_seq,
                &messages,
            )
            .await;
        }
        if over {
            return;
        }
        tokio::time::sleep(RECOVERY_PAUSE).await;
    }
}

/// Reads a partition's outbox records and done records, by command.
async fn read(journal: &Stream<()>, subject: &str) -> Result<BTreeMap<u64, Pending>, Error> {
    let mut pending: BTreeMap<u64, Pending> = BTreeMap::new();
    let end = journal::last_sequence(journal, subject).await?;
    journal::scan(
        journal,
        subject,
        1,
        end,
        Scan::default(),
        |message, _, _| {
            if let Some(headers) = message.headers.as_ref()
                && let Some(command_seq) = header_u64(headers, HDR_COMMAND_SEQ)
            {
                let p = pending.entry(command_seq).or_default();
                if let Some(entity) = headers.get(HDR_ENTITY) {
                    p.entity = entity.as_str().to_owned();
                }
                if headers.get(HDR_OUTBOX_DONE).is_some() {
                    p.done = true;
                } else if let (Some(target), Some(index)) = (
                    headers.get(HDR_OUTBOX_TARGET),
                    header_u64(headers, crate::wire::HDR_OUTBOX_INDEX),
                ) {
                    p.messages.insert(
                        usize::try_from(index).unwrap_or(usize::MAX),
                        OutboxMessage {
                            subject: target.as_str().to_owned(),
                            payload: message.payload.clone(),
                        },
                    );
                }
            }
            Ok(())
        },
    )
    .await?;
    Ok(pending)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outbox_msg_ids_name_the_source_command_and_index() {
        assert_eq!(msg_id(&Names::new("order"), 3, 42, 1), "order:42:out:1");
        // Spread, each command stream numbers its own commands: the partition makes the id
        // unique among the sources a target hears from.
        let spread = Names::spread("order", 2, 8);
        assert_eq!(msg_id(&spread, 3, 42, 1), "order:3:42:out:1");
        assert_ne!(msg_id(&spread, 3, 42, 1), msg_id(&spread, 4, 42, 1));
    }
}
