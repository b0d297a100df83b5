//! Partitioning: which partition an entity id belongs to.
//!
//! jetshard does not hash ids itself on the publish path: the command stream's subject transform
//! `{{partition(N,1)}}` makes the server place every command. [`partition_of`] computes the same
//! placement (FNV-1a 32-bit over the id's UTF-8 bytes, modulo the partition count) so that code
//! outside the server, tools and tests, can tell where an id lives.

use crate::wire::id::EntityId;

const FNV_OFFSET_BASIS: u32 = 0x811c_9dc5;
const FNV_PRIME: u32 = 0x0100_0193;

/// FNV-1a, 32 bits, as the server's `partition()` subject-transform function computes it.
#[cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
pub fn fnv1a_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(FNV_OFFSET_BASIS, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(FNV_PRIME)
    })
}

/// The partition, in `0..partitions`, that the server assigns to commands for `id`.
///
/// # Panics
/// Panics if `partitions` is 0; a [`crate::ShardConfig`] never holds 0 partitions.
pub fn partition_of(id: &EntityId, partitions: u32) -> u32 {
    fnv1a_32(id.as_str().as_bytes()) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_reference_vectors() {
        // Vectors from the FNV reference (draft-eastlake-fnv).
        assert_eq!(fnv1a_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a_32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a_32(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn partition_is_the_hash_modulo_the_count() {
        let id = EntityId::new("order-17").unwrap();
        assert_eq!(partition_of(&id, 8), fnv1a_32(b"order-17") % 8);
        assert_eq!(partition_of(&id, 1), 0);
    }
}
