//! What this process knows of other processes' deaths: the probe, the diagnoses, and the
//! claim's question "is the previous owner gone?" (see the [crash watch](super)).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::wire::Names;

/// Two "no responders" this far apart (with no answer between them) declare a process dead.
/// A subscription that is being set up or moved between servers of a cluster is missing for
/// less than that; a closed connection stays closed.
pub(super) const CONFIRM_GAP: Duration = Duration::from_millis(20);

/// How long a claim's probe waits for an answer before it counts for nothing. Only "no
/// responders" changes a claim's diagnosis (an answer and a timeout both mean "not known dead"),
/// and the server gives it within a millisecond or two: a longer wait would only delay the
/// takeover from a stalled owner, whose probe is never answered.
const CLAIM_PROBE_TIMEOUT: Duration = Duration::from_millis(50);

/// The most dead incarnations remembered (the oldest are forgotten first).
const REMEMBERED_DEATHS: usize = 1024;

/// What one ask on `<t>.alive.<incarnation>` got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ProbeResult {
    /// The process answered.
    Alive,
    /// The server knows no subscriber: the connection is gone (for now, or for good).
    NoResponders,
    /// No answer in time, or another error: tells nothing.
    Silent,
}

/// Asks the process of `incarnation` once whether it is there, waiting `timeout` at most.
pub(super) async fn ask(
    client: &async_nats::Client,
    names: &Names,
    incarnation: &str,
    timeout: Duration,
) -> ProbeResult {
    let request = client.request(names.alive_subject(incarnation), Default::default());
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(_)) => ProbeResult::Alive,
        Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
            ProbeResult::NoResponders
        }
        _ => ProbeResult::Silent,
    }
}

/// What this process knows of other processes' deaths, shared by its watch and its claims
/// (a claim whose previous owner is known dead does not probe it again).
#[derive(Default)]
pub(crate) struct Deaths {
    inner: Mutex<DeathLog>,
    /// Bumped at every death recorded, to wake claims waiting on a diagnosis.
    changed: watch::Sender<u64>,
}

/// The deaths heard of: the incarnations suspected (since when), those declared dead, and the
/// order they were declared in (the oldest are forgotten first).
#[derive(Default)]
struct DeathLog {
    /// When the first "no responders" of a run was seen, per incarnation.
    suspected: HashMap<String, Instant>,
    dead: HashSet<String>,
    order: VecDeque<String>,
}

/// A diagnosis of an incarnation after a probe's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Diagnosis {
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
    fn known(&self) -> std::sync::MutexGuard<'_, DeathLog> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `incarnation` was declared dead.
    pub(super) fn is_dead(&self, incarnation: &str) -> bool {
        self.known().dead.contains(incarnation)
    }

    /// Takes an answer of `incarnation` at `now` into account.
    pub(super) fn heard(&self, incarnation: &str, answer: ProbeResult, now: Instant) -> Diagnosis {
        let mut known = self.known();
        match answer {
            ProbeResult::Alive => {
                known.suspected.remove(incarnation);
                if known.dead.remove(incarnation) {
                    known.order.retain(|i| i != incarnation);
                }
                Diagnosis::Alive
            }
            ProbeResult::Silent => Diagnosis::Unknown,
            ProbeResult::NoResponders => {
                if known.dead.contains(incarnation) {
                    return Diagnosis::Dead;
                }
                let since = *known.suspected.entry(incarnation.to_owned()).or_insert(now);
                if now.duration_since(since) < CONFIRM_GAP {
                    return Diagnosis::Suspect;
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
                Diagnosis::Died
            }
        }
    }

    /// `incarnation` wrote a new fence record: it is alive, whatever was concluded before.
    pub(super) fn revived(&self, incarnation: &str) {
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
            Diagnosis::Died | Diagnosis::Dead => return true,
            Diagnosis::Alive | Diagnosis::Unknown => return false,
            Diagnosis::Suspect => {
                let since = deaths
                    .suspected_since(incarnation)
                    .unwrap_or_else(Instant::now);
                deaths.wait_dead(incarnation, since + CONFIRM_GAP).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_no_responders_a_gap_apart_declare_death_and_an_answer_or_a_claim_undoes_it() {
        let deaths = Deaths::default();
        let t0 = Instant::now();
        assert_eq!(
            deaths.heard("a", ProbeResult::NoResponders, t0),
            Diagnosis::Suspect
        );
        // Too soon after the first: still a suspect.
        let soon = t0 + CONFIRM_GAP / 2;
        assert_eq!(
            deaths.heard("a", ProbeResult::NoResponders, soon),
            Diagnosis::Suspect
        );
        assert!(!deaths.is_dead("a"));
        let later = t0 + CONFIRM_GAP;
        assert_eq!(
            deaths.heard("a", ProbeResult::NoResponders, later),
            Diagnosis::Died
        );
        assert!(deaths.is_dead("a"));
        // Once: later answers of the dead do not declare it again.
        assert_eq!(
            deaths.heard("a", ProbeResult::NoResponders, later),
            Diagnosis::Dead
        );
        // It answered after all (its connection came back): alive, and the count restarts.
        assert_eq!(
            deaths.heard("a", ProbeResult::Alive, later),
            Diagnosis::Alive
        );
        assert!(!deaths.is_dead("a"));
        assert_eq!(
            deaths.heard("a", ProbeResult::NoResponders, later + CONFIRM_GAP * 2),
            Diagnosis::Suspect
        );
        // A new claim of it is a sign of life too.
        deaths.heard("a", ProbeResult::NoResponders, later + CONFIRM_GAP * 4);
        deaths.revived("a");
        assert_eq!(
            deaths.heard("a", ProbeResult::NoResponders, later + CONFIRM_GAP * 5),
            Diagnosis::Suspect
        );
    }

    #[test]
    fn a_probe_that_times_out_counts_for_nothing() {
        let deaths = Deaths::default();
        let t0 = Instant::now();
        for k in 0..10 {
            assert_eq!(
                deaths.heard("slow", ProbeResult::Silent, t0 + CONFIRM_GAP * k),
                Diagnosis::Unknown
            );
        }
        assert!(!deaths.is_dead("slow"));
        assert_eq!(
            deaths.heard("b", ProbeResult::NoResponders, t0),
            Diagnosis::Suspect
        );
        assert_eq!(
            deaths.heard("b", ProbeResult::Silent, t0 + CONFIRM_GAP),
            Diagnosis::Unknown
        );
        assert!(!deaths.is_dead("b"));
    }
}
