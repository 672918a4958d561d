//! The Raft log on disk. It is also the partition's only copy of the records: a data entry
//! holds the producer's batches, and reads serve them from here (see docs/replication.md).
//!
//! File format (`raft.log`): records `[len u32 BE][crc32c u32 BE][payload; len bytes]`, one per
//! entry, in index order. Payload: `term u64, 0 u64, index u64, kind u8`, then for
//! kind 1 (data) the batches, for kind 2 (membership) `configs u32, per config: n u32, n × u64,
//! nodes u32, n × u64`; kind 0 (blank) has nothing more. `vote` holds vote records in the same
//! framing (`term u64, has_node u8, node u64, committed u8`); the last valid one wins. Recovery keeps the
//! longest prefix of whole, CRC-valid, index-contiguous records and cuts the rest (a torn tail
//! from a crash is only ever unsynced data, which nobody acknowledged).
//!
//! Durability: `append` writes every entry, then awaits one `fdatasync` of the file, and only
//! then reports the entries flushed to openraft; `save_vote` and `truncate` return only after
//! their fsync.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, CommittedLeaderId, EntryPayload, LogState, Membership, OptionalSend, RaftLogReader,
    StorageIOError,
};

use crate::disk::Disk;
use crate::offsets::OffsetTranslator;
use crate::types::{Batches, Entry, KilnRaft, LogId, NodeId, StorageError, Vote};

const FRAME_HEADER: usize = 8;
const KIND_BLANK: u8 = 0;
const KIND_DATA: u8 = 1;
const KIND_MEMBERSHIP: u8 = 2;
/// Largest record accepted at recovery (a length field past it is a torn or corrupt header).
const MAX_RECORD_BYTES: usize = 64 << 20;

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_HEADER + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Splits `buf` into whole, CRC-valid frames; returns them with their start positions and the
/// length of the valid prefix.
fn unframe(buf: &[u8]) -> (Vec<(u64, &[u8])>, usize) {
    let mut out = Vec::new();
    let mut at = 0usize;
    while let Some(header) = buf.get(at..at + FRAME_HEADER) {
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let crc = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
        if len > MAX_RECORD_BYTES {
            break;
        }
        let Some(payload) = buf.get(at + FRAME_HEADER..at + FRAME_HEADER + len) else {
            break;
        };
        if crc32c::crc32c(payload) != crc {
            break;
        }
        out.push((at as u64, payload));
        at += FRAME_HEADER + len;
    }
    (out, at)
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let out = self.buf.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(out)
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u8(&mut self) -> Option<u8> {
        Some(*self.take(1)?.first()?)
    }
    fn rest(&mut self) -> &[u8] {
        let out = self.buf.get(self.at..).unwrap_or(&[]);
        self.at = self.buf.len();
        out
    }
}

/// Counts the records in already-validated batches.
pub fn record_count(batches: &[u8]) -> Result<u32, kiln_log::LogError> {
    let mut n: u32 = 0;
    for batch in kiln_log::batch::batches(batches) {
        let records = u32::try_from(batch?.header.record_count).unwrap_or(0);
        n = n.saturating_add(records);
    }
    Ok(n)
}

pub(crate) fn encode_entry(entry: &Entry) -> Vec<u8> {
    let mut p = Vec::with_capacity(32);
    encode_entry_payload(entry, &mut p);
    frame(&p)
}

/// Appends an entry's payload (a `raft.log` record without its framing) to `p`. The network
/// transport sends entries in this encoding too, so there is one entry format to keep right.
pub(crate) fn encode_entry_payload(entry: &Entry, p: &mut Vec<u8>) {
    p.extend_from_slice(&entry.log_id.leader_id.term.to_be_bytes());
    // With one leader per term the log id names the term only; the field is kept for a
    // format that also fits openraft's default (several leaders per term) mode.
    p.extend_from_slice(&0u64.to_be_bytes());
    p.extend_from_slice(&entry.log_id.index.to_be_bytes());
    match &entry.payload {
        EntryPayload::Blank => p.push(KIND_BLANK),
        EntryPayload::Normal(Batches(bytes)) => {
            p.push(KIND_DATA);
            p.extend_from_slice(bytes);
        }
        EntryPayload::Membership(m) => {
            p.push(KIND_MEMBERSHIP);
            let configs = m.get_joint_config();
            p.extend_from_slice(&(configs.len() as u32).to_be_bytes());
            for config in configs {
                p.extend_from_slice(&(config.len() as u32).to_be_bytes());
                for id in config {
                    p.extend_from_slice(&id.to_be_bytes());
                }
            }
            let nodes: Vec<NodeId> = m.nodes().map(|(id, _)| *id).collect();
            p.extend_from_slice(&(nodes.len() as u32).to_be_bytes());
            for id in nodes {
                p.extend_from_slice(&id.to_be_bytes());
            }
        }
    }
}

pub(crate) fn decode_entry(payload: &[u8]) -> Option<Entry> {
    let mut r = Reader {
        buf: payload,
        at: 0,
    };
    let term = r.u64()?;
    let node = r.u64()?;
    let index = r.u64()?;
    let log_id = LogId::new(CommittedLeaderId::new(term, node), index);
    let payload = match r.u8()? {
        KIND_BLANK => EntryPayload::Blank,
        KIND_DATA => EntryPayload::Normal(Batches(Bytes::copy_from_slice(r.rest()))),
        KIND_MEMBERSHIP => {
            let n = r.u32()? as usize;
            let mut configs = Vec::new();
            for _ in 0..n.min(16) {
                let k = r.u32()? as usize;
                let mut set = BTreeSet::new();
                for _ in 0..k.min(1024) {
                    set.insert(r.u64()?);
                }
                configs.push(set);
            }
            let k = r.u32()? as usize;
            let mut nodes = BTreeSet::new();
            for _ in 0..k.min(1024) {
                nodes.insert(r.u64()?);
            }
            EntryPayload::Membership(Membership::new(configs, nodes))
        }
        _ => return None,
    };
    Some(Entry { log_id, payload })
}

fn entry_records(entry: &Entry) -> u32 {
    match &entry.payload {
        EntryPayload::Normal(Batches(bytes)) => record_count(bytes).unwrap_or(0),
        _ => 0,
    }
}

fn encode_vote(vote: &Vote) -> Vec<u8> {
    let mut p = Vec::with_capacity(VOTE_BYTES);
    encode_vote_payload(vote, &mut p);
    frame(&p)
}

/// Length of an encoded vote (`term u64, has_node u8, node u64, committed u8`).
pub(crate) const VOTE_BYTES: usize = 18;

/// Appends a vote's payload (a `vote` record without its framing) to `p`; the network
/// transport uses the same encoding.
pub(crate) fn encode_vote_payload(vote: &Vote, p: &mut Vec<u8>) {
    p.extend_from_slice(&vote.leader_id.term.to_be_bytes());
    match vote.leader_id.voted_for {
        Some(node) => {
            p.push(1);
            p.extend_from_slice(&node.to_be_bytes());
        }
        None => {
            p.push(0);
            p.extend_from_slice(&0u64.to_be_bytes());
        }
    }
    p.push(u8::from(vote.committed));
}

pub(crate) fn decode_vote(payload: &[u8]) -> Option<Vote> {
    let mut r = Reader {
        buf: payload,
        at: 0,
    };
    let term = r.u64()?;
    let has_node = r.u8()? != 0;
    let node = r.u64()?;
    let committed = r.u8()? != 0;
    Some(Vote {
        leader_id: openraft::LeaderId {
            term,
            voted_for: has_node.then_some(node),
        },
        committed,
    })
}

/// What recovery found and cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogRecovery {
    pub entries: usize,
    pub cut_bytes: u64,
}

pub(crate) struct LogInner {
    disk: Arc<dyn Disk>,
    vote_disk: Arc<dyn Disk>,
    /// index → (entry, position of its record in the file).
    entries: BTreeMap<u64, (Entry, u64)>,
    end_pos: u64,
    translator: OffsetTranslator,
    vote: Option<Vote>,
    last_purged: Option<LogId>,
}

impl LogInner {
    pub(crate) fn translator(&self) -> &OffsetTranslator {
        &self.translator
    }

    pub(crate) fn entry(&self, index: u64) -> Option<&Entry> {
        self.entries.get(&index).map(|(e, _)| e)
    }
}

/// The Raft log store of one replica (cheap to clone; clones share the log).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

fn io_err(e: io::Error) -> AnyError {
    AnyError::new(&e)
}

impl LogStore {
    /// Opens the log on `disk` and the vote on `vote_disk`, recovering both: the valid,
    /// contiguous prefix is kept, anything after it is cut (and the cut is fsynced).
    pub async fn open(
        disk: Arc<dyn Disk>,
        vote_disk: Arc<dyn Disk>,
    ) -> io::Result<(LogStore, LogRecovery)> {
        let buf = disk.read_all()?;
        let (frames, valid) = unframe(&buf);
        let mut entries = BTreeMap::new();
        let mut translator = OffsetTranslator::new();
        let mut end_pos = 0u64;
        for (pos, payload) in frames {
            let Some(entry) = decode_entry(payload) else {
                break;
            };
            let index = entry.log_id.index;
            if translator.append(index, entry_records(&entry)).is_err() {
                break;
            }
            if let Some((&last, _)) = entries.iter().next_back() {
                if index != last + 1 {
                    translator.truncate_from(index);
                    break;
                }
            }
            end_pos = pos + (FRAME_HEADER + payload.len()) as u64;
            entries.insert(index, (entry, pos));
        }
        let _ = valid;
        let cut_bytes = buf.len() as u64 - end_pos;
        if cut_bytes > 0 {
            tracing::warn!(
                cut_bytes,
                kept_bytes = end_pos,
                "raft log: cutting a torn or invalid tail"
            );
            disk.truncate(end_pos)?;
            disk.sync().await?;
        }
        let vote_buf = vote_disk.read_all()?;
        let (vote_frames, vote_valid) = unframe(&vote_buf);
        let vote = vote_frames
            .iter()
            .rev()
            .find_map(|(_, payload)| decode_vote(payload));
        if vote_valid < vote_buf.len() {
            vote_disk.truncate(vote_valid as u64)?;
            vote_disk.sync().await?;
        }
        let recovery = LogRecovery {
            entries: entries.len(),
            cut_bytes,
        };
        let inner = LogInner {
            disk,
            vote_disk,
            entries,
            end_pos,
            translator,
            vote,
            last_purged: None,
        };
        Ok((
            LogStore {
                inner: Arc::new(Mutex::new(inner)),
            },
            recovery,
        ))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, LogInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The Kafka offset the next data entry will take (uncommitted entries included).
    pub fn log_end_offset(&self) -> i64 {
        self.lock().translator.next_offset()
    }

    /// The Kafka offset after every record at or below `raft_index`.
    pub fn offset_through(&self, raft_index: Option<u64>) -> i64 {
        self.lock().translator.next_offset_through(raft_index)
    }

    /// The last entry's log id.
    pub fn last_log_id(&self) -> Option<LogId> {
        self.lock()
            .entries
            .values()
            .next_back()
            .map(|(e, _)| e.log_id)
    }

    fn range_entries<RB: RangeBounds<u64>>(&self, range: RB) -> Vec<Entry> {
        let inner = self.lock();
        let start = match range.start_bound() {
            Bound::Included(&s) => Bound::Included(s),
            Bound::Excluded(&s) => Bound::Excluded(s),
            Bound::Unbounded => Bound::Unbounded,
        };
        let end = match range.end_bound() {
            Bound::Included(&s) => Bound::Included(s),
            Bound::Excluded(&s) => Bound::Excluded(s),
            Bound::Unbounded => Bound::Unbounded,
        };
        inner
            .entries
            .range((start, end))
            .map(|(_, (e, _))| e.clone())
            .collect()
    }
}

impl RaftLogReader<KilnRaft> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        Ok(self.range_entries(range))
    }
}

impl RaftLogStorage<KilnRaft> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<KilnRaft>, StorageError> {
        let inner = self.lock();
        let last = inner.entries.values().next_back().map(|(e, _)| e.log_id);
        Ok(LogState {
            last_purged_log_id: inner.last_purged,
            last_log_id: last.or(inner.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let sync = {
            let mut inner = self.lock();
            inner
                .vote_disk
                .append(&encode_vote(vote))
                .map_err(|e| StorageIOError::write_vote(io_err(e)))?;
            inner.vote = Some(*vote);
            inner.vote_disk.sync()
        };
        sync.await
            .map_err(|e| StorageIOError::write_vote(io_err(e)))?;
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.lock().vote)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<KilnRaft>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let sync = {
            let mut inner = self.lock();
            for entry in entries {
                let index = entry.log_id.index;
                let record = encode_entry(&entry);
                inner
                    .translator
                    .append(index, entry_records(&entry))
                    .map_err(|e| {
                        StorageIOError::write_log_entry(entry.log_id, AnyError::new(&e))
                    })?;
                inner
                    .disk
                    .append(&record)
                    .map_err(|e| StorageIOError::write_log_entry(entry.log_id, io_err(e)))?;
                let pos = inner.end_pos;
                inner.end_pos += record.len() as u64;
                inner.entries.insert(index, (entry, pos));
            }
            inner.disk.sync()
        };
        // Reported flushed only once the fsync covering every entry above has returned.
        let result = sync.await;
        callback.log_io_completed(result);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let sync = {
            let mut inner = self.lock();
            let index = log_id.index;
            let Some(&(_, pos)) = inner.entries.get(&index) else {
                return Ok(());
            };
            inner
                .disk
                .truncate(pos)
                .map_err(|e| StorageIOError::write_logs(io_err(e)))?;
            inner.end_pos = pos;
            inner.entries.split_off(&index);
            inner.translator.truncate_from(index);
            inner.disk.sync()
        };
        sync.await
            .map_err(|e| StorageIOError::write_logs(io_err(e)))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // Snapshots are never built (SnapshotPolicy::Never), so openraft never purges; if it
        // did, the entries would only leave memory (the file is not compacted yet).
        let mut inner = self.lock();
        let keep = inner.entries.split_off(&(log_id.index + 1));
        inner.entries = keep;
        inner.last_purged = Some(log_id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::disk::{FileDisk, SimDisk, SyncBehaviour};
    use std::time::Duration;

    fn lid(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    #[test]
    fn entries_round_trip_through_the_encoding() {
        let blank = Entry {
            log_id: lid(3, 7),
            payload: EntryPayload::Blank,
        };
        let data = Entry {
            log_id: lid(3, 8),
            payload: EntryPayload::Normal(Batches(Bytes::from_static(b"not parsed here"))),
        };
        let members = Entry {
            log_id: lid(1, 1),
            payload: EntryPayload::Membership(Membership::new(
                vec![BTreeSet::from([1, 2, 3])],
                BTreeSet::from([1, 2, 3, 4]),
            )),
        };
        for e in [blank, data, members] {
            let framed = encode_entry(&e);
            let (frames, valid) = unframe(&framed);
            assert_eq!(valid, framed.len());
            let back = decode_entry(frames[0].1).unwrap();
            assert_eq!(back.log_id, e.log_id);
            assert_eq!(format!("{:?}", back.payload), format!("{:?}", e.payload));
        }
        // Any truncation of a frame is not a frame.
        let framed = encode_entry(&Entry {
            log_id: lid(1, 2),
            payload: EntryPayload::Blank,
        });
        for cut in 0..framed.len() {
            assert_eq!(unframe(&framed[..cut]).0.len(), 0);
        }
    }

    async fn write(store: &LogStore, entries: Vec<Entry>) {
        let sync = {
            let mut inner = store.lock();
            for e in entries {
                let rec = encode_entry(&e);
                inner.disk.append(&rec).unwrap();
                let pos = inner.end_pos;
                inner.end_pos += rec.len() as u64;
                inner.translator.append(e.log_id.index, 0).unwrap();
                inner.entries.insert(e.log_id.index, (e, pos));
            }
            inner.disk.sync()
        };
        sync.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn recovery_cuts_a_torn_tail_and_keeps_synced_entries() {
        let disk = SimDisk::new(Duration::from_millis(1), SyncBehaviour::Honest);
        let vote = SimDisk::new(Duration::from_millis(1), SyncBehaviour::Honest);
        let (mut store, rec) = LogStore::open(Arc::new(disk.clone()), Arc::new(vote.clone()))
            .await
            .unwrap();
        assert_eq!(rec, LogRecovery::default());
        store.save_vote(&Vote::new(2, 1)).await.unwrap();
        let blanks = |r: std::ops::Range<u64>| {
            r.map(|i| Entry {
                log_id: lid(2, i),
                payload: EntryPayload::Blank,
            })
            .collect::<Vec<_>>()
        };
        write(&store, blanks(1..4)).await;
        // Written but not synced, then the power goes: a torn half of the next records stays.
        {
            let inner = store.lock();
            for e in blanks(4..6) {
                inner.disk.append(&encode_entry(&e)).unwrap();
            }
        }
        let disk2 = disk.crash(|extra| extra / 2 + 3);
        let vote2 = vote.crash(|_| 0);
        let (mut store2, rec) = LogStore::open(Arc::new(disk2.clone()), Arc::new(vote2))
            .await
            .unwrap();
        assert!(rec.entries >= 3 && rec.entries <= 4, "{rec:?}");
        assert!(rec.cut_bytes > 0);
        assert_eq!(store2.read_vote().await.unwrap(), Some(Vote::new(2, 1)));
        let got = store2.try_get_log_entries(1..).await.unwrap();
        assert_eq!(got.len(), rec.entries);
        assert_eq!(disk2.written_len(), disk2.synced_len(), "the cut is synced");
        // Truncation is durable once it returns.
        store2.truncate(lid(2, 2)).await.unwrap();
        let disk3 = disk2.crash(|_| 0);
        let vote3 = SimDisk::new(Duration::from_millis(1), SyncBehaviour::Honest);
        let (mut store3, _) = LogStore::open(Arc::new(disk3), Arc::new(vote3))
            .await
            .unwrap();
        let left = store3.try_get_log_entries(..).await.unwrap();
        assert_eq!(
            left.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            vec![1]
        );
    }

    #[tokio::test]
    async fn file_log_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let open = || async {
            LogStore::open(
                Arc::new(FileDisk::open(&dir.path().join("raft.log")).unwrap()),
                Arc::new(FileDisk::open(&dir.path().join("vote")).unwrap()),
            )
            .await
            .unwrap()
        };
        let (mut store, _) = open().await;
        store.save_vote(&Vote::new_committed(5, 2)).await.unwrap();
        write(
            &store,
            (1..=3)
                .map(|i| Entry {
                    log_id: lid(5, i),
                    payload: EntryPayload::Blank,
                })
                .collect(),
        )
        .await;
        drop(store);
        let (mut store, rec) = open().await;
        assert_eq!(rec.entries, 3);
        assert_eq!(
            store.read_vote().await.unwrap(),
            Some(Vote::new_committed(5, 2))
        );
        assert_eq!(store.last_log_id(), Some(lid(5, 3)));
    }
}
