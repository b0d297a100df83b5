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
//!   and within the membership expiry (three heartbeat periods) the survivors choose new
//!   watchers;
//!
//! - it also watches the members that own nothing (their heartbeats name their incarnation);
//!   one found dead is counted out of the membership at once (`Heartbeat::gone`, said for it
//!   on `<t>.nodes`): otherwise the others hold their standbys back for it (it owned fewest)
//!   until its heartbeats expire, and a partition handed off to it just before it died, not
//!   taken, is pulled by nobody meanwhile;
//!
//! - two "no responders" at least [`CONFIRM_GAP`](deaths::CONFIRM_GAP) apart, with no answer between them, declare
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
//! A wrong diagnosis (a process whose connection dropped and comes back) costs one takeover: the
//! new owner claims a new generation, and every write of the old one is fenced.
//!
//! Architecture Invariant: this module unpins only a partition whose latest fence record names
//! an incarnation found dead, whose consumer is still pinned to that record's pin, and whose
//! unpin record for that fence record this process stored first: at most one unpin per claim.

mod deaths;
mod owners;
mod unpin;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::journal::fence::{self, FenceRecord};
use crate::journal::server::Streams;
use crate::runtime::balance::Heartbeat;
use crate::wire::{Names, PRIORITY_GROUP};

pub(crate) use deaths::{Deaths, is_gone};
use deaths::{Diagnosis, ask};
#[cfg(feature = "test-support")]
pub use owners::crash_watchers;
use owners::{Owners, watches};
use unpin::first_to_unpin;

/// How long a watch's probe waits for an answer before it counts for nothing. A new probe
/// goes out every interval whether or not the last one was answered: a probe that reached the
/// process just before it died is never answered, and must not hold up the next one.
const WATCH_PROBE_TIMEOUT: Duration = Duration::from_millis(250);

/// What the watch needs.
pub(crate) struct WatchArgs {
    pub(crate) client: async_nats::Client,
    /// Publishes the unpin records (`<t>.unpin.<p>`).
    pub(crate) js: async_nats::jetstream::Context,
    pub(crate) names: std::sync::Arc<Names>,
    pub(crate) journals: Streams,
    pub(crate) commands: Streams,
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
    /// The other live processes' incarnations, each with its node, as their heartbeats say:
    /// watched whether or not they own a partition (see [`Heartbeat::gone`]).
    pub(crate) peers: watch::Receiver<BTreeMap<String, String>>,
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
        match fence::latest(args.journals.of(partition), &args.names, partition).await {
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
    // Wake-ups being offered (`pin::wake`); dropped with the watch.
    let mut wakes = FuturesUnordered::new();
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
                let peers = args.peers.borrow().clone();
                let owning = owners.watched();
                let members_owning_nothing = peers.keys().filter(|i| !owning.contains(*i)).cloned();
                for incarnation in owning.iter().cloned().chain(members_owning_nothing) {
                    if args.deaths.is_dead(&incarnation) {
                        continue;
                    }
                    let node = owners.node_of(&incarnation).or_else(|| peers.get(&incarnation).map(String::as_str));
                    if let (Some(members), Some(node)) = (&members, node)
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
            Some(()) = wakes.next(), if !wakes.is_empty() => {}
            Some((incarnation, answer, at)) = answers.next(), if !answers.is_empty() => {
                if args.deaths.heard(&incarnation, answer, at) == Diagnosis::Died {
                    let member = args.peers.borrow().get(&incarnation).cloned();
                    if let Some(node) = &member {
                        // Before the unpins: the others stop holding their standbys back for it.
                        tracing::info!(node = %args.node, dead = %incarnation, member = %node, "a member is gone; counting it out");
                        Heartbeat::gone(node, &incarnation).publish(&args.client, &args.names).await;
                    }
                    let partitions = owners.partitions_of(&incarnation);
                    if partitions.is_empty() {
                        continue;
                    }
                    tracing::warn!(node = %args.node, dead = %incarnation, ?partitions, "a process that owned partitions is gone; unpinning those it still holds");
                    let unpins = partitions.iter().map(|&p| unpin_if_still_owned(&args, p, &incarnation));
                    for (partition, (found, wake)) in partitions.iter().zip(futures::future::join_all(unpins).await) {
                        if let Some((generation, incarnation)) = found {
                            owners.seen(*partition, generation, incarnation.as_deref(), true);
                        }
                        if wake {
                            // Beside the watch: a wake-up may be offered for seconds.
                            let (js, names, partitions) = (args.js.clone(), args.names.clone(), args.partitions);
                            let partition = *partition;
                            wakes.push(async move {
                                crate::runtime::pin::wake(&js, &names, partition, partitions).await;
                            });
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
/// to correct the watch's view, and whether the partition is to be woken (no command waits
/// there to pin a standby).
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
) -> (Option<(u64, Option<String>)>, bool) {
    let (fence_seq, record) = match fence::latest(
        args.journals.of(partition),
        &args.names,
        partition,
    )
    .await
    {
        Ok(Some(latest)) => latest,
        Ok(None) => return (None, false),
        Err(e) => {
            tracing::warn!(partition, error = %e, "crash watch: fence record not read; the pin moves after its TTL");
            return (None, false);
        }
    };
    let found = Some((record.generation, record.incarnation.clone()));
    if record.incarnation.as_deref() != Some(dead) {
        tracing::debug!(
            partition,
            generation = record.generation,
            "already claimed by another process"
        );
        return (found, false);
    }
    let consumer = args.names.consumer(partition);
    let (pinned, waiting) = match args.commands.of(partition).consumer_info(&consumer).await {
        Ok(info) => (
            info.priority_groups
                .iter()
                .find(|g| g.group == PRIORITY_GROUP)
                .and_then(|g| g.pinned_client_id.clone()),
            info.num_pending,
        ),
        Err(e) => {
            tracing::warn!(partition, error = %e, "crash watch: consumer not read; the pin moves after its TTL");
            return (found, false);
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
            return (found, false);
        }
    };
    if !unpin && waiting > 0 {
        return (found, false);
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
            return (found, false);
        }
        Err(e) => {
            tracing::warn!(partition, error = %e, "crash watch: unpin record not stored; the pin moves after its TTL");
            return (found, false);
        }
    }
    if unpin {
        match args
            .commands
            .of(partition)
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
                return (found, false);
            }
        }
    }
    // No command waits to pin a standby: it is to be woken, so that it takes the partition and
    // fires the timers due there.
    (found, waiting == 0)
}
