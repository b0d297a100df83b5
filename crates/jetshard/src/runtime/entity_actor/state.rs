//! The entity actor's state: its id, context and loaded seed (or quarantine).

use std::sync::Arc;

use super::batch::InBatch;
use super::protocol::{EntityContext, Quarantine};
use super::replay::Seed;
use crate::entity::{Entity, EntityId};

/// What the actor knows of its entity's state.
pub(crate) enum Loaded<E: Entity> {
    /// Not read yet: revived from the journal on the first command.
    No,
    Yes(Seed<E>),
    Quarantined(Quarantine),
}

pub(crate) struct EntityState<E: Entity> {
    pub(super) id: EntityId,
    /// Its events' subject (`Names::event_subject`), built once for all its commands.
    pub(super) event_subject: async_nats::Subject,
    pub(super) context: Arc<EntityContext>,
    pub(super) seed: Loaded<E>,
    /// The batched read of its last records, if it was spawned with other new entities of a
    /// pull burst: taken by its load.
    pub(super) batch: Option<InBatch>,
    /// Set after a failure: later messages are ignored until the actor stops.
    pub(super) broken: bool,
    /// Set when the entity was loaded from the journal (for a command or a query): its next
    /// command's outcome tells the owner every timer it has armed. A write answered "not
    /// confirmed" that landed armed timers no outcome reported (its command comes back a
    /// duplicate), and only the journal knows them.
    pub(super) timers_untold: bool,
}
