//! `PartitionLog`: the public face of one partition's log. Appends, reads, timestamp lookups,
//! segment rolling and retention; durability lives in `flush`, recovery in `recovery`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{
    Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak,
};
use std::thread::JoinHandle;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::watch;

use crate::batch;
use crate::checkpoint::{self, Checkpoint};
use crate::flush::{self, Durability, FlushSignal};
use crate::recovery;
use crate::segment::{self, Pending, Segment};
use crate::{FlushPolicy, LogConfig, LogError};

/// Where an append landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    pub base_offset: i64,
    pub last_offset: i64,
    pub record_count: u64,
    pub max_timestamp: i64,
}

/// Whole batches, CRC-checked, and the offset to read next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadResult {
    pub records: Bytes,
    pub next_offset: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampLookup {
    pub batch_base_offset: i64,
    pub batch_max_timestamp: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    pub segments: usize,
    /// Bytes read and CRC-checked past the recovery checkpoint.
    pub scanned_bytes: u64,
    /// Bytes cut from a torn or corrupt tail, including deleted later segments.
    pub truncated_bytes: u64,
    pub next_offset: i64,
    pub elapsed: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionReport {
    pub segments_deleted: usize,
    pub bytes_deleted: u64,
    pub log_start_offset: i64,
}

/// One partition's log. Cheap to clone; all clones share the same log.
#[derive(Clone)]
pub struct PartitionLog {
    inner: Arc<Inner>,
}

/// What the append lock protects.
struct AppendState {
    active: Arc<Segment>,
    next_offset: i64,
}

struct Inner {
    dir: PathBuf,
    config: LogConfig,
    /// The append lock: held while writing to the active segment and while rolling.
    append: Mutex<AppendState>,
    /// Base offset -> segment. Readers clone an `Arc<Segment>` and do their I/O without locks.
    segments: RwLock<BTreeMap<i64, Arc<Segment>>>,
    log_start: AtomicI64,
    /// Stored after the segment's size, so a reader that sees an offset below it finds its bytes.
    log_end: AtomicI64,
    durability: Durability,
    /// The last checkpoint written. The mutex also serializes checkpoint writes.
    checkpoint: Mutex<Checkpoint>,
    signal: Arc<FlushSignal>,
    flusher: Mutex<Option<JoinHandle<()>>>,
    closed: AtomicBool,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn read_lock<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn write_lock<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

impl PartitionLog {
    /// Opens (creating if needed) the partition in `dir`, recovering it, and starts its flusher.
    pub fn open(dir: &Path, config: LogConfig) -> Result<(PartitionLog, RecoveryReport), LogError> {
        config.check().map_err(|reason| LogError::Io {
            op: "check log config",
            path: dir.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, reason),
        })?;
        let recovered = recovery::recover(dir, &config)?;
        let Some(active) = recovered.segments.last().cloned() else {
            return Err(LogError::io("recover", dir)(std::io::Error::other(
                "no active segment",
            )));
        };
        let log_start = recovered.segments.first().map_or(active.base, |s| s.base);
        let next_offset = active.next_offset();
        let policy = config.flush;
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            config,
            append: Mutex::new(AppendState {
                active,
                next_offset,
            }),
            segments: RwLock::new(
                recovered
                    .segments
                    .into_iter()
                    .map(|s| (s.base, s))
                    .collect(),
            ),
            log_start: AtomicI64::new(log_start),
            log_end: AtomicI64::new(next_offset),
            // Recovery fsynced everything it kept.
            durability: Durability::new(next_offset),
            checkpoint: Mutex::new(recovered.checkpoint),
            signal: Arc::new(FlushSignal::default()),
            flusher: Mutex::new(None),
            closed: AtomicBool::new(false),
        });
        // The flusher holds only a weak reference, so dropping every handle still drops the log.
        let weak: Weak<Inner> = Arc::downgrade(&inner);
        let mut last_synced = None;
        let name = format!(
            "kiln-flush-{}",
            dir.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        );
        let handle = flush::spawn_flusher(name, inner.signal.clone(), policy, move || {
            weak.upgrade()
                .is_some_and(|inner| inner.flush_step(&mut last_synced))
        })
        .map_err(LogError::io("spawn flusher thread", dir))?;
        *lock(&inner.flusher) = Some(handle);
        Ok((PartitionLog { inner }, recovered.report))
    }

    /// Validates every batch in `batches` (one or more concatenated RecordBatch v2, as a producer
    /// sends them) before writing any; stamps base offsets; appends. All or nothing.
    pub fn append(&self, batches: &[u8], now_ms: i64) -> Result<AppendInfo, LogError> {
        self.inner.append(batches, now_ms)
    }

    /// Resolves once every offset below `next_offset` is fsynced (EveryBatch) or at once (Interval).
    pub async fn wait_durable(&self, next_offset: i64) -> Result<(), LogError> {
        match self.inner.config.flush {
            FlushPolicy::EveryBatch => self.inner.durability.wait(next_offset).await,
            FlushPolicy::Interval(_) => self.inner.durability.check(),
        }
    }

    /// Whole batches starting with the one that holds `offset`, up to `max_bytes`, but always at
    /// least one whole batch when one exists below `max_offset` (exclusive; the broker passes the
    /// high watermark). Every batch is CRC-checked before it is returned; a bad one is an error,
    /// never served.
    pub fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        max_offset: i64,
    ) -> Result<ReadResult, LogError> {
        self.inner.read(offset, max_bytes, max_offset)
    }

    /// First batch whose max timestamp >= ts_ms (batch granularity; the broker refines to a record).
    pub fn lookup_timestamp(&self, ts_ms: i64) -> Result<Option<TimestampLookup>, LogError> {
        self.inner.check_not_closed()?;
        let segments: Vec<Arc<Segment>> =
            read_lock(&self.inner.segments).values().cloned().collect();
        for seg in segments {
            if seg.max_timestamp() < ts_ms {
                continue;
            }
            if let Some(h) = seg.find_timestamp(ts_ms, seg.size())? {
                return Ok(Some(TimestampLookup {
                    batch_base_offset: h.base_offset,
                    batch_max_timestamp: h.max_timestamp,
                }));
            }
        }
        Ok(None)
    }

    pub fn log_start_offset(&self) -> i64 {
        self.inner.log_start.load(Ordering::Acquire)
    }

    /// Next offset to assign.
    pub fn log_end_offset(&self) -> i64 {
        self.inner.log_end.load(Ordering::Acquire)
    }

    /// All offsets below are fsynced: the single-node high watermark.
    pub fn durable_offset(&self) -> i64 {
        self.inner.durability.durable()
    }

    /// Durable offset changes (fetch long poll).
    pub fn subscribe_durable(&self) -> watch::Receiver<i64> {
        self.inner.durability.subscribe()
    }

    pub fn size_bytes(&self) -> u64 {
        read_lock(&self.inner.segments)
            .values()
            .map(|s| s.size())
            .sum()
    }

    /// Deletes whole closed segments, oldest first, by age and by size. Never the active one.
    pub fn apply_retention(&self, now_ms: i64) -> Result<RetentionReport, LogError> {
        self.inner.apply_retention(now_ms)
    }

    /// Final fsync and checkpoint; stops the flusher thread. Later calls do nothing.
    pub fn close(&self) -> Result<(), LogError> {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.inner.shutdown()
    }
}

impl Inner {
    fn check_not_closed(&self) -> Result<(), LogError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(LogError::Closed);
        }
        Ok(())
    }

    fn append(&self, buf: &[u8], now_ms: i64) -> Result<AppendInfo, LogError> {
        // Validate everything before taking the lock or writing anything: all or nothing.
        let found = batch::validate_batches(buf)?;
        if buf.len() > i32::MAX as usize {
            return Err(LogError::InvalidBatch {
                position: 0,
                reason: format!("{} bytes in one append is too large", buf.len()),
            });
        }
        let record_count: u64 = found
            .iter()
            .map(|b| u64::from(b.header.last_offset_delta.unsigned_abs()) + 1)
            .sum();
        let max_timestamp = found
            .iter()
            .map(|b| b.header.max_timestamp)
            .max()
            .unwrap_or(i64::MIN);
        let mut owned = buf.to_vec();

        let mut st = lock(&self.append);
        self.check_not_closed()?;
        self.durability.check()?;
        if self.should_roll(&st, buf.len() as u64, record_count, now_ms) {
            self.roll(&mut st)?;
        }
        let base_offset = st.next_offset;
        let mut next = base_offset;
        let mut pending = Vec::with_capacity(found.len());
        for b in &found {
            let after = next
                .checked_add(i64::from(b.header.last_offset_delta) + 1)
                .filter(|&n| n - st.active.base <= i64::from(u32::MAX))
                .ok_or_else(|| LogError::InvalidBatch {
                    position: b.position,
                    reason: "too many records for one segment".to_string(),
                })?;
            let stamped = owned
                .get_mut(b.position..)
                .is_some_and(|rest| batch::set_base_offset(rest, next));
            debug_assert!(stamped, "validated batches hold a base offset field");
            pending.push(Pending {
                buf_pos: b.position,
                len: b.bytes.len(),
                base_offset: next,
                next_offset: after,
                max_timestamp: b.header.max_timestamp,
            });
            next = after;
        }
        match st.active.append(&owned, &pending, next, now_ms) {
            Ok(()) => {}
            Err(LogError::Poisoned(reason)) => {
                self.durability.poison(reason.clone());
                return Err(LogError::Poisoned(reason));
            }
            Err(e) => return Err(e),
        }
        debug_assert!(next > st.next_offset, "offsets only grow");
        st.next_offset = next;
        self.log_end.store(next, Ordering::Release);
        drop(st);
        if self.config.flush == FlushPolicy::EveryBatch {
            self.signal.notify();
        }
        Ok(AppendInfo {
            base_offset,
            last_offset: next - 1,
            record_count,
            max_timestamp,
        })
    }

    fn should_roll(&self, st: &AppendState, len: u64, records: u64, now_ms: i64) -> bool {
        let seg = &st.active;
        let size = seg.size();
        if size == 0 {
            return false;
        }
        let too_big = size + len > self.config.segment_bytes;
        let first = seg.first_append_ms();
        let too_old = first != i64::MIN
            && now_ms.saturating_sub(first)
                >= i64::try_from(self.config.segment_ms).unwrap_or(i64::MAX);
        // Relative offsets in the index are u32.
        let rel_end = (st.next_offset - seg.base)
            .unsigned_abs()
            .saturating_add(records);
        too_big || too_old || rel_end > u64::from(u32::MAX)
    }

    /// Closes the active segment and starts a new one. The old segment, its indexes and the
    /// directory are fsynced before the new segment takes writes, so everything before the new
    /// segment is durable and the checkpoint can move to its start.
    fn roll(&self, st: &mut AppendState) -> Result<(), LogError> {
        let old = st.active.clone();
        if let Err(e) = old.sync() {
            let reason = e.to_string();
            self.durability.poison(reason.clone());
            return Err(LogError::Poisoned(reason));
        }
        old.index.seal();
        old.index.persist()?;
        let created = Segment::create(&self.dir, st.next_offset, self.config.index_interval_bytes)
            .and_then(|seg| checkpoint::sync_dir(&self.dir).map(|()| seg));
        let new = match created {
            Ok(seg) => Arc::new(seg),
            Err(e) => {
                // Leave no stray file: an empty segment in the middle would break contiguity.
                if let Err(cleanup) = segment::remove_files(&self.dir, st.next_offset) {
                    tracing::warn!(error = %cleanup, "could not remove a half-created segment");
                }
                return Err(e);
            }
        };
        self.durability.publish(st.next_offset);
        write_lock(&self.segments).insert(new.base, new.clone());
        st.active = new.clone();
        let cp = Checkpoint {
            segment_base: new.base,
            position: 0,
            next_offset: new.base,
            max_timestamp: i64::MIN,
        };
        if let Err(e) = self.checkpoint(&new, cp, true) {
            // Not fatal: recovery falls back to an older checkpoint and scans more.
            tracing::warn!(error = %e, "could not write the recovery checkpoint after a roll");
        }
        Ok(())
    }

    /// One group commit: fsync everything written so far, publish it, maybe checkpoint.
    /// Returns false when the flusher should stop.
    fn flush_step(&self, last_synced: &mut Option<(i64, u64)>) -> bool {
        if self.durability.check().is_err() {
            return false;
        }
        let (seg, cp) = {
            let st = lock(&self.append);
            let seg = st.active.clone();
            let cp = Checkpoint {
                segment_base: seg.base,
                position: seg.size(),
                next_offset: st.next_offset,
                max_timestamp: seg.max_timestamp(),
            };
            (seg, cp)
        };
        if *last_synced == Some((cp.segment_base, cp.position)) {
            return true;
        }
        if let Err(e) = seg.sync() {
            self.durability.poison(e.to_string());
            return false;
        }
        *last_synced = Some((cp.segment_base, cp.position));
        self.durability.publish(cp.next_offset);
        if let Err(e) = self.checkpoint(&seg, cp, false) {
            tracing::warn!(error = %e, "could not write the recovery checkpoint");
        }
        true
    }

    /// Writes `cp` (which must describe fsynced data of `seg`) if it is newer than the last
    /// checkpoint and, unless forced, more than `checkpoint_interval_bytes` past it.
    fn checkpoint(&self, seg: &Segment, cp: Checkpoint, force: bool) -> Result<(), LogError> {
        let mut current = lock(&self.checkpoint);
        if !cp.is_after(&current) {
            return Ok(());
        }
        let behind = if current.segment_base == cp.segment_base {
            cp.position - current.position
        } else {
            u64::MAX
        };
        if !force && behind <= self.config.checkpoint_interval_bytes {
            return Ok(());
        }
        // The checkpoint vouches for the index entries before it: they go to disk first.
        seg.index.persist()?;
        checkpoint::write(&self.dir, &cp)?;
        *current = cp;
        Ok(())
    }

    fn read(&self, offset: i64, max_bytes: usize, max_offset: i64) -> Result<ReadResult, LogError> {
        self.check_not_closed()?;
        let log_end = self.log_end.load(Ordering::Acquire);
        let log_start = self.log_start.load(Ordering::Acquire);
        let out_of_range = || LogError::OffsetOutOfRange {
            requested: offset,
            log_start,
            log_end,
        };
        if offset < log_start || offset > log_end {
            return Err(out_of_range());
        }
        let empty = ReadResult {
            records: Bytes::new(),
            next_offset: offset,
        };
        if offset == log_end || offset >= max_offset {
            return Ok(empty);
        }
        let mut seg = read_lock(&self.segments)
            .range(..=offset)
            .next_back()
            .map(|(_, s)| s.clone())
            .ok_or_else(out_of_range)?;
        loop {
            let end = seg.size();
            if let Some((pos, header)) = seg.find_batch(offset, end)? {
                let (records, next_offset) =
                    seg.read_batches(pos, &header, max_bytes, max_offset, end)?;
                if records.is_empty() {
                    return Ok(empty);
                }
                return Ok(ReadResult {
                    records: Bytes::from(records),
                    next_offset,
                });
            }
            // `offset` is past this segment's end: it must start the next one.
            let next = read_lock(&self.segments)
                .range(seg.base.saturating_add(1)..)
                .next()
                .map(|(_, s)| s.clone());
            match next {
                Some(next) if next.base <= offset => seg = next,
                _ => return Err(out_of_range()),
            }
        }
    }

    fn apply_retention(&self, now_ms: i64) -> Result<RetentionReport, LogError> {
        self.check_not_closed()?;
        let cutoff = self
            .config
            .retention_ms
            .map(|ms| now_ms.saturating_sub(i64::try_from(ms).unwrap_or(i64::MAX)));
        let victims: Vec<Arc<Segment>> = {
            // The append lock keeps the active segment from changing under us.
            let st = lock(&self.append);
            let mut segments = write_lock(&self.segments);
            let mut total: u64 = segments.values().map(|s| s.size()).sum();
            let mut victims = Vec::new();
            for seg in segments.values() {
                if seg.base == st.active.base {
                    break;
                }
                let too_old = cutoff.is_some_and(|c| segment_time_ms(seg) < c);
                let too_big = self.config.retention_bytes.is_some_and(|max| total > max);
                if !(too_old || too_big) {
                    // Only a prefix goes, so the log stays contiguous from its start offset.
                    break;
                }
                total -= seg.size();
                victims.push(seg.clone());
            }
            for v in &victims {
                segments.remove(&v.base);
            }
            let start = segments.keys().next().copied().unwrap_or(st.active.base);
            debug_assert!(
                start >= self.log_start.load(Ordering::Acquire),
                "log start only grows"
            );
            self.log_start.store(start, Ordering::Release);
            victims
        };
        // Unlink outside the locks. Readers holding a victim keep reading its open file.
        let mut bytes_deleted = 0;
        for v in &victims {
            bytes_deleted += v.size();
            segment::remove_files(&self.dir, v.base)?;
        }
        if !victims.is_empty() {
            checkpoint::sync_dir(&self.dir)?;
            tracing::info!(dir = %self.dir.display(), segments = victims.len(), bytes_deleted, "retention deleted segments");
        }
        Ok(RetentionReport {
            segments_deleted: victims.len(),
            bytes_deleted,
            log_start_offset: self.log_start.load(Ordering::Acquire),
        })
    }

    /// Stops the flusher, then a final fsync and checkpoint. Wakes every waiter.
    fn shutdown(&self) -> Result<(), LogError> {
        self.signal.shutdown();
        if let Some(handle) = lock(&self.flusher).take() {
            // The last handle may be dropped by the flusher thread itself; it cannot join itself.
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
        let result = self.final_flush();
        self.durability.close();
        result
    }

    fn final_flush(&self) -> Result<(), LogError> {
        self.durability.check()?;
        let st = lock(&self.append);
        let seg = st.active.clone();
        if let Err(e) = seg.sync() {
            let reason = e.to_string();
            self.durability.poison(reason.clone());
            return Err(LogError::Poisoned(reason));
        }
        self.durability.publish(st.next_offset);
        seg.index.seal();
        let cp = Checkpoint {
            segment_base: seg.base,
            position: seg.size(),
            next_offset: st.next_offset,
            max_timestamp: seg.max_timestamp(),
        };
        self.checkpoint(&seg, cp, true)
    }
}

/// A segment's age for retention: its largest batch timestamp or, when batches carry none,
/// the file's modification time.
fn segment_time_ms(seg: &Segment) -> i64 {
    let ts = seg.max_timestamp();
    if ts >= 0 {
        return ts;
    }
    std::fs::metadata(seg.path())
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(i64::MIN, |d| {
            i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
        })
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Dropped without close(): still leave a clean checkpoint behind if we can.
        if !self.closed.swap(true, Ordering::AcqRel) {
            if let Err(e) = self.shutdown() {
                tracing::warn!(dir = %self.dir.display(), error = %e, "final flush on drop failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::segment::fault;

    /// A header-only batch (valid RecordBatch v2 framing with opaque record bytes).
    fn batch(records_len: usize, ts: i64) -> Vec<u8> {
        let mut b = vec![0u8; crate::BATCH_HEADER_LEN + records_len];
        let total = b.len() as i32;
        b[8..12].copy_from_slice(&(total - 12).to_be_bytes());
        b[16] = 2;
        b[35..43].copy_from_slice(&ts.to_be_bytes());
        b[57..61].copy_from_slice(&1i32.to_be_bytes());
        let crc = batch::compute_crc(&b).unwrap();
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    #[test]
    fn disk_full_write_is_cut_back_and_the_log_stays_usable() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = PartitionLog::open(dir.path(), LogConfig::default()).unwrap();
        let first = batch(100, 1);
        log.append(&first, 0).unwrap();
        let size = log.size_bytes();
        let segment = dir.path().join(format!("{:020}.log", 0));

        fault::fail_next_write_after(70);
        match log.append(&batch(500, 2), 0) {
            Err(LogError::DiskFull { path }) => assert_eq!(path, segment),
            other => panic!("expected DiskFull, got {other:?}"),
        }
        // No partial batch is left in the file, and offsets did not move.
        assert_eq!(std::fs::metadata(&segment).unwrap().len(), size);
        assert_eq!(log.log_end_offset(), 1);
        assert_eq!(log.size_bytes(), size);

        // Still usable: the next append lands right after the first batch.
        let third = batch(20, 3);
        let info = log.append(&third, 0).unwrap();
        assert_eq!(info.base_offset, 1);
        let r = log.read(0, 1 << 20, i64::MAX).unwrap();
        assert_eq!(r.records.len(), first.len() + third.len());
        assert_eq!(r.next_offset, 2);
        block_on(log.wait_durable(2)).unwrap();
        log.close().unwrap();
        let (log, report) = PartitionLog::open(dir.path(), LogConfig::default()).unwrap();
        assert_eq!((report.next_offset, report.truncated_bytes), (2, 0));
        assert_eq!(log.read(1, 1, i64::MAX).unwrap().records.len(), third.len());
    }

    #[test]
    fn poisoned_log_refuses_appends_and_wakes_waiters() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = PartitionLog::open(dir.path(), LogConfig::default()).unwrap();
        log.append(&batch(10, 1), 0).unwrap();
        block_on(log.wait_durable(1)).unwrap();
        // Stand-in for a failed fsync (which cannot be provoked portably).
        log.inner
            .durability
            .poison("fsync: EIO (injected)".to_string());
        assert!(matches!(
            log.append(&batch(10, 1), 0),
            Err(LogError::Poisoned(_))
        ));
        // Already durable: still fine. Not yet durable: Poisoned, not a hang.
        block_on(log.wait_durable(1)).unwrap();
        assert!(matches!(
            block_on(log.wait_durable(2)),
            Err(LogError::Poisoned(_))
        ));
        assert!(matches!(log.close(), Err(LogError::Poisoned(_))));
    }

    #[test]
    fn a_reader_holding_a_deleted_segment_keeps_reading() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            segment_bytes: 1000,
            retention_bytes: Some(1),
            ..LogConfig::default()
        };
        let (log, _) = PartitionLog::open(dir.path(), config).unwrap();
        for ts in 0..10 {
            log.append(&batch(300, ts), 0).unwrap();
        }
        // What `read` holds between finding the segment and doing its I/O.
        let held = read_lock(&log.inner.segments)
            .values()
            .next()
            .cloned()
            .unwrap();
        let report = log.apply_retention(0).unwrap();
        assert!(report.segments_deleted >= 3);
        assert!(!held.path().exists(), "unlinked");
        let end = held.size();
        let (pos, header) = held.find_batch(0, end).unwrap().unwrap();
        let (bytes, next) = held
            .read_batches(pos, &header, 1 << 20, i64::MAX, end)
            .unwrap();
        assert_eq!((bytes.len(), next), (2 * 361, 2));
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }
}
