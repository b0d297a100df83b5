//! The first answer a waiting client gets for a command an earlier owner already handled: its
//! own events (read back from the journal) or its typed rejection, not an untyped duplicate.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::protocol::EntityContext;
use super::replay::Seed;
use crate::codec::Codec;
use crate::data::Effects;
use crate::entity::{Entity, EntityId, decode_event};
use crate::error::Error;
use crate::journal::{self, Record};
use crate::reply::Detail;

/// Fills `detail` for a client waiting on command `seq`, which an earlier owner applied with
/// `events` events and did not answer (it stopped first, or its answer was lost): the events,
/// read back from the journal. Leaves it empty when they cannot all be found: the client then
/// gets the duplicate.
pub(super) async fn events_again<E: Entity>(
    id: &EntityId,
    context: &EntityContext,
    seq: u64,
    events: u32,
    detail: &mut Option<Detail>,
) {
    match events_of_command::<E>(id, context, seq).await {
        Ok(encoded) if encoded.len() == events as usize => {
            *detail = Some(Detail::Events(encoded));
        }
        Ok(encoded) => tracing::warn!(
            found = encoded.len(),
            expected = events,
            "the events of an applied command were not all found again; answered as a duplicate"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "the events of an applied command could not be read again; answered as a duplicate")
        }
    }
}

/// The typed rejection of the entity's last command, known from a snapshot only by its text
/// (`reason`): a rejection writes nothing, so the state after it is the state it was decided
/// on, and deciding the command again (decide is a pure function of state and command) gives
/// it again. `None` unless that decision is a rejection with the same text.
pub(super) fn rejection_again<E: Entity>(
    seed: &Seed<E>,
    payload: &[u8],
    reason: &str,
    codec: Codec,
    id: &EntityId,
) -> Option<Detail> {
    let command = codec.decode::<E::Command>(payload).ok()?;
    let mut effects = Effects::for_entity(codec, id.clone());
    let decided = catch_unwind(AssertUnwindSafe(|| {
        E::decide_with_effects(&seed.state, command, &mut effects)
    }))
    .ok()?;
    match decided {
        Err(rejection) if rejection.to_string() == reason => {
            codec.encode(&rejection).ok().map(Detail::Rejection)
        }
        _ => None,
    }
}

/// The events the entity's command `command_seq` wrote, read back from the journal and encoded
/// as this code's event version (as a first answer carries them). Reads the entity's events
/// from its first: used only to answer a client whose command an earlier owner applied but
/// did not answer (a takeover or a lost answer), which is rare.
async fn events_of_command<E: Entity>(
    id: &EntityId,
    context: &EntityContext,
    command_seq: u64,
) -> Result<Vec<Vec<u8>>, Error> {
    let codec = context.codec;
    let events = context.names.event_subject(context.partition, id);
    let end = journal::last_sequence(&context.journal_stream, &events).await?;
    let mut found = Vec::new();
    let mut failed = None;
    journal::replay(&context.journal_stream, events, 1, end, |stored| {
        if stored.command_seq != command_seq || stored.entity != id.as_str() {
            return Ok(());
        }
        if let Record::Event {
            version, payload, ..
        } = stored.record
        {
            if version == E::EVENT_VERSION {
                found.push(payload.to_vec());
            } else {
                match decode_event::<E>(version, payload, codec).and_then(|e| codec.encode(&e)) {
                    Ok(bytes) => found.push(bytes),
                    Err(e) => failed = Some(e),
                }
            }
        }
        Ok(())
    })
    .await?;
    match failed {
        Some(e) => Err(Error::Codec(e)),
        None => Ok(found),
    }
}
