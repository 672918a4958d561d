//! The committed-offsets store on its own: a property test of random commit sequences, resets,
//! group deletions, reopens and compactions (committed offsets are monotonic except across
//! resets; replay after reopen equals the in-memory state), and compaction interrupted at every
//! step (the store reopens as the old log or the new one, never neither, never less).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;

use kiln_broker::groups::offsets::{
    CommitKind, CommitOutcome, CommitRequest, CompactStep, OffsetsStore, StoreConfig,
};
use kiln_broker::groups::records::OffsetKey;
use proptest::prelude::*;

const GROUPS: [&str; 2] = ["burnin", "triage"];

fn key(k: u8) -> OffsetKey {
    OffsetKey {
        group: GROUPS[usize::from(k % 2)].to_string(),
        topic: if k % 4 < 2 {
            "kiln.nodes"
        } else {
            "kiln.nodes.dlq"
        }
        .to_string(),
        partition: i32::from(k / 4),
    }
}

fn open(dir: &Path) -> OffsetsStore {
    OffsetsStore::open(dir, StoreConfig::default()).unwrap().0
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Commits and waits until durable (as the OffsetCommit handler does before answering).
fn commit(
    rt: &tokio::runtime::Runtime,
    store: &OffsetsStore,
    k: u8,
    offset: i64,
    kind: CommitKind,
) -> CommitOutcome {
    let request = CommitRequest {
        key: key(k),
        offset,
        leader_epoch: -1,
        metadata: Some(format!("m{offset}")),
        kind,
    };
    let (outcomes, ticket) = store.commit(&[request], 1_000).unwrap();
    rt.block_on(store.wait(ticket)).unwrap();
    outcomes[0]
}

fn state(store: &OffsetsStore) -> BTreeMap<OffsetKey, (i64, Option<String>)> {
    store
        .snapshot()
        .into_iter()
        .map(|(k, c)| (k, (c.offset, c.metadata)))
        .collect()
}

#[derive(Debug, Clone)]
enum Op {
    Member(u8, i64),
    Reset(u8, i64),
    DeleteGroup(u8),
    Reopen,
    Compact,
    CrashDuringCompaction(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u8..16, 0i64..50).prop_map(|(k, o)| Op::Member(k, o)),
        2 => (0u8..16, 0i64..50).prop_map(|(k, o)| Op::Reset(k, o)),
        1 => (0u8..2).prop_map(Op::DeleteGroup),
        1 => Just(Op::Reopen),
        1 => Just(Op::Compact),
        1 => (0u8..4).prop_map(Op::CrashDuringCompaction),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn committed_offsets_are_monotonic_except_across_resets(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = runtime();
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        // The model: what must be committed, by key.
        let mut model: BTreeMap<OffsetKey, (i64, Option<String>)> = BTreeMap::new();
        for op in ops {
            let before = state(&store);
            match op {
                Op::Member(k, offset) => {
                    let outcome = commit(&rt, &store, k, offset, CommitKind::Member);
                    match model.get(&key(k)) {
                        Some((current, _)) if offset < *current => {
                            prop_assert_eq!(outcome, CommitOutcome::KeptHigher { kept: *current });
                        }
                        _ => {
                            prop_assert_eq!(outcome, CommitOutcome::Written);
                            model.insert(key(k), (offset, Some(format!("m{offset}"))));
                        }
                    }
                    // Invariant 4: a member commit never moves any offset backwards.
                    let after = state(&store);
                    for (k, (o, _)) in &before {
                        let now = after.get(k).map(|(o, _)| *o);
                        prop_assert!(now.is_some_and(|n| n >= *o), "{:?} moved from {} to {:?}", k, o, now);
                    }
                }
                Op::Reset(k, offset) => {
                    prop_assert_eq!(commit(&rt, &store, k, offset, CommitKind::Reset), CommitOutcome::Written);
                    model.insert(key(k), (offset, Some(format!("m{offset}"))));
                }
                Op::DeleteGroup(g) => {
                    let group = GROUPS[usize::from(g)];
                    if let Some(ticket) = store.delete_group(group, 1_000).unwrap() {
                        rt.block_on(store.wait(ticket)).unwrap();
                    }
                    model.retain(|k, _| k.group != group);
                }
                Op::Reopen => {
                    let in_memory = state(&store);
                    store.close();
                    drop(store);
                    store = open(dir.path());
                    prop_assert_eq!(&state(&store), &in_memory, "replay differs from memory");
                }
                Op::Compact => {
                    store.compact().unwrap();
                    let (records, live, _) = store.stats();
                    prop_assert_eq!(records, live, "a compacted log holds only live keys");
                }
                Op::CrashDuringCompaction(step) => {
                    let step = [CompactStep::Written, CompactStep::Synced, CompactStep::PointerWritten, CompactStep::Switched][usize::from(step)];
                    let _ = store.compact_stopping_at(step);
                    drop(store);
                    store = open(dir.path());
                }
            }
            prop_assert_eq!(&state(&store), &model);
        }
        store.close();
        drop(store);
        let store = open(dir.path());
        prop_assert_eq!(&state(&store), &model, "final replay");
    }
}

/// Compaction bounds the log: many commits to few keys, then one compaction leaves one record
/// per key, and a restart replays only those.
#[test]
fn compaction_bounds_what_a_restart_replays() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        compact_min_records: 100,
        compact_ratio: 4,
    };
    let (store, _) = OffsetsStore::open(dir.path(), config.clone()).unwrap();
    for round in 0..60i64 {
        for k in 0..8u8 {
            commit(&rt, &store, k, round, CommitKind::Member);
        }
    }
    assert!(store.needs_compaction());
    let report = store.compact().unwrap().unwrap();
    assert_eq!(
        (report.records_before, report.live_keys, report.generation),
        (480, 8, 1)
    );
    assert!(!store.needs_compaction());
    let expected = state(&store);
    // Commits after compaction go to the new log and survive too.
    commit(&rt, &store, 0, 100, CommitKind::Member);
    let expected_after = {
        let mut e = expected.clone();
        e.insert(key(0), (100, Some("m100".into())));
        e
    };
    store.close();
    drop(store);
    let (store, report) = OffsetsStore::open(dir.path(), config).unwrap();
    assert_eq!(report.records_replayed, 9, "8 live keys plus one commit");
    assert_eq!(report.generation, 1);
    assert_eq!(state(&store), expected_after);
    let entries: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        entries.contains(&"log-1".to_string()) && !entries.contains(&"log-0".to_string()),
        "{entries:?}"
    );
}

/// Stopping compaction after each step and reopening gives back every committed offset: the old
/// log before the CURRENT rename, the new one after it.
#[test]
fn compaction_interrupted_at_every_step_keeps_every_offset() {
    let rt = runtime();
    for step in [
        CompactStep::Written,
        CompactStep::Synced,
        CompactStep::PointerWritten,
        CompactStep::Switched,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        for round in 0..20i64 {
            for k in 0..6u8 {
                commit(
                    &rt,
                    &store,
                    k,
                    round * 10 + i64::from(k),
                    CommitKind::Member,
                );
            }
        }
        commit(&rt, &store, 3, 1, CommitKind::Reset);
        let expected = state(&store);
        let _ = store.compact_stopping_at(step);
        drop(store);
        let (store, report) = OffsetsStore::open(dir.path(), StoreConfig::default()).unwrap();
        assert_eq!(state(&store), expected, "after stopping at {step:?}");
        let generation = if step >= CompactStep::Switched { 1 } else { 0 };
        assert_eq!(report.generation, generation, "{step:?}");
        let logs: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("log-"))
            .collect();
        assert_eq!(
            logs,
            vec![format!("log-{generation}")],
            "leftovers removed after {step:?}"
        );
    }
}
