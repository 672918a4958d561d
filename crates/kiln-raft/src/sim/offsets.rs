//! The consumer-offsets group of the simulated cluster, a table group as the broker's is: a
//! consumer commits offsets through the group's leader, every replica applies them to a
//! [`SimTable`] (latest offset per key), the table is snapshotted and the log behind it purged,
//! and a coordinator reads the leader's table as a new group coordinator does before serving.
//!
//! Each commit is one record batch, key = `group/topic/partition`, value = the offset (8 bytes,
//! big-endian). The consumer commits one key at a time per key task, each offset higher than
//! the last it submitted, and counts a commit only once it is acknowledged. The coordinator,
//! every 20-120 ms, picks the offsets leader, waits for `ensure_linearizable` and reads its
//! table.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::Rng;
use tokio::time::Instant;

use super::batch::{build_keyed_batch, keyed_records};
use super::{leader_of, lock, log_line, split, Ack, ReadBatch, Shared, SimRouter, OFFSETS};
use crate::partition::{PartitionError, ReplicatedPartition};
use crate::record::Reader;
use crate::rng::StableRng;
use crate::state_machine::Table;
use crate::types::NodeId;

/// The keys the consumer commits (group/topic/partition).
pub(super) const KEYS: [&str; 3] = [
    "burnin/kiln.nodes/0",
    "burnin/kiln.nodes/1",
    "triage/kiln.nodes.dlq/0",
];

/// The key of the marker entry committed after healing (not a consumer's key).
pub(super) const MARKER_KEY: &str = "__marker";

/// The latest offset per key, applied in log order.
#[derive(Default)]
pub(super) struct SimTable {
    values: Mutex<BTreeMap<String, i64>>,
    /// Records that did not decode (the checker reports them).
    pub(super) undecodable: Mutex<usize>,
}

impl SimTable {
    pub(super) fn values(&self) -> BTreeMap<String, i64> {
        let mut v = lock_table(&self.values).clone();
        v.remove(MARKER_KEY);
        v
    }
}

fn lock_table<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Table for SimTable {
    fn apply(&self, _index: u64, _kafka_offset: i64, batches: &Bytes) {
        let mut values = lock_table(&self.values);
        for b in kiln_log::batch::batches(batches) {
            let Ok(b) = b else {
                *lock_table(&self.undecodable) += 1;
                return;
            };
            apply_batch(&mut values, b.bytes, &self.undecodable);
        }
    }

    fn snapshot(&self) -> Result<Vec<u8>, String> {
        let values = lock_table(&self.values);
        let mut out = Vec::new();
        out.extend_from_slice(&(values.len() as u32).to_be_bytes());
        for (k, v) in values.iter() {
            out.extend_from_slice(&(k.len() as u32).to_be_bytes());
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(&v.to_be_bytes());
        }
        Ok(out)
    }

    fn restore(&self, snapshot: &[u8]) -> Result<(), String> {
        let mut r = Reader::new(snapshot);
        let bad = || "sim table snapshot does not decode".to_string();
        let n = r.u32().ok_or_else(bad)?;
        let mut values = BTreeMap::new();
        for _ in 0..n {
            let len = r.u32().ok_or_else(bad)? as usize;
            let key =
                String::from_utf8(r.take(len).ok_or_else(bad)?.to_vec()).map_err(|_| bad())?;
            values.insert(key, r.i64().ok_or_else(bad)?);
        }
        if !r.done() {
            return Err(bad());
        }
        *lock_table(&self.values) = values;
        Ok(())
    }
}

fn apply_batch(values: &mut BTreeMap<String, i64>, batch: &[u8], undecodable: &Mutex<usize>) {
    let Some(records) = keyed_records(batch) else {
        *lock_table(undecodable) += 1;
        return;
    };
    for (key, value) in records {
        let key = key.and_then(|k| String::from_utf8(k).ok());
        let value: Option<[u8; 8]> = value.as_slice().try_into().ok();
        match (key, value) {
            (Some(k), Some(v)) => {
                values.insert(k, i64::from_be_bytes(v));
            }
            _ => *lock_table(undecodable) += 1,
        }
    }
}

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
    /// (replica, batch) every read of the group's log returned.
    pub(super) reads: Vec<(NodeId, ReadBatch)>,
    /// Each broker's table, for the coordinator (the current incarnation's).
    pub(super) tables: BTreeMap<NodeId, Arc<SimTable>>,
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

/// One consumer key: commits rising offsets until `until`, one at a time.
pub(super) async fn consumer(
    key: &'static str,
    router: SimRouter,
    shared: Arc<Mutex<Shared>>,
    start: Instant,
    until: Instant,
    seed: u64,
) {
    let mut rng = StableRng::seed(seed);
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
        let deadline = began + super::CLIENT_DEADLINE;
        let mut hint: Option<NodeId> = None;
        let res = loop {
            let up = router.replicas(OFFSETS);
            let target = hint
                .and_then(|h| up.iter().find(|r| r.id() == h).cloned())
                .or_else(|| leader_of(&up));
            let Some(t) = target else {
                if Instant::now() >= deadline {
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let res = match tokio::time::timeout(left, t.proposer().submit(batch.clone())).await {
                Ok(Ok(r)) => Ok(r),
                Ok(Err(_)) => Ok(Err(PartitionError::Stopped("the proposer stopped".into()))),
                Err(e) => Err(e),
            };
            // Follow the coordinator hint, as a consumer does after NOT_COORDINATOR, or wait
            // for an election.
            if let Ok(Err(PartitionError::NotLeader { leader })) = &res {
                if Instant::now() < deadline {
                    hint = *leader;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
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
    let mut rng = StableRng::seed(seed);
    loop {
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..120))).await;
        if Instant::now() >= until {
            return;
        }
        rebuild(&router, &shared, start, past_high_watermark).await;
    }
}

/// One rebuild, as a new coordinator does it: on the offsets leader, `ensure_linearizable`,
/// then its table (or, when `past_high_watermark`, the latest value per key in everything its
/// log holds, committed or not: the bug the checker must catch). Returns whether it happened.
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
    let table = lock(shared).off.tables.get(&leader.id()).cloned();
    let ready =
        tokio::time::timeout(Duration::from_secs(1), leader.raft().ensure_linearizable()).await;
    if !matches!(ready, Ok(Ok(_))) {
        return false;
    }
    // A coordinator that crashed while it waited serves nothing, even if its broker is back:
    // the replica up now is another one (its table is another, still being rebuilt).
    let now = lock(shared).off.tables.get(&leader.id()).cloned();
    let same = matches!((&table, &now), (Some(a), Some(b)) if Arc::ptr_eq(a, b));
    if !same || !router.lock().up.contains_key(&(OFFSETS, leader.id())) {
        return false;
    }
    record_rebuild(&leader, shared, start, began, past_high_watermark)
}

/// Reads `leader`'s committed offsets and records what the rebuild saw.
pub(super) fn record_rebuild(
    leader: &ReplicatedPartition,
    shared: &Arc<Mutex<Shared>>,
    start: Instant,
    began: Instant,
    past_high_watermark: bool,
) -> bool {
    let high_watermark = leader.high_watermark();
    let values = if past_high_watermark {
        let Ok(read) = leader.read_past_high_watermark(leader.log_start_offset(), usize::MAX)
        else {
            return false;
        };
        let mut values = BTreeMap::new();
        let undecodable = Mutex::new(0);
        for b in split(&read.records) {
            apply_batch(&mut values, &b.bytes, &undecodable);
        }
        values.remove(MARKER_KEY);
        values
    } else {
        let table = lock(shared).off.tables.get(&leader.id()).cloned();
        let Some(table) = table else {
            return false;
        };
        table.values()
    };
    let n = {
        let mut s = lock(shared);
        let n = s.off.rebuilds.len();
        let bad = s
            .off
            .tables
            .values()
            .map(|t| *lock_table(&t.undecodable))
            .sum::<usize>();
        s.off.undecodable = s.off.undecodable.max(bad);
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
