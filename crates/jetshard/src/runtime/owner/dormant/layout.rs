use std::time::Instant;

use super::*;

/// A state laid out like the bench entity's: two counters and a byte vector (40 bytes
/// inline, 3 encoded with bincode when empty).
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Small {
    count: u64,
    last: u64,
    blob: Vec<u8>,
}

struct Bench;
impl Entity for Bench {
    type Command = ();
    type Event = ();
    type State = Small;
    type Rejection = String;
    fn decide(_: &Small, _: ()) -> Result<Vec<()>, String> {
        Ok(vec![])
    }
    fn apply(_: &mut Small, _: &()) {}
}

/// The heap `n` dormant states of the bench-like entity hold per entity (counting
/// allocator, `test_alloc`), printed with its split, and the wake (decode) time per entity.
/// Returns (heap per entity, counted bytes per entity, encoded state).
fn measure(n: usize) -> (usize, usize, usize) {
    let ids: Vec<EntityId> = (0..n)
        .map(|k| EntityId::new(format!("e{k}")).unwrap())
        .collect();
    let seed = Seed::<Bench> {
        last_command_seq: 12,
        last_outcome: Some(LastOutcome::Applied { events: 1 }),
        journal_seq: 40_000,
        ..Default::default()
    };
    let before = crate::test_alloc::held_by_this_thread();
    let mut dormant = Dormant::<Bench>::new(Arc::new(DormantTotals::default()), Codec::Bincode);
    for id in &ids {
        assert!(dormant.keep(id, &seed));
    }
    let heap = (crate::test_alloc::held_by_this_thread() - before) as usize;
    let packed: usize = dormant.states.iter().map(|p| p.0.len()).sum();
    let slots = heap - packed;
    let encoded = Codec::Bincode.encode(&Small::default()).unwrap().len();
    let counted = dormant.bytes();
    eprintln!(
        "DORMANT {n} states: {} bytes of heap per entity (its allocation {}: stamp 8, id \
         length 2 + id {:.1}, small fields {:.1}, state {encoded}; the table {} for {} slots \
         of {} bytes and a control byte); counted at {}; target 2 x {encoded} + 100 = {}",
        heap / n,
        packed / n,
        ids.iter().map(|i| i.as_str().len()).sum::<usize>() as f64 / n as f64,
        (packed - n * (HEAD + encoded)) as f64 / n as f64
            - ids.iter().map(|i| i.as_str().len()).sum::<usize>() as f64 / n as f64,
        slots / n,
        dormant.states.capacity(),
        std::mem::size_of::<Packed>(),
        counted / n,
        2 * encoded + 100
    );
    let started = Instant::now();
    for id in &ids {
        assert!(dormant.take(id.as_str()).is_some());
    }
    eprintln!(
        "DORMANT wake: {} ns per entity to take and decode its state (debug build)",
        started.elapsed().as_nanos() / n as u128
    );
    (heap / n, counted / n, encoded)
}

/// The target for a small state, at a table's fullest (10,000 states: 0.61 of
/// its slots) and emptiest (7,169 states, just after it doubled: 0.44): a dormant entity
/// holds at most 2 x its encoded state + 100 bytes of heap, and is counted (the budget in
/// bytes, `PartitionStatus::dormant_bytes`) at no less than what it holds.
#[test]
#[cfg(target_pointer_width = "64")]
fn a_dormant_entity_holds_at_most_twice_its_encoding_and_100_bytes() {
    for n in [10_000, 7_169] {
        let (heap, counted, encoded) = measure(n);
        assert!(heap <= 2 * encoded + 100, "{n} states: {heap} bytes each");
        assert!(
            counted >= heap,
            "{n} states: {heap} bytes each, counted {counted}"
        );
    }
}

/// A dormant entry's slot: one boxed slice (its allocation holds the rest).
#[test]
#[cfg(target_pointer_width = "64")]
fn a_dormant_slot_is_a_pointer_and_a_length() {
    assert_eq!(std::mem::size_of::<Packed>(), 16);
    assert_eq!(TABLE_SHARE, 39);
}
