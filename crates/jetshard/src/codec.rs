//! The codec seam: how commands and events are turned into bytes.
//!
//! One enum, so the choice is plain configuration and a new codec is one more arm. bincode is
//! pinned at 2.0.1 (its last real release) and used only here.

use std::cell::RefCell;

use bytes::{Bytes, BytesMut};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::CodecError;

/// How an entity type's commands and events are encoded on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Codec {
    /// bincode 2 (standard config, serde): compact and fast; Rust-only readers.
    #[default]
    Bincode,
    /// JSON: any NATS client can publish commands and read events.
    Json,
}

/// How many bytes the buffer events are cut from is allocated at a time
/// ([`Codec::encode_bytes`]; a larger value gets a buffer of its size): within glibc's small
/// bins (at most 1,000 bytes on x86-64: a larger request first merges the free fast-bin chunks),
/// a dozen or more small events.
const ENCODING_CHUNK: usize = 960;

impl Codec {
    /// The codec's name as recorded with the streams (stream metadata `jetshard.codec`) and
    /// named in errors: `bincode` or `json`.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Bincode => "bincode",
            Codec::Json => "json",
        }
    }

    /// The codec named `name` (as [`name`](Self::name) writes it); `None` for another name.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "bincode" => Some(Codec::Bincode),
            "json" => Some(Codec::Json),
            _ => None,
        }
    }

    /// Encodes a value.
    ///
    /// # Errors
    /// [`CodecError`] if the value cannot be serialized.
    pub fn encode<T: Serialize>(self, value: &T) -> Result<Vec<u8>, CodecError> {
        match self {
            Codec::Bincode => bincode::serde::encode_to_vec(value, bincode::config::standard())
                .map_err(|e| CodecError::Encode(e.to_string())),
            Codec::Json => serde_json::to_vec(value).map_err(|e| CodecError::Encode(e.to_string())),
        }
    }

    /// Encodes a value into [`Bytes`] cut from a buffer this thread keeps: no allocation of its
    /// own for most values. The value is encoded into a scratch `Vec` (serde writes it piece by
    /// piece, a byte at a time for a byte sequence: a `Vec` takes those fastest), then copied
    /// into a chunk allocated [`ENCODING_CHUNK`] bytes at a time and split off it, a share of
    /// that allocation: a chunk is freed once every value cut from it is dropped (events are:
    /// once written). A copy of its own per value (as before) cost an allocation, and the
    /// client's first clone of a `Bytes` that owns its allocation (async-nats clones every
    /// payload it writes) another.
    ///
    /// # Errors
    /// [`CodecError`] if the value cannot be serialized.
    pub(crate) fn encode_bytes<T: Serialize>(self, value: &T) -> Result<Bytes, CodecError> {
        /// A scratch buffer larger than this is not kept for the next encoding.
        const KEPT: usize = 64 * 1024;
        thread_local! {
            static SCRATCH: RefCell<(Vec<u8>, BytesMut)> =
                RefCell::new((Vec::new(), BytesMut::new()));
        }
        SCRATCH.with(|scratch| {
            // A `Serialize` impl that encodes again on this thread: no shared buffer for it.
            let Ok(mut scratch) = scratch.try_borrow_mut() else {
                return self.encode(value).map(Bytes::from);
            };
            let (encoding, chunk) = &mut *scratch;
            encoding.clear();
            let encoded = self.encode_into(value, encoding).map(|()| {
                if chunk.capacity() < encoding.len() {
                    *chunk = BytesMut::with_capacity(ENCODING_CHUNK.max(encoding.len()));
                }
                chunk.extend_from_slice(encoding);
                chunk.split().freeze()
            });
            if encoding.capacity() > KEPT {
                *encoding = Vec::new();
            }
            encoded
        })
    }

    /// Appends a value's encoding to `out` (a dormant state's allocation, built in one piece).
    ///
    /// # Errors
    /// [`CodecError`] if the value cannot be serialized (`out` may then hold part of it).
    pub(crate) fn encode_into<T: Serialize>(
        self,
        value: &T,
        out: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        match self {
            Codec::Bincode => {
                bincode::serde::encode_into_std_write(value, out, bincode::config::standard())
                    .map(drop)
                    .map_err(|e| CodecError::Encode(e.to_string()))
            }
            Codec::Json => {
                serde_json::to_writer(out, value).map_err(|e| CodecError::Encode(e.to_string()))
            }
        }
    }

    /// Decodes a value; trailing bytes are an error.
    ///
    /// # Errors
    /// [`CodecError`] if the bytes are not a valid encoding of `T`.
    pub fn decode<T: DeserializeOwned>(self, bytes: &[u8]) -> Result<T, CodecError> {
        match self {
            Codec::Bincode => {
                let (value, read) = bincode_decode_bounded(bytes)?;
                if read != bytes.len() {
                    return Err(CodecError::Decode(format!(
                        "as bincode: {} trailing bytes after the value",
                        bytes.len() - read
                    )));
                }
                Ok(value)
            }
            Codec::Json => serde_json::from_slice(bytes)
                .map_err(|e| CodecError::Decode(format!("as json: {e}"))),
        }
    }
}

/// bincode decodes a length before the bytes it announces and allocates for it first: without
/// a limit, ten bytes announcing a string of 2^50 bytes abort the process (allocation failure
/// is no panic). The limit is on the bytes that strings, byte buffers and the containers bincode
/// sizes itself may claim: the smallest power of four (from 256) at least the message's length
/// (a well-formed message never claims more than it holds), so a decode allocates at most four
/// times the message for them. serde's own sequence visitors cap what they preallocate.
fn bincode_decode_bounded<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, usize), CodecError> {
    macro_rules! bounded {
        ($($shift:literal)*) => {{
            let limit = bytes.len().max(1).next_power_of_two();
            $(
                if limit <= 1 << $shift {
                    let config = bincode::config::standard().with_limit::<{ 1 << $shift }>();
                    return bincode::serde::decode_from_slice(bytes, config)
                        .map_err(|e| CodecError::Decode(format!("as bincode: {e}")));
                }
            )*
            Err(CodecError::Decode(format!(
                "as bincode: {} bytes: larger than any message this codec decodes",
                bytes.len()
            )))
        }};
    }
    bounded!(8 10 12 14 16 18 20 22 24 26 28 30)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Cmd {
        Add { sku: String, qty: u32 },
        Ship,
    }

    #[test]
    fn both_codecs_round_trip() {
        for codec in [Codec::Bincode, Codec::Json] {
            for value in [
                Cmd::Add {
                    sku: "x".into(),
                    qty: 3,
                },
                Cmd::Ship,
            ] {
                let bytes = codec.encode(&value).unwrap();
                assert_eq!(codec.decode::<Cmd>(&bytes).unwrap(), value);
            }
        }
    }

    #[test]
    fn encode_into_appends_the_encoding() {
        for codec in [Codec::Bincode, Codec::Json] {
            let value = Cmd::Add {
                sku: "sku-17".into(),
                qty: 300,
            };
            let mut out = b"head".to_vec();
            codec.encode_into(&value, &mut out).unwrap();
            assert_eq!(out[..4], *b"head");
            assert_eq!(out[4..], codec.encode(&value).unwrap());
        }
    }

    /// Values cut from the shared buffer stay whole and apart: across chunk boundaries, with a
    /// value larger than a chunk (a buffer of its own), and after an encoding that failed.
    #[test]
    fn encoded_bytes_are_each_value_alone_whatever_shares_their_buffer() {
        struct Fails;
        impl Serialize for Fails {
            fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom("no"))
            }
        }
        for codec in [Codec::Bincode, Codec::Json] {
            let values: Vec<Cmd> = (0..300u32)
                .map(|i| Cmd::Add {
                    // Every 50th value larger than a chunk.
                    sku: "s".repeat(if i % 50 == 7 {
                        3 * ENCODING_CHUNK
                    } else {
                        i as usize % 40
                    }),
                    qty: i,
                })
                .collect();
            let mut encoded = Vec::new();
            for (i, value) in values.iter().enumerate() {
                encoded.push(codec.encode_bytes(value).unwrap());
                if i % 30 == 0 {
                    assert!(codec.encode_bytes(&Fails).is_err());
                }
            }
            for (value, bytes) in values.iter().zip(&encoded) {
                assert_eq!(bytes[..], codec.encode(value).unwrap()[..]);
                assert_eq!(codec.decode::<Cmd>(bytes).unwrap(), *value);
            }
        }
    }

    #[test]
    fn garbage_is_a_decode_error_not_a_panic() {
        for codec in [Codec::Bincode, Codec::Json] {
            for bytes in [&b""[..], b"\xff\xff\xff\xff\xff", b"{not json", b"\x07"] {
                assert!(matches!(
                    codec.decode::<Cmd>(bytes),
                    Err(CodecError::Decode(_))
                ));
            }
        }
        // "Variant 0, a string of 2^50 bytes": refused, not allocated (an allocation failure
        // would abort the test process).
        let huge = [0x00, 0xFD, 0, 0, 0, 0, 0, 0, 0x04, 0x00];
        assert!(matches!(
            Codec::Bincode.decode::<Cmd>(&huge),
            Err(CodecError::Decode(_))
        ));
        let mut bytes = Codec::Bincode.encode(&Cmd::Ship).unwrap();
        bytes.push(0);
        assert!(Codec::Bincode.decode::<Cmd>(&bytes).is_err());
    }
}
