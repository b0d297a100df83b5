//! Loading an entity on its first command: its latest snapshot restored, the journal replayed
//! after it; an entity whose records cannot be read back is quarantined.

use std::collections::{BTreeMap, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_nats::jetstream::message::StreamMessage;

use super::batch::InBatch;
use super::outcome_header::LastOutcome;
use super::protocol::{EntityContext, Quarantine, panic_message};
use super::replay::Seed;
use crate::codec::Codec;
use crate::data::origin::Origins;
use crate::entity::{Entity, EntityId, Snapshots};
use crate::error::Error;
use crate::journal::chain::{self, Lineage};
use crate::journal::{self, Reads, Record, SnapshotRecord, StoredEvent, TimerRecord};
use crate::wire::Names;

/// Why an entity could not be revived.
pub(super) enum Revival {
    /// A record of it cannot be read back: quarantine it.
    Quarantined(Quarantine),
    /// The journal could not be read (server unavailable): try again later.
    Unreadable(String),
}

/// Loads one entity from the journal: its latest snapshot, if the entity type writes them and
/// it reads back, then its own records after it: events (`<t>.evt.<p>.<id>`), dead letters
/// (`<t>.dlq.<p>.<id>`, which count as processed) and timer records (`<t>.tmr.<p>.<id>`: its
/// armed timers). Reads only this entity's subjects, so it costs the same however long the
/// partition's history is:
/// - its last record of any kind (`<t>.*.<p>.<id>`), one read, or none when `batch` read the
///   last record of each of its subjects together with other entities' ([`BatchLoad`]): an
///   entity without history, and one whose last record is its snapshot, are loaded by it alone;
/// - otherwise its latest snapshot (one read, or taken from the batch), then its records after
///   the snapshot, in journal order, on the same filter (snapshots passed), by direct gets;
///   none when its last records hold them all: each of them its command's only record, naming
///   (`Jetshard-Previous`) a sequence all the entity's records before it are at or below, down
///   past the snapshot (`journal::tail_is_known`; an entity with one event since its snapshot,
///   or in all, written by this version).
///
/// A snapshot is never written while the entity has a timer armed (`write_snapshot`), so every
/// armed timer's `set` record is after the latest snapshot, and read here.
///
/// A snapshot that does not read back (another state version, a damaged record) is ignored:
/// the entity is loaded from all its events, which are the record; never a wedge.
#[tracing::instrument(level = "debug", skip_all, fields(partition = context.partition, entity = %id, generation = context.journal.generation()))]
pub(super) async fn revive<E: Entity>(
    id: &EntityId,
    context: &EntityContext,
    batch: Option<&InBatch>,
) -> Result<Seed<E>, Revival> {
    let mut reads = ReadsMade::default();
    let revived = read_entity(id, context, batch, &mut reads).await;
    let stats = &context.load_stats;
    stats.loads.fetch_add(1, Ordering::Relaxed);
    stats
        .batched
        .fetch_add(u64::from(reads.batched), Ordering::Relaxed);
    stats.reads.fetch_add(reads.single, Ordering::Relaxed);
    revived
}

/// The reads of one load, for [`LoadStats`](super::LoadStats), and its load permit.
#[derive(Default)]
struct ReadsMade {
    /// Single reads (the batched read is counted by the batch).
    single: u64,
    /// Its last records came from a batched read.
    batched: bool,
    /// One of the process's [`MAX_LOADS`](super::MAX_LOADS) permits, taken before the load's
    /// first read of its own and held to its end. A load that takes everything from a batched
    /// read never takes one: the batch's read holds a permit of another kind
    /// ([`MAX_BATCH_READS`](super::MAX_BATCH_READS), `batch.rs`), so the entities of a burst do
    /// not queue behind each other for a read none of them makes.
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl ReadsMade {
    /// Takes a load permit if this load holds none yet (the semaphore is never closed).
    async fn permit(&mut self, context: &EntityContext) {
        if self.permit.is_none() {
            self.permit = Arc::clone(&context.loads).acquire_owned().await.ok();
        }
    }
}

/// [`revive`], counting its reads in `reads`. Each read's future is boxed apart: every load
/// allocates this one's (its actor boxes it), and a load that takes everything from a batched
/// read makes none of them.
async fn read_entity<E: Entity>(
    id: &EntityId,
    context: &EntityContext,
    batch: Option<&InBatch>,
    reads: &mut ReadsMade,
) -> Result<Seed<E>, Revival> {
    let unreadable =
        |e: Error| Revival::Unreadable(format!("cannot revive {id} from the journal: {e}"));
    let codec = context.codec;
    let partition = context.partition;
    let journal_stream = &context.journal_stream;
    // Every record of the entity (`<t>.*.<p>.<id>`): built only for a read.
    let records = || context.names.entity_records(partition, id);
    let direct = context.direct_reads;
    let mut seed = Seed::<E>::default();
    // Its last record of each kind, if read in a batch with other entities.
    let batched = match batch {
        Some(batch) => batch.records().await,
        None => None,
    };
    let known = batched.as_ref().map(|batched| batched.records());
    reads.batched = known.is_some();
    let mut read_alone = None;
    let last = match known {
        Some(known) => known.iter().max_by_key(|m| m.sequence),
        None => {
            reads.permit(context).await;
            reads.single += 1;
            read_alone = Box::pin(journal::last_record(journal_stream, &records(), direct))
                .await
                .map_err(unreadable)?;
            read_alone.as_ref()
        }
    };
    // Its last records: of each subject (batched), or its very last.
    let lasts = known.unwrap_or(read_alone.as_slice());
    let Some(last) = last else {
        seed.tail = Some(Lineage::at(0));
        return Ok(seed);
    };
    let end = last.sequence;
    let snapshots = E::snapshots();
    let latest = match (snapshots, known) {
        (None, _) => None,
        (Some(_), _) if Names::is_snapshot_subject(&last.subject) => journal::snapshot_record(last),
        (Some(_), Some(known)) => known
            .iter()
            .find(|m| Names::is_snapshot_subject(&m.subject))
            .and_then(journal::snapshot_record),
        (Some(_), None) => {
            reads.permit(context).await;
            reads.single += 1;
            let subject = context.names.snapshot_subject(partition, id);
            Box::pin(journal::latest_snapshot(journal_stream, &subject, direct))
                .await
                .map_err(unreadable)?
        }
    };
    // Records of commands up to `covered` are in the snapshot; those from `from` are read.
    // Those at or below `skipped` need not be (`from - 1`, or the snapshot's own sequence: a
    // record between its `upto` and it is of a command it covers).
    let (mut from, mut covered, mut skipped) = (1, None, 0);
    if let (Some(snapshots), Some((snapshot_seq, snapshot))) = (snapshots, latest) {
        match restore::<E>(&snapshot, snapshots, codec) {
            Ok(restored) => {
                tracing::debug!(
                    snapshot_seq,
                    cmd_seq = snapshot.command_seq,
                    "loaded from a snapshot"
                );
                from = snapshot.upto + 1;
                covered = Some(snapshot.command_seq);
                skipped = snapshot.upto.max(snapshot_seq);
                seed = restored;
                if snapshot_seq == end {
                    // Its last record: nothing after it.
                    seed.tail = Some(Lineage::at(end));
                    return Ok(seed);
                }
            }
            Err(reason) => tracing::warn!(
                snapshot_seq,
                %reason,
                "snapshot ignored; the entity is loaded from its events"
            ),
        }
    }
    let mut quarantine = None;
    // Where each timer's `set` record was read (see below).
    let mut set_at: HashMap<Box<str>, u64> = HashMap::new();
    // Direct gets on a replicated journal too: its end is known, so a replica behind the
    // leader that has not got a record yet says "none", which is asked again of the leader.
    let how = if direct {
        Reads::Direct
    } else {
        Reads::DirectConfirmed
    };
    let each = |stored: StoredEvent<'_>| -> Result<(), Error> {
        if covered.is_some_and(|c| stored.command_seq <= c) || stored.entity != id.as_str() {
            return Ok(());
        }
        if let Record::Timer(TimerRecord::Set { name, .. }) = &stored.record {
            set_at.insert((*name).into(), stored.seq);
        }
        match &mut quarantine {
            None => quarantine = seed.replay(id.as_str(), &stored, codec).err(),
            Some(q) => q.last_command_seq = q.last_command_seq.max(stored.command_seq),
        }
        Ok(())
    };
    // Its records after the snapshot are its last records already (each names the one before
    // it, down past the snapshot): no read. Else they are read.
    if journal::tail_is_known(lasts, skipped + 1, end) {
        journal::replay_known(lasts, skipped + 1, end, each).map_err(unreadable)?;
    } else {
        reads.permit(context).await;
        // Back from its last record, link by link: its own records only, down past the
        // snapshot's own sequence (a record between its `upto` and it is of a command it
        // covers; the link of the entity's first record after a snapshot names the snapshot
        // when the entity was loaded from it).
        let mut asked = chain::Asked::default();
        let tail = Tail {
            lasts,
            last,
            from: skipped + 1,
            how,
        };
        let walked = Box::pin(records_after(context, id, tail, &mut asked))
            .await
            .map_err(unreadable)?;
        reads.single += asked.requests;
        match walked {
            Some(found) => {
                journal::replay_found(&found, each).map_err(unreadable)?;
            }
            None => {
                let replayed = Box::pin(journal::replay_with(
                    journal_stream,
                    records(),
                    from,
                    end,
                    how,
                    each,
                ))
                .await
                .map_err(unreadable)?;
                reads.single += replayed.requests;
            }
        }
    }
    // Where its commands since the snapshot ended, as its last record says: what its next
    // record names for the load after this one.
    seed.tail = Some(Lineage::of_last(last, skipped + 1));
    if !seed.timers.is_empty() {
        reads.permit(context).await;
        reads.single += 1;
        // A compaction may have purged, while they were read, timer records from the front of
        // the entity's subject: then a `set` could have been read without the `fired` or
        // `cancel` after it. Everything a compaction purges is of timers no longer armed, so a
        // timer whose `set` lies before the first record left is not armed.
        let timers = context.names.timer_subject(partition, id);
        let first = Box::pin(journal::first_sequence(journal_stream, &timers))
            .await
            .map_err(unreadable)?
            .unwrap_or(u64::MAX);
        seed.timers
            .retain(|name, _| set_at.get(name).is_some_and(|at| *at >= first));
    }
    match quarantine {
        Some(q) => Err(Revival::Quarantined(q)),
        None => Ok(seed),
    }
}

/// Where an entity's tail is read from: its last records in hand (`lasts`, `last` the very
/// last), down to journal sequence `from`, by direct gets as `how` says.
struct Tail<'a> {
    lasts: &'a [StreamMessage],
    last: &'a StreamMessage,
    from: u64,
    how: Reads,
}

/// The entity's records from `tail.from` up to its last record, in journal order, followed
/// back link by link (`journal/chain/`); `None` when the chain breaks.
async fn records_after(
    context: &EntityContext,
    id: &EntityId,
    tail: Tail<'_>,
    asked: &mut chain::Asked,
) -> Result<Option<Vec<StreamMessage>>, Error> {
    let started = std::time::Instant::now();
    let walk = chain::Walk {
        journal: &context.journal_stream,
        leader: &context.journal_stream,
        names: &context.names,
        partition: context.partition,
        entity: id.as_str(),
        known: tail.lasts,
    };
    let found = chain::records_back(&walk, tail.last, tail.from, tail.how, asked).await?;
    tracing::debug!(
        from = tail.from,
        end = tail.last.sequence,
        records = found.as_ref().map(Vec::len),
        requests = asked.requests,
        rounds = asked.rounds,
        read_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        "tail read"
    );
    Ok(found)
}

/// The state a snapshot holds, or why it cannot be used.
pub(super) fn restore<E: Entity>(
    snapshot: &SnapshotRecord,
    snapshots: Snapshots<E::State>,
    codec: Codec,
) -> Result<Seed<E>, String> {
    if snapshot.version != snapshots.version() {
        return Err(format!(
            "state version {} written, this code reads {}",
            snapshot.version,
            snapshots.version()
        ));
    }
    let decoded = catch_unwind(AssertUnwindSafe(|| {
        snapshots.decode(&snapshot.state, codec)
    }));
    let state = match decoded {
        Ok(Ok(state)) => state,
        Ok(Err(e)) => return Err(format!("state does not decode: {e}")),
        Err(panic) => return Err(format!("decoding panicked: {}", panic_message(&*panic))),
    };
    Ok(Seed {
        state,
        last_command_seq: snapshot.command_seq,
        last_outcome: snapshot
            .last_outcome
            .as_deref()
            .and_then(LastOutcome::from_header),
        journal_seq: snapshot.upto,
        unsnapshotted: 0,
        // Set by the load, once it has read all it reads.
        tail: None,
        // None was armed when the snapshot was written (`write_snapshot`).
        timers: BTreeMap::new(),
        // Empty in a snapshot written before origins were kept.
        origins: snapshot
            .origins
            .as_deref()
            .map(Origins::from_header)
            .unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::super::batch::{BatchLoad, InBatch};
    use super::*;
    use crate::test_alloc::{SMALL_ALLOCATION, future_size};
    use crate::test_entity::Counter;

    /// Every load allocates its future (the entity actor boxes it): the reads only some loads
    /// make (a tail of more than a few records, an entity loaded alone, armed timers) are boxed
    /// apart, so that a load from a batched read alone is a small allocation
    /// ([`SMALL_ALLOCATION`]).
    #[test]
    #[allow(unreachable_code, clippy::diverging_sub_expression)]
    fn a_load_future_is_small() {
        let size = future_size(|| revive::<Counter>(unreachable!(), unreachable!(), None));
        eprintln!("load future: {size} bytes");
        assert!(size <= SMALL_ALLOCATION, "a load's future is {size} bytes");
    }

    /// A partition's context on a fresh single-server journal whose entities `ids` each hold one
    /// event (their first record, `Jetshard-Previous: 0`, as jetshard writes it), with
    /// `permits` load permits and as many batched-read permits; the server is returned to keep
    /// it running.
    async fn journal_of(
        ids: &[&str],
        permits: usize,
    ) -> (jetshard_testkit::NatsServer, Arc<EntityContext>) {
        use crate::telemetry::CommandMetrics;
        use crate::wire::{HDR_COMMAND_SEQ, HDR_GENERATION, HDR_PREVIOUS};
        use metrics::Histogram;
        let server = jetshard_testkit::NatsServer::start()
            .await
            .expect("start nats-server");
        let client = server.connect().await.expect("connect");
        let js = async_nats::jetstream::new(client.clone());
        let names = Arc::new(Names::new("t"));
        js.create_stream(async_nats::jetstream::stream::Config {
            name: names.journal_stream(0).to_owned(),
            subjects: names.journal_subjects(0),
            allow_direct: true,
            allow_atomic_publish: true,
            ..Default::default()
        })
        .await
        .expect("create the journal");
        let journal_stream = js
            .get_stream_no_info(names.journal_stream(0))
            .await
            .expect("open the journal");
        for id in ids {
            let id = EntityId::new(*id).expect("an id");
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(HDR_GENERATION, "1");
            headers.insert(HDR_COMMAND_SEQ, "0");
            headers.insert(HDR_PREVIOUS, "0");
            js.publish_with_headers(names.event_subject(0, &id), headers, "5".into())
                .await
                .expect("publish an event")
                .await
                .expect("store it");
        }
        // The writer's fence record after the events: its watermark covers them.
        let journal = crate::journal::write::test_writer(
            js,
            Arc::clone(&names),
            std::time::Duration::from_secs(5),
        )
        .await;
        let context = Arc::new(EntityContext {
            partition: 0,
            journal,
            journal_stream,
            direct_reads: true,
            client,
            names,
            routes: Arc::default(),
            codec: Codec::Json,
            report: Arc::new(|_| {}),
            metrics: CommandMetrics {
                decide_seconds: Histogram::noop(),
                write_seconds: Histogram::noop(),
                batch_events: Histogram::noop(),
                replay_seconds: Histogram::noop(),
                snapshot_seconds: Histogram::noop(),
            },
            snapshots: super::super::protocol::SnapshotPolicy {
                every: None,
                on_passivation: false,
            },
            loads: Arc::new(tokio::sync::Semaphore::new(permits)),
            batch_reads: Arc::new(tokio::sync::Semaphore::new(permits)),
            load_stats: Arc::default(),
            retired: std::sync::atomic::AtomicBool::new(false),
        });
        (server, context)
    }

    /// A batched read is made when it is planned, before any of its entities loads, and takes
    /// no load permit (a permit of its own kind): it is made while every load permit is taken,
    /// and its entities then load from it alone, without a permit or a read of their own. An
    /// entity loaded alone waits for a load permit for its own read.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batched_read_starts_when_planned_and_takes_no_load_permit() {
        const WITHIN: std::time::Duration = std::time::Duration::from_secs(10);
        let (_server, context) = journal_of(&["a", "b", "c"], 1).await;
        let [a, b, c] = ["a", "b", "c"].map(|id| EntityId::new(id).expect("an id"));
        // Every load permit taken.
        let held = Arc::clone(&context.loads)
            .acquire_owned()
            .await
            .expect("the only permit");
        let batch = BatchLoad::new(&context, &[a.clone(), b.clone()]);
        let (in_a, in_b) = (
            InBatch::new(Arc::clone(&batch), 0),
            InBatch::new(Arc::clone(&batch), 1),
        );
        // Nobody loads yet: the batch's read is made all the same.
        let deadline = tokio::time::Instant::now() + WITHIN;
        while context.load_stats.reads.load(Ordering::Relaxed) == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the batch's read was not made before its entities loaded"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        for (id, share) in [(&a, &in_a), (&b, &in_b)] {
            let seed = tokio::time::timeout(WITHIN, revive::<Counter>(id, &context, Some(share)))
                .await
                .expect("loads from the batch without a load permit")
                .unwrap_or_else(|_| panic!("{id} revives"));
            assert_eq!((seed.state, seed.tail.is_some()), (5, true));
        }
        assert_eq!(
            context.load_stats.reads.load(Ordering::Relaxed),
            1,
            "one read for both"
        );
        assert_eq!(
            context.batch_reads.available_permits(),
            1,
            "the batch's read gave its permit back"
        );
        // `c`, alone, reads: it waits for the permit, and loads once it is given back.
        let mut alone = {
            let context = Arc::clone(&context);
            tokio::spawn(async move {
                revive::<Counter>(&c, &context, None)
                    .await
                    .map(|seed| seed.state)
                    .map_err(|_| "c does not revive")
            })
        };
        // Its read would take a millisecond: half a second without an answer is the wait.
        let waited = std::time::Duration::from_millis(500);
        assert!(
            tokio::time::timeout(waited, &mut alone).await.is_err(),
            "c read without a permit"
        );
        drop(held);
        let state = tokio::time::timeout(WITHIN, alone)
            .await
            .expect("c loads once a permit is free")
            .expect("the load's task");
        assert_eq!(state, Ok(5));
        let loads = &context.load_stats;
        assert_eq!(loads.loads.load(Ordering::Relaxed), 3);
        assert_eq!(loads.batched.load(Ordering::Relaxed), 2);
    }

    fn record(version: u32, state: &[u8]) -> SnapshotRecord {
        SnapshotRecord {
            state: Bytes::copy_from_slice(state),
            version,
            command_seq: 17,
            upto: 40,
            last_outcome: Some("rejected too late".to_owned()),
            origins: None,
        }
    }

    #[test]
    fn the_last_outcome_reads_back_from_its_header() {
        for outcome in [
            LastOutcome::Applied { events: 3 },
            LastOutcome::Rejected("too late".into()),
            LastOutcome::DeadLettered("malformed: x y".into()),
            LastOutcome::Rejected("".into()),
        ] {
            assert_eq!(
                LastOutcome::from_header(&outcome.to_header()),
                Some(outcome)
            );
        }
        assert_eq!(LastOutcome::from_header("applied many"), None);
        assert_eq!(LastOutcome::from_header("other"), None);
    }

    #[test]
    fn a_snapshot_restores_state_mark_and_outcome() {
        let snapshots = Counter::snapshots().unwrap();
        let seed = restore::<Counter>(&record(2, b"42"), snapshots, Codec::Json).unwrap();
        assert_eq!(seed.state, 42);
        assert_eq!(seed.last_command_seq, 17);
        assert_eq!(seed.journal_seq, 40);
        assert_eq!(seed.unsnapshotted, 0);
        assert_eq!(
            seed.last_outcome,
            Some(LastOutcome::Rejected("too late".into()))
        );
    }

    #[test]
    fn a_snapshot_of_another_version_or_that_does_not_decode_is_refused() {
        let snapshots = Counter::snapshots().unwrap();
        let other = restore::<Counter>(&record(1, b"42"), snapshots, Codec::Json);
        assert!(other.is_err_and(|e| e.contains("version 1")));
        let garbage = restore::<Counter>(&record(2, b"\xff{"), snapshots, Codec::Json);
        assert!(garbage.is_err_and(|e| e.contains("does not decode")));
        let bincode = restore::<Counter>(&record(2, &[0xfd; 3]), snapshots, Codec::Bincode);
        assert!(bincode.is_err());
    }
}
