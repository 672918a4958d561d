#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use kiln_log::{FlushPolicy, LogConfig, LogError, PartitionLog};

#[test]
fn builder_round_trips_records() {
    let recs: Vec<Rec> = vec![
        (Some(b"a".to_vec()), Some(b"hello".to_vec()), 1_000),
        (None, Some(vec![7; 300]), 1_005),
        (Some(b"c".to_vec()), None, 999),
    ];
    let b = build_batch(&recs);
    kiln_log::batch::verify_crc(&b, 0).unwrap();
    let h = kiln_log::BatchHeader::parse(&b).unwrap();
    assert_eq!(
        (h.record_count, h.last_offset_delta, h.max_timestamp),
        (3, 2, 1_005)
    );
    let decoded = decode_batch(&b);
    assert_eq!(
        decoded.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(
        decoded.into_iter().map(|(_, r)| r).collect::<Vec<_>>(),
        recs
    );
}

#[test]
fn append_read_round_trip_across_rolls() {
    let dir = tempfile::tempdir().unwrap();
    let (log, report) = PartitionLog::open(dir.path(), small_config()).unwrap();
    assert_eq!((report.segments, report.next_offset), (1, 0));
    let mut appended = Vec::new();
    let mut next = 0;
    for i in 0..200usize {
        let n = 1 + i % 4;
        let b = batch_of(n, 10 + (i * 37) % 400, i as u8, 1_000 + i as i64);
        let info = log.append(&b, 0).unwrap();
        assert_eq!(info.base_offset, next);
        assert_eq!(info.last_offset, next + n as i64 - 1);
        assert_eq!(info.record_count, n as u64);
        next += n as i64;
        let mut stamped = b.clone();
        stamped[..8].copy_from_slice(&info.base_offset.to_be_bytes());
        appended.push(stamped);
    }
    block_on(log.wait_durable(next)).unwrap();
    assert_eq!(log.log_end_offset(), next);
    assert_eq!(log.durable_offset(), next);
    let segments = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "log")
        })
        .count();
    assert!(
        segments > 5,
        "expected several rolls, got {segments} segments"
    );
    assert_eq!(
        log.size_bytes(),
        appended.iter().map(|b| b.len() as u64).sum::<u64>()
    );

    // Whole log, with various read sizes (a small max_bytes still returns one whole batch).
    for max_bytes in [1, 500, 3000, 1 << 20] {
        assert_eq!(
            read_all(&log, max_bytes, i64::MAX),
            appended,
            "max_bytes {max_bytes}"
        );
    }
    // Every offset lands in the batch that holds it.
    let mut base = 0;
    for b in &appended {
        let h = kiln_log::BatchHeader::parse(b).unwrap();
        for offset in base..=h.last_offset() {
            let r = log.read(offset, 1, i64::MAX).unwrap();
            assert_eq!(&r.records[..], &b[..], "offset {offset}");
            assert_eq!(r.next_offset, h.last_offset() + 1);
        }
        base = h.last_offset() + 1;
    }
    // Records decode to what the builder put in, offsets included.
    let first = decode_batch(&appended[3]);
    assert_eq!(
        first[0].0,
        kiln_log::BatchHeader::parse(&appended[3])
            .unwrap()
            .base_offset
    );

    // Range edges.
    assert!(log.read(next, 100, i64::MAX).unwrap().records.is_empty());
    assert_eq!(log.read(next, 100, i64::MAX).unwrap().next_offset, next);
    assert!(matches!(
        log.read(next + 1, 100, i64::MAX),
        Err(LogError::OffsetOutOfRange { requested, log_start: 0, log_end }) if requested == next + 1 && log_end == next
    ));
    assert!(matches!(
        log.read(-1, 100, i64::MAX),
        Err(LogError::OffsetOutOfRange { .. })
    ));

    // max_offset (the high watermark) is never crossed.
    let hw = 10;
    let got = read_all(&log, 1 << 20, hw);
    let last = kiln_log::BatchHeader::parse(got.last().unwrap()).unwrap();
    assert!(last.last_offset() < hw);
    assert!(got.len() < appended.len());
    assert!(log.read(0, 100, 0).unwrap().records.is_empty());

    log.close().unwrap();
    assert!(matches!(
        log.append(&batch_of(1, 1, 0, 0), 0),
        Err(LogError::Closed)
    ));

    // Reopen after a clean close: nothing to scan, same content.
    let (log, report) = PartitionLog::open(dir.path(), small_config()).unwrap();
    assert_eq!(report.next_offset, next);
    assert_eq!(report.scanned_bytes, 0);
    assert_eq!(report.truncated_bytes, 0);
    assert_eq!(read_all(&log, 1 << 20, i64::MAX), appended);
    let info = log.append(&batch_of(2, 5, 1, 5), 0).unwrap();
    assert_eq!(info.base_offset, next);
}

#[test]
fn multi_batch_append_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = PartitionLog::open(dir.path(), small_config()).unwrap();
    let mut buf = batch_of(2, 10, 1, 100);
    buf.extend(batch_of(3, 10, 2, 200));
    let info = log.append(&buf, 0).unwrap();
    assert_eq!(
        (
            info.base_offset,
            info.last_offset,
            info.record_count,
            info.max_timestamp
        ),
        (0, 4, 5, 200)
    );
    let r = log.read(0, 1 << 20, i64::MAX).unwrap();
    let got = split_batches(&r.records);
    assert_eq!(
        kiln_log::BatchHeader::parse(&got[1]).unwrap().base_offset,
        2
    );

    // Second batch corrupt: nothing is written.
    let mut bad = batch_of(1, 10, 1, 100);
    let mut second = batch_of(1, 10, 2, 100);
    let last = second.len() - 1;
    second[last] ^= 0xff;
    let at = bad.len();
    bad.extend(second);
    match log.append(&bad, 0) {
        Err(LogError::CrcMismatch {
            position,
            expected,
            actual,
        }) => {
            assert_eq!(position, at);
            assert_ne!(expected, actual);
        }
        other => panic!("expected CrcMismatch, got {other:?}"),
    }
    assert_eq!(log.log_end_offset(), 5);
    let size = log.size_bytes();
    // Garbage, truncated, wrong magic: refused, nothing written.
    assert!(matches!(
        log.append(&[], 0),
        Err(LogError::InvalidBatch { .. })
    ));
    assert!(matches!(
        log.append(&[1, 2, 3], 0),
        Err(LogError::InvalidBatch { .. })
    ));
    let good = batch_of(1, 10, 1, 100);
    assert!(matches!(
        log.append(&good[..good.len() - 1], 0),
        Err(LogError::InvalidBatch { .. })
    ));
    let mut magic = good.clone();
    magic[16] = 1;
    assert!(matches!(
        log.append(&magic, 0),
        Err(LogError::InvalidBatch { .. })
    ));
    assert_eq!(log.size_bytes(), size);
    assert_eq!(log.log_end_offset(), 5);
}

#[test]
fn read_by_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = PartitionLog::open(dir.path(), small_config()).unwrap();
    assert_eq!(log.lookup_timestamp(0).unwrap(), None);
    // Timestamps mostly rising, with one straggler going backwards.
    let mut stamps = Vec::new();
    for i in 0..100i64 {
        let ts = if i == 50 { 5 } else { 1_000 + i * 10 };
        let info = log.append(&batch_of(2, 100, 0, ts), 0).unwrap();
        stamps.push((info.base_offset, ts));
    }
    let expect = |target: i64| stamps.iter().find(|(_, ts)| *ts >= target).copied();
    for target in [
        i64::MIN,
        0,
        5,
        6,
        1_000,
        1_001,
        1_495,
        1_500,
        1_505,
        1_990,
        1_991,
        i64::MAX,
    ] {
        let got = log
            .lookup_timestamp(target)
            .unwrap()
            .map(|l| (l.batch_base_offset, l.batch_max_timestamp));
        assert_eq!(got, expect(target), "target {target}");
    }
    // Same answers after reopening (time indexes reloaded from disk).
    log.close().unwrap();
    let (log, _) = PartitionLog::open(dir.path(), small_config()).unwrap();
    for target in [0, 1_000, 1_001, 1_500, 1_505, 1_990, 1_991] {
        let got = log
            .lookup_timestamp(target)
            .unwrap()
            .map(|l| (l.batch_base_offset, l.batch_max_timestamp));
        assert_eq!(got, expect(target), "target {target} after reopen");
    }
}

#[test]
fn retention_by_age_and_size() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        retention_ms: Some(10_000),
        ..small_config()
    };
    let (log, _) = PartitionLog::open(dir.path(), config.clone()).unwrap();
    // ~1 KiB batches, 4 KiB segments: 3 batches per segment. Timestamps 0..60_000 step 1000.
    for i in 0..60i64 {
        log.append(&batch_of(1, 1000, 0, i * 1000), 0).unwrap();
    }
    let before = log.size_bytes();
    // Nothing is old yet at t = 0.
    assert_eq!(log.apply_retention(0).unwrap().segments_deleted, 0);
    // At t = 40_000 everything whose max timestamp < 30_000 goes: batches 0..=29, i.e. 10 segments.
    let r = log.apply_retention(40_000).unwrap();
    assert_eq!(r.segments_deleted, 10);
    assert_eq!(r.log_start_offset, 30);
    assert_eq!(log.log_start_offset(), 30);
    assert_eq!(log.size_bytes(), before - r.bytes_deleted);
    assert!(matches!(
        log.read(29, 100, i64::MAX),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    assert_eq!(read_all(&log, 1 << 20, i64::MAX).len(), 30);
    // The active segment is never deleted, however old.
    let r = log.apply_retention(i64::MAX).unwrap();
    assert_eq!(r.segments_deleted, 9);
    assert_eq!(r.log_start_offset, 57);
    assert!(log.size_bytes() > 0);
    assert_eq!(read_all(&log, 1 << 20, i64::MAX).len(), 3);
    log.close().unwrap();
    // Reopen: deleted segments stay deleted.
    let (log, _) = PartitionLog::open(dir.path(), config).unwrap();
    assert_eq!(log.log_start_offset(), r.log_start_offset);

    // By size.
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        retention_bytes: Some(10_000),
        ..small_config()
    };
    let (log, _) = PartitionLog::open(dir.path(), config).unwrap();
    for _ in 0..30 {
        log.append(&batch_of(1, 1000, 0, 0), 0).unwrap();
    }
    // A reader holding data from the oldest segment keeps it through retention.
    let held = log.read(0, 1 << 20, i64::MAX).unwrap();
    let r = log.apply_retention(0).unwrap();
    assert!(r.segments_deleted > 0);
    assert!(log.size_bytes() <= 10_000, "size {}", log.size_bytes());
    assert!(
        log.size_bytes() + 3 * 1100 > 10_000,
        "deleted too much: {}",
        log.size_bytes()
    );
    assert!(!held.records.is_empty());
    assert_eq!(
        read_all(&log, 1 << 20, i64::MAX).len() as i64,
        log.log_end_offset() - log.log_start_offset()
    );
}

#[test]
fn group_commit_wakes_waiters() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = PartitionLog::open(dir.path(), small_config()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..8u8 {
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..20 {
                    let info = log.append(&batch_of(1, 50, t, i), 0).unwrap();
                    log.wait_durable(info.last_offset + 1).await.unwrap();
                    assert!(log.durable_offset() > info.last_offset);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    assert_eq!(log.durable_offset(), 160);
    let mut rx = log.subscribe_durable();
    assert_eq!(*rx.borrow_and_update(), 160);
    log.append(&batch_of(1, 50, 0, 0), 0).unwrap();
    block_on(async {
        tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|d| *d >= 161))
            .await
            .unwrap()
            .unwrap();
    });
}

#[test]
fn concurrent_readers_only_see_whole_checked_batches() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = PartitionLog::open(dir.path(), small_config()).unwrap();
    let total = 400;
    std::thread::scope(|s| {
        let writer = log.clone();
        s.spawn(move || {
            for i in 0..total {
                writer
                    .append(&batch_of(1 + i % 3, i % 200, i as u8, i as i64), 0)
                    .unwrap();
            }
        });
        for _ in 0..2 {
            let reader = log.clone();
            s.spawn(move || {
                let mut offset = 0;
                let mut batches = 0;
                while batches < total {
                    // Read up to the durable offset (the high watermark), as the broker does.
                    let hw = reader.durable_offset();
                    let r = reader.read(offset, 1000, hw).unwrap();
                    for b in split_batches(&r.records) {
                        let h = kiln_log::BatchHeader::parse(&b).unwrap();
                        assert_eq!(h.base_offset, offset);
                        assert!(h.last_offset() < hw);
                        kiln_log::batch::verify_crc(&b, 0).unwrap();
                        offset = h.last_offset() + 1;
                        batches += 1;
                    }
                    if r.records.is_empty() {
                        std::thread::yield_now();
                    }
                }
            });
        }
    });
}

#[test]
fn interval_flush_policy() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        flush: FlushPolicy::Interval(Duration::from_millis(20)),
        ..small_config()
    };
    let (log, _) = PartitionLog::open(dir.path(), config).unwrap();
    let info = log.append(&batch_of(1, 50, 0, 0), 0).unwrap();
    // Returns at once, before any fsync.
    block_on(log.wait_durable(info.last_offset + 1)).unwrap();
    let mut rx = log.subscribe_durable();
    block_on(async {
        tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|d| *d >= 1))
            .await
            .unwrap()
            .unwrap();
    });
    log.close().unwrap();
}

#[test]
fn roll_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_ms: 1000,
        ..LogConfig::default()
    };
    let (log, _) = PartitionLog::open(dir.path(), config).unwrap();
    log.append(&batch_of(1, 10, 0, 0), 10_000).unwrap();
    log.append(&batch_of(1, 10, 0, 0), 10_500).unwrap();
    log.append(&batch_of(1, 10, 0, 0), 11_000).unwrap();
    log.append(&batch_of(1, 10, 0, 0), 11_100).unwrap();
    let logs: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".log"))
        .collect();
    let mut logs = logs;
    logs.sort();
    assert_eq!(
        logs,
        vec!["00000000000000000000.log", "00000000000000000002.log"]
    );
}

#[test]
fn config_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 10,
        ..LogConfig::default()
    };
    assert!(matches!(
        PartitionLog::open(dir.path(), config),
        Err(LogError::Io { .. })
    ));
}
