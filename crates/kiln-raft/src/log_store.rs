//! The Raft log on disk. It is also the partition's only copy of the records: a data entry
//! holds the producer's batches, and reads serve them from here (see docs/replication.md).
//!
//! Two files: `raft.log`, one frame per entry, and `vote`, state records (the vote and the
//! repair guard), formats in `record.rs`. Recovery (`recovery.rs`) keeps the longest prefix of
//! whole, CRC-valid, index-contiguous entries and cuts the rest; a torn tail from a crash is
//! only ever unsynced data, which nobody acknowledged, but damage before the end is not, and
//! the replica then repairs from its peers before it votes again (`guard.rs`).
//!
//! Durability: `append` writes every entry, then awaits one `fdatasync` of the file, and only
//! then reports the entries flushed to openraft; `save_vote` and `truncate` return only after
//! their fsync. A full disk is waited out (`full_disk.rs`).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{AnyError, LogState, OptionalSend, RaftLogReader, StorageIOError};

use crate::disk::Disk;
use crate::full_disk::{append_durably, truncate_durably};
use crate::guard::{Guard, ReplicaHealth};
use crate::offsets::OffsetTranslator;
use crate::record::{encode_entry, encode_state_pair, entry_records, VoteState};
use crate::recovery::{scan_log, scan_vote, LogScan, LogTail, VoteScan};
use crate::types::{Entry, KilnRaft, LogId, StorageError, Vote};

pub use crate::record::record_count;
pub use crate::recovery::{DamageCause, LogDamage, LogRecovery, VoteRecovery};

pub(crate) struct LogInner {
    disk: Arc<dyn Disk>,
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

/// The `vote` file and its length. Writers take it in turn (openraft's `save_vote` and the
/// lifting of the guard), so a write cut back after a full disk never cuts another's record.
struct VoteFile {
    disk: Arc<dyn Disk>,
    len: u64,
}

/// The Raft log store of one replica (cheap to clone; clones share the log).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<LogInner>>,
    vote_file: Arc<tokio::sync::Mutex<VoteFile>>,
    health: ReplicaHealth,
}

fn io_err(e: io::Error) -> AnyError {
    AnyError::new(&e)
}

/// The recovery report, logged: damage at ERROR with its numbers, a torn tail at WARN.
fn report(scan: &LogScan, vote: &VoteScan, cut_bytes: u64, guard: Guard) {
    match scan.tail {
        LogTail::Clean => {}
        LogTail::Torn => tracing::warn!(
            cut_bytes,
            kept_bytes = scan.end,
            "raft log: cutting a torn tail (a write a crash cut short before its fsync)"
        ),
        LogTail::Damaged(d) => tracing::error!(
            cause = ?d.cause,
            at_byte = d.at_byte,
            first_lost_index = d.first_lost_index,
            highest_index_after = ?d.highest_index_after,
            frames_after = d.frames_after,
            cut_bytes,
            repair_until = ?guard.repair_until,
            repair_term = ?guard.repair_term,
            "raft log damaged: entries from index {} are lost (highest index seen after the \
             damage: {:?}); cutting {} bytes; no votes or candidacy until a leader has refilled \
             the log: applied through index {:?}, or an entry of a term after {:?}",
            d.first_lost_index,
            d.highest_index_after,
            cut_bytes,
            guard.repair_until,
            guard.repair_term
        ),
    }
    let v = vote.report;
    if v.latest_lost {
        tracing::error!(
            damaged_bytes = v.damaged_bytes,
            vote_floor = ?guard.vote_floor,
            "vote file damaged: the latest vote record is lost, so a vote this replica cast may \
             be forgotten; no votes or candidacy until it has followed a leader of term {:?} or \
             later",
            guard.vote_floor
        );
    } else if v.damaged_bytes > 0 {
        tracing::warn!(
            damaged_bytes = v.damaged_bytes,
            "vote file: damaged bytes before an intact copy of the latest record; nothing lost"
        );
    }
}

impl LogStore {
    /// Opens the log on `disk` and the vote on `vote_disk`, recovering both: the valid,
    /// contiguous prefix is kept, anything after it is cut (and the cut is fsynced). Damage
    /// sets the repair guard, which is made durable before any damaged byte is cut.
    pub async fn open(
        disk: Arc<dyn Disk>,
        vote_disk: Arc<dyn Disk>,
    ) -> io::Result<(LogStore, LogRecovery)> {
        let buf = disk.read_all()?;
        let scan = scan_log(&buf);
        let file_len = buf.len() as u64;
        drop(buf);
        let vote_buf = vote_disk.read_all()?;
        let vote = scan_vote(&vote_buf);
        let mut vote_len = vote_buf.len() as u64;
        drop(vote_buf);

        let persisted = vote.state.unwrap_or_default();
        let mut guard = persisted.guard;
        if let LogTail::Damaged(d) = scan.tail {
            // The highest term of the file's entries bounds the terms in which this replica's
            // acknowledgements counted towards a commit; where the damage hides the end of the
            // file, its vote's term does (unless the vote record is damaged too).
            let vote_term = persisted.vote.map(|v| v.leader_id.term);
            let term = d
                .highest_term
                .or(vote_term.filter(|_| !vote.report.latest_lost));
            guard = guard.merge(Guard::repair(d.highest_index_before(), term));
        }
        if vote.report.latest_lost {
            guard = guard.merge(Guard::vote_floor(vote.highest_term.unwrap_or(0)));
        }
        let health = ReplicaHealth::new(guard);
        let cut_bytes = file_len - scan.end as u64;
        report(&scan, &vote, cut_bytes, guard);
        if !persisted.guard.is_clear() && persisted.guard == guard {
            tracing::warn!(
                ?guard,
                "resuming the repair of a damaged replica: no votes until it is over"
            );
        }

        // The guard is durable before the damaged bytes go, so a crash in between cannot
        // leave a cut log and no record that it needs repair.
        if (vote.end as u64) < vote_len {
            truncate_durably(&vote_disk, vote.end as u64, &health).await?;
            vote_len = vote.end as u64;
        }
        if guard != persisted.guard {
            let bytes = encode_state_pair(&VoteState {
                vote: persisted.vote,
                guard,
            });
            append_durably(&vote_disk, vote_len, &bytes, &health).await?;
            vote_len += bytes.len() as u64;
        }
        if cut_bytes > 0 {
            truncate_durably(&disk, scan.end as u64, &health).await?;
        }

        let mut entries = BTreeMap::new();
        let mut translator = OffsetTranslator::new();
        for (pos, entry) in scan.entries {
            let index = entry.log_id.index;
            translator
                .append(index, entry_records(&entry))
                .map_err(io::Error::other)?;
            entries.insert(index, (entry, pos));
        }
        let recovery = LogRecovery {
            entries: entries.len(),
            cut_bytes,
            tail: scan.tail,
            vote: vote.report,
            guard,
        };
        let inner = LogInner {
            disk,
            entries,
            end_pos: scan.end as u64,
            translator,
            vote: persisted.vote,
            last_purged: None,
        };
        let store = LogStore {
            inner: Arc::new(Mutex::new(inner)),
            vote_file: Arc::new(tokio::sync::Mutex::new(VoteFile {
                disk: vote_disk,
                len: vote_len,
            })),
            health,
        };
        Ok((store, recovery))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, LogInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This replica's health: the repair guard and the disk-full flag.
    pub fn health(&self) -> ReplicaHealth {
        self.health.clone()
    }

    /// Clears the repair guard once it was met: the log is synced (it holds everything the
    /// replica applied), then a state record without the guard is made durable.
    pub(crate) async fn lift_guard(&self) -> io::Result<()> {
        let mut file = self.vote_file.lock().await;
        let log_disk = Arc::clone(&self.lock().disk);
        log_disk.sync().await?;
        let state = VoteState {
            vote: self.lock().vote,
            guard: Guard::default(),
        };
        let bytes = encode_state_pair(&state);
        append_durably(&file.disk, file.len, &bytes, &self.health).await?;
        file.len += bytes.len() as u64;
        self.health.set_guard(Guard::default());
        Ok(())
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
        let mut file = self.vote_file.lock().await;
        let state = VoteState {
            vote: Some(*vote),
            guard: self.health.guard(),
        };
        let bytes = encode_state_pair(&state);
        append_durably(&file.disk, file.len, &bytes, &self.health)
            .await
            .map_err(|e| StorageIOError::write_vote(io_err(e)))?;
        file.len += bytes.len() as u64;
        self.lock().vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        let vote = self.lock().vote;
        // openraft restores a replica whose committed vote names itself as leader at once, no
        // election. A damaged one must not lead: it may lack committed entries, and would
        // overwrite them on its followers. Uncommitted, the vote still binds it in its term.
        if self.health.guarded() {
            return Ok(vote.map(|v| Vote {
                leader_id: v.leader_id,
                committed: false,
            }));
        }
        Ok(vote)
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
        let (disk, start, bytes) = {
            let mut inner = self.lock();
            let start = inner.end_pos;
            let mut bytes = Vec::new();
            for entry in entries {
                let index = entry.log_id.index;
                inner
                    .translator
                    .append(index, entry_records(&entry))
                    .map_err(|e| {
                        StorageIOError::write_log_entry(entry.log_id, AnyError::new(&e))
                    })?;
                let pos = start + bytes.len() as u64;
                bytes.extend_from_slice(&encode_entry(&entry));
                inner.entries.insert(index, (entry, pos));
            }
            inner.end_pos = start + bytes.len() as u64;
            (Arc::clone(&inner.disk), start, bytes)
        };
        // Reported flushed only once the fsync covering every entry above has returned. Every
        // earlier write was synced before this call (openraft waits for each flush), so on a
        // full disk the file is cut back to `start` and these bytes written again.
        let result = append_durably(&disk, start, &bytes, &self.health).await;
        callback.log_io_completed(result);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let (disk, pos) = {
            let mut inner = self.lock();
            let index = log_id.index;
            let Some(&(_, pos)) = inner.entries.get(&index) else {
                return Ok(());
            };
            inner.end_pos = pos;
            inner.entries.split_off(&index);
            inner.translator.truncate_from(index);
            (Arc::clone(&inner.disk), pos)
        };
        truncate_durably(&disk, pos, &self.health)
            .await
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
    use crate::record::decode_entry;
    use crate::types::Batches;
    use bytes::Bytes;
    use openraft::{CommittedLeaderId, EntryPayload, Membership};
    use std::collections::BTreeSet;
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
            let scan = scan_log(&framed);
            assert_eq!(scan.end, framed.len());
            assert_eq!(scan.tail, LogTail::Clean);
            let back = decode_entry(&framed[8..]).unwrap();
            assert_eq!(back.log_id, e.log_id);
            assert_eq!(format!("{:?}", back.payload), format!("{:?}", e.payload));
        }
        // Any truncation of a frame is not a frame, and is a torn tail.
        let framed = encode_entry(&Entry {
            log_id: lid(1, 2),
            payload: EntryPayload::Blank,
        });
        for cut in 1..framed.len() {
            let scan = scan_log(&framed[..cut]);
            assert_eq!(
                (scan.entries.len(), scan.tail),
                (0, LogTail::Torn),
                "cut {cut}"
            );
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
        assert_eq!(
            rec.tail,
            LogTail::Torn,
            "unsynced bytes a crash tore need no repair"
        );
        assert!(!rec.repairing());
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

#[cfg(test)]
mod damage_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::disk::{SimDisk, SyncBehaviour};
    use crate::recovery::LogTail;
    use openraft::{CommittedLeaderId, EntryPayload};
    use std::time::Duration;

    fn disk() -> SimDisk {
        SimDisk::new(Duration::from_millis(1), SyncBehaviour::Honest)
    }

    async fn open(log: &SimDisk, vote: &SimDisk) -> (LogStore, LogRecovery) {
        LogStore::open(Arc::new(log.clone()), Arc::new(vote.clone()))
            .await
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn damage_is_remembered_until_the_repair_is_recorded() {
        let (log, vote) = (disk(), disk());
        let (mut store, _) = open(&log, &vote).await;
        store.save_vote(&Vote::new_committed(3, 2)).await.unwrap();
        for i in 0..6 {
            let entry = Entry {
                log_id: LogId::new(CommittedLeaderId::new(3, 0), i),
                payload: EntryPayload::Blank,
            };
            log.append(&encode_entry(&entry)).unwrap();
        }
        log.sync().await.unwrap();
        drop(store);
        // A flipped bit in entry 2 while the replica is down.
        let (log, vote) = (log.crash(|_| 0), vote.crash(|_| 0));
        log.rot(|b| b[3 * 33 - 5] ^= 0x20);
        let (mut store, rec) = open(&log, &vote).await;
        assert!(matches!(rec.tail, LogTail::Damaged(d) if d.first_lost_index == 2));
        assert_eq!(rec.entries, 2);
        assert_eq!(rec.guard.repair_until, Some(5));
        assert!(store.health().repairing(), "no metrics yet: repairing");
        // Uncommitted while repairing, so openraft does not restore it as leader.
        assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(3, 2)));
        // The cut log alone no longer shows the damage; the vote file still does.
        let (log, vote) = (log.crash(|_| 0), vote.crash(|_| 0));
        let (store, rec) = open(&log, &vote).await;
        assert_eq!(rec.tail, LogTail::Clean);
        assert_eq!(rec.guard.repair_until, Some(5));
        store.lift_guard().await.unwrap();
        assert!(!store.health().repairing());
        let (log, vote) = (log.crash(|_| 0), vote.crash(|_| 0));
        let (mut store, rec) = open(&log, &vote).await;
        assert!(!rec.repairing());
        assert_eq!(
            store.read_vote().await.unwrap(),
            Some(Vote::new_committed(3, 2))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_vote_record_sets_a_floor_that_survives_restarts() {
        let (log, vote) = (disk(), disk());
        let (mut store, _) = open(&log, &vote).await;
        store.save_vote(&Vote::new(4, 1)).await.unwrap();
        store.save_vote(&Vote::new(9, 3)).await.unwrap();
        drop(store);
        let (log, vote) = (log.crash(|_| 0), vote.crash(|_| 0));
        let len = vote.synced_len();
        // Both copies of the latest save damaged (one bad sector, say).
        vote.rot(|b| {
            b[len - 10] ^= 1;
            b[len - 10 - 46] ^= 1;
        });
        let (mut store, rec) = open(&log, &vote).await;
        assert!(rec.vote.latest_lost);
        assert_eq!(rec.guard.vote_floor, Some(4));
        assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(4, 1)));
        store.save_vote(&Vote::new(5, 2)).await.unwrap();
        drop(store);
        let (log, vote) = (log.crash(|_| 0), vote.crash(|_| 0));
        let (mut store, rec) = open(&log, &vote).await;
        assert!(!rec.vote.latest_lost);
        assert_eq!(
            rec.guard.vote_floor,
            Some(4),
            "the floor is in every later save"
        );
        assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(5, 2)));
    }
}
