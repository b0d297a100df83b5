//! Unit tests of `journal::read`.

use super::*;

/// A record of entity `a` of partition 0 as a `multi_last` answer holds it: `kind`
/// (`evt`, `tmr`, `dlq`, `snap`) at `seq`, naming `previous` if given.
fn record(kind: &str, seq: u64, previous: Option<u64>) -> StreamMessage {
    let mut headers = HeaderMap::new();
    headers.insert(HDR_GENERATION, "1");
    headers.insert(HDR_COMMAND_SEQ, (seq * 10).to_string());
    match kind {
        "tmr" => {
            headers.insert(HDR_TIMER_OP, "cancel");
            headers.insert(HDR_TIMER, "t");
        }
        "dlq" => headers.insert(HDR_ENTITY, "a"),
        _ => {}
    }
    if let Some(previous) = previous {
        headers.insert(HDR_PREVIOUS, previous.to_string());
    }
    StreamMessage {
        subject: format!("t.{kind}.0.a").into(),
        sequence: seq,
        headers,
        payload: Bytes::from_static(b"e"),
        time: time::OffsetDateTime::UNIX_EPOCH,
    }
}

/// The sequences `replay_known` hands on.
fn replayed(known: &[StreamMessage], from: u64, end: u64) -> Vec<u64> {
    let mut seen = Vec::new();
    replay_known(known, from, end, |stored| {
        seen.push(stored.seq);
        Ok(())
    })
    .unwrap();
    seen
}

#[test]
fn an_only_record_naming_nothing_before_it_is_the_whole_tail() {
    let known = [record("evt", 7, Some(0))];
    assert!(tail_is_known(&known, 1, 7));
    assert_eq!(replayed(&known, 1, 7), [7]);
}

#[test]
fn a_chain_across_subjects_down_past_the_snapshot_is_the_whole_tail() {
    // A snapshot at 5 (records up to it covered), then a dead letter at 9 and an event at 12
    // naming it.
    let known = [
        record("snap", 5, None),
        record("evt", 12, Some(9)),
        record("dlq", 9, Some(5)),
    ];
    assert!(tail_is_known(&known, 6, 12));
    assert_eq!(replayed(&known, 6, 12), [9, 12]);
    // Without the snapshot, what lies at or below 5 is not known.
    assert!(!tail_is_known(&known, 1, 12));
}

#[test]
fn a_broken_chain_means_the_tail_is_read() {
    // No header: written before it existed, or one of a command's several records.
    assert!(!tail_is_known(&[record("evt", 7, None)], 1, 7));
    // An earlier record of the entity, not among its last ones.
    assert!(!tail_is_known(&[record("evt", 7, Some(4))], 1, 7));
    // A header that names the record itself or a later one proves nothing.
    assert!(!tail_is_known(&[record("evt", 7, Some(7))], 1, 7));
    // A known record in the range that the chain passes by.
    let known = [record("evt", 12, Some(0)), record("tmr", 9, Some(0))];
    assert!(!tail_is_known(&known, 1, 12));
    // The last record a snapshot (one that does not read back): read.
    let known = [record("snap", 12, None), record("evt", 9, Some(0))];
    assert!(!tail_is_known(&known, 1, 12));
}
