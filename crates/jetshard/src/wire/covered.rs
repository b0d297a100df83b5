//! What an entity's snapshot covers, as subjects of the journal: what compaction may purge
//! behind it.

use crate::wire::names::Names;

impl Names {
    /// The subjects a snapshot on `snapshot_subject` (`<t>.snap.<p>.<id>`) covers; `None` if
    /// it is not a snapshot subject of this type.
    pub(crate) fn covered_by_snapshot(&self, snapshot_subject: &str) -> Option<Covered> {
        let t = &self.entity_type;
        let rest = snapshot_subject.strip_prefix(&format!("{t}.snap."))?;
        Some(Covered {
            records: format!("{t}.*.{rest}"),
            each: [
                format!("{t}.evt.{rest}"),
                format!("{t}.tmr.{rest}"),
                snapshot_subject.to_owned(),
            ],
            dead_letters: format!("{t}.dlq.{rest}"),
        })
    }
}

/// What an entity's snapshot covers, as subjects of the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Covered {
    /// Every record of the entity (`<t>.*.<p>.<id>`): its events, timer records, snapshots
    /// and dead letters (the journal's only four-token subjects).
    pub(crate) records: String,
    /// The same without its dead letters, one subject each: its events (`<t>.evt.<p>.<id>`),
    /// timer records (`<t>.tmr.<p>.<id>`) and snapshots (`<t>.snap.<p>.<id>`).
    pub(crate) each: [String; 3],
    /// Its dead letters (`<t>.dlq.<p>.<id>`), which go by their own retention.
    pub(crate) dead_letters: String,
}

#[cfg(test)]
mod tests {
    use crate::wire::id::EntityId;
    use crate::wire::names::Names;

    #[test]
    fn a_snapshot_covers_its_entity_s_records_but_not_its_dead_letters() {
        let n = Names::new("order");
        let id = EntityId::new("o-1").unwrap();
        let covered = n.covered_by_snapshot(&n.snapshot_subject(3, &id)).unwrap();
        assert_eq!(covered.records, "order.*.3.o-1");
        assert_eq!(
            covered.each,
            [
                n.event_subject(3, &id),
                n.timer_subject(3, &id),
                n.snapshot_subject(3, &id)
            ]
        );
        assert_eq!(covered.dead_letters, n.entity_dead_letters(3, &id));
        assert!(n.covered_by_snapshot(&n.event_subject(3, &id)).is_none());
        // The journal's four-token subjects are exactly an entity's records: what
        // `records` matches besides `each` is its dead letters.
        let four_tokens: Vec<String> = n
            .journal_subjects(0)
            .into_iter()
            .filter(|s| s.split('.').count() == 4)
            .collect();
        assert_eq!(
            four_tokens,
            [
                "order.evt.*.*",
                "order.dlq.*.*",
                "order.snap.*.*",
                "order.tmr.*.*"
            ]
        );
    }
}
