//! An entity's records after its snapshot, found by following the links its records carry back
//! from its last one, each read by its sequence: a load costs the entity's own records, not
//! the records of every other entity written between them.
//!
//! The journal interleaves a partition's entities, and the server keeps no index of a subject
//! finer than a message block: reading an entity's records with `next_by_subj` (literal or
//! wildcard) scans every message between them (docs/PERFORMANCE.md, "Loads"), so a load after a
//! takeover would cost the journal's span since the entity's snapshot. A read by sequence does
//! not scan. Each record an entity's actor writes names where the one before it is
//! ([`HDR_PREVIOUS`] on a command's only record of the entity; [`HDR_UNIT`] on the last of
//! several, which are stored in consecutive sequences), so the tail is read record by record
//! from the end, never through other entities' records.
//!
//! A link is trusted only as far as it proves itself: each record it leads to must be one of
//! the entity's own (an event, timer record or dead letter on its subjects). Where a record
//! has no link (written before links, by a generation with a write in doubt, or after a write
//! answered as a duplicate), or a link leads to a record that is gone (a compaction purged a
//! timer record) or is not the entity's, the walk gives up and the caller reads the tail as
//! before ([`replay_with`](crate::journal::read::replay_with)).
//!
//! A link leads one record back, so a walk of `n` commands would wait for `n` answers one
//! after another. Each linked record also says where the entity's commands before its link
//! ended ([`HDR_EARLIER`], kept by its actor as a [`Lineage`]): the walk asks for all of those
//! records at once, then for the other records of their commands at once, and follows the
//! links through what it holds. The hint saves round trips, never a check: a record read
//! ahead counts only where a link the walk follows leads to it.

use async_nats::header::HeaderName;
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{DirectGetErrorKind, RawMessageErrorKind, Stream};

use crate::error::Error;
use crate::journal::read::Reads;
use crate::wire::{HDR_EARLIER, HDR_PREVIOUS, HDR_UNIT, Names, header_u64};

/// The most commands a walk follows back before it leaves the tail to a scan: a tail that
/// long (an entity type without snapshots) is read faster in one consumer than by as many
/// round trips.
pub(crate) const MAX_HOPS: usize = 256;

/// The most earlier commands a record names ([`HDR_EARLIER`]): a walk asks for up to this
/// many of the entity's commands at once (two rounds: their last records, then the rest of
/// theirs). A tail of more commands takes two rounds per this many, read from the oldest
/// record named, whose own header names the ones before it. At 15, the header is about 100
/// bytes in a journal where an entity's records lie ~10^5 sequences apart.
pub(crate) const EARLIER: usize = 15;

/// Where an entity's records are, as its actor knows them (the entity's only writer): its last
/// record's journal sequence (what its next record's link names) and the last records of the
/// entity's commands before it, newest first, back to its snapshot and at most [`EARLIER`] of
/// them (what its next record's [`HDR_EARLIER`] says).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Lineage {
    last: u64,
    earlier: Vec<u64>,
}

impl Lineage {
    /// An entity whose last record is at `last` (0: it has none), nothing known before it.
    pub(crate) fn at(last: u64) -> Self {
        Self {
            last,
            earlier: Vec::new(),
        }
    }

    /// As the entity's last record `message` tells it, the records below `from` left out (a
    /// snapshot covers them).
    pub(crate) fn of_last(message: &StreamMessage, from: u64) -> Self {
        let mut lineage = Self::at(message.sequence);
        if let Some((_, previous)) = link(message) {
            lineage.earlier = std::iter::once(previous)
                .chain(earlier(message, previous))
                .take_while(|seq| *seq >= from && *seq > 0)
                .take(EARLIER)
                .collect();
        }
        lineage
    }

    /// Its last record's sequence: what the next record's link names.
    pub(crate) fn last(&self) -> u64 {
        self.last
    }

    /// The entity's next command's last record is at `seq`.
    pub(crate) fn followed_by(&mut self, seq: u64) {
        if self.last > 0 {
            // Sized once: an entity that writes again writes on (no growth one step at a time).
            if self.earlier.capacity() == 0 {
                self.earlier.reserve_exact(EARLIER);
            }
            self.earlier.truncate(EARLIER - 1);
            self.earlier.insert(0, self.last);
        }
        self.last = seq;
    }

    /// A snapshot covers the entity's records up to `upto`: no load reads them again.
    pub(crate) fn covered(&mut self, upto: u64) {
        self.earlier.retain(|seq| *seq > upto);
    }

    /// The earlier commands' last records, newest first.
    #[cfg(test)]
    pub(crate) fn earlier(&self) -> &[u64] {
        &self.earlier
    }

    /// An entity whose last record is at `last` with `earlier` before it (as [`Self::earlier`]
    /// returned them).
    #[cfg(test)]
    pub(crate) fn from_parts(last: u64, earlier: Vec<u64>) -> Self {
        Self { last, earlier }
    }

    /// The value of the next record's [`HDR_EARLIER`]: the gaps down from [`Self::last`];
    /// `None` when nothing is known before it.
    pub(crate) fn earlier_header(&self) -> Option<String> {
        use std::fmt::Write;
        // Sized for gaps of up to 7 digits and their spaces: one allocation.
        let mut value = String::with_capacity(self.earlier.len() * 8);
        let mut above = self.last;
        for seq in &self.earlier {
            let gap = above.checked_sub(*seq).filter(|gap| *gap > 0)?;
            if !value.is_empty() {
                value.push(' ');
            }
            let _ = write!(value, "{gap}");
            above = *seq;
        }
        (!value.is_empty()).then_some(value)
    }
}

/// The sequences `message`'s [`HDR_EARLIER`] names, newest first, down from its link's
/// `previous`; as far as they read as sequences going down.
fn earlier(message: &StreamMessage, previous: u64) -> impl Iterator<Item = u64> + '_ {
    let gaps = message
        .headers
        .get(EARLIER_HEADER)
        .map(|v| v.as_str())
        .unwrap_or("");
    gaps.split(' ')
        .map_while(|gap| gap.parse::<u64>().ok().filter(|gap| *gap > 0))
        .scan(previous, |above, gap| {
            *above = above.checked_sub(gap)?;
            Some(*above)
        })
}

/// What a walk asked of the server: its requests, and the rounds it waited for them in (the
/// requests of one round are in flight together).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Asked {
    pub(crate) requests: u64,
    pub(crate) rounds: u64,
}

/// Where a walk reads from.
pub(crate) struct Walk<'a> {
    /// The journal, as its direct gets reach it (any replica answers).
    pub(crate) journal: &'a Stream<()>,
    /// The journal, as its API reaches it (the leader answers): the same handle, but for a
    /// test that reads a replica behind its leader through a client of that replica alone.
    pub(crate) leader: &'a Stream<()>,
    pub(crate) names: &'a Names,
    pub(crate) partition: u32,
    pub(crate) entity: &'a str,
    /// Records already in hand (the entity's last record of each subject): not read again.
    pub(crate) known: &'a [StreamMessage],
}

/// The entity's records from journal sequence `from` up to `last` (its last record), in
/// journal order, found by following the links back from `last`; `None` when the chain cannot
/// be followed all the way (the caller reads the tail otherwise). `asked` counts the reads
/// made of the server.
pub(crate) async fn records_back(
    walk: &Walk<'_>,
    last: &StreamMessage,
    from: u64,
    mut reads: Reads,
    asked: &mut Asked,
) -> Result<Option<Vec<StreamMessage>>, Error> {
    let mut found = Vec::new();
    // Records read before a link led to them: each counts only once one does.
    let mut ahead = Vec::new();
    let mut at = last.clone();
    for _ in 0..MAX_HOPS {
        let Some((count, previous)) = link(&at) else {
            return Ok(gave_up(walk, at.sequence, "no link"));
        };
        let first = at.sequence + 1 - count;
        // The unit's records lie above the sequence it names.
        if previous >= first {
            return Ok(gave_up(walk, at.sequence, "a link that does not go back"));
        }
        // The command's other records, and the commands before it that `at` names, at once.
        let mut wanted: Vec<u64> = (first..at.sequence).collect();
        if previous >= from && !held(walk, &ahead, previous) {
            wanted.push(previous);
            wanted.extend(earlier(&at, previous).take_while(|seq| *seq >= from));
        }
        read_ahead(walk, wanted, from, reads, asked, &mut ahead).await;
        for seq in first..at.sequence {
            let Some(sibling) = record_at(walk, &ahead, seq, &mut reads, asked).await? else {
                return Ok(gave_up(
                    walk,
                    seq,
                    "no record of the entity in its command's place",
                ));
            };
            found.push(sibling);
        }
        found.push(at);
        if previous < from {
            found.sort_unstable_by_key(|m| m.sequence);
            found.retain(|m| m.sequence >= from);
            return Ok(Some(found));
        }
        let Some(before) = record_at(walk, &ahead, previous, &mut reads, asked).await? else {
            return Ok(gave_up(
                walk,
                previous,
                "no record of the entity where a link leads",
            ));
        };
        at = before;
    }
    Ok(gave_up(walk, at.sequence, "too many commands back"))
}

/// Reads the records at `wanted` that are not held yet, all at once, into `ahead`; then, at
/// once again, the other records of the commands among them that wrote several (down to
/// `from`). Best effort, by direct gets only: a record not read here is read where a link
/// leads to it, as `reads` says (a replica behind its leader, a failure).
async fn read_ahead(
    walk: &Walk<'_>,
    mut wanted: Vec<u64>,
    from: u64,
    reads: Reads,
    asked: &mut Asked,
    ahead: &mut Vec<StreamMessage>,
) {
    if reads == Reads::Leader {
        return;
    }
    for _ in 0..2 {
        wanted.retain(|seq| !held(walk, ahead, *seq));
        if wanted.is_empty() {
            return;
        }
        asked.requests += wanted.len() as u64;
        asked.rounds += 1;
        let answers =
            futures::future::join_all(wanted.iter().map(|seq| walk.journal.direct_get(*seq))).await;
        let read = ahead.len();
        ahead.extend(answers.into_iter().filter_map(Result::ok));
        // Only the entity's own records' commands: a hint that named another's costs no more.
        wanted = ahead[read..]
            .iter()
            .filter(|m| {
                walk.names
                    .is_record_of(&m.subject, walk.partition, walk.entity)
            })
            .filter_map(|m| link(m).map(|(count, _)| (m.sequence + 1 - count)..m.sequence))
            .flatten()
            .filter(|seq| *seq >= from)
            .collect();
    }
}

/// The record at `seq` is in hand: known to the walk or read ahead.
fn held(walk: &Walk<'_>, ahead: &[StreamMessage], seq: u64) -> bool {
    walk.known.iter().chain(ahead).any(|m| m.sequence == seq)
}

/// Says why a walk stopped at `seq` (its load reads the entity's subjects instead).
fn gave_up(walk: &Walk<'_>, seq: u64, why: &str) -> Option<Vec<StreamMessage>> {
    tracing::debug!(entity = walk.entity, seq, why, "the chain is not followed");
    None
}

/// What `message` says of the records of its entity before it: how many of its command's
/// records of the entity end at it (1 for [`HDR_PREVIOUS`]) and the sequence every earlier one
/// is at or below. `None` without a link, or with one that cannot be (a count of 0, or more
/// than the sequences below it).
fn link(message: &StreamMessage) -> Option<(u64, u64)> {
    if let Some(previous) = header_u64(&message.headers, PREVIOUS) {
        return Some((1, previous));
    }
    let unit = message.headers.get(UNIT)?.as_str();
    let (count, previous) = unit.split_once(' ')?;
    let (count, previous) = (count.parse::<u64>().ok()?, previous.parse::<u64>().ok()?);
    (count >= 1 && count <= message.sequence).then_some((count, previous))
}

/// The entity's record at `seq`, from the known ones or read; `None` if there is none there
/// or it is not one of the entity's own records.
async fn record_at(
    walk: &Walk<'_>,
    ahead: &[StreamMessage],
    seq: u64,
    reads: &mut Reads,
    asked: &mut Asked,
) -> Result<Option<StreamMessage>, Error> {
    let message = match walk.known.iter().chain(ahead).find(|m| m.sequence == seq) {
        Some(held) => Some(held.clone()),
        None => read_at(walk, seq, reads, asked).await?,
    };
    Ok(message.filter(|m| {
        walk.names
            .is_record_of(&m.subject, walk.partition, walk.entity)
    }))
}

/// The message at `seq`, `None` if there is none: by direct get, as `reads` says, else through
/// the API. A replica behind the leader answers "none" for a sequence past its end (it holds a
/// prefix of the stream), which is asked again of the leader; a failure of a direct get other
/// than "none" turns them off for the rest of the walk.
async fn read_at(
    walk: &Walk<'_>,
    seq: u64,
    reads: &mut Reads,
    asked: &mut Asked,
) -> Result<Option<StreamMessage>, Error> {
    if *reads != Reads::Leader {
        asked.requests += 1;
        asked.rounds += 1;
        match walk.journal.direct_get(seq).await {
            Ok(message) => return Ok(Some(message)),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound && *reads == Reads::Direct => {
                return Ok(None);
            }
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => {}
            Err(e) => {
                tracing::debug!(seq, error = %e, "direct get failed; asking the API");
                *reads = Reads::Leader;
            }
        }
    }
    asked.requests += 1;
    asked.rounds += 1;
    match walk.leader.get_raw_message(seq).await {
        Ok(message) => Ok(Some(message)),
        Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(Error::jetstream(format!("read journal sequence {seq}"), e)),
    }
}

const PREVIOUS: HeaderName = HeaderName::from_static(HDR_PREVIOUS);
const UNIT: HeaderName = HeaderName::from_static(HDR_UNIT);
const EARLIER_HEADER: HeaderName = HeaderName::from_static(HDR_EARLIER);

#[cfg(test)]
mod tests;
