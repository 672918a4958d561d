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

use std::time::{Duration, Instant};

use kiln_queue::rdkafka::consumer::{BaseConsumer, Consumer};
use kiln_queue::rdkafka::message::OwnedMessage;
use kiln_queue::rdkafka::{Offset, TopicPartitionList};

/// Reads partitions `0..partitions` of `topic` from the beginning with manual assignment until
/// `want` records arrived (30 s at most; `context` is added to the failure message).
pub fn read_records(
    c: &BaseConsumer,
    topic: &str,
    partitions: i32,
    want: i64,
    context: &dyn Fn() -> String,
) -> Vec<OwnedMessage> {
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("tpl");
    }
    c.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while (out.len() as i64) < want {
        assert!(
            Instant::now() < deadline,
            "read {} of {want} records of {topic}\n{}",
            out.len(),
            context()
        );
        match c.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(e)) => panic!("consume: {e}"),
            Some(Ok(m)) => out.push(m.detach()),
        }
    }
    out
}

/// Registers `manifest` with the real `kiln intake register` against `bootstrap` and the store
/// at `database_url` (ignoring any KILN_* defaults of the environment) and asserts it succeeded.
pub fn register_manifest(manifest: &std::path::Path, bootstrap: &str, database_url: &str) {
    register_manifest_with(manifest, bootstrap, database_url, &[]);
}

/// [`register_manifest`] with more flags (`--kafka-config`, `--kafka-config-file`).
pub fn register_manifest_with(
    manifest: &std::path::Path,
    bootstrap: &str,
    database_url: &str,
    flags: &[String],
) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["intake", "register"])
        .arg(manifest)
        .args(["--bootstrap", bootstrap, "--database-url", database_url])
        .args(flags)
        .env_remove("KILN_BOOTSTRAP")
        .env_remove("KILN_DATABASE_URL")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("kiln intake register");
    assert!(
        out.status.success(),
        "register: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
