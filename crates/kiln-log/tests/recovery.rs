//! Recovery on the simulated file system: crashes that tear unsynced writes are cut quietly,
//! damage to synced data is reported with the entries it lost, and a property test crashes at
//! random points and checks that nothing synced is ever lost.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::*;
use kiln_log::header::HEADER_LEN;
use kiln_log::{ControlKind, LogTail};
use proptest::prelude::*;

fn segment_files(fs: &kiln_log::sim_fs::SimFs) -> Vec<(std::path::PathBuf, usize)> {
    let mut files: Vec<_> = fs
        .durable_files(Path::new("/log"))
        .into_iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    files
}

#[test]
fn a_crash_cuts_only_unsynced_entries() {
    block_on(async {
        let fs = sim();
        let (log, report) = open_sim(&fs, small_config());
        assert_eq!(report.tail, LogTail::Clean);
        for i in 0..5 {
            append(&log, 1, &data(1, 2, i));
        }
        log.sync().await.unwrap();
        let synced = entries(&log);
        for i in 0..3 {
            append(&log, 1, &data(2, 2, i));
        }
        // Power loss: half of the unsynced bytes reached the disk.
        let (fs, _) = fs.crash(|n| n / 2);
        let (log, report) = open_sim(&fs, small_config());
        assert_eq!(report.tail, LogTail::Torn);
        let after = entries(&log);
        assert!(after.starts_with(&synced), "{after:?}");
        assert!(after.len() < 8);
        // The cut is durable: another crash finds the same log, cleanly.
        let (fs, _) = fs.crash(|_| 0);
        let (log2, report) = open_sim(&fs, small_config());
        assert_eq!(report.tail, LogTail::Clean);
        assert_eq!(entries(&log2), after);
        drop(log);
    });
}

#[test]
fn zeros_over_synced_entries_are_damage_not_a_torn_tail() {
    block_on(async {
        let fs = sim();
        let (log, _) = open_sim(&fs, small_config());
        for i in 0..6 {
            append(&log, 3, &data(1, 2, i));
        }
        log.sync().await.unwrap();
        // Until the header claims the last sync, damage to it would look torn: bring it up to
        // date as an idle log does.
        assert!(log.header_behind());
        log.sync_header().await.unwrap();
        assert!(!log.header_behind());
        drop(log);
        let (fs, _) = fs.crash(|_| 0);
        let (path, len) = segment_files(&fs).pop().unwrap();
        // Zeros over the last 400 synced bytes (several entries).
        assert!(fs.rot(&path, |b| b[len - 400..].fill(0)));
        let (log, report) = open_sim(&fs, small_config());
        let LogTail::Damaged(d) = report.tail else {
            panic!("expected damage, got {:?}", report.tail);
        };
        assert_eq!(d.synced_through, Some(5));
        assert_eq!(d.synced_term, Some(3));
        assert!(d.first_lost_index < 6);
        assert_eq!(log.tail().next_index, d.first_lost_index);
        // The cut log is now what is claimed: a restart sees it clean.
        drop(log);
        let (fs, _) = fs.crash(|_| 0);
        let (_, report) = open_sim(&fs, small_config());
        assert_eq!(report.tail, LogTail::Clean);
    });
}

#[test]
fn a_flipped_bit_or_a_short_sealed_segment_is_damage() {
    block_on(async {
        let fs = sim();
        let (log, _) = open_sim(&fs, small_config());
        for i in 0..80 {
            append(&log, 1, &data(1, 2, i));
            if i % 10 == 9 {
                log.sync().await.unwrap();
            }
        }
        log.sync().await.unwrap();
        log.sync_header().await.unwrap();
        let all = entries(&log);
        drop(log);
        let (fs, _) = fs.crash(|_| 0);
        let files = segment_files(&fs);
        assert!(files.len() >= 3);
        // A sealed segment loses its last 100 bytes.
        let (path, len) = files[1].clone();
        assert!(fs.rot(&path, |b| b.truncate(len - 100)));
        let (log, report) = open_sim(&fs, small_config());
        let LogTail::Damaged(d) = report.tail else {
            panic!("expected damage, got {:?}", report.tail);
        };
        assert_eq!(d.synced_through, Some(79), "later segments' claims count");
        let kept = entries(&log);
        assert_eq!(kept[..], all[..kept.len()]);
        drop(log);

        // A flipped bit past the checkpoint of the last segment.
        let far_checkpoints = kiln_log::LogConfig {
            checkpoint_interval_bytes: 1 << 20,
            ..small_config()
        };
        let fs = sim();
        let (log, _) = open_sim(&fs, far_checkpoints.clone());
        for i in 0..4 {
            append(&log, 1, &data(1, 2, i));
        }
        log.sync().await.unwrap();
        log.sync_header().await.unwrap();
        drop(log);
        let (fs, _) = fs.crash(|_| 0);
        let (path, len) = segment_files(&fs).pop().unwrap();
        // Past the checkpoint (recovery trusts what lies before it; reads CRC-check that).
        assert!(fs.rot(&path, |b| b[len - 50] ^= 0x10));
        let (log, report) = open_sim(&fs, far_checkpoints);
        assert!(
            matches!(report.tail, LogTail::Damaged(ref d) if d.first_lost_index == 3 && d.synced_through == Some(3)),
            "{:?}",
            report.tail
        );
        assert_eq!(log.tail().next_index, 3);
        // Before the checkpoint, a read finds it and refuses to serve it.
        drop(log);
        let fs = sim();
        let (log, _) = open_sim(&fs, small_config());
        for i in 0..12 {
            append(&log, 1, &data(1, 2, i));
        }
        log.sync().await.unwrap();
        log.close().unwrap();
        drop(log);
        let (fs, _) = fs.crash(|_| 0);
        let (path, _) = segment_files(&fs).pop().unwrap();
        assert!(fs.rot(&path, |b| b[HEADER_LEN as usize + 200] ^= 0x10));
        let (log, report) = open_sim(&fs, small_config());
        assert_eq!(report.tail, LogTail::Clean);
        assert!(matches!(
            log.read(0, 1 << 20, i64::MAX),
            Err(kiln_log::LogError::Corrupt { .. })
        ));
        assert!(log
            .read_entries(0, 1, usize::MAX, kiln_log::ReadMode::Full)
            .is_err());
    });
}

#[test]
fn a_torn_header_slot_falls_back_to_the_other() {
    block_on(async {
        let fs = sim();
        let (log, _) = open_sim(&fs, small_config());
        for i in 0..4 {
            append(&log, 1, &data(1, 2, i));
            log.sync().await.unwrap();
        }
        log.sync_header().await.unwrap();
        let all = entries(&log);
        drop(log);
        let (fs, _) = fs.crash(|_| 0);
        let (path, _) = segment_files(&fs).pop().unwrap();
        let bytes = fs.durable_bytes(&path).unwrap();
        let a = kiln_log::header::Slot::decode(&bytes[..128]).unwrap();
        let b = kiln_log::header::Slot::decode(&bytes[512..640]).unwrap();
        let newer = if a.seq > b.seq { 0 } else { 512 };
        assert!(fs.rot(&path, |b| b[newer + 40] ^= 1));
        let (log, report) = open_sim(&fs, small_config());
        assert_ne!(report.tail, LogTail::Torn);
        assert!(
            !matches!(report.tail, LogTail::Damaged(_)),
            "the older slot claims less: {:?}",
            report.tail
        );
        assert_eq!(entries(&log), all);
    });
}

#[test]
fn a_reset_cut_short_by_a_crash_keeps_the_new_start() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open_real(dir.path(), small_config());
    for i in 0..30 {
        append(&log, 1, &data(1, 2, i));
    }
    log.close().unwrap();
    let saved: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
        .collect();
    log.reset(100, 5_000, 4).unwrap();
    append(&log, 5, &Spec::Control(ControlKind::Blank, vec![]));
    log.close().unwrap();
    drop(log);
    // The old segments come back, as if the crash came before they were removed.
    for (p, b) in saved {
        std::fs::write(p, b).unwrap();
    }
    let (log, _) = open_real(dir.path(), small_config());
    assert_eq!(entries(&log), vec![(100, 5, 5_000, -1)]);
    assert_eq!(log.first(), (100, 4));
}

#[derive(Debug, Clone)]
enum Op {
    Append {
        batches: usize,
        control: bool,
    },
    Sync,
    Header,
    Truncate(u8),
    /// Retention: whole segments up to this share of the log go.
    Purge(u8),
    /// A snapshot beyond the log: it starts over this many entries past its end.
    Reset(u8),
    Crash {
        keep_percent: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (1usize..4, proptest::bool::weighted(0.15)).prop_map(|(batches, control)| Op::Append { batches, control }),
        3 => Just(Op::Sync),
        1 => Just(Op::Header),
        1 => any::<u8>().prop_map(Op::Truncate),
        1 => any::<u8>().prop_map(Op::Purge),
        1 => (0u8..4).prop_map(Op::Reset),
        1 => (0u8..=100).prop_map(|keep_percent| Op::Crash { keep_percent }),
    ]
}

/// Runs `ops` from an empty log and checks, after every recovery, that the log holds every
/// entry a completed sync covered, unchanged, then a prefix of what was written after, and that a
/// crash alone is never reported as damage.
fn check_ops(ops: Vec<Op>) -> Result<(), TestCaseError> {
    block_on(async {
        let mut fs = sim();
        let (mut log, _) = open_sim(&fs, small_config());
        // What was appended (index, term, kafka, records) and how much of it is synced.
        let mut written = entries(&log);
        let mut synced = written.len();
        let mut term = 1;
        for op in ops {
            match op {
                Op::Append { batches, control } => {
                    let spec = if control {
                        Spec::Control(ControlKind::Blank, vec![])
                    } else {
                        data(batches, 2, 1)
                    };
                    append(&log, term, &spec);
                    written = entries(&log);
                }
                Op::Sync => {
                    log.sync().await.unwrap();
                    synced = written.len();
                }
                Op::Header => {
                    if log.header_behind() {
                        log.sync_header().await.unwrap();
                    }
                }
                Op::Truncate(at) => {
                    let at = u64::from(at) % (written.len() as u64 + 1);
                    let (first, _) = log.first();
                    log.truncate_from(first + at).unwrap();
                    written.truncate(at as usize);
                    synced = synced.min(written.len());
                    term += 1;
                }
                Op::Purge(share) => {
                    let (first, _) = log.first();
                    let through = first + u64::from(share) * written.len() as u64 / 255;
                    log.purge_through(through).unwrap();
                    let kept = entries(&log);
                    let gone = written.len() - kept.len();
                    prop_assert_eq!(&kept[..], &written[gone..]);
                    written = kept;
                    synced = synced.saturating_sub(gone);
                }
                Op::Reset(past) => {
                    let tail = log.tail();
                    let past = u64::from(past);
                    log.reset(
                        tail.next_index + past,
                        tail.next_kafka + 2 * past as i64,
                        term,
                    )
                    .unwrap();
                    written = entries(&log);
                    prop_assert!(written.is_empty());
                    synced = 0;
                }
                Op::Crash { keep_percent } => {
                    drop(log);
                    let (next, _) = fs.crash(|n| n * u64::from(keep_percent) / 100);
                    fs = next;
                    let (reopened, report) = open_sim(&fs, small_config());
                    prop_assert!(
                        !matches!(report.tail, LogTail::Damaged(_)),
                        "{:?}",
                        report.tail
                    );
                    let after = entries(&reopened);
                    prop_assert!(
                        after.len() >= synced,
                        "lost synced entries: {} of {}",
                        after.len(),
                        synced
                    );
                    prop_assert_eq!(&after[..], &written[..after.len()]);
                    written = after;
                    synced = written.len();
                    log = reopened;
                    term += 1;
                }
            }
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Random appends, syncs, truncations and power losses that keep a random part of the
    /// unsynced writes.
    #[test]
    fn nothing_synced_is_lost_and_crashes_are_never_damage(ops in proptest::collection::vec(op(), 1..80)) {
        check_ops(ops)?;
    }
}

/// A schedule the property found: after a recovery, appends roll into new segments, a
/// truncation cuts back into them, and a crash that keeps none of the unsynced writes follows.
/// Everything the recovery had found was on disk and must survive.
#[test]
fn a_truncation_after_a_recovery_keeps_what_the_recovery_found() {
    let a = |batches| Op::Append {
        batches,
        control: false,
    };
    let mut ops = vec![a(1), a(1), Op::Sync, a(1), a(1), a(1), Op::Truncate(176)];
    ops.extend(std::iter::repeat_n(a(1), 9));
    ops.push(Op::Truncate(100));
    ops.extend(std::iter::repeat_n(a(1), 4));
    ops.push(Op::Crash { keep_percent: 75 });
    ops.extend([
        a(1),
        a(2),
        a(2),
        a(1),
        a(2),
        a(1),
        a(2),
        a(3),
        a(2),
        a(1),
        a(3),
        a(1),
    ]);
    ops.push(Op::Truncate(51));
    ops.push(Op::Crash { keep_percent: 0 });
    check_ops(ops).unwrap();
}

/// A schedule the property found: a truncation back into the last synced segment after later
/// segments were rolled, then a crash that keeps almost none of the unsynced writes.
#[test]
fn a_truncation_into_the_synced_segment_then_a_crash_is_not_damage() {
    let a = |batches| Op::Append {
        batches,
        control: false,
    };
    let mut ops = vec![
        a(1),
        a(1),
        Op::Sync,
        a(1),
        a(2),
        a(1),
        a(1),
        Op::Truncate(86),
    ];
    ops.extend([a(1), a(2)]);
    ops.extend(std::iter::repeat_n(a(1), 22));
    ops.extend([a(2), Op::Truncate(69), Op::Crash { keep_percent: 1 }]);
    check_ops(ops).unwrap();
}
