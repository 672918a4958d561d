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
    let records: Vec<(Option<&[u8]>, &[u8])> =
        values.iter().map(|v| (None, v.as_slice())).collect();
    build_keyed_batch(&records, timestamp_ms)
}

/// A valid RecordBatch v2 (no compression) holding `(key, value)` records.
pub(super) fn build_keyed_batch(values: &[(Option<&[u8]>, &[u8])], timestamp_ms: i64) -> Vec<u8> {
    let mut records = Vec::new();
    for (i, (key, value)) in values.iter().enumerate() {
        let mut r = Vec::new();
        r.push(0); // attributes
        put_varint(&mut r, 0); // timestamp delta
        put_varint(&mut r, i as i64); // offset delta
        match key {
            Some(k) => {
                put_varint(&mut r, k.len() as i64);
                r.extend_from_slice(k);
            }
            None => put_varint(&mut r, -1),
        }
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

/// As [`build_batch`], from an idempotent producer: `producer_id`, epoch 0, sequences from
/// `base_sequence` (the CRC, which covers those fields, computed again).
pub fn build_idempotent_batch(
    values: &[Vec<u8>],
    timestamp_ms: i64,
    producer_id: i64,
    base_sequence: i32,
) -> Vec<u8> {
    let mut b = build_batch(values, timestamp_ms);
    b[43..51].copy_from_slice(&producer_id.to_be_bytes());
    b[51..53].copy_from_slice(&0i16.to_be_bytes());
    b[53..57].copy_from_slice(&base_sequence.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

/// Reads one zigzag varint at `*at`, moving past it.
fn get_varint(buf: &[u8], at: &mut usize) -> Option<i64> {
    let mut z: u64 = 0;
    for shift in (0..70).step_by(7) {
        let byte = *buf.get(*at)?;
        *at += 1;
        z |= u64::from(byte & 0x7f).checked_shl(shift)?;
        if byte & 0x80 == 0 {
            return Some(((z >> 1) as i64) ^ -((z & 1) as i64));
        }
    }
    None
}

/// A byte run of length `len` (a varint already read) at `*at`; `None` for a null (-1).
fn get_bytes<'a>(buf: &'a [u8], at: &mut usize, len: i64) -> Option<Option<&'a [u8]>> {
    if len < 0 {
        return Some(None);
    }
    let len = usize::try_from(len).ok()?;
    let bytes = buf.get(*at..at.checked_add(len)?)?;
    *at += len;
    Some(Some(bytes))
}

/// One record's key (`None`: null) and value.
pub(super) type KeyedRecord = (Option<Vec<u8>>, Vec<u8>);

/// The `(key, value)` records of one uncompressed RecordBatch v2 (as [`build_keyed_batch`]
/// writes them); `None` if the bytes are not one.
pub(super) fn keyed_records(batch: &[u8]) -> Option<Vec<KeyedRecord>> {
    let count = i32::from_be_bytes(batch.get(57..61)?.try_into().ok()?);
    let mut at = 61usize;
    let mut out = Vec::new();
    for _ in 0..count {
        let len = usize::try_from(get_varint(batch, &mut at)?).ok()?;
        let end = at.checked_add(len)?;
        let r = batch.get(at..end)?;
        let mut p = 1usize; // attributes
        get_varint(r, &mut p)?; // timestamp delta
        get_varint(r, &mut p)?; // offset delta
        let key_len = get_varint(r, &mut p)?;
        let key = get_bytes(r, &mut p, key_len)?.map(<[u8]>::to_vec);
        let value_len = get_varint(r, &mut p)?;
        let value = get_bytes(r, &mut p, value_len)?
            .unwrap_or_default()
            .to_vec();
        out.push((key, value));
        at = end;
    }
    Some(out)
}

/// The bytes of a batch that reading does not stamp: everything but the base offset and the
/// partition leader epoch.
pub(super) fn unstamped(bytes: &[u8]) -> (&[u8], &[u8]) {
    (
        bytes.get(8..12).unwrap_or(&[]),
        bytes.get(16..).unwrap_or(&[]),
    )
}
