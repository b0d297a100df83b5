//! The states of a partition's entities that have no actor ("dormant"), within a budget.
//!
//! A passivated actor hands its state back to the owner, which keeps it here, encoded, until the
//! entity's next command spawns a new actor with it (decoded then). The states of all of this
//! process's partitions count against one budget (`ShardConfig::max_dormant_entities`,
//! `max_dormant_bytes`): past it, an owner drops its least recently used states. A dropped state
//! costs nothing but a load from the journal (the entity's snapshot and the records after it) on
//! the entity's next command, exactly as after a takeover, so memory follows the entities in use
//! rather than every entity ever seen.
//!
//! Each dormant entity is one allocation ([`Packed`]: its id, its small fields as varints and
//! its state's encoding) and one 16-byte slot of a hash set: a few dozen bytes beyond the
//! encoded state (the target, `2 x encoded + 100`, is guarded by the `layout` tests).

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;

use crate::codec::Codec;
use crate::data::origin::Origins;
use crate::data::timers::Armed;
use crate::entity::{Entity, EntityId, MAX_ID_LEN};
use crate::journal::chain::Lineage;
use crate::runtime::entity_actor::Seed;
use crate::runtime::entity_actor::outcome_header::LastOutcome;

/// The dormant states of all of this process's partitions: how many, and their estimated bytes.
#[derive(Debug, Default)]
pub(crate) struct DormantTotals {
    entities: AtomicUsize,
    bytes: AtomicUsize,
}

/// What the dormant states of the process may hold (`ShardConfig::max_dormant_entities`,
/// `max_dormant_bytes`); `None`: no bound of that kind.
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    pub(super) entities: Option<usize>,
    pub(super) bytes: Option<usize>,
}

/// Bytes of a packed entry before its id: the LRU stamp (8) and the id's length (2).
const HEAD: usize = 10;
const _: () = assert!(MAX_ID_LEN <= u16::MAX as usize);

/// A dormant entity's share of the hash set, counted with each entry: its slot (a pointer and
/// a length) and control byte, times 16/7, the most slots per entry a table holds right after
/// it grew (7/8 full before, twice the slots after).
const TABLE_SHARE: usize = (std::mem::size_of::<Packed>() + 1) * 16 / 7 + 1;

/// One dormant entity in one allocation, unchanged until it is taken: its LRU stamp (u64, little
/// endian; least recently used: lowest), its id (its length as a u16, then its bytes), its
/// seed's other fields (LEB128 varints: the last command's sequence, the journal sequence, the
/// events since the snapshot, its tail (0: not known, else one past it), the last outcome, and
/// the armed timers, usually none), the outbox origins it
/// remembers (usually none) and, to the end, its state's encoding (the entity type's codec). Hashed and compared as its id, so the
/// set is looked up by `&str`.
struct Packed(Box<[u8]>);

impl Packed {
    fn pack<E: Entity>(
        stamp: u64,
        entity: &str,
        seed: &Seed<E>,
        codec: Codec,
    ) -> Result<Self, crate::error::CodecError> {
        let mut out = Vec::with_capacity(HEAD + entity.len() + 8);
        out.extend_from_slice(&stamp.to_le_bytes());
        // At most `MAX_ID_LEN` (checked at compile time to fit).
        out.extend_from_slice(&(entity.len() as u16).to_le_bytes());
        out.extend_from_slice(entity.as_bytes());
        put(&mut out, seed.last_command_seq);
        put(&mut out, seed.journal_seq);
        put(&mut out, u64::from(seed.unsnapshotted));
        // 0: not known; else one past it. Where its earlier commands ended is not kept: its
        // last record names them (`Jetshard-Earlier`), so a load after its next record reads
        // them one round trip later, and a dormant entity stays as small as it was.
        put(
            &mut out,
            seed.tail
                .as_ref()
                .and_then(|tail| tail.last().checked_add(1))
                .unwrap_or(0),
        );
        match &seed.last_outcome {
            None => out.push(0),
            Some(LastOutcome::Applied { events }) => {
                out.push(1);
                put(&mut out, u64::from(*events));
            }
            Some(LastOutcome::Rejected(text)) => {
                out.push(2);
                put_bytes(&mut out, text.as_bytes());
            }
            Some(LastOutcome::DeadLettered(text)) => {
                out.push(3);
                put_bytes(&mut out, text.as_bytes());
            }
        }
        put(&mut out, seed.timers.len() as u64);
        for (name, armed) in &seed.timers {
            put_bytes(&mut out, name.as_bytes());
            put(&mut out, armed.set_seq);
            put(&mut out, armed.due_ms);
            put_bytes(&mut out, &armed.payload);
        }
        // The outbox origins it remembers (as a snapshot's header; usually none: one byte).
        put_bytes(
            &mut out,
            seed.origins.to_header().as_deref().unwrap_or("").as_bytes(),
        );
        codec.encode_into(&seed.state, &mut out)?;
        Ok(Self(out.into_boxed_slice()))
    }

    fn stamp(&self) -> u64 {
        let mut stamp = [0; 8];
        stamp.copy_from_slice(&self.0[..8]);
        u64::from_le_bytes(stamp)
    }

    fn id_len(&self) -> usize {
        usize::from(u16::from_le_bytes([self.0[8], self.0[9]]))
    }

    fn id(&self) -> &str {
        // Written from a `&str`: always valid.
        std::str::from_utf8(&self.0[HEAD..HEAD + self.id_len()]).unwrap_or_default()
    }

    /// The bytes this entry is counted at: its allocation and its share of the table.
    fn bytes(&self) -> usize {
        self.0.len() + TABLE_SHARE
    }

    /// The seed back; `None` if the state does not decode (its next actor then loads it from
    /// the journal, as after an eviction).
    fn unpack<E: Entity>(&self, codec: Codec) -> Option<Seed<E>> {
        let mut rest = &self.0[HEAD + self.id_len()..];
        let last_command_seq = take(&mut rest)?;
        let journal_seq = take(&mut rest)?;
        let unsnapshotted = u32::try_from(take(&mut rest)?).ok()?;
        let tail = take(&mut rest)?.checked_sub(1).map(Lineage::at);
        let (&kind, after) = rest.split_first()?;
        rest = after;
        let last_outcome = match kind {
            0 => None,
            1 => Some(LastOutcome::Applied {
                events: u32::try_from(take(&mut rest)?).ok()?,
            }),
            2 => Some(LastOutcome::Rejected(take_str(&mut rest)?)),
            3 => Some(LastOutcome::DeadLettered(take_str(&mut rest)?)),
            _ => return None,
        };
        let mut timers = BTreeMap::new();
        for _ in 0..take(&mut rest)? {
            let name = take_str(&mut rest)?;
            let set_seq = take(&mut rest)?;
            let due_ms = take(&mut rest)?;
            let payload = Bytes::copy_from_slice(take_bytes(&mut rest)?);
            timers.insert(
                name,
                Armed {
                    set_seq,
                    due_ms,
                    payload,
                },
            );
        }
        let origins = Origins::from_header(std::str::from_utf8(take_bytes(&mut rest)?).ok()?);
        let state = codec.decode(rest).ok()?;
        Some(Seed {
            state,
            last_command_seq,
            last_outcome,
            journal_seq,
            unsnapshotted,
            tail,
            timers,
            origins,
        })
    }
}

impl Borrow<str> for Packed {
    fn borrow(&self) -> &str {
        self.id()
    }
}

impl Hash for Packed {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As the `&str` it is looked up by.
        self.id().hash(state);
    }
}

impl PartialEq for Packed {
    fn eq(&self, other: &Self) -> bool {
        self.id() == other.id()
    }
}

impl Eq for Packed {}

/// Appends `value` as a LEB128 varint.
fn put(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Reads a varint [`put`] wrote; `None` at the end of the bytes or past 64 bits.
fn take(rest: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, after) = rest.split_first()?;
        *rest = after;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn take_bytes<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = usize::try_from(take(rest)?).ok()?;
    let bytes = rest.get(..len)?;
    *rest = &rest[len..];
    Some(bytes)
}

fn take_str(rest: &mut &[u8]) -> Option<Box<str>> {
    std::str::from_utf8(take_bytes(rest)?).ok().map(Box::from)
}

/// One partition's dormant states, counted in the process's totals.
pub(super) struct Dormant<E: Entity> {
    states: HashSet<Packed>,
    /// The entity type's codec: the states' encoding.
    codec: Codec,
    /// Stamps the states in the order they were kept (least recently used: lowest).
    clock: u64,
    /// This partition's bytes (part of `totals`): each entry's allocation and table share.
    bytes: usize,
    /// Dormant states over all of this process's partitions.
    totals: Arc<DormantTotals>,
    entity: PhantomData<fn() -> E>,
}

impl<E: Entity> Dormant<E> {
    pub(super) fn new(totals: Arc<DormantTotals>, codec: Codec) -> Self {
        Self {
            states: HashSet::new(),
            codec,
            clock: 0,
            bytes: 0,
            totals,
            entity: PhantomData,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.states.len()
    }

    /// This partition's dormant states' bytes: their allocations, and their share of the table
    /// (at its emptiest after growth: an estimate from above).
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Keeps `entity`'s state, encoded (the most recently used one now). A state that does not
    /// encode is not kept: the entity's next actor loads it from the journal. Returns whether
    /// it was kept.
    pub(super) fn keep(&mut self, entity: &EntityId, seed: &Seed<E>) -> bool {
        self.clock += 1;
        let packed = match Packed::pack(self.clock, entity.as_str(), seed, self.codec) {
            Ok(packed) => packed,
            Err(error) => {
                tracing::debug!(%entity, %error, "dormant state not kept: it does not encode");
                self.forget(entity.as_str());
                return false;
            }
        };
        let bytes = packed.bytes();
        match self.states.replace(packed) {
            Some(old) => self.uncount(0, old.bytes()),
            None => {
                self.totals.entities.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.bytes += bytes;
        self.totals.bytes.fetch_add(bytes, Ordering::Relaxed);
        true
    }

    fn uncount(&mut self, entities: usize, bytes: usize) {
        self.bytes -= bytes;
        self.totals.entities.fetch_sub(entities, Ordering::Relaxed);
        self.totals.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Whether `entity`'s state is kept.
    pub(super) fn contains(&self, entity: &str) -> bool {
        self.states.contains(entity)
    }

    /// Takes `entity`'s state out, decoded (for its new actor); `None` if none is kept or it
    /// does not decode.
    pub(super) fn take(&mut self, entity: &str) -> Option<Seed<E>> {
        let packed = self.states.take(entity)?;
        self.uncount(1, packed.bytes());
        self.shrink();
        let seed = packed.unpack(self.codec);
        if seed.is_none() {
            tracing::debug!(entity, "dormant state dropped: it does not decode");
        }
        seed
    }

    /// Drops `entity`'s state, if kept (it is not to be trusted any more).
    pub(super) fn forget(&mut self, entity: &str) {
        if let Some(packed) = self.states.take(entity) {
            self.uncount(1, packed.bytes());
            self.shrink();
        }
    }

    /// Gives the table's slots back once it is less than a quarter full (to half full), so that
    /// a table that held many states once does not stay at its largest.
    fn shrink(&mut self) {
        let (len, capacity) = (self.states.len(), self.states.capacity());
        if capacity > 64 && len * 4 < capacity {
            self.states.shrink_to(len * 2);
        }
    }

    /// Keeps the process's totals within `budget`: once over either bound, drops this
    /// partition's least recently used states until the totals are down to 90 % of both (or
    /// this partition has none left), so that eviction runs in batches, not at every
    /// passivation. Returns how many went.
    pub(super) fn evict_over(&mut self, budget: Budget) -> usize {
        let entities = self.totals.entities.load(Ordering::Relaxed);
        let bytes = self.totals.bytes.load(Ordering::Relaxed);
        let over_entities = budget.entities.is_some_and(|b| entities > b);
        let over_bytes = budget.bytes.is_some_and(|b| bytes > b);
        if !over_entities && !over_bytes {
            return 0;
        }
        let entities_to_drop = budget
            .entities
            .map_or(0, |b| entities.saturating_sub(b * 9 / 10));
        let bytes_to_drop = budget.bytes.map_or(0, |b| bytes.saturating_sub(b * 9 / 10));
        let mut kept: Vec<(u64, usize)> = self
            .states
            .iter()
            .map(|packed| (packed.stamp(), packed.bytes()))
            .collect();
        kept.sort_unstable();
        let (mut count, mut dropped_bytes, mut cutoff) = (0, 0, None);
        for (stamp, bytes) in kept {
            if count >= entities_to_drop && dropped_bytes >= bytes_to_drop {
                break;
            }
            count += 1;
            dropped_bytes += bytes;
            cutoff = Some(stamp);
        }
        let Some(cutoff) = cutoff else {
            return 0;
        };
        // Stamps are unique: exactly `count` states are at or below the cutoff.
        self.states.retain(|packed| packed.stamp() > cutoff);
        self.uncount(count, dropped_bytes);
        self.shrink();
        count
    }
}

impl<E: Entity> Drop for Dormant<E> {
    fn drop(&mut self) {
        let (entities, bytes) = (self.states.len(), self.bytes);
        self.uncount(entities, bytes);
    }
}

#[cfg(test)]
mod layout;
#[cfg(test)]
mod tests;
