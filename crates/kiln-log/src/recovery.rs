//! Opening a log directory after a clean shutdown or a crash (docs/storage.md, "Recovery").
//!
//! Segments are taken in index order. A sealed segment was wholly fsynced before it was sealed:
//! it is trusted with its indexes after cheap checks. The last segment (and one whose seal a
//! crash prevented) is trusted up to its header's checkpoint, and from there every batch is read
//! and CRC checked: offsets must continue, an entry's batches share one term, terms never
//! decrease, and an entry ends with a batch carrying the entry-end flag. The log keeps the
//! longest prefix of whole, valid entries.
//!
//! What is cut tells which case it was:
//! * **torn**: the valid prefix reaches at least what the header claims synced. Only writes no
//!   fsync covered are lost, and nobody was told they were durable: cut them (WARN).
//! * **damaged**: the valid prefix ends before the synced claim (a flipped bit, zeros over
//!   synced data, a file cut short). The entries it held may have been acknowledged: they are cut
//!   (never served) and [`LogTail::Damaged`] says which, so the replica repairs before it votes.
//!
//! A segment that starts past the end of the one before it is what a [`crate::Log::reset`]
//! leaves when a crash cuts it short, if its header says it restarts the log: the older segments
//! are dropped. Any other such gap means the segment before lost its unsynced tail (a new
//! segment's directory entry can reach the disk before the older segment is sealed): the later
//! segments continued lost entries and are cut.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::fs::Fs;
use crate::header::{Mark, Slot, HEADER_LEN};
use crate::points::PointBuilder;
use crate::segment::{self, Segment};
use crate::{batch, LogConfig, LogError};

/// What recovery found at the end of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTail {
    Clean,
    /// Unsynced writes a crash cut short were removed.
    Torn,
    /// Synced data was lost (see the module docs).
    Damaged(Damage),
}

/// Lost synced data, as recovery saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// The first entry that is gone (the log now ends before it).
    pub first_lost_index: u64,
    /// The highest index the headers claimed synced (`None`: no claim survived).
    pub synced_through: Option<u64>,
    /// The term of that entry, as claimed.
    pub synced_term: Option<u64>,
    pub path: String,
    pub position: u64,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    pub segments: usize,
    /// Bytes read and CRC checked past the checkpoints.
    pub scanned_bytes: u64,
    /// Bytes cut from the end (torn or damaged), later segments included.
    pub cut_bytes: u64,
    pub tail: LogTail,
    pub first_index: u64,
    pub next_index: u64,
    pub next_kafka: i64,
    pub last_term: u64,
    pub elapsed: Duration,
}

pub(crate) struct Recovered {
    /// In index order; never empty; the last one is the active segment.
    pub segments: Vec<Arc<Segment>>,
    pub report: RecoveryReport,
}

/// One segment on disk, before it is checked.
struct Found {
    seg: Segment,
    slot: Option<Slot>,
    file_len: u64,
}

/// How a segment's scan ended.
struct ScanEnd {
    end: Mark,
    stop: Option<(u64, String)>,
    scanned: u64,
}

/// Present in a log directory when a read found damage: the next open CRC-checks everything.
pub(crate) const VERIFY_MARKER: &str = "verify-on-open";

pub(crate) fn recover(fs: &dyn Fs, dir: &Path, config: &LogConfig) -> Result<Recovered, LogError> {
    let started = Instant::now();
    fs.create_dir_all(dir)
        .map_err(LogError::io("create log directory", dir))?;
    let marker = dir.join(VERIFY_MARKER);
    let marked = fs.exists(&marker);
    let verify_all = config.verify_all_on_open || marked;
    if marked {
        tracing::warn!(dir = %dir.display(), "a read found damage: checking every segment");
    }
    let bases = list_segments(fs, dir)?;
    let interval = u64::from(config.index_interval_bytes);
    let mut found = Vec::with_capacity(bases.len());
    for &base in &bases {
        let (seg, slot, file_len) = Segment::open(fs, dir, base)?;
        found.push(Found {
            seg,
            slot,
            file_len,
        });
    }
    let mut kept: Vec<Segment> = Vec::new();
    let mut scanned_bytes = 0u64;
    let mut cut_bytes = 0u64;
    let mut tail = LogTail::Clean;
    let mut dir_changed = false;
    // Segments whose files were read past a checkpoint: fsynced before a new claim covers them.
    let mut to_sync: Vec<usize> = Vec::new();

    let count = found.len();
    let mut iter = found.into_iter().enumerate().peekable();
    while let Some((i, f)) = iter.next() {
        let is_last = i + 1 == count;
        let prev_end = kept.last().map(Segment::end);
        let Found {
            seg,
            slot,
            file_len,
        } = f;
        // Where this segment should start.
        if let Some(p) = prev_end {
            let restart = slot.is_some_and(|s| s.restart && s.base_index == seg.base_index);
            // A segment that does not continue the log, and why. Past its end without the
            // restart flag: the previous segment lost its unsynced tail while this one's
            // directory entry reached the disk, so this one continued lost entries.
            let broken = if seg.base_index > p.next_index && !restart {
                Some(format!(
                    "segment starts at entry {} past the end of the previous one, {}, and no reset made it",
                    seg.base_index, p.next_index
                ))
            } else if seg.base_index < p.next_index {
                Some(format!(
                    "segment starts at entry {} inside the previous one, which ends at {}",
                    seg.base_index, p.next_index
                ))
            } else {
                None
            };
            if let Some(reason) = broken {
                // Cut it and all after; damage only if it claims synced entries of its own.
                let claim = slot.as_ref().and_then(claims_data);
                cut_bytes += cut_rest(
                    fs,
                    dir,
                    seg,
                    iter.by_ref().map(|(_, f)| f),
                    &mut dir_changed,
                )?;
                tail = damaged_or_torn(p, claim, HEADER_LEN, &reason, dir);
                break;
            }
            if seg.base_index > p.next_index {
                tracing::warn!(dir = %dir.display(), from = kept.first().map(|s| s.base_index), to = p.next_index, restart = seg.base_index, "dropping segments left behind by a reset");
                for s in kept.drain(..) {
                    segment::remove_files(fs, dir, s.base_index)?;
                }
                to_sync.clear();
                dir_changed = true;
            }
        }
        let prev_end = kept.last().map(Segment::end);
        let slot = slot.filter(|s| s.base_index == seg.base_index);
        let seg = match (slot, prev_end) {
            (Some(s), Some(p)) if s.base_kafka != p.next_kafka || s.prev_term != p.last_term => {
                let reason = format!(
                    "segment header says it starts at Kafka offset {} after term {}, the log before it ends at {} in term {}",
                    s.base_kafka, s.prev_term, p.next_kafka, p.last_term
                );
                cut_bytes += cut_rest(
                    fs,
                    dir,
                    seg,
                    iter.by_ref().map(|(_, f)| f),
                    &mut dir_changed,
                )?;
                tail = damaged_or_torn(p, Some(s.synced), HEADER_LEN, &reason, dir);
                break;
            }
            (Some(_), _) => seg,
            (None, _) if is_last && file_len < HEADER_LEN => {
                // A segment whose creation a crash cut short: nothing in it was ever synced.
                tracing::warn!(path = %seg.path.display(), "removing a segment whose creation did not complete");
                cut_bytes += file_len;
                let base = seg.base_index;
                drop(seg);
                segment::remove_files(fs, dir, base)?;
                dir_changed = true;
                if tail == LogTail::Clean {
                    tail = LogTail::Torn;
                }
                continue;
            }
            (None, p) => {
                // Both header slots damaged: take the start from the log before, or the first
                // batch, and assume everything in the file was synced (the safe assumption).
                tracing::error!(path = %seg.path.display(), "segment header damaged in both slots; rebuilding it");
                let (kafka, term) = match p {
                    Some(p) => (p.next_kafka, p.last_term),
                    None => first_batch_start(&seg, file_len),
                };
                seg.with_base(kafka, term)
            }
        };
        let claim = match slot {
            Some(s) => s.synced,
            None => Mark {
                len: file_len,
                next_index: u64::MAX,
                next_kafka: i64::MAX,
                last_term: u64::MAX,
            },
        };
        // The trusted prefix: a sealed segment whole, any other up to its checkpoint.
        let (trusted, trusted_max_ts) = match slot {
            Some(s) if s.sealed => (s.synced, s.checkpoint_max_ts),
            Some(s) => (s.checkpoint, s.checkpoint_max_ts),
            None => (seg.end(), i64::MIN),
        };
        let mut scan_from = trusted;
        if verify_all {
            scan_from = seg.end();
            seg.offsets.truncate(0)?;
            seg.times.truncate(0)?;
        } else if trusted.len > file_len {
            // Even the trusted part is gone: rebuild from the start to see what is left.
            scan_from = seg.end();
            seg.offsets.truncate(0)?;
            seg.times.truncate(0)?;
        } else if !trust_prefix(&seg, trusted, interval)? {
            scan_from = seg.end();
        } else {
            seg.set_end(trusted);
            seg.set_max_ts(trusted_max_ts);
            let last_ts = seg.times.last()?.map_or(i64::MIN, |p| p.ts);
            seg.time_index_max
                .store(last_ts, std::sync::atomic::Ordering::Release);
        }
        if slot.is_some_and(|s| s.sealed)
            && !is_last
            && file_len > trusted.len
            && scan_from == trusted
        {
            // Bytes after a seal were never part of the log.
            tracing::warn!(path = %seg.path.display(), extra = file_len - trusted.len, "cutting bytes past a sealed segment's end");
            seg.file
                .set_len(trusted.len)
                .map_err(LogError::io("truncate segment", &seg.path))?;
        }
        let file_len = if slot.is_some_and(|s| s.sealed) && !is_last && scan_from == trusted {
            trusted.len.min(file_len)
        } else {
            file_len
        };
        let sealed_whole = slot.is_some_and(|s| s.sealed)
            && scan_from == trusted
            && trusted.len == file_len
            && !is_last;
        let scan = if sealed_whole {
            ScanEnd {
                end: trusted,
                stop: None,
                scanned: 0,
            }
        } else {
            let s = scan(&seg, scan_from, file_len, interval)?;
            to_sync.push(kept.len());
            s
        };
        scanned_bytes += scan.scanned;
        seg.set_end(scan.end);
        let first_ts = seg.first_append_ms();
        if first_ts == i64::MIN {
            seg.set_first_append_ms(first_batch_time(&seg, scan.end.len));
        }
        let damaged = scan.end.len < claim.len;
        let Some((position, reason)) = scan.stop.clone().or_else(|| {
            damaged.then(|| {
                (
                    scan.end.len,
                    "the file ends before the synced length its header claims".to_string(),
                )
            })
        }) else {
            kept.push(seg);
            continue;
        };
        // Cut here; anything after goes too.
        cut_bytes += file_len.saturating_sub(scan.end.len);
        seg.file
            .set_len(scan.end.len)
            .map_err(LogError::io("truncate segment", &seg.path))?;
        let path = seg.path.display().to_string();
        let mut later_claims: Vec<Mark> = Vec::new();
        for (_, f) in iter.by_ref() {
            if let Some(c) = f.slot.as_ref().and_then(claims_data) {
                later_claims.push(c);
            }
            let base = f.seg.base_index;
            drop(f.seg);
            cut_bytes += segment::remove_files(fs, dir, base)?;
            dir_changed = true;
        }
        if damaged
            || later_claims
                .iter()
                .any(|c| c.next_index > scan.end.next_index)
        {
            let best = later_claims
                .into_iter()
                .chain(std::iter::once(claim))
                .filter(|c| c.next_index != u64::MAX)
                .max_by_key(|c| c.next_index);
            let d = Damage {
                first_lost_index: scan.end.next_index,
                synced_through: best.and_then(|c| c.next_index.checked_sub(1)),
                synced_term: best.map(|c| c.last_term),
                path,
                position,
                reason: reason.clone(),
            };
            tracing::error!(
                path = %d.path,
                position = d.position,
                first_lost_index = d.first_lost_index,
                synced_through = ?d.synced_through,
                bytes_cut = file_len.saturating_sub(scan.end.len),
                reason = %d.reason,
                "log damaged: synced entries are lost and were cut; they must be refilled from a peer"
            );
            tail = LogTail::Damaged(d);
        } else {
            tracing::warn!(path = %seg.path.display(), position, bytes_cut = file_len - scan.end.len, %reason, "recovery cut a torn tail (writes no fsync covered)");
            if tail == LogTail::Clean {
                tail = LogTail::Torn;
            }
        }
        kept.push(seg);
        break;
    }

    if kept.is_empty() {
        // A new log, or one whose only segment never reached the disk.
        let seg = Segment::create(fs, dir, 0, 0, 0, false)?;
        for f in [&seg.file, seg.offsets.file(), seg.times.file()] {
            f.sync_now()
                .map_err(LogError::io("fsync new segment", &seg.path))?;
        }
        dir_changed = true;
        kept.push(seg);
    }
    // Everything kept past a checkpoint is made durable, then the last segment's header
    // claims it: from here on the claim is true.
    for &i in &to_sync {
        if let Some(seg) = kept.get(i) {
            for f in [&seg.file, seg.offsets.file(), seg.times.file()] {
                f.sync_now()
                    .map_err(LogError::io("fsync recovered segment", &seg.path))?;
            }
        }
    }
    if marked {
        fs.remove_file(&marker)
            .map_err(LogError::io("remove verify marker", &marker))?;
        dir_changed = true;
    }
    if dir_changed {
        fs.sync_dir(dir)
            .map_err(LogError::io("fsync directory", dir))?;
    }
    let last_index = kept.len() - 1;
    for (i, seg) in kept.iter().enumerate() {
        let end = seg.end();
        let slot = seg.slot(end, end, seg.max_ts(), i != last_index);
        if i == last_index || to_sync.contains(&i) {
            seg.write_slot(&slot)?;
            seg.file
                .sync_now()
                .map_err(LogError::io("fsync segment header", &seg.path))?;
        }
    }
    let first = kept.first().map_or(0, |s| s.base_index);
    let end = kept.last().map(Segment::end).unwrap_or_default();
    let report = RecoveryReport {
        segments: kept.len(),
        scanned_bytes,
        cut_bytes,
        tail,
        first_index: first,
        next_index: end.next_index,
        next_kafka: end.next_kafka,
        last_term: end.last_term,
        elapsed: started.elapsed(),
    };
    tracing::info!(dir = %dir.display(), segments = report.segments, scanned_bytes, cut_bytes, next_index = report.next_index, next_kafka = report.next_kafka, elapsed_ms = report.elapsed.as_millis() as u64, "log recovered");
    Ok(Recovered {
        segments: kept.into_iter().map(Arc::new).collect(),
        report,
    })
}

/// Removes `seg` and every later segment; returns the bytes removed.
fn cut_rest(
    fs: &dyn Fs,
    dir: &Path,
    seg: Segment,
    rest: impl Iterator<Item = Found>,
    dir_changed: &mut bool,
) -> Result<u64, LogError> {
    let mut bases = vec![seg.base_index];
    drop(seg);
    bases.extend(rest.map(|f| f.seg.base_index));
    let mut bytes = 0;
    for b in bases {
        bytes += segment::remove_files(fs, dir, b)?;
        *dir_changed = true;
    }
    Ok(bytes)
}

/// What a later segment's header says was synced before it, if anything: a segment is sealed,
/// or claims synced entries of its own, only after every segment before it was sealed. A header
/// claiming nothing past its own start (a new segment's) vouches for nothing before it.
fn claims_data(slot: &Slot) -> Option<Mark> {
    (slot.sealed || slot.synced.len > HEADER_LEN).then_some(slot.synced)
}

fn damaged_or_torn(end: Mark, claim: Option<Mark>, _at: u64, reason: &str, dir: &Path) -> LogTail {
    match claim.filter(|c| c.next_index > end.next_index) {
        Some(c) => {
            tracing::error!(dir = %dir.display(), %reason, "log damaged: later segments do not continue it and were cut");
            LogTail::Damaged(Damage {
                first_lost_index: end.next_index,
                synced_through: c.next_index.checked_sub(1),
                synced_term: Some(c.last_term),
                path: dir.display().to_string(),
                position: 0,
                reason: reason.to_string(),
            })
        }
        None => {
            tracing::warn!(dir = %dir.display(), %reason, "cut segments that do not continue the log");
            LogTail::Torn
        }
    }
}

/// The Kafka offset and term of a segment's first batch (for a header that is gone).
fn first_batch_start(seg: &Segment, file_len: u64) -> (i64, u64) {
    seg.header_at(HEADER_LEN, file_len)
        .map_or((0, 0), |h| (h.base_offset, h.stored_term()))
}

fn first_batch_time(seg: &Segment, end: u64) -> i64 {
    match seg.header_at(HEADER_LEN, end) {
        Ok(h) if h.max_timestamp >= 0 => h.max_timestamp,
        _ => i64::MIN,
    }
}

/// Checks the index files below `trusted` cheaply (points in order and in bounds, and a header
/// hop from the last point that lands exactly on `trusted` at the right entry and offset);
/// drops points past it. If the check fails both indexes are rebuilt by hopping headers (no
/// CRC: the data itself is trusted). False when even that fails: scan from the start.
fn trust_prefix(seg: &Segment, trusted: Mark, interval: u64) -> Result<bool, LogError> {
    let keep = seg
        .offsets
        .count_where(|p| u64::from(p.pos) < trusted.len)?;
    seg.offsets.truncate(keep)?;
    let rel = seg.rel_kafka(trusted.next_kafka).unwrap_or(u32::MAX);
    let keep = seg.times.count_where(|p| p.rel_kafka < rel)?;
    seg.times.truncate(keep)?;
    if trusted.len == HEADER_LEN {
        return Ok(true);
    }
    let last = seg.offsets.last()?;
    let (pos, rel_index, starts) = last.map_or((HEADER_LEN, 0, true), |p| {
        (u64::from(p.pos), u64::from(p.rel_index), p.starts_entry)
    });
    if hop_to(seg, pos, rel_index, starts, trusted)? {
        return Ok(true);
    }
    tracing::warn!(path = %seg.path.display(), "index files do not match the log; rebuilding them");
    seg.offsets.truncate(0)?;
    seg.times.truncate(0)?;
    seg.time_index_max
        .store(i64::MIN, std::sync::atomic::Ordering::Release);
    let mut points = PointBuilder::default();
    let mut w = seg.walker(HEADER_LEN, 0, true, trusted.len);
    while let Some(b) = w.next_header().ok().flatten() {
        points.observe(seg, &b.header, b.pos, b.rel_index, b.starts_entry, interval)?;
    }
    let ok = w.pos == trusted.len && seg.base_index + w.rel_index == trusted.next_index;
    if !ok {
        seg.offsets.truncate(0)?;
        seg.times.truncate(0)?;
    }
    Ok(ok)
}

/// Whether hopping headers from `pos` ends exactly at `target`.
fn hop_to(
    seg: &Segment,
    pos: u64,
    rel_index: u64,
    starts: bool,
    target: Mark,
) -> Result<bool, LogError> {
    let mut w = seg.walker(pos, rel_index, starts, target.len);
    let mut kafka = None;
    loop {
        match w.next_header() {
            Ok(Some(b)) => kafka = Some(b.header.base_offset + b.header.kafka_records()),
            Ok(None) => break,
            Err(_) => return Ok(false),
        }
    }
    Ok(w.pos == target.len
        && w.starts_entry
        && seg.base_index + w.rel_index == target.next_index
        && kafka.is_none_or(|k| k == target.next_kafka))
}

/// Reads and CRC checks every batch from `from` to `file_len`, adding index points, and
/// returns the end of the last whole valid entry.
fn scan(seg: &Segment, from: Mark, file_len: u64, interval: u64) -> Result<ScanEnd, LogError> {
    let mut points = PointBuilder::default();
    let rel = from.next_index - seg.base_index;
    let mut w = seg.walker(from.len, rel, true, file_len);
    let mut end = from;
    let mut expect_kafka = from.next_kafka;
    let mut term = from.last_term;
    // The entry being read: its first batch's term.
    let mut open_entry: Option<u64> = None;
    let stop = loop {
        let b = match w.peek() {
            Ok(Some(b)) => b,
            Ok(None) => break None,
            Err(e) => break Some((w.pos, e.to_string())),
        };
        let h = b.header;
        if h.base_offset != expect_kafka {
            break Some((
                b.pos,
                format!(
                    "batch has offset {}, expected {expect_kafka}",
                    h.base_offset
                ),
            ));
        }
        let t = h.stored_term();
        match open_entry {
            Some(entry_term) if t != entry_term => {
                break Some((
                    b.pos,
                    format!("batch of term {t} inside an entry of term {entry_term}"),
                ))
            }
            Some(_) if h.is_control() => {
                break Some((b.pos, "a control batch inside a data entry".into()))
            }
            None if t < term => {
                break Some((b.pos, format!("entry of term {t} after term {term}")))
            }
            None if h.is_control() && !h.ends_entry() => {
                break Some((b.pos, "a control batch that does not end its entry".into()))
            }
            _ => {}
        }
        if let Err(e) = w.batch_bytes(&b) {
            break Some((b.pos, e.to_string()));
        }
        if h.is_control() {
            let bytes = w.batch_bytes(&b)?;
            if let Err(e) = batch::decode_control_batch(&bytes) {
                break Some((b.pos, e.to_string()));
            }
        }
        if let Err(e) = points.observe(seg, &h, b.pos, b.rel_index, b.starts_entry, interval) {
            break Some((b.pos, e.to_string()));
        }
        let _ = w.next_header();
        expect_kafka += h.kafka_records();
        open_entry = Some(t);
        if h.ends_entry() {
            open_entry = None;
            term = t;
            end = Mark {
                len: w.pos,
                next_index: seg.base_index + w.rel_index,
                next_kafka: expect_kafka,
                last_term: t,
            };
        }
    };
    let stop = match (stop, open_entry) {
        (None, Some(_)) => Some((end.len, "the file ends inside an entry".to_string())),
        (stop, _) => stop,
    };
    // Index points past the last whole entry describe cut batches.
    let keep = seg.offsets.count_where(|p| u64::from(p.pos) < end.len)?;
    seg.offsets.truncate(keep)?;
    let rel = seg.rel_kafka(end.next_kafka).unwrap_or(u32::MAX);
    let keep = seg.times.count_where(|p| p.rel_kafka < rel)?;
    seg.times.truncate(keep)?;
    Ok(ScanEnd {
        end,
        stop,
        scanned: file_len.saturating_sub(from.len),
    })
}

/// Segment first indexes in the directory, sorted. Removes temporary files and index files
/// without a segment (left by a crash during a purge).
fn list_segments(fs: &dyn Fs, dir: &Path) -> Result<Vec<u64>, LogError> {
    let mut logs = std::collections::BTreeSet::new();
    let mut indexes = Vec::new();
    for name in fs
        .list(dir)
        .map_err(LogError::io("list log directory", dir))?
    {
        let Some((stem, ext)) = name.split_once('.') else {
            continue;
        };
        if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(base) = stem.parse::<u64>() else {
            continue;
        };
        match ext {
            "log" if !name.ends_with(".tmp") => {
                logs.insert(base);
            }
            "index" | "timeindex" => indexes.push((base, dir.join(&name))),
            _ => {}
        }
    }
    for (base, path) in indexes {
        if !logs.contains(&base) {
            tracing::warn!(path = %path.display(), "removing an index file whose segment is gone");
            fs.remove_file(&path)
                .map_err(LogError::io("remove orphan index", &path))?;
        }
    }
    Ok(logs.into_iter().collect())
}
