//! Kafka RecordBatch v2 headers: parsing, validation, CRC32C and iteration over a buffer of batches.
//!
//! Layout (all big-endian):
//! baseOffset i64 @0, batchLength i32 @8 (= total bytes - 12), partitionLeaderEpoch i32 @12,
//! magic i8 @16, crc u32 @17 (CRC32C over bytes 21..end), attributes i16 @21,
//! lastOffsetDelta i32 @23, baseTimestamp i64 @27, maxTimestamp i64 @35, producerId i64 @43,
//! producerEpoch i16 @51, baseSequence i32 @53, recordCount i32 @57, records @61.
//!
//! Everything here reads untrusted bytes, so every access is checked: no input can make it panic.
//!
//! Two fields that the CRC does not cover carry the log's own bookkeeping on disk (docs/storage.md,
//! "Entries"): `partitionLeaderEpoch` is the Raft term the batch was written in, with bit 31
//! ([`ENTRY_END`]) set on the last batch of each Raft entry, and `baseOffset` holds the Kafka
//! offset of the batch's first record in its low 48 bits and, in its top 16, a check over the
//! bookkeeping fields (offset, epoch field, length, CRC), so damage to the bytes the CRC does
//! not cover is found too ([`stamp_stored`], [`BatchHeader::from_stored`]). Reads stamp the plain
//! offset and term back before a batch leaves the log. A control batch (attributes bit 5) holds one record whose key
//! is `[version i16 = 0][kind u16]` and whose value is the log's payload (a Raft-only entry: see
//! [`ControlKind`]); it takes no Kafka offset (its `baseOffset` is the offset of the next data
//! record) and is never served to a client.

use crate::LogError;

/// Size of the fixed RecordBatch v2 header, up to and including `recordCount`.
pub const BATCH_HEADER_LEN: usize = 61;
/// Bytes not counted by `batchLength`: baseOffset and batchLength themselves.
pub const LOG_OVERHEAD: usize = 12;
/// Smallest legal `batchLength`: a header with no records.
pub const MIN_BATCH_LENGTH: i32 = (BATCH_HEADER_LEN - LOG_OVERHEAD) as i32;
pub const MAGIC_V2: i8 = 2;
/// Attributes bit 4: the batch is part of a transaction.
pub const ATTR_TRANSACTIONAL: i16 = 0x10;
/// Attributes bit 5: a control batch (Kafka's transaction markers; here Raft-only entries).
pub const ATTR_CONTROL: i16 = 0x20;
/// Bit 31 of the stored `partitionLeaderEpoch`: this batch is the last of its Raft entry.
pub const ENTRY_END: u32 = 1 << 31;
/// Terms are stored in the 31 bits below [`ENTRY_END`].
pub const TERM_MAX: u64 = (ENTRY_END - 1) as u64;
/// A stored batch's Kafka offset takes the low 48 bits of `baseOffset`.
pub const STORED_OFFSET_MAX: i64 = (1 << 48) - 1;

const BATCH_LENGTH_AT: usize = 8;
const PARTITION_LEADER_EPOCH_AT: usize = 12;
const MAGIC_AT: usize = 16;
const CRC_AT: usize = 17;
/// The CRC covers everything from `attributes` to the end, so stamping the base offset or the
/// leader epoch does not invalidate it.
const CRC_COVERS_FROM: usize = 21;
const LAST_OFFSET_DELTA_AT: usize = 23;
const BASE_TIMESTAMP_AT: usize = 27;
const MAX_TIMESTAMP_AT: usize = 35;
const PRODUCER_ID_AT: usize = 43;
const PRODUCER_EPOCH_AT: usize = 51;
const BASE_SEQUENCE_AT: usize = 53;
const RECORD_COUNT_AT: usize = 57;

/// The fields of an idempotent producer's batch that its producer state keeps (kiln-raft's
/// `producers`): which producer, which epoch, which sequence numbers, at which offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerBatch {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub last_offset_delta: i32,
    /// The batch's first Kafka offset.
    pub base_offset: i64,
    pub max_timestamp: i64,
}

impl ProducerBatch {
    /// The sequence number of the batch's last record (sequences wrap at `i32::MAX` to 0, as
    /// in Kafka).
    pub fn last_sequence(&self) -> i32 {
        let last = i64::from(self.base_sequence) + i64::from(self.last_offset_delta);
        if last > i64::from(i32::MAX) {
            (last - i64::from(i32::MAX) - 1) as i32
        } else {
            last as i32
        }
    }

    pub fn last_offset(&self) -> i64 {
        self.base_offset + i64::from(self.last_offset_delta)
    }
}

/// The fixed header of one RecordBatch v2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

fn array<const N: usize>(buf: &[u8], at: usize) -> Option<[u8; N]> {
    buf.get(at..at.checked_add(N)?)?.try_into().ok()
}

fn invalid(position: usize, reason: impl Into<String>) -> LogError {
    LogError::InvalidBatch {
        position,
        reason: reason.into(),
    }
}

impl BatchHeader {
    /// Parses and checks the header at the start of `buf`. Only the header needs to be present;
    /// whether the whole batch is there is the caller's business (see [`batches`]).
    /// Checks: enough bytes, magic 2, batchLength >= 49, lastOffsetDelta >= 0,
    /// recordCount == lastOffsetDelta + 1.
    pub fn parse(buf: &[u8]) -> Result<BatchHeader, LogError> {
        Self::parse_at(buf, 0)
    }

    /// Like [`BatchHeader::parse`], reporting errors at `position` (where `buf` starts in a larger buffer).
    pub fn parse_at(buf: &[u8], position: usize) -> Result<BatchHeader, LogError> {
        let short = || {
            invalid(
                position,
                format!(
                    "{} bytes left, a batch header needs {BATCH_HEADER_LEN}",
                    buf.len()
                ),
            )
        };
        let i64_at = |at| {
            array::<8>(buf, at)
                .map(i64::from_be_bytes)
                .ok_or_else(short)
        };
        let i32_at = |at| {
            array::<4>(buf, at)
                .map(i32::from_be_bytes)
                .ok_or_else(short)
        };
        let i16_at = |at| {
            array::<2>(buf, at)
                .map(i16::from_be_bytes)
                .ok_or_else(short)
        };
        if buf.len() < BATCH_HEADER_LEN {
            return Err(short());
        }
        let magic = array::<1>(buf, MAGIC_AT)
            .map(i8::from_be_bytes)
            .ok_or_else(short)?;
        let header = BatchHeader {
            base_offset: i64_at(0)?,
            batch_length: i32_at(BATCH_LENGTH_AT)?,
            partition_leader_epoch: i32_at(PARTITION_LEADER_EPOCH_AT)?,
            magic,
            crc: array::<4>(buf, CRC_AT)
                .map(u32::from_be_bytes)
                .ok_or_else(short)?,
            attributes: i16_at(CRC_COVERS_FROM)?,
            last_offset_delta: i32_at(LAST_OFFSET_DELTA_AT)?,
            base_timestamp: i64_at(BASE_TIMESTAMP_AT)?,
            max_timestamp: i64_at(MAX_TIMESTAMP_AT)?,
            producer_id: i64_at(PRODUCER_ID_AT)?,
            producer_epoch: i16_at(PRODUCER_EPOCH_AT)?,
            base_sequence: i32_at(BASE_SEQUENCE_AT)?,
            record_count: i32_at(RECORD_COUNT_AT)?,
        };
        header.check(position)?;
        Ok(header)
    }

    fn check(&self, position: usize) -> Result<(), LogError> {
        if self.magic != MAGIC_V2 {
            return Err(invalid(
                position,
                format!("magic {} (only 2 is supported)", self.magic),
            ));
        }
        if self.batch_length < MIN_BATCH_LENGTH {
            return Err(invalid(
                position,
                format!(
                    "batchLength {} is below the minimum {MIN_BATCH_LENGTH}",
                    self.batch_length
                ),
            ));
        }
        if self.last_offset_delta < 0 {
            return Err(invalid(
                position,
                format!("lastOffsetDelta {} is negative", self.last_offset_delta),
            ));
        }
        if i64::from(self.record_count) != i64::from(self.last_offset_delta) + 1 {
            return Err(invalid(
                position,
                format!(
                    "recordCount {} does not match lastOffsetDelta {} + 1",
                    self.record_count, self.last_offset_delta
                ),
            ));
        }
        Ok(())
    }

    /// Total size of the batch in bytes, header included.
    pub fn total_len(&self) -> usize {
        // batch_length >= MIN_BATCH_LENGTH > 0 once checked; a negative value maps to 0 rather than wrapping.
        usize::try_from(self.batch_length).unwrap_or(0) + LOG_OVERHEAD
    }

    /// Offset of the last record in the batch.
    pub fn last_offset(&self) -> i64 {
        self.base_offset
            .saturating_add(i64::from(self.last_offset_delta))
    }

    /// Offset that follows this batch.
    pub fn next_offset(&self) -> i64 {
        self.last_offset().saturating_add(1)
    }

    /// What an idempotent producer's batch says about itself (`None`: no producer id).
    /// `base_offset` must be the batch's Kafka offset (a logical header, not a stored one).
    pub fn producer_batch(&self) -> Option<ProducerBatch> {
        if self.producer_id < 0 || self.is_control() {
            return None;
        }
        Some(ProducerBatch {
            producer_id: self.producer_id,
            producer_epoch: self.producer_epoch,
            base_sequence: self.base_sequence,
            last_offset_delta: self.last_offset_delta,
            base_offset: self.base_offset,
            max_timestamp: self.max_timestamp,
        })
    }

    /// A control batch: a Raft-only entry in the log, never a client's records.
    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }

    /// The Kafka offsets this batch takes as stored in the log: its records for a data batch,
    /// none for a control batch.
    pub fn kafka_records(&self) -> i64 {
        if self.is_control() {
            0
        } else {
            i64::from(self.record_count)
        }
    }

    /// A stored batch's header with its plain Kafka offset, once the check over its bookkeeping
    /// fields holds (an error names what disagrees).
    pub fn from_stored(mut self) -> Result<BatchHeader, String> {
        let raw = self.base_offset as u64;
        let kafka = (raw & STORED_OFFSET_MAX as u64) as i64;
        let check = (raw >> 48) as u16;
        let want = stored_check(
            kafka,
            self.partition_leader_epoch as u32,
            self.batch_length,
            self.crc,
        );
        if check != want {
            return Err(format!(
                "bookkeeping check {check:#06x} does not match {want:#06x} (offset, term or entry flag damaged)"
            ));
        }
        self.base_offset = kafka;
        Ok(self)
    }

    /// The Raft term of a stored batch (its `partitionLeaderEpoch` without [`ENTRY_END`]).
    pub fn stored_term(&self) -> u64 {
        u64::from(self.partition_leader_epoch as u32 & !ENTRY_END)
    }

    /// Whether a stored batch is the last of its Raft entry.
    pub fn ends_entry(&self) -> bool {
        self.partition_leader_epoch as u32 & ENTRY_END != 0
    }
}

/// CRC32C (Castagnoli) of a whole batch as Kafka defines it: bytes 21..end.
/// `None` when `batch` is shorter than a header.
pub fn compute_crc(batch: &[u8]) -> Option<u32> {
    if batch.len() < BATCH_HEADER_LEN {
        return None;
    }
    batch.get(CRC_COVERS_FROM..).map(crc32c::crc32c)
}

/// Checks the stored CRC of one whole batch (`batch` must be exactly the batch's bytes).
pub fn verify_crc(batch: &[u8], position: usize) -> Result<(), LogError> {
    let header = BatchHeader::parse_at(batch, position)?;
    if batch.len() != header.total_len() {
        return Err(invalid(
            position,
            format!(
                "buffer holds {} bytes, the batch is {}",
                batch.len(),
                header.total_len()
            ),
        ));
    }
    let actual = compute_crc(batch).ok_or_else(|| invalid(position, "too short for a CRC"))?;
    if actual != header.crc {
        return Err(LogError::CrcMismatch {
            position,
            expected: header.crc,
            actual,
        });
    }
    Ok(())
}

/// Overwrites the base offset field. Returns false when `batch` is too short to hold one.
pub fn set_base_offset(batch: &mut [u8], base_offset: i64) -> bool {
    match batch.get_mut(0..8) {
        Some(field) => {
            field.copy_from_slice(&base_offset.to_be_bytes());
            true
        }
        None => false,
    }
}

/// One batch found in a buffer.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// Where the batch starts in the buffer.
    pub position: usize,
    pub header: BatchHeader,
    /// The whole batch, header included.
    pub bytes: &'a [u8],
}

/// Iterates the batches of a buffer, checking each header and that the whole batch is present,
/// but not the CRC. Stops after the first error.
pub struct Batches<'a> {
    buf: &'a [u8],
    position: usize,
    failed: bool,
}

/// Iterates the concatenated batches in `buf` (see [`Batches`]).
pub fn batches(buf: &[u8]) -> Batches<'_> {
    Batches {
        buf,
        position: 0,
        failed: false,
    }
}

impl<'a> Iterator for Batches<'a> {
    type Item = Result<Batch<'a>, LogError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.position >= self.buf.len() {
            return None;
        }
        let position = self.position;
        let rest = self.buf.get(position..)?;
        let result = BatchHeader::parse_at(rest, position).and_then(|header| {
            let len = header.total_len();
            match rest.get(..len) {
                Some(bytes) => Ok(Batch {
                    position,
                    header,
                    bytes,
                }),
                None => Err(invalid(
                    position,
                    format!("batch of {len} bytes but only {} bytes left", rest.len()),
                )),
            }
        });
        match &result {
            Ok(batch) => self.position = position + batch.bytes.len(),
            Err(_) => self.failed = true,
        }
        Some(result)
    }
}

/// The check a stored batch carries in the top 16 bits of `baseOffset`.
fn stored_check(kafka: i64, epoch_field: u32, batch_length: i32, crc: u32) -> u16 {
    let mut b = [0u8; 20];
    b[..8].copy_from_slice(&kafka.to_be_bytes());
    b[8..12].copy_from_slice(&epoch_field.to_be_bytes());
    b[12..16].copy_from_slice(&batch_length.to_be_bytes());
    b[16..].copy_from_slice(&crc.to_be_bytes());
    let c = crc32c::crc32c(&b);
    (c ^ (c >> 16)) as u16
}

/// Stamps a batch for storage: its Kafka offset (at most [`STORED_OFFSET_MAX`]) and the check in
/// `baseOffset`, the stored epoch field (term and [`ENTRY_END`]) in `partitionLeaderEpoch`.
/// Returns false when `batch` is too short or the offset does not fit.
pub fn stamp_stored(batch: &mut [u8], kafka: i64, epoch_field: u32) -> bool {
    let Ok(header) = BatchHeader::parse(batch) else {
        return false;
    };
    if !(0..=STORED_OFFSET_MAX).contains(&kafka) {
        return false;
    }
    let check = stored_check(kafka, epoch_field, header.batch_length, header.crc);
    let stored = (kafka as u64) | (u64::from(check) << 48);
    set_partition_leader_epoch(batch, epoch_field) && set_base_offset(batch, stored as i64)
}

/// Overwrites the `partitionLeaderEpoch` field. Returns false when `batch` is too short.
pub fn set_partition_leader_epoch(batch: &mut [u8], value: u32) -> bool {
    match batch.get_mut(PARTITION_LEADER_EPOCH_AT..PARTITION_LEADER_EPOCH_AT + 4) {
        Some(field) => {
            field.copy_from_slice(&value.to_be_bytes());
            true
        }
        None => false,
    }
}

/// Validates a buffer of one or more concatenated batches as a producer sends them: every header,
/// every CRC, that the batches cover the buffer exactly, and that none is a control batch (only
/// the log writes those). Returns the batches in order.
pub fn validate_batches(buf: &[u8]) -> Result<Vec<Batch<'_>>, LogError> {
    walk_producer_batches(buf, |batch| {
        verify_crc(batch.bytes, batch.position)?;
        Ok(*batch)
    })
}

/// The structure of a buffer of producer batches whose CRCs were checked already
/// ([`validate_batches`]): every header checked again, the batches covering the buffer exactly,
/// none a control batch. Returns each batch's position and record count, in order.
pub fn structure(buf: &[u8]) -> Result<Vec<(usize, u32)>, LogError> {
    walk_producer_batches(buf, |batch| {
        let records = u32::try_from(batch.header.record_count).map_err(|_| {
            invalid(
                batch.position,
                format!("negative record count {}", batch.header.record_count),
            )
        })?;
        Ok((batch.position, records))
    })
}

/// The walk both of the above make: at least one batch, every header checked, the batches
/// covering the buffer exactly, none a control batch; `each` sees every batch in order and
/// may refuse it.
fn walk_producer_batches<'a, T>(
    buf: &'a [u8],
    mut each: impl FnMut(&Batch<'a>) -> Result<T, LogError>,
) -> Result<Vec<T>, LogError> {
    if buf.is_empty() {
        return Err(invalid(0, "no record batches"));
    }
    let mut out = Vec::new();
    for batch in batches(buf) {
        let batch = batch?;
        if batch.header.is_control() {
            return Err(invalid(
                batch.position,
                "control batches are written by the broker only",
            ));
        }
        out.push(each(&batch)?);
    }
    Ok(out)
}

/// Counts the records of already validated batches.
pub fn count_records(buf: &[u8]) -> Result<u32, LogError> {
    let mut n: u32 = 0;
    for batch in batches(buf) {
        let records = u32::try_from(batch?.header.record_count).unwrap_or(0);
        n = n.saturating_add(records);
    }
    Ok(n)
}

/// The kinds of Raft-only entries the log stores as control batches. Kafka's own control
/// record types (0 abort, 1 commit, 2..6 KRaft) are not used, so no tool mistakes one for the
/// other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum ControlKind {
    /// A new leader's first entry (openraft's blank entry); no payload.
    Blank = 100,
    /// A Raft membership (voter and learner sets); the payload is kiln-raft's encoding.
    Membership = 101,
    /// A replicated request that the replica applies (the log start moved, ...); the payload
    /// is kiln-raft's encoding.
    Command = 102,
}

impl ControlKind {
    pub fn from_u16(v: u16) -> Option<ControlKind> {
        match v {
            100 => Some(ControlKind::Blank),
            101 => Some(ControlKind::Membership),
            102 => Some(ControlKind::Command),
            _ => None,
        }
    }
}

fn put_varint(out: &mut Vec<u8>, v: i64) {
    // Kafka's record fields are zigzag varints.
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

fn get_varint(buf: &[u8], at: &mut usize) -> Option<i64> {
    let mut z: u64 = 0;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*at)?;
        *at += 1;
        z |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(((z >> 1) as i64) ^ -((z & 1) as i64));
        }
    }
    None
}

/// Builds a control batch holding one record (key `[0 i16][kind u16]`, value `payload`), with
/// `base_offset`, the stored epoch field `epoch_field` and `timestamp_ms`. Its CRC is set.
pub fn encode_control_batch(
    base_offset: i64,
    epoch_field: u32,
    timestamp_ms: i64,
    kind: ControlKind,
    payload: &[u8],
) -> Vec<u8> {
    let mut record = Vec::with_capacity(16 + payload.len());
    record.push(0); // attributes
    put_varint(&mut record, 0); // timestampDelta
    put_varint(&mut record, 0); // offsetDelta
    put_varint(&mut record, 4);
    record.extend_from_slice(&0i16.to_be_bytes());
    record.extend_from_slice(&(kind as u16).to_be_bytes());
    put_varint(&mut record, payload.len() as i64);
    record.extend_from_slice(payload);
    put_varint(&mut record, 0); // headers
    let mut b = Vec::with_capacity(BATCH_HEADER_LEN + 10 + record.len());
    b.extend_from_slice(&base_offset.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes()); // batchLength, set below
    b.extend_from_slice(&epoch_field.to_be_bytes());
    b.push(MAGIC_V2 as u8);
    b.extend_from_slice(&0u32.to_be_bytes()); // crc, set below
    b.extend_from_slice(&ATTR_CONTROL.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes()); // lastOffsetDelta
    b.extend_from_slice(&timestamp_ms.to_be_bytes());
    b.extend_from_slice(&timestamp_ms.to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes()); // producerId
    b.extend_from_slice(&(-1i16).to_be_bytes()); // producerEpoch
    b.extend_from_slice(&(-1i32).to_be_bytes()); // baseSequence
    b.extend_from_slice(&1i32.to_be_bytes()); // recordCount
    put_varint(&mut b, record.len() as i64);
    b.extend_from_slice(&record);
    let batch_length = (b.len() - LOG_OVERHEAD) as i32;
    b[BATCH_LENGTH_AT..BATCH_LENGTH_AT + 4].copy_from_slice(&batch_length.to_be_bytes());
    let crc = crc32c::crc32c(&b[CRC_COVERS_FROM..]);
    b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    b
}

/// The kind and payload of a control batch written by [`encode_control_batch`] (`batch` is the
/// whole batch, CRC already checked).
pub fn decode_control_batch(batch: &[u8]) -> Result<(ControlKind, &[u8]), LogError> {
    let header = BatchHeader::parse(batch)?;
    if !header.is_control() || header.record_count != 1 {
        return Err(invalid(0, "not a control batch of one record"));
    }
    let bad = |why: &str| invalid(BATCH_HEADER_LEN, format!("control record: {why}"));
    let mut at = BATCH_HEADER_LEN;
    let len = get_varint(batch, &mut at).ok_or_else(|| bad("no length"))?;
    let end = at
        .checked_add(usize::try_from(len).map_err(|_| bad("negative length"))?)
        .filter(|&e| e <= batch.len())
        .ok_or_else(|| bad("length past the batch"))?;
    at += 1; // attributes
    for _ in 0..2 {
        get_varint(batch, &mut at).ok_or_else(|| bad("no delta"))?;
    }
    if get_varint(batch, &mut at) != Some(4) {
        return Err(bad("key is not 4 bytes"));
    }
    let key = batch.get(at..at + 4).ok_or_else(|| bad("short key"))?;
    at += 4;
    let kind = u16::from_be_bytes([key[2], key[3]]);
    let kind = ControlKind::from_u16(kind).ok_or_else(|| bad("unknown kind"))?;
    let value_len = get_varint(batch, &mut at).ok_or_else(|| bad("no value length"))?;
    let value_len = usize::try_from(value_len).map_err(|_| bad("negative value length"))?;
    let value = at
        .checked_add(value_len)
        .filter(|&e| e <= end)
        .and_then(|e| batch.get(at..e))
        .ok_or_else(|| bad("value past the record"))?;
    Ok((kind, value))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    /// A header-only batch (no records is not legal Kafka, but the header checks allow it when
    /// recordCount matches; enough to test parsing).
    fn raw_batch(records_len: usize, last_offset_delta: i32) -> Vec<u8> {
        let mut b = vec![0u8; BATCH_HEADER_LEN + records_len];
        let total = b.len();
        b[8..12].copy_from_slice(&((total - LOG_OVERHEAD) as i32).to_be_bytes());
        b[16] = 2;
        b[23..27].copy_from_slice(&last_offset_delta.to_be_bytes());
        b[35..43].copy_from_slice(&1234i64.to_be_bytes());
        b[57..61].copy_from_slice(&(last_offset_delta + 1).to_be_bytes());
        let crc = compute_crc(&b).unwrap();
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    #[test]
    fn parses_and_validates() {
        let mut buf = raw_batch(10, 2);
        buf.extend(raw_batch(0, 0));
        let found = validate_batches(&buf).unwrap();
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].header.record_count, 3);
        assert_eq!(found[0].header.max_timestamp, 1234);
        assert_eq!(found[1].position, 71);
        assert_eq!(found[1].header.total_len(), 61);
    }

    #[test]
    fn stamping_keeps_crc() {
        let mut b = raw_batch(5, 0);
        assert!(set_base_offset(&mut b, 99));
        verify_crc(&b, 0).unwrap();
        assert_eq!(BatchHeader::parse(&b).unwrap().base_offset, 99);
    }

    #[test]
    fn rejects_bad_batches() {
        let good = raw_batch(4, 1);
        let mut bad_magic = good.clone();
        bad_magic[16] = 1;
        assert!(matches!(
            validate_batches(&bad_magic),
            Err(LogError::InvalidBatch { .. })
        ));
        let mut bad_crc = good.clone();
        bad_crc[62] ^= 1;
        assert!(matches!(
            validate_batches(&bad_crc),
            Err(LogError::CrcMismatch { position: 0, .. })
        ));
        let mut bad_count = good.clone();
        bad_count[57..61].copy_from_slice(&5i32.to_be_bytes());
        assert!(matches!(
            validate_batches(&bad_count),
            Err(LogError::InvalidBatch { .. })
        ));
        let mut trailing = good.clone();
        trailing.extend_from_slice(&[0, 0, 0]);
        assert!(matches!(
            validate_batches(&trailing),
            Err(LogError::InvalidBatch { position: 65, .. })
        ));
        assert!(validate_batches(&good[..60]).is_err());
        assert!(validate_batches(&[]).is_err());
        let mut short_len = good.clone();
        short_len[8..12].copy_from_slice(&48i32.to_be_bytes());
        assert!(validate_batches(&short_len).is_err());
        let mut long_len = good;
        long_len[8..12].copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(validate_batches(&long_len).is_err());
    }

    #[test]
    fn stored_bookkeeping_is_checked() {
        let mut b = raw_batch(10, 2);
        assert!(stamp_stored(&mut b, 12_345, 7 | ENTRY_END));
        let h = BatchHeader::parse(&b).unwrap().from_stored().unwrap();
        assert_eq!(
            (h.base_offset, h.stored_term(), h.ends_entry()),
            (12_345, 7, true)
        );
        verify_crc(&b, 0).unwrap();
        // Any flipped bit in the offset, the epoch field or the length is caught.
        for byte in 0..16 {
            for bit in 0..8 {
                let mut bad = b.clone();
                bad[byte] ^= 1 << bit;
                let parsed = BatchHeader::parse(&bad).map(|h| h.from_stored());
                assert!(
                    !matches!(parsed, Ok(Ok(h)) if h == BatchHeader::parse(&b).unwrap().from_stored().unwrap()),
                    "byte {byte} bit {bit}"
                );
                if byte < 8 || (12..16).contains(&byte) {
                    assert!(matches!(parsed, Ok(Err(_))), "byte {byte} bit {bit}");
                }
            }
        }
        assert!(!stamp_stored(&mut b, STORED_OFFSET_MAX + 1, 1));
        assert!(!stamp_stored(&mut b, -1, 1));
    }

    #[test]
    fn control_batches_round_trip_and_are_refused_from_producers() {
        let b = encode_control_batch(42, 7 | ENTRY_END, 1000, ControlKind::Membership, b"voters");
        verify_crc(&b, 0).unwrap();
        let h = BatchHeader::parse(&b).unwrap();
        assert!(h.is_control());
        assert_eq!(
            (h.base_offset, h.kafka_records(), h.record_count),
            (42, 0, 1)
        );
        assert_eq!((h.stored_term(), h.ends_entry()), (7, true));
        let (kind, payload) = decode_control_batch(&b).unwrap();
        assert_eq!((kind, payload), (ControlKind::Membership, &b"voters"[..]));
        let empty = encode_control_batch(0, 1, 0, ControlKind::Blank, b"");
        assert_eq!(decode_control_batch(&empty).unwrap().1, b"");
        assert!(matches!(
            validate_batches(&b),
            Err(LogError::InvalidBatch { .. })
        ));
        assert!(decode_control_batch(&raw_batch(4, 0)).is_err());
        for cut in BATCH_HEADER_LEN..b.len() {
            let mut short = b[..cut].to_vec();
            let len = (short.len() - LOG_OVERHEAD) as i32;
            short[8..12].copy_from_slice(&len.to_be_bytes());
            let _ = decode_control_batch(&short);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn never_panics_on_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..200), magic2 in any::<bool>()) {
            let mut bytes = bytes;
            if magic2 && bytes.len() > 16 {
                bytes[16] = 2;
            }
            let _ = BatchHeader::parse(&bytes);
            let _ = validate_batches(&bytes);
            let _ = compute_crc(&bytes);
            let _ = decode_control_batch(&bytes);
            for b in batches(&bytes) {
                let _ = b;
            }
        }
    }
}
