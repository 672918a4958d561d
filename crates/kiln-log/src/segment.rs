//! One segment: `<first index>.log` (a [`crate::header`] and then stored batches) and its two
//! sparse indexes. Positional I/O only, so readers never contend with the appender for a
//! cursor; the size is published after the bytes are written, so a reader that stays below it
//! never sees a partial batch.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::batch::{self, BatchHeader, BATCH_HEADER_LEN};
use crate::fs::{Fs, FsFile};
use crate::header::{self, Mark, Slot, HEADER_LEN};
use crate::index::{IndexFile, OffsetPoint, TimePoint};
use crate::LogError;

/// Sequential reads (recovery scans, entry reads) go in chunks of this size.
pub(crate) const READ_CHUNK_BYTES: usize = 1 << 20;

pub(crate) fn log_path(dir: &Path, base_index: u64) -> PathBuf {
    dir.join(format!("{base_index:020}.log"))
}

pub(crate) fn index_paths(dir: &Path, base_index: u64) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{base_index:020}.index")),
        dir.join(format!("{base_index:020}.timeindex")),
    )
}

pub(crate) struct Segment {
    pub base_index: u64,
    pub base_kafka: i64,
    pub prev_term: u64,
    /// Made by [`crate::Log::reset`]: every slot of its header says so (see [`Slot::restart`]).
    pub restart: bool,
    pub path: PathBuf,
    pub file: Arc<dyn FsFile>,
    pub offsets: IndexFile<OffsetPoint>,
    pub times: IndexFile<TimePoint>,
    /// Where the whole entries end (size, next index and Kafka offset, last term). Published
    /// after the bytes are written.
    end: Mutex<Mark>,
    size: AtomicU64,
    /// Largest timestamp of any stored batch (retention's clock); `i64::MIN` for none.
    max_ts: AtomicI64,
    /// Largest data-batch timestamp that went into the time index; `i64::MIN` for none.
    pub time_index_max: AtomicI64,
    /// `now_ms` of the first append (or, recovered, the first batch's timestamp), for
    /// age-based rolling; `i64::MIN` while empty.
    first_append_ms: AtomicI64,
    /// The sequence number of the last header slot written.
    pub header_seq: AtomicU64,
}

/// One batch found while walking a segment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Walked {
    pub pos: u64,
    pub header: BatchHeader,
    /// Relative Raft index of the entry the batch belongs to.
    pub rel_index: u64,
    /// Whether the batch is the first of its entry.
    pub starts_entry: bool,
}

impl Segment {
    /// Creates a new segment file with a fresh header (not synced: the caller syncs the file
    /// and the directory before the segment is relied upon).
    pub fn create(
        fs: &dyn Fs,
        dir: &Path,
        base_index: u64,
        base_kafka: i64,
        prev_term: u64,
        restart: bool,
    ) -> Result<Segment, LogError> {
        let path = log_path(dir, base_index);
        let (index_path, time_path) = index_paths(dir, base_index);
        for p in [&index_path, &time_path] {
            fs.remove_file(p)
                .map_err(LogError::io("remove stale index", p))?;
        }
        let file = fs
            .open(&path, true)
            .map_err(LogError::io("create segment", &path))?;
        let len = file.len().map_err(LogError::io("stat segment", &path))?;
        if len != 0 {
            // Only if recovery left a stale file behind: never overwrite data.
            return Err(LogError::Io {
                op: "create segment",
                path,
                source: std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "segment file exists and is not empty",
                ),
            });
        }
        file.write_all_at(
            &header::initial(base_index, base_kafka, prev_term, restart),
            0,
        )
        .map_err(LogError::io("write segment header", &path))?;
        let offsets = IndexFile::open(fs, index_path)?;
        let times = IndexFile::open(fs, time_path)?;
        let end = Mark {
            len: HEADER_LEN,
            next_index: base_index,
            next_kafka: base_kafka,
            last_term: prev_term,
        };
        Ok(Segment::assemble(
            base_index, base_kafka, prev_term, restart, path, file, offsets, times, end, 1,
        ))
    }

    /// Opens an existing segment for recovery; its end is set by recovery.
    pub fn open(
        fs: &dyn Fs,
        dir: &Path,
        base_index: u64,
    ) -> Result<(Segment, Option<Slot>, u64), LogError> {
        let path = log_path(dir, base_index);
        let (index_path, time_path) = index_paths(dir, base_index);
        let file = fs
            .open(&path, false)
            .map_err(LogError::io("open segment", &path))?;
        let len = file.len().map_err(LogError::io("stat segment", &path))?;
        let mut head = vec![0u8; usize::try_from(len.min(HEADER_LEN)).unwrap_or(0)];
        file.read_exact_at(&mut head, 0)
            .map_err(LogError::io("read segment header", &path))?;
        let slot = header::read_best(&head);
        let offsets = IndexFile::open(fs, index_path)?;
        let times = IndexFile::open(fs, time_path)?;
        let (base_kafka, prev_term, restart, seq) = slot.map_or((0, 0, false, 1), |s| {
            (s.base_kafka, s.prev_term, s.restart, s.seq)
        });
        let end = Mark {
            len: HEADER_LEN,
            next_index: base_index,
            next_kafka: base_kafka,
            last_term: prev_term,
        };
        let seg = Segment::assemble(
            base_index, base_kafka, prev_term, restart, path, file, offsets, times, end, seq,
        );
        Ok((seg, slot, len))
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        base_index: u64,
        base_kafka: i64,
        prev_term: u64,
        restart: bool,
        path: PathBuf,
        file: Arc<dyn FsFile>,
        offsets: IndexFile<OffsetPoint>,
        times: IndexFile<TimePoint>,
        end: Mark,
        header_seq: u64,
    ) -> Segment {
        Segment {
            base_index,
            base_kafka,
            prev_term,
            restart,
            path,
            file,
            offsets,
            times,
            size: AtomicU64::new(end.len),
            end: Mutex::new(end),
            max_ts: AtomicI64::new(i64::MIN),
            time_index_max: AtomicI64::new(i64::MIN),
            first_append_ms: AtomicI64::new(i64::MIN),
            header_seq: AtomicU64::new(header_seq),
        }
    }

    /// Rebases a segment recovered with a damaged header on what the log around it says.
    pub fn with_base(mut self, base_kafka: i64, prev_term: u64) -> Segment {
        self.base_kafka = base_kafka;
        self.prev_term = prev_term;
        self.set_end(Mark {
            len: HEADER_LEN,
            next_index: self.base_index,
            next_kafka: base_kafka,
            last_term: prev_term,
        });
        self
    }

    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    pub fn end(&self) -> Mark {
        *self.end.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes a new end (after the bytes up to it are written).
    pub fn set_end(&self, end: Mark) {
        *self.end.lock().unwrap_or_else(|p| p.into_inner()) = end;
        self.size.store(end.len, Ordering::Release);
    }

    pub fn max_ts(&self) -> i64 {
        self.max_ts.load(Ordering::Acquire)
    }

    pub fn observe_ts(&self, ts: i64) {
        self.max_ts.fetch_max(ts, Ordering::AcqRel);
    }

    pub fn set_max_ts(&self, ts: i64) {
        self.max_ts.store(ts, Ordering::Release);
    }

    pub fn first_append_ms(&self) -> i64 {
        self.first_append_ms.load(Ordering::Relaxed)
    }

    pub fn set_first_append_ms(&self, ms: i64) {
        self.first_append_ms.store(ms, Ordering::Relaxed);
    }

    pub fn is_empty(&self) -> bool {
        self.size() <= HEADER_LEN
    }

    pub fn rel_index(&self, index: u64) -> Option<u32> {
        u32::try_from(index.checked_sub(self.base_index)?).ok()
    }

    pub fn rel_kafka(&self, offset: i64) -> Option<u32> {
        u32::try_from(offset.checked_sub(self.base_kafka)?).ok()
    }

    pub fn corrupt(&self, position: u64, reason: impl Into<String>) -> LogError {
        LogError::Corrupt {
            path: self.path.clone(),
            position,
            reason: reason.into(),
        }
    }

    /// Writes header slot `slot` (its sequence number picks the place).
    pub fn write_slot(&self, slot: &Slot) -> Result<(), LogError> {
        self.file
            .write_all_at(&slot.encode(), slot.position())
            .map_err(LogError::io("write segment header", &self.path))?;
        self.header_seq.fetch_max(slot.seq, Ordering::AcqRel);
        Ok(())
    }

    /// The next slot sequence number.
    pub fn next_seq(&self) -> u64 {
        self.header_seq.load(Ordering::Acquire) + 1
    }

    /// The next header slot of this segment, claiming `synced` durable and trusting what lies
    /// below `checkpoint`.
    pub fn slot(
        &self,
        synced: Mark,
        checkpoint: Mark,
        checkpoint_max_ts: i64,
        sealed: bool,
    ) -> Slot {
        Slot {
            seq: self.next_seq(),
            base_index: self.base_index,
            base_kafka: self.base_kafka,
            prev_term: self.prev_term,
            synced,
            checkpoint,
            checkpoint_max_ts,
            sealed,
            restart: self.restart,
        }
    }

    /// Reads `len` bytes at `pos`.
    pub fn read_at(&self, pos: u64, len: usize) -> Result<Vec<u8>, LogError> {
        let mut buf = vec![0u8; len];
        self.file
            .read_exact_at(&mut buf, pos)
            .map_err(LogError::io("read segment", &self.path))?;
        Ok(buf)
    }

    /// Reads and checks the header of the batch at `pos`, which must lie wholly below `end`.
    pub fn header_at(&self, pos: u64, end: u64) -> Result<BatchHeader, LogError> {
        if pos + BATCH_HEADER_LEN as u64 > end {
            return Err(self.corrupt(
                pos,
                format!("batch header cut off by the end of data at {end}"),
            ));
        }
        let buf = self.read_at(pos, BATCH_HEADER_LEN)?;
        let header = BatchHeader::parse(&buf)
            .map_err(|e| self.corrupt(pos, e.to_string()))?
            .from_stored()
            .map_err(|e| self.corrupt(pos, e))?;
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

    /// A walker over the batches from `pos`, which starts a batch of the entry with relative
    /// index `rel_index` (`starts_entry`: it is that entry's first batch), up to `end`.
    pub fn walker(&self, pos: u64, rel_index: u64, starts_entry: bool, end: u64) -> Walker<'_> {
        Walker {
            seg: self,
            pos,
            rel_index,
            starts_entry,
            last_term: None,
            end,
            chunk: Vec::new(),
            chunk_at: 0,
        }
    }

    /// A walker from the first batch of the entry with index `index` (which this segment must
    /// hold below `end`): found through the offset index, then by hopping batch headers.
    pub fn walker_at_index(&self, index: u64, end: u64) -> Result<Walker<'_>, LogError> {
        let rel = u64::from(
            self.rel_index(index)
                .ok_or_else(|| self.corrupt(0, format!("index {index} outside the segment")))?,
        );
        let point = if rel == 0 {
            None
        } else {
            self.offsets
                .floor(|p| u64::from(p.rel_index) < rel && u64::from(p.pos) < end)?
        };
        let mut w = match point {
            Some(p) => self.walker(
                u64::from(p.pos),
                u64::from(p.rel_index),
                p.starts_entry,
                end,
            ),
            None => self.walker(HEADER_LEN, 0, true, end),
        };
        loop {
            if w.rel_index == rel && w.starts_entry {
                return Ok(w);
            }
            if w.rel_index > rel || w.pos >= end {
                return Err(self.corrupt(w.pos, format!("no entry {index} where the index points")));
            }
            if w.next_header()?.is_none() {
                return Err(self.corrupt(w.pos, format!("entry {index} not found")));
            }
        }
    }

    /// A walker from the data batch holding Kafka `offset` (or the first data batch after it,
    /// past control batches), below `end`; `None` when the segment ends first.
    pub fn walker_at_kafka(&self, offset: i64, end: u64) -> Result<Option<Walker<'_>>, LogError> {
        let rel = self.rel_kafka(offset).unwrap_or(u32::MAX);
        let point = self
            .offsets
            .floor(|p| p.rel_kafka <= rel && u64::from(p.pos) < end)?;
        let mut w = match point {
            Some(p) => self.walker(
                u64::from(p.pos),
                u64::from(p.rel_index),
                p.starts_entry,
                end,
            ),
            None => self.walker(HEADER_LEN, 0, true, end),
        };
        loop {
            let Some(h) = w.peek()? else {
                return Ok(None);
            };
            if h.header.base_offset > offset && !h.header.is_control() {
                // The batch holding `offset` is gone (retention) or `offset` is past a gap.
                return Ok(Some(w));
            }
            if !h.header.is_control() && h.header.last_offset() >= offset {
                return Ok(Some(w));
            }
            w.next_header()?;
        }
    }
}

/// Hops batch headers forward through a segment, reading in chunks, tracking which entry each
/// batch belongs to (the [`batch::ENTRY_END`] flag closes an entry).
pub(crate) struct Walker<'a> {
    seg: &'a Segment,
    pub pos: u64,
    pub rel_index: u64,
    pub starts_entry: bool,
    /// Term of the last batch walked past (`None` before the first).
    pub last_term: Option<u64>,
    end: u64,
    chunk: Vec<u8>,
    chunk_at: u64,
}

impl Walker<'_> {
    /// Bytes `[pos, pos + len)` of the segment, from the chunk buffer when it holds them.
    pub fn bytes(&mut self, pos: u64, len: usize) -> Result<&[u8], LogError> {
        let want_end = pos + len as u64;
        let buffered = pos >= self.chunk_at && want_end <= self.chunk_at + self.chunk.len() as u64;
        if !buffered {
            let left = usize::try_from(self.end.saturating_sub(pos)).unwrap_or(usize::MAX);
            let n = len.max(READ_CHUNK_BYTES).min(left).max(len);
            self.chunk = self.seg.read_at(pos, n)?;
            self.chunk_at = pos;
        }
        let from = usize::try_from(pos - self.chunk_at).unwrap_or(usize::MAX);
        self.chunk
            .get(from..from + len)
            .ok_or_else(|| self.seg.corrupt(pos, "read past the buffered chunk"))
    }

    /// The batch at the walker's position, without moving; `None` at the end.
    pub fn peek(&mut self) -> Result<Option<Walked>, LogError> {
        if self.pos >= self.end {
            return Ok(None);
        }
        if self.pos + BATCH_HEADER_LEN as u64 > self.end {
            return Err(self
                .seg
                .corrupt(self.pos, "batch header cut off by the end of data"));
        }
        let (pos, end) = (self.pos, self.end);
        let head = self.bytes(pos, BATCH_HEADER_LEN)?;
        let header = BatchHeader::parse(head)
            .map_err(|e| self.seg.corrupt(pos, e.to_string()))?
            .from_stored()
            .map_err(|e| self.seg.corrupt(pos, e))?;
        if pos + header.total_len() as u64 > end {
            return Err(self.seg.corrupt(pos, "batch runs past the end of data"));
        }
        Ok(Some(Walked {
            pos,
            header,
            rel_index: self.rel_index,
            starts_entry: self.starts_entry,
        }))
    }

    /// The batch at the walker's position, moving past it.
    pub fn next_header(&mut self) -> Result<Option<Walked>, LogError> {
        let Some(w) = self.peek()? else {
            return Ok(None);
        };
        self.pos += w.header.total_len() as u64;
        self.last_term = Some(w.header.stored_term());
        if w.header.ends_entry() {
            self.rel_index += 1;
            self.starts_entry = true;
        } else {
            self.starts_entry = false;
        }
        Ok(Some(w))
    }

    /// The whole bytes of a batch found by [`Walker::peek`] / [`Walker::next_header`], CRC
    /// checked (corrupt data is never returned).
    pub fn batch_bytes(&mut self, w: &Walked) -> Result<Vec<u8>, LogError> {
        let len = w.header.total_len();
        let seg = self.seg;
        let bytes = self.bytes(w.pos, len)?.to_vec();
        batch::verify_crc(&bytes, 0).map_err(|e| seg.corrupt(w.pos, e.to_string()))?;
        Ok(bytes)
    }
}

/// Removes the files of the segment at `base_index`; returns the log file's size.
pub(crate) fn remove_files(fs: &dyn Fs, dir: &Path, base_index: u64) -> Result<u64, LogError> {
    let path = log_path(dir, base_index);
    let size = fs.open(&path, false).and_then(|f| f.len()).unwrap_or(0);
    let (index, time) = index_paths(dir, base_index);
    for p in [&path, &index, &time] {
        fs.remove_file(p)
            .map_err(LogError::io("delete segment file", p))?;
    }
    Ok(size)
}
