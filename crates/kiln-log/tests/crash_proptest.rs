//! Property: whatever a crash leaves of the unsynced tail, recovery yields exactly a prefix of
//! whole batches, byte-identical to what was appended, holding every batch that was fsynced.
#![allow(clippy::unwrap_used)]

mod common;

use std::fs::{self, OpenOptions};
use std::io::Write;

use common::*;
use kiln_log::{BatchHeader, LogConfig, PartitionLog};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Append {
    records: usize,
    value_len: usize,
    /// Wait for the fsync covering this batch before the next append.
    wait: bool,
}

fn append_op() -> impl Strategy<Value = Append> {
    (1..5usize, 0..700usize, prop::bool::weighted(0.25)).prop_map(|(records, value_len, wait)| {
        Append {
            records,
            value_len,
            wait,
        }
    })
}

fn config() -> impl Strategy<Value = LogConfig> {
    (1024..6000u64, 0..600u32, 0..5000u64).prop_map(
        |(segment_bytes, index_interval_bytes, checkpoint_interval_bytes)| LogConfig {
            segment_bytes,
            index_interval_bytes,
            checkpoint_interval_bytes,
            retention_ms: None,
            ..LogConfig::default()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn crash_recovers_a_durable_prefix(
        config in config(),
        ops in prop::collection::vec(append_op(), 1..40),
        cut in 0.0..=1.0f64,
        garbage in prop::option::weighted(0.4, prop::collection::vec(any::<u8>(), 1..200)),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let crash = tempfile::tempdir().unwrap();
        let (log, _) = PartitionLog::open(dir.path(), config.clone()).unwrap();
        let mut model: Vec<Vec<u8>> = Vec::new();
        let mut waited = 0i64;
        for (i, op) in ops.iter().enumerate() {
            let b = batch_of(op.records, op.value_len, i as u8, i as i64);
            let info = log.append(&b, 0).unwrap();
            let mut stamped = b;
            stamped[..8].copy_from_slice(&info.base_offset.to_be_bytes());
            model.push(stamped);
            if op.wait {
                block_on(log.wait_durable(info.last_offset + 1)).unwrap();
                waited = info.last_offset + 1;
            }
        }
        // The crash: the files as they are now. The durable offset is read after the copy, so
        // the copied checkpoint cannot be ahead of it.
        copy_dir(dir.path(), crash.path());
        let durable = log.durable_offset();
        prop_assert!(durable >= waited);
        drop(log);

        // Lose part of the unsynced tail of the active segment, maybe leave garbage after it.
        let active = last_segment(crash.path());
        let active_base: i64 = active.file_stem().unwrap().to_str().unwrap().parse().unwrap();
        let durable_pos: u64 = model
            .iter()
            .map(|b| BatchHeader::parse(b).unwrap())
            .filter(|h| h.base_offset >= active_base && h.base_offset < durable)
            .map(|h| h.total_len() as u64)
            .sum();
        let len = fs::metadata(&active).unwrap().len();
        prop_assert!(durable_pos <= len);
        let cut_at = durable_pos + ((len - durable_pos) as f64 * cut) as u64;
        let mut f = OpenOptions::new().write(true).open(&active).unwrap();
        f.set_len(cut_at).unwrap();
        if let Some(g) = &garbage {
            use std::io::Seek;
            f.seek(std::io::SeekFrom::End(0)).unwrap();
            f.write_all(g).unwrap();
        }
        drop(f);

        let (log, report) = PartitionLog::open(crash.path(), config.clone()).unwrap();
        let got = read_all(&log, 1 << 16, i64::MAX);
        prop_assert!(got.len() <= model.len());
        prop_assert_eq!(&got[..], &model[..got.len()], "a byte-identical prefix");
        let must_have = model.iter().filter(|b| BatchHeader::parse(b).unwrap().next_offset() <= durable).count();
        prop_assert!(got.len() >= must_have, "kept {} batches, {} were durable", got.len(), must_have);
        let end = got.last().map_or(0, |b| BatchHeader::parse(b).unwrap().next_offset());
        prop_assert_eq!(log.log_end_offset(), end);
        prop_assert_eq!(report.next_offset, end);
        prop_assert_eq!(log.durable_offset(), end);
        // Still a working log: appends continue at the recovered end, and survive a reopen.
        let info = log.append(&batch_of(1, 3, 0, 0), 0).unwrap();
        prop_assert_eq!(info.base_offset, end);
        log.close().unwrap();
        drop(log);
        let (log, report) = PartitionLog::open(crash.path(), config).unwrap();
        prop_assert_eq!(report.truncated_bytes, 0);
        prop_assert_eq!(report.scanned_bytes, 0);
        prop_assert_eq!(read_all(&log, 1 << 16, i64::MAX).len(), got.len() + 1);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Damage anywhere (segments, indexes, checkpoint) never makes open or read panic, and
    /// whatever is served is whole batches with valid CRCs.
    #[test]
    fn damaged_files_never_panic(
        batches in 1..40usize,
        damage in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), prop::collection::vec(any::<u8>(), 1..16)), 1..6),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig { segment_bytes: 2048, index_interval_bytes: 128, ..LogConfig::default() };
        let (log, _) = PartitionLog::open(dir.path(), config.clone()).unwrap();
        for i in 0..batches {
            log.append(&batch_of(1 + i % 3, i * 13 % 300, i as u8, i as i64), 0).unwrap();
        }
        log.close().unwrap();
        drop(log);
        let mut files: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        for (file, at, bytes) in &damage {
            let path = file.get(&files);
            let len = fs::metadata(path).unwrap().len() as usize;
            let mut content = fs::read(path).unwrap();
            let at = if len == 0 { 0 } else { at.index(len) };
            let end = (at + bytes.len()).min(content.len());
            content.splice(at..end, bytes.iter().copied());
            fs::write(path, &content).unwrap();
        }
        if let Ok((log, _)) = PartitionLog::open(dir.path(), config) {
            let mut offset = log.log_start_offset();
            while offset < log.log_end_offset() {
                match log.read(offset, 1 << 12, i64::MAX) {
                    Ok(r) => {
                        prop_assert!(r.next_offset > offset);
                        for b in split_batches(&r.records) {
                            prop_assert!(kiln_log::batch::verify_crc(&b, 0).is_ok());
                        }
                        offset = r.next_offset;
                    }
                    Err(_) => offset += 1,
                }
            }
            let _ = log.lookup_timestamp(5);
            let _ = log.append(&batch_of(1, 1, 0, 0), 0);
        }
    }
}
