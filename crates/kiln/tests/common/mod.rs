//! Helpers shared by the end-to-end tests of the `kiln` binary.
#![allow(dead_code)] // each test binary uses its own subset

/// Kafka's Java partitioner (murmur2, positive, modulo partitions): librdkafka's
/// `murmur2_random` must agree, so any client maps a rack to the same partition.
pub fn java_partition(key: &[u8], partitions: i32) -> i32 {
    let (seed, m, r) = (0x9747_b28c_u32, 0x5bd1_e995_u32, 24);
    let mut h = seed ^ key.len() as u32;
    let chunks = key.chunks_exact(4);
    let tail = chunks.remainder();
    for c in chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(m);
        k ^= k >> r;
        k = k.wrapping_mul(m);
        h = h.wrapping_mul(m);
        h ^= k;
    }
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(m);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(m);
    h ^= h >> 15;
    ((h & 0x7fff_ffff) % partitions as u32) as i32
}
