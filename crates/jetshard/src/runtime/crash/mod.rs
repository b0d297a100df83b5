//! Crash detection: moving a dead process's partitions without waiting for the pin TTL.
//!
//! A process that dies takes its connection with it, and the server then knows no subscriber of
//! its `<t>.alive.<incarnation>`: a request there is answered "no responders" within a
//! millisecond or two. Each shard system watches the processes that own partitions:
//!
//! - it learns who owns what from the fence records (read once at start, then from a core
//!   subscription on `<t>.fence.*`: every claim is seen as it is published);
//! - every [`probe interval`](crate::ShardConfigBuilder::crash_probe_interval) it asks the
//!   owning incarnations it watches whether they are there. Each owning process is watched by
//!   [`crash_watchers`](crate::ShardConfigBuilder::crash_watchers) others (default 3), not by
//!   everyone: the first `k` of the live processes (the membership heard on `<t>.nodes`) ranked
//!   by a hash of (watcher, watched) node names, rendezvous hashing, so every process agrees
//!   without a coordinator and a membership change moves only the watches of the process that
//!   came or went. A process that has heard no membership (balancing off, or in its first pin
//!   TTL) watches every owner, as before. Idle probe traffic is `N x k / interval` requests and
//!   answers for N processes: linear in N, constant per process. An owner whose watchers all
//!   die with it loses its pin at the pin TTL (the server's own fallback, as without a watch),
//!   and within the membership expiry (three pin TTLs) the survivors choose new watchers;
//!
//! - two "no responders" at least [`CONFIRM_GAP`] apart, with no answer between them, declare
//!   it dead: for each partition whose latest fence record (read again from the stream) still
//!   names it, and whose consumer is still pinned to the pin that record names, it asks the
//!   server to unpin. A standby's waiting pull is pinned about a millisecond later.
//!
//! Several watches find the same death at once; the first to store an unpin record for the dead
//! owner's fence record (`<t>.unpin.<p>`, deduplicated by the fence record's sequence) unpins,
//! the others leave the pin alone (see `unpin_if_still_owned`).
//!
//! Only "no responders" counts: it is the server saying that nobody subscribes, which is what a
//! closed connection leaves. A probe that times out (a stalled, swapped or busy process, or a
//! slow network) counts for nothing: such an owner keeps its pin until the pin TTL, as before.
//! A wrong verdict (a process whose connection dropped and comes back) costs one takeover: the
//! new owner claims a new generation, and every write of the old one is fenced.
//!
//! Architecture Invariant: this module unpins only a partition whose latest fence record names
//! an incarnation found dead, whose consumer is still pinned to that record's pin, and whose
//! unpin record for that fence record this process stored first: at most one unpin per claim.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::stream::Stream;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::journal::fence::{self, FenceRecord};
use crate::wire::{Names, PRIORITY_GROUP};

/// Two "no responders" this far apart (with no answer between them) declare a process dead.
/// A subscription that is being set up or moved between servers of a cluster is missing for
/// less than that; a closed connection stays closed.
pub(crate) const CONFIRM_GAP: Duration = Duration::from_millis(20);

/// How long a claim's probe waits for an answer before it counts for nothing. Only "no
/// responders" changes a claim's verdict (an answer and a timeout both mean "not known dead"),
/// and the server gives it within a millisecond or two: a longer wait would only delay the
/// takeover from a stalled owner, whose probe is never answered.
const CLAIM_PROBE_TIMEOUT: Duration = Duration::from_millis(50);

/// How long a watch's probe waits for an answer before it counts for nothing. A new probe
/// goes out every interval whether or not the last one was answered: a probe that reached the
/// process just before it died is never answered, and must not hold up the next one.
const WATCH_PROBE_TIMEOUT: Duration = Duration::from_millis(250);

/// The most dead incarnations remembered (the oldest are forgotten first).
const REMEMBERED_DEATHS: usize = 1024;

/// What one ask on `<t>.alive.<incarnation>` got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The process answered.
    Alive,
    /// The server knows no subscriber: the connection is gone (for now, or for good).
    NoResponders,
    /// No answer in time, or another error: tells nothing.
    Silent,
}

/// Asks the process of `incarnation` once whether it is there, waiting `timeout` at most.
pub(crate) async fn ask(
    client: &async_nats::Client,
    names: &Names,
    incarnation: &str,
    timeout: Duration,
) -> Answer {
    let request = client.request(names.alive_subject(incarnation), Default::default());
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(_)) => Answer::Alive,
        Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
            Answer::NoResponders
        }
        _ => Answer::Silent,
    }
}

/// What this process knows of other processes' deaths, shared by its watch and its claims
/// (a claim whose previous owner is known dead does not probe it again).
#[derive(Default)]
pub(crate) struct Deaths {
    inner: Mutex<Known>,
    /// Bumped at every death recorded, to wake claims waiting on a verdict.
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct Known {
    /// When the first "no responders" of a run was seen, per incarnation.
    suspected: HashMap<String, Instant>,
    dead: HashSet<String>,
    order: VecDeque<String>,
}

/// A verdict on an incarnation after an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Alive,
    /// One "no responders" (or several, less than [`CONFIRM_GAP`] apart) so far.
    Suspect,
    /// Declared dead by this answer.
    Died,
    /// Declared dead before.
    Dead,
    Unknown,
}

impl Deaths {
    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `incarnation` was declared dead.
    pub(crate) fn is_dead(&self, incarnation: &str) -> bool {
        self.known().dead.contains(incarnation)
    }

    /// Takes an answer of `incarnation` at `now` into account.
    pub(crate) fn heard(&self, incarnation: &str, answer: Answer, now: Instant) -> Verdict {
        let mut known = self.known();
        match answer {
            Answer::Alive => {
                known.suspected.remove(incarnation);
                if known.dead.remove(incarnation) {
                    known.order.retain(|i| i != incarnation);
                }
                Verdict::Alive
            }
            Answer::Silent => Verdict::Unknown,
            Answer::NoResponders => {
                if known.dead.contains(incarnation) {
                    return Verdict::Dead;
                }
                let since = *known.suspected.entry(incarnation.to_owned()).or_insert(now);
                if now.duration_since(since) < CONFIRM_GAP {
                    return Verdict::Suspect;
                }
                known.suspected.remove(incarnation);
                known.dead.insert(incarnation.to_owned());
                known.order.push_back(incarnation.to_owned());
                while known.order.len() > REMEMBERED_DEATHS {
                    if let Some(oldest) = known.order.pop_front() {
                        known.dead.remove(&oldest);
                    }
                }
                drop(known);
                self.changed.send_modify(|n| *n += 1);
                Verdict::Died
            }
        }
    }

    /// `incarnation` wrote a new fence record: it is alive, whatever was concluded before.
    pub(crate) fn revived(&self, incarnation: &str) {
        let mut known = self.known();
        known.suspected.remove(incarnation);
        if known.dead.remove(incarnation) {
            known.order.retain(|i| i != incarnation);
        }
    }

    /// When a "no responders" of `incarnation` was first seen in the current run of them.
    fn suspected_since(&self, incarnation: &str) -> Option<Instant> {
        self.known().suspected.get(incarnation).copied()
    }

    /// Waits until `incarnation` is declared dead or `until` passes.
    async fn wait_dead(&self, incarnation: &str, until: Instant) {
        let mut changed = self.changed.subscribe();
        while !self.is_dead(incarnation) {
            if tokio::time::timeout_at(until, changed.changed())
                .await
                .is_err()
            {
                return;
            }
        }
    }
}

/// Whether the process of `incarnation` is gone, as a claim needs to know: dead if it was
/// declared dead and still gets "no responders", or if it gets "no responders" twice
/// [`CONFIRM_GAP`] apart (counting this process's watch's earlier ones); alive if it answers;
/// unknown if it does not answer in time.
pub(crate) async fn is_gone(
    client: &async_nats::Client,
    names: &Names,
    deaths: &Deaths,
    incarnation: &str,
) -> bool {
    loop {
        let answer = ask(client, names, incarnation, CLAIM_PROBE_TIMEOUT).await;
        match deaths.heard(incarnation, answer, Instant::now()) {
            Verdict::Died | Verdict::Dead => return true,
            Verdict::Alive | Verdict::Unknown => return false,
            Verdict::Suspect => {
                let since = deaths
                    .suspected_since(incarnation)
                    .unwrap_or_else(Instant::now);
                deaths.wait_dead(incarnation, since + CONFIRM_GAP).await;
            }
        }
    }
}

/// Who owns each partition, by the fence records seen: the pure part of the watch.
#[derive(Debug, Default)]
pub(crate) struct Owners {
    me: String,
    /// Per partition: the newest generation seen and the incarnations that claimed it (two
    /// claims of one generation are both seen on the subscription; one of them lost).
    latest: HashMap<u32, (u64, Vec<String>)>,
    /// The node name of each incarnation seen in a fence record (watches are chosen by node).
    nodes: HashMap<String, String>,
}

impl Owners {
    pub(crate) fn new(me: &str) -> Self {
        Self {
            me: me.to_owned(),
            latest: HashMap::new(),
            nodes: HashMap::new(),
        }
    }

    /// `incarnation` runs on the node named `node` (from its fence record).
    pub(crate) fn named(&mut self, incarnation: &str, node: &str) {
        if self.nodes.get(incarnation).is_some_and(|n| n == node) {
            return;
        }
        self.nodes.insert(incarnation.to_owned(), node.to_owned());
        // Forget the incarnations no partition names any more, so the map stays bounded.
        if self.nodes.len() > 2 * self.latest.len() + 16 {
            let named: HashSet<&String> = self.latest.values().flat_map(|(_, i)| i).collect();
            self.nodes.retain(|i, _| named.contains(i));
        }
    }

    /// The node of `incarnation`, if a fence record named it.
    pub(crate) fn node_of(&self, incarnation: &str) -> Option<&str> {
        self.nodes.get(incarnation).map(String::as_str)
    }

    /// A fence record of `partition` was seen: `confirmed` when read from the stream (it is the
    /// latest), not when heard on the subscription (it may have lost its race).
    pub(crate) fn seen(
        &mut self,
        partition: u32,
        generation: u64,
        incarnation: Option<&str>,
        confirmed: bool,
    ) {
        let entry = self.latest.entry(partition).or_insert((0, Vec::new()));
        if generation < entry.0 {
            return;
        }
        if generation > entry.0 || confirmed {
            *entry = (generation, Vec::new());
        }
        if let Some(incarnation) = incarnation
            && !entry.1.iter().any(|i| i == incarnation)
        {
            entry.1.push(incarnation.to_owned());
        }
    }

    /// The incarnations to watch: those named by a partition's newest records, but this one's.
    pub(crate) fn watched(&self) -> BTreeSet<String> {
        self.latest
            .values()
            .flat_map(|(_, incarnations)| incarnations.iter())
            .filter(|i| **i != self.me)
            .cloned()
            .collect()
    }

    /// The partitions whose newest records name `incarnation`.
    pub(crate) fn partitions_of(&self, incarnation: &str) -> Vec<u32> {
        let mut partitions: Vec<u32> = self
            .latest
            .iter()
            .filter(|(_, (_, incarnations))| incarnations.iter().any(|i| i == incarnation))
            .map(|(p, _)| *p)
            .collect();
        partitions.sort_unstable();
        partitions
    }
}

/// The processes that watch the node `watched`: the first `k` of `members` (but `watched`)
/// ranked by rendezvous hashing. Every process that knows the same members computes the same
/// watchers; a member that comes or goes changes the watchers of the nodes it ranks high for,
/// and no others. Operators and tests use it to tell who watches whom.
pub fn crash_watchers<'a>(
    watched: &str,
    members: impl IntoIterator<Item = &'a str>,
    k: usize,
) -> Vec<&'a str> {
    let others = members.into_iter().filter(|m| *m != watched);
    crate::runtime::balance::rendezvous(&crate::wire::watch_key(watched), others, k)
}

/// Whether `me` is one of the `k` watchers of `watched` among `members` (which may or may not
/// name `me`).
pub(crate) fn watches(me: &str, watched: &str, members: &BTreeSet<String>, k: usize) -> bool {
    if me == watched {
        return false;
    }
    let ranked = members
        .iter()
        .map(String::as_str)
        .chain(std::iter::once(me));
    crash_watchers(watched, ranked, k).contains(&me)
}

/// What the watch needs.
pub(crate) struct WatchArgs {
    pub(crate) client: async_nats::Client,
    /// Publishes the unpin records (`<t>.unpin.<p>`).
    pub(crate) js: async_nats::jetstream::Context,
    pub(crate) names: std::sync::Arc<Names>,
    pub(crate) journal: Stream<()>,
    pub(crate) commands: Stream<()>,
    pub(crate) partitions: u32,
    pub(crate) incarnation: String,
    pub(crate) node: String,
    pub(crate) interval: Duration,
    pub(crate) deaths: std::sync::Arc<Deaths>,
    /// How many processes watch each owner.
    pub(crate) watchers: usize,
    /// The live processes (node names) as the membership last heard them; `None` while there
    /// is no membership (balancing off): then every owner is watched.
    pub(crate) members: watch::Receiver<Option<BTreeSet<String>>>,
}

/// Starts watching the owners of the entity type's partitions (see the module docs). The
/// subscription is made before this returns, so no claim published after it is missed.
///
/// # Errors
/// If the subscription cannot be made.
pub(crate) async fn watch(args: WatchArgs) -> Result<JoinHandle<()>, async_nats::SubscribeError> {
    let claims = args.client.subscribe(args.names.fence_subjects()).await?;
    Ok(tokio::spawn(run(args, claims)))
}

async fn run(args: WatchArgs, mut claims: async_nats::Subscriber) {
    let mut owners = Owners::new(&args.incarnation);
    for partition in 0..args.partitions {
        match fence::latest(&args.journal, &args.names, partition).await {
            Ok(Some((_, record))) => {
                if let Some(incarnation) = &record.incarnation {
                    owners.named(incarnation, &record.node);
                }
                owners.seen(
                    partition,
                    record.generation,
                    record.incarnation.as_deref(),
                    true,
                );
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(partition, error = %e, "crash watch: fence record not read");
            }
        }
    }
    let mut tick = tokio::time::interval(args.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut answers = FuturesUnordered::new();
    loop {
        tokio::select! {
            claim = claims.next() => {
                let Some(claim) = claim else { return };
                let headers = claim.headers.unwrap_or_default();
                if let Ok(record) = FenceRecord::decode(&headers, &claim.payload) {
                    if let Some(incarnation) = &record.incarnation {
                        args.deaths.revived(incarnation);
                        owners.named(incarnation, &record.node);
                    }
                    owners.seen(record.partition, record.generation, record.incarnation.as_deref(), false);
                }
            }
            _ = tick.tick() => {
                let members = args.members.borrow().clone();
                for incarnation in owners.watched() {
                    if args.deaths.is_dead(&incarnation) {
                        continue;
                    }
                    if let (Some(members), Some(node)) = (&members, owners.node_of(&incarnation))
                        && !watches(&args.node, node, members, args.watchers)
                    {
                        continue;
                    }
                    let client = args.client.clone();
                    let names = args.names.clone();
                    answers.push(async move {
                        let answer = ask(&client, &names, &incarnation, WATCH_PROBE_TIMEOUT).await;
                        (incarnation, answer, Instant::now())
                    });
                }
            }
            Some((incarnation, answer, at)) = answers.next(), if !answers.is_empty() => {
                if args.deaths.heard(&incarnation, answer, at) == Verdict::Died {
                    let partitions = owners.partitions_of(&incarnation);
                    tracing::warn!(node = %args.node, dead = %incarnation, ?partitions, "a process that owned partitions is gone; unpinning those it still holds");
                    let unpins = partitions.iter().map(|&p| unpin_if_still_owned(&args, p, &incarnation));
                    for (partition, found) in partitions.iter().zip(futures::future::join_all(unpins).await) {
                        if let Some((generation, incarnation)) = found {
                            owners.seen(*partition, generation, incarnation.as_deref(), true);
                        }
                    }
                }
            }
        }
    }
}

/// Unpins `partition` if its latest fence record names `dead`, its consumer is still pinned
/// under the pin that record names (none named: an older record; unpinned anyway), and no other
/// watch unpins it for the same record. Returns the latest record's generation and incarnation,
/// to correct the watch's view.
///
/// Every live process watches, so several find the same owner dead within a millisecond. The
/// server's unpin names no pin: a second unpin sent just after the first would take the pin from
/// the standby the first one let in. So a watch first stores an unpin record whose `Nats-Msg-Id`
/// names the fence record; the server stores it once, and answers every later watch
/// "duplicate": only the first unpins.
async fn unpin_if_still_owned(
    args: &WatchArgs,
    partition: u32,
    dead: &str,
) -> Option<(u64, Option<String>)> {
    let (fence_seq, record) = match fence::latest(&args.journal, &args.names, partition).await {
        Ok(Some(latest)) => latest,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!(partition, error = %e, "crash watch: fence record not read; the pin moves after its TTL");
            return None;
        }
    };
    let found = Some((record.generation, record.incarnation.clone()));
    if record.incarnation.as_deref() != Some(dead) {
        tracing::debug!(
            partition,
            generation = record.generation,
            "already claimed by another process"
        );
        return found;
    }
    let consumer = args.names.consumer(partition);
    let (pinned, waiting) = match args.commands.consumer_info(&consumer).await {
        Ok(info) => (
            info.priority_groups
                .iter()
                .find(|g| g.group == PRIORITY_GROUP)
                .and_then(|g| g.pinned_client_id.clone()),
            info.num_pending,
        ),
        Err(e) => {
            tracing::warn!(partition, error = %e, "crash watch: consumer not read; the pin moves after its TTL");
            return found;
        }
    };
    // Unpin if the dead owner's pin holds (a record naming none is older: unpinned anyway).
    // Nobody pinned (its pin lapsed, or the server restarted): nothing to unpin, but with no
    // command waiting the partition would stay unowned, and its timers unfired.
    let unpin = match (&record.pin, &pinned) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(pin), Some(pinned)) if pin == pinned => true,
        (Some(_), Some(_)) => {
            tracing::debug!(
                partition,
                generation = record.generation,
                "the pin has already moved"
            );
            return found;
        }
    };
    if !unpin && waiting > 0 {
        return found;
    }
    let what = serde_json::json!({
        "fence_seq": fence_seq,
        "generation": record.generation,
        "dead": record.incarnation,
        "owner": record.node,
        "by": args.incarnation,
        "by_node": args.node,
    });
    match first_to_unpin(
        &args.js,
        &args.names,
        partition,
        fence_seq,
        what.to_string(),
    )
    .await
    {
        Ok(true) => {}
        Ok(false) => {
            tracing::debug!(
                partition,
                generation = record.generation,
                "another process unpins it"
            );
            return found;
        }
        Err(e) => {
            tracing::warn!(partition, error = %e, "crash watch: unpin record not stored; the pin moves after its TTL");
            return found;
        }
    }
    if unpin {
        match args
            .commands
            .unpin_consumer(&consumer, PRIORITY_GROUP)
            .await
        {
            Ok(()) => tracing::info!(
                partition,
                generation = record.generation,
                node = %args.node,
                owner = %record.node,
                "unpinned the partition of a dead process"
            ),
            Err(e) => {
                tracing::warn!(partition, error = %e, "crash watch: unpin failed; the pin moves after its TTL");
                return found;
            }
        }
    }
    if waiting == 0 {
        // No command waits to pin a standby: wake it, so that it takes the partition and fires
        // the timers due there.
        crate::runtime::pin::wake(&args.js, &args.names, partition, args.partitions).await;
    }
    found
}

/// Stores the unpin record of the fence record at `fence_seq` (`what`: who found whom dead,
/// for people reading the journal): true if this watch stored it first (it unpins), false if
/// the server already had it (another watch unpins).
async fn first_to_unpin(
    js: &async_nats::jetstream::Context,
    names: &Names,
    partition: u32,
    fence_seq: u64,
    what: String,
) -> Result<bool, String> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(
        crate::wire::HDR_MSG_ID,
        names.unpin_msg_id(partition, fence_seq).as_str(),
    );
    headers.insert(crate::wire::HDR_ROLLUP, "sub");
    let ack = js
        .publish_with_headers(names.unpin_subject(partition), headers, what.into())
        .await
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())?;
    Ok(!ack.duplicate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_no_responders_a_gap_apart_declare_death_and_an_answer_or_a_claim_undoes_it() {
        let deaths = Deaths::default();
        let t0 = Instant::now();
        assert_eq!(
            deaths.heard("a", Answer::NoResponders, t0),
            Verdict::Suspect
        );
        // Too soon after the first: still a suspect.
        let soon = t0 + CONFIRM_GAP / 2;
        assert_eq!(
            deaths.heard("a", Answer::NoResponders, soon),
            Verdict::Suspect
        );
        assert!(!deaths.is_dead("a"));
        let later = t0 + CONFIRM_GAP;
        assert_eq!(
            deaths.heard("a", Answer::NoResponders, later),
            Verdict::Died
        );
        assert!(deaths.is_dead("a"));
        // Once: later answers of the dead do not declare it again.
        assert_eq!(
            deaths.heard("a", Answer::NoResponders, later),
            Verdict::Dead
        );
        // It answered after all (its connection came back): alive, and the count restarts.
        assert_eq!(deaths.heard("a", Answer::Alive, later), Verdict::Alive);
        assert!(!deaths.is_dead("a"));
        assert_eq!(
            deaths.heard("a", Answer::NoResponders, later + CONFIRM_GAP * 2),
            Verdict::Suspect
        );
        // A new claim of it is a sign of life too.
        deaths.heard("a", Answer::NoResponders, later + CONFIRM_GAP * 4);
        deaths.revived("a");
        assert_eq!(
            deaths.heard("a", Answer::NoResponders, later + CONFIRM_GAP * 5),
            Verdict::Suspect
        );
    }

    #[test]
    fn a_probe_that_times_out_counts_for_nothing() {
        let deaths = Deaths::default();
        let t0 = Instant::now();
        for k in 0..10 {
            assert_eq!(
                deaths.heard("slow", Answer::Silent, t0 + CONFIRM_GAP * k),
                Verdict::Unknown
            );
        }
        assert!(!deaths.is_dead("slow"));
        assert_eq!(
            deaths.heard("b", Answer::NoResponders, t0),
            Verdict::Suspect
        );
        assert_eq!(
            deaths.heard("b", Answer::Silent, t0 + CONFIRM_GAP),
            Verdict::Unknown
        );
        assert!(!deaths.is_dead("b"));
    }

    #[tokio::test]
    async fn of_the_watches_that_find_one_claim_dead_only_the_first_unpins() {
        use async_nats::jetstream::stream;
        let server = jetshard_testkit::NatsServer::start()
            .await
            .expect("nats-server");
        let client = async_nats::connect(server.url()).await.expect("connect");
        let js = async_nats::jetstream::new(client);
        let names = Names::new("t");
        js.create_stream(stream::Config {
            name: names.journal_stream.clone(),
            subjects: names.journal_subjects(),
            allow_rollup: true,
            ..Default::default()
        })
        .await
        .expect("create the journal");
        // Five watches found the claim at sequence 7 of partition 3 dead at once.
        let firsts = futures::future::join_all(
            (0..5).map(|i| first_to_unpin(&js, &names, 3, 7, format!("watch {i}"))),
        )
        .await;
        let firsts: Vec<bool> = firsts.into_iter().map(|r| r.expect("stored")).collect();
        assert_eq!(firsts.iter().filter(|f| **f).count(), 1, "{firsts:?}");
        // Later, again: still not first.
        assert!(
            !first_to_unpin(&js, &names, 3, 7, "late".into())
                .await
                .unwrap()
        );
        // Another claim (or another partition) is another verdict.
        assert!(
            first_to_unpin(&js, &names, 3, 9, "next claim".into())
                .await
                .unwrap()
        );
        assert!(
            first_to_unpin(&js, &names, 4, 7, "other partition".into())
                .await
                .unwrap()
        );
        // Rolled up: one record per partition.
        let stored = js
            .get_stream(&names.journal_stream)
            .await
            .unwrap()
            .info()
            .await
            .unwrap()
            .state
            .messages;
        assert_eq!(stored, 2);
    }

    #[test]
    fn the_watch_follows_the_newest_claims_and_skips_this_process() {
        let mut owners = Owners::new("me");
        owners.seen(0, 3, Some("x"), true);
        owners.seen(1, 1, Some("me"), true);
        owners.seen(2, 5, Some("y"), false);
        assert_eq!(owners.watched(), ["x", "y"].map(String::from).into());
        // Two claims of generation 6 of partition 2 were heard: both watched until one is read
        // back from the stream as the latest.
        owners.seen(2, 6, Some("x"), false);
        owners.seen(2, 6, Some("z"), false);
        assert_eq!(owners.partitions_of("z"), vec![2]);
        assert_eq!(owners.partitions_of("x"), vec![0, 2]);
        owners.seen(2, 6, Some("z"), true);
        assert_eq!(owners.partitions_of("x"), vec![0]);
        // An older record heard late changes nothing.
        owners.seen(0, 2, Some("y"), false);
        assert_eq!(owners.partitions_of("x"), vec![0]);
        // Partition 0 is taken by this process: x is no longer watched.
        owners.seen(0, 4, Some("me"), false);
        assert_eq!(owners.watched(), ["z"].map(String::from).into());
    }

    #[test]
    fn each_owner_has_k_watchers_that_every_process_agrees_on() {
        let members: BTreeSet<String> = (0..64).map(|i| format!("node-{i}")).collect();
        let mut watching = HashMap::<&str, usize>::new();
        for watched in &members {
            let watchers = crash_watchers(watched, members.iter().map(String::as_str), 3);
            assert_eq!(watchers.len(), 3);
            assert!(!watchers.contains(&watched.as_str()));
            // Each process decides alone, from the same members, and agrees.
            for me in &members {
                assert_eq!(
                    watches(me, watched, &members, 3),
                    watchers.contains(&me.as_str()),
                    "{me} on {watched}"
                );
            }
            for w in watchers {
                *watching.entry(w).or_default() += 1;
            }
        }
        // Spread: no process watches many more than k others (64 x 3 watches over 64).
        let most = watching.values().max().copied().unwrap_or(0);
        assert!(most <= 9, "a process watches {most} owners");
    }

    #[test]
    fn a_member_that_comes_or_goes_moves_only_its_own_watches() {
        let mut members: BTreeSet<String> = (0..16).map(|i| format!("n{i}")).collect();
        let before: HashMap<String, Vec<String>> = members
            .iter()
            .map(|w| {
                let watchers = crash_watchers(w, members.iter().map(String::as_str), 3);
                (w.clone(), watchers.into_iter().map(str::to_owned).collect())
            })
            .collect();
        let gone = "n7".to_owned();
        members.remove(&gone);
        for (watched, was) in &before {
            if *watched == gone {
                continue;
            }
            let now = crash_watchers(watched, members.iter().map(String::as_str), 3);
            let kept: Vec<&String> = was.iter().filter(|w| **w != gone).collect();
            for w in kept {
                assert!(
                    now.contains(&w.as_str()),
                    "{w} stays a watcher of {watched}"
                );
            }
        }
        // Too few members for k: everyone watches everyone else.
        let two: BTreeSet<String> = ["a".to_owned(), "b".to_owned()].into();
        assert!(watches("a", "b", &two, 3));
        assert!(!watches("a", "a", &two, 3));
        // A process that knows nobody yet watches everyone.
        assert!(watches("new", "x", &BTreeSet::new(), 1));
    }
}
