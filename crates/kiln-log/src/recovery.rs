//! Opening a partition directory after a clean shutdown or a crash.
//!
//! Segments wholly before the recovery checkpoint were fsynced: they are trusted along with
//! their index files, which only get cheap checks. From the checkpoint position to the end of
//! the log every batch is read and CRC-checked; at the first torn, corrupt or non-contiguous
//! batch the log is cut there and any later segments are deleted. Without a usable checkpoint
//! everything is scanned. The checkpoint bounds the scan, so recovery time does not grow with
//! the size of the partition.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::checkpoint::{self, Checkpoint, CHECKPOINT_TMP};
use crate::segment::{self, Segment};
use crate::{LogConfig, LogError, RecoveryReport};

pub(crate) struct Recovered {
    /// In offset order; never empty; the last one is the active segment.
    pub segments: Vec<Arc<Segment>>,
    pub checkpoint: Checkpoint,
    pub report: RecoveryReport,
}

pub(crate) fn recover(dir: &Path, config: &LogConfig) -> Result<Recovered, LogError> {
    let started = Instant::now();
    fs::create_dir_all(dir).map_err(LogError::io("create log directory", dir))?;
    let (bases, mut dir_changed) = list_segments(dir)?;
    let raw_checkpoint = checkpoint::read(dir)?;
    let checkpoint = raw_checkpoint.filter(|cp| checkpoint_matches(dir, &bases, cp));
    let interval = config.index_interval_bytes;

    let mut segments: Vec<Arc<Segment>> = Vec::new();
    let mut scanned_bytes = 0u64;
    let mut truncated_bytes = 0u64;
    // Index in `segments` of the first segment read past the checkpoint. Those bytes may so far
    // exist only in the page cache (the process died, the kernel did not): they are fsynced
    // before a new checkpoint vouches for them.
    let mut first_scanned: Option<usize> = None;

    for (i, &base) in bases.iter().enumerate() {
        let (seg, index_ok) = Segment::open(dir, base, interval)?;
        let next_base = bases.get(i + 1).copied();
        let is_last = next_base.is_none();
        if seg.size() == 0 && !is_last {
            // Left by a roll that failed half way; it holds nothing and would break contiguity.
            tracing::warn!(path = %seg.path().display(), "removing an empty segment that is not the last one");
            drop(seg);
            segment::remove_files(dir, base)?;
            dir_changed = true;
            continue;
        }
        let (from, expected) = match checkpoint {
            Some(cp) if base < cp.segment_base => {
                recover_trusted(&seg, index_ok, next_base)?;
                segments.push(Arc::new(seg));
                continue;
            }
            Some(cp) if base == cp.segment_base && trust_prefix(&seg, index_ok, &cp)? => {
                (cp.position, cp.next_offset)
            }
            _ => {
                seg.index.clear()?;
                (0, base)
            }
        };
        first_scanned.get_or_insert(segments.len());
        let file_len = seg.size();
        let prev_end = segments.last().map(|p| p.next_offset());
        let (end, stop) = match prev_end {
            Some(prev_end) if from == 0 && prev_end != base => (
                0,
                Some(format!(
                    "segment starts at offset {base} but the previous segment ends at {prev_end}"
                )),
            ),
            _ => {
                let scan = seg.scan(from, expected, u64::MAX, true, true)?;
                scanned_bytes += scan.end - from;
                seg.set_recovered(scan.next_offset, i64::MIN);
                (scan.end, scan.stop)
            }
        };
        let Some(reason) = stop else {
            segments.push(Arc::new(seg));
            continue;
        };
        // Cut the log at the first bad batch and drop everything after it.
        tracing::warn!(
            path = %seg.path().display(),
            position = end,
            bytes_cut = file_len - end,
            reason = %reason,
            "recovery truncated the log at a torn or corrupt batch"
        );
        truncated_bytes += file_len - end;
        if end == 0 && !segments.is_empty() {
            drop(seg);
            segment::remove_files(dir, base)?;
            dir_changed = true;
        } else {
            seg.truncate(end)?;
            segments.push(Arc::new(seg));
        }
        for &later in bases.iter().skip(i + 1) {
            let cut = segment::remove_files(dir, later)?;
            tracing::warn!(
                path = %segment::log_path(dir, later).display(),
                bytes_cut = cut,
                "recovery deleted a segment that followed the truncation point"
            );
            truncated_bytes += cut;
            dir_changed = true;
        }
        break;
    }

    if segments.is_empty() {
        // Offsets only grow: a log whose files vanished restarts where the checkpoint said it was.
        let start = raw_checkpoint.map_or(0, |cp| cp.next_offset.max(0));
        segments.push(Arc::new(Segment::create(dir, start, interval)?));
        dir_changed = true;
    }
    let (closed, active) = match segments.split_last() {
        Some((active, closed)) => (closed, active.clone()),
        None => unreachable_segments(dir)?,
    };
    for seg in closed {
        seg.index.seal();
    }
    for seg in &segments {
        seg.index.persist()?;
    }
    for seg in segments
        .iter()
        .skip(first_scanned.unwrap_or(segments.len()))
    {
        seg.sync()?;
    }
    if dir_changed {
        checkpoint::sync_dir(dir)?;
    }
    let next_offset = active.next_offset();
    // The roll clock restarts from the first batch's timestamp, as Kafka does; without one, now.
    let first_append_ms = match active.first_header() {
        Some(h) if h.max_timestamp >= 0 => h.max_timestamp,
        Some(_) => now_ms(),
        None => i64::MIN,
    };
    active.set_recovered(next_offset, first_append_ms);
    let checkpoint = Checkpoint {
        segment_base: active.base,
        position: active.size(),
        next_offset,
        max_timestamp: active.max_timestamp(),
    };
    checkpoint::write(dir, &checkpoint)?;
    let report = RecoveryReport {
        segments: segments.len(),
        scanned_bytes,
        truncated_bytes,
        next_offset,
        elapsed: started.elapsed(),
    };
    tracing::info!(dir = %dir.display(), ?report, "partition log recovered");
    Ok(Recovered {
        segments,
        checkpoint,
        report,
    })
}

fn unreachable_segments<T>(dir: &Path) -> Result<T, LogError> {
    Err(LogError::Io {
        op: "recover",
        path: dir.to_path_buf(),
        source: std::io::Error::other("no segment after recovery"),
    })
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Segment base offsets in the directory, sorted. Removes a leftover temporary checkpoint and
/// index files without a log (left by a crash during retention). Returns whether it removed any.
fn list_segments(dir: &Path) -> Result<(Vec<i64>, bool), LogError> {
    let mut logs = BTreeSet::new();
    let mut indexes = Vec::new();
    let mut removed = false;
    for entry in fs::read_dir(dir).map_err(LogError::io("list log directory", dir))? {
        let entry = entry.map_err(LogError::io("list log directory", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name == CHECKPOINT_TMP {
            fs::remove_file(entry.path())
                .map_err(LogError::io("remove temporary checkpoint", &entry.path()))?;
            removed = true;
            continue;
        }
        let Some((stem, ext)) = name.split_once('.') else {
            continue;
        };
        if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(base) = stem.parse::<i64>() else {
            continue;
        };
        match ext {
            "log" => {
                logs.insert(base);
            }
            "index" | "timeindex" => indexes.push((base, entry.path())),
            _ => {}
        }
    }
    for (base, path) in indexes {
        if !logs.contains(&base) {
            tracing::warn!(path = %path.display(), "removing an index file whose segment is gone");
            fs::remove_file(&path).map_err(LogError::io("remove orphan index", &path))?;
            removed = true;
        }
    }
    Ok((logs.into_iter().collect(), removed))
}

/// A checkpoint is only usable if it points into a segment that exists and is long enough.
fn checkpoint_matches(dir: &Path, bases: &[i64], cp: &Checkpoint) -> bool {
    let len = fs::metadata(segment::log_path(dir, cp.segment_base)).map_or(None, |m| Some(m.len()));
    let rel_ok = cp
        .next_offset
        .checked_sub(cp.segment_base)
        .is_some_and(|rel| (0..=i64::from(u32::MAX)).contains(&rel));
    let ok = bases.binary_search(&cp.segment_base).is_ok()
        && len.is_some_and(|len| len >= cp.position)
        && rel_ok;
    if !ok {
        tracing::warn!(
            dir = %dir.display(),
            ?cp,
            segment_len = ?len,
            "recovery checkpoint does not match the segments on disk; scanning the whole log"
        );
    }
    ok
}

/// Trusts the checkpoint segment's indexes below the checkpoint if they pass the cheap checks
/// and the last offset entry points at the batch it claims. Otherwise the caller scans the
/// whole segment.
fn trust_prefix(seg: &Segment, index_ok: bool, cp: &Checkpoint) -> Result<bool, LogError> {
    let rel = u64::try_from(cp.next_offset - seg.base).unwrap_or(0);
    if !index_ok {
        return Ok(false);
    }
    seg.index.keep_before(cp.position, rel, cp.max_timestamp)?;
    if !seg.index.is_consistent(cp.position, rel) {
        tracing::warn!(path = %seg.path().display(), "index files before the recovery checkpoint are inconsistent; rescanning the segment");
        return Ok(false);
    }
    if let Some(last) = seg.index.last_offset_entry() {
        let expected = seg.base.saturating_add(i64::from(last.rel));
        let tail = seg.scan(u64::from(last.pos), expected, cp.position, false, false)?;
        if tail.end < cp.position {
            tracing::warn!(path = %seg.path().display(), reason = ?tail.stop, "offset index does not match the log; rescanning the segment");
            return Ok(false);
        }
    }
    Ok(true)
}

/// A segment wholly before the checkpoint: cheap checks of its indexes (entries in order and in
/// bounds, and a hop from the last offset entry must land exactly on the end of the file); if
/// they fail, rebuild both indexes by hopping batch headers.
fn recover_trusted(seg: &Segment, index_ok: bool, next_base: Option<i64>) -> Result<(), LogError> {
    let len = seg.size();
    let rel_end = next_base.map_or(u64::MAX, |n| u64::try_from(n - seg.base).unwrap_or(0));
    let problem = if !index_ok {
        "index file size is not a whole number of entries".to_string()
    } else if !seg.index.is_consistent(len, rel_end) {
        "index entries are out of order or out of bounds".to_string()
    } else if len > 0 && seg.max_timestamp() == i64::MIN {
        "time index is empty".to_string()
    } else {
        let (pos, rel) = seg
            .index
            .last_offset_entry()
            .map_or((0, 0), |e| (u64::from(e.pos), i64::from(e.rel)));
        let tail = seg.scan(pos, seg.base.saturating_add(rel), u64::MAX, false, false)?;
        match tail.stop {
            None if tail.end == len => {
                seg.set_recovered(tail.next_offset, i64::MIN);
                warn_if_gap(seg, next_base);
                return Ok(());
            }
            None => "offset index does not lead to the end of the log".to_string(),
            Some(reason) => format!("offset index does not lead to the end of the log: {reason}"),
        }
    };
    tracing::warn!(path = %seg.path().display(), %problem, "rebuilding segment indexes");
    seg.index.clear()?;
    let full = seg.scan(0, seg.base, u64::MAX, false, true)?;
    if let Some(reason) = full.stop {
        // Fsynced data is damaged. Cutting it would silently drop acknowledged records; keep it,
        // reads of the damaged part fail with Corrupt and never serve it.
        tracing::error!(
            path = %seg.path().display(),
            position = full.end,
            %reason,
            "segment before the recovery checkpoint is damaged; keeping it"
        );
    }
    seg.set_recovered(full.next_offset, i64::MIN);
    warn_if_gap(seg, next_base);
    Ok(())
}

fn warn_if_gap(seg: &Segment, next_base: Option<i64>) {
    if let Some(next_base) = next_base.filter(|&n| n != seg.next_offset()) {
        tracing::error!(
            path = %seg.path().display(),
            segment_end = seg.next_offset(),
            next_base,
            "offsets are not contiguous between segments before the recovery checkpoint"
        );
    }
}
