//! One segment: `<base>.log` plus its sparse indexes. Positional I/O only (pwrite/pread), so
//! readers never contend with the appender for a file cursor.

use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::batch::{self, BatchHeader, BATCH_HEADER_LEN};
use crate::index::{index_paths, SegmentIndex};
use crate::LogError;

/// Recovery scans read the log in chunks of this size.
const SCAN_CHUNK: usize = 1 << 20;

pub(crate) fn log_path(dir: &Path, base: i64) -> PathBuf {
    dir.join(format!("{base:020}.log"))
}

/// A batch about to be appended: where it sits in the append buffer and what the index needs.
pub(crate) struct Pending {
    pub buf_pos: usize,
    pub len: usize,
    pub base_offset: i64,
    pub next_offset: i64,
    pub max_timestamp: i64,
}

/// Where a recovery scan stopped.
#[derive(Debug)]
pub(crate) struct ScanEnd {
    /// Position just past the last good batch.
    pub end: u64,
    /// Offset following the last good batch.
    pub next_offset: i64,
    /// Why the scan stopped before the end of the file, if it did.
    pub stop: Option<String>,
}

pub(crate) struct Segment {
    pub base: i64,
    path: PathBuf,
    file: File,
    /// Bytes of whole batches. Published (Release) only after they are written, so readers that
    /// stay below it never see a partial batch.
    size: AtomicU64,
    next_offset: AtomicI64,
    /// `now_ms` of the first append, for age-based rolling; `i64::MIN` while empty.
    first_append_ms: AtomicI64,
    pub index: SegmentIndex,
}

fn open_log(path: &Path) -> Result<File, LogError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(LogError::io("open segment", path))
}

impl Segment {
    /// Creates a new, empty segment (its index files start empty too).
    pub fn create(dir: &Path, base: i64, index_interval: u32) -> Result<Segment, LogError> {
        let path = log_path(dir, base);
        let file = open_log(&path)?;
        let len = file
            .metadata()
            .map_err(LogError::io("stat segment", &path))?
            .len();
        if len != 0 {
            // Only possible if recovery failed to remove a stale segment: never overwrite data.
            return Err(LogError::Io {
                op: "create segment",
                path,
                source: std::io::Error::new(
                    ErrorKind::AlreadyExists,
                    "segment file exists and is not empty",
                ),
            });
        }
        let (index, _) = SegmentIndex::open(dir, base, index_interval)?;
        index.clear()?;
        Ok(Segment::new(base, path, file, 0, index))
    }

    /// Opens an existing segment for recovery. Its size is the file's length and its next offset
    /// unknown until recovery sets it. The flag is false when an index file had a bad size.
    pub fn open(dir: &Path, base: i64, index_interval: u32) -> Result<(Segment, bool), LogError> {
        let path = log_path(dir, base);
        let file = open_log(&path)?;
        let len = file
            .metadata()
            .map_err(LogError::io("stat segment", &path))?
            .len();
        let (index, index_ok) = SegmentIndex::open(dir, base, index_interval)?;
        Ok((Segment::new(base, path, file, len, index), index_ok))
    }

    fn new(base: i64, path: PathBuf, file: File, size: u64, index: SegmentIndex) -> Segment {
        Segment {
            base,
            path,
            file,
            size: AtomicU64::new(size),
            next_offset: AtomicI64::new(base),
            first_append_ms: AtomicI64::new(i64::MIN),
            index,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    pub fn next_offset(&self) -> i64 {
        self.next_offset.load(Ordering::Acquire)
    }

    pub fn max_timestamp(&self) -> i64 {
        self.index.max_timestamp()
    }

    pub fn first_append_ms(&self) -> i64 {
        self.first_append_ms.load(Ordering::Relaxed)
    }

    /// Recovery: the segment ends at `next_offset`; its roll clock starts at `first_append_ms`.
    pub fn set_recovered(&self, next_offset: i64, first_append_ms: i64) {
        self.next_offset.store(next_offset, Ordering::Release);
        self.first_append_ms
            .store(first_append_ms, Ordering::Relaxed);
    }

    fn rel(&self, offset: i64) -> Option<u32> {
        u32::try_from(offset.checked_sub(self.base)?).ok()
    }

    /// Appends already stamped and validated batches at the end of the segment. The caller holds
    /// the append lock. On a failed write the file is cut back to where it was, so no partial
    /// batch remains; if even that fails the error is `Poisoned`.
    pub fn append(
        &self,
        buf: &[u8],
        batches: &[Pending],
        next_offset: i64,
        now_ms: i64,
    ) -> Result<(), LogError> {
        let pos = self.size();
        if let Err(e) = self.write_at(buf, pos) {
            if let Err(cut) = self.file.set_len(pos) {
                return Err(LogError::Poisoned(format!(
                    "write to {} failed ({e}) and cutting it back to {pos} failed too ({cut})",
                    self.path.display()
                )));
            }
            if e.kind() == ErrorKind::StorageFull {
                return Err(LogError::DiskFull {
                    path: self.path.clone(),
                });
            }
            return Err(LogError::io("write segment", &self.path)(e));
        }
        let mut expected = self.next_offset();
        for b in batches {
            debug_assert_eq!(b.base_offset, expected, "offsets only grow, without gaps");
            let (Some(rel), Ok(at)) = (
                self.rel(b.base_offset),
                u32::try_from(pos + b.buf_pos as u64),
            ) else {
                // The caller rolls before offsets or positions could overflow u32.
                debug_assert!(false, "batch outside the segment's u32 range");
                continue;
            };
            self.index.observe(rel, at, b.len as u64, b.max_timestamp);
            expected = b.next_offset;
        }
        debug_assert!(next_offset > self.next_offset(), "offsets only grow");
        self.next_offset.store(next_offset, Ordering::Release);
        if self.first_append_ms() == i64::MIN {
            self.first_append_ms.store(now_ms, Ordering::Relaxed);
        }
        self.size.store(pos + buf.len() as u64, Ordering::Release);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], pos: u64) -> std::io::Result<()> {
        #[cfg(test)]
        if let Some(keep) = fault::take_write_failure() {
            // Simulate a disk that fills up part way through the write.
            let part = buf.get(..keep.min(buf.len())).unwrap_or_default();
            self.file.write_all_at(part, pos)?;
            return Err(std::io::Error::from(ErrorKind::StorageFull));
        }
        self.file.write_all_at(buf, pos)
    }

    /// fdatasync: makes every byte written so far durable.
    /// fdatasync of the segment file, timed into the process-wide histogram (`stats`).
    pub fn sync(&self) -> Result<(), LogError> {
        let started = std::time::Instant::now();
        let result = self
            .file
            .sync_data()
            .map_err(LogError::io("fsync segment", &self.path));
        crate::stats::record_fsync(started.elapsed());
        result
    }

    fn corrupt(&self, position: u64, reason: impl Into<String>) -> LogError {
        LogError::Corrupt {
            path: self.path.clone(),
            position,
            reason: reason.into(),
        }
    }

    /// Reads and checks the header of the batch at `pos`, which must lie wholly below `end`.
    fn header_at(&self, pos: u64, end: u64) -> Result<BatchHeader, LogError> {
        if pos + BATCH_HEADER_LEN as u64 > end {
            return Err(self.corrupt(
                pos,
                format!("batch header cut off by the end of data at {end}"),
            ));
        }
        let mut buf = [0u8; BATCH_HEADER_LEN];
        self.file
            .read_exact_at(&mut buf, pos)
            .map_err(LogError::io("read segment", &self.path))?;
        let header = BatchHeader::parse(&buf).map_err(|e| self.corrupt(pos, e.to_string()))?;
        if pos + header.total_len() as u64 > end {
            return Err(self.corrupt(
                pos,
                format!(
                    "batch of {} bytes runs past the end of data at {end}",
                    header.total_len()
                ),
            ));
        }
        Ok(header)
    }

    /// Finds the batch holding `offset` below byte `end`: floor lookup in the sparse index, then
    /// hop batch headers. `None` when the segment ends first.
    pub fn find_batch(
        &self,
        offset: i64,
        end: u64,
    ) -> Result<Option<(u64, BatchHeader)>, LogError> {
        let rel = self.rel(offset).unwrap_or(u32::MAX);
        let mut pos = self.index.position_for(rel);
        while pos < end {
            let header = self.header_at(pos, end)?;
            if header.base_offset > offset {
                return Err(self.corrupt(
                    pos,
                    format!(
                        "batch starts at offset {} past the requested {offset}",
                        header.base_offset
                    ),
                ));
            }
            if header.last_offset() >= offset {
                return Ok(Some((pos, header)));
            }
            pos += header.total_len() as u64;
        }
        Ok(None)
    }

    /// Reads whole batches starting with `first` (at `pos`): up to `max_bytes`, but at least the
    /// first one, never a batch reaching `max_offset`, never past byte `end`. Every batch is
    /// CRC-checked; returns the bytes and the offset following them (`first.base_offset` if none).
    pub fn read_batches(
        &self,
        pos: u64,
        first: &BatchHeader,
        max_bytes: usize,
        max_offset: i64,
        end: u64,
    ) -> Result<(Vec<u8>, i64), LogError> {
        if first.last_offset() >= max_offset {
            return Ok((Vec::new(), first.base_offset));
        }
        let available = usize::try_from(end.saturating_sub(pos)).unwrap_or(usize::MAX);
        let want = max_bytes.min(available).max(first.total_len());
        let mut buf = vec![0u8; want];
        self.file
            .read_exact_at(&mut buf, pos)
            .map_err(LogError::io("read segment", &self.path))?;
        let mut at = 0usize;
        let mut next = first.base_offset;
        while let Some(rest) = buf.get(at..) {
            if rest.len() < BATCH_HEADER_LEN {
                break;
            }
            let here = pos + at as u64;
            let header = BatchHeader::parse(rest).map_err(|e| self.corrupt(here, e.to_string()))?;
            let Some(bytes) = rest.get(..header.total_len()) else {
                break; // the read window ends inside this batch
            };
            if header.base_offset != next {
                return Err(self.corrupt(
                    here,
                    format!("batch has offset {}, expected {next}", header.base_offset),
                ));
            }
            if header.last_offset() >= max_offset {
                break;
            }
            batch::verify_crc(bytes, 0).map_err(|e| self.corrupt(here, e.to_string()))?;
            at += bytes.len();
            next = header.next_offset();
        }
        debug_assert!(
            at >= first.total_len(),
            "the first batch is always returned"
        );
        buf.truncate(at);
        Ok((buf, next))
    }

    /// First batch below byte `end` whose max timestamp is >= `ts`.
    pub fn find_timestamp(&self, ts: i64, end: u64) -> Result<Option<BatchHeader>, LogError> {
        let rel = self.index.rel_before_timestamp(ts);
        let mut pos = self.index.position_for(rel);
        while pos < end {
            let header = self.header_at(pos, end)?;
            if header.max_timestamp >= ts {
                return Ok(Some(header));
            }
            pos += header.total_len() as u64;
        }
        Ok(None)
    }

    /// Header of the first batch, if any (recovery uses its timestamp to restart the roll clock).
    pub fn first_header(&self) -> Option<BatchHeader> {
        self.header_at(0, self.size()).ok()
    }

    /// Walks the batches from `from` (which holds offset `expected`) to the end of the file (or
    /// the first batch boundary at or past `until`), checking headers, contiguous offsets and,
    /// with `verify_crc`, every CRC. With `build_index` each good batch is added to the indexes.
    /// Stops at the first bad batch and says why.
    pub fn scan(
        &self,
        from: u64,
        expected: i64,
        until: u64,
        verify_crc: bool,
        build_index: bool,
    ) -> Result<ScanEnd, LogError> {
        let file_len = self.size();
        let mut reader = ChunkReader::new(&self.file, &self.path, file_len);
        let mut pos = from;
        let mut next = expected;
        let stop = loop {
            if pos >= file_len || pos >= until {
                break None;
            }
            let Some(head) = reader.get(pos, BATCH_HEADER_LEN)? else {
                break Some(format!("torn batch header: {} bytes left", file_len - pos));
            };
            let header = match BatchHeader::parse(head) {
                Ok(h) => h,
                Err(e) => break Some(e.to_string()),
            };
            let len = header.total_len();
            if pos + len as u64 > file_len {
                break Some(format!(
                    "torn batch: {len} bytes but only {} left in the file",
                    file_len - pos
                ));
            }
            if header.base_offset != next {
                break Some(format!(
                    "batch has offset {}, expected {next}",
                    header.base_offset
                ));
            }
            let (Some(rel), Ok(at)) = (self.rel(header.base_offset), u32::try_from(pos)) else {
                break Some("batch outside the segment's addressable range".to_string());
            };
            if verify_crc {
                let Some(bytes) = reader.get(pos, len)? else {
                    break Some("torn batch".to_string());
                };
                if let Err(e) = batch::verify_crc(bytes, 0) {
                    break Some(e.to_string());
                }
            }
            if build_index {
                self.index
                    .observe(rel, at, len as u64, header.max_timestamp);
            }
            pos += len as u64;
            next = header.next_offset();
        };
        Ok(ScanEnd {
            end: pos,
            next_offset: next,
            stop,
        })
    }

    /// Cuts the file back to `pos` and makes that durable (recovery only).
    pub fn truncate(&self, pos: u64) -> Result<(), LogError> {
        self.file
            .set_len(pos)
            .map_err(LogError::io("truncate segment", &self.path))?;
        self.file
            .sync_all()
            .map_err(LogError::io("fsync segment", &self.path))?;
        self.size.store(pos, Ordering::Release);
        Ok(())
    }
}

/// Removes the files of the segment at `base`; returns the size of its log file.
/// Readers still holding the segment keep reading: on Linux an unlinked file lives until closed.
pub(crate) fn remove_files(dir: &Path, base: i64) -> Result<u64, LogError> {
    let path = log_path(dir, base);
    let size = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let (index, timeindex) = index_paths(dir, base);
    for p in [&path, &index, &timeindex] {
        match fs::remove_file(p) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(LogError::io("delete segment file", p)(e)),
        }
    }
    Ok(size)
}

/// Sequential reads in large chunks, for recovery scans.
struct ChunkReader<'a> {
    file: &'a File,
    path: &'a Path,
    file_len: u64,
    buf: Vec<u8>,
    start: u64,
}

impl<'a> ChunkReader<'a> {
    fn new(file: &'a File, path: &'a Path, file_len: u64) -> Self {
        ChunkReader {
            file,
            path,
            file_len,
            buf: Vec::new(),
            start: 0,
        }
    }

    /// Bytes [pos, pos + len), or `None` when they run past the end of the file.
    fn get(&mut self, pos: u64, len: usize) -> Result<Option<&[u8]>, LogError> {
        let Some(end) = pos.checked_add(len as u64) else {
            return Ok(None);
        };
        if end > self.file_len {
            return Ok(None);
        }
        let buffered = pos >= self.start && end <= self.start + self.buf.len() as u64;
        if !buffered {
            let left = usize::try_from(self.file_len - pos).unwrap_or(usize::MAX);
            let want = len.max(SCAN_CHUNK).min(left);
            self.buf.resize(want, 0);
            self.file
                .read_exact_at(&mut self.buf, pos)
                .map_err(LogError::io("read segment", self.path))?;
            self.start = pos;
        }
        let from = usize::try_from(pos - self.start).unwrap_or(usize::MAX);
        Ok(self.buf.get(from..from.saturating_add(len)))
    }
}

/// Test-only fault injection: make the next segment write on this thread write only part of
/// its bytes and then fail with ENOSPC.
#[cfg(test)]
pub(crate) mod fault {
    use std::cell::Cell;

    thread_local! {
        static FAIL_AFTER: Cell<Option<usize>> = const { Cell::new(None) };
    }

    pub fn fail_next_write_after(bytes: usize) {
        FAIL_AFTER.with(|f| f.set(Some(bytes)));
    }

    pub(super) fn take_write_failure() -> Option<usize> {
        FAIL_AFTER.with(|f| f.take())
    }
}
