//! Sparse per-segment indexes.
//!
//! `<base>.index`: entries (relative offset u32 BE, file position u32 BE), one per
//! `index_interval_bytes` of log, each pointing at the start of a batch.
//! `<base>.timeindex`: entries (max timestamp so far i64 BE, relative offset u32 BE), added when the
//! segment's max timestamp grows (at most one per interval, plus a final one when the segment is
//! sealed). An entry (ts, rel) means: no batch up to and including the one holding `rel` has a
//! timestamp above `ts`.
//!
//! Entries live in memory, which is authoritative while the log is open; the files are appended
//! lazily (`persist`, on checkpoint, roll and close). That is safe because recovery only trusts
//! the part of an index file that lies before the recovery checkpoint and rebuilds the rest.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

use crate::partition::{lock, read_lock, write_lock};
use crate::LogError;

pub(crate) trait Entry: Copy {
    const LEN: usize;
    fn encode(&self, out: &mut Vec<u8>);
    fn decode(bytes: &[u8]) -> Option<Self>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OffsetEntry {
    pub rel: u32,
    pub pos: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimeEntry {
    pub ts: i64,
    pub rel: u32,
}

fn be<const N: usize>(bytes: &[u8], at: usize) -> Option<[u8; N]> {
    bytes.get(at..at + N)?.try_into().ok()
}

impl Entry for OffsetEntry {
    const LEN: usize = 8;
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.rel.to_be_bytes());
        out.extend_from_slice(&self.pos.to_be_bytes());
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        Some(OffsetEntry {
            rel: u32::from_be_bytes(be(bytes, 0)?),
            pos: u32::from_be_bytes(be(bytes, 4)?),
        })
    }
}

impl Entry for TimeEntry {
    const LEN: usize = 12;
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.ts.to_be_bytes());
        out.extend_from_slice(&self.rel.to_be_bytes());
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        Some(TimeEntry {
            ts: i64::from_be_bytes(be(bytes, 0)?),
            rel: u32::from_be_bytes(be(bytes, 8)?),
        })
    }
}

/// One index file: entries in memory, the first `on_disk` of which are known to be in the file.
pub(crate) struct IndexFile<E> {
    path: PathBuf,
    file: File,
    entries: RwLock<Vec<E>>,
    /// Entries already written to the file. The mutex also serializes `persist`.
    on_disk: Mutex<usize>,
}

impl<E: Entry> IndexFile<E> {
    /// Opens (or creates) an index file and decodes it. `valid` is false when its size is not a
    /// multiple of the entry size; the entries are then empty and the index must be rebuilt.
    fn open(path: PathBuf) -> Result<(Self, bool), LogError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(LogError::io("open index", &path))?;
        let len = file
            .metadata()
            .map_err(LogError::io("stat index", &path))?
            .len();
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let mut entries = Vec::new();
        let valid = len % E::LEN == 0;
        if valid {
            let mut bytes = vec![0u8; len];
            file.read_exact_at(&mut bytes, 0)
                .map_err(LogError::io("read index", &path))?;
            entries = bytes.chunks_exact(E::LEN).filter_map(E::decode).collect();
        }
        let on_disk = if valid { entries.len() } else { 0 };
        let index = IndexFile {
            path,
            file,
            entries: RwLock::new(entries),
            on_disk: Mutex::new(on_disk),
        };
        if !valid {
            index.truncate(0)?;
        }
        Ok((index, valid))
    }

    fn push(&self, entry: E) {
        write_lock(&self.entries).push(entry);
    }

    fn last(&self) -> Option<E> {
        read_lock(&self.entries).last().copied()
    }

    fn with<R>(&self, f: impl FnOnce(&[E]) -> R) -> R {
        f(&read_lock(&self.entries))
    }

    /// Keeps the first `keep` entries, in memory and in the file (recovery only).
    fn truncate(&self, keep: usize) -> Result<(), LogError> {
        let mut on_disk = lock(&self.on_disk);
        let mut entries = write_lock(&self.entries);
        entries.truncate(keep);
        if *on_disk > entries.len() {
            *on_disk = entries.len();
        }
        self.file
            .set_len((*on_disk * E::LEN) as u64)
            .map_err(LogError::io("truncate index", &self.path))
    }

    /// Appends the entries not yet in the file and fsyncs it.
    fn persist(&self) -> Result<(), LogError> {
        let mut on_disk = lock(&self.on_disk);
        // Copy under the read lock, write without it, so appends adding entries never wait on I/O.
        let (bytes, count) = {
            let entries = read_lock(&self.entries);
            let mut bytes = Vec::new();
            for e in entries.iter().skip(*on_disk) {
                e.encode(&mut bytes);
            }
            (bytes, entries.len())
        };
        if count == *on_disk {
            return Ok(());
        }
        self.file
            .write_all_at(&bytes, (*on_disk * E::LEN) as u64)
            .map_err(LogError::io("write index", &self.path))?;
        self.file
            .sync_data()
            .map_err(LogError::io("fsync index", &self.path))?;
        *on_disk = count;
        Ok(())
    }
}

/// Running state for deciding when to add entries.
#[derive(Debug, Clone, Copy)]
struct Builder {
    bytes_since_offset_entry: u64,
    bytes_since_time_entry: u64,
    /// Largest batch max timestamp in the segment, `i64::MIN` for none.
    max_ts: i64,
    /// Relative offset of the batch that set `max_ts`.
    max_rel: u32,
}

/// Both sparse indexes of one segment.
pub(crate) struct SegmentIndex {
    offsets: IndexFile<OffsetEntry>,
    times: IndexFile<TimeEntry>,
    builder: Mutex<Builder>,
    interval: u64,
}

/// Paths of the index files of the segment at `base` in `dir`.
pub(crate) fn index_paths(dir: &Path, base: i64) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{base:020}.index")),
        dir.join(format!("{base:020}.timeindex")),
    )
}

impl SegmentIndex {
    /// Opens (or creates) the index files of a segment. The returned flag is false when either
    /// file had a size that is not a multiple of its entry size (both are then emptied).
    pub fn open(dir: &Path, base: i64, interval: u32) -> Result<(SegmentIndex, bool), LogError> {
        let (offset_path, time_path) = index_paths(dir, base);
        let (offsets, offsets_ok) = IndexFile::<OffsetEntry>::open(offset_path)?;
        let (times, times_ok) = IndexFile::<TimeEntry>::open(time_path)?;
        let max_ts = times.last().map_or(i64::MIN, |e| e.ts);
        let max_rel = times.last().map_or(0, |e| e.rel);
        let index = SegmentIndex {
            offsets,
            times,
            builder: Mutex::new(Builder {
                bytes_since_offset_entry: 0,
                bytes_since_time_entry: 0,
                max_ts,
                max_rel,
            }),
            interval: u64::from(interval),
        };
        Ok((index, offsets_ok && times_ok))
    }

    /// Records a batch appended at `pos` holding relative offsets from `rel`.
    pub fn observe(&self, rel: u32, pos: u32, len: u64, max_ts: i64) {
        let mut b = lock(&self.builder);
        if b.bytes_since_offset_entry >= self.interval && pos > 0 {
            debug_assert!(self
                .offsets
                .last()
                .is_none_or(|e| e.rel < rel && e.pos < pos));
            self.offsets.push(OffsetEntry { rel, pos });
            b.bytes_since_offset_entry = 0;
        }
        b.bytes_since_offset_entry += len;
        if max_ts > b.max_ts {
            b.max_ts = max_ts;
            b.max_rel = rel;
            if self.times.last().is_none() || b.bytes_since_time_entry >= self.interval {
                self.times.push(TimeEntry { ts: max_ts, rel });
                b.bytes_since_time_entry = 0;
            }
        }
        b.bytes_since_time_entry += len;
    }

    /// Adds a final time entry so that the time index records the segment's max timestamp
    /// (done when a segment is closed; recovery reads a closed segment's max from it).
    pub fn seal(&self) {
        let b = lock(&self.builder);
        if b.max_ts != i64::MIN && self.times.last().is_none_or(|e| e.ts < b.max_ts) {
            self.times.push(TimeEntry {
                ts: b.max_ts,
                rel: b.max_rel,
            });
        }
    }

    /// File position of the last indexed batch at or before relative offset `rel`.
    pub fn position_for(&self, rel: u32) -> u64 {
        self.offsets.with(|entries| {
            let n = entries.partition_point(|e| e.rel <= rel);
            n.checked_sub(1)
                .and_then(|i| entries.get(i))
                .map_or(0, |e| u64::from(e.pos))
        })
    }

    /// Relative offset after which the first batch with a timestamp >= `ts` must lie (or 0).
    pub fn rel_before_timestamp(&self, ts: i64) -> u32 {
        self.times.with(|entries| {
            let n = entries.partition_point(|e| e.ts < ts);
            n.checked_sub(1)
                .and_then(|i| entries.get(i))
                .map_or(0, |e| e.rel)
        })
    }

    pub fn max_timestamp(&self) -> i64 {
        lock(&self.builder).max_ts
    }

    pub fn last_offset_entry(&self) -> Option<OffsetEntry> {
        self.offsets.last()
    }

    /// Cheap validation of loaded entries: strictly increasing offsets and positions, every
    /// position inside the log file, timestamps strictly increasing, relative offsets not
    /// decreasing and below `rel_end` (the segment's next relative offset).
    pub fn is_consistent(&self, log_len: u64, rel_end: u64) -> bool {
        let offsets_ok = self.offsets.with(|entries| {
            entries
                .windows(2)
                .all(|w| w[0].rel < w[1].rel && w[0].pos < w[1].pos)
                && entries
                    .iter()
                    .all(|e| u64::from(e.pos) < log_len && u64::from(e.rel) < rel_end)
        });
        let times_ok = self.times.with(|entries| {
            entries
                .windows(2)
                .all(|w| w[0].ts < w[1].ts && w[0].rel <= w[1].rel)
                && entries.iter().all(|e| u64::from(e.rel) < rel_end)
        });
        offsets_ok && times_ok
    }

    /// Keeps only entries for batches before the byte position `pos` / relative offset `rel`,
    /// and restarts the running maximum at `max_ts` (recovery: the part past the checkpoint is
    /// rebuilt by scanning).
    pub fn keep_before(&self, pos: u64, rel: u64, max_ts: i64) -> Result<(), LogError> {
        let keep = self
            .offsets
            .with(|e| e.partition_point(|e| u64::from(e.pos) < pos));
        self.offsets.truncate(keep)?;
        let keep = self
            .times
            .with(|e| e.partition_point(|e| u64::from(e.rel) < rel));
        self.times.truncate(keep)?;
        let mut b = lock(&self.builder);
        let last = self.times.last();
        *b = Builder {
            bytes_since_offset_entry: 0,
            bytes_since_time_entry: 0,
            max_ts: last.map_or(i64::MIN, |e| e.ts).max(max_ts),
            max_rel: last.map_or(0, |e| e.rel),
        };
        Ok(())
    }

    /// Drops every entry, in memory and on disk (new segment, or an index about to be rebuilt).
    pub fn clear(&self) -> Result<(), LogError> {
        self.keep_before(0, 0, i64::MIN)
    }

    /// Writes the entries not yet on disk to both files and fsyncs them.
    pub fn persist(&self) -> Result<(), LogError> {
        self.offsets.persist()?;
        self.times.persist()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sparse_entries_lookup_and_reload() {
        let dir = tempfile::tempdir().unwrap();
        let (idx, ok) = SegmentIndex::open(dir.path(), 100, 100).unwrap();
        assert!(ok);
        // 10 batches of 60 bytes, 2 records each, timestamps 10, 20, .. but one going backwards.
        for i in 0..10u32 {
            let ts = if i == 5 { 1 } else { i64::from(i) * 10 };
            idx.observe(i * 2, i * 60, 60, ts);
        }
        assert_eq!(idx.position_for(0), 0);
        assert_eq!(idx.position_for(5), 120);
        assert_eq!(idx.position_for(19), 480);
        assert_eq!(idx.rel_before_timestamp(0), 0);
        assert_eq!(idx.max_timestamp(), 90);
        idx.seal();
        idx.persist().unwrap();
        let (again, ok) = SegmentIndex::open(dir.path(), 100, 100).unwrap();
        assert!(ok);
        assert!(again.is_consistent(600, 20));
        assert!(!again.is_consistent(400, 20));
        assert_eq!(again.position_for(19), 480);
        assert_eq!(again.max_timestamp(), 90);
        let rel = again.rel_before_timestamp(75);
        assert!(
            rel <= 14,
            "entry {rel} must not skip past the first batch with ts >= 75"
        );
    }

    #[test]
    fn odd_sized_file_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let (offset_path, _) = index_paths(dir.path(), 0);
        std::fs::write(&offset_path, [1, 2, 3]).unwrap();
        let (idx, ok) = SegmentIndex::open(dir.path(), 0, 10).unwrap();
        assert!(!ok);
        assert_eq!(idx.last_offset_entry(), None);
        assert_eq!(std::fs::metadata(&offset_path).unwrap().len(), 0);
    }
}
