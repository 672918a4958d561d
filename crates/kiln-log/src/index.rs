//! Sparse per-segment indexes, on disk and read on demand: the log holds none of their
//! entries in memory, so memory does not grow with the size of the data (the page cache keeps
//! the hot parts).
//!
//! `<index>.index`: one [`OffsetPoint`] (16 bytes: relative Kafka offset u32, relative Raft
//! index u32, file position u32, flags u32 with bit 0 "this batch starts its entry") per
//! `index_interval_bytes` of log, each at a batch boundary.
//! `<index>.timeindex`: one [`TimePoint`] (12 bytes: max timestamp so far i64, relative Kafka
//! offset u32) each time the segment's largest data-batch timestamp grows, at most one per
//! interval. A point (ts, rel) means: no data batch before the one holding `rel` has a
//! timestamp above `ts`.
//!
//! Points are appended as batches are written, without an fsync; they are trusted at recovery
//! only below the segment header's checkpoint (the index files are fsynced before a checkpoint
//! vouches for them) and rebuilt past it.

use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::fs::{Fs, FsFile};
use crate::LogError;

pub(crate) trait Point: Copy {
    const LEN: usize;
    fn encode(&self) -> Vec<u8>;
    fn decode(bytes: &[u8]) -> Option<Self>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OffsetPoint {
    pub rel_kafka: u32,
    pub rel_index: u32,
    pub pos: u32,
    pub starts_entry: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimePoint {
    pub ts: i64,
    pub rel_kafka: u32,
}

fn be<const N: usize>(bytes: &[u8], at: usize) -> Option<[u8; N]> {
    bytes.get(at..at + N)?.try_into().ok()
}

impl Point for OffsetPoint {
    const LEN: usize = 16;
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::LEN);
        out.extend_from_slice(&self.rel_kafka.to_be_bytes());
        out.extend_from_slice(&self.rel_index.to_be_bytes());
        out.extend_from_slice(&self.pos.to_be_bytes());
        out.extend_from_slice(&u32::from(self.starts_entry).to_be_bytes());
        out
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        Some(OffsetPoint {
            rel_kafka: u32::from_be_bytes(be(bytes, 0)?),
            rel_index: u32::from_be_bytes(be(bytes, 4)?),
            pos: u32::from_be_bytes(be(bytes, 8)?),
            starts_entry: u32::from_be_bytes(be(bytes, 12)?) & 1 == 1,
        })
    }
}

impl Point for TimePoint {
    const LEN: usize = 12;
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::LEN);
        out.extend_from_slice(&self.ts.to_be_bytes());
        out.extend_from_slice(&self.rel_kafka.to_be_bytes());
        out
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        Some(TimePoint {
            ts: i64::from_be_bytes(be(bytes, 0)?),
            rel_kafka: u32::from_be_bytes(be(bytes, 8)?),
        })
    }
}

/// One index file. `count` points are valid; readers see a point only after it was written.
pub(crate) struct IndexFile<P> {
    pub path: PathBuf,
    file: Arc<dyn FsFile>,
    count: AtomicU64,
    _point: PhantomData<P>,
}

impl<P: Point> IndexFile<P> {
    /// Opens (creating if missing) an index file. Its whole points count; a partial point at
    /// the end (a torn append) is ignored and cut by the next `truncate`.
    pub fn open(fs: &dyn Fs, path: PathBuf) -> Result<IndexFile<P>, LogError> {
        let file = fs
            .open(&path, true)
            .map_err(LogError::io("open index", &path))?;
        let len = file.len().map_err(LogError::io("stat index", &path))?;
        Ok(IndexFile {
            path,
            file,
            count: AtomicU64::new(len / P::LEN as u64),
            _point: PhantomData,
        })
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// Point `i`, read from the file.
    pub fn get(&self, i: u64) -> Result<Option<P>, LogError> {
        if i >= self.count() {
            return Ok(None);
        }
        let mut buf = vec![0u8; P::LEN];
        self.file
            .read_exact_at(&mut buf, i * P::LEN as u64)
            .map_err(LogError::io("read index", &self.path))?;
        Ok(P::decode(&buf))
    }

    pub fn last(&self) -> Result<Option<P>, LogError> {
        match self.count().checked_sub(1) {
            Some(i) => self.get(i),
            None => Ok(None),
        }
    }

    /// The last point for which `before` holds, given that `before` is true for a prefix of
    /// the points and false after (binary search, one read per step).
    pub fn floor(&self, before: impl Fn(&P) -> bool) -> Result<Option<P>, LogError> {
        let (mut lo, mut hi) = (0u64, self.count());
        let mut found = None;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.get(mid)? {
                Some(p) if before(&p) => {
                    found = Some(p);
                    lo = mid + 1;
                }
                Some(_) => hi = mid,
                None => break,
            }
        }
        Ok(found)
    }

    /// The number of leading points for which `keep` holds (same monotony as [`Self::floor`]).
    pub fn count_where(&self, keep: impl Fn(&P) -> bool) -> Result<u64, LogError> {
        let (mut lo, mut hi) = (0u64, self.count());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.get(mid)? {
                Some(p) if keep(&p) => lo = mid + 1,
                _ => hi = mid,
            }
        }
        Ok(lo)
    }

    /// Appends a point (the caller holds the append lock).
    pub fn push(&self, point: P) -> Result<(), LogError> {
        let n = self.count();
        self.file
            .write_all_at(&point.encode(), n * P::LEN as u64)
            .map_err(LogError::io("write index", &self.path))?;
        self.count.store(n + 1, Ordering::Release);
        Ok(())
    }

    /// Keeps the first `keep` points.
    pub fn truncate(&self, keep: u64) -> Result<(), LogError> {
        let keep = keep.min(self.count());
        self.count.store(keep, Ordering::Release);
        self.file
            .set_len(keep * P::LEN as u64)
            .map_err(LogError::io("truncate index", &self.path))
    }

    pub fn file(&self) -> &Arc<dyn FsFile> {
        &self.file
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fs::RealFs;

    #[test]
    fn points_are_found_by_binary_search_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.index");
        let idx = IndexFile::<OffsetPoint>::open(&RealFs, path.clone()).unwrap();
        for i in 0..100u32 {
            idx.push(OffsetPoint {
                rel_kafka: i * 10,
                rel_index: i,
                pos: 4096 + i * 100,
                starts_entry: i % 2 == 0,
            })
            .unwrap();
        }
        let p = idx.floor(|p| p.rel_kafka <= 455).unwrap().unwrap();
        assert_eq!((p.rel_kafka, p.rel_index, p.starts_entry), (450, 45, false));
        assert_eq!(idx.floor(|_| false).unwrap(), None);
        assert_eq!(idx.count_where(|p| p.pos < 4096 + 1000).unwrap(), 10);
        idx.truncate(10).unwrap();
        drop(idx);
        // A torn point at the end is ignored.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &[1, 2, 3]))
            .unwrap();
        let idx = IndexFile::<OffsetPoint>::open(&RealFs, path).unwrap();
        assert_eq!(idx.count(), 10);
        assert_eq!(idx.last().unwrap().unwrap().rel_index, 9);
    }
}
