//! The `state` file of a replica: what its state machine has applied, so a restart neither
//! re-reads its log nor serves less than it had, and where its log starts.
//!
//! Layout (big-endian), replaced atomically (`kiln_log::fs::write_atomic`):
//! magic `KLNSTAT\x03`, `applied` (log id?), `log_start` (`flag u8`, last purged log id, Kafka
//! offset i64, and from version 3 the membership in effect there: its log id?, the
//! membership), membership (its log id?, the membership), `table` (`flag u8`, `len u32`,
//! bytes), `records_start` i64 (from version 2), then CRC32C u32 of everything before. A log
//! id? is `0u8` or `1u8, term u64, index u64`.
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

/// Version 3 adds the membership in effect at the log start; version 2 added `records_start`
/// after the table. Files of versions 1 and 2 still load: their groups never changed
/// membership (it came with version 3), so the one in effect at the log start is the current.
const MAGIC: &[u8; 8] = b"KLNSTAT\x03";
const MAGIC_V2: &[u8; 8] = b"KLNSTAT\x02";
const MAGIC_V1: &[u8; 8] = b"KLNSTAT\x01";
pub(crate) const STATE_FILE: &str = "state";
/// A table snapshot larger than this is refused on decode (a damaged length field).
const TABLE_BYTES_MAX: usize = 1 << 30;

/// Where a replica's log starts: everything up to `last_purged` is covered by the snapshot (a
/// data partition's snapshot is only this), and clients read from `kafka_offset` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogStart {
    pub last_purged: LogId,
    pub kafka_offset: i64,
    /// The membership in effect at `last_purged` (its entry at or before it): what a snapshot
    /// of this log start carries. A replica that installs the snapshot then appends the
    /// membership entries after it in order; a later membership here would run its
    /// configuration backwards.
    pub membership: StoredMembership<NodeId, EmptyNode>,
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
        match &self.log_start {
            None => p.push(0),
            Some(s) => {
                p.push(1);
                put_log_id(&mut p, Some(s.last_purged));
                p.extend_from_slice(&s.kafka_offset.to_be_bytes());
                put_log_id(&mut p, *s.membership.log_id());
                encode_membership(s.membership.membership(), &mut p);
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
            m if m == MAGIC => 3,
            m if m == MAGIC_V2 => 2,
            m if m == MAGIC_V1 => 1,
            _ => return Err("bad magic or version".into()),
        };
        let applied = get_log_id(&mut r).ok_or_else(bad)?;
        let log_start = match r.u8().ok_or_else(bad)? {
            0 => None,
            1 => {
                let last_purged = get_log_id(&mut r).flatten().ok_or_else(bad)?;
                let kafka_offset = r.i64().ok_or_else(bad)?;
                let membership = if version >= 3 {
                    let id = get_log_id(&mut r).ok_or_else(bad)?;
                    Some(StoredMembership::new(
                        id,
                        decode_membership(&mut r).ok_or_else(bad)?,
                    ))
                } else {
                    None
                };
                Some((last_purged, kafka_offset, membership))
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
        let membership = StoredMembership::new(membership_id, membership);
        let log_start = log_start.map(|(last_purged, kafka_offset, at)| LogStart {
            last_purged,
            kafka_offset,
            membership: at.unwrap_or_else(|| membership.clone()),
        });
        if let Some(ls) = &log_start {
            if ls
                .membership
                .log_id()
                .is_some_and(|m| m.index > ls.last_purged.index)
            {
                return Err(format!(
                    "the membership at the log start ({:?}) is past the log start ({:?})",
                    ls.membership.log_id(),
                    ls.last_purged
                ));
            }
        }
        Ok(GroupState {
            applied,
            log_start,
            membership,
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
                membership: StoredMembership::new(
                    Some(id(1, 0)),
                    Membership::new(vec![BTreeSet::from([1, 2, 3])], BTreeSet::from([1, 2, 3])),
                ),
            }),
            membership: StoredMembership::new(
                Some(id(2, 60)),
                Membership::new(vec![BTreeSet::from([1, 2, 4])], BTreeSet::from([1, 2, 4])),
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

        // Versions 1 and 2: no membership at the log start (the group's only membership was
        // in effect there), and version 1 has no records_start either.
        let old_layout = |magic: &[u8; 8], records_start: bool| {
            let mut p = Vec::new();
            p.extend_from_slice(magic);
            put_log_id(&mut p, state.applied);
            p.push(1);
            put_log_id(&mut p, Some(id(2, 40)));
            p.extend_from_slice(&1000i64.to_be_bytes());
            put_log_id(&mut p, Some(id(1, 0)));
            encode_membership(
                &Membership::new(vec![BTreeSet::from([1, 2, 3])], BTreeSet::from([1, 2, 3])),
                &mut p,
            );
            p.push(1);
            p.extend_from_slice(&5u32.to_be_bytes());
            p.extend_from_slice(b"table");
            if records_start {
                p.extend_from_slice(&1010i64.to_be_bytes());
            }
            let crc = crc32c::crc32c(&p);
            p.extend_from_slice(&crc.to_be_bytes());
            p
        };
        for (magic, records_start) in [(MAGIC_V1, false), (MAGIC_V2, true)] {
            let old = GroupState::decode(&old_layout(magic, records_start)).unwrap();
            assert_eq!(old.records_start, if records_start { 1010 } else { 0 });
            let ls = old.log_start.unwrap();
            assert_eq!(ls.last_purged, id(2, 40));
            assert_eq!(ls.membership, old.membership);
        }

        // A membership at the log start past the log start is damage.
        let mut bad = state.clone();
        if let Some(ls) = &mut bad.log_start {
            ls.membership = bad.membership.clone();
        }
        let err = GroupState::decode(&bad.encode()).unwrap_err();
        assert!(err.contains("past the log start"), "{err}");
    }
}
