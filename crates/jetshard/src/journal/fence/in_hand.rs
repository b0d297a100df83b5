//! What a claim counts of the commands in hand: each range of them with the claims in a row
//! that found it after the previous owner died (`hold`), and whether the claimant runs them in
//! isolation (`trial`), so that a command that kills every owner that runs it is found.

use crate::journal::fence::record::{HeldRange, Trial};

/// What a claimant knows of the commands in hand before it claims.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct InHand {
    /// Those delivered to earlier owners: counted (inclusive range; `None`: none).
    pub(crate) counted: Option<(u64, u64)>,
    /// The first of them that is a command of this partition.
    pub(crate) head: Option<u64>,
    /// Isolate once a command has been in hand at this many claims in a row.
    pub(crate) isolate_at: u32,
}

/// The trial of a claim: whether it isolates, and how often its head was first in hand at an
/// isolated owner's death (`died`: whether the previous owner's process is gone).
pub(crate) fn trial(
    previous: Option<Trial>,
    held: &[HeldRange],
    in_hand: &InHand,
    died: bool,
) -> Option<Trial> {
    let head = in_hand.head?;
    if !may_isolate(held, in_hand.isolate_at) || claims_holding(held, head) == 0 {
        return None;
    }
    let more = u32::from(died);
    let runs = match previous {
        // The previous owner ran one command at a time: it died with `head` first in hand.
        Some(t) if t.seq == head => t.runs.saturating_add(more),
        Some(_) => more,
        // Commands ran side by side: nothing tells which one was running.
        None => 0,
    };
    Some(Trial { seq: head, runs })
}

/// Whether a claim counting `held` may run its commands in isolation: only then does its trial
/// name the first command in hand (`InHand::head`), so only then must the claim know it.
pub(crate) fn may_isolate(held: &[HeldRange], isolate_at: u32) -> bool {
    held.iter().any(|r| r.claims >= isolate_at.max(1))
}

/// The most ranges a fence record keeps (the longest runs of claims win).
const MAX_HELD_RANGES: usize = 64;

/// The ranges of a new claim: the commands in hand now, `window` (inclusive; `None` if nothing
/// is in hand), each counted once more than the previous claim counted it if the previous owner
/// `died` (its process is gone), as often as before if it is alive (it lost the pin; whatever
/// it held did not kill it). Commands counted 0 times are not kept.
pub(crate) fn hold(
    previous: &[HeldRange],
    window: Option<(u64, u64)>,
    died: bool,
) -> Vec<HeldRange> {
    let Some((first, last)) = window.filter(|(first, last)| first <= last) else {
        return Vec::new();
    };
    let more = u32::from(died);
    let mut ranges = Vec::new();
    let mut next = first;
    let mut earlier: Vec<&HeldRange> = previous
        .iter()
        .filter(|r| r.first <= last && r.last >= first)
        .collect();
    earlier.sort_by_key(|r| r.first);
    for range in earlier {
        let (from, to) = (range.first.max(next), range.last.min(last));
        if from > to {
            continue;
        }
        if from > next {
            ranges.push(HeldRange {
                first: next,
                last: from - 1,
                claims: more,
            });
        }
        ranges.push(HeldRange {
            first: from,
            last: to,
            claims: range.claims.saturating_add(more),
        });
        next = to + 1;
    }
    if next <= last {
        ranges.push(HeldRange {
            first: next,
            last,
            claims: more,
        });
    }
    ranges.retain(|r| r.claims > 0);
    if ranges.len() > MAX_HELD_RANGES {
        let mut by_claims = ranges.clone();
        by_claims.sort_by_key(|r| std::cmp::Reverse(r.claims));
        let keep = by_claims[MAX_HELD_RANGES - 1].claims;
        ranges.retain(|r| r.claims >= keep);
        ranges.truncate(MAX_HELD_RANGES);
    }
    ranges
}

/// How many claims in a row found command `seq` in hand (0: none).
pub(crate) fn claims_holding(held: &[HeldRange], seq: u64) -> u32 {
    held.iter()
        .find(|r| r.first <= seq && seq <= r.last)
        .map_or(0, |r| r.claims)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(first: u64, last: u64, claims: u32) -> HeldRange {
        HeldRange {
            first,
            last,
            claims,
        }
    }

    #[test]
    fn a_claim_counts_the_commands_in_hand_once_more_than_the_claim_before() {
        assert_eq!(hold(&[], None, true), vec![]);
        assert_eq!(hold(&[], Some((5, 4)), true), vec![]);
        let first = hold(&[], Some((10, 20)), true);
        assert_eq!(first, vec![range(10, 20, 1)]);
        // The floor moved past 14; 21..=25 came in since.
        let second = hold(&first, Some((15, 25)), true);
        assert_eq!(second, vec![range(15, 20, 2), range(21, 25, 1)]);
        let third = hold(&second, Some((15, 25)), true);
        assert_eq!(third, vec![range(15, 20, 3), range(21, 25, 2)]);
        assert_eq!(claims_holding(&third, 17), 3);
        assert_eq!(claims_holding(&third, 25), 2);
        assert_eq!(claims_holding(&third, 26), 0);
        // The previous owner lost its pin alive: nothing it held killed it; counts carry over.
        assert_eq!(
            hold(&third, Some((15, 40)), false),
            vec![range(15, 20, 3), range(21, 25, 2)]
        );
        // Progress past everything: nothing carried over.
        assert_eq!(hold(&third, Some((30, 31)), true), vec![range(30, 31, 1)]);
        // A window inside an old range, and one spanning gaps between old ranges.
        assert_eq!(
            hold(&[range(1, 100, 4)], Some((50, 60)), true),
            vec![range(50, 60, 5)]
        );
        assert_eq!(
            hold(&[range(5, 6, 2), range(9, 9, 3)], Some((4, 10)), true),
            vec![
                range(4, 4, 1),
                range(5, 6, 3),
                range(7, 8, 1),
                range(9, 9, 4),
                range(10, 10, 1)
            ]
        );
    }

    #[test]
    fn a_claim_isolates_once_a_command_was_in_hand_twice_and_counts_the_heads_of_isolated_owners() {
        let in_hand = |head| InHand {
            counted: Some((10, 20)),
            head: Some(head),
            isolate_at: 2,
        };
        // In hand once: no suspicion.
        assert_eq!(trial(None, &[range(10, 20, 1)], &in_hand(10), true), None);
        // Twice: isolate; nothing known yet of who was running.
        let first = trial(None, &[range(10, 20, 2)], &in_hand(10), true);
        assert_eq!(first, Some(Trial { seq: 10, runs: 0 }));
        // The isolated owner died with 12 first in hand (10 and 11 were done), then again.
        let second = trial(first, &[range(12, 20, 3)], &in_hand(12), true);
        assert_eq!(second, Some(Trial { seq: 12, runs: 1 }));
        assert_eq!(
            trial(second, &[range(12, 20, 4)], &in_hand(12), true),
            Some(Trial { seq: 12, runs: 2 })
        );
        // Nothing in hand from earlier owners: no trial.
        let none = InHand {
            counted: None,
            head: None,
            isolate_at: 2,
        };
        assert_eq!(trial(second, &[], &none, true), None);
        // An isolated owner that lost its pin alive: its head did not kill it.
        assert_eq!(
            trial(second, &[range(12, 20, 4)], &in_hand(12), false),
            Some(Trial { seq: 12, runs: 1 })
        );
    }

    /// What lets a claim skip waiting for the window (`Claimant::head`): whatever the head,
    /// a claim that `may_isolate` says cannot isolate has no trial; one that can, with the
    /// head in a range held often enough, has.
    #[test]
    fn a_claim_that_cannot_isolate_has_no_trial_whatever_its_head() {
        let held_sets = [
            vec![],
            vec![range(10, 20, 1)],
            vec![range(10, 12, 1), range(13, 20, 2)],
            vec![range(10, 20, 3)],
        ];
        let previous = [None, Some(Trial { seq: 12, runs: 1 })];
        for isolate_at in [0, 1, 2, 3] {
            for held in &held_sets {
                let may = may_isolate(held, isolate_at);
                for head in [None, Some(5), Some(10), Some(13), Some(20)] {
                    let in_hand = InHand {
                        counted: Some((10, 20)),
                        head,
                        isolate_at,
                    };
                    for prev in previous {
                        for died in [false, true] {
                            let trial = trial(prev, held, &in_hand, died);
                            assert!(may || trial.is_none(), "{held:?} {isolate_at} {head:?}");
                        }
                    }
                }
                // The head named by a held range at the threshold: a trial.
                let suspect = held.iter().find(|r| r.claims >= isolate_at.max(1));
                assert_eq!(may, suspect.is_some(), "{held:?} {isolate_at}");
                if let Some(r) = suspect {
                    let in_hand = InHand {
                        counted: Some((10, 20)),
                        head: Some(r.first),
                        isolate_at,
                    };
                    assert!(trial(None, held, &in_hand, true).is_some());
                }
            }
        }
    }

    #[test]
    fn a_record_keeps_a_bounded_number_of_ranges_the_longest_held_first() {
        let many: Vec<HeldRange> = (0..200)
            .map(|i| range(i * 2, i * 2, 1 + (i % 3) as u32))
            .collect();
        let next = hold(&many, Some((0, 400)), true);
        assert!(next.len() <= MAX_HELD_RANGES);
        assert!(next.iter().all(|r| r.claims >= 3), "{next:?}");
    }
}
