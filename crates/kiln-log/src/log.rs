//! [`Log`]: one partition's Raft log, which is also its record store (docs/storage.md).
//!
//! A Raft entry is one or more stored batches: a data entry holds the producer's batches, a
//! Raft-only entry one control batch. Entries are appended without an fsync ([`Log::append`])
//! and made durable by [`Log::sync`]; clients read records by Kafka offset ([`Log::read`]), Raft
//! reads entries by index ([`Log::read_entries`]). The tail is cut at an entry boundary
//! ([`Log::truncate_from`]), the head by whole segments ([`Log::purge_through`]), and a log that
//! fell behind a snapshot starts over at its end ([`Log::reset`]).
//!
//! # Kafka offsets and Raft indexes
//!
//! Every entry takes one Raft index; only data records take Kafka offsets. So the two numberings
//! drift apart, and the log keeps the translation explicit rather than assumed:
//!
//! * a stored data batch's `baseOffset` is its Kafka offset; a control batch's is the Kafka
//!   offset of the next data record, and it takes none ([`crate::BatchHeader::kafka_records`]);
//! * each segment knows its first entry's index and Kafka offset (its header), and its sparse
//!   index maps both relative numbers to file positions, so either one finds a batch;
//! * an entry's index is counted from there by the entry-end flag of its batches.
//!
//! A worked example, as stored (index: content → Kafka offsets): 0: membership → none;
//! 1: blank (leader of term 1) → none; 2: 5 records → 0..5; 3: 1 record → 5..6; 4: blank (term
//! 2) → none; 5: 3 records → 6..9. The Kafka offset after entry 3 is 6, after entry 4 still 6;
//! a follower that truncates from 4 and takes a new leader's entries reuses offset 6 (never
//! committed, so never read by anyone). `tests/translation.rs` checks this and a model.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::batch::{self, BatchHeader, ControlKind, ProducerBatch, ENTRY_END, TERM_MAX};
use crate::fs::Fs;
use crate::header::{Mark, HEADER_LEN};
use crate::points::PointBuilder;
use crate::recovery::{self, RecoveryReport};
use crate::segment::{self, Segment};
use crate::{LogConfig, LogError};

/// What an entry to append holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryBody {
    /// One or more producer batches, validated by the caller (`batch::validate_batches`: every
    /// header and CRC); the log checks their headers again (and, in debug builds, their CRCs)
    /// and stamps their offsets and term. In place when the log holds the only reference to
    /// the bytes, on a copy otherwise: a producer's records are copied into memory once, on
    /// their way from the socket to the disk.
    Records(Bytes),
    /// A Raft-only entry, stored as one control batch.
    Control(ControlKind, Bytes),
}

/// One entry to append at `index`, written in `term`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEntry {
    pub index: u64,
    pub term: u64,
    pub body: EntryBody,
}

/// How much of an entry [`Log::read_entries`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// Everything, CRC checked.
    Full,
    /// Data entries as their record count and their idempotent producers' batch headers only
    /// (record bytes neither checked nor copied); control entries whole. For a state machine
    /// that only counts records and follows producers.
    Summary,
}

/// An entry as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEntry {
    pub index: u64,
    pub term: u64,
    /// Kafka offset of the first record (data), or of the next data record (control).
    pub kafka_offset: i64,
    pub body: StoredBody,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredBody {
    /// The batches as stored: offsets stamped, the epoch field holding the term and the
    /// entry-end flag.
    Records {
        batches: Bytes,
        record_count: u32,
    },
    /// [`ReadMode::Summary`] of a data entry: its record count, and the batches that carry a
    /// producer id, in order.
    Summary {
        record_count: u32,
        producers: Vec<ProducerBatch>,
    },
    Control {
        kind: ControlKind,
        payload: Bytes,
    },
}

impl StoredEntry {
    /// The Kafka offsets this entry's records take.
    pub fn kafka_records(&self) -> u32 {
        match &self.body {
            StoredBody::Records { record_count, .. } | StoredBody::Summary { record_count, .. } => {
                *record_count
            }
            StoredBody::Control { .. } => 0,
        }
    }
}

/// Whole data batches, CRC checked, ready for a client, and the offset to read next.
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

/// The end of the log: the next entry's index and Kafka offset, and the last entry's term.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tail {
    pub next_index: u64,
    pub next_kafka: i64,
    pub last_term: u64,
}

/// One segment, for retention decisions and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentInfo {
    pub base_index: u64,
    pub base_kafka: i64,
    pub next_index: u64,
    pub next_kafka: i64,
    pub size_bytes: u64,
    /// Largest batch timestamp, `i64::MIN` for none.
    pub max_timestamp: i64,
    /// The segment being appended to.
    pub active: bool,
}

/// What [`Log::purge_through`] removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeReport {
    pub segments_deleted: usize,
    pub bytes_deleted: u64,
}

/// One partition's log. Cheap to clone; all clones share it.
#[derive(Clone)]
pub struct Log {
    inner: Arc<Inner>,
}

struct AppendState {
    active: Arc<Segment>,
    points: PointBuilder,
    /// Segments rolled off since the last sync: fsynced and sealed by the next one.
    rolled: Vec<Arc<Segment>>,
    /// A segment file was created since the last sync (the directory needs one).
    dir_dirty: bool,
    /// When to roll and how sparse the index is: changeable while the log is open
    /// ([`Log::set_roll`]), so kept under the append lock rather than in `Inner::config`.
    roll: RollSettings,
}

/// The settings of [`LogConfig`] a topic may change at run time; they apply from the next
/// append on (a segment already larger than a new `segment_bytes` rolls at its next append).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RollSettings {
    pub segment_bytes: u64,
    pub segment_ms: u64,
    pub index_interval_bytes: u32,
}

/// What is known to be on disk, and what the active segment's header claims.
struct Durable {
    /// The segment these marks are about (the active one at the last sync).
    segment: u64,
    synced: Mark,
    claimed: Mark,
    checkpoint: Mark,
    checkpoint_max_ts: i64,
}

struct Inner {
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    config: LogConfig,
    /// Lock order: `append`, then `durable`, then `segments`.
    append: Mutex<AppendState>,
    durable: Mutex<Durable>,
    /// First index → segment. Readers clone an `Arc<Segment>` and do their I/O without locks.
    segments: RwLock<BTreeMap<u64, Arc<Segment>>>,
    /// The logical log start: reads below it are out of range (retention moves it, whole
    /// segments go later).
    log_start: AtomicI64,
    poisoned: Mutex<Option<String>>,
    is_poisoned: AtomicBool,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read_lock<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

fn write_lock<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// How a sync waits for each of its fsyncs: on the runtime's blocking pool (the file's own
/// [`FsFile::sync`](crate::fs::FsFile::sync)), or on the calling thread.
#[derive(Clone, Copy)]
enum Wait {
    Task,
    InPlace,
}

impl Wait {
    async fn sync(self, f: &Arc<dyn crate::fs::FsFile>) -> std::io::Result<()> {
        match self {
            Wait::Task => f.sync().await,
            Wait::InPlace => f.sync_now(),
        }
    }
}

/// Runs a sync made with [`Wait::InPlace`] to its end: nothing in it waits on anything else,
/// so its first poll finishes it.
fn in_place<T>(work: impl std::future::Future<Output = T>) -> T {
    let mut work = std::pin::pin!(work);
    match work
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(out) => out,
        std::task::Poll::Pending => {
            unreachable!("a sync in place waited on something (every fsync is made in place)")
        }
    }
}

fn min_mark(a: Mark, b: Mark) -> Mark {
    if a.len <= b.len {
        a
    } else {
        b
    }
}

impl Log {
    /// Opens (creating if needed) the log in `dir` and recovers it: a torn tail is cut, damage
    /// (synced data missing) is cut and reported (`RecoveryReport::tail`), and everything kept
    /// is fsynced before the segment header claims it.
    pub fn open(
        fs: Arc<dyn Fs>,
        dir: &Path,
        config: LogConfig,
    ) -> Result<(Log, RecoveryReport), LogError> {
        config.check().map_err(|reason| LogError::Io {
            op: "check log config",
            path: dir.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, reason),
        })?;
        let recovered = recovery::recover(fs.as_ref(), dir, &config)?;
        let active = recovered
            .segments
            .last()
            .cloned()
            .ok_or_else(|| LogError::Io {
                op: "recover",
                path: dir.to_path_buf(),
                source: std::io::Error::other("no segment after recovery"),
            })?;
        let end = active.end();
        let durable = Durable {
            segment: active.base_index,
            synced: end,
            claimed: end,
            checkpoint: end,
            checkpoint_max_ts: active.max_ts(),
        };
        let log_start = recovered.segments.first().map_or(0, |s| s.base_kafka);
        let roll = RollSettings {
            segment_bytes: config.segment_bytes,
            segment_ms: config.segment_ms,
            index_interval_bytes: config.index_interval_bytes,
        };
        let inner = Inner {
            fs,
            dir: dir.to_path_buf(),
            config,
            append: Mutex::new(AppendState {
                active,
                points: PointBuilder::default(),
                rolled: Vec::new(),
                dir_dirty: false,
                roll,
            }),
            durable: Mutex::new(durable),
            segments: RwLock::new(
                recovered
                    .segments
                    .into_iter()
                    .map(|s| (s.base_index, s))
                    .collect(),
            ),
            log_start: AtomicI64::new(log_start),
            poisoned: Mutex::new(None),
            is_poisoned: AtomicBool::new(false),
        };
        Ok((
            Log {
                inner: Arc::new(inner),
            },
            recovered.report,
        ))
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    fn check_poison(&self) -> Result<(), LogError> {
        if !self.inner.is_poisoned.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(LogError::Poisoned(
            lock(&self.inner.poisoned).clone().unwrap_or_default(),
        ))
    }

    /// The error for a failed fsync: a full disk is reported as such (the caller cuts back with
    /// [`Log::rewind_unsynced`] and writes again: after a failed fsync the kernel may have
    /// dropped the pages, so a retried fsync alone could claim data it lost); anything else
    /// poisons the log.
    fn sync_failed(&self, e: std::io::Error, what: &str) -> LogError {
        if crate::fs::is_disk_full(&e) {
            return LogError::DiskFull {
                path: PathBuf::from(what),
            };
        }
        self.poison(format!("fsync {what}: {e}"))
    }

    fn poison(&self, reason: String) -> LogError {
        tracing::error!(dir = %self.inner.dir.display(), %reason, "fsync failed; the log refuses writes until it is reopened");
        lock(&self.inner.poisoned).get_or_insert(reason.clone());
        self.inner.is_poisoned.store(true, Ordering::Release);
        LogError::Poisoned(reason)
    }

    /// The end of the log (written entries, synced or not).
    pub fn tail(&self) -> Tail {
        let end = lock(&self.inner.append).active.end();
        Tail {
            next_index: end.next_index,
            next_kafka: end.next_kafka,
            last_term: end.last_term,
        }
    }

    /// The end of what the last [`Log::sync`] made durable.
    pub fn durable_tail(&self) -> Tail {
        let d = lock(&self.inner.durable);
        Tail {
            next_index: d.synced.next_index,
            next_kafka: d.synced.next_kafka,
            last_term: d.synced.last_term,
        }
    }

    /// The index of the first entry the log holds (`tail().next_index` when it holds none),
    /// and the term of the entry before it (0: none).
    pub fn first(&self) -> (u64, u64) {
        let segments = read_lock(&self.inner.segments);
        segments
            .values()
            .next()
            .map_or((0, 0), |s| (s.base_index, s.prev_term))
    }

    /// The logical log start: the first Kafka offset a client may read.
    pub fn log_start_offset(&self) -> i64 {
        self.inner.log_start.load(Ordering::Acquire)
    }

    /// Moves the logical log start forward (retention, a snapshot); never back.
    pub fn advance_log_start(&self, offset: i64) {
        self.inner.log_start.fetch_max(offset, Ordering::AcqRel);
    }

    /// Changes when segments roll and the index density, from the next append on (topic
    /// configs altered at run time). Refuses what the on-disk format cannot hold.
    pub fn set_roll(&self, roll: RollSettings) -> Result<(), String> {
        let check = LogConfig {
            segment_bytes: roll.segment_bytes,
            segment_ms: roll.segment_ms,
            index_interval_bytes: roll.index_interval_bytes,
            ..self.inner.config.clone()
        };
        check.check()?;
        lock(&self.inner.append).roll = roll;
        Ok(())
    }

    pub fn roll_settings(&self) -> RollSettings {
        lock(&self.inner.append).roll
    }

    /// The next Kafka offset to assign (written records included, synced or not).
    pub fn log_end_offset(&self) -> i64 {
        self.tail().next_kafka
    }

    pub fn size_bytes(&self) -> u64 {
        read_lock(&self.inner.segments)
            .values()
            .map(|s| s.size())
            .sum()
    }

    pub fn segments(&self) -> Vec<SegmentInfo> {
        let active = lock(&self.inner.append).active.base_index;
        read_lock(&self.inner.segments)
            .values()
            .map(|s| {
                let end = s.end();
                SegmentInfo {
                    base_index: s.base_index,
                    base_kafka: s.base_kafka,
                    next_index: end.next_index,
                    next_kafka: end.next_kafka,
                    size_bytes: s.size(),
                    max_timestamp: s.max_ts(),
                    active: s.base_index == active,
                }
            })
            .collect()
    }

    /// Stamps and writes `entries` (indexes consecutive from the tail, terms not decreasing)
    /// after the tail, without an fsync, and returns each entry's bytes as stored. Records are
    /// stamped in place, so afterwards `entries` hold them as stored (which append again the
    /// same way, byte for byte). On an error nothing of the failed entry is visible; earlier
    /// entries of the call may be: [`Log::rewind_unsynced`] cuts back to the last sync.
    pub fn append(&self, entries: &mut [NewEntry], now_ms: i64) -> Result<Vec<Bytes>, LogError> {
        self.check_poison()?;
        let mut stored = Vec::with_capacity(entries.len());
        let mut st = lock(&self.inner.append);
        for entry in entries.iter_mut() {
            let end = st.active.end();
            if entry.index != end.next_index {
                return Err(LogError::OutOfOrder(format!(
                    "entry {} appended where entry {} is next",
                    entry.index, end.next_index
                )));
            }
            if entry.term < end.last_term || entry.term > TERM_MAX {
                return Err(LogError::OutOfOrder(format!(
                    "entry {} of term {} after term {} (terms must not decrease, at most {TERM_MAX})",
                    entry.index, entry.term, end.last_term
                )));
            }
            let (index, term) = (entry.index, entry.term);
            let (bytes, records) = stamp(entry, end.next_kafka, now_ms)?;
            if self.should_roll(&st, bytes.len() as u64, records, now_ms) {
                self.roll(&mut st)?;
            }
            self.write_entry(&mut st, index, term, &bytes, records, now_ms)?;
            stored.push(bytes);
        }
        Ok(stored)
    }

    fn should_roll(&self, st: &AppendState, len: u64, records: u64, now_ms: i64) -> bool {
        let seg = &st.active;
        if seg.is_empty() {
            return false;
        }
        let end = seg.end();
        let too_big = end.len + len > st.roll.segment_bytes;
        let first = seg.first_append_ms();
        let too_old = first != i64::MIN
            && now_ms.saturating_sub(first)
                >= i64::try_from(st.roll.segment_ms).unwrap_or(i64::MAX);
        // Relative indexes and Kafka offsets in the index are u32.
        let rel_kafka = (end.next_kafka - seg.base_kafka).unsigned_abs() + records;
        let rel_index = end.next_index - seg.base_index + 1;
        too_big || too_old || rel_kafka > u64::from(u32::MAX) || rel_index > u64::from(u32::MAX)
    }

    /// Starts a new segment at the tail. The old one is fsynced and sealed by the next sync.
    fn roll(&self, st: &mut AppendState) -> Result<(), LogError> {
        let end = st.active.end();
        let seg = Segment::create(
            self.inner.fs.as_ref(),
            &self.inner.dir,
            end.next_index,
            end.next_kafka,
            end.last_term,
            false,
        )
        .inspect_err(|_| {
            // Leave no stray file: an empty segment in the middle would break contiguity.
            if let Err(cleanup) =
                segment::remove_files(self.inner.fs.as_ref(), &self.inner.dir, end.next_index)
            {
                tracing::warn!(error = %cleanup, "could not remove a half-created segment");
            }
        })?;
        let seg = Arc::new(seg);
        let old = std::mem::replace(&mut st.active, seg.clone());
        st.rolled.push(old);
        st.dir_dirty = true;
        st.points = PointBuilder::default();
        write_lock(&self.inner.segments).insert(seg.base_index, seg);
        Ok(())
    }

    fn write_entry(
        &self,
        st: &mut AppendState,
        index: u64,
        term: u64,
        bytes: &[u8],
        records: u64,
        now_ms: i64,
    ) -> Result<(), LogError> {
        let seg = st.active.clone();
        let end = seg.end();
        if let Err(e) = seg.file.write_all_at(bytes, end.len) {
            if let Err(cut) = seg.file.set_len(end.len) {
                return Err(self.poison(format!(
                    "write to {} failed ({e}) and cutting it back to {} failed too ({cut})",
                    seg.path.display(),
                    end.len
                )));
            }
            return Err(LogError::io("write segment", &seg.path)(e));
        }
        let rel_index = index - seg.base_index;
        let mut at = 0usize;
        let mut first = true;
        for b in batch::batches(bytes) {
            let b = b?;
            let header = b
                .header
                .from_stored()
                .map_err(|e| seg.corrupt(end.len + at as u64, e))?;
            st.points.observe(
                &seg,
                &header,
                end.len + at as u64,
                rel_index,
                first,
                u64::from(st.roll.index_interval_bytes),
            )?;
            first = false;
            at += b.bytes.len();
        }
        debug_assert_eq!(at, bytes.len(), "stamped batches cover the entry");
        if seg.first_append_ms() == i64::MIN {
            seg.set_first_append_ms(now_ms);
        }
        seg.set_end(Mark {
            len: end.len + bytes.len() as u64,
            next_index: index + 1,
            next_kafka: end.next_kafka + records as i64,
            last_term: term,
        });
        Ok(())
    }

    /// Cuts the log back to what the last sync made durable (after a failed write or sync, so
    /// the entries can be written again).
    pub fn rewind_unsynced(&self) -> Result<(), LogError> {
        let st = lock(&self.inner.append);
        let d = lock(&self.inner.durable);
        let seg = st.active.clone();
        if d.segment != seg.base_index || !st.rolled.is_empty() {
            // A roll since the last sync: only whole new segments to drop. Rare; keep it simple
            // and exact by cutting each one.
            drop(d);
            drop(st);
            let target = self.durable_tail().next_index;
            return self.truncate_from(target);
        }
        let synced = d.synced;
        if seg.end().len == synced.len {
            return Ok(());
        }
        seg.file
            .set_len(synced.len)
            .map_err(LogError::io("cut back segment", &seg.path))?;
        let keep = seg.offsets.count_where(|p| u64::from(p.pos) < synced.len)?;
        seg.offsets.truncate(keep)?;
        let rel = seg.rel_kafka(synced.next_kafka).unwrap_or(u32::MAX);
        let keep = seg.times.count_where(|p| p.rel_kafka < rel)?;
        seg.times.truncate(keep)?;
        seg.set_end(synced);
        Ok(())
    }

    /// Makes everything written so far durable: the rolled-off segments are fsynced and sealed,
    /// the directory synced if a segment was created, then the active segment fsynced. Its
    /// header claims what the previous sync made durable (a claim is written only once true;
    /// [`Log::sync_header`] brings it up to date when no more writes come).
    pub async fn sync(&self) -> Result<(), LogError> {
        self.sync_with(Wait::Task).await
    }

    /// [`Log::sync`] with every fsync made on the calling thread (`fdatasync` in place, the
    /// simulated file's at once): for a thread that does nothing else, so one fsync follows the
    /// last without waiting for a runtime to schedule it. Never on a runtime worker.
    pub fn sync_in_place(&self) -> Result<(), LogError> {
        in_place(self.sync_with(Wait::InPlace))
    }

    async fn sync_with(&self, wait: Wait) -> Result<(), LogError> {
        self.check_poison()?;
        let (active, target, rolled, dir_dirty) = {
            let mut st = lock(&self.inner.append);
            let rolled = std::mem::take(&mut st.rolled);
            let dirty = std::mem::take(&mut st.dir_dirty);
            (st.active.clone(), st.active.end(), rolled, dirty)
        };
        for seg in &rolled {
            self.seal(seg, wait).await?;
        }
        if dir_dirty {
            self.inner
                .fs
                .sync_dir(&self.inner.dir)
                .map_err(|e| self.poison(format!("fsync {}: {e}", self.inner.dir.display())))?;
        }
        self.write_claim(&active)?;
        if let Err(e) = wait.sync(&active.file).await {
            return Err(self.sync_failed(e, &active.path.display().to_string()));
        }
        let checkpoint_due = {
            let mut d = lock(&self.inner.durable);
            if d.segment != active.base_index {
                let start = Mark {
                    len: HEADER_LEN,
                    next_index: active.base_index,
                    next_kafka: active.base_kafka,
                    last_term: active.prev_term,
                };
                *d = Durable {
                    segment: active.base_index,
                    synced: start,
                    claimed: start,
                    checkpoint: start,
                    checkpoint_max_ts: i64::MIN,
                };
            }
            if target.len > d.synced.len {
                d.synced = target;
            }
            d.synced.len - d.checkpoint.len >= self.inner.config.checkpoint_interval_bytes
        };
        if checkpoint_due {
            // The checkpoint vouches for the index files below it: they go to disk first.
            for f in [active.offsets.file(), active.times.file()] {
                if let Err(e) = wait.sync(f).await {
                    tracing::warn!(error = %e, "could not fsync an index file; the checkpoint waits");
                    return Ok(());
                }
            }
            let mut d = lock(&self.inner.durable);
            if d.segment == active.base_index && target.len >= d.checkpoint.len {
                d.checkpoint = min_mark(target, d.synced);
                d.checkpoint_max_ts = active.max_ts();
            }
        }
        Ok(())
    }

    /// Writes a header slot of `seg` claiming what is durable now, if that is more than it
    /// claims (under the durable lock, so slots are written in claim order).
    fn write_claim(&self, seg: &Segment) -> Result<(), LogError> {
        let mut d = lock(&self.inner.durable);
        if d.segment != seg.base_index || d.claimed == d.synced {
            return Ok(());
        }
        let slot = seg.slot(d.synced, d.checkpoint, d.checkpoint_max_ts, false);
        seg.write_slot(&slot)?;
        d.claimed = d.synced;
        Ok(())
    }

    /// True when the active segment's header claims less than is durable: an idle log should
    /// call [`Log::sync_header`] soon, so damage to its last synced entries is recognised.
    pub fn header_behind(&self) -> bool {
        let d = lock(&self.inner.durable);
        d.claimed != d.synced
    }

    /// Brings the active segment's header claim up to what is durable, and fsyncs it.
    pub async fn sync_header(&self) -> Result<(), LogError> {
        self.sync_header_with(Wait::Task).await
    }

    /// [`Log::sync_header`] with its fsync on the calling thread (see [`Log::sync_in_place`]).
    pub fn sync_header_in_place(&self) -> Result<(), LogError> {
        in_place(self.sync_header_with(Wait::InPlace))
    }

    async fn sync_header_with(&self, wait: Wait) -> Result<(), LogError> {
        self.check_poison()?;
        let active = lock(&self.inner.append).active.clone();
        self.write_claim(&active)?;
        wait.sync(&active.file)
            .await
            .map_err(|e| self.sync_failed(e, &active.path.display().to_string()))
    }

    /// Seals a rolled-off segment: its data and indexes fsynced, then a slot saying it is
    /// whole, fsynced too.
    async fn seal(&self, seg: &Segment, wait: Wait) -> Result<(), LogError> {
        for f in [&seg.file, seg.offsets.file(), seg.times.file()] {
            if let Err(e) = wait.sync(f).await {
                return Err(self.sync_failed(e, &f.describe()));
            }
        }
        let end = seg.end();
        let slot = seg.slot(end, end, seg.max_ts(), true);
        seg.write_slot(&slot)?;
        wait.sync(&seg.file)
            .await
            .map_err(|e| self.sync_failed(e, &seg.path.display().to_string()))
    }

    /// Removes every entry from `index` on (a conflicting, uncommitted tail), durably: the
    /// header is rewritten to claim no more than the cut first, then later segments go, then
    /// the file is cut. Blocking (it fsyncs on the calling thread); truncations are rare.
    pub fn truncate_from(&self, index: u64) -> Result<(), LogError> {
        self.check_poison()?;
        let mut st = lock(&self.inner.append);
        let tail = st.active.end();
        if index >= tail.next_index {
            return Ok(());
        }
        let (first, _) = self.first();
        if index < first {
            return Err(LogError::OutOfOrder(format!(
                "truncation from {index} reaches below the first entry {first}"
            )));
        }
        let seg = read_lock(&self.inner.segments)
            .range(..=index)
            .next_back()
            .map(|(_, s)| s.clone())
            .ok_or_else(|| LogError::OutOfOrder(format!("no segment holds entry {index}")))?;
        let seg_end = seg.end();
        let (pos, kafka, last_term) = if index == seg.base_index {
            (HEADER_LEN, seg.base_kafka, seg.prev_term)
        } else {
            let mut w = seg.walker_at_index(index, seg_end.len)?;
            let first_batch = w
                .peek()?
                .ok_or_else(|| seg.corrupt(w.pos, "no batch at the truncation point"))?;
            let term = w.last_term.unwrap_or(seg.prev_term);
            (first_batch.pos, first_batch.header.base_offset, term)
        };
        let cut = Mark {
            len: pos,
            next_index: index,
            next_kafka: kafka,
            last_term,
        };
        let mut d = lock(&self.inner.durable);
        let (claim, checkpoint, checkpoint_max_ts) = if d.segment == seg.base_index {
            (
                min_mark(d.synced, cut),
                min_mark(d.checkpoint, cut),
                d.checkpoint_max_ts,
            )
        } else if seg.base_index < d.segment
            && !st.rolled.iter().any(|r| r.base_index == seg.base_index)
        {
            // A sealed segment: wholly synced, so the cut is.
            (cut, cut, seg.max_ts())
        } else {
            // Rolled off and not yet sealed: only what is there for sure.
            let start = Mark {
                len: HEADER_LEN,
                next_index: seg.base_index,
                next_kafka: seg.base_kafka,
                last_term: seg.prev_term,
            };
            (start, start, i64::MIN)
        };
        // Both slots, so no older slot with a longer claim can win at recovery.
        for _ in 0..2 {
            seg.write_slot(&seg.slot(claim, checkpoint, checkpoint_max_ts, false))?;
        }
        seg.file
            .sync_now()
            .map_err(|e| self.poison(format!("fsync {}: {e}", seg.path.display())))?;
        let later: Vec<Arc<Segment>> = read_lock(&self.inner.segments)
            .range(seg.base_index + 1..)
            .map(|(_, s)| s.clone())
            .collect();
        for l in &later {
            segment::remove_files(self.inner.fs.as_ref(), &self.inner.dir, l.base_index)?;
        }
        if !later.is_empty() {
            self.inner
                .fs
                .sync_dir(&self.inner.dir)
                .map_err(LogError::io("fsync directory", &self.inner.dir))?;
            let mut segments = write_lock(&self.inner.segments);
            for l in &later {
                segments.remove(&l.base_index);
            }
        }
        seg.file
            .set_len(pos)
            .map_err(LogError::io("truncate segment", &seg.path))?;
        let keep = seg.offsets.count_where(|p| u64::from(p.pos) < pos)?;
        seg.offsets.truncate(keep)?;
        let rel = seg.rel_kafka(kafka).unwrap_or(u32::MAX);
        let keep = seg.times.count_where(|p| p.rel_kafka < rel)?;
        seg.times.truncate(keep)?;
        let last_ts = seg.times.last()?.map_or(i64::MIN, |p| p.ts);
        seg.time_index_max.store(last_ts, Ordering::Release);
        seg.file
            .sync_now()
            .map_err(|e| self.poison(format!("fsync {}: {e}", seg.path.display())))?;
        seg.set_end(cut);
        st.rolled.retain(|r| r.base_index < seg.base_index);
        st.active = seg.clone();
        st.points = PointBuilder::default();
        *d = Durable {
            segment: seg.base_index,
            synced: claim,
            claimed: claim,
            checkpoint,
            checkpoint_max_ts,
        };
        tracing::info!(dir = %self.inner.dir.display(), index, kafka, "log truncated");
        Ok(())
    }

    /// Deletes whole segments holding only entries at or below `index`, oldest first, never
    /// the active one. Readers holding a deleted segment keep reading its open file.
    pub fn purge_through(&self, index: u64) -> Result<PurgeReport, LogError> {
        let st = lock(&self.inner.append);
        let victims: Vec<Arc<Segment>> = read_lock(&self.inner.segments)
            .values()
            .take_while(|s| s.base_index != st.active.base_index && s.end().next_index <= index + 1)
            .cloned()
            .collect();
        drop(st);
        let mut report = PurgeReport::default();
        for v in &victims {
            report.bytes_deleted +=
                segment::remove_files(self.inner.fs.as_ref(), &self.inner.dir, v.base_index)?;
            report.segments_deleted += 1;
        }
        if !victims.is_empty() {
            self.inner
                .fs
                .sync_dir(&self.inner.dir)
                .map_err(LogError::io("fsync directory", &self.inner.dir))?;
            let mut segments = write_lock(&self.inner.segments);
            for v in &victims {
                segments.remove(&v.base_index);
            }
            let start = segments.values().next().map_or(0, |s| s.base_kafka);
            drop(segments);
            self.advance_log_start(start);
            tracing::info!(dir = %self.inner.dir.display(), segments = victims.len(), bytes = report.bytes_deleted, "purged segments");
        }
        Ok(report)
    }

    /// Starts the log over empty at `next_index` (Kafka offset `next_kafka`, after an entry of
    /// `prev_term`), dropping every segment: for a replica that installed a snapshot beyond its
    /// log. The new segment is durable before the old ones go, and recovery drops older
    /// segments that a gap separates from a newer one, so a crash in between leaves the new
    /// start.
    pub fn reset(&self, next_index: u64, next_kafka: i64, prev_term: u64) -> Result<(), LogError> {
        self.check_poison()?;
        let mut st = lock(&self.inner.append);
        let tail = st.active.end();
        if next_index < tail.next_index {
            return Err(LogError::OutOfOrder(format!(
                "reset to {next_index} behind the log end {}",
                tail.next_index
            )));
        }
        let old: Vec<Arc<Segment>> = read_lock(&self.inner.segments).values().cloned().collect();
        let fs = self.inner.fs.as_ref();
        if old.iter().any(|s| s.base_index == next_index) {
            // Only an empty active segment can start at the log end.
            segment::remove_files(fs, &self.inner.dir, next_index)?;
        }
        let seg = Arc::new(Segment::create(
            fs,
            &self.inner.dir,
            next_index,
            next_kafka,
            prev_term,
            true,
        )?);
        for f in [&seg.file, seg.offsets.file(), seg.times.file()] {
            f.sync_now()
                .map_err(|e| self.poison(format!("fsync {}: {e}", f.describe())))?;
        }
        fs.sync_dir(&self.inner.dir)
            .map_err(LogError::io("fsync directory", &self.inner.dir))?;
        for s in old.iter().filter(|s| s.base_index != next_index) {
            segment::remove_files(fs, &self.inner.dir, s.base_index)?;
        }
        fs.sync_dir(&self.inner.dir)
            .map_err(LogError::io("fsync directory", &self.inner.dir))?;
        let mut d = lock(&self.inner.durable);
        let start = seg.end();
        *d = Durable {
            segment: next_index,
            synced: start,
            claimed: start,
            checkpoint: start,
            checkpoint_max_ts: i64::MIN,
        };
        {
            let mut segments = write_lock(&self.inner.segments);
            segments.clear();
            segments.insert(next_index, seg.clone());
        }
        st.active = seg;
        st.rolled.clear();
        st.dir_dirty = false;
        st.points = PointBuilder::default();
        self.advance_log_start(next_kafka);
        tracing::info!(dir = %self.inner.dir.display(), next_index, next_kafka, "log reset after a snapshot");
        Ok(())
    }

    /// A read found damage: it is never served, and the next open CRC-checks every segment
    /// (and so cuts the damage and reports it, for the replica to be repaired).
    fn noticed(&self, e: LogError) -> LogError {
        if let LogError::Corrupt {
            path,
            position,
            reason,
        } = &e
        {
            tracing::error!(path = %path.display(), position, %reason, "damaged log data found on read; it is not served, and the next start checks every segment");
            let marker = self.inner.dir.join(crate::recovery::VERIFY_MARKER);
            if !self.inner.fs.exists(&marker) {
                if let Err(w) = crate::fs::write_atomic(
                    self.inner.fs.as_ref(),
                    &marker,
                    b"damage found on read\n",
                ) {
                    tracing::warn!(error = %w, "could not leave the verify marker");
                }
            }
        }
        e
    }

    fn segment_for_index(&self, index: u64) -> Option<Arc<Segment>> {
        read_lock(&self.inner.segments)
            .range(..=index)
            .next_back()
            .map(|(_, s)| s.clone())
    }

    /// Entries `from..to` (as many as exist, stopping early once more than `max_bytes` are
    /// gathered; at least one when any exists). Data batches are CRC checked in
    /// [`ReadMode::Full`]; a bad one is an error, never returned.
    pub fn read_entries(
        &self,
        from: u64,
        to: u64,
        max_bytes: usize,
        mode: ReadMode,
    ) -> Result<Vec<StoredEntry>, LogError> {
        self.read_entries_inner(from, to, max_bytes, mode)
            .map_err(|e| self.noticed(e))
    }

    fn read_entries_inner(
        &self,
        from: u64,
        to: u64,
        max_bytes: usize,
        mode: ReadMode,
    ) -> Result<Vec<StoredEntry>, LogError> {
        let mut out = Vec::new();
        let mut index = from;
        let mut bytes = 0usize;
        let (first, _) = self.first();
        if from < first {
            return Err(LogError::OffsetOutOfRange {
                requested: i64::try_from(from).unwrap_or(i64::MAX),
                log_start: i64::try_from(first).unwrap_or(i64::MAX),
                log_end: i64::try_from(self.tail().next_index).unwrap_or(i64::MAX),
            });
        }
        while index < to {
            let Some(seg) = self.segment_for_index(index) else {
                break;
            };
            let end = seg.end();
            if index >= end.next_index {
                break;
            }
            let mut w = seg.walker_at_index(index, end.len)?;
            while index < to && index < end.next_index {
                let entry = read_one_entry(&seg, &mut w, seg.base_index, mode)?;
                if entry.index != index {
                    return Err(seg.corrupt(
                        w.pos,
                        format!("found entry {} where {index} was expected", entry.index),
                    ));
                }
                bytes += match &entry.body {
                    StoredBody::Records { batches, .. } => batches.len(),
                    StoredBody::Control { payload, .. } => payload.len() + 64,
                    StoredBody::Summary { .. } => 64,
                };
                out.push(entry);
                index += 1;
                if bytes > max_bytes {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    /// The Kafka offset after entry `index` (which must be in the log, or the entry just
    /// before its first).
    pub fn kafka_after(&self, index: u64) -> Result<i64, LogError> {
        let (first, _) = self.first();
        if index.checked_add(1) == Some(first) {
            let segments = read_lock(&self.inner.segments);
            return Ok(segments.values().next().map_or(0, |s| s.base_kafka));
        }
        let entries = self.read_entries(index, index + 1, 0, ReadMode::Summary)?;
        let e = entries
            .first()
            .ok_or_else(|| LogError::OutOfOrder(format!("no entry {index} in the log")))?;
        Ok(e.kafka_offset + i64::from(e.kafka_records()))
    }

    /// Whole data batches from the one holding Kafka `offset`, up to `max_bytes` (at least one
    /// batch when one exists below `max_offset`), never at or past `max_offset` (the broker
    /// passes the high watermark), control batches left out. Every batch is CRC checked and its
    /// epoch field set to its term.
    pub fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        max_offset: i64,
    ) -> Result<ReadResult, LogError> {
        self.read_inner(offset, max_bytes, max_offset)
            .map_err(|e| self.noticed(e))
    }

    fn read_inner(
        &self,
        offset: i64,
        max_bytes: usize,
        max_offset: i64,
    ) -> Result<ReadResult, LogError> {
        let log_start = self.log_start_offset();
        let log_end = self.log_end_offset();
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
        let candidates: Vec<Arc<Segment>> = {
            let segments = read_lock(&self.inner.segments);
            let mut from = segments
                .values()
                .rev()
                .find(|s| s.base_kafka <= offset)
                .map_or(0, |s| s.base_index);
            // Several segments can start at one Kafka offset (segments of control batches only):
            // start with the first of them.
            if let Some(s) = segments.get(&from) {
                let base = s.base_kafka;
                if let Some(earliest) = segments.values().find(|x| x.base_kafka == base) {
                    from = earliest.base_index;
                }
            }
            segments.range(from..).map(|(_, s)| s.clone()).collect()
        };
        for seg in candidates {
            let end = seg.end();
            if end.next_kafka <= offset {
                continue;
            }
            let Some(mut w) = seg.walker_at_kafka(offset, end.len)? else {
                continue;
            };
            let mut out = BytesMut::new();
            let mut next = offset;
            while let Some(b) = w.next_header()? {
                if b.header.is_control() {
                    continue;
                }
                if b.header.last_offset() >= max_offset {
                    break;
                }
                if !out.is_empty() && out.len() + b.header.total_len() > max_bytes {
                    break;
                }
                if b.header.base_offset != next && !out.is_empty() {
                    return Err(seg.corrupt(
                        b.pos,
                        format!("batch has offset {}, expected {next}", b.header.base_offset),
                    ));
                }
                let mut bytes = w.batch_bytes(&b)?;
                let term = u32::try_from(b.header.stored_term()).unwrap_or(u32::MAX);
                batch::set_partition_leader_epoch(&mut bytes, term);
                batch::set_base_offset(&mut bytes, b.header.base_offset);
                out.extend_from_slice(&bytes);
                next = b.header.next_offset();
            }
            if out.is_empty() {
                return Ok(empty);
            }
            return Ok(ReadResult {
                records: out.freeze(),
                next_offset: next,
            });
        }
        Ok(empty)
    }

    /// The first data batch whose max timestamp is >= `ts_ms`, below Kafka offset `max_offset`
    /// (batch granularity; the broker refines to a record).
    pub fn lookup_timestamp(
        &self,
        ts_ms: i64,
        max_offset: i64,
    ) -> Result<Option<TimestampLookup>, LogError> {
        self.lookup_timestamp_inner(ts_ms, max_offset)
            .map_err(|e| self.noticed(e))
    }

    fn lookup_timestamp_inner(
        &self,
        ts_ms: i64,
        max_offset: i64,
    ) -> Result<Option<TimestampLookup>, LogError> {
        let log_start = self.log_start_offset();
        let segments: Vec<Arc<Segment>> =
            read_lock(&self.inner.segments).values().cloned().collect();
        for seg in segments {
            if seg.max_ts() < ts_ms {
                continue;
            }
            let end = seg.end();
            let rel = seg
                .times
                .floor(|p| p.ts < ts_ms)?
                .map_or(0, |p| p.rel_kafka);
            let start = (seg.base_kafka + i64::from(rel)).max(log_start);
            let Some(mut w) = seg.walker_at_kafka(start, end.len)? else {
                continue;
            };
            while let Some(b) = w.next_header()? {
                if b.header.is_control() || b.header.last_offset() < log_start {
                    continue;
                }
                if b.header.base_offset >= max_offset {
                    return Ok(None);
                }
                if b.header.max_timestamp >= ts_ms {
                    return Ok(Some(TimestampLookup {
                        batch_base_offset: b.header.base_offset,
                        batch_max_timestamp: b.header.max_timestamp,
                    }));
                }
            }
        }
        Ok(None)
    }

    /// The prefix of closed segments that retention removes at `now_ms`: by age (largest
    /// timestamp older than `retention_ms`) and by size (while the log exceeds
    /// `retention_bytes`), only segments whose entries are all at or below `max_index`.
    /// Returns the last index they hold and the Kafka offset after them.
    pub fn retention_point(
        &self,
        now_ms: i64,
        retention_ms: Option<u64>,
        retention_bytes: Option<u64>,
        max_index: u64,
    ) -> Option<(u64, i64)> {
        let cutoff =
            retention_ms.map(|ms| now_ms.saturating_sub(i64::try_from(ms).unwrap_or(i64::MAX)));
        let segments = self.segments();
        let mut total: u64 = segments.iter().map(|s| s.size_bytes).sum();
        let log_start = self.log_start_offset();
        let mut point = None;
        for s in &segments {
            if s.active || s.next_index == 0 || s.next_index - 1 > max_index {
                break;
            }
            let too_old = cutoff.is_some_and(|c| s.max_timestamp < c);
            let too_big = retention_bytes.is_some_and(|max| total > max);
            if !(too_old || too_big) {
                break;
            }
            total -= s.size_bytes;
            if s.next_kafka > log_start {
                point = Some((s.next_index - 1, s.next_kafka));
            }
        }
        point
    }

    /// Final sync, seal and header claim (clean shutdown). Later writes are refused only by the
    /// caller's choice; calling it twice is harmless.
    pub fn close(&self) -> Result<(), LogError> {
        self.check_poison()?;
        let (active, rolled) = {
            let mut st = lock(&self.inner.append);
            (st.active.clone(), std::mem::take(&mut st.rolled))
        };
        for seg in &rolled {
            for f in [&seg.file, seg.offsets.file(), seg.times.file()] {
                f.sync_now()
                    .map_err(|e| self.poison(format!("fsync {}: {e}", f.describe())))?;
            }
            let end = seg.end();
            seg.write_slot(&seg.slot(end, end, seg.max_ts(), true))?;
            seg.file
                .sync_now()
                .map_err(|e| self.poison(format!("fsync {}: {e}", seg.path.display())))?;
        }
        self.inner
            .fs
            .sync_dir(&self.inner.dir)
            .map_err(LogError::io("fsync directory", &self.inner.dir))?;
        for f in [&active.file, active.offsets.file(), active.times.file()] {
            f.sync_now()
                .map_err(|e| self.poison(format!("fsync {}: {e}", f.describe())))?;
        }
        let end = active.end();
        let mut d = lock(&self.inner.durable);
        let slot = active.slot(end, end, active.max_ts(), false);
        active.write_slot(&slot)?;
        active
            .file
            .sync_now()
            .map_err(|e| self.poison(format!("fsync {}: {e}", active.path.display())))?;
        *d = Durable {
            segment: active.base_index,
            synced: end,
            claimed: end,
            checkpoint: end,
            checkpoint_max_ts: active.max_ts(),
        };
        Ok(())
    }
}

/// How long an idle log may leave its header claim behind what is durable (see
/// [`Log::header_behind`]): the window in which damage to the last synced entries would look
/// like a torn write.
pub const HEADER_CLAIM_DELAY: Duration = Duration::from_millis(5);

/// The stored bytes of `entry`, whose first record takes Kafka offset `kafka`, and the Kafka
/// offsets it takes.
fn stamp(entry: &mut NewEntry, kafka: i64, now_ms: i64) -> Result<(Bytes, u64), LogError> {
    let term = u32::try_from(entry.term)
        .map_err(|_| LogError::OutOfOrder(format!("term {} too large", entry.term)))?;
    if kafka > batch::STORED_OFFSET_MAX {
        return Err(LogError::OutOfOrder(format!(
            "Kafka offset {kafka} is past the largest a log stores ({})",
            batch::STORED_OFFSET_MAX
        )));
    }
    match &mut entry.body {
        EntryBody::Control(kind, payload) => {
            let mut b =
                batch::encode_control_batch(kafka, term | ENTRY_END, now_ms, *kind, payload);
            batch::stamp_stored(&mut b, kafka, term | ENTRY_END);
            Ok((Bytes::from(b), 0))
        }
        EntryBody::Records(buf) => {
            // (position, records) of each batch: the headers are checked here, the CRCs were
            // checked by the caller (the contract of `EntryBody::Records`; checking a CRC again
            // costs a pass over every byte on the produce path).
            let found = batch::structure(buf)?;
            debug_assert!(
                batch::validate_batches(buf).is_ok(),
                "records appended without their CRCs checked"
            );
            let mut owned = std::mem::take(buf)
                .try_into_mut()
                .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
            // Stamping only writes fields outside the CRC and is a function of (offset, term,
            // length, CRC), so stamped records can be appended again and come out the same.
            let stamped = stamp_records(&mut owned, &found, kafka, term);
            *buf = owned.freeze();
            let records = stamped?;
            Ok((buf.clone(), records))
        }
    }
}

/// Stamps each batch of `owned` (positions and record counts in `found`) for an entry whose
/// first record takes Kafka offset `kafka`. Returns the entry's record count.
fn stamp_records(
    owned: &mut [u8],
    found: &[(usize, u32)],
    kafka: i64,
    term: u32,
) -> Result<u64, LogError> {
    let mut next = kafka;
    let last = found.len().saturating_sub(1);
    for (i, &(position, records)) in found.iter().enumerate() {
        let Some(rest) = owned.get_mut(position..) else {
            return Err(LogError::InvalidBatch {
                position,
                reason: "batch outside the buffer".into(),
            });
        };
        let field = if i == last { term | ENTRY_END } else { term };
        if next > batch::STORED_OFFSET_MAX || !batch::stamp_stored(rest, next, field) {
            return Err(LogError::OutOfOrder(format!(
                "Kafka offset {next} is past the largest a log stores ({})",
                batch::STORED_OFFSET_MAX
            )));
        }
        next += i64::from(records);
    }
    Ok((next - kafka) as u64)
}

/// Reads the entry starting at the walker's position (the walker ends past it).
fn read_one_entry(
    seg: &Segment,
    w: &mut segment::Walker<'_>,
    base_index: u64,
    mode: ReadMode,
) -> Result<StoredEntry, LogError> {
    let mut batches = BytesMut::new();
    let mut producers = Vec::new();
    let mut records: u32 = 0;
    let mut first: Option<BatchHeader> = None;
    let mut index = 0;
    loop {
        let b = w
            .next_header()?
            .ok_or_else(|| seg.corrupt(w.pos, "the log ends inside an entry"))?;
        let h = b.header;
        if let Some(f) = first {
            if h.stored_term() != f.stored_term() || h.is_control() {
                return Err(seg.corrupt(b.pos, "an entry's batches disagree on their term or kind"));
            }
        } else {
            if !b.starts_entry {
                return Err(seg.corrupt(b.pos, "expected the first batch of an entry"));
            }
            first = Some(h);
            index = base_index + b.rel_index;
            if h.is_control() {
                if !h.ends_entry() {
                    return Err(seg.corrupt(b.pos, "a control batch must be a whole entry"));
                }
                let bytes = w.batch_bytes(&b)?;
                let (kind, payload) = batch::decode_control_batch(&bytes)
                    .map_err(|e| seg.corrupt(b.pos, e.to_string()))?;
                return Ok(StoredEntry {
                    index,
                    term: h.stored_term(),
                    kafka_offset: h.base_offset,
                    body: StoredBody::Control {
                        kind,
                        payload: Bytes::copy_from_slice(payload),
                    },
                });
            }
        }
        records = records.saturating_add(u32::try_from(h.record_count).unwrap_or(0));
        match mode {
            ReadMode::Full => batches.extend_from_slice(&w.batch_bytes(&b)?),
            ReadMode::Summary => producers.extend(h.producer_batch()),
        }
        if h.ends_entry() {
            break;
        }
    }
    let Some(f) = first else {
        return Err(seg.corrupt(w.pos, "empty entry"));
    };
    let body = match mode {
        ReadMode::Full => StoredBody::Records {
            batches: batches.freeze(),
            record_count: records,
        },
        ReadMode::Summary => StoredBody::Summary {
            record_count: records,
            producers,
        },
    };
    Ok(StoredEntry {
        index,
        term: f.stored_term(),
        kafka_offset: f.base_offset,
        body,
    })
}
