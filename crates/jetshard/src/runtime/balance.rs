//! Spreading partitions over the processes that run an entity type.
//!
//! The server pins each partition to one of the processes pulling it, which can leave one
//! process with every partition. Each process publishes a heartbeat on `<t>.nodes` (core NATS)
//! with how many partitions it owns, every pin TTL (less often past a few dozen processes:
//! [`heartbeat_period`]), and hears the others'. A process that owns more than its fair share,
//! `ceil(partitions / processes)`, while others own less, hands off its excess (at most what the
//! others lack; gracefully: drain, acknowledge, unpin, stay out for a while); a process under
//! its share is pulling as a standby and is pinned.
//!
//! Not every process stands by for every partition: a partition is pulled by its owner and by
//! the first [`standbys`](crate::ShardConfigBuilder::standbys) + 1 live processes ranked by
//! rendezvous hashing of (process, partition) (the owner among them or not), so the pulls a
//! partition costs do not grow with the fleet, and the partitions a process stands by for are
//! spread evenly. While the spread is uneven (a process owns more than its fair share), the
//! processes under their share pull every partition, so that whatever is handed off lands on
//! one of them. When the members change (a process comes, goes, falls silent for three
//! heartbeat periods, or is found dead by its crash watchers, who say so for it) the standbys
//! are chosen again: a partition whose owner and standbys all died is pulled by its new
//! standbys within three heartbeat periods, and pinned by the server once its pin lapses (or at
//! once, if a crash watch of the owner survives and unpins it).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// The first `k` of `members` for `key`, by rendezvous hashing (highest weight first): every
/// process that knows the same members computes the same answer, and a member that comes or
/// goes changes the answer only for the keys it ranks high for.
pub(crate) fn rendezvous<'a>(
    key: &str,
    members: impl IntoIterator<Item = &'a str>,
    k: usize,
) -> Vec<&'a str> {
    let mut ranked: Vec<(u64, &str)> = members.into_iter().map(|m| (weight(m, key), m)).collect();
    ranked.sort_unstable_by(|a, b| b.cmp(a));
    ranked.dedup_by(|a, b| a.1 == b.1);
    ranked.into_iter().take(k).map(|(_, m)| m).collect()
}

/// The rendezvous weight of `member` for `key`: FNV-1a (64 bits) of both, mixed by
/// splitmix64's finalizer so that names differing in one character spread well.
fn weight(member: &str, key: &str) -> u64 {
    let bytes = member.bytes().chain(std::iter::once(0)).chain(key.bytes());
    let mut z = bytes.fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The processes that stand by for `partition` among `members` (node names), `standbys + 1`
/// of them (or all, in a smaller fleet): whichever of them does not own it keeps a pull waiting
/// on its consumer. Operators and tests use it to tell who stands by for what.
#[cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
pub fn partition_standbys<'a>(
    partition: u32,
    members: impl IntoIterator<Item = &'a str>,
    standbys: usize,
) -> Vec<&'a str> {
    rendezvous(&crate::wire::standby_key(partition), members, standbys + 1)
}

/// The partitions `me` stands by for among the live `members` (which name `me`): those for
/// which it is among the first `standbys + 1` by rendezvous hashing. Every partition has
/// `standbys + 1` of them (or every member, in a fleet that small).
pub(crate) fn standing_by(
    me: &str,
    members: &BTreeSet<String>,
    partitions: u32,
    standbys: usize,
) -> Vec<bool> {
    (0..partitions)
        .map(|p| partition_standbys(p, members.iter().map(String::as_str), standbys).contains(&me))
        .collect()
}

/// About how many heartbeats a process hears per pin TTL, at most. A fleet of up to this many
/// says one per process per pin TTL; past it, each process says its heartbeat every
/// `ceil(N / HEARD_PER_TTL)` pin TTLs ([`heartbeat_period`]), so that what one process hears
/// does not grow with the fleet: `N` heartbeats a period, each delivered to `N` processes, is
/// `HEARD_PER_TTL` per process per pin TTL (linear in `N` for the fleet, not `N^2 / T`).
pub(crate) const HEARD_PER_TTL: u32 = 32;

/// How often a process says its heartbeat in a fleet of `members` processes (itself among
/// them): every pin TTL up to [`HEARD_PER_TTL`] members, then proportionally less often. A
/// change of what it owns is said at the next balancing round whatever the period, so the
/// shares the others balance against are a round old at most; what a longer period delays is
/// only counting out a process that died with all its crash watchers (three periods).
pub(crate) fn heartbeat_period(members: usize, pin_ttl: Duration) -> Duration {
    let members = u32::try_from(members).unwrap_or(u32::MAX);
    pin_ttl * members.div_ceil(HEARD_PER_TTL).max(1)
}

/// What a process says of itself on `<t>.nodes` (or a crash watch of a dead one, see
/// [`Heartbeat::gone`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Heartbeat {
    pub(crate) node: String,
    pub(crate) owned: u32,
    /// Said once by a process that stops gracefully, before it releases its partitions: the
    /// others count it out at once. Counted until its heartbeats expire, a process gone would
    /// lower everyone's fair share, and they would hand partitions off to each other.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) leaving: bool,
    /// The process's incarnation (what its liveness answerer listens on, `<t>.alive.<it>`):
    /// its crash watchers probe it, whether or not it owns anything. Absent from older
    /// processes' heartbeats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) incarnation: Option<String>,
    /// The longest until its next heartbeat (milliseconds), when longer than a pin TTL (a
    /// fleet past [`HEARD_PER_TTL`] processes): the others count it out only after three of
    /// these without one. Absent: a pin TTL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) every_ms: Option<u64>,
}

impl Heartbeat {
    /// Said by a crash watch for `incarnation` of `node`, found dead: the others count it out
    /// at once, as if it had left. Otherwise they would go on holding their standbys back for
    /// it (it owned fewest) until its heartbeats expire, three pin TTLs, and a partition handed
    /// off to it that it did not take would be pulled by nobody meanwhile.
    pub(crate) fn gone(node: &str, incarnation: &str) -> Self {
        Self {
            node: node.to_owned(),
            owned: 0,
            leaving: true,
            incarnation: Some(incarnation.to_owned()),
            every_ms: None,
        }
    }

    /// Publishes it on `<t>.nodes` (core NATS, best effort: the next one follows a pin TTL
    /// later).
    pub(crate) async fn publish(&self, client: &async_nats::Client, names: &crate::wire::Names) {
        if let Ok(body) = serde_json::to_vec(self) {
            let _ = client
                .publish(names.membership_subject(), body.into())
                .await;
        }
    }
}

/// The other processes heard recently.
pub(crate) struct Membership {
    me: String,
    /// Each peer: what it owns, when it was heard last, and first.
    peers: HashMap<String, Peer>,
    expiry: Duration,
    /// How long a newcomer is heard before partitions are handed off to it: every process
    /// hears it, and holds its standbys back, before the first hand-off.
    known_after: Duration,
}

struct Peer {
    owned: u32,
    last: Instant,
    first: Instant,
    /// Silent this long, it no longer counts: the membership's expiry, or three of the periods
    /// its heartbeat says, if longer.
    expiry: Duration,
    /// From its heartbeats, if it says it.
    incarnation: Option<String>,
}

impl Membership {
    /// `expiry`: a peer not heard for this long (or three of its own heartbeat periods, if
    /// longer) no longer counts; `known_after`: a newcomer is handed partitions once heard for
    /// this long (a balancing round).
    pub(crate) fn new(me: &str, expiry: Duration, known_after: Duration) -> Self {
        Self {
            me: me.to_owned(),
            peers: HashMap::new(),
            expiry,
            known_after,
        }
    }

    pub(crate) fn heard(&mut self, heartbeat: Heartbeat, at: Instant) {
        if heartbeat.node == self.me {
            return;
        }
        if heartbeat.leaving {
            // Said of one incarnation (found dead), it does not count out the node's next one.
            let same = |peer: &Peer| match (&peer.incarnation, &heartbeat.incarnation) {
                (Some(known), Some(said)) => known == said,
                _ => true,
            };
            if self.peers.get(&heartbeat.node).is_some_and(same) {
                self.peers.remove(&heartbeat.node);
            }
            return;
        }
        let peer = self.peers.entry(heartbeat.node).or_insert(Peer {
            owned: 0,
            last: at,
            first: at,
            expiry: self.expiry,
            incarnation: None,
        });
        peer.owned = heartbeat.owned;
        peer.last = at;
        peer.expiry = heartbeat.every_ms.map_or(self.expiry, |ms| {
            self.expiry.max(Duration::from_millis(ms) * 3)
        });
        if heartbeat.incarnation.is_some() {
            peer.incarnation = heartbeat.incarnation;
        }
    }

    /// The incarnations of the other processes heard recently (those that say theirs), each
    /// with its node: the crash watch probes them, owning or not.
    pub(crate) fn incarnations(&mut self, now: Instant) -> BTreeMap<String, String> {
        self.forget_silent(now);
        self.peers
            .iter()
            .filter_map(|(node, peer)| Some((peer.incarnation.clone()?, node.clone())))
            .collect()
    }

    /// The processes heard recently (not silent for the expiry, not leaving), this one with
    /// them: the members the crash watch ranks its watchers among.
    pub(crate) fn live(&mut self, now: Instant) -> std::collections::BTreeSet<String> {
        self.forget_silent(now);
        self.peers
            .keys()
            .cloned()
            .chain(std::iter::once(self.me.clone()))
            .collect()
    }

    fn forget_silent(&mut self, now: Instant) {
        self.peers
            .retain(|_, peer| now.duration_since(peer.last) < peer.expiry);
    }

    /// How many partitions this process, owning `owned` of `partitions`, should hand off now:
    /// its excess over the fair share, at most what the processes under their share lack
    /// (counting the processes heard for a round at least).
    pub(crate) fn shed_count(&mut self, owned: u32, partitions: u32, now: Instant) -> u32 {
        self.forget_silent(now);
        let known: Vec<u32> = self
            .peers
            .values()
            .filter(|peer| now.duration_since(peer.first) >= self.known_after)
            .map(|peer| peer.owned)
            .collect();
        let processes = known.len() as u32 + 1;
        let fair = partitions.div_ceil(processes);
        let lacking: u32 = known
            .iter()
            .map(|theirs| fair.saturating_sub(*theirs))
            .sum();
        owned.saturating_sub(fair).min(lacking)
    }

    /// Whether this process, owning `owned` of `partitions`, pulls every partition, not only
    /// those it stands by for: while it owns less than its fair share and another process more
    /// (a hand-off is coming: it lands on a process under its share, whoever the partition's
    /// standbys are), and while another owns two more (that one holds back its standbys: see
    /// [`holds_back`](Self::holds_back); so a partition whose standbys all hold back is still
    /// pulled, by the process that owns fewest).
    pub(crate) fn pulls_every_partition(
        &mut self,
        owned: u32,
        partitions: u32,
        now: Instant,
    ) -> bool {
        self.forget_silent(now);
        let fair = partitions.div_ceil(self.peers.len() as u32 + 1);
        let most = self
            .peers
            .values()
            .map(|peer| peer.owned)
            .max()
            .unwrap_or(0);
        owned.saturating_add(2) <= most || (owned < fair && most > fair)
    }

    /// Whether this process, owning `owned`, holds back its standbys: while a process heard
    /// recently owns at least two fewer partitions, the partitions that move (handed off, or
    /// released by a process that stops) are left to the processes that own fewest. Otherwise
    /// any standby may be pinned, and a partition handed off by one process over its share
    /// often lands on another, which hands it off again (three moves where one would do).
    /// The process that owns fewest never holds back, so every partition keeps a standby; one
    /// that falls silent stops counting after the expiry (three heartbeat periods).
    pub(crate) fn holds_back(&mut self, owned: u32, now: Instant) -> bool {
        self.forget_silent(now);
        self.peers
            .values()
            .any(|peer| peer.owned.saturating_add(2) <= owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(node: &str, owned: u32) -> Heartbeat {
        Heartbeat {
            node: node.into(),
            owned,
            leaving: false,
            incarnation: None,
            every_ms: None,
        }
    }

    #[test]
    fn past_a_few_dozen_processes_each_says_its_heartbeat_less_often() {
        let ttl = Duration::from_secs(2);
        assert_eq!(heartbeat_period(1, ttl), ttl);
        assert_eq!(heartbeat_period(HEARD_PER_TTL as usize, ttl), ttl);
        assert_eq!(heartbeat_period(HEARD_PER_TTL as usize + 1, ttl), ttl * 2);
        // What one process hears per pin TTL stays about HEARD_PER_TTL at any size.
        for n in [64usize, 1_000, 10_000] {
            let periods = heartbeat_period(n, ttl).as_secs_f64() / ttl.as_secs_f64();
            let heard = n as f64 / periods;
            assert!(
                heard <= f64::from(HEARD_PER_TTL) && heard > f64::from(HEARD_PER_TTL) / 2.0,
                "{n} processes: {heard} heard per pin TTL"
            );
        }
    }

    #[test]
    fn a_peer_that_says_a_longer_period_is_counted_for_three_of_them() {
        let now = Instant::now();
        let mut m = Membership::new("a", Duration::from_secs(6), Duration::ZERO);
        m.heard(beat("b", 1), now);
        m.heard(
            Heartbeat {
                every_ms: Some(10_000),
                ..beat("c", 1)
            },
            now,
        );
        let later = now + Duration::from_secs(7);
        assert_eq!(
            m.live(later).into_iter().collect::<Vec<_>>(),
            ["a", "c"],
            "b is silent past the expiry; c said it speaks every 10 s"
        );
        assert_eq!(
            m.live(now + Duration::from_secs(31)).len(),
            1,
            "c silent for three of its periods"
        );
    }

    #[test]
    fn a_process_that_says_it_leaves_is_counted_out_at_once() {
        let now = Instant::now();
        // b's view: a, c and b share 8 partitions (3, 3, 2); c stops, a takes its three.
        let mut counted = Membership::new("b", Duration::from_secs(6), Duration::ZERO);
        let mut told = Membership::new("b", Duration::from_secs(6), Duration::ZERO);
        for m in [&mut counted, &mut told] {
            m.heard(beat("a", 3), now);
            m.heard(beat("c", 3), now);
            assert_eq!(m.shed_count(3, 8, now), 0);
        }
        told.heard(
            Heartbeat {
                leaving: true,
                ..beat("c", 0)
            },
            now,
        );
        // A newcomer d, heard before c's last heartbeat expired.
        for m in [&mut counted, &mut told] {
            m.heard(beat("a", 5), now);
            m.heard(beat("d", 0), now);
        }
        assert_eq!(told.shed_count(3, 8, now), 0, "b is at its share of 3");
        // Counted, c makes four processes and a share of 2: b would hand one off, to a standby
        // of a as likely as to d's.
        assert_eq!(counted.shed_count(3, 8, now), 1);
    }

    #[test]
    fn a_process_found_dead_is_counted_out_at_once_but_not_its_next_incarnation() {
        let now = Instant::now();
        let mut m = Membership::new("a", Duration::from_secs(6), Duration::ZERO);
        let said = |node: &str, owned, incarnation: &str| Heartbeat {
            every_ms: None,
            incarnation: Some(incarnation.into()),
            ..beat(node, owned)
        };
        m.heard(beat("b", 4), now);
        m.heard(said("c", 0, "c-1"), now);
        assert!(m.holds_back(4, now), "c owns fewest");
        assert_eq!(
            m.incarnations(now),
            BTreeMap::from([("c-1".to_owned(), "c".to_owned())]),
            "b says no incarnation: not probed as a member"
        );
        // c restarted as c-2 before the verdict on c-1 was said: c-2 stays.
        m.heard(said("c", 0, "c-2"), now);
        m.heard(Heartbeat::gone("c", "c-1"), now);
        assert!(m.holds_back(4, now));
        m.heard(Heartbeat::gone("c", "c-2"), now);
        assert!(
            !m.holds_back(4, now),
            "c-2 found dead: nobody to hold back for"
        );
        assert!(m.incarnations(now).is_empty());
    }

    #[test]
    fn standbys_hold_back_while_another_process_owns_two_fewer() {
        let now = Instant::now();
        let mut m = Membership::new("a", Duration::from_secs(6), Duration::ZERO);
        assert!(!m.holds_back(8, now), "alone, it takes everything");
        // A newcomer: a and b (4 each) hold back, d takes what they hand off.
        m.heard(beat("b", 4), now);
        m.heard(beat("d", 0), now);
        assert!(m.holds_back(4, now));
        // 3-3-2 is as even as 8 over 3 gets: every standby pulls, so that any process can take
        // over from one that dies.
        m.heard(beat("b", 3), now);
        m.heard(beat("d", 2), now);
        assert!(!m.holds_back(3, now));
        assert!(!m.holds_back(2, now), "the fewest never holds back");
        // d fell silent (it died): nobody holds back for it after the expiry.
        m.heard(beat("b", 4), now);
        m.heard(beat("d", 0), now);
        assert!(m.holds_back(4, now));
        assert!(!m.holds_back(4, now + Duration::from_secs(7)));
    }

    #[test]
    fn a_newcomer_is_handed_partitions_once_heard_for_a_round() {
        let start = Instant::now();
        let round = Duration::from_secs(2);
        let mut m = Membership::new("a", Duration::from_secs(6), round);
        m.heard(beat("b", 4), start - round);
        m.heard(beat("c", 0), start);
        // Meanwhile b hears c too, and holds its standbys back.
        assert_eq!(m.shed_count(4, 8, start), 0);
        m.heard(beat("c", 0), start + round);
        assert_eq!(m.shed_count(4, 8, start + round), 1);
    }

    #[test]
    fn a_heartbeat_says_leaving_only_when_it_is() {
        let text = serde_json::to_string(&beat("a", 2)).unwrap_or_default();
        assert_eq!(text, r#"{"node":"a","owned":2}"#, "the wire as before");
        let gone = serde_json::to_string(&Heartbeat::gone("a", "i1")).unwrap_or_default();
        assert_eq!(
            gone,
            r#"{"node":"a","owned":0,"leaving":true,"incarnation":"i1"}"#
        );
        let leaving: Heartbeat = serde_json::from_str(r#"{"node":"a","owned":0,"leaving":true}"#)
            .unwrap_or(beat("x", 9));
        assert!(leaving.leaving);
        assert_eq!(leaving.incarnation, None);
    }

    #[test]
    fn a_process_over_its_share_sheds_only_when_another_is_under_it() {
        let now = Instant::now();
        let mut m = Membership::new("a", Duration::from_secs(3), Duration::ZERO);
        assert_eq!(m.shed_count(8, 8, now), 0, "alone, it keeps everything");
        m.heard(beat("b", 0), now);
        assert_eq!(m.shed_count(8, 8, now), 4);
        assert_eq!(m.shed_count(4, 8, now), 0, "at its share");
        m.heard(beat("b", 4), now);
        assert_eq!(m.shed_count(4, 8, now), 0);
        // 8 over 3: shares of 3; 3-3-2 is balanced.
        m.heard(beat("c", 2), now);
        assert_eq!(m.shed_count(3, 8, now), 0);
        m.heard(beat("b", 5), now);
        m.heard(beat("c", 0), now);
        assert_eq!(m.shed_count(3, 8, now), 0, "b, not a, is over");
        // a holds 6 of 8, b 2, c 0: c lacks 3, b lacks 1, a is 3 over.
        m.heard(beat("b", 2), now);
        assert_eq!(m.shed_count(6, 8, now), 3);
    }

    #[test]
    fn its_own_heartbeat_and_silent_peers_do_not_count() {
        let now = Instant::now();
        let mut m = Membership::new("a", Duration::from_secs(3), Duration::ZERO);
        m.heard(beat("a", 0), now);
        assert_eq!(m.shed_count(8, 8, now), 0);
        m.heard(beat("b", 0), now);
        assert_eq!(
            m.shed_count(8, 8, now + Duration::from_secs(4)),
            0,
            "b fell silent"
        );
    }

    #[test]
    fn each_partition_has_its_standbys_and_they_spread_evenly() {
        let members: BTreeSet<String> = (0..16).map(|i| format!("node-{i}")).collect();
        let partitions = 256;
        let by: Vec<Vec<bool>> = members
            .iter()
            .map(|me| standing_by(me, &members, partitions, 2))
            .collect();
        for p in 0..partitions as usize {
            assert_eq!(by.iter().filter(|b| b[p]).count(), 3, "partition {p}");
        }
        // 256 x 3 over 16: 48 each on average.
        for b in &by {
            let n = b.iter().filter(|x| **x).count();
            assert!((24..=80).contains(&n), "a process stands by for {n}");
        }
        // A fleet of two: both stand by for everything.
        let two: BTreeSet<String> = ["a".to_owned(), "b".to_owned()].into();
        assert!(standing_by("a", &two, 8, 2).iter().all(|b| *b));
    }

    #[test]
    fn processes_under_their_share_pull_everything_only_while_another_is_over() {
        let now = Instant::now();
        let mut m = Membership::new("a", Duration::from_secs(6), Duration::ZERO);
        m.heard(beat("b", 3), now);
        m.heard(beat("c", 3), now);
        assert!(!m.pulls_every_partition(2, 8, now), "3-3-2 is even");
        m.heard(beat("b", 6), now);
        m.heard(beat("c", 2), now);
        assert!(m.pulls_every_partition(0, 8, now), "b hands off");
        assert!(
            m.pulls_every_partition(3, 8, now),
            "b, two over a, holds back"
        );
        m.heard(beat("b", 4), now);
        assert!(
            !m.pulls_every_partition(3, 9, now),
            "a at its share, b one over"
        );
        // 3-3-1 with a partition nobody owns: b and c hold back; a, fewest, pulls it.
        m.heard(beat("b", 3), now);
        m.heard(beat("c", 3), now);
        assert!(!m.holds_back(1, now), "the fewest never holds back");
        assert!(m.pulls_every_partition(1, 8, now));
    }
}
