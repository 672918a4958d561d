//! The state machine of a replica: what applying committed entries does.
//!
//! Two kinds of group:
//! * a **data** partition's records already live in its log, so applying an entry only moves the
//!   high watermark (the Kafka offset after the last applied record), follows its idempotent
//!   producers ([`crate::producers`]) and carries out commands (retention's
//!   [`Command::LogStart`]). Its snapshot carries no records: only where the log starts (the
//!   last purged entry and the first Kafka offset) and the producer table, so a follower
//!   behind the leader's log start installs it and fetches from there;
//! * a **table** group (the consumer offsets, the cluster metadata) applies its records to a
//!   [`Table`] the broker provides, and its snapshot is that table: the log up to it is purged,
//!   so replaying after a restart or a leader change costs what the table holds, not every
//!   record ever written.
//!
//! The `state` file (`state.rs`) keeps the applied position (a data partition's, every
//! [`SAVE_EVERY_ENTRIES`] entries, never past what its log has synced; a table group's with
//! each snapshot), so a restart neither re-reads the log nor starts below what it served.

use std::io::Cursor;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use kiln_log::{LogError, ReadMode};
use openraft::storage::RaftStateMachine;
use openraft::{
    AnyError, EmptyNode, EntryPayload, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta,
    StorageIOError, StoredMembership,
};
use tokio::sync::{watch, Notify};

use crate::log_store::{lock, LogStore};
use crate::payload::{Command, Payload};
use crate::producers::ProducerTable;
use crate::record::Reader;
use crate::state::{GroupState, LogStart};
use crate::types::{Applied, Entry, KilnRaft, LogId, NodeId, StorageError};

/// A data partition saves its applied position at least this often (entries).
pub const SAVE_EVERY_ENTRIES: u64 = 4096;
/// A table group snapshots (and purges its log) once this many entries were applied since the
/// last snapshot.
pub const TABLE_SNAPSHOT_EVERY_ENTRIES: u64 = 20_000;

/// The state a table group keeps (see the module docs). Every call is made under the state
/// machine's lock, in log order.
pub trait Table: Send + Sync + 'static {
    /// Applies the records of one committed entry (`batches` as stored: offsets stamped).
    fn apply(&self, index: u64, kafka_offset: i64, batches: &Bytes);
    /// The whole table, for a snapshot. An error (a table that cannot write itself out)
    /// stops the replica rather than write a snapshot that lacks part of it.
    fn snapshot(&self) -> Result<Vec<u8>, String>;
    /// Replaces the table with a snapshot's. An error leaves the replica stopped.
    fn restore(&self, snapshot: &[u8]) -> Result<(), String>;
}

#[derive(Clone)]
pub enum GroupKind {
    Data,
    Table(Arc<dyn Table>),
}

struct SmInner {
    state: GroupState,
    /// A data partition's idempotent producers, as of what is applied (saved in `state.table`).
    producers: ProducerTable,
    /// The high watermark: the Kafka offset after every applied record.
    next_kafka: i64,
    since_save: u64,
    /// The generation of the last state-file content built (see [`FileGate`]).
    save_generation: u64,
}

impl SmInner {
    /// The generation for a state-file content built now, under the lock: generations follow
    /// the states they are built from.
    fn next_generation(&mut self) -> u64 {
        self.save_generation += 1;
        self.save_generation
    }
}

/// Orders the `state` file's writes, which may run outside the state machine's lock (the
/// periodic save and a table group's snapshot are written on the blocking pool): each content
/// carries the generation it was built in, and a write older than the last one written is
/// skipped, so the file never goes back to an earlier state.
#[derive(Default)]
struct FileGate {
    /// The generation of the content the file holds (0: none written since opening).
    written: Mutex<u64>,
}

impl FileGate {
    /// Writes `state`, built in `generation`, unless a later content is written already.
    fn write(
        &self,
        fs: &dyn kiln_log::fs::Fs,
        dir: &std::path::Path,
        state: &GroupState,
        generation: u64,
    ) -> std::io::Result<()> {
        let mut written = lock(&self.written);
        assert_ne!(
            generation, *written,
            "a state-file content is written at most once"
        );
        if generation < *written {
            tracing::debug!(dir = %dir.display(), generation, written = *written, "a later state is saved already; this one is skipped");
            return Ok(());
        }
        state.save(fs, dir)?;
        *written = generation;
        Ok(())
    }
}

/// See the module docs. Cheap to clone.
#[derive(Clone)]
pub struct StateMachine {
    inner: Arc<Mutex<SmInner>>,
    high_watermark: Arc<watch::Sender<i64>>,
    store: LogStore,
    kind: GroupKind,
    file_gate: Arc<FileGate>,
    /// Woken when a snapshot is due (the log start moved, or a table grew a log behind it).
    snapshot_wanted: Arc<Notify>,
    table_snapshot_every: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct SmError(String);

fn sm_err(e: impl Into<String>) -> AnyError {
    AnyError::new(&SmError(e.into()))
}

const SNAPSHOT_DATA: u8 = 1;
const SNAPSHOT_TABLE: u8 = 2;
/// A data snapshot with DeleteRecords' start after the log start (older brokers cannot read
/// it; they read `SNAPSHOT_DATA`, which is still written while no records were deleted).
const SNAPSHOT_DATA_V2: u8 = 3;

fn encode_snapshot(kafka_offset: i64, table: Option<&[u8]>) -> Vec<u8> {
    let mut p = Vec::with_capacity(9 + table.map_or(0, <[u8]>::len));
    p.push(if table.is_some() {
        SNAPSHOT_TABLE
    } else {
        SNAPSHOT_DATA
    });
    p.extend_from_slice(&kafka_offset.to_be_bytes());
    if let Some(t) = table {
        p.extend_from_slice(t);
    }
    p
}

/// A data snapshot: the log start's Kafka offset, DeleteRecords' start when one was set (kind
/// `SNAPSHOT_DATA_V2`), then the producer table.
fn encode_data_snapshot(kafka_offset: i64, records_start: i64, producers: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(17 + producers.len());
    let v2 = records_start > kafka_offset;
    p.push(if v2 { SNAPSHOT_DATA_V2 } else { SNAPSHOT_DATA });
    p.extend_from_slice(&kafka_offset.to_be_bytes());
    if v2 {
        p.extend_from_slice(&records_start.to_be_bytes());
    }
    p.extend_from_slice(producers);
    p
}

/// What a snapshot holds: a data partition's (log start, DeleteRecords' start or 0, producer
/// table bytes; empty when written before producers were followed) or a table group's (log
/// start, table).
enum SnapshotBody<'a> {
    Data(i64, i64, &'a [u8]),
    Table(i64, &'a [u8]),
}

fn decode_snapshot(bytes: &[u8]) -> Option<SnapshotBody<'_>> {
    let mut r = Reader::new(bytes);
    let kind = r.u8()?;
    let kafka = r.i64()?;
    match kind {
        SNAPSHOT_DATA => Some(SnapshotBody::Data(kafka, 0, r.rest())),
        SNAPSHOT_DATA_V2 => {
            let records_start = r.i64()?;
            Some(SnapshotBody::Data(kafka, records_start, r.rest()))
        }
        SNAPSHOT_TABLE => Some(SnapshotBody::Table(kafka, r.rest())),
        _ => None,
    }
}

impl StateMachine {
    /// Loads the `state` file beside the log and brings the log in line with it: entries the
    /// log start covers are purged (a crash may have come between saving it and purging), a log
    /// behind it starts over there, a table is restored.
    pub fn open(
        store: LogStore,
        kind: GroupKind,
        table_snapshot_every: u64,
    ) -> std::io::Result<StateMachine> {
        let shared = &store.shared;
        let mut state = GroupState::load(shared.fs.as_ref(), &shared.dir)?.unwrap_or_default();
        let log = &shared.log;
        if let Some(ls) = &state.log_start {
            let p = ls.last_purged;
            if log.tail().next_index <= p.index {
                log.reset(p.index + 1, ls.kafka_offset, p.leader_id.term)
                    .map_err(std::io::Error::other)?;
            } else {
                log.purge_through(p.index).map_err(std::io::Error::other)?;
            }
            log.advance_log_start(ls.kafka_offset);
        }
        log.advance_log_start(state.records_start);
        let (first, _) = log.first();
        let tail = log.tail();
        if let Some(a) = state.applied {
            if a.index >= tail.next_index {
                // Damage cut the log below what was applied: apply again what comes back.
                let kept = tail.next_index.checked_sub(1).filter(|&i| i + 1 > first);
                tracing::warn!(dir = %shared.dir.display(), applied = a.index, log_end = tail.next_index, "the log ends before the applied position; applying again from the log's end");
                state.applied = kept
                    .map(|i| LogId::new(openraft::CommittedLeaderId::new(tail.last_term, 0), i));
            }
        }
        // What a snapshot covers is applied, whatever the log still holds.
        if let Some(purged) = state.log_start.as_ref().map(|ls| ls.last_purged) {
            if state.applied < Some(purged) {
                state.applied = Some(purged);
            }
        }
        let mut producers = ProducerTable::default();
        match (&kind, &state.table) {
            (GroupKind::Table(table), Some(bytes)) => {
                table.restore(bytes).map_err(std::io::Error::other)?;
            }
            (GroupKind::Data, Some(bytes)) => {
                producers = ProducerTable::decode(bytes).map_err(std::io::Error::other)?;
            }
            (_, None) => {}
        }
        let next_kafka = match state.applied {
            Some(a) if a.index + 1 >= first => {
                log.kafka_after(a.index).map_err(std::io::Error::other)?
            }
            _ => log.log_start_offset(),
        };
        let (tx, _) = watch::channel(next_kafka);
        Ok(StateMachine {
            inner: Arc::new(Mutex::new(SmInner {
                state,
                producers,
                next_kafka,
                since_save: 0,
                save_generation: 0,
            })),
            file_gate: Arc::new(FileGate::default()),
            high_watermark: Arc::new(tx),
            store,
            kind,
            snapshot_wanted: Arc::new(Notify::new()),
            table_snapshot_every: table_snapshot_every.max(1),
        })
    }

    fn lock(&self) -> MutexGuard<'_, SmInner> {
        lock(&self.inner)
    }

    /// The Kafka offset after the last purged entry (`i64::MIN` before any purge): log starts
    /// at or below it are already applied.
    pub fn purged_kafka(&self) -> i64 {
        self.lock()
            .state
            .log_start
            .as_ref()
            .map_or(i64::MIN, |l| l.kafka_offset)
    }

    /// Kafka offset below which records are committed and applied: consumers read below it.
    pub fn high_watermark(&self) -> i64 {
        self.lock().next_kafka
    }

    /// Changes of the high watermark (fetch long polls, acks).
    pub fn subscribe_high_watermark(&self) -> watch::Receiver<i64> {
        self.high_watermark.subscribe()
    }

    pub fn last_applied(&self) -> Option<LogId> {
        self.lock().state.applied
    }

    /// The producer table and the high watermark, as of what is applied (taken together).
    pub fn producers(&self) -> (ProducerTable, i64) {
        let inner = self.lock();
        (inner.producers.clone(), inner.next_kafka)
    }

    /// Resolves when a snapshot is due.
    pub fn snapshot_wanted(&self) -> Arc<Notify> {
        self.snapshot_wanted.clone()
    }

    /// The state file's content as of what is applied, never past what the log has synced;
    /// `None` for a table group, whose file is written with its snapshot only. Counts as saved.
    fn state_to_save(&self, inner: &mut SmInner) -> Option<(GroupState, u64)> {
        if matches!(self.kind, GroupKind::Table(_)) {
            return None;
        }
        let durable = self.store.shared.log.durable_tail();
        let mut state = inner.state.clone();
        if let Some(a) = state.applied {
            if a.index >= durable.next_index {
                state.applied = durable
                    .next_index
                    .checked_sub(1)
                    .map(|i| LogId::new(openraft::CommittedLeaderId::new(durable.last_term, 0), i));
            }
        }
        if let Some(purged) = state.log_start.as_ref().map(|ls| ls.last_purged) {
            if state.applied < Some(purged) {
                state.applied = Some(purged);
            }
        }
        // The producers as of the in-memory applied position, which may be past the saved one:
        // applying the entries in between again changes nothing (`producers.rs`).
        state.table = Some(Bytes::from(inner.producers.encode()));
        inner.since_save = 0;
        Some((state, inner.next_generation()))
    }

    /// Writes `state`, built in `generation`, on the blocking pool: the write is two fsyncs (the
    /// file's and its directory's), which on a runtime worker would stall every task queued
    /// behind it, and nobody waits on the state machine's lock meanwhile (readers of the
    /// producers and the high watermark go on). [`FileGate`] keeps the writes in order.
    async fn write_state(&self, state: GroupState, generation: u64) -> Result<(), LogError> {
        let shared = Arc::clone(&self.store.shared);
        let gate = Arc::clone(&self.file_gate);
        let dir = shared.dir.clone();
        crate::log_store::off_the_runtime(&dir, move || {
            gate.write(shared.fs.as_ref(), &shared.dir, &state, generation)
                .map_err(|source| LogError::Io {
                    op: "writing the state file",
                    path: shared.dir.join(crate::state::STATE_FILE),
                    source,
                })
        })
        .await
    }

    /// Applies `entries` under the state machine's lock; what is left to do without it (save
    /// the state file, publish the high watermark) is returned.
    // openraft's `StorageError` (large) is what `apply` returns; converting here gains nothing.
    #[allow(clippy::result_large_err)]
    fn apply_locked(
        &self,
        entries: impl IntoIterator<Item = Entry>,
    ) -> Result<AppliedEntries, StorageError> {
        let mut out = Vec::new();
        let mut inner = self.lock();
        let mut must_save = false;
        for entry in entries {
            let index = entry.log_id.index;
            let term = entry.log_id.leader_id.term;
            let base = inner.next_kafka;
            let mismatch = |k: i64| {
                StorageIOError::apply(
                    entry.log_id,
                    sm_err(format!(
                        "entry {index} holds Kafka offset {k}, applying in order gives {base}"
                    )),
                )
            };
            let count = match &entry.payload {
                EntryPayload::Normal(Payload::Records {
                    batches,
                    record_count,
                    kafka_offset,
                }) => {
                    // Pair check: the offset the log stamped is the one applying in order gives.
                    if let Some(k) = *kafka_offset {
                        if k != base {
                            return Err(mismatch(k).into());
                        }
                    }
                    match &self.kind {
                        GroupKind::Table(table) => table.apply(index, base, batches),
                        GroupKind::Data => {
                            for b in Payload::producer_batches(batches, base) {
                                inner.producers.apply(b);
                            }
                        }
                    }
                    *record_count
                }
                EntryPayload::Normal(Payload::WrittenAhead { .. }) => {
                    return Err(StorageIOError::apply(
                        entry.log_id,
                        sm_err(
                            "an entry written ahead is never read back (the log gives its records)",
                        ),
                    )
                    .into());
                }
                EntryPayload::Normal(Payload::Summary {
                    record_count,
                    kafka_offset,
                    producers,
                }) => {
                    if *kafka_offset != base {
                        return Err(mismatch(*kafka_offset).into());
                    }
                    if matches!(self.kind, GroupKind::Table(_)) {
                        return Err(StorageIOError::apply(
                            entry.log_id,
                            sm_err("a table group was given an entry without its records"),
                        )
                        .into());
                    }
                    let end = base + i64::from(*record_count);
                    for b in producers {
                        if b.base_offset < base || b.last_offset() >= end {
                            return Err(StorageIOError::apply(
                                entry.log_id,
                                sm_err(format!(
                                    "entry {index}: a producer batch at {}..={} outside its offsets {base}..{end}",
                                    b.base_offset,
                                    b.last_offset()
                                )),
                            )
                            .into());
                        }
                        inner.producers.apply(*b);
                    }
                    *record_count
                }
                EntryPayload::Normal(Payload::Command(Command::LogStart {
                    index: purge_index,
                    term: purge_term,
                    kafka_offset,
                })) => {
                    let current = inner
                        .state
                        .log_start
                        .as_ref()
                        .map_or(i64::MIN, |l| l.kafka_offset);
                    // The snapshot of a log start carries the membership in effect there; only
                    // the latest applied one is known, so a log start before it waits for a
                    // later retention pass (keeping more than retention asked, never less).
                    let membership_after = inner
                        .state
                        .membership
                        .log_id()
                        .is_some_and(|m| m.index > *purge_index);
                    if membership_after {
                        tracing::info!(
                            index,
                            purge_index,
                            membership = ?inner.state.membership.log_id(),
                            "log start before the latest membership change; kept until retention passes it"
                        );
                    } else if *kafka_offset > current
                        && *kafka_offset <= base
                        && *purge_index < index
                    {
                        inner.state.log_start = Some(LogStart {
                            last_purged: LogId::new(
                                openraft::CommittedLeaderId::new(*purge_term, 0),
                                *purge_index,
                            ),
                            kafka_offset: *kafka_offset,
                            membership: inner.state.membership.clone(),
                        });
                        self.store.shared.log.advance_log_start(*kafka_offset);
                        must_save = true;
                    } else {
                        tracing::warn!(
                            index,
                            kafka_offset,
                            current,
                            high_watermark = base,
                            "ignoring a log start that does not move forward within the log"
                        );
                    }
                    0
                }
                EntryPayload::Normal(Payload::Command(Command::DeleteRecords { kafka_offset })) => {
                    let log = &self.store.shared.log;
                    // The leader checked the offset against its high watermark; `base` is at
                    // least that, so a larger offset here means a confused proposer.
                    if *kafka_offset <= log.log_start_offset() {
                        // Already there (applied again after a restart, or an older request).
                    } else if *kafka_offset <= base {
                        inner.state.records_start = *kafka_offset;
                        log.advance_log_start(*kafka_offset);
                        must_save = true;
                    } else {
                        tracing::warn!(
                            index,
                            kafka_offset,
                            log_start = log.log_start_offset(),
                            high_watermark = base,
                            "ignoring a records start that does not move forward within the log"
                        );
                    }
                    0
                }
                EntryPayload::Membership(m) => {
                    inner.state.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                    0
                }
                EntryPayload::Blank => 0,
            };
            inner.next_kafka = base + i64::from(count);
            inner.state.applied = Some(entry.log_id);
            inner.since_save += 1;
            out.push(Applied {
                base_offset: base,
                record_count: count,
                leader_epoch: term,
            });
        }
        let hw = inner.next_kafka;
        let table_due = matches!(self.kind, GroupKind::Table(_))
            && inner.since_save >= self.table_snapshot_every;
        let to_save = if must_save
            || (matches!(self.kind, GroupKind::Data) && inner.since_save >= SAVE_EVERY_ENTRIES)
        {
            self.state_to_save(&mut inner)
        } else {
            None
        };
        Ok(AppliedEntries {
            out,
            high_watermark: hw,
            to_save,
            snapshot_wanted: must_save || table_due,
        })
    }

    /// Saves what is applied (a clean shutdown).
    pub fn save_now(&self) -> std::io::Result<()> {
        let Some((state, generation)) = self.state_to_save(&mut self.lock()) else {
            return Ok(());
        };
        let shared = &self.store.shared;
        self.file_gate
            .write(shared.fs.as_ref(), &shared.dir, &state, generation)
    }
}

/// What [`StateMachine::apply_locked`] leaves to do once the lock is released.
struct AppliedEntries {
    out: Vec<Applied>,
    high_watermark: i64,
    /// The state file's new content and its generation, when a save is due.
    to_save: Option<(GroupState, u64)>,
    snapshot_wanted: bool,
}

impl RaftSnapshotBuilder<KilnRaft> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<KilnRaft>, StorageError> {
        let built = self.snapshot_locked()?;
        if let Some(file) = built.file {
            self.write_state(file.state, file.generation)
                .await
                .map_err(|e| StorageIOError::write_snapshot(None, AnyError::new(&e)))?;
            tracing::info!(dir = %self.store.shared.dir.display(), applied = ?file.applied.map(|a| a.index), bytes = file.table_bytes, "table snapshot written; the log before it is purged");
        }
        Ok(Snapshot {
            meta: built.meta,
            snapshot: Box::new(Cursor::new(built.data)),
        })
    }
}

/// A snapshot built under the state machine's lock.
struct BuiltSnapshot {
    meta: SnapshotMeta<NodeId, EmptyNode>,
    data: Vec<u8>,
    /// A table group's state file, to write once the lock is released.
    file: Option<SnapshotFile>,
}

/// A table snapshot's state file.
struct SnapshotFile {
    state: GroupState,
    generation: u64,
    /// The last entry the table covers.
    applied: Option<LogId>,
    table_bytes: usize,
}

impl StateMachine {
    /// Builds a snapshot under the state machine's lock. A table group's snapshot is its state
    /// file, returned for writing once the lock is released.
    // openraft's `StorageError` (large) is what `build_snapshot` returns.
    #[allow(clippy::result_large_err)]
    fn snapshot_locked(&self) -> Result<BuiltSnapshot, StorageError> {
        let mut inner = self.lock();
        let (last_log_id, data, to_write) = match &self.kind {
            GroupKind::Data => {
                let kafka = inner.state.log_start.as_ref().map_or(0, |l| l.kafka_offset);
                (
                    inner.state.log_start.as_ref().map(|l| l.last_purged),
                    encode_data_snapshot(
                        kafka,
                        inner.state.records_start,
                        &inner.producers.encode(),
                    ),
                    None,
                )
            }
            GroupKind::Table(table) => {
                let bytes = table.snapshot().map_err(|e| {
                    StorageIOError::write_snapshot(
                        None,
                        AnyError::error(format!("table snapshot: {e}")),
                    )
                })?;
                let applied = inner.state.applied;
                inner.state.table = Some(Bytes::from(bytes.clone()));
                if let Some(a) = applied {
                    // The table is as of `applied`, and so is the membership applied.
                    inner.state.log_start = Some(LogStart {
                        last_purged: a,
                        kafka_offset: inner.next_kafka,
                        membership: inner.state.membership.clone(),
                    });
                }
                inner.since_save = 0;
                let generation = inner.next_generation();
                let file = SnapshotFile {
                    state: inner.state.clone(),
                    generation,
                    applied,
                    table_bytes: bytes.len(),
                };
                (
                    applied,
                    encode_snapshot(inner.next_kafka, Some(&bytes)),
                    Some(file),
                )
            }
        };
        let meta = SnapshotMeta {
            last_log_id,
            last_membership: inner
                .state
                .log_start
                .as_ref()
                .map_or_else(|| inner.state.membership.clone(), |l| l.membership.clone()),
            snapshot_id: format!("{last_log_id:?}"),
        };
        Ok(BuiltSnapshot {
            meta,
            data,
            file: to_write,
        })
    }
}

impl RaftStateMachine<KilnRaft> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, EmptyNode>), StorageError> {
        let inner = self.lock();
        Ok((inner.state.applied, inner.state.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let applied = self.apply_locked(entries)?;
        if let Some((state, generation)) = applied.to_save {
            self.write_state(state, generation)
                .await
                .map_err(|e| StorageIOError::write_state_machine(AnyError::new(&e)))?;
        }
        self.high_watermark.send_replace(applied.high_watermark);
        if applied.snapshot_wanted {
            self.snapshot_wanted.notify_one();
        }
        Ok(applied.out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, EmptyNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.into_inner();
        let bad = |why: String| {
            StorageError::from(StorageIOError::read_snapshot(
                Some(meta.signature()),
                sm_err(why),
            ))
        };
        let body = decode_snapshot(&bytes).ok_or_else(|| bad("snapshot does not decode".into()))?;
        let last = meta
            .last_log_id
            .ok_or_else(|| bad("snapshot without a last log id".into()))?;
        let mut inner = self.lock();
        let mut records_start = 0;
        let kafka = match (&self.kind, body) {
            (GroupKind::Table(table), SnapshotBody::Table(kafka, t)) => {
                table.restore(t).map_err(bad)?;
                inner.state.table = Some(Bytes::copy_from_slice(t));
                kafka
            }
            (GroupKind::Data, SnapshotBody::Data(kafka, deleted, p)) => {
                records_start = deleted;
                inner.producers = if p.is_empty() {
                    ProducerTable::default()
                } else {
                    ProducerTable::decode(p).map_err(bad)?
                };
                inner.state.table = Some(Bytes::from(inner.producers.encode()));
                kafka
            }
            _ => return Err(bad("snapshot of the wrong kind of group".into())),
        };
        inner.state.applied = Some(last);
        inner.state.membership = meta.last_membership.clone();
        inner.state.log_start = Some(LogStart {
            last_purged: last,
            kafka_offset: kafka,
            membership: meta.last_membership.clone(),
        });
        inner.next_kafka = kafka;
        inner.state.records_start = inner.state.records_start.max(records_start);
        let shared = &self.store.shared;
        // Written here, under the lock, before the log is reset to the snapshot (rare: a
        // follower far behind); the gate orders it with a snapshot being built meanwhile.
        let generation = inner.next_generation();
        self.file_gate
            .write(shared.fs.as_ref(), &shared.dir, &inner.state, generation)
            .map_err(|e| {
                StorageIOError::write_snapshot(Some(meta.signature()), AnyError::new(&e))
            })?;
        let log = &shared.log;
        if log.tail().next_index <= last.index {
            self.store.forget_written_ahead();
            log.reset(last.index + 1, kafka, last.leader_id.term)
                .map_err(|e| {
                    StorageIOError::write_snapshot(Some(meta.signature()), AnyError::new(&e))
                })?;
        }
        log.advance_log_start(kafka);
        log.advance_log_start(records_start);
        drop(inner);
        self.high_watermark.send_replace(kafka);
        tracing::info!(dir = %shared.dir.display(), last_log_id = %last, kafka, "installed a snapshot: the log starts there");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<KilnRaft>>, StorageError> {
        let inner = self.lock();
        let Some(ls) = inner.state.log_start.clone() else {
            return Ok(None);
        };
        let (last, data) = match &self.kind {
            GroupKind::Data => (
                ls.last_purged,
                encode_data_snapshot(
                    ls.kafka_offset,
                    inner.state.records_start,
                    &inner.producers.encode(),
                ),
            ),
            GroupKind::Table(_) => {
                let Some(t) = &inner.state.table else {
                    return Ok(None);
                };
                (ls.last_purged, encode_snapshot(ls.kafka_offset, Some(t)))
            }
        };
        Ok(Some(Snapshot {
            meta: SnapshotMeta {
                last_log_id: Some(last),
                last_membership: ls.membership.clone(),
                snapshot_id: format!("{last:?}"),
            },
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

/// How the Raft core's own store reads a group's entries (see `log_store.rs`).
pub(crate) fn core_read_mode(kind: &GroupKind) -> ReadMode {
    match kind {
        GroupKind::Data => ReadMode::Summary,
        GroupKind::Table(_) => ReadMode::Full,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::path::Path;
    use std::time::Duration;

    use kiln_log::fs::Fs;
    use kiln_log::sim_fs::{SimFs, SyncBehaviour};

    use super::*;

    /// Two saves whose writes finish in the other order than their contents were built (the
    /// periodic save or a table snapshot on the blocking pool, an installed snapshot inline):
    /// the file keeps the later content.
    #[test]
    fn the_state_file_never_goes_back_to_an_earlier_content() {
        let sim = SimFs::new(Duration::ZERO, SyncBehaviour::Honest);
        let dir = Path::new("/r");
        sim.create_dir_all(dir).unwrap();
        let gate = FileGate::default();
        let state_at = |records_start: i64| GroupState {
            records_start,
            ..GroupState::default()
        };
        let saved = || GroupState::load(&sim, dir).unwrap().unwrap().records_start;

        gate.write(&sim, dir, &state_at(20), 2).unwrap();
        assert_eq!(saved(), 20);
        // Built before the one above, written after it: skipped.
        gate.write(&sim, dir, &state_at(10), 1).unwrap();
        assert_eq!(saved(), 20);
        gate.write(&sim, dir, &state_at(30), 3).unwrap();
        assert_eq!(saved(), 30);
    }

    #[test]
    #[should_panic(expected = "written at most once")]
    fn a_content_is_never_written_twice() {
        let sim = SimFs::new(Duration::ZERO, SyncBehaviour::Honest);
        let dir = Path::new("/r");
        sim.create_dir_all(dir).unwrap();
        let gate = FileGate::default();
        gate.write(&sim, dir, &GroupState::default(), 1).unwrap();
        let _ = gate.write(&sim, dir, &GroupState::default(), 1);
    }
}
