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
        wanted = ahead[read..]
            .iter()
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
mod tests {
    use async_nats::HeaderMap;
    use async_nats::jetstream::Context;

    use super::*;
    use crate::entity::EntityId;

    /// A journal on a fresh server, with the entity `a`'s records interleaved with `others`
    /// records of entity `b` between each two of `a`'s.
    struct Journal {
        _server: Option<jetshard_testkit::NatsServer>,
        js: Context,
        stream: Stream<()>,
        names: Names,
    }

    impl Journal {
        async fn new() -> Self {
            let server = jetshard_testkit::NatsServer::start()
                .await
                .expect("start nats-server");
            let client = server.connect().await.expect("connect");
            let js = async_nats::jetstream::new(client);
            let names = Names::new("t");
            js.create_stream(async_nats::jetstream::stream::Config {
                name: names.journal_stream().to_owned(),
                subjects: names.journal_subjects(),
                allow_direct: true,
                ..Default::default()
            })
            .await
            .expect("create the journal");
            let stream = js
                .get_stream_no_info(names.journal_stream())
                .await
                .expect("open the journal");
            Self {
                _server: Some(server),
                js,
                stream,
                names,
            }
        }

        /// Publishes a record on `subject` with `link` (a header name and value), returning
        /// its sequence.
        async fn publish(&self, subject: String, link: Option<(&'static str, String)>) -> u64 {
            self.publish_with(subject, link.into_iter().collect()).await
        }

        /// Publishes a record on `subject` with `links` (header names and values).
        async fn publish_with(&self, subject: String, links: Vec<(&'static str, String)>) -> u64 {
            let mut headers = HeaderMap::new();
            headers.insert(crate::wire::HDR_GENERATION, "1");
            headers.insert(crate::wire::HDR_COMMAND_SEQ, "1");
            for (name, value) in links {
                headers.insert(name, value.as_str());
            }
            self.js
                .publish_with_headers(subject, headers, "1".into())
                .await
                .expect("publish")
                .await
                .expect("store")
                .sequence
        }

        async fn others(&self, count: usize) {
            let b = EntityId::new("b").expect("an id");
            for _ in 0..count {
                self.publish(self.names.event_subject(0, &b), None).await;
            }
        }

        /// The event and timer subjects of the entity `a` walked.
        fn subjects_of_a(&self) -> (String, String) {
            let a = EntityId::new("a").expect("an id");
            (
                self.names.event_subject(0, &a),
                self.names.timer_subject(0, &a),
            )
        }

        /// The sequences of the records a walk back from `last` down to `from` finds (with
        /// nothing known beforehand), and what it asked.
        async fn walked(&self, last: &StreamMessage, from: u64) -> (Vec<u64>, Asked) {
            let mut asked = Asked::default();
            let found = records_back(&self.walk(&[]), last, from, Reads::Direct, &mut asked)
                .await
                .expect("read")
                .expect("followed");
            (found.iter().map(|m| m.sequence).collect(), asked)
        }

        fn walk<'a>(&'a self, known: &'a [StreamMessage]) -> Walk<'a> {
            Walk {
                journal: &self.stream,
                leader: &self.stream,
                names: &self.names,
                partition: 0,
                entity: "a",
                known,
            }
        }
    }

    /// Five commands of `a`, one of them with two records (an event and a timer record), each
    /// behind a thousand records of another entity: the walk finds exactly `a`'s records after
    /// `from`, with one read per record it did not hold, whatever lies between them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_walk_reads_the_entitys_own_records_only() {
        let journal = Journal::new().await;
        let (evt, tmr) = journal.subjects_of_a();
        let mut own = Vec::new();
        let mut previous = 0;
        for command in 0..5 {
            journal.others(200).await;
            if command == 2 {
                own.push(journal.publish(evt.clone(), None).await);
                let unit = format!("2 {previous}");
                own.push(journal.publish(tmr.clone(), Some((HDR_UNIT, unit))).await);
            } else {
                let link = Some((HDR_PREVIOUS, previous.to_string()));
                own.push(journal.publish(evt.clone(), link).await);
            }
            previous = *own.last().expect("a record");
        }
        let last = journal
            .stream
            .direct_get(previous)
            .await
            .expect("the last record");
        // From the start: all six records; the last one held, five read.
        let (seqs, asked) = journal.walked(&last, 1).await;
        assert_eq!(seqs, own);
        assert_eq!((asked.requests, asked.rounds), (5, 5));
        // From above the second command's record (as after a snapshot covering two commands):
        // the last four records, three read (the last one held).
        let (seqs, asked) = journal.walked(&last, own[1] + 1).await;
        assert_eq!(seqs, own[2..]);
        assert_eq!((asked.requests, asked.rounds), (3, 3));
    }

    /// Records that say where the commands before them ended (`Jetshard-Earlier`, as an
    /// actor's [`Lineage`] writes it): the walk asks for the commands' last records at once,
    /// then for the other record of the command that wrote two, and finds exactly the records
    /// it finds link by link, in two rounds where the links alone take one per record. A hint
    /// that names another entity's record costs a read, never a wrong record.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_walk_reads_the_commands_a_record_names_at_once() {
        let journal = Journal::new().await;
        let (evt, tmr) = journal.subjects_of_a();
        let mut own = Vec::new();
        let mut lineage = Lineage::at(0);
        let links = |name: &'static str, value: String, lineage: &Lineage| {
            let mut links = vec![(name, value)];
            links.extend(lineage.earlier_header().map(|e| (HDR_EARLIER, e)));
            links
        };
        for command in 0..8 {
            journal.others(50).await;
            let last = lineage.last();
            let seq = if command == 3 {
                own.push(journal.publish(evt.clone(), None).await);
                let unit = links(HDR_UNIT, format!("2 {last}"), &lineage);
                journal.publish_with(tmr.clone(), unit).await
            } else {
                let link = links(HDR_PREVIOUS, last.to_string(), &lineage);
                journal.publish_with(evt.clone(), link).await
            };
            own.push(seq);
            lineage.followed_by(seq);
        }
        // The last record names the seven commands before it (the first one's link names 0).
        let last = journal
            .stream
            .direct_get(lineage.last())
            .await
            .expect("read");
        assert_eq!(
            Lineage::of_last(&last, 1).earlier(),
            lineage.earlier(),
            "read back as written"
        );
        let (seqs, asked) = journal.walked(&last, 1).await;
        assert_eq!(seqs, own);
        assert_eq!((asked.requests, asked.rounds), (8, 2));

        // From above the fifth command's record (a snapshot covering five commands): the
        // last three commands' records, one round.
        let (seqs, asked) = journal.walked(&last, own[5] + 1).await;
        assert_eq!(seqs, own[6..]);
        assert_eq!((asked.requests, asked.rounds), (2, 1));

        // A record whose hint names another entity's record (the one just below `a`'s last)
        // among `a`'s: the walk reads it ahead for nothing and follows the links to `a`'s
        // records only.
        let mut hinted = vec![lineage.last() - 1];
        hinted.extend(lineage.earlier().iter().copied());
        let lying = Lineage::from_parts(lineage.last(), hinted);
        let next = journal
            .publish_with(evt, links(HDR_PREVIOUS, lineage.last().to_string(), &lying))
            .await;
        own.push(next);
        let last = journal.stream.direct_get(next).await.expect("read");
        let (seqs, asked) = journal.walked(&last, 1).await;
        assert_eq!(seqs, own);
        // The eight commands' last records and the stranger at once, then the unit's other.
        assert_eq!((asked.requests, asked.rounds), (10, 2));
    }

    /// A record without a link, and a link that leads to another entity's record, end the walk:
    /// the caller reads the tail as before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_broken_chain_is_not_followed() {
        let journal = Journal::new().await;
        let a = EntityId::new("a").expect("an id");
        let evt = journal.names.event_subject(0, &a);
        let unlinked = journal.publish(evt.clone(), None).await;
        journal.others(3).await;
        let linked = journal
            .publish(evt.clone(), Some((HDR_PREVIOUS, unlinked.to_string())))
            .await;
        let last = journal.stream.direct_get(linked).await.expect("read");
        let mut asked = Asked::default();
        let walked = records_back(&journal.walk(&[]), &last, 1, Reads::Direct, &mut asked)
            .await
            .expect("read");
        assert!(walked.is_none());
        // A link naming another entity's record.
        let wrong = journal
            .publish(evt, Some((HDR_PREVIOUS, (linked + 1).to_string())))
            .await;
        let last = journal.stream.direct_get(wrong).await.expect("read");
        let walked = records_back(&journal.walk(&[]), &last, 1, Reads::Direct, &mut asked)
            .await
            .expect("read");
        assert!(walked.is_none());
    }

    /// On R3, a walk whose direct gets reach a replica behind its leader: the cluster's `s2`
    /// reaches its peers through a proxy, which is cut once `s2` holds the entity's first
    /// records; the next ones are stored by the other two. Read through a client of `s2` alone,
    /// its direct gets answer what `s2` holds, and "none" for what it lacks, which the walk asks
    /// of the leader: every record, in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_r3_a_walk_through_a_replica_behind_its_leader_reads_what_it_lacks_from_the_leader()
    {
        use jetshard_testkit::{NatsCluster, wait_until};
        const PATIENCE: std::time::Duration = std::time::Duration::from_secs(15);
        let cluster = NatsCluster::start_with_proxied_routes(3)
            .await
            .expect("start the cluster");
        let client = cluster.node(0).connect().await.expect("connect to s0");
        let js = async_nats::jetstream::new(client.clone());
        let names = Names::new("t");
        js.create_stream(async_nats::jetstream::stream::Config {
            name: names.journal_stream().to_owned(),
            subjects: names.journal_subjects(),
            allow_direct: true,
            num_replicas: 3,
            ..Default::default()
        })
        .await
        .expect("create the journal");
        jetshard_testkit::wait_stream_writable(&js, "t.evt.0.x", PATIENCE)
            .await
            .expect("the journal answers");
        // The quorum goes on without s2: its leader elsewhere.
        wait_until(PATIENCE, "the journal's leader off s2", || async {
            let leader = js
                .get_stream(names.journal_stream())
                .await
                .ok()
                .and_then(|s| s.cached_info().cluster.clone())
                .and_then(|c| c.leader);
            if leader.as_deref() == Some("s2") {
                let subject = format!("$JS.API.STREAM.LEADER.STEPDOWN.{}", names.journal_stream());
                let _ = client.request(subject, "".into()).await;
            }
            leader.is_some_and(|l| l != "s2")
        })
        .await
        .expect("a leader off s2");
        let leader = js
            .get_stream_no_info(names.journal_stream())
            .await
            .expect("open the journal");
        let behind = async_nats::jetstream::new(cluster.node(2).connect().await.expect("s2"));
        let through_behind = behind
            .get_stream_no_info(names.journal_stream())
            .await
            .expect("open the journal on s2");
        let journal = Journal {
            _server: None,
            js: js.clone(),
            stream: leader.clone(),
            names: Names::new("t"),
        };
        let a = EntityId::new("a").expect("an id");
        let evt = names.event_subject(0, &a);
        let mut own = Vec::new();
        let mut previous = 0;
        for _ in 0..3 {
            journal.others(20).await;
            let link = Some((HDR_PREVIOUS, previous.to_string()));
            previous = journal.publish(evt.clone(), link).await;
            own.push(previous);
        }
        // s2 holds them, then is cut off: its clients' direct gets are answered by it alone.
        let held = previous;
        wait_until(PATIENCE, "s2 holds the first records", || async {
            through_behind.direct_get(held).await.is_ok()
        })
        .await
        .expect("s2 caught up");
        cluster.route_proxy().expect("proxied").cut();
        for _ in 0..3 {
            journal.others(20).await;
            let link = Some((HDR_PREVIOUS, previous.to_string()));
            previous = journal.publish(evt.clone(), link).await;
            own.push(previous);
        }
        let lacking = previous;
        wait_until(
            PATIENCE,
            "s2 answers alone, without the new records",
            || async {
                let read = tokio::time::timeout(
                    std::time::Duration::from_millis(300),
                    through_behind.direct_get(lacking),
                )
                .await;
                matches!(read, Ok(Err(e)) if e.kind() == DirectGetErrorKind::NotFound)
            },
        )
        .await
        .expect("s2 cut off, behind its leader");

        let last = leader
            .get_raw_message(lacking)
            .await
            .expect("the last record");
        let walk = Walk {
            journal: &through_behind,
            leader: &leader,
            names: &names,
            partition: 0,
            entity: "a",
            known: &[],
        };
        let mut asked = Asked::default();
        let found = records_back(&walk, &last, 1, Reads::DirectConfirmed, &mut asked)
            .await
            .expect("read")
            .expect("followed");
        let seqs: Vec<u64> = found.iter().map(|m| m.sequence).collect();
        assert_eq!(seqs, own);
        // Five records read: the two s2 lacks asked again of the leader (7 requests at least),
        // the three it holds answered by it.
        assert!(asked.requests >= 7, "{asked:?}");
        cluster.route_proxy().expect("proxied").heal();
    }
}
