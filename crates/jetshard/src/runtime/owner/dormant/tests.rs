use super::*;

/// A state whose encoding is as long as asked (bincode: its length, then its bytes).
struct Blob;
impl Entity for Blob {
    type Command = ();
    type Event = ();
    type State = Vec<u8>;
    type Rejection = String;
    fn decide(_: &Vec<u8>, _: ()) -> Result<Vec<()>, String> {
        Ok(vec![])
    }
    fn apply(_: &mut Vec<u8>, _: &()) {}
}

fn id(n: u32) -> EntityId {
    EntityId::new(format!("e{n:02}")).unwrap()
}

fn seed(len: usize) -> Seed<Blob> {
    Seed {
        state: vec![7; len],
        ..Default::default()
    }
}

fn dormant(totals: &Arc<DormantTotals>) -> Dormant<Blob> {
    Dormant::new(Arc::clone(totals), Codec::Bincode)
}

fn entities(budget: usize) -> Budget {
    Budget {
        entities: Some(budget),
        bytes: None,
    }
}

fn totals(totals: &DormantTotals) -> (usize, usize) {
    (
        totals.entities.load(Ordering::Relaxed),
        totals.bytes.load(Ordering::Relaxed),
    )
}

#[test]
fn the_least_recently_kept_states_go_first_down_to_ninety_percent() {
    let total = Arc::new(DormantTotals::default());
    let mut dormant = dormant(&total);
    for n in 0..10 {
        assert!(dormant.keep(&id(n), &seed(n as usize)));
    }
    // e00 is used again: it is now the most recent.
    let e0 = dormant.take("e00").unwrap();
    dormant.keep(&id(0), &e0);
    assert_eq!(dormant.evict_over(entities(10)), 0);
    dormant.keep(&id(10), &seed(10));
    // 11 kept, budget 10: down to 9.
    assert_eq!(dormant.evict_over(entities(10)), 2);
    assert_eq!(totals(&total), (9, dormant.bytes()));
    assert!(dormant.take("e01").is_none() && dormant.take("e02").is_none());
    assert_eq!(dormant.take("e00").map(|s| s.state), Some(vec![]));
    drop(dormant);
    assert_eq!(totals(&total), (0, 0));
}

#[test]
fn a_partition_drops_only_what_it_holds() {
    let total = Arc::new(DormantTotals::default());
    total.entities.store(50, Ordering::Relaxed);
    let mut dormant = dormant(&total);
    dormant.keep(&id(1), &seed(1));
    assert_eq!(dormant.evict_over(entities(10)), 1);
    assert_eq!(dormant.len(), 0);
    assert_eq!(totals(&total), (50, 0));
}

#[test]
fn the_byte_budget_drops_the_oldest_until_ninety_percent() {
    let total = Arc::new(DormantTotals::default());
    let mut dormant = dormant(&total);
    // Ten states of 100 bytes, one of 500 (the most recent).
    for n in 0..10 {
        dormant.keep(&id(n), &seed(100));
    }
    dormant.keep(&id(10), &seed(500));
    // Stamp and id 13, seven small fields 7, bincode's length 1 (3 for 500), the table share.
    let each = 13 + 7 + 1 + 100 + TABLE_SHARE;
    let big = each + 402;
    assert_eq!(dormant.bytes(), 10 * each + big);
    // Down to 90 % of 12 small ones' worth: the three oldest go.
    let budget = Budget {
        entities: Some(100),
        bytes: Some(12 * each),
    };
    assert!(3 * each >= 10 * each + big - 12 * each * 9 / 10);
    assert!(2 * each < 10 * each + big - 12 * each * 9 / 10);
    assert_eq!(dormant.evict_over(budget), 3);
    assert_eq!(totals(&total), (8, 7 * each + big));
    assert_eq!(dormant.bytes(), 7 * each + big);
    assert!(dormant.take("e02").is_none() && dormant.take("e03").is_some());
    assert_eq!(dormant.evict_over(budget), 0);
}

#[test]
fn a_state_is_counted_at_its_encoding_its_id_and_its_table_share() {
    let total = Arc::new(DormantTotals::default());
    let mut dormant = dormant(&total);
    dormant.keep(&id(1), &seed(1));
    let small = dormant.bytes();
    dormant.keep(&id(1), &seed(1_000));
    // bincode: a length of 1 byte and 1 byte (2); a length of 3 bytes and 1,000 (1,003).
    assert_eq!(dormant.bytes() - small, 1_001);
    // The stamp and id (10 + 3), seven small fields of a byte each (the last command's and
    // the journal's sequences, the events since the snapshot, no tail known, no outcome, no
    // timers, no outbox origins), the state (2).
    assert_eq!(small, 13 + 7 + 2 + TABLE_SHARE);
    assert_eq!(totals(&total), (1, dormant.bytes()));
}

#[test]
fn a_seed_comes_back_as_it_was_kept() {
    let total = Arc::new(DormantTotals::default());
    let mut dormant = dormant(&total);
    let mut timers = BTreeMap::new();
    for (name, due_ms) in [("reminder", 1_700_000_000_000), ("t", u64::MAX)] {
        let armed = Armed {
            set_seq: 300,
            due_ms,
            payload: Bytes::from_static(b"\x00\xffpayload"),
        };
        timers.insert(Box::from(name), armed);
    }
    let outcomes = [
        None,
        Some(LastOutcome::Applied { events: u32::MAX }),
        Some(LastOutcome::Rejected("out of stock: é".into())),
        Some(LastOutcome::DeadLettered("".into())),
    ];
    for (n, last_outcome) in outcomes.into_iter().enumerate() {
        let kept = Seed::<Blob> {
            state: vec![1, 2, 3],
            last_command_seq: u64::MAX,
            last_outcome,
            journal_seq: 1 << 40,
            unsnapshotted: u32::MAX,
            tail: [None, Some(0), Some(1 << 40), Some(u64::MAX - 1)][n].map(Lineage::at),
            timers: if n % 2 == 0 {
                timers.clone()
            } else {
                BTreeMap::new()
            },
            origins: {
                let mut origins = Origins::default();
                for seq in 0..n as u64 {
                    origins.remember(crate::data::origin::Origin::new("order", 3, seq, 1));
                }
                origins
            },
        };
        let entity = id(n as u32);
        dormant.keep(&entity, &kept);
        let back = dormant.take(entity.as_str()).unwrap();
        assert_eq!(back.state, kept.state);
        assert_eq!(back.last_command_seq, kept.last_command_seq);
        assert_eq!(back.last_outcome, kept.last_outcome);
        assert_eq!(back.origins.to_header(), kept.origins.to_header());
        assert_eq!(back.journal_seq, kept.journal_seq);
        assert_eq!(back.unsnapshotted, kept.unsnapshotted);
        assert_eq!(back.tail, kept.tail);
        assert_eq!(back.timers, kept.timers);
        // Where its earlier commands ended is not kept: its last record names them.
        let longer = Seed::<Blob> {
            tail: Some(Lineage::from_parts(1 << 40, vec![(1 << 40) - 7, 1 << 20])),
            ..Seed::default()
        };
        dormant.keep(&entity, &longer);
        let back = dormant.take(entity.as_str()).unwrap();
        assert_eq!(back.tail, Some(Lineage::at(1 << 40)));
    }
    assert_eq!(totals(&total), (0, 0));
}

#[test]
fn a_json_state_comes_back_too() {
    let total = Arc::new(DormantTotals::default());
    let mut dormant = Dormant::<Blob>::new(Arc::clone(&total), Codec::Json);
    dormant.keep(&id(1), &seed(3));
    assert_eq!(dormant.take("e01").map(|s| s.state), Some(vec![7, 7, 7]));
    assert!(dormant.take("e01").is_none());
}

#[test]
fn a_table_that_emptied_gives_its_slots_back() {
    let total = Arc::new(DormantTotals::default());
    let mut dormant = dormant(&total);
    for n in 0..1_000 {
        dormant.keep(&id(n), &seed(0));
    }
    for n in 0..990 {
        dormant.forget(id(n).as_str());
    }
    assert!(
        dormant.states.capacity() < 64,
        "{}",
        dormant.states.capacity()
    );
    assert_eq!(dormant.len(), 10);
}
