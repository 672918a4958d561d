//! The committed-offsets table on its own, and through a broker restart.
//!
//! - A property test: random commits and group deletions, applied as commit batches in log
//!   order, with snapshots restored into a fresh table at random points, always equal a plain
//!   map of the latest values (what replay after a restart must rebuild).
//! - Bad bytes in the log or in a snapshot are counted or refused, never a panic.
//! - Through a broker: after many commits the table is snapshotted, a restart replays the
//!   snapshot and the commits after it (not every commit), and answers every latest offset.
#![allow(clippy::unwrap_used)]

mod groups_common;

use std::collections::BTreeMap;

use bytes::Bytes;
use kiln_broker::groups::offsets::{encode_changes, OffsetsTable};
use kiln_broker::groups::records::{Committed, OffsetKey};
use kiln_raft::Table;
use proptest::prelude::*;

const GROUPS: [&str; 3] = ["burnin", "triage", "audit"];

fn key(k: u8) -> OffsetKey {
    OffsetKey {
        group: GROUPS[usize::from(k % 3)].to_string(),
        topic: format!("t{}", k % 2),
        partition: i32::from(k % 5),
    }
}

fn committed(offset: i64, metadata: Option<String>) -> Committed {
    Committed {
        offset,
        leader_epoch: -1,
        metadata,
        commit_time_ms: 1_700_000_000_000,
        reset: false,
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// One commit request: several keys at once.
    Commit(Vec<(u8, i64, Option<String>)>),
    DeleteGroup(u8),
    /// Snapshot the table and restore it into a fresh one (a restart, or a follower that
    /// installs the leader's snapshot).
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop::collection::vec(
            (any::<u8>(), 0i64..1_000_000, prop::option::of("[a-z]{0,8}")),
            1..6
        )
        .prop_map(Op::Commit),
        1 => any::<u8>().prop_map(Op::DeleteGroup),
        1 => Just(Op::Restart),
    ]
}

fn contents(table: &OffsetsTable) -> BTreeMap<OffsetKey, (i64, Option<String>)> {
    table
        .entries()
        .into_iter()
        .map(|(k, v)| (k, (v.offset, v.metadata)))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn applying_commits_and_restoring_snapshots_equals_the_latest_values(ops in prop::collection::vec(op(), 1..60)) {
        let mut table = OffsetsTable::default();
        let mut model: BTreeMap<OffsetKey, (i64, Option<String>)> = BTreeMap::new();
        let mut index = 0u64;
        for op in ops {
            match op {
                Op::Commit(changes) => {
                    let changes: Vec<_> = changes
                        .into_iter()
                        .map(|(k, o, m)| (key(k), Some(committed(o, m))))
                        .collect();
                    for (k, v) in &changes {
                        let v = v.as_ref().unwrap();
                        model.insert(k.clone(), (v.offset, v.metadata.clone()));
                    }
                    let batch = encode_changes(&changes, 0).unwrap();
                    index += 1;
                    table.apply(index, 0, &batch);
                }
                Op::DeleteGroup(g) => {
                    let group = GROUPS[usize::from(g % 3)];
                    let doomed: Vec<_> = model.keys().filter(|k| k.group == group).cloned().collect();
                    if doomed.is_empty() {
                        continue;
                    }
                    let changes: Vec<_> = doomed.iter().map(|k| (k.clone(), None)).collect();
                    for k in &doomed {
                        model.remove(k);
                    }
                    index += 1;
                    table.apply(index, 0, &encode_changes(&changes, 0).unwrap());
                }
                Op::Restart => {
                    let snapshot = table.snapshot().unwrap();
                    let fresh = OffsetsTable::default();
                    fresh.restore(&snapshot).unwrap();
                    table = fresh;
                }
            }
            prop_assert_eq!(&contents(&table), &model);
        }
    }
}

#[test]
fn bad_bytes_in_the_log_are_skipped_and_counted_and_a_bad_snapshot_is_refused() {
    let table = OffsetsTable::default();
    let good = encode_changes(&[(key(1), Some(committed(7, None)))], 0).unwrap();
    table.apply(1, 0, &good);
    table.apply(
        2,
        1,
        &Bytes::from_static(b"this is not a record batch at all........"),
    );
    let (applied, keys, skipped) = table.stats();
    assert_eq!((applied, keys), (1, 1));
    assert!(skipped >= 1, "the bad entry is counted: {skipped}");
    // Garbage as a snapshot is an error (the replica stops), and the table keeps what it had.
    assert!(table
        .restore(b"garbage garbage garbage garbage garbage garbage garbage")
        .is_err());
    assert_eq!(table.stats().1, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_replays_the_last_snapshot_and_answers_every_latest_offset() {
    use groups_common::*;
    let dir = tempfile::tempdir().unwrap();
    // A snapshot every 20 commit requests; 400 requests to 6 keys.
    let tweak = |c: &mut kiln_broker::BrokerConfig| c.offsets_compact_min_records = 20;
    let b = start(dir.path().to_path_buf(), tweak).await;
    let mut conn = b.connect().await;
    create_topic(&mut conn, "t", 3).await;
    for p in 0..3 {
        produce(&mut conn, "t", p, 500).await;
    }
    for round in 1..=400i64 {
        let p = (round % 3) as i32;
        let group = if round % 2 == 0 { "a" } else { "b" };
        let errors = commit(&mut conn, group, -1, "", &[("t", p, round, Some("m"))]).await;
        assert_eq!(errors, vec![0], "round {round}");
    }
    drop(conn);
    let dir_path = b.stop().await;
    let b = start(dir_path, tweak).await;
    let (records, keys, skipped) = b.broker.groups.store().stats();
    assert_eq!((keys, skipped), (6, 0));
    // The restored table (6 records) plus the commits after the last snapshot (fewer than 20
    // requests, one record each), not all 400.
    assert!(
        records < 6 + 20 + 5,
        "a restart replays the table and what follows it, not every commit ({records} records)"
    );
    let mut conn = b.connect().await;
    for (group, p, last) in [
        ("a", 0, 396),
        ("a", 1, 400),
        ("a", 2, 398),
        ("b", 0, 399),
        ("b", 1, 397),
        ("b", 2, 395),
    ] {
        assert_eq!(
            fetch_offset(&mut conn, group, "t", p).await,
            (last, Some("m".into()), 0),
            "{group} t/{p}"
        );
    }
    b.stop().await;
}
