//! Raft indexes and Kafka offsets: the worked example of `log.rs`'s docs, reads that leave
//! control batches out, truncation, purge and reset, and a model-based property test.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use kiln_log::{BatchHeader, ControlKind, LogError, ReadMode, StoredBody};
use proptest::prelude::*;

#[test]
fn worked_example_from_the_docs() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open_real(dir.path(), small_config());
    // 0: membership, 1: blank (term 1), 2: 5 records, 3: 1 record, 4: blank (term 2), 5: 3.
    append(
        &log,
        0,
        &Spec::Control(ControlKind::Membership, b"m".to_vec()),
    );
    append(&log, 1, &Spec::Control(ControlKind::Blank, vec![]));
    append(&log, 1, &data(1, 5, b'a'));
    append(&log, 1, &data(1, 1, b'b'));
    append(&log, 2, &Spec::Control(ControlKind::Blank, vec![]));
    append(&log, 2, &data(3, 1, b'c'));
    assert_eq!(
        entries(&log),
        vec![
            (0, 0, 0, -1),
            (1, 1, 0, -1),
            (2, 1, 0, 5),
            (3, 1, 5, 1),
            (4, 2, 6, -1),
            (5, 2, 6, 3)
        ]
    );
    assert_eq!(log.kafka_after(3).unwrap(), 6);
    assert_eq!(log.kafka_after(4).unwrap(), 6);
    assert_eq!(log.kafka_after(5).unwrap(), 9);
    assert_eq!(log.log_end_offset(), 9);
    // Reads by Kafka offset see data batches only, stamped with their term.
    let batches = read_all(&log, 1 << 20, 9);
    assert_eq!(batches.len(), 5);
    let heads: Vec<(i64, i32)> = batches
        .iter()
        .map(|b| {
            let h = BatchHeader::parse(b).unwrap();
            (h.base_offset, h.partition_leader_epoch)
        })
        .collect();
    assert_eq!(heads, vec![(0, 1), (5, 1), (6, 2), (7, 2), (8, 2)]);
    let r = log.read(6, 1, 9).unwrap();
    assert_eq!(r.next_offset, 7, "at least one whole batch");
    assert_eq!(log.read(3, 1 << 20, 6).unwrap().next_offset, 6);
    assert_eq!(log.read(3, 1 << 20, 5).unwrap().next_offset, 5);
    assert!(
        log.read(0, 1 << 20, 0).unwrap().records.is_empty(),
        "nothing below max_offset 0"
    );
    // A follower that truncates from 4 reuses offset 6.
    log.truncate_from(4).unwrap();
    assert_eq!(log.tail().next_kafka, 6);
    assert_eq!(log.tail().last_term, 1);
    append(&log, 3, &Spec::Control(ControlKind::Blank, vec![]));
    append(&log, 3, &data(1, 2, b'd'));
    assert_eq!(entries(&log)[4..], [(4, 3, 6, -1), (5, 3, 6, 2)]);
    // Reopened, it reads the same.
    let before = entries(&log);
    log.close().unwrap();
    drop(log);
    let (log, report) = open_real(dir.path(), small_config());
    assert_eq!(report.tail, kiln_log::LogTail::Clean);
    assert_eq!(entries(&log), before);
    assert_eq!(log.tail().next_kafka, 8);
}

#[test]
fn entries_are_read_whole_by_index_and_summaries_skip_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open_real(dir.path(), small_config());
    for i in 0..40u8 {
        append(&log, 1, &data(1 + usize::from(i % 3), 2, i));
    }
    let all = log.read_entries(0, 40, usize::MAX, ReadMode::Full).unwrap();
    assert_eq!(all.len(), 40);
    assert!(log.segments().len() > 3, "small segments roll");
    for (i, e) in all.iter().enumerate() {
        let StoredBody::Records {
            batches,
            record_count,
        } = &e.body
        else {
            panic!("data entry expected");
        };
        assert_eq!(*record_count as usize, 2 * (1 + i % 3));
        assert_eq!(split_batches(batches).len(), 1 + i % 3);
    }
    let some = log
        .read_entries(17, 23, usize::MAX, ReadMode::Summary)
        .unwrap();
    assert_eq!(
        some.iter().map(|e| e.index).collect::<Vec<_>>(),
        (17..23).collect::<Vec<_>>()
    );
    assert!(some
        .iter()
        .all(|e| matches!(e.body, StoredBody::Summary { .. })));
    assert_eq!(some[0].kafka_offset, all[17].kafka_offset);
    // A byte bound stops early, but never before one entry.
    assert_eq!(log.read_entries(5, 40, 0, ReadMode::Full).unwrap().len(), 1);
}

#[test]
fn purge_drops_whole_segments_and_reset_starts_over() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open_real(dir.path(), small_config());
    for i in 0..60u8 {
        append(&log, 1, &data(1, 3, i));
    }
    common::block_on(log.sync()).unwrap();
    let segs = log.segments();
    let cut = segs[2].next_index - 1;
    let report = log.purge_through(cut).unwrap();
    assert_eq!(report.segments_deleted, 3);
    assert_eq!(log.first().0, segs[3].base_index);
    assert_eq!(log.log_start_offset(), segs[3].base_kafka);
    assert!(matches!(
        log.read(0, 100, i64::MAX),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    // Purging into the middle of a segment leaves it.
    assert_eq!(
        log.purge_through(segs[3].base_index)
            .unwrap()
            .segments_deleted,
        0
    );
    log.reset(500, 10_000, 7).unwrap();
    assert_eq!(log.first(), (500, 7));
    assert_eq!(log.tail().next_kafka, 10_000);
    append(&log, 8, &data(1, 2, 1));
    assert_eq!(entries(&log), vec![(500, 8, 10_000, 2)]);
    log.close().unwrap();
    drop(log);
    let (log, _) = open_real(dir.path(), small_config());
    assert_eq!(entries(&log), vec![(500, 8, 10_000, 2)]);
    assert_eq!(log.log_start_offset(), 10_000);
}

#[test]
fn retention_point_covers_old_closed_segments_only() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open_real(dir.path(), small_config());
    for i in 0..60u8 {
        append(&log, 1, &data(1, 3, i));
    }
    let segs = log.segments();
    let total: u64 = segs.iter().map(|s| s.size_bytes).sum();
    // Timestamps are 1000: a retention of 10 ms at time 2000 removes every closed segment.
    let (index, kafka) = log
        .retention_point(2_000, Some(10), None, u64::MAX)
        .unwrap();
    let last_closed = segs.iter().rev().find(|s| !s.active).unwrap();
    assert_eq!(
        (index, kafka),
        (last_closed.next_index - 1, last_closed.next_kafka)
    );
    // ... but none whose entries are not yet committed.
    assert_eq!(
        log.retention_point(2_000, Some(10), None, segs[0].next_index - 2),
        None
    );
    assert_eq!(
        log.retention_point(2_000, Some(10), None, segs[0].next_index - 1)
            .unwrap()
            .0,
        segs[0].next_index - 1
    );
    // By size: just enough oldest segments to get under the bound.
    let (index, _) = log
        .retention_point(0, None, Some(total - segs[0].size_bytes), u64::MAX)
        .unwrap();
    assert_eq!(index, segs[0].next_index - 1);
    assert_eq!(log.retention_point(0, None, Some(total), u64::MAX), None);
}

#[test]
fn out_of_order_appends_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open_real(dir.path(), small_config());
    append(&log, 2, &data(1, 1, 0));
    let body = batch_of(1, 1, 0, 0);
    let bad_index = kiln_log::NewEntry {
        index: 5,
        term: 2,
        body: kiln_log::EntryBody::Records(body.clone().into()),
    };
    assert!(matches!(
        log.append(&mut [bad_index], 0),
        Err(LogError::OutOfOrder(_))
    ));
    let old_term = kiln_log::NewEntry {
        index: 1,
        term: 1,
        body: kiln_log::EntryBody::Records(body.clone().into()),
    };
    assert!(matches!(
        log.append(&mut [old_term], 0),
        Err(LogError::OutOfOrder(_))
    ));
    let garbage = kiln_log::NewEntry {
        index: 1,
        term: 2,
        body: kiln_log::EntryBody::Records(bytes::Bytes::from_static(
            b"not a batch at all, not even close to one.......!",
        )),
    };
    assert!(log.append(&mut [garbage], 0).is_err());
    assert_eq!(log.tail().next_index, 1);
}

#[derive(Debug, Clone)]
enum Op {
    Data { batches: usize, records: usize },
    Blank,
    NewTerm,
    Truncate(u64),
    Sync,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1usize..4, 1usize..4).prop_map(|(batches, records)| Op::Data { batches, records }),
        1 => Just(Op::Blank),
        1 => Just(Op::NewTerm),
        1 => (0u64..30).prop_map(Op::Truncate),
        2 => Just(Op::Sync),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Against a naive model (the list of entries with their record counts): indexes, terms
    /// and Kafka offsets agree after any sequence of appends and truncations, and after a
    /// reopen.
    #[test]
    fn matches_a_naive_model(ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = open_real(dir.path(), small_config());
        let mut model: Vec<(u64, Option<u32>)> = Vec::new(); // (term, records or None for control)
        let mut term = 1;
        for op in ops {
            match op {
                Op::Data { batches, records } => {
                    append(&log, term, &data(batches, records, 7));
                    model.push((term, Some((batches * records) as u32)));
                }
                Op::Blank => {
                    append(&log, term, &Spec::Control(ControlKind::Blank, vec![]));
                    model.push((term, None));
                }
                Op::NewTerm => term += 1,
                Op::Truncate(at) => {
                    let at = at.min(model.len() as u64);
                    log.truncate_from(at).unwrap();
                    model.truncate(at as usize);
                }
                Op::Sync => common::block_on(log.sync()).unwrap(),
            }
            let mut kafka = 0i64;
            let expected: Vec<(u64, u64, i64, i64)> = model
                .iter()
                .enumerate()
                .map(|(i, (t, n))| {
                    let row = (i as u64, *t, kafka, n.map_or(-1, i64::from));
                    kafka += i64::from(n.unwrap_or(0));
                    row
                })
                .collect();
            prop_assert_eq!(entries(&log), expected);
            prop_assert_eq!(log.log_end_offset(), kafka);
            let records: usize = read_all(&log, 1 << 20, i64::MAX).iter().map(|b| BatchHeader::parse(b).unwrap().record_count as usize).sum();
            prop_assert_eq!(records as i64, kafka);
        }
        let before = entries(&log);
        log.close().unwrap();
        drop(log);
        let (log, _) = open_real(dir.path(), small_config());
        prop_assert_eq!(entries(&log), before);
    }
}

/// Records the log holds the only reference to are stamped where they lie (no copy); records
/// someone else still holds are stamped on a copy, so the other holder never sees them change.
/// Either way the entry afterwards holds the records as stored, and appending those again (after
/// a rewind) writes the same bytes.
#[test]
fn records_are_stamped_in_place_only_when_the_log_holds_them_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open_real(dir.path(), small_config());
    let unique = bytes::Bytes::from(batch_of(3, 10, 1, 0));
    let unique_at = unique.as_ptr();
    let mut entries = [kiln_log::NewEntry {
        index: 0,
        term: 1,
        body: kiln_log::EntryBody::Records(unique),
    }];
    let stored = log.append(&mut entries, 0).unwrap();
    assert_eq!(stored[0].as_ptr(), unique_at, "stamped in place");
    assert_eq!(
        entries[0].body,
        kiln_log::EntryBody::Records(stored[0].clone())
    );

    let plain = batch_of(2, 10, 2, 0);
    let kept = bytes::Bytes::from(plain.clone());
    let mut entries = [kiln_log::NewEntry {
        index: 1,
        term: 1,
        body: kiln_log::EntryBody::Records(kept.clone()),
    }];
    let stored = log.append(&mut entries, 0).unwrap();
    assert_eq!(
        kept.as_ref(),
        plain.as_slice(),
        "another holder's bytes are untouched"
    );
    assert_ne!(stored[0].as_ptr(), kept.as_ptr());
    assert_ne!(
        stored[0].as_ref(),
        plain.as_slice(),
        "the stored copy is stamped"
    );

    // Written again from the stamped form: byte for byte the same.
    let before = log
        .read_entries(1, 2, usize::MAX, kiln_log::ReadMode::Full)
        .unwrap();
    log.truncate_from(1).unwrap();
    let again = log.append(&mut entries, 0).unwrap();
    assert_eq!(again[0], stored[0]);
    let after = log
        .read_entries(1, 2, usize::MAX, kiln_log::ReadMode::Full)
        .unwrap();
    assert_eq!(format!("{before:?}"), format!("{after:?}"));
    assert_eq!(log.tail().next_kafka, 5);
}
