//! Valid Kafka batches for the simulated client.

fn put_varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        let byte = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A valid RecordBatch v2 (no compression) holding `values` as records with no key.
pub fn build_batch(values: &[Vec<u8>], timestamp_ms: i64) -> Vec<u8> {
    let mut records = Vec::new();
    for (i, value) in values.iter().enumerate() {
        let mut r = Vec::new();
        r.push(0); // attributes
        put_varint(&mut r, 0); // timestamp delta
        put_varint(&mut r, i as i64); // offset delta
        put_varint(&mut r, -1); // no key
        put_varint(&mut r, value.len() as i64);
        r.extend_from_slice(value);
        put_varint(&mut r, 0); // no headers
        put_varint(&mut records, r.len() as i64);
        records.extend_from_slice(&r);
    }
    let count = values.len() as i32;
    let mut b = Vec::with_capacity(61 + records.len());
    b.extend_from_slice(&0i64.to_be_bytes()); // base offset, stamped on read
    b.extend_from_slice(&((49 + records.len()) as i32).to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes()); // partition leader epoch
    b.push(2); // magic
    b.extend_from_slice(&0u32.to_be_bytes()); // crc, below
    b.extend_from_slice(&0i16.to_be_bytes()); // attributes
    b.extend_from_slice(&(count - 1).to_be_bytes()); // last offset delta
    b.extend_from_slice(&timestamp_ms.to_be_bytes());
    b.extend_from_slice(&timestamp_ms.to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
    b.extend_from_slice(&(-1i16).to_be_bytes()); // producer epoch
    b.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    b.extend_from_slice(&count.to_be_bytes());
    b.extend_from_slice(&records);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

/// The bytes of a batch that reading does not stamp: everything but the base offset and the
/// partition leader epoch.
pub(super) fn unstamped(bytes: &[u8]) -> (&[u8], &[u8]) {
    (
        bytes.get(8..12).unwrap_or(&[]),
        bytes.get(16..).unwrap_or(&[]),
    )
}
