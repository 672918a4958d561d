#![allow(clippy::unwrap_used)]

mod common;

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::*;
use kiln_log::{BatchHeader, LogConfig, LogError, PartitionLog};

/// Appends `n` batches of 1..=3 records, returns them as stamped.
fn fill(log: &PartitionLog, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let b = batch_of(1 + i % 3, 50 + (i * 31) % 300, i as u8, 1_000 + i as i64);
            let info = log.append(&b, 0).unwrap();
            let mut stamped = b;
            stamped[..8].copy_from_slice(&info.base_offset.to_be_bytes());
            stamped
        })
        .collect()
}

fn segment_files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

fn flip_byte(path: &Path, pos: u64) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, pos).unwrap();
    b[0] ^= 0x20;
    f.write_all_at(&b, pos).unwrap();
}

/// A config whose checkpoint only moves on roll and close, so a crash leaves the whole active
/// segment to scan.
fn lazy_checkpoint() -> LogConfig {
    LogConfig {
        checkpoint_interval_bytes: u64::MAX,
        ..small_config()
    }
}

#[test]
fn flipped_bit_is_detected_on_read_and_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = PartitionLog::open(dir.path(), small_config()).unwrap();
    let batches = fill(&log, 60);
    log.close().unwrap();
    // Flip a bit inside the records of the second batch of the first (closed, trusted) segment.
    let first = &segment_files(dir.path(), "log")[0];
    let second_at = batches[0].len() as u64;
    flip_byte(first, second_at + 70);

    let (log, report) = PartitionLog::open(dir.path(), small_config()).unwrap();
    assert_eq!(report.truncated_bytes, 0, "trusted data is not cut");
    let bad_offset = BatchHeader::parse(&batches[1]).unwrap().base_offset;
    match log.read(bad_offset, 1 << 20, i64::MAX) {
        Err(LogError::Corrupt {
            path,
            position,
            reason,
        }) => {
            assert_eq!(&path, first);
            assert_eq!(position, second_at);
            assert!(reason.contains("CRC"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // A read starting before the bad batch that would include it fails too: nothing is served.
    assert!(matches!(
        log.read(0, 1 << 20, i64::MAX),
        Err(LogError::Corrupt { .. })
    ));
    // The first batch alone is fine.
    assert_eq!(
        &log.read(0, 1, i64::MAX).unwrap().records[..],
        &batches[0][..]
    );

    // Bit rot under a running log, in the active segment.
    let last = segment_files(dir.path(), "log").pop().unwrap();
    let last_batch = batches.last().unwrap();
    let len = fs::metadata(&last).unwrap().len();
    flip_byte(&last, len - 5);
    let off = BatchHeader::parse(last_batch).unwrap().base_offset;
    assert!(matches!(
        log.read(off, 1 << 20, i64::MAX),
        Err(LogError::Corrupt { .. })
    ));
}

#[test]
fn torn_tail_is_truncated_with_a_report() {
    let dir = tempfile::tempdir().unwrap();
    let crash = tempfile::tempdir().unwrap();
    let (log, _) = PartitionLog::open(dir.path(), lazy_checkpoint()).unwrap();
    let batches = fill(&log, 40);
    block_on(log.wait_durable(log.log_end_offset())).unwrap();
    copy_dir(dir.path(), crash.path());
    drop(log);

    // Cut the last batch in half.
    let active = last_segment(crash.path());
    let len = fs::metadata(&active).unwrap().len();
    let last_len = batches.last().unwrap().len() as u64;
    let cut_to = len - last_len / 2;
    OpenOptions::new()
        .write(true)
        .open(&active)
        .unwrap()
        .set_len(cut_to)
        .unwrap();

    let (log, report) = PartitionLog::open(crash.path(), lazy_checkpoint()).unwrap();
    assert_eq!(report.truncated_bytes, cut_to - (len - last_len));
    let expect_next = BatchHeader::parse(batches.last().unwrap())
        .unwrap()
        .base_offset;
    assert_eq!(report.next_offset, expect_next);
    assert_eq!(
        report.scanned_bytes,
        len - last_len,
        "scanned from the checkpoint at the segment start"
    );
    assert_eq!(log.log_end_offset(), expect_next);
    assert_eq!(fs::metadata(&active).unwrap().len(), len - last_len);
    assert_eq!(
        read_all(&log, 1 << 20, i64::MAX),
        batches[..batches.len() - 1]
    );
    // The log goes on from there.
    let info = log.append(&batch_of(1, 10, 0, 0), 0).unwrap();
    assert_eq!(info.base_offset, expect_next);
}

#[test]
fn garbage_after_the_end_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = PartitionLog::open(dir.path(), small_config()).unwrap();
    let batches = fill(&log, 10);
    log.close().unwrap();
    let active = last_segment(dir.path());
    let len = fs::metadata(&active).unwrap().len();
    let f = OpenOptions::new().append(true).open(&active).unwrap();
    f.write_all_at(&[0xAB; 100], len).unwrap();
    let (log, report) = PartitionLog::open(dir.path(), small_config()).unwrap();
    assert_eq!(report.truncated_bytes, 100);
    assert_eq!(
        report.scanned_bytes, 0,
        "the clean-close checkpoint covers every whole batch"
    );
    assert_eq!(read_all(&log, 1 << 20, i64::MAX), batches);
}

#[test]
fn recovery_with_and_without_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = PartitionLog::open(dir.path(), small_config()).unwrap();
    let batches = fill(&log, 120);
    block_on(log.wait_durable(log.log_end_offset())).unwrap();
    let with_cp = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), with_cp.path());
    let without_cp = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), without_cp.path());
    fs::remove_file(without_cp.path().join("recovery-checkpoint")).unwrap();
    let total: u64 = batches.iter().map(|b| b.len() as u64).sum();

    let (a, ra) = PartitionLog::open(with_cp.path(), small_config()).unwrap();
    let (b, rb) = PartitionLog::open(without_cp.path(), small_config()).unwrap();
    assert_eq!(
        rb.scanned_bytes, total,
        "without a checkpoint everything is scanned"
    );
    assert!(
        ra.scanned_bytes < 4096,
        "with one, at most the active segment: {}",
        ra.scanned_bytes
    );
    for (log, r) in [(&a, &ra), (&b, &rb)] {
        assert_eq!(r.truncated_bytes, 0);
        assert_eq!(r.next_offset, log.log_end_offset());
        assert_eq!(read_all(log, 1 << 20, i64::MAX), batches);
        assert_eq!(
            log.lookup_timestamp(1_050)
                .unwrap()
                .unwrap()
                .batch_max_timestamp,
            1_050
        );
    }
    // A damaged checkpoint is ignored (full scan), never trusted.
    drop((a, b));
    let damaged = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), damaged.path());
    flip_byte(&damaged.path().join("recovery-checkpoint"), 12);
    let (c, rc) = PartitionLog::open(damaged.path(), small_config()).unwrap();
    assert_eq!(rc.scanned_bytes, total);
    assert_eq!(read_all(&c, 1 << 20, i64::MAX), batches);
}

#[test]
fn corruption_in_the_middle_cuts_there_and_deletes_later_segments() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = PartitionLog::open(dir.path(), small_config()).unwrap();
    let batches = fill(&log, 80);
    log.close().unwrap();
    fs::remove_file(dir.path().join("recovery-checkpoint")).unwrap();
    let logs = segment_files(dir.path(), "log");
    assert!(logs.len() >= 5);
    // Corrupt the first batch of the third segment.
    flip_byte(&logs[2], 65);
    let later: u64 = logs[2..]
        .iter()
        .map(|p| fs::metadata(p).unwrap().len())
        .sum();
    let (log, report) = PartitionLog::open(dir.path(), small_config()).unwrap();
    assert_eq!(report.truncated_bytes, later);
    assert_eq!(report.segments, 2);
    assert_eq!(segment_files(dir.path(), "log"), logs[..2]);
    let kept = read_all(&log, 1 << 20, i64::MAX);
    assert_eq!(kept, batches[..kept.len()]);
    assert_eq!(log.log_end_offset(), report.next_offset);
    // Appends continue in the (reopened) second segment.
    log.append(&batch_of(1, 10, 0, 0), 0).unwrap();
}

#[test]
fn damaged_index_files_are_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = PartitionLog::open(dir.path(), small_config()).unwrap();
    let batches = fill(&log, 100);
    log.close().unwrap();
    let indexes = segment_files(dir.path(), "index");
    let times = segment_files(dir.path(), "timeindex");
    assert!(
        fs::metadata(&indexes[0]).unwrap().len() > 8,
        "the first segment has index entries"
    );
    let good_index = fs::read(&indexes[0]).unwrap();
    let good_time = fs::read(&times[1]).unwrap();
    // Odd size, out-of-order entries, entries pointing past the file, a missing time index.
    fs::write(&indexes[0], [1, 2, 3]).unwrap();
    let mut swapped = fs::read(&indexes[1]).unwrap();
    swapped.rotate_left(8);
    fs::write(&indexes[1], &swapped).unwrap();
    let mut past = fs::read(&indexes[2]).unwrap();
    past[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
    fs::write(&indexes[2], &past).unwrap();
    fs::remove_file(&times[1]).unwrap();

    let (log, report) = PartitionLog::open(dir.path(), small_config()).unwrap();
    assert_eq!(report.truncated_bytes, 0);
    assert_eq!(read_all(&log, 1 << 20, i64::MAX), batches);
    for (i, b) in batches.iter().enumerate().step_by(7) {
        let h = BatchHeader::parse(b).unwrap();
        assert_eq!(
            &log.read(h.last_offset(), 1, i64::MAX).unwrap().records[..],
            &b[..],
            "batch {i}"
        );
    }
    assert_eq!(
        log.lookup_timestamp(1_042)
            .unwrap()
            .unwrap()
            .batch_max_timestamp,
        1_042
    );
    // Rebuilt on disk, identical to what appends produced.
    assert_eq!(fs::read(&indexes[0]).unwrap(), good_index);
    assert_eq!(fs::read(&times[1]).unwrap(), good_time);
}

#[test]
fn stale_files_are_cleaned_up() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = PartitionLog::open(dir.path(), small_config()).unwrap();
    let batches = fill(&log, 30);
    log.close().unwrap();
    // Orphan index files (a crash during retention) and a leftover temp checkpoint.
    fs::write(dir.path().join("00000000000000000000.index.bak"), b"x").unwrap();
    fs::write(dir.path().join("00000000000099999999.index"), [0; 8]).unwrap();
    fs::write(dir.path().join("recovery-checkpoint.tmp"), b"junk").unwrap();
    let (log, _) = PartitionLog::open(dir.path(), small_config()).unwrap();
    assert!(!dir.path().join("00000000000099999999.index").exists());
    assert!(!dir.path().join("recovery-checkpoint.tmp").exists());
    assert_eq!(read_all(&log, 1 << 20, i64::MAX), batches);
}

/// kill -9 for real: a child process (this test binary, re-run) appends and waits for
/// durability, reports how far it got, and is killed mid-stream.
#[test]
fn recovery_after_kill_9() {
    kill_9_case(
        8 << 20,
        LogConfig {
            segment_bytes: 1 << 20,
            ..LogConfig::default()
        },
    );
}

/// The spec's target: a 1 GiB partition recovers in well under 2 s after kill -9.
/// Slow to set up (writes 1 GiB), so ignored by default:
/// `cargo test -p kiln-log --release --test recovery -- --ignored --nocapture`.
#[test]
#[ignore]
fn one_gib_recovers_fast_after_kill_9() {
    let report = kill_9_case(1 << 30, LogConfig::default());
    assert!(report.elapsed.as_millis() < 2000, "{report:?}");
}

const CHILD_ENV: &str = "KILN_LOG_KILL9_CHILD";

fn kill_9_case(bytes: u64, config: LogConfig) -> kiln_log::RecoveryReport {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "kill_9_child",
            "--nocapture",
            "--include-ignored",
            "--test-threads=1",
        ])
        .env(
            CHILD_ENV,
            format!("{}|{bytes}|{}", dir.path().display(), config.segment_bytes),
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut durable = -1i64;
    for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(d) = line.strip_prefix("durable ") {
            durable = d.parse().unwrap();
        } else if line == "done" {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(durable > 0, "the child reported progress");
    let (log, report) = PartitionLog::open(dir.path(), config).unwrap();
    eprintln!("{report:?}");
    assert!(
        log.log_end_offset() >= durable,
        "acknowledged data survived"
    );
    assert!(
        report.scanned_bytes < bytes / 2 || bytes < (64 << 20),
        "the checkpoint bounds the scan"
    );
    // Every batch is whole and contiguous.
    let mut offset = log.log_start_offset();
    while offset < log.log_end_offset() {
        let r = log.read(offset, 1 << 20, i64::MAX).unwrap();
        assert!(r.next_offset > offset);
        offset = r.next_offset;
    }
    report
}

/// Not a test on its own: the child side of the kill -9 tests.
#[test]
fn kill_9_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.split('|');
    let dir = PathBuf::from(parts.next().unwrap());
    let bytes: u64 = parts.next().unwrap().parse().unwrap();
    let segment_bytes: u64 = parts.next().unwrap().parse().unwrap();
    let (log, _) = PartitionLog::open(
        &dir,
        LogConfig {
            segment_bytes,
            ..LogConfig::default()
        },
    )
    .unwrap();
    let batch = batch_of(16, 1000, 7, 1_000);
    let per_batch = batch.len() as u64;
    let mut written = 0;
    let mut i = 0u64;
    while written < bytes {
        let info = log.append(&batch, 0).unwrap();
        written += per_batch;
        i += 1;
        if i.is_multiple_of(64) {
            block_on(log.wait_durable(info.last_offset + 1)).unwrap();
            println!("durable {}", info.last_offset + 1);
        }
    }
    // Keep appending without waiting, so there is unsynced data when the kill lands.
    for _ in 0..100 {
        log.append(&batch, 0).unwrap();
    }
    println!("done");
    std::thread::sleep(std::time::Duration::from_secs(60));
}
