//! The consumer-offsets group of the simulated cluster: a consumer that commits offsets
//! through the group's leader, and a coordinator that rebuilds the committed offsets from the
//! group's log, as a new group coordinator does before serving.
//!
//! Each commit is one record batch, key = `group/topic/partition`, value = the offset (8 bytes,
//! big-endian). The consumer commits one key at a time per key task, each offset higher than
//! the last it submitted, and counts a commit only once it is acknowledged. The coordinator,
//! every 20-120 ms, picks the offsets leader, waits for `ensure_linearizable`, reads the log
//! below the high watermark and keeps the latest value per key.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use openraft::EntryPayload;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::batch::{build_keyed_batch, keyed_records};
use super::{leader_of, lock, log_line, Ack, Shared, SimRouter, OFFSETS};
use crate::disk::{Disk, SimDisk};
use crate::partition::{PartitionError, ReadBatch, ReplicatedPartition};
use crate::recovery::scan_log;
use crate::types::{Batches, NodeId};

/// The keys the consumer commits (group/topic/partition).
pub(super) const KEYS: [&str; 3] = [
    "burnin/kiln.nodes/0",
    "burnin/kiln.nodes/1",
    "triage/kiln.nodes.dlq/0",
];

/// The key of the marker entry committed after healing (not a consumer's key).
pub(super) const MARKER_KEY: &str = "__marker";

/// What the offsets group's client side recorded during the run.
#[derive(Default)]
pub(super) struct OffsetsShared {
    /// Every acknowledged append to the group (commits and the final marker).
    pub(super) acks: Vec<Ack>,
    /// Acknowledged commits: (key, offset, acknowledged at).
    pub(super) commits: Vec<(String, i64, Instant)>,
    /// Commits that failed or timed out (outcome unknown).
    pub(super) failed: usize,
    /// The highest offset submitted per key (acknowledged or not).
    pub(super) submitted: BTreeMap<String, i64>,
    /// Every rebuild, in the order it finished.
    pub(super) rebuilds: Vec<Rebuild>,
    /// (replica, batch) every rebuild read.
    pub(super) reads: Vec<(NodeId, ReadBatch)>,
    /// Each broker's offsets log file, for the broken rebuild that reads past the high
    /// watermark.
    pub(super) disks: BTreeMap<NodeId, SimDisk>,
    /// Batches a rebuild could not decode.
    pub(super) undecodable: usize,
}

/// One rebuild of the committed offsets.
pub(super) struct Rebuild {
    pub(super) n: usize,
    pub(super) by: NodeId,
    /// When it began (before `ensure_linearizable`).
    pub(super) began: Instant,
    pub(super) high_watermark: i64,
    pub(super) values: BTreeMap<String, i64>,
}

/// The batch one commit appends.
pub(super) fn commit_batch(key: &str, offset: i64) -> Bytes {
    Bytes::from(build_keyed_batch(
        &[(Some(key.as_bytes()), &offset.to_be_bytes())],
        offset,
    ))
}

/// The latest offset per key over `batches`, in log order, and how many batches (or records)
/// could not be decoded.
pub(super) fn latest<'a>(
    batches: impl Iterator<Item = &'a [u8]>,
) -> (BTreeMap<String, i64>, usize) {
    let mut values = BTreeMap::new();
    let mut bad = 0;
    for b in batches {
        let Some(records) = keyed_records(b) else {
            bad += 1;
            continue;
        };
        for (key, value) in records {
            let key = key.and_then(|k| String::from_utf8(k).ok());
            let value: Option<[u8; 8]> = value.as_slice().try_into().ok();
            match (key, value) {
                (Some(k), Some(v)) => {
                    values.insert(k, i64::from_be_bytes(v));
                }
                _ => bad += 1,
            }
        }
    }
    values.remove(MARKER_KEY);
    (values, bad)
}

/// One consumer key: commits rising offsets until `until`, one at a time.
pub(super) async fn consumer(
    key: &'static str,
    router: SimRouter,
    shared: Arc<Mutex<Shared>>,
    start: Instant,
    until: Instant,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut offset = 0i64;
    let mut n = 0usize;
    loop {
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..150))).await;
        if Instant::now() >= until {
            return;
        }
        offset += rng.random_range(1..=20);
        n += 1;
        lock(&shared).off.submitted.insert(key.to_string(), offset);
        let batch = commit_batch(key, offset);
        let began = Instant::now();
        let replicas = router.replicas(OFFSETS);
        let mut target = leader_of(&replicas).or_else(|| replicas.first().cloned());
        let mut tries = 0;
        let res = loop {
            let Some(t) = target.clone() else {
                break None;
            };
            tries += 1;
            let res = tokio::time::timeout(Duration::from_secs(3), t.append(batch.clone())).await;
            // Follow the coordinator hint, as a consumer does after NOT_COORDINATOR.
            if let Ok(Err(PartitionError::NotLeader { leader: Some(l) })) = &res {
                if tries < 3 {
                    if let Some(next) = router.replicas(OFFSETS).into_iter().find(|r| r.id() == *l)
                    {
                        target = Some(next);
                        continue;
                    }
                }
            }
            break Some((t.id(), res));
        };
        match res {
            Some((via, Ok(Ok(ack)))) => {
                log_line(
                    &shared,
                    start,
                    format!(
                        "ack commit {key}={offset} via offsets replica {via}: offset {} epoch {}",
                        ack.base_offset, ack.leader_epoch
                    ),
                );
                let done = Instant::now();
                let mut s = lock(&shared);
                s.off.acks.push((n, ack, began, done, batch));
                s.off.commits.push((key.to_string(), offset, done));
            }
            Some((_, Ok(Err(e)))) => {
                let why = match e {
                    PartitionError::NotLeader { .. } => "not leader".to_string(),
                    other => other.to_string(),
                };
                log_line(
                    &shared,
                    start,
                    format!("commit {key}={offset} failed: {why}"),
                );
                lock(&shared).off.failed += 1;
            }
            Some((_, Err(_))) => {
                log_line(
                    &shared,
                    start,
                    format!("commit {key}={offset} timed out (outcome unknown)"),
                );
                lock(&shared).off.failed += 1;
            }
            None => {
                log_line(
                    &shared,
                    start,
                    format!("commit {key}={offset}: no replica up"),
                );
                lock(&shared).off.failed += 1;
            }
        }
    }
}

/// The coordinator: rebuilds the committed offsets every 20-120 ms until `until`.
pub(super) async fn coordinator(
    router: SimRouter,
    shared: Arc<Mutex<Shared>>,
    start: Instant,
    until: Instant,
    seed: u64,
    past_high_watermark: bool,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    loop {
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..120))).await;
        if Instant::now() >= until {
            return;
        }
        rebuild(&router, &shared, start, past_high_watermark).await;
    }
}

/// Every batch in `disk`'s log file, committed or not (the broken rebuild).
fn whole_log(disk: &SimDisk) -> Vec<Bytes> {
    let Ok(bytes) = disk.read_all() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (_, entry) in scan_log(&bytes).entries {
        if let EntryPayload::Normal(Batches(buf)) = &entry.payload {
            for b in kiln_log::batch::batches(buf).flatten() {
                out.push(Bytes::copy_from_slice(b.bytes));
            }
        }
    }
    out
}

/// One rebuild, as a new coordinator does it: on the offsets leader, `ensure_linearizable`,
/// then the log below the high watermark (or, when `past_high_watermark`, everything the
/// leader has written: the bug the checker must catch). Returns whether it happened.
pub(super) async fn rebuild(
    router: &SimRouter,
    shared: &Arc<Mutex<Shared>>,
    start: Instant,
    past_high_watermark: bool,
) -> bool {
    let Some(leader) = leader_of(&router.replicas(OFFSETS)) else {
        return false;
    };
    let began = Instant::now();
    let ready =
        tokio::time::timeout(Duration::from_secs(1), leader.raft().ensure_linearizable()).await;
    if !matches!(ready, Ok(Ok(_))) {
        return false;
    }
    // A coordinator that crashed while it waited serves nothing.
    if !router.lock().up.contains_key(&(OFFSETS, leader.id())) {
        return false;
    }
    record_rebuild(&leader, shared, start, began, past_high_watermark)
}

/// Reads `leader`'s offsets log and records what the rebuild saw.
pub(super) fn record_rebuild(
    leader: &ReplicatedPartition,
    shared: &Arc<Mutex<Shared>>,
    start: Instant,
    began: Instant,
    past_high_watermark: bool,
) -> bool {
    let high_watermark = leader.high_watermark();
    let (values, bad, read) = if past_high_watermark {
        let disk = lock(shared).off.disks.get(&leader.id()).cloned();
        let batches = disk.map(|d| whole_log(&d)).unwrap_or_default();
        let (values, bad) = latest(batches.iter().map(|b| b.as_ref()));
        (values, bad, Vec::new())
    } else {
        let Ok(batches) = leader.read(0, usize::MAX) else {
            return false;
        };
        let (values, bad) = latest(batches.iter().map(|b| b.bytes.as_ref()));
        (values, bad, batches)
    };
    let n = {
        let mut s = lock(shared);
        let n = s.off.rebuilds.len();
        s.off.undecodable += bad;
        s.off
            .reads
            .extend(read.into_iter().map(|b| (leader.id(), b)));
        n
    };
    let shown: Vec<String> = values.iter().map(|(k, v)| format!("{k}={v}")).collect();
    log_line(
        shared,
        start,
        format!(
            "rebuild {n} by offsets replica {} {} hw {high_watermark}: {}",
            leader.id(),
            if past_high_watermark { "past" } else { "below" },
            shown.join(" ")
        ),
    );
    lock(shared).off.rebuilds.push(Rebuild {
        n,
        by: leader.id(),
        began,
        high_watermark,
        values,
    });
    true
}
