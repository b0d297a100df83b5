//! Fence records written as another process would: a claim that supersedes the owner's
//! generation without that process ever serving the partition.

use async_nats::HeaderMap;
use async_nats::jetstream::Context;
use jetshard::wire::{HDR_EXPECTED_SUBJECT_SEQ, HDR_GENERATION, Names};

/// A claim of `partition`'s next generation by a process named "elsewhere", compare-and-set
/// against the latest fence record as a real claim is. Returns the generation and the record's
/// stream sequence.
pub async fn claim_elsewhere(js: &Context, names: &Names, partition: u32) -> (u64, u64) {
    let journal = js
        .get_stream(names.journal_stream(partition))
        .await
        .unwrap();
    let fence_subject = names.fence_subject(partition);
    let last = journal
        .get_last_raw_message_by_subject(&fence_subject)
        .await
        .unwrap();
    let previous: jetshard::FenceRecord = serde_json::from_slice(&last.payload).unwrap();
    let generation = previous.generation + 1;
    let mut headers = HeaderMap::new();
    headers.insert(HDR_GENERATION, generation.to_string());
    headers.insert(HDR_EXPECTED_SUBJECT_SEQ, last.sequence.to_string());
    let record = jetshard::FenceRecord::new(partition, generation, "elsewhere");
    let seq = js
        .publish_with_headers(
            fence_subject,
            headers,
            serde_json::to_vec(&record).unwrap().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap()
        .sequence;
    (generation, seq)
}
