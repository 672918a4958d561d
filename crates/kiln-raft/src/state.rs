//! The `state` file of a replica: what its state machine has applied, so a restart neither
//! re-reads its log nor serves less than it had, and where its log starts.
//!
//! Layout (big-endian), replaced atomically (`kiln_log::fs::write_atomic`):
//! magic `KLNSTAT\x01`, `applied` (log id?), `log_start` (`flag u8`, last purged log id, Kafka
//! offset i64), membership (`flag u8`, its log id?, the membership), `table` (`len u32`, bytes),
//! then CRC32C u32 of everything before. A log id? is `0u8` or `1u8, term u64, index u64`.
//!
//! `applied` is never past what this replica's log holds synced (the caller makes sure), and
//! `log_start` is written before any entry it covers is purged. For a table group (offsets,
//! metadata) the file is also its snapshot: the table as of `applied`.

use std::path::Path;

use bytes::Bytes;
use kiln_log::fs::{self, Fs};
use openraft::{CommittedLeaderId, EmptyNode, StoredMembership};

use crate::record::{decode_membership, encode_membership, Reader};
use crate::types::{LogId, NodeId};

/// Version 2 adds `records_start` after the table; version 1 files (no such field) still load.
const MAGIC: &[u8; 8] = b"KLNSTAT\x02";
const MAGIC_V1: &[u8; 8] = b"KLNSTAT\x01";
pub(crate) const STATE_FILE: &str = "state";
/// A table snapshot larger than this is refused on decode (a damaged length field).
const TABLE_BYTES_MAX: usize = 1 << 30;

/// Where a replica's log starts: everything up to `last_purged` is covered by the snapshot (a
/// data partition's snapshot is only this), and clients read from `kafka_offset` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogStart {
    pub last_purged: LogId,
    pub kafka_offset: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupState {
    pub applied: Option<LogId>,
    pub log_start: Option<LogStart>,
    pub membership: StoredMembership<NodeId, EmptyNode>,
    /// A table group's table as of `applied`.
    pub table: Option<Bytes>,
    /// Where DeleteRecords says clients read from (0: never set); at or past `log_start`'s
    /// offset, and possibly inside an entry, so it is kept apart from the purge point.
    pub records_start: i64,
}

fn put_log_id(p: &mut Vec<u8>, id: Option<LogId>) {
    match id {
        None => p.push(0),
        Some(id) => {
            p.push(1);
            p.extend_from_slice(&id.leader_id.term.to_be_bytes());
            p.extend_from_slice(&id.index.to_be_bytes());
        }
    }
}

fn get_log_id(r: &mut Reader<'_>) -> Option<Option<LogId>> {
    match r.u8()? {
        0 => Some(None),
        1 => {
            let term = r.u64()?;
            let index = r.u64()?;
            Some(Some(LogId::new(CommittedLeaderId::new(term, 0), index)))
        }
        _ => None,
    }
}

impl GroupState {
    pub fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(64 + self.table.as_ref().map_or(0, Bytes::len));
        p.extend_from_slice(MAGIC);
        put_log_id(&mut p, self.applied);
        match self.log_start {
            None => p.push(0),
            Some(s) => {
                p.push(1);
                put_log_id(&mut p, Some(s.last_purged));
                p.extend_from_slice(&s.kafka_offset.to_be_bytes());
            }
        }
        put_log_id(&mut p, *self.membership.log_id());
        encode_membership(self.membership.membership(), &mut p);
        let table = self.table.as_deref().unwrap_or(&[]);
        p.push(u8::from(self.table.is_some()));
        p.extend_from_slice(&(table.len() as u32).to_be_bytes());
        p.extend_from_slice(table);
        p.extend_from_slice(&self.records_start.to_be_bytes());
        let crc = crc32c::crc32c(&p);
        p.extend_from_slice(&crc.to_be_bytes());
        p
    }

    pub fn decode(bytes: &[u8]) -> Result<GroupState, String> {
        let (body, crc) = bytes
            .split_last_chunk::<4>()
            .ok_or_else(|| "shorter than its checksum".to_string())?;
        if crc32c::crc32c(body) != u32::from_be_bytes(*crc) {
            return Err("checksum mismatch".into());
        }
        let mut r = Reader::new(body);
        let bad = || "malformed".to_string();
        let version = match r.take(8).ok_or_else(bad)? {
            m if m == MAGIC => 2,
            m if m == MAGIC_V1 => 1,
            _ => return Err("bad magic or version".into()),
        };
        let applied = get_log_id(&mut r).ok_or_else(bad)?;
        let log_start = match r.u8().ok_or_else(bad)? {
            0 => None,
            1 => {
                let last_purged = get_log_id(&mut r).flatten().ok_or_else(bad)?;
                let kafka_offset = r.i64().ok_or_else(bad)?;
                Some(LogStart {
                    last_purged,
                    kafka_offset,
                })
            }
            _ => return Err(bad()),
        };
        let membership_id = get_log_id(&mut r).ok_or_else(bad)?;
        let membership = decode_membership(&mut r).ok_or_else(bad)?;
        let has_table = r.u8().ok_or_else(bad)? == 1;
        let len = r.u32().ok_or_else(bad)? as usize;
        if len > TABLE_BYTES_MAX {
            return Err(format!("table of {len} bytes is over the limit"));
        }
        let table = r.take(len).ok_or_else(bad)?;
        let records_start = if version >= 2 {
            r.i64().ok_or_else(bad)?
        } else {
            0
        };
        if !r.done() {
            return Err("trailing bytes".into());
        }
        Ok(GroupState {
            applied,
            log_start,
            membership: StoredMembership::new(membership_id, membership),
            table: has_table.then(|| Bytes::copy_from_slice(table)),
            records_start,
        })
    }

    /// Reads `dir/state`; `Ok(None)` when there is none. A damaged file is an error: it is
    /// written atomically, so damage is damage, not a crash.
    pub fn load(fs: &dyn Fs, dir: &Path) -> std::io::Result<Option<GroupState>> {
        let path = dir.join(STATE_FILE);
        match fs::read_all(fs, &path)? {
            None => Ok(None),
            Some(bytes) => GroupState::decode(&bytes).map(Some).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            }),
        }
    }

    pub fn save(&self, fs: &dyn Fs, dir: &Path) -> std::io::Result<()> {
        fs::write_atomic(fs, &dir.join(STATE_FILE), &self.encode())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeSet;

    use openraft::Membership;

    use super::*;

    #[test]
    fn round_trips_and_refuses_damage() {
        let id = |t, i| LogId::new(CommittedLeaderId::new(t, 0), i);
        let state = GroupState {
            applied: Some(id(3, 99)),
            log_start: Some(LogStart {
                last_purged: id(2, 40),
                kafka_offset: 1000,
            }),
            membership: StoredMembership::new(
                Some(id(1, 0)),
                Membership::new(vec![BTreeSet::from([1, 2, 3])], BTreeSet::from([1, 2, 3])),
            ),
            table: Some(Bytes::from_static(b"table")),
            records_start: 1010,
        };
        let bytes = state.encode();
        assert_eq!(GroupState::decode(&bytes).unwrap(), state);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            assert!(GroupState::decode(&bad).is_err(), "flip at {i}");
        }
        assert!(GroupState::decode(&bytes[..10]).is_err());
        let empty = GroupState::default();
        assert_eq!(GroupState::decode(&empty.encode()).unwrap(), empty);

        // A version 1 file: the same fields without records_start.
        let mut v1 = bytes[..bytes.len() - 12].to_vec();
        v1[..8].copy_from_slice(MAGIC_V1);
        let crc = crc32c::crc32c(&v1);
        v1.extend_from_slice(&crc.to_be_bytes());
        let old = GroupState::decode(&v1).unwrap();
        assert_eq!(old.records_start, 0);
        assert_eq!(old.log_start, state.log_start);
    }
}
