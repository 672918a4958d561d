//! The committed-offsets store: the table of the replicated `__consumer_offsets/0` group, and
//! the coordinator's view of the commits it has in flight.
//!
//! Every broker holds a replica of the group, and every replica applies each committed commit
//! request to its [`OffsetsTable`] (kiln-raft calls it, in log order). The table is the group's
//! snapshot: after `offsets_compact_min_records` commits it is written whole and the log behind
//! it purged, so replaying after a restart costs what the table holds (one record per live
//! (group, topic, partition) key), not every commit ever made.
//!
//! The coordinator (the group's leader) answers OffsetFetch from the table, which holds only
//! what is committed: no client ever sees an offset a failover could take back. Commits are
//! checked against `latest`, the table plus the commits in flight, so a member never moves an
//! offset backwards even before its previous commit is answered. One commit request is one
//! RecordBatch (key = group/topic/partition, value = offset, metadata, commit time; a null value
//! deletes the key), written through the group's proposer and answered once committed.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use kiln_log::BatchHeader;

use super::records::{self, Committed, OffsetKey};
use crate::cluster::Replica;

/// Records per batch when the table is written as a snapshot.
const SNAPSHOT_BATCH_RECORDS: usize = 1000;
/// Largest batch one commit request may write; larger requests are refused whole.
pub const COMMIT_BATCH_BYTES_MAX: usize = 16 << 20;
/// Longest wait for writes already in flight when a commit changes nothing.
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// The offsets group snapshots its table after this many applied commit requests.
    pub snapshot_every: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            snapshot_every: 10_000,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Record(String),
    #[error("a commit of {0} bytes exceeds the {COMMIT_BATCH_BYTES_MAX}-byte limit of one commit")]
    TooLarge(usize),
    /// The replicated offsets group did not commit the write (this broker lost its leadership,
    /// or the group stopped). The client retries at the new coordinator.
    #[error("not replicated: {0}")]
    NotReplicated(String),
}

/// Who is committing, which decides whether the offset may move backwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitKind {
    /// A group member (generation >= 0): never moves a committed offset backwards.
    Member,
    /// A commit while the group has no members (an admin reset, or a consumer that manages its
    /// own partitions): may move it anywhere.
    Reset,
}

#[derive(Debug, Clone)]
pub struct CommitRequest {
    pub key: OffsetKey,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
    pub kind: CommitKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    Written,
    /// A member tried to move the offset backwards; the stored (higher) offset was kept.
    KeptHigher {
        kept: i64,
    },
}

/// Resolves (through [`OffsetsStore::wait`]) once a write is committed, or with an error.
///
/// A commit that writes nothing (it keeps a higher offset in flight, or changes nothing) is
/// answered only once the writes it rests on are committed *in the serving epoch it was
/// checked in* (one epoch per [`OffsetsStore::start_serving`]): if that epoch ends first (the
/// term ends, or one of its writes fails), those writes may be gone (truncated with the old
/// leader's tail), so the answer is an error and the client retries at the coordinator,
/// which checks it again against what is really committed. Without the epoch, a commit of 90
/// behind an uncommitted 100 could be answered success after the 100 was truncated and the
/// coordinator rebuilt at 50.
pub struct Ticket(TicketKind);

enum TicketKind {
    /// Committed once the replicated group has committed it.
    Replicated {
        receiver: kiln_raft::proposer::AppendReceiver,
        epoch: u64,
        seq: i64,
    },
    /// Nothing new written: wait for the writes up to `seq` of `epoch` already in flight.
    AfterSeq { epoch: u64, seq: i64 },
}

/// The coordinator's writes in its serving epoch: `committed` is the last sequence number
/// known committed; `ended` once the epoch is over (leadership lost, or one of its writes
/// failed, after which `latest` may hold what was never written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Progress {
    epoch: u64,
    committed: i64,
    ended: bool,
}

type GroupOffsets = BTreeMap<(String, i32), Committed>;

#[derive(Default)]
struct TableState {
    applied: HashMap<String, GroupOffsets>,
    records_applied: u64,
    skipped: u64,
}

/// The committed offsets, as applied from the replicated log (see the module docs).
#[derive(Default)]
pub struct OffsetsTable {
    state: Mutex<TableState>,
}

impl OffsetsTable {
    fn lock(&self) -> MutexGuard<'_, TableState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every committed offset, sorted by key.
    pub fn entries(&self) -> Vec<(OffsetKey, Committed)> {
        let st = self.lock();
        let mut out = Vec::new();
        for (group, offsets) in &st.applied {
            for ((topic, partition), c) in offsets {
                let key = OffsetKey {
                    group: group.clone(),
                    topic: topic.clone(),
                    partition: *partition,
                };
                out.push((key, c.clone()));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// (records applied since start or the last restore, live keys, records skipped).
    pub fn stats(&self) -> (u64, u64, u64) {
        let st = self.lock();
        (st.records_applied, count_keys(&st.applied), st.skipped)
    }
}

impl kiln_raft::Table for OffsetsTable {
    fn apply(&self, _index: u64, _kafka_offset: i64, batches: &Bytes) {
        let mut st = self.lock();
        let (applied, skipped) =
            replay_batches(batches.clone(), |k, v| apply_change(&mut st.applied, k, v));
        st.records_applied += applied;
        st.skipped += skipped;
    }

    fn snapshot(&self) -> Result<Vec<u8>, String> {
        let live: Vec<(OffsetKey, Option<Committed>)> = self
            .entries()
            .into_iter()
            .map(|(k, v)| (k, Some(v)))
            .collect();
        let mut out = BytesMut::new();
        for chunk in live.chunks(SNAPSHOT_BATCH_RECORDS) {
            out.extend_from_slice(&encode_changes(chunk, 0).map_err(|e| e.to_string())?);
        }
        Ok(out.to_vec())
    }

    fn restore(&self, snapshot: &[u8]) -> Result<(), String> {
        let mut map = HashMap::new();
        let (applied, skipped) = replay_batches(Bytes::copy_from_slice(snapshot), |k, v| {
            apply_change(&mut map, k, v)
        });
        if skipped > 0 {
            return Err(format!("offsets snapshot: {skipped} records do not parse"));
        }
        let mut st = self.lock();
        st.applied = map;
        st.records_applied = applied;
        Ok(())
    }
}

/// The coordinator's view of what it has written.
#[derive(Default)]
struct Coordinating {
    /// The table plus the writes in flight: commits are checked against it.
    latest: HashMap<String, GroupOffsets>,
    next_seq: i64,
    /// The serving epoch `latest` was built in (0 before the first).
    epoch: u64,
}

pub struct OffsetsStore {
    config: StoreConfig,
    table: Arc<OffsetsTable>,
    /// The offsets group's local replica: commits are written through its proposer.
    replica: OnceLock<Arc<Replica>>,
    state: Mutex<Coordinating>,
    /// What is known committed of the serving epoch's writes.
    progress: tokio::sync::watch::Sender<Progress>,
    /// The Raft term this broker coordinates in, once its view is caught up.
    serving_term: AtomicU64,
    /// Woken when a write fails while this broker still leads: the coordinator rebuilds its
    /// view (`groups::follow_coordinator_leadership`).
    resync: tokio::sync::Notify,
}

/// `serving_term` when this broker is not the coordinator.
const NOT_SERVING: u64 = u64::MAX;

fn lock(m: &Mutex<Coordinating>) -> MutexGuard<'_, Coordinating> {
    // Changed only by whole assignments under the lock; a panic elsewhere leaves it whole.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl OffsetsStore {
    pub fn new(config: StoreConfig) -> OffsetsStore {
        OffsetsStore {
            config,
            table: Arc::new(OffsetsTable::default()),
            replica: OnceLock::new(),
            state: Mutex::new(Coordinating::default()),
            progress: tokio::sync::watch::channel(Progress {
                epoch: 0,
                committed: 0,
                ended: true,
            })
            .0,
            serving_term: AtomicU64::new(NOT_SERVING),
            resync: tokio::sync::Notify::new(),
        }
    }

    /// The table the offsets group's state machine applies to.
    pub fn table(&self) -> Arc<OffsetsTable> {
        self.table.clone()
    }

    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Writes go through `replica` from now on. Call once, before serving.
    pub fn set_replica(&self, replica: Arc<Replica>) {
        if self.replica.set(replica).is_err() {
            tracing::error!("the offsets replica was set twice; keeping the first");
        }
    }

    pub fn replica(&self) -> Option<&Arc<Replica>> {
        self.replica.get()
    }

    /// Appends one batch with every commit that changes something. Member commits never move an
    /// offset backwards: such a partition keeps its higher offset and reports `KeptHigher`.
    /// The returned ticket resolves once everything written so far is committed.
    pub fn commit(
        &self,
        requests: &[CommitRequest],
        now_ms: i64,
    ) -> Result<(Vec<CommitOutcome>, Ticket), StoreError> {
        let mut st = lock(&self.state);
        let mut outcomes = Vec::with_capacity(requests.len());
        let mut changes = Vec::with_capacity(requests.len());
        for r in requests {
            let current = st
                .latest
                .get(&r.key.group)
                .and_then(|g| g.get(&(r.key.topic.clone(), r.key.partition)));
            if let (CommitKind::Member, Some(current)) = (r.kind, current) {
                if r.offset < current.offset {
                    outcomes.push(CommitOutcome::KeptHigher {
                        kept: current.offset,
                    });
                    continue;
                }
            }
            outcomes.push(CommitOutcome::Written);
            changes.push((
                r.key.clone(),
                Some(Committed {
                    offset: r.offset,
                    leader_epoch: r.leader_epoch,
                    metadata: r.metadata.clone(),
                    commit_time_ms: now_ms,
                    reset: r.kind == CommitKind::Reset,
                }),
            ));
        }
        let ticket = self.append_locked(&mut st, changes, now_ms)?;
        Ok((outcomes, ticket))
    }

    /// Writes a tombstone for every offset of `group`. `None` when the group has none.
    pub fn delete_group(&self, group: &str, now_ms: i64) -> Result<Option<Ticket>, StoreError> {
        let mut st = lock(&self.state);
        let Some(offsets) = st.latest.get(group) else {
            return Ok(None);
        };
        let changes = offsets
            .keys()
            .map(|(topic, partition)| {
                (
                    OffsetKey {
                        group: group.to_string(),
                        topic: topic.clone(),
                        partition: *partition,
                    },
                    None,
                )
            })
            .collect();
        self.append_locked(&mut st, changes, now_ms).map(Some)
    }

    /// Writes a tombstone for each of `partitions` (topic, partition) that `group` has an
    /// offset for (OffsetDelete); the others are left alone, as Kafka does.
    pub fn delete_offsets(
        &self,
        group: &str,
        partitions: &[(String, i32)],
        now_ms: i64,
    ) -> Result<Ticket, StoreError> {
        let mut st = lock(&self.state);
        let changes = match st.latest.get(group) {
            Some(offsets) => partitions
                .iter()
                .filter(|tp| offsets.contains_key(*tp))
                .map(|(topic, partition)| {
                    (
                        OffsetKey {
                            group: group.to_string(),
                            topic: topic.clone(),
                            partition: *partition,
                        },
                        None,
                    )
                })
                .collect(),
            None => Vec::new(),
        };
        self.append_locked(&mut st, changes, now_ms)
    }

    fn append_locked(
        &self,
        st: &mut Coordinating,
        changes: Vec<(OffsetKey, Option<Committed>)>,
        now_ms: i64,
    ) -> Result<Ticket, StoreError> {
        if changes.is_empty() {
            // Nothing new, but the caller's answer must not rest on a value not yet committed.
            return Ok(Ticket(TicketKind::AfterSeq {
                epoch: st.epoch,
                seq: st.next_seq,
            }));
        }
        let batch = encode_changes(&changes, now_ms)?;
        if batch.len() > COMMIT_BATCH_BYTES_MAX {
            return Err(StoreError::TooLarge(batch.len()));
        }
        let Some(replica) = self.replica.get() else {
            return Err(StoreError::NotReplicated(
                "the offsets group is not open yet".into(),
            ));
        };
        // Submitted under the state lock, so the group's log order is the order of `latest`.
        let receiver = replica.proposer().submit(batch);
        for (key, value) in &changes {
            apply_change(&mut st.latest, key, value.as_ref());
        }
        st.next_seq += 1;
        let seq = st.next_seq;
        Ok(Ticket(TicketKind::Replicated {
            receiver,
            epoch: st.epoch,
            seq,
        }))
    }

    /// Waits until the ticket's write is committed (and so applied to the table); an error
    /// when it is not, or may not be (see [`Ticket`]).
    pub async fn wait(&self, ticket: Ticket) -> Result<(), StoreError> {
        match ticket.0 {
            TicketKind::Replicated {
                receiver,
                epoch,
                seq,
            } => match receiver.await {
                Ok(Ok(_)) => {
                    self.committed_through(epoch, seq);
                    Ok(())
                }
                Ok(Err(e)) => {
                    self.write_failed(epoch);
                    Err(StoreError::NotReplicated(e.to_string()))
                }
                Err(_) => {
                    self.write_failed(epoch);
                    Err(StoreError::NotReplicated(
                        "the offsets replica stopped".into(),
                    ))
                }
            },
            TicketKind::AfterSeq { epoch, seq } => {
                let mut progress = self.progress.subscribe();
                let settled = async {
                    progress
                        .wait_for(|p| p.epoch != epoch || p.ended || p.committed >= seq)
                        .await
                        .map(|p| *p)
                        .ok()
                };
                match tokio::time::timeout(IN_FLIGHT_WAIT, settled).await {
                    Ok(Some(p)) if p.epoch == epoch && p.committed >= seq => Ok(()),
                    Ok(Some(_)) => Err(StoreError::NotReplicated(
                        "the coordinator stopped (its term ended, or a write failed) before \
                         the commits this answer rests on were committed"
                            .into(),
                    )),
                    _ => Err(StoreError::NotReplicated(
                        "earlier commits were not replicated in time".into(),
                    )),
                }
            }
        }
    }

    /// Raft commits in submission order, so every write of `epoch` up to `seq` is in.
    fn committed_through(&self, epoch: u64, seq: i64) {
        self.progress.send_if_modified(|p| {
            let moved = p.epoch == epoch && seq > p.committed;
            if moved {
                p.committed = seq;
            }
            moved
        });
    }

    /// A write of `epoch` failed: `latest` may hold what was never written, so the epoch's
    /// unanswered tickets fail and the coordinator rebuilds its view before serving again.
    fn write_failed(&self, epoch: u64) {
        let current = self.progress.send_if_modified(|p| {
            let current = p.epoch == epoch && !p.ended;
            p.ended |= current;
            current
        });
        if current {
            tracing::warn!(
                epoch,
                "an offset commit was not replicated; rebuilding the coordinator's view"
            );
            self.stop_serving();
            self.resync.notify_one();
        }
    }

    /// Resolves once a failed write asked the coordinator to rebuild its view.
    pub async fn resync_needed(&self) {
        self.resync.notified().await;
    }

    /// Whether this broker is the coordinator with a view that is caught up.
    pub fn is_serving(&self) -> bool {
        self.serving_term.load(Ordering::Acquire) != NOT_SERVING
    }

    /// The term this broker coordinates in, if it does.
    pub fn serving_term(&self) -> Option<u64> {
        let term = self.serving_term.load(Ordering::Acquire);
        (term != NOT_SERVING).then_some(term)
    }

    /// Stops serving: requests get NOT_COORDINATOR, and tickets waiting on writes of the
    /// term fail (they may never commit).
    pub fn stop_serving(&self) {
        self.serving_term.store(NOT_SERVING, Ordering::Release);
        self.progress.send_if_modified(|p| {
            let moved = !p.ended;
            p.ended = true;
            moved
        });
    }

    /// Starts serving in `term`, with the table (caught up by the caller: applied through the
    /// term's first entry) as the coordinator's view.
    pub fn start_serving(&self, term: u64) -> u64 {
        let table = self.table.lock();
        let keys = count_keys(&table.applied);
        let mut st = lock(&self.state);
        st.latest = table.applied.clone();
        st.epoch += 1;
        // Replicated tickets of earlier epochs resolve through their receivers; writes-nothing
        // tickets of earlier epochs fail (`Ticket`); new ones count on.
        let (epoch, seq) = (st.epoch, st.next_seq);
        drop(st);
        drop(table);
        self.progress.send_replace(Progress {
            epoch,
            committed: seq,
            ended: false,
        });
        self.serving_term.store(term, Ordering::Release);
        keys
    }

    pub fn committed(&self, key: &OffsetKey) -> Option<Committed> {
        self.table
            .lock()
            .applied
            .get(&key.group)
            .and_then(|g| g.get(&(key.topic.clone(), key.partition)))
            .cloned()
    }

    pub fn group_offsets(&self, group: &str) -> Vec<(String, i32, Committed)> {
        self.table
            .lock()
            .applied
            .get(group)
            .map(|g| {
                g.iter()
                    .map(|((t, p), c)| (t.clone(), *p, c.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn groups(&self) -> Vec<String> {
        let table = self.table.lock();
        let st = lock(&self.state);
        let mut names: Vec<String> = st
            .latest
            .keys()
            .chain(table.applied.keys())
            .cloned()
            .collect();
        names.sort();
        names.dedup();
        names
    }

    pub fn has_group(&self, group: &str) -> bool {
        let table = self.table.lock();
        let st = lock(&self.state);
        st.latest.contains_key(group) || table.applied.contains_key(group)
    }

    pub fn snapshot(&self) -> Vec<(OffsetKey, Committed)> {
        self.table.entries()
    }

    /// (records applied since start or the last restore, live keys, records skipped).
    pub fn stats(&self) -> (u64, u64, u64) {
        self.table.stats()
    }
}

fn apply_change(
    map: &mut HashMap<String, GroupOffsets>,
    key: &OffsetKey,
    value: Option<&Committed>,
) {
    match value {
        Some(v) => {
            map.entry(key.group.clone())
                .or_default()
                .insert((key.topic.clone(), key.partition), v.clone());
        }
        None => {
            if let Some(g) = map.get_mut(&key.group) {
                g.remove(&(key.topic.clone(), key.partition));
                if g.is_empty() {
                    map.remove(&key.group);
                }
            }
        }
    }
}

fn count_keys(map: &HashMap<String, GroupOffsets>) -> u64 {
    map.values().map(|g| g.len() as u64).sum()
}

/// One commit request's batch: an uncompressed RecordBatch v2 holding every change, record
/// offsets 0..n (what the offsets group's log and snapshots hold; conversion of the older
/// layout writes them too).
pub fn encode_changes(
    changes: &[(OffsetKey, Option<Committed>)],
    now_ms: i64,
) -> Result<Bytes, StoreError> {
    let mut recs = Vec::with_capacity(changes.len());
    for (i, (key, value)) in changes.iter().enumerate() {
        let offset = i as i64;
        recs.push(Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset,
            // The encoder starts a new batch whenever offset - sequence changes; keep it constant
            // so the whole commit is one batch (base sequence -1, as for non-idempotent producers).
            sequence: (offset as i32).wrapping_sub(1),
            timestamp: value.as_ref().map_or(now_ms, |v| v.commit_time_ms),
            key: Some(records::encode_key(key).map_err(|e| StoreError::Record(e.to_string()))?),
            value: match value {
                Some(v) => {
                    Some(records::encode_value(v).map_err(|e| StoreError::Record(e.to_string()))?)
                }
                None => None,
            },
            headers: Default::default(),
        });
    }
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        recs.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| StoreError::Record(format!("encoding the offsets batch: {e}")))?;
    Ok(buf.freeze())
}

/// Feeds every record of concatenated batches to `apply`, in order. Returns (records applied,
/// records skipped because they do not parse).
fn replay_batches(
    mut rest: Bytes,
    mut apply: impl FnMut(&OffsetKey, Option<&Committed>),
) -> (u64, u64) {
    let (mut applied, mut skipped) = (0u64, 0u64);
    while !rest.is_empty() {
        let Ok(header) = BatchHeader::parse(&rest) else {
            tracing::error!("skipping the rest of an offsets read: batch header does not parse");
            skipped += 1;
            break;
        };
        let len = header.total_len().min(rest.len());
        let mut one = rest.split_to(len);
        match RecordBatchDecoder::decode(&mut one) {
            Ok(set) => {
                for record in set.records {
                    let parsed = record
                        .key
                        .as_deref()
                        .ok_or_else(|| records::RecordError("record without a key".into()))
                        .and_then(records::decode_key)
                        .and_then(|k| match record.value.as_deref() {
                            None => Ok((k, None)),
                            Some(v) => records::decode_value(v).map(|v| (k, Some(v))),
                        });
                    match parsed {
                        Ok((key, value)) => {
                            apply(&key, value.as_ref());
                            applied += 1;
                        }
                        Err(e) => {
                            tracing::error!(offset = record.offset, error = %e, "skipping an offsets record that does not parse");
                            skipped += 1;
                        }
                    }
                }
            }
            Err(e) => {
                tracing::error!(offset = header.base_offset, error = %e, "skipping an offsets batch that does not decode");
                skipped += u64::from(header.last_offset_delta.unsigned_abs()) + 1;
            }
        }
    }
    (applied, skipped)
}

/// Applies the records of one commit batch to `latest` (key → latest value; a tombstone
/// removes the key).
pub(crate) fn replay_into(batch: Bytes, latest: &mut BTreeMap<OffsetKey, Committed>) {
    replay_batches(batch, |k, v| match v {
        Some(v) => {
            latest.insert(k.clone(), v.clone());
        }
        None => {
            latest.remove(k);
        }
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn key() -> OffsetKey {
        OffsetKey {
            group: "burnin".into(),
            topic: "kiln.nodes".into(),
            partition: 0,
        }
    }

    fn at(offset: i64) -> Committed {
        Committed {
            offset,
            leader_epoch: -1,
            metadata: None,
            commit_time_ms: 0,
            reset: false,
        }
    }

    fn member_commit(offset: i64) -> CommitRequest {
        CommitRequest {
            key: key(),
            offset,
            leader_epoch: -1,
            metadata: None,
            kind: CommitKind::Member,
        }
    }

    /// A store serving with 50 committed and a write of 100 in flight (what `append_locked`
    /// leaves: in `latest`, one sequence number on, not yet committed), and a member's commit
    /// of 90 checked against it: kept higher, waiting on the 100.
    fn kept_behind_a_write_in_flight() -> (OffsetsStore, Ticket, i64) {
        let store = OffsetsStore::new(StoreConfig::default());
        apply_change(&mut store.table.lock().applied, &key(), Some(&at(50)));
        store.start_serving(1);
        let seq = {
            let mut st = lock(&store.state);
            apply_change(&mut st.latest, &key(), Some(&at(100)));
            st.next_seq += 1;
            st.next_seq
        };
        let (outcomes, ticket) = store.commit(&[member_commit(90)], 0).unwrap();
        assert_eq!(outcomes, vec![CommitOutcome::KeptHigher { kept: 100 }]);
        (store, ticket, seq)
    }

    // The interleaving: the 100 is truncated with the term; the broker leads again, rebuilds
    // its view from the table (50). The commit of 90 must not be answered success: the client
    // would then read 50 back.
    #[tokio::test]
    async fn a_commit_kept_behind_a_write_lost_with_the_term_is_not_answered_success() {
        let (store, ticket, _) = kept_behind_a_write_in_flight();
        store.stop_serving();
        store.start_serving(3);
        let answer = store.wait(ticket).await;
        assert!(
            matches!(answer, Err(StoreError::NotReplicated(_))),
            "{answer:?}"
        );
        assert_eq!(store.committed(&key()).unwrap().offset, 50);
        // Checked again in the new view, the 90 is no longer behind anything: it is written.
        let err = store.commit(&[member_commit(90)], 0).err().unwrap();
        assert!(err.to_string().contains("not open yet"), "{err}");
        assert_eq!(
            lock(&store.state).latest["burnin"][&("kiln.nodes".to_string(), 0)].offset,
            50
        );
    }

    // The same while the answer is already waiting when the term ends.
    #[tokio::test]
    async fn a_waiting_commit_fails_when_the_term_ends() {
        let (store, ticket, _) = kept_behind_a_write_in_flight();
        let store = Arc::new(store);
        let waiting = tokio::spawn({
            let store = store.clone();
            async move { store.wait(ticket).await }
        });
        tokio::task::yield_now().await;
        store.stop_serving();
        store.start_serving(3);
        assert!(waiting.await.unwrap().is_err());
    }

    #[tokio::test]
    async fn a_commit_kept_behind_a_write_is_answered_once_that_write_commits() {
        let (store, ticket, seq) = kept_behind_a_write_in_flight();
        let epoch = lock(&store.state).epoch;
        store.committed_through(epoch, seq);
        store.wait(ticket).await.unwrap();
        // A write of an earlier epoch committing late moves nothing of this one.
        let (_, ticket) = store.commit(&[member_commit(95)], 0).unwrap();
        store.committed_through(epoch - 1, seq + 10);
        assert_eq!(store.progress.borrow().committed, seq);
        store.wait(ticket).await.unwrap();
    }

    // A write that fails while this broker still leads (its queue full, say) may leave
    // `latest` ahead of what is written: the epoch's answers fail and serving stops until the
    // coordinator rebuilds its view.
    #[tokio::test]
    async fn a_failed_write_fails_the_answers_resting_on_it_and_asks_for_a_rebuild() {
        let (store, ticket, _) = kept_behind_a_write_in_flight();
        let epoch = lock(&store.state).epoch;
        store.write_failed(epoch);
        assert!(!store.is_serving());
        tokio::time::timeout(Duration::from_secs(1), store.resync_needed())
            .await
            .unwrap();
        assert!(store.wait(ticket).await.is_err());
        // A failure reported for an epoch already over asks for nothing.
        store.start_serving(1);
        store.write_failed(epoch);
        assert!(store.is_serving());
    }
}
