//! The framework's own records and decoders, fed arbitrary input: a typed error or a value,
//! never a panic (proptest, 2,000 cases each).

use std::str::FromStr;

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, HeaderValue};
use jetshard::{Codec, EntityId, FenceRecord, FenceRecordError, MAX_ID_LEN};
use jetshard_testkit::history::Record;
use jetshard_tests::ledger::LedgerCmd;
use proptest::prelude::*;

/// Headers as a server could deliver them: arbitrary names (valid ones kept) and values,
/// often with a `Jetshard-Generation` among them.
fn headers() -> impl Strategy<Value = HeaderMap> {
    let pairs = prop::collection::vec(("[ -~]{0,24}", ".{0,40}"), 0..6);
    let generation = prop::option::of(prop_oneof![
        any::<u64>().prop_map(|g| g.to_string()),
        "[0-9 +-]{0,25}",
        ".{0,10}",
    ]);
    (pairs, generation).prop_map(|(pairs, generation)| {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            if let (Ok(name), Ok(value)) =
                (HeaderName::from_str(&name), HeaderValue::from_str(&value))
            {
                headers.insert(name, value);
            }
        }
        if let Some(generation) = generation.and_then(|g| HeaderValue::from_str(&g).ok()) {
            headers.insert("Jetshard-Generation", generation);
        }
        headers
    })
}

/// Bodies: arbitrary bytes, JSON-ish text, and fence records with arbitrary fields.
fn bodies() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200),
        ".{0,120}".prop_map(String::into_bytes),
        (
            any::<u32>(),
            any::<u64>(),
            ".{0,20}",
            prop::option::of(".{0,20}")
        )
            .prop_map(|(partition, generation, node, extra)| {
                let mut value = serde_json::json!({
                    "partition": partition, "generation": generation, "node": node,
                });
                if let Some(extra) = extra {
                    value["extra"] = serde_json::Value::String(extra);
                }
                serde_json::to_vec(&value).unwrap()
            }),
        (any::<i64>(), any::<f64>(), any::<bool>()).prop_map(|(a, b, c)| {
            format!(r#"{{"partition":{a},"generation":{b},"node":{c}}}"#).into_bytes()
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn fence_record_decoding_never_panics_and_accepts_only_agreeing_records(
        headers in headers(),
        body in bodies(),
    ) {
        match FenceRecord::decode(&headers, &body) {
            Ok(record) => {
                let header = headers.get("Jetshard-Generation").unwrap();
                prop_assert_eq!(header.as_str().trim().parse::<u64>().ok(), Some(record.generation));
                let again: FenceRecord = serde_json::from_slice(&body).unwrap();
                prop_assert_eq!(again, record);
            }
            Err(FenceRecordError::Mismatch { header, body: in_body }) => {
                prop_assert_ne!(header, in_body);
            }
            Err(_) => {}
        }
    }

    #[test]
    fn a_fence_record_round_trips_through_its_wire_form(
        partition in any::<u32>(),
        generation in any::<u64>(),
        node in ".{0,64}",
    ) {
        let record = FenceRecord::new(partition, generation, node);
        let mut headers = HeaderMap::new();
        headers.insert("Jetshard-Generation", generation.to_string().as_str());
        let body = serde_json::to_vec(&record).unwrap();
        prop_assert_eq!(FenceRecord::decode(&headers, &body), Ok(record));
    }

    #[test]
    fn entity_ids_are_accepted_exactly_when_they_are_one_valid_token(id in ".{0,300}") {
        let valid = !id.is_empty()
            && id.len() <= MAX_ID_LEN
            && !id.chars().any(|c| matches!(c, '.' | '*' | '>') || c.is_whitespace() || c.is_control());
        prop_assert_eq!(EntityId::new(&id).is_ok(), valid, "{:?}", id);
    }

    #[test]
    fn command_decoding_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        for codec in [Codec::Json, Codec::Bincode] {
            let _ = codec.decode::<LedgerCmd>(&bytes);
        }
    }

    #[test]
    fn journal_record_parsing_never_panics(
        subject in prop_oneof!["[a-z0-9.]{0,40}", "ledger\\.(evt|fence|dlq|cmd)(\\.[a-z0-9-]{0,6}){0,3}"],
        headers in prop::option::of(headers()),
        body in bodies(),
    ) {
        let _ = Record::parse("ledger", 1, &subject, headers.as_ref(), body);
    }
}
