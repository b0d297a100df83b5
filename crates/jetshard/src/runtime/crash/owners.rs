//! Who owns which partition (from the fence records seen) and who watches whom (rendezvous
//! hashing over the membership): the pure part of the [crash watch](super).

use std::collections::{BTreeSet, HashMap, HashSet};

#[derive(Debug, Default)]
pub(super) struct Owners {
    me: String,
    /// Per partition: the newest generation seen and the incarnations that claimed it (two
    /// claims of one generation are both seen on the subscription; one of them lost).
    latest: HashMap<u32, (u64, Vec<String>)>,
    /// The node name of each incarnation seen in a fence record (watches are chosen by node).
    nodes: HashMap<String, String>,
}

impl Owners {
    pub(super) fn new(me: &str) -> Self {
        Self {
            me: me.to_owned(),
            latest: HashMap::new(),
            nodes: HashMap::new(),
        }
    }

    /// `incarnation` runs on the node named `node` (from its fence record).
    pub(super) fn named(&mut self, incarnation: &str, node: &str) {
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
    pub(super) fn node_of(&self, incarnation: &str) -> Option<&str> {
        self.nodes.get(incarnation).map(String::as_str)
    }

    /// A fence record of `partition` was seen: `confirmed` when read from the stream (it is the
    /// latest), not when heard on the subscription (it may have lost its race).
    pub(super) fn seen(
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
    pub(super) fn watched(&self) -> BTreeSet<String> {
        self.latest
            .values()
            .flat_map(|(_, incarnations)| incarnations.iter())
            .filter(|i| **i != self.me)
            .cloned()
            .collect()
    }

    /// The partitions whose newest records name `incarnation`.
    pub(super) fn partitions_of(&self, incarnation: &str) -> Vec<u32> {
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
#[cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
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
pub(super) fn watches(me: &str, watched: &str, members: &BTreeSet<String>, k: usize) -> bool {
    if me == watched {
        return false;
    }
    let ranked = members
        .iter()
        .map(String::as_str)
        .chain(std::iter::once(me));
    crash_watchers(watched, ranked, k).contains(&me)
}

#[cfg(test)]
mod tests {
    use super::*;

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
