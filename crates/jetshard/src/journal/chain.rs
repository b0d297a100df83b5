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

use async_nats::header::HeaderName;
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{DirectGetErrorKind, RawMessageErrorKind, Stream};

use crate::error::Error;
use crate::journal::read::Reads;
use crate::wire::{HDR_PREVIOUS, HDR_UNIT, Names, header_u64};

/// The most commands a walk follows back before it leaves the tail to a scan: a tail that
/// long (an entity type without snapshots) is read faster in one consumer than by as many
/// round trips.
pub(crate) const MAX_HOPS: usize = 256;

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
/// be followed all the way (the caller reads the tail otherwise). `requests` counts the reads
/// made of the server.
pub(crate) async fn records_back(
    walk: &Walk<'_>,
    last: &StreamMessage,
    from: u64,
    mut reads: Reads,
    requests: &mut u64,
) -> Result<Option<Vec<StreamMessage>>, Error> {
    let mut found = Vec::new();
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
        for seq in first..at.sequence {
            let Some(sibling) = record_at(walk, seq, &mut reads, requests).await? else {
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
        let Some(before) = record_at(walk, previous, &mut reads, requests).await? else {
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
    seq: u64,
    reads: &mut Reads,
    requests: &mut u64,
) -> Result<Option<StreamMessage>, Error> {
    let message = match walk.known.iter().find(|m| m.sequence == seq) {
        Some(known) => Some(known.clone()),
        None => read_at(walk, seq, reads, requests).await?,
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
    requests: &mut u64,
) -> Result<Option<StreamMessage>, Error> {
    *requests += 1;
    if *reads != Reads::Leader {
        match walk.journal.direct_get(seq).await {
            Ok(message) => return Ok(Some(message)),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound && *reads == Reads::Direct => {
                return Ok(None);
            }
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => *requests += 1,
            Err(e) => {
                tracing::debug!(seq, error = %e, "direct get failed; asking the API");
                *reads = Reads::Leader;
                *requests += 1;
            }
        }
    }
    match walk.leader.get_raw_message(seq).await {
        Ok(message) => Ok(Some(message)),
        Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(Error::jetstream(format!("read journal sequence {seq}"), e)),
    }
}

const PREVIOUS: HeaderName = HeaderName::from_static(HDR_PREVIOUS);
const UNIT: HeaderName = HeaderName::from_static(HDR_UNIT);

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
            let mut headers = HeaderMap::new();
            headers.insert(crate::wire::HDR_GENERATION, "1");
            headers.insert(crate::wire::HDR_COMMAND_SEQ, "1");
            if let Some((name, value)) = link {
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
        let a = EntityId::new("a").expect("an id");
        let (evt, tmr) = (
            journal.names.event_subject(0, &a),
            journal.names.timer_subject(0, &a),
        );
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
        let mut requests = 0;
        let found = records_back(&journal.walk(&[]), &last, 1, Reads::Direct, &mut requests)
            .await
            .expect("read")
            .expect("followed");
        let seqs: Vec<u64> = found.iter().map(|m| m.sequence).collect();
        assert_eq!(seqs, own);
        assert_eq!(requests, 5);
        // From above the second command's record (as after a snapshot covering two commands):
        // the last four records, three read (the last one held).
        let mut requests = 0;
        let found = records_back(
            &journal.walk(&[]),
            &last,
            own[1] + 1,
            Reads::Direct,
            &mut requests,
        )
        .await
        .expect("read")
        .expect("followed");
        let seqs: Vec<u64> = found.iter().map(|m| m.sequence).collect();
        assert_eq!(seqs, own[2..]);
        assert_eq!(requests, 3);
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
        let mut requests = 0;
        let walked = records_back(&journal.walk(&[]), &last, 1, Reads::Direct, &mut requests)
            .await
            .expect("read");
        assert!(walked.is_none());
        // A link naming another entity's record.
        let wrong = journal
            .publish(evt, Some((HDR_PREVIOUS, (linked + 1).to_string())))
            .await;
        let last = journal.stream.direct_get(wrong).await.expect("read");
        let walked = records_back(&journal.walk(&[]), &last, 1, Reads::Direct, &mut requests)
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
        let mut requests = 0;
        let found = records_back(&walk, &last, 1, Reads::DirectConfirmed, &mut requests)
            .await
            .expect("read")
            .expect("followed");
        let seqs: Vec<u64> = found.iter().map(|m| m.sequence).collect();
        assert_eq!(seqs, own);
        // Five records read: the two s2 lacks asked again of the leader (7 requests at least),
        // the three it holds answered by it.
        assert!(requests >= 7, "{requests} requests");
        cluster.route_proxy().expect("proxied").heal();
    }
}
