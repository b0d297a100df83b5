//! An entity's state rebuilt from the journal: its seed (state, last command, last outcome)
//! and the replay of records onto it.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::outcome_header::LastOutcome;
use super::protocol::{Quarantine, panic_message};
use crate::codec::Codec;
use crate::data::origin::{Origin, Origins};
use crate::data::timers::Armed;
use crate::entity::{Entity, decode_event};
use crate::journal::chain::Lineage;
use crate::journal::{self, Record, TimerRecord};

/// An entity's state and what its last command came to.
pub(crate) struct Seed<E: Entity> {
    pub(crate) state: E::State,
    pub(crate) last_command_seq: u64,
    /// The outcome of the command at `last_command_seq`, told again to a redelivery of it.
    pub(crate) last_outcome: Option<LastOutcome>,
    /// The journal sequence of the entity's last record known to be in `state` (0: unknown):
    /// a snapshot of `state` covers the records up to it.
    pub(crate) journal_seq: u64,
    /// Events in `state` since its last snapshot (or since it was loaded without one).
    pub(crate) unsnapshotted: u32,
    /// A journal sequence every record of the entity (snapshots aside) is at or below, when
    /// known for sure: the end of what its load read, then each write's sequence (its actor is
    /// the entity's only writer), with where its commands before it ended. `None` after a
    /// write whose sequence was not told (the server had it already). What its next record
    /// says it follows (`Jetshard-Previous`, `Jetshard-Earlier`, [`Self::previous`]).
    pub(crate) tail: Option<Lineage>,
    /// Its armed timers, by name (`timer.rs`).
    pub(crate) timers: BTreeMap<Box<str>, Armed>,
    /// The origins of the outbox messages it applied, the latest (`data/origin.rs`).
    pub(crate) origins: Origins,
}

impl<E: Entity> Default for Seed<E> {
    fn default() -> Self {
        Self {
            state: E::State::default(),
            last_command_seq: 0,
            last_outcome: None,
            journal_seq: 0,
            unsnapshotted: 0,
            tail: None,
            timers: BTreeMap::new(),
            origins: Origins::default(),
        }
    }
}

impl<E: Entity> Seed<E> {
    /// What the entity's next record says of the records before it (`Jetshard-Previous`, or
    /// `Jetshard-Unit`): its [`tail`](Self::tail), so that a load follows its records back
    /// one by one instead of reading through the journal between them (`journal/chain/`).
    pub(crate) fn previous(&self) -> Option<&Lineage> {
        self.tail.as_ref()
    }

    /// A write of the entity's records is durable at `stored` (the sequence of its last; 0 if
    /// the server had them already: not known; `None`: nothing was written).
    pub(crate) fn wrote(&mut self, stored: Option<u64>) {
        match (stored, &mut self.tail) {
            (None, _) => {}
            (Some(0), _) => self.tail = None,
            (Some(seq), Some(tail)) => tail.followed_by(seq),
            (Some(seq), None) => self.tail = Some(Lineage::at(seq)),
        }
    }
}

impl<E: Entity> Seed<E> {
    /// Takes one record read back from the journal into the state. A record of a command
    /// before the last one seen changes nothing but the outcome memory.
    ///
    /// # Errors
    /// The quarantine of the entity if the record is an event that cannot be read or applied.
    pub(crate) fn replay(
        &mut self,
        entity: &str,
        stored: &journal::StoredEvent<'_>,
        codec: Codec,
    ) -> Result<(), Quarantine> {
        match &stored.record {
            Record::Timer(timer) => match timer {
                TimerRecord::Set {
                    name,
                    due_ms,
                    payload,
                } => {
                    let armed = Armed {
                        set_seq: stored.command_seq,
                        due_ms: *due_ms,
                        payload: (*payload).clone(),
                    };
                    self.timers.insert((*name).into(), armed);
                }
                TimerRecord::Cancel { name } => {
                    self.timers.remove(*name);
                }
                TimerRecord::Fired { name, set_seq } => {
                    if self
                        .timers
                        .get(*name)
                        .is_some_and(|a| a.set_seq == *set_seq)
                    {
                        self.timers.remove(*name);
                    }
                }
            },
            Record::DeadLetter { reason } => {
                if stored.command_seq >= self.last_command_seq {
                    self.last_outcome = Some(LastOutcome::DeadLettered((*reason).into()));
                }
            }
            Record::Event {
                version,
                payload,
                origin,
            } => {
                let quarantine = |reason: String| Quarantine {
                    journal_seq: stored.seq,
                    reason,
                    last_command_seq: self.last_command_seq.max(stored.command_seq),
                };
                let event: E::Event = match decode_event::<E>(*version, payload, codec) {
                    Ok(event) => event,
                    Err(e) => {
                        return Err(quarantine(format!(
                            "event of {entity} at journal seq {} (version {version}) does not decode: {e}",
                            stored.seq
                        )));
                    }
                };
                if let Err(panic) =
                    catch_unwind(AssertUnwindSafe(|| E::apply(&mut self.state, &event)))
                {
                    return Err(quarantine(format!(
                        "apply panicked on the event of {entity} at journal seq {}: {}",
                        stored.seq,
                        panic_message(&*panic)
                    )));
                }
                let events = match &self.last_outcome {
                    Some(LastOutcome::Applied { events })
                        if stored.command_seq == self.last_command_seq =>
                    {
                        events + 1
                    }
                    _ => 1,
                };
                self.last_outcome = Some(LastOutcome::Applied { events });
                self.unsnapshotted = self.unsnapshotted.saturating_add(1);
                if let Some(origin) = origin.and_then(Origin::parse) {
                    self.origins.remember(origin);
                }
            }
        }
        self.last_command_seq = self.last_command_seq.max(stored.command_seq);
        self.journal_seq = self.journal_seq.max(stored.seq);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_entity::Counter;

    #[test]
    fn a_write_answered_as_a_duplicate_leaves_the_tail_unknown_until_a_known_sequence() {
        let mut seed = Seed::<Counter> {
            tail: Some(Lineage::at(5)),
            ..Seed::default()
        };
        let last = |seed: &Seed<Counter>| seed.previous().map(Lineage::last);
        assert_eq!(last(&seed), Some(5));
        // Nothing written (a rejection): the tail stands.
        seed.wrote(None);
        assert_eq!(last(&seed), Some(5));
        // Stored before, at a sequence not told: nothing is named.
        seed.wrote(Some(0));
        assert_eq!((seed.tail.clone(), last(&seed)), (None, None));
        seed.wrote(None);
        assert_eq!(last(&seed), None);
        // A write stored at a known sequence: every record of the entity is at or below it,
        // nothing known of the ones before.
        seed.wrote(Some(9));
        assert_eq!(seed.previous(), Some(&Lineage::at(9)));
        // The next ones name where the commands before them ended, newest first.
        seed.wrote(Some(14));
        seed.wrote(Some(20));
        let tail = seed.previous().expect("known");
        assert_eq!((tail.last(), tail.earlier()), (20, &[14, 9][..]));
    }
}
