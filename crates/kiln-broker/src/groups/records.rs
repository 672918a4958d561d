//! The records of the internal offsets log: one key per (group, topic, partition), one value per
//! commit, a null value (tombstone) when a group's offsets are deleted.
//!
//! Key, version 1:   i16 version | i16 len + group | i16 len + topic | i32 partition
//! Value, version 1: i16 version | i64 offset | i32 leader epoch | i32 len (-1 = null) + metadata
//!                   | i64 commit time (ms) | i8 flags (bit 0: written by an explicit reset)
//!
//! Every decode is bounds-checked: a record that does not parse is reported, never trusted.

use bytes::{BufMut, Bytes, BytesMut};

const KEY_VERSION: i16 = 1;
const VALUE_VERSION: i16 = 1;
const FLAG_RESET: i8 = 1;

/// Longest group id accepted anywhere (a bound on memory and on the i16 length prefix).
pub const GROUP_ID_LEN_MAX: usize = 1024;

/// Which partition's committed offset, for which group.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OffsetKey {
    pub group: String,
    pub topic: String,
    pub partition: i32,
}

/// A committed offset as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The next record the group will read (Kafka's convention: last processed + 1).
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
    pub commit_time_ms: i64,
    /// Written by an explicit reset (a commit while the group had no members).
    pub reset: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("offsets record does not parse: {0}")]
pub struct RecordError(pub String);

pub fn encode_key(key: &OffsetKey) -> Result<Bytes, RecordError> {
    let mut buf = BytesMut::with_capacity(10 + key.group.len() + key.topic.len());
    buf.put_i16(KEY_VERSION);
    put_short_str(&mut buf, &key.group)?;
    put_short_str(&mut buf, &key.topic)?;
    buf.put_i32(key.partition);
    Ok(buf.freeze())
}

pub fn encode_value(value: &Committed) -> Result<Bytes, RecordError> {
    let metadata_len = value.metadata.as_ref().map_or(0, String::len);
    let mut buf = BytesMut::with_capacity(27 + metadata_len);
    buf.put_i16(VALUE_VERSION);
    buf.put_i64(value.offset);
    buf.put_i32(value.leader_epoch);
    match &value.metadata {
        None => buf.put_i32(-1),
        Some(m) => {
            let len = i32::try_from(m.len())
                .map_err(|_| RecordError("metadata longer than i32::MAX".into()))?;
            buf.put_i32(len);
            buf.put_slice(m.as_bytes());
        }
    }
    buf.put_i64(value.commit_time_ms);
    buf.put_i8(if value.reset { FLAG_RESET } else { 0 });
    Ok(buf.freeze())
}

pub fn decode_key(bytes: &[u8]) -> Result<OffsetKey, RecordError> {
    let mut r = Reader(bytes);
    let version = r.i16()?;
    if version != KEY_VERSION {
        return Err(RecordError(format!("unknown key version {version}")));
    }
    let group = r.short_str()?;
    let topic = r.short_str()?;
    let partition = r.i32()?;
    r.end()?;
    Ok(OffsetKey {
        group,
        topic,
        partition,
    })
}

pub fn decode_value(bytes: &[u8]) -> Result<Committed, RecordError> {
    let mut r = Reader(bytes);
    let version = r.i16()?;
    if version != VALUE_VERSION {
        return Err(RecordError(format!("unknown value version {version}")));
    }
    let offset = r.i64()?;
    let leader_epoch = r.i32()?;
    let metadata = match r.i32()? {
        -1 => None,
        n => {
            let len =
                usize::try_from(n).map_err(|_| RecordError(format!("metadata length {n}")))?;
            Some(r.str(len)?)
        }
    };
    let commit_time_ms = r.i64()?;
    let flags = r.i8()?;
    r.end()?;
    Ok(Committed {
        offset,
        leader_epoch,
        metadata,
        commit_time_ms,
        reset: flags & FLAG_RESET != 0,
    })
}

fn put_short_str(buf: &mut BytesMut, s: &str) -> Result<(), RecordError> {
    let len = i16::try_from(s.len())
        .map_err(|_| RecordError(format!("string of {} bytes is too long", s.len())))?;
    buf.put_i16(len);
    buf.put_slice(s.as_bytes());
    Ok(())
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], RecordError> {
        if self.0.len() < n {
            return Err(RecordError(format!(
                "needs {n} more bytes, {} left",
                self.0.len()
            )));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], RecordError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    fn i8(&mut self) -> Result<i8, RecordError> {
        Ok(i8::from_be_bytes(self.array()?))
    }
    fn i16(&mut self) -> Result<i16, RecordError> {
        Ok(i16::from_be_bytes(self.array()?))
    }
    fn i32(&mut self) -> Result<i32, RecordError> {
        Ok(i32::from_be_bytes(self.array()?))
    }
    fn i64(&mut self) -> Result<i64, RecordError> {
        Ok(i64::from_be_bytes(self.array()?))
    }
    fn str(&mut self, len: usize) -> Result<String, RecordError> {
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| RecordError("string is not UTF-8".into()))
    }
    fn short_str(&mut self) -> Result<String, RecordError> {
        let len = self.i16()?;
        let len = usize::try_from(len).map_err(|_| RecordError(format!("string length {len}")))?;
        self.str(len)
    }
    fn end(&self) -> Result<(), RecordError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(RecordError(format!("{} trailing bytes", self.0.len())))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn round_trip() {
        let key = OffsetKey {
            group: "burnin".into(),
            topic: "kiln.nodes".into(),
            partition: 3,
        };
        assert_eq!(decode_key(&encode_key(&key).unwrap()).unwrap(), key);
        for metadata in [None, Some(String::new()), Some("ü meta".to_string())] {
            let value = Committed {
                offset: 42,
                leader_epoch: -1,
                metadata,
                commit_time_ms: 1_700_000_000_000,
                reset: true,
            };
            assert_eq!(decode_value(&encode_value(&value).unwrap()).unwrap(), value);
        }
    }

    #[test]
    fn truncated_or_padded_input_is_an_error() {
        let key = encode_key(&OffsetKey {
            group: "g".into(),
            topic: "t".into(),
            partition: 0,
        })
        .unwrap();
        for cut in 0..key.len() {
            assert!(decode_key(&key[..cut]).is_err(), "cut at {cut}");
        }
        let mut padded = key.to_vec();
        padded.push(0);
        assert!(decode_key(&padded).is_err());
        assert!(decode_value(&[0, 1, 0xff]).is_err());
        // A negative length other than -1 must not be taken as a huge one.
        let mut bad = vec![0, 1];
        bad.extend_from_slice(&[0; 12]);
        bad.extend_from_slice(&(-7i32).to_be_bytes());
        assert!(decode_value(&bad).is_err());
    }
}
