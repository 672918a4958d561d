//! The committed-offsets store: an internal partition log, compacted by key, replayed into
//! memory on start.
//!
//! Layout under `data_dir/internal/consumer-offsets/`:
//! `CURRENT` names the live log generation N (one line, written to `CURRENT.tmp`, fsynced,
//! renamed over `CURRENT`, directory fsynced); `log-N/` is a `kiln_log::PartitionLog` holding
//! one RecordBatch v2 per commit request (key = group/topic/partition, value = offset,
//! metadata, commit time; a null value deletes the key). Any other `log-*` directory is a
//! leftover of an interrupted compaction and is removed on open.
//!
//! Two views are kept in memory. `latest` is what the log holds, including appends not yet
//! fsynced: commits are checked against it. `applied` holds only what is durable: OffsetFetch
//! reads it, so no client ever sees an offset a crash could take back. Appends are applied in
//! log order once the durable offset covers them.
//!
//! Compaction writes the live set (`latest`) to `log-(N+1)`, fsyncs and closes it, then
//! switches `CURRENT` with one atomic rename. A crash before the rename leaves generation N (which
//! holds every acknowledged commit), after it generation N+1 (which holds the same): old or
//! new, never neither.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use kiln_log::{BatchHeader, FlushPolicy, LogConfig, LogError, PartitionLog};

use super::records::{self, Committed, OffsetKey};
use crate::cluster::Replica;

const CURRENT: &str = "CURRENT";
const CURRENT_TMP: &str = "CURRENT.tmp";
const LOG_PREFIX: &str = "log-";
/// Records per batch when compaction rewrites the live set.
const COMPACT_BATCH_RECORDS: usize = 1000;
/// Largest batch one commit request may write; larger requests are refused whole.
pub const COMMIT_BATCH_BYTES_MAX: usize = 16 << 20;
/// Bytes asked of the log per read during replay.
const REPLAY_READ_BYTES: usize = 1 << 20;

#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Compact only once the log holds at least this many records...
    pub compact_min_records: u64,
    /// ...and at least this many times more records than live keys.
    pub compact_ratio: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            compact_min_records: 10_000,
            compact_ratio: 4,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("offsets log: {0}")]
    Log(#[from] LogError),
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {reason}", path.display())]
    BadState { path: PathBuf, reason: String },
    #[error("{0}")]
    Record(String),
    #[error("a commit of {0} bytes exceeds the {COMMIT_BATCH_BYTES_MAX}-byte limit of one commit")]
    TooLarge(usize),
    /// Cluster mode: the replicated offsets group did not commit the write (this broker lost
    /// its leadership, or the group stopped). The client retries at the new coordinator.
    #[error("not replicated: {0}")]
    NotReplicated(String),
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
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

/// Resolves (through [`OffsetsStore::wait`]) once a write is durable.
pub struct Ticket(TicketKind);

enum TicketKind {
    /// Standalone: durable once the local log's durable offset reaches `end_offset`.
    Local { log: PartitionLog, end_offset: i64 },
    /// Cluster mode: durable once the replicated group has committed it.
    Replicated {
        receiver: kiln_raft::proposer::AppendReceiver,
        seq: i64,
    },
    /// Cluster mode, nothing new written: wait for the writes already in flight.
    AfterSeq(i64),
}

#[derive(Debug, Clone)]
pub struct OpenReport {
    pub generation: u64,
    pub records_replayed: u64,
    pub records_skipped: u64,
    pub live_keys: u64,
    pub elapsed: Duration,
}

#[derive(Debug, Clone)]
pub struct CompactReport {
    pub generation: u64,
    pub records_before: u64,
    pub live_keys: u64,
    pub elapsed: Duration,
}

/// Where [`OffsetsStore::compact_stopping_at`] stops, to test a crash at each step.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CompactStep {
    /// The new log is written but not fsynced or closed.
    Written,
    /// The new log is fsynced and closed; `CURRENT` still names the old one.
    Synced,
    /// `CURRENT.tmp` names the new log; not yet renamed.
    PointerWritten,
    /// `CURRENT` names the new log; the old directory is still there.
    Switched,
    /// Done.
    Finished,
}

type GroupOffsets = BTreeMap<(String, i32), Committed>;

struct PendingWrite {
    /// The write is durable once the log's durable offset reaches this.
    end_offset: i64,
    changes: Vec<(OffsetKey, Option<Committed>)>,
}

struct State {
    log: PartitionLog,
    generation: u64,
    latest: HashMap<String, GroupOffsets>,
    applied: HashMap<String, GroupOffsets>,
    pending: VecDeque<PendingWrite>,
    /// Records in the current log (replayed plus appended): what compaction would drop.
    records_in_log: u64,
    /// Cluster mode: sequence number of the last write submitted (`PendingWrite::end_offset`
    /// holds these instead of log offsets).
    next_seq: i64,
    live_keys: u64,
}

pub struct OffsetsStore {
    dir: PathBuf,
    config: StoreConfig,
    state: Mutex<State>,
    compacting: AtomicBool,
    /// Cluster mode: commits are written through this replicated group instead of the local
    /// log (which then stays empty), and the view is rebuilt from it on becoming coordinator.
    replicated: Option<Arc<Replica>>,
    /// Cluster mode: the sequence number of the last write known committed.
    committed_seq: tokio::sync::watch::Sender<i64>,
    /// Cluster mode: the Raft term this broker coordinates in, once its view is rebuilt.
    serving_term: std::sync::atomic::AtomicU64,
}

/// `serving_term` when this broker is not the coordinator.
const NOT_SERVING: u64 = u64::MAX;
/// Longest wait for writes already in flight when a commit changes nothing.
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(30);

fn log_config() -> LogConfig {
    LogConfig {
        segment_bytes: 64 << 20,
        // Time-based rolling would only add segments; compaction replaces the whole log.
        segment_ms: u64::MAX / 2,
        // Committed offsets are never aged out by time or size: only compaction rewrites them.
        retention_ms: None,
        retention_bytes: None,
        index_interval_bytes: 4096,
        flush: FlushPolicy::EveryBatch,
        checkpoint_interval_bytes: 8 << 20,
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // The state is only changed by whole assignments under the lock; a panic elsewhere
    // leaves it consistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn log_dir(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("{LOG_PREFIX}{generation}"))
}

impl OffsetsStore {
    /// Opens (creating if needed) the store in `dir` and replays it into memory.
    pub fn open(dir: &Path, config: StoreConfig) -> Result<(OffsetsStore, OpenReport), StoreError> {
        let started = Instant::now();
        fs::create_dir_all(dir).map_err(io("create", dir))?;
        let current = read_current(dir)?;
        let generation = current.unwrap_or(0);
        remove_leftovers(dir, generation)?;
        let (log, _) = PartitionLog::open(&log_dir(dir, generation), log_config())?;
        if current.is_none() {
            write_current(dir, generation)?;
        }
        let mut latest: HashMap<String, GroupOffsets> = HashMap::new();
        let (replayed, skipped) = replay(&log, |key, value| apply_change(&mut latest, key, value))?;
        let live_keys = count_keys(&latest);
        let report = OpenReport {
            generation,
            records_replayed: replayed,
            records_skipped: skipped,
            live_keys,
            elapsed: started.elapsed(),
        };
        let store = OffsetsStore {
            dir: dir.to_path_buf(),
            config,
            state: Mutex::new(State {
                log,
                generation,
                applied: latest.clone(),
                latest,
                pending: VecDeque::new(),
                records_in_log: replayed + skipped,
                next_seq: 0,
                live_keys,
            }),
            compacting: AtomicBool::new(false),
            replicated: None,
            committed_seq: tokio::sync::watch::channel(0).0,
            serving_term: std::sync::atomic::AtomicU64::new(NOT_SERVING),
        };
        Ok((store, report))
    }

    /// Appends one batch with every commit that changes something. Member commits never move an
    /// offset backwards: such a partition keeps its higher offset and reports `KeptHigher`.
    /// The returned ticket resolves once everything appended so far is durable.
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

    fn append_locked(
        &self,
        st: &mut State,
        changes: Vec<(OffsetKey, Option<Committed>)>,
        now_ms: i64,
    ) -> Result<Ticket, StoreError> {
        if changes.is_empty() {
            // Nothing new, but the caller's answer must not rest on a value not yet durable.
            if self.replicated.is_some() {
                return Ok(Ticket(TicketKind::AfterSeq(st.next_seq)));
            }
            return Ok(Ticket(TicketKind::Local {
                log: st.log.clone(),
                end_offset: st.log.log_end_offset(),
            }));
        }
        let batch = encode_batch(&changes, now_ms)?;
        if batch.len() > COMMIT_BATCH_BYTES_MAX {
            return Err(StoreError::TooLarge(batch.len()));
        }
        if let Some(replica) = &self.replicated {
            // Submitted under the state lock, so the group's log order is the order of `latest`.
            let receiver = replica.proposer.submit(batch);
            for (key, value) in &changes {
                apply_change(&mut st.latest, key, value.as_ref());
            }
            st.records_in_log += changes.len() as u64;
            st.live_keys = count_keys(&st.latest);
            st.next_seq += 1;
            let seq = st.next_seq;
            st.pending.push_back(PendingWrite {
                end_offset: seq,
                changes,
            });
            return Ok(Ticket(TicketKind::Replicated { receiver, seq }));
        }
        let info = st.log.append(&batch, now_ms)?;
        for (key, value) in &changes {
            apply_change(&mut st.latest, key, value.as_ref());
        }
        st.records_in_log += changes.len() as u64;
        st.live_keys = count_keys(&st.latest);
        let end_offset = info.last_offset + 1;
        st.pending.push_back(PendingWrite {
            end_offset,
            changes,
        });
        Ok(Ticket(TicketKind::Local {
            log: st.log.clone(),
            end_offset,
        }))
    }

    /// Waits until the ticket's write is durable, then makes it visible to readers.
    pub async fn wait(&self, ticket: Ticket) -> Result<(), StoreError> {
        match ticket.0 {
            TicketKind::Local { log, end_offset } => {
                log.wait_durable(end_offset).await?;
                self.apply_durable();
                Ok(())
            }
            TicketKind::Replicated { receiver, seq } => match receiver.await {
                Ok(Ok(_)) => {
                    self.apply_committed_through(seq);
                    Ok(())
                }
                Ok(Err(e)) => Err(StoreError::NotReplicated(e.to_string())),
                Err(_) => Err(StoreError::NotReplicated(
                    "the offsets replica stopped".into(),
                )),
            },
            TicketKind::AfterSeq(seq) => {
                let mut committed = self.committed_seq.subscribe();
                let caught_up = async { committed.wait_for(|c| *c >= seq).await.is_ok() };
                match tokio::time::timeout(IN_FLIGHT_WAIT, caught_up).await {
                    Ok(true) => Ok(()),
                    _ => Err(StoreError::NotReplicated(
                        "earlier commits were not replicated in time".into(),
                    )),
                }
            }
        }
    }

    /// Cluster mode: Raft commits in submission order, so every write up to `seq` is in.
    fn apply_committed_through(&self, seq: i64) {
        let mut st = lock(&self.state);
        while st.pending.front().is_some_and(|p| p.end_offset <= seq) {
            let Some(write) = st.pending.pop_front() else {
                break;
            };
            for (key, value) in &write.changes {
                apply_change(&mut st.applied, key, value.as_ref());
            }
        }
        self.committed_seq.send_if_modified(|c| {
            let moved = seq > *c;
            *c = (*c).max(seq);
            moved
        });
    }

    /// Cluster mode: writes through `replica` from now on. Call before serving.
    pub fn set_replicated(&mut self, replica: Arc<Replica>) {
        self.replicated = Some(replica);
    }

    pub fn replicated(&self) -> Option<&Arc<Replica>> {
        self.replicated.as_ref()
    }

    /// Cluster mode: whether this broker is the coordinator with a rebuilt view.
    pub fn is_serving(&self) -> bool {
        self.replicated.is_none() || self.serving_term.load(Ordering::Acquire) != NOT_SERVING
    }

    /// Cluster mode: the term this broker coordinates in, if it does.
    pub fn serving_term(&self) -> Option<u64> {
        let term = self.serving_term.load(Ordering::Acquire);
        (term != NOT_SERVING).then_some(term)
    }

    pub fn stop_serving(&self) {
        self.serving_term.store(NOT_SERVING, Ordering::Release);
    }

    /// Cluster mode: replaces the view with the replicated log's committed content (read by
    /// the caller below the high watermark) and starts serving in `term`.
    pub fn rebuild(&self, batches: Vec<Bytes>, term: u64) -> (u64, u64) {
        let mut map: HashMap<String, GroupOffsets> = HashMap::new();
        let (mut replayed, mut skipped) = (0u64, 0u64);
        for batch in batches {
            let (a, s) = replay_batches(batch, |k, v| apply_change(&mut map, k, v));
            replayed += a;
            skipped += s;
        }
        let mut st = lock(&self.state);
        st.pending.clear();
        st.live_keys = count_keys(&map);
        st.records_in_log = replayed + skipped;
        st.applied = map.clone();
        st.latest = map;
        // Tickets of the previous term resolve through their receivers; new ones count on.
        let seq = st.next_seq;
        drop(st);
        self.committed_seq.send_replace(seq);
        self.serving_term.store(term, Ordering::Release);
        (replayed, skipped)
    }

    /// Moves every durable pending write into the readable view, in log order.
    fn apply_durable(&self) {
        let mut st = lock(&self.state);
        let durable = st.log.durable_offset();
        while st.pending.front().is_some_and(|p| p.end_offset <= durable) {
            let Some(write) = st.pending.pop_front() else {
                break;
            };
            for (key, value) in &write.changes {
                apply_change(&mut st.applied, key, value.as_ref());
            }
        }
    }

    /// The durable committed offset for one partition.
    pub fn committed(&self, key: &OffsetKey) -> Option<Committed> {
        lock(&self.state)
            .applied
            .get(&key.group)
            .and_then(|g| g.get(&(key.topic.clone(), key.partition)))
            .cloned()
    }

    /// Every durable committed offset of one group, by topic and partition.
    pub fn group_offsets(&self, group: &str) -> Vec<(String, i32, Committed)> {
        lock(&self.state)
            .applied
            .get(group)
            .map(|g| {
                g.iter()
                    .map(|((t, p), c)| (t.clone(), *p, c.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Groups that have at least one committed offset (written, durable or not).
    pub fn groups(&self) -> Vec<String> {
        let st = lock(&self.state);
        let mut names: Vec<String> = st.latest.keys().chain(st.applied.keys()).cloned().collect();
        names.sort();
        names.dedup();
        names
    }

    pub fn has_group(&self, group: &str) -> bool {
        let st = lock(&self.state);
        st.latest.contains_key(group) || st.applied.contains_key(group)
    }

    /// Every durable committed offset.
    pub fn snapshot(&self) -> Vec<(OffsetKey, Committed)> {
        let st = lock(&self.state);
        let mut out = Vec::with_capacity(st.live_keys as usize);
        for (group, offsets) in &st.applied {
            for ((topic, partition), c) in offsets {
                out.push((
                    OffsetKey {
                        group: group.clone(),
                        topic: topic.clone(),
                        partition: *partition,
                    },
                    c.clone(),
                ));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// (records in the log, live keys, generation).
    pub fn stats(&self) -> (u64, u64, u64) {
        let st = lock(&self.state);
        (st.records_in_log, st.live_keys, st.generation)
    }

    pub fn needs_compaction(&self) -> bool {
        if self.replicated.is_some() {
            // The replicated group's log is not compacted (docs/replication.md).
            return false;
        }
        let (records, live, _) = self.stats();
        records >= self.config.compact_min_records
            && records >= live.saturating_mul(self.config.compact_ratio.max(1))
    }

    /// Compacts unless another compaction is running. Blocking: run it off the async threads.
    pub fn compact(&self) -> Result<Option<CompactReport>, StoreError> {
        self.compact_stopping_at(CompactStep::Finished)
    }

    /// Compaction that stops after `stop`, leaving the files as a crash there would.
    /// Tests reopen the directory afterwards; anything else must call [`Self::compact`].
    #[doc(hidden)]
    pub fn compact_stopping_at(
        &self,
        stop: CompactStep,
    ) -> Result<Option<CompactReport>, StoreError> {
        if self.compacting.swap(true, Ordering::AcqRel) {
            return Ok(None);
        }
        let result = self.compact_locked(stop);
        self.compacting.store(false, Ordering::Release);
        result.map(Some)
    }

    fn compact_locked(&self, stop: CompactStep) -> Result<CompactReport, StoreError> {
        let started = Instant::now();
        // Commits wait while this runs; it is rare (the log must be many times its live set).
        let mut st = lock(&self.state);
        let records_before = st.records_in_log;
        let generation = st.generation + 1;
        let new_dir = log_dir(&self.dir, generation);
        if new_dir.exists() {
            fs::remove_dir_all(&new_dir).map_err(io("remove stale", &new_dir))?;
        }
        let (new_log, _) = PartitionLog::open(&new_dir, log_config())?;
        let mut live: Vec<(OffsetKey, Option<Committed>)> =
            Vec::with_capacity(st.live_keys as usize);
        for (group, offsets) in &st.latest {
            for ((topic, partition), c) in offsets {
                live.push((
                    OffsetKey {
                        group: group.clone(),
                        topic: topic.clone(),
                        partition: *partition,
                    },
                    Some(c.clone()),
                ));
            }
        }
        live.sort_by(|a, b| a.0.cmp(&b.0));
        let now = crate::time::now_ms();
        for chunk in live.chunks(COMPACT_BATCH_RECORDS) {
            let batch = encode_batch(chunk, now)?;
            new_log.append(&batch, now)?;
        }
        if stop == CompactStep::Written {
            return Err(StoreError::Record("stopped after writing (test)".into()));
        }
        new_log.close()?;
        if stop == CompactStep::Synced {
            return Err(StoreError::Record("stopped after fsync (test)".into()));
        }
        write_current_tmp(&self.dir, generation)?;
        if stop == CompactStep::PointerWritten {
            return Err(StoreError::Record(
                "stopped before the rename (test)".into(),
            ));
        }
        rename_current(&self.dir)?;
        // From here on generation N+1 is the store.
        let (reopened, _) = PartitionLog::open(&new_dir, log_config())?;
        let old = std::mem::replace(&mut st.log, reopened);
        let old_generation = st.generation;
        st.generation = generation;
        // Everything in `latest` is durable in the new log.
        st.pending.clear();
        st.applied = st.latest.clone();
        st.live_keys = live.len() as u64;
        st.records_in_log = st.live_keys;
        drop(st);
        // Closing publishes the old log's durable offset, which wakes commits still waiting on it.
        if let Err(e) = old.close() {
            tracing::warn!(error = %e, "closing the compacted-away offsets log failed; its data is in the new one");
        }
        if stop == CompactStep::Switched {
            return Err(StoreError::Record("stopped after the switch (test)".into()));
        }
        let old_dir = log_dir(&self.dir, old_generation);
        if let Err(e) = fs::remove_dir_all(&old_dir) {
            tracing::warn!(path = %old_dir.display(), error = %e, "removing the old offsets log failed; it is removed on the next start");
        }
        sync_dir(&self.dir)?;
        Ok(CompactReport {
            generation,
            records_before,
            live_keys: live.len() as u64,
            elapsed: started.elapsed(),
        })
    }

    /// Final fsync of the log.
    pub fn close(&self) {
        let st = lock(&self.state);
        if let Err(e) = st.log.close() {
            tracing::warn!(error = %e, "closing the offsets log failed");
        }
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

/// One uncompressed RecordBatch v2 holding every change, record offsets 0..n.
fn encode_batch(
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

/// Feeds every record of the log to `apply`, in order. Returns (records applied, records skipped
/// because they do not parse).
fn replay(
    log: &PartitionLog,
    mut apply: impl FnMut(&OffsetKey, Option<&Committed>),
) -> Result<(u64, u64), StoreError> {
    let end = log.log_end_offset();
    let mut offset = log.log_start_offset();
    let (mut applied, mut skipped) = (0u64, 0u64);
    while offset < end {
        let read = log.read(offset, REPLAY_READ_BYTES, end)?;
        if read.records.is_empty() || read.next_offset <= offset {
            break;
        }
        let (a, s) = replay_batches(read.records.clone(), &mut apply);
        applied += a;
        skipped += s;
        offset = read.next_offset;
    }
    Ok((applied, skipped))
}

/// Feeds every record of concatenated batches to `apply`. Returns (applied, skipped).
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

fn read_current(dir: &Path) -> Result<Option<u64>, StoreError> {
    let path = dir.join(CURRENT);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("read", &path)(e)),
    };
    text.trim()
        .parse::<u64>()
        .map(Some)
        .map_err(|_| StoreError::BadState {
            path,
            reason: format!("expected a generation number, found {:?}", text.trim()),
        })
}

/// Removes every log generation except `keep`, and a stray `CURRENT.tmp`.
fn remove_leftovers(dir: &Path, keep: u64) -> Result<(), StoreError> {
    let keep_name = format!("{LOG_PREFIX}{keep}");
    for entry in fs::read_dir(dir).map_err(io("list", dir))? {
        let entry = entry.map_err(io("list", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.starts_with(LOG_PREFIX) && name != keep_name {
            tracing::info!(path = %path.display(), "removing an offsets log left by an interrupted compaction");
            fs::remove_dir_all(&path).map_err(io("remove", &path))?;
        } else if name == CURRENT_TMP {
            fs::remove_file(&path).map_err(io("remove", &path))?;
        }
    }
    Ok(())
}

fn write_current_tmp(dir: &Path, generation: u64) -> Result<(), StoreError> {
    let tmp = dir.join(CURRENT_TMP);
    let mut file = fs::File::create(&tmp).map_err(io("create", &tmp))?;
    file.write_all(format!("{generation}\n").as_bytes())
        .map_err(io("write", &tmp))?;
    file.sync_all().map_err(io("fsync", &tmp))?;
    Ok(())
}

fn rename_current(dir: &Path) -> Result<(), StoreError> {
    let tmp = dir.join(CURRENT_TMP);
    let current = dir.join(CURRENT);
    fs::rename(&tmp, &current).map_err(io("rename", &current))?;
    sync_dir(dir)
}

fn write_current(dir: &Path, generation: u64) -> Result<(), StoreError> {
    write_current_tmp(dir, generation)?;
    rename_current(dir)
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync directory", dir))
}
