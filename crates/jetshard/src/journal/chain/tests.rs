//! Unit tests of the chain walk (real servers).

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
            name: names.journal_stream(0).to_owned(),
            subjects: names.journal_subjects(0),
            allow_direct: true,
            ..Default::default()
        })
        .await
        .expect("create the journal");
        let stream = js
            .get_stream_no_info(names.journal_stream(0))
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
async fn on_r3_a_walk_through_a_replica_behind_its_leader_reads_what_it_lacks_from_the_leader() {
    use jetshard_testkit::{NatsCluster, wait_until};
    const PATIENCE: std::time::Duration = std::time::Duration::from_secs(15);
    let cluster = NatsCluster::start_with_proxied_routes(3)
        .await
        .expect("start the cluster");
    let client = cluster.node(0).connect().await.expect("connect to s0");
    let js = async_nats::jetstream::new(client.clone());
    let names = Names::new("t");
    js.create_stream(async_nats::jetstream::stream::Config {
        name: names.journal_stream(0).to_owned(),
        subjects: names.journal_subjects(0),
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
            .get_stream(names.journal_stream(0))
            .await
            .ok()
            .and_then(|s| s.cached_info().cluster.clone())
            .and_then(|c| c.leader);
        if leader.as_deref() == Some("s2") {
            let subject = format!("$JS.API.STREAM.LEADER.STEPDOWN.{}", names.journal_stream(0));
            let _ = client.request(subject, "".into()).await;
        }
        leader.is_some_and(|l| l != "s2")
    })
    .await
    .expect("a leader off s2");
    let leader = js
        .get_stream_no_info(names.journal_stream(0))
        .await
        .expect("open the journal");
    let behind = async_nats::jetstream::new(cluster.node(2).connect().await.expect("s2"));
    let through_behind = behind
        .get_stream_no_info(names.journal_stream(0))
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
