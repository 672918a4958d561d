//! The Raft log of a replica, on kiln-log: the partition's segments are its Raft log, each
//! record written to disk once (docs/replication.md, "Log layout: one engine").
//!
//! openraft's entries map onto stored entries one to one: a normal entry with records is its
//! batches; a blank entry, a membership and a command are each one control batch. The term is
//! stored in every batch, so a log id is read back from the log alone.
//!
//! Durability: `append` writes the entries and returns; a flusher reports them flushed to
//! openraft once an fsync covers them (`flush.rs`: appends that come while a sync runs share
//! the next one; a full disk is waited out, the entries cut back and written again). openraft
//! waits for that report before a follower answers, and a leader counts its own entries
//! toward a commit only then (Kiln's openraft patch), so a leader's write, its fsync and its
//! followers' overlap. `save_vote`, `truncate` and `purge` return only after every earlier
//! append is flushed and their own fsync. A replica with peers also makes the segment header
//! claim the new entries synced (one more small fsync) before it reports them flushed:
//! recovery then tells damage to any entry it acknowledged from a torn write, so a damaged
//! replica never votes before it is refilled. A single replica has nobody to refill it, so its
//! claim follows a few milliseconds later, off the write path.
//!
//! Written ahead: a leader's proposer writes a new entry of records into the log itself, at the
//! index Raft is about to give it, and queues its sync, before it hands the entry to Raft
//! ([`LogStore::write_ahead`]); the fsync then starts without waiting for the Raft core to
//! take the entry. When the core appends it, the store adopts what is written: same index,
//! term and token. Anything else the core appends there (a membership change or a new leader's
//! blank entry that came first, another leader's entries) cuts what was written ahead, which
//! was never acknowledged, and is written as usual; an entry written ahead that the core then
//! appends elsewhere carries its bytes and is written like a replicated one. Only the leader of
//! the term the vote names writes ahead, so nothing is written in a term this replica does not
//! lead.
//!
//! Reads: the most recent entries are kept in a bounded cache (replication to followers and
//! applying read them right after they are written); older ones come from the segments. The
//! store openraft's core owns reads a data partition's entries as summaries (record counts, no
//! bytes): the core only applies them, and applying a data entry only counts its records.

// openraft's storage traits fix the error type (`StorageError`, large); helpers that feed
// them return it too rather than convert at every call.
#![allow(clippy::result_large_err)]
use std::collections::VecDeque;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use kiln_log::fs::Fs;
use kiln_log::{
    ControlKind, EntryBody, Log, LogError, NewEntry, ReadMode, StoredBody, StoredEntry,
};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, CommittedLeaderId, EntryPayload, LogState, OptionalSend, RaftLogReader,
    StorageIOError,
};

use crate::full_disk::retry_when_full;
use crate::guard::{Guard, ReplicaHealth};
use crate::payload::{Command, Payload};
use crate::record::{decode_membership, encode_membership, Reader, VoteState};
use crate::types::{Entry, KilnRaft, LogId, NodeId, StorageError, Vote};
use crate::vote::{VoteFile, VoteRecovery};

mod flush;
use flush::{Flushes, Pending, FLUSHES_PENDING_MAX};

/// Entries written ahead and not yet appended by Raft, per replica: the proposer's entries in
/// flight (`ENTRIES_IN_FLIGHT`) and a few more. Past it the proposer hands entries to Raft
/// unwritten.
pub const WRITTEN_AHEAD_MAX: usize = 16;
/// Bytes of recent entries one replica keeps in memory.
pub const ENTRY_CACHE_BYTES_MAX: usize = 4 << 20;
/// Bytes one replication read gathers (openraft's `limited_get_log_entries`), at least one
/// entry.
pub const REPLICATION_READ_BYTES_MAX: usize = 4 << 20;
pub(crate) const VOTE_FILE: &str = "vote";

/// What opening a replica's files found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecovery {
    pub log: kiln_log::RecoveryReport,
    pub vote: VoteRecovery,
    /// The guard the replica starts under (persisted in `vote`, so a restart before the repair
    /// is over keeps it).
    pub guard: Guard,
}

impl LogRecovery {
    /// True when the replica starts repairing: it neither votes nor stands for election until
    /// a leader has refilled its log (see [`crate::ReplicatedPartition::repairing`]).
    pub fn repairing(&self) -> bool {
        !self.guard.is_clear()
    }

    /// Entries the log holds after recovery.
    pub fn entries(&self) -> u64 {
        self.log.next_index - self.log.first_index
    }
}

/// Recent entries, oldest first, contiguous.
#[derive(Default)]
struct Cache {
    entries: VecDeque<Entry>,
    bytes: usize,
}

impl Cache {
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|e| e.log_id.index)
    }

    fn push(&mut self, entry: Entry) {
        if let Some(last) = self.entries.back() {
            if last.log_id.index + 1 != entry.log_id.index {
                self.clear();
            }
        }
        self.bytes += entry_bytes(&entry);
        self.entries.push_back(entry);
        while self.bytes > ENTRY_CACHE_BYTES_MAX && self.entries.len() > 1 {
            if let Some(old) = self.entries.pop_front() {
                self.bytes -= entry_bytes(&old);
            }
        }
    }

    fn truncate_from(&mut self, index: u64) {
        while self.entries.back().is_some_and(|e| e.log_id.index >= index) {
            if let Some(e) = self.entries.pop_back() {
                self.bytes -= entry_bytes(&e);
            }
        }
    }

    fn purge_through(&mut self, index: u64) {
        while self
            .entries
            .front()
            .is_some_and(|e| e.log_id.index <= index)
        {
            if let Some(e) = self.entries.pop_front() {
                self.bytes -= entry_bytes(&e);
            }
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// The cached entries `start..end`, if the cache holds all of them.
    fn get(&self, start: u64, end: u64) -> Option<Vec<Entry>> {
        let first = self.first_index()?;
        let last = self.entries.back()?.log_id.index;
        if start < first || end > last + 1 {
            return None;
        }
        let from = usize::try_from(start - first).ok()?;
        let n = usize::try_from(end.saturating_sub(start)).ok()?;
        Some(self.entries.iter().skip(from).take(n).cloned().collect())
    }
}

fn entry_bytes(e: &Entry) -> usize {
    match &e.payload {
        EntryPayload::Normal(p) => p.bytes_len() + 64,
        _ => 64,
    }
}

pub(crate) struct Shared {
    pub(crate) log: Log,
    pub(crate) fs: Arc<dyn Fs>,
    pub(crate) dir: PathBuf,
    vote_file: tokio::sync::Mutex<VoteFile>,
    /// The vote as saved, and the floor below which no vote is reported (the highest term in
    /// the log: a lost vote record must not let a stale leader in).
    vote: Mutex<Option<Vote>>,
    vote_floor_term: u64,
    pub(crate) health: ReplicaHealth,
    cache: Mutex<Cache>,
    /// A header-claim task is scheduled.
    claim_pending: AtomicBool,
    /// The group has peers: the header claim is made before an append is reported flushed.
    repairable: bool,
    /// Appends written and not yet flushed (`flush.rs`).
    flushes: Mutex<Flushes>,
    /// Told when the flusher stops with nothing queued.
    flushed: tokio::sync::Notify,
    /// Held while entries are written: by `append`, by `write_ahead`, and by the flusher
    /// writing them again. Guards the entries written ahead.
    write_gate: Mutex<Ahead>,
}

/// Entries written ahead of Raft (see the module docs), under the write gate.
#[derive(Default)]
struct Ahead {
    /// (index, term, token) of each, in log order; they end the log.
    written: VecDeque<(u64, u64, u64)>,
    /// The token the next one gets.
    next_token: u64,
    /// Raft's append is under way past the gate (cutting what was written ahead to write its own
    /// entries there, or waiting out a full disk, which cuts the log back to what is durable):
    /// nothing is written ahead until it is done.
    paused: bool,
}

/// The Raft log store of one replica (cheap to clone; clones share the log).
#[derive(Clone)]
pub struct LogStore {
    pub(crate) shared: Arc<Shared>,
    /// How data entries are read back (see the module docs).
    mode: ReadMode,
}

fn io_err(e: impl std::error::Error + 'static) -> AnyError {
    AnyError::new(&e)
}

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 0), index)
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The openraft entry for a stored one.
fn to_entry(e: StoredEntry) -> Result<Entry, String> {
    let payload = match e.body {
        StoredBody::Records {
            batches,
            record_count,
        } => EntryPayload::Normal(Payload::Records {
            batches,
            record_count,
            kafka_offset: Some(e.kafka_offset),
        }),
        StoredBody::Summary {
            record_count,
            producers,
        } => EntryPayload::Normal(Payload::Summary {
            record_count,
            kafka_offset: e.kafka_offset,
            producers,
        }),
        StoredBody::Control { kind, payload } => match kind {
            ControlKind::Blank => EntryPayload::Blank,
            ControlKind::Membership => {
                let mut r = Reader::new(&payload);
                let m = decode_membership(&mut r)
                    .filter(|_| r.done())
                    .ok_or_else(|| format!("entry {}: membership does not decode", e.index))?;
                EntryPayload::Membership(m)
            }
            ControlKind::Command => EntryPayload::Normal(Payload::Command(
                Command::decode(&payload)
                    .ok_or_else(|| format!("entry {}: command does not decode", e.index))?,
            )),
        },
    };
    Ok(Entry {
        log_id: log_id(e.term, e.index),
        payload,
    })
}

/// Why the log store refuses an entry (a bug or a peer that lies).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Refused(String);

impl LogStore {
    /// Opens the log in `dir` and the `vote` file beside it, recovering both. Damage sets the
    /// repair guard, which is durable before anything else happens. `repairable`: the group has
    /// peers to repair from (a single replica's damage is only reported: there is no one to
    /// refill it, and a guard would keep it from ever leading).
    pub async fn open(
        fs: Arc<dyn Fs>,
        dir: &Path,
        config: kiln_log::LogConfig,
        repairable: bool,
    ) -> io::Result<(LogStore, LogRecovery)> {
        fs.create_dir_all(dir)?;
        let (log, report) = Log::open(fs.clone(), dir, config).map_err(io::Error::other)?;
        let health = ReplicaHealth::default();
        let (mut vote_file, vote_scan) =
            VoteFile::open(fs.as_ref(), &dir.join(VOTE_FILE), &health).await?;
        let persisted = vote_scan.state.unwrap_or_default();
        let mut guard = persisted.guard;
        let tail = log.tail();
        let vote_term = persisted.vote.map_or(0, |v| v.leader_id.term);
        if let kiln_log::LogTail::Damaged(d) = &report.tail {
            if repairable {
                let until = d
                    .synced_through
                    .unwrap_or(d.first_lost_index)
                    .max(d.first_lost_index);
                guard = guard.merge(Guard::repair(until, d.synced_term.or(Some(vote_term))));
            } else {
                tracing::error!(dir = %dir.display(), first_lost_index = d.first_lost_index, "a single replica lost synced entries: there is no peer to refill them from; they are gone");
            }
        }
        if vote_scan.report.latest_lost {
            let floor = vote_scan.highest_term.unwrap_or(0).max(tail.last_term);
            guard = guard.merge(Guard::vote_floor(floor));
            // The lost save may have held a repair guard that the surviving ones predate: the
            // replica may lack committed entries it acknowledged, and not know which.
            if repairable {
                tracing::error!(dir = %dir.display(), term = floor, "the latest save of the vote file is lost, and with it any repair guard it held: no votes until a leader of a later term is followed");
                guard = guard.merge(Guard::repair_unknown(floor));
            }
        }
        // The log holds entries of a term the vote file does not reach: a vote record was lost
        // (entries of a term are accepted only after its vote is saved). The vote this replica
        // cast in that term is unknown.
        if tail.last_term > vote_term && repairable {
            tracing::error!(dir = %dir.display(), log_term = tail.last_term, vote_term, "the log holds entries of a later term than the saved vote: a vote record is lost, and with it any repair guard it held; no votes until a leader of a later term is followed");
            guard = guard
                .merge(Guard::vote_floor(tail.last_term))
                .merge(Guard::repair_unknown(tail.last_term));
        }
        health.set_guard(guard);
        if guard != persisted.guard {
            vote_file
                .save(
                    &VoteState {
                        vote: persisted.vote,
                        guard,
                    },
                    &health,
                )
                .await?;
        }
        if !persisted.guard.is_clear() && persisted.guard == guard {
            tracing::warn!(dir = %dir.display(), ?guard, "resuming the repair of a damaged replica: no votes until it is over");
        }
        let recovery = LogRecovery {
            log: report,
            vote: vote_scan.report,
            guard,
        };
        let shared = Shared {
            log,
            fs,
            dir: dir.to_path_buf(),
            vote_file: tokio::sync::Mutex::new(vote_file),
            vote: Mutex::new(persisted.vote),
            vote_floor_term: tail.last_term,
            health,
            cache: Mutex::new(Cache::default()),
            claim_pending: AtomicBool::new(false),
            repairable,
            flushes: Mutex::new(Flushes::default()),
            flushed: tokio::sync::Notify::new(),
            write_gate: Mutex::new(Ahead::default()),
        };
        Ok((
            LogStore {
                shared: Arc::new(shared),
                mode: ReadMode::Full,
            },
            recovery,
        ))
    }

    /// This store read in `mode` (the Raft core's own store of a data partition reads
    /// summaries).
    pub(crate) fn with_mode(&self, mode: ReadMode) -> LogStore {
        LogStore {
            shared: self.shared.clone(),
            mode,
        }
    }

    pub fn log(&self) -> &Log {
        &self.shared.log
    }

    /// This replica's health: the repair guard and the disk-full flag.
    pub fn health(&self) -> ReplicaHealth {
        self.shared.health.clone()
    }

    /// Clears the repair guard once it was met: the log is synced (it holds everything the
    /// replica applied), then a state record without the guard is made durable.
    pub(crate) async fn lift_guard(&self) -> io::Result<()> {
        let mut file = self.shared.vote_file.lock().await;
        self.shared.log.sync().await.map_err(io::Error::other)?;
        let state = VoteState {
            vote: *lock(&self.shared.vote),
            guard: Guard::default(),
        };
        file.save(&state, &self.shared.health).await?;
        self.shared.health.set_guard(Guard::default());
        Ok(())
    }

    /// The last entry's log id.
    pub fn last_log_id(&self) -> Option<LogId> {
        let tail = self.shared.log.tail();
        let (first, prev_term) = self.shared.log.first();
        if tail.next_index > first {
            Some(log_id(tail.last_term, tail.next_index - 1))
        } else if first > 0 {
            Some(log_id(prev_term, first - 1))
        } else {
            None
        }
    }

    fn read(&self, start: u64, end: u64, max_bytes: usize) -> Result<Vec<Entry>, StorageError> {
        let tail = self.shared.log.tail().next_index;
        let end = end.min(tail);
        if start >= end {
            return Ok(Vec::new());
        }
        // Purged (by a snapshot) since the caller looked: openraft allows entries that are not
        // found. Nothing is returned rather than the part still held, so a replication stream
        // never sends entries that do not follow its previous log id; the leader sends its
        // snapshot instead. (Seen in the simulation: a deposed leader's stream reading below a
        // snapshot it had just installed, which stopped its Raft node for good.)
        if start < self.shared.log.first().0 {
            return Ok(Vec::new());
        }
        if let Some(cached) = lock(&self.shared.cache).get(start, end) {
            if self.mode == ReadMode::Summary {
                return Ok(cached.into_iter().map(summarize).collect());
            }
            return Ok(cached);
        }
        let stored = self
            .shared
            .log
            .read_entries(start, end, max_bytes, self.mode)
            .map_err(|e| {
                tracing::error!(dir = %self.shared.dir.display(), start, end, error = %e, "reading the Raft log failed; the entry is never served");
                StorageIOError::read_logs(io_err(e))
            })?;
        stored
            .into_iter()
            .map(|e| {
                let index = e.index;
                to_entry(e).map_err(|why| {
                    StorageIOError::read_log_entry(log_id(0, index), io_err(Refused(why))).into()
                })
            })
            .collect()
    }

    /// What the log stores for each entry: its batches, or a control batch. A new data entry's
    /// bytes move out of `entries` (so the log, holding their only reference when the proposer
    /// joined them into a buffer of their own, stamps them in place); [`LogStore::cache_written`]
    /// puts them back as stored. A replicated entry's bytes are a slice of the AppendEntries
    /// frame it came in: they are cloned, so the log copies them and its cache never holds a
    /// whole frame for one entry.
    fn encode(&self, entries: &mut [Entry]) -> Result<Vec<NewEntry>, StorageError> {
        let mut kafka = self.shared.log.tail().next_kafka;
        let mut news = Vec::with_capacity(entries.len());
        for e in entries {
            let body = match &mut e.payload {
                EntryPayload::Blank => EntryBody::Control(ControlKind::Blank, Bytes::new()),
                EntryPayload::Membership(m) => {
                    let mut p = Vec::new();
                    encode_membership(m, &mut p);
                    EntryBody::Control(ControlKind::Membership, Bytes::from(p))
                }
                EntryPayload::Normal(Payload::Command(c)) => {
                    EntryBody::Control(ControlKind::Command, Bytes::from(c.encode()))
                }
                EntryPayload::Normal(Payload::Records {
                    batches,
                    record_count,
                    kafka_offset,
                }) => {
                    // Pair check: a replicated entry carries the offset its leader gave it; this
                    // log must give it the same one.
                    if let Some(k) = kafka_offset {
                        if *k != kafka {
                            let why = format!(
                                "entry {} was written at Kafka offset {k} by its leader, this log would put it at {kafka}",
                                e.log_id.index
                            );
                            return Err(StorageIOError::write_log_entry(
                                e.log_id,
                                io_err(Refused(why)),
                            )
                            .into());
                        }
                    }
                    kafka += i64::from(*record_count);
                    if kafka_offset.is_some() {
                        EntryBody::Records(batches.clone())
                    } else {
                        EntryBody::Records(std::mem::take(batches))
                    }
                }
                // Written ahead, then cut (see the module docs): its bytes as they were stored,
                // stamped again where they land now. That may be further on in Kafka offsets
                // than where they were written ahead: an entry handed to Raft unwritten before
                // it (the proposer's offsets, which the commit pair-checks).
                EntryPayload::Normal(Payload::WrittenAhead {
                    batches,
                    record_count,
                    ..
                }) => {
                    kafka += i64::from(*record_count);
                    EntryBody::Records(batches.clone())
                }
                EntryPayload::Normal(Payload::Summary { .. }) => {
                    let why = format!(
                        "entry {} is a summary, which is never written",
                        e.log_id.index
                    );
                    return Err(
                        StorageIOError::write_log_entry(e.log_id, io_err(Refused(why))).into(),
                    );
                }
            };
            news.push(NewEntry {
                index: e.log_id.index,
                term: e.log_id.leader_id.term,
                body,
            });
        }
        Ok(news)
    }

    /// Caches `entries`, just written (under the write gate), as reads give them back: records
    /// stamped with their offsets.
    fn cache_written(&self, entries: Vec<Entry>, stored: Vec<Bytes>) {
        debug_assert_eq!(entries.len(), stored.len());
        let mut cache = lock(&self.shared.cache);
        let mut kafka_at = self.shared.log.tail().next_kafka
            - entries
                .iter()
                .map(|e| i64::from(payload_records(&e.payload)))
                .sum::<i64>();
        for (e, bytes) in entries.into_iter().zip(stored) {
            let payload = match e.payload {
                EntryPayload::Normal(
                    Payload::Records { record_count, .. }
                    | Payload::WrittenAhead { record_count, .. },
                ) => {
                    let p = EntryPayload::Normal(Payload::Records {
                        batches: bytes,
                        record_count,
                        kafka_offset: Some(kafka_at),
                    });
                    kafka_at += i64::from(record_count);
                    p
                }
                other => other,
            };
            cache.push(Entry {
                log_id: e.log_id,
                payload,
            });
        }
    }

    /// An append whose write met a full disk: once every earlier append is flushed, what of it
    /// is not durable is cut back and written again, synced inline, until it fits. (A flush
    /// behind may have synced the part written before the disk filled: that part stays.)
    async fn append_when_full(&self, news: &[NewEntry], now: i64) -> Result<(), LogError> {
        flush::drain(&self.shared).await;
        let first = news.first().map_or(0, |e| e.index);
        lock(&self.shared.cache).truncate_from(first);
        let log = self.shared.log.clone();
        let what = self.shared.dir.display().to_string();
        let strict_claim = self.shared.repairable;
        retry_when_full(&what, &self.shared.health, || {
            let log = log.clone();
            async move {
                log.rewind_unsynced()?;
                let from = log.tail().next_index;
                assert!(
                    from >= first && from <= first + news.len() as u64,
                    "after a full disk the log ends at {from}, outside the append of {first}.."
                );
                let mut rest: Vec<NewEntry> =
                    news.iter().filter(|e| e.index >= from).cloned().collect();
                let attempt = match log.append(&mut rest, now) {
                    Ok(_) => match log.sync().await {
                        Ok(()) if strict_claim => log.sync_header().await,
                        other => other,
                    },
                    Err(e) => Err(e),
                };
                if matches!(attempt, Err(LogError::DiskFull { .. })) {
                    log.rewind_unsynced()?;
                }
                attempt
            }
        })
        .await
    }

    /// Writes `payload`, new records, into the log as the entry Raft will append next in
    /// `term`, and queues its sync (see the module docs); returns what to hand Raft instead.
    /// `leader`: this replica's id. Left as it is (Raft's append writes it) unless the vote says
    /// this replica leads `term`, fewer than [`WRITTEN_AHEAD_MAX`] are written ahead and no
    /// append of Raft's is under way; and after a failed write, which Raft's append then meets
    /// itself (a full disk is waited out there).
    pub(crate) fn write_ahead(&self, term: u64, leader: NodeId, payload: Payload) -> Payload {
        let Payload::Records {
            batches,
            record_count,
            kafka_offset: None,
        } = payload
        else {
            return payload;
        };
        // Under the gate: Raft's appends are ordered with this one. A vote saved for a later
        // term just after this check is harmless: that term's entries cut this one (and a log's
        // terms never decrease, so none can be written behind them).
        let mut ahead = lock(&self.shared.write_gate);
        let leads = lock(&self.shared.vote).is_some_and(|v| {
            v.committed && v.leader_id.term == term && v.leader_id.voted_for == Some(leader)
        });
        if !leads || ahead.paused || ahead.written.len() >= WRITTEN_AHEAD_MAX {
            return Payload::records(batches, record_count);
        }
        let tail = self.shared.log.tail();
        if let Some(&(last, _, _)) = ahead.written.back() {
            assert_eq!(
                last + 1,
                tail.next_index,
                "the entries written ahead end the log"
            );
        }
        let index = tail.next_index;
        let mut news = vec![NewEntry {
            index,
            term,
            body: EntryBody::Records(batches),
        }];
        let now = now_ms();
        let writing = self.shared.health.writing();
        match self.shared.log.append(&mut news, now) {
            Ok(stored) => {
                let token = ahead.next_token;
                ahead.next_token += 1;
                ahead.written.push_back((index, term, token));
                let as_stored = stored.first().cloned().unwrap_or_default();
                let entry = Entry {
                    log_id: log_id(term, index),
                    payload: EntryPayload::Normal(Payload::records(Bytes::new(), record_count)),
                };
                self.cache_written(vec![entry], stored);
                flush::queue(
                    &self.shared,
                    Pending {
                        entries: news,
                        now_ms: now,
                        writing,
                    },
                );
                Payload::WrittenAhead {
                    batches: as_stored,
                    record_count,
                    token,
                }
            }
            Err(e) => {
                tracing::debug!(dir = %self.shared.dir.display(), error = %e, "writing ahead failed; Raft's append writes the entry");
                let Some(NewEntry {
                    body: EntryBody::Records(batches),
                    ..
                }) = news.pop()
                else {
                    unreachable!("the entry written ahead is the records it was given");
                };
                Payload::records(batches, record_count)
            }
        }
    }

    /// Takes the entries written ahead that Raft appends now off the front of `entries` (same
    /// index, term and token), and returns how many. When more follow at an index the log
    /// already holds (written ahead, and not these), returns that index too: what is written
    /// ahead from there must be cut before they are written.
    fn adopt(&self, entries: &mut Vec<Entry>) -> (usize, Option<u64>) {
        let mut ahead = lock(&self.shared.write_gate);
        let mut n = 0;
        for e in entries.iter() {
            let Some(&(index, term, token)) = ahead.written.front() else {
                break;
            };
            let same = index == e.log_id.index
                && term == e.log_id.leader_id.term
                && matches!(&e.payload, EntryPayload::Normal(Payload::WrittenAhead { token: t, .. }) if *t == token);
            if !same {
                break;
            }
            ahead.written.pop_front();
            n += 1;
        }
        entries.drain(..n);
        let tail = self.shared.log.tail().next_index;
        let cut = entries
            .first()
            .map(|e| e.log_id.index)
            .filter(|&i| i < tail);
        if let Some(from) = cut {
            // Raft appends after its own last entry: everything the log holds past it was
            // written ahead and not adopted.
            assert_eq!(
                ahead.written.front().map(|w| w.0),
                Some(from),
                "Raft appends at {from}, inside the log (ending at {tail}), not where the entries written ahead start"
            );
            ahead.written.clear();
            ahead.paused = true;
        }
        (n, cut)
    }

    /// Cuts the log from `index` on, durably, once every append queued before is flushed.
    async fn cut_from(&self, index: u64) -> Result<(), StorageError> {
        flush::drain(&self.shared).await;
        let log = self.shared.log.clone();
        let dir = &self.shared.dir;
        let what = dir.display().to_string();
        retry_when_full(&what, &self.shared.health, || {
            let log = log.clone();
            async move { off_the_runtime(dir, move || log.truncate_from(index)).await }
        })
        .await
        .map_err(|e| StorageIOError::write_logs(io_err(e)))?;
        lock(&self.shared.cache).truncate_from(index);
        Ok(())
    }

    /// Forgets the entries written ahead: the log is about to be reset under them (a snapshot
    /// installed, which only a follower does).
    pub(crate) fn forget_written_ahead(&self) {
        lock(&self.shared.write_gate).written.clear();
    }

    /// Reports an append that was not queued for a flush: flushed, or failed.
    fn answer(
        &self,
        result: Result<(), LogError>,
        last: LogId,
        callback: LogFlushed<KilnRaft>,
    ) -> Result<(), StorageError> {
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                if !self.shared.repairable {
                    schedule_claim(&self.shared);
                }
                Ok(())
            }
            Err(e) => {
                tracing::error!(dir = %self.shared.dir.display(), error = %e, "appending to the Raft log failed");
                callback.log_io_completed(Err(io::Error::other(e.to_string())));
                Err(StorageIOError::write_log_entry(last, io_err(e)).into())
            }
        }
    }
}

/// Runs file work that blocks (deleting whole segments and fsyncing their directory, which
/// under a heavy write load took hundreds of milliseconds; cutting a tail) on the runtime's
/// blocking pool, so it holds up none of the runtime's workers. Without it every retention pass
/// (every 5 s in `kiln-bench failover`) stalled one of a 2-core broker's two workers long
/// enough for leases of the groups it served to lapse: 13 and 15 lapses in a loaded minute, 0
/// and 0 with it. Not `block_in_place`: that hands the worker's role to another pool thread on
/// every call, so over a long run every pool thread allocates for the hot path and each one
/// grows its own malloc arena (under retention a broker's RSS rose from 80 to 280 MiB in 140 s).
/// On a current-thread runtime (the simulation, some tests) it runs in place, in order.
/// `dir`: the log's directory, named if the work never ran (the runtime shut down first).
pub(crate) async fn off_the_runtime<T: Send + 'static>(
    dir: &Path,
    work: impl FnOnce() -> Result<T, LogError> + Send + 'static,
) -> Result<T, LogError> {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            match tokio::task::spawn_blocking(work).await {
                Ok(out) => out,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => Err(LogError::Io {
                    op: "blocking file work (the runtime is shutting down)",
                    path: dir.to_path_buf(),
                    source: io::Error::other(e.to_string()),
                }),
            }
        }
        _ => work(),
    }
}

/// Schedules a header claim a little later, unless one is pending (see the module docs).
fn schedule_claim(shared: &Arc<Shared>) {
    if shared.claim_pending.swap(true, Ordering::AcqRel) {
        return;
    }
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(kiln_log::HEADER_CLAIM_DELAY).await;
        shared.claim_pending.store(false, Ordering::Release);
        if shared.log.header_behind() {
            if let Err(e) = shared.log.sync_header().await {
                tracing::warn!(dir = %shared.dir.display(), error = %e, "could not bring the segment header up to date");
            }
        }
    });
}

/// A data entry without its bytes.
fn summarize(e: Entry) -> Entry {
    match e.payload {
        EntryPayload::Normal(Payload::Records {
            record_count,
            kafka_offset: Some(kafka_offset),
            batches,
        }) => Entry {
            log_id: e.log_id,
            payload: EntryPayload::Normal(Payload::Summary {
                record_count,
                kafka_offset,
                producers: Payload::producer_batches(&batches, kafka_offset),
            }),
        },
        other => Entry {
            log_id: e.log_id,
            payload: other,
        },
    }
}

impl RaftLogReader<KilnRaft> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s + 1,
            Bound::Unbounded => self.shared.log.first().0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e + 1,
            Bound::Excluded(&e) => e,
            Bound::Unbounded => u64::MAX,
        };
        self.read(start, end, usize::MAX)
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        self.read(start, end, REPLICATION_READ_BYTES_MAX)
    }
}

impl RaftLogStorage<KilnRaft> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<KilnRaft>, StorageError> {
        let (first, prev_term) = self.shared.log.first();
        let last_purged = (first > 0).then(|| log_id(prev_term, first - 1));
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: self.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.with_mode(ReadMode::Full)
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let mut file = self.shared.vote_file.lock().await;
        // A vote that only becomes committed (its leader was elected) changes nothing that is
        // read back: `read_vote` reports every vote uncommitted after a restart. Writing and
        // syncing it anyway would cost every election two fsyncs more (the new leader's and
        // each voter's), which with a thousand partitions failing over at once is seconds.
        let same = lock(&self.shared.vote).is_some_and(|v| v.leader_id == vote.leader_id);
        if same {
            *lock(&self.shared.vote) = Some(*vote);
            return Ok(());
        }
        let state = VoteState {
            vote: Some(*vote),
            guard: self.shared.health.guard(),
        };
        file.save(&state, &self.shared.health)
            .await
            .map_err(|e| StorageIOError::write_vote(io_err(e)))?;
        *lock(&self.shared.vote) = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        let vote = *lock(&self.shared.vote);
        let floor = self.shared.vote_floor_term;
        let vote = match vote {
            // Never report a vote below the highest term in the log: a leader of a lower term
            // must not be followed, whatever the vote file lost.
            Some(v) if v.leader_id.term >= floor => Some(v),
            _ if floor > 0 => Some(Vote {
                leader_id: openraft::LeaderId {
                    term: floor,
                    voted_for: None,
                },
                committed: false,
            }),
            other => other,
        };
        // openraft restores a replica whose committed vote names itself as leader at once, with
        // no election and without a new blank entry. Its commit index then starts at what it
        // had applied, and a read it confirms as leader can miss entries it committed before the
        // restart (openraft 0.9 takes the read point from the term's first entry). Reported
        // uncommitted, the vote still binds the replica in its term (it voted for itself), and a
        // new leader is elected with a blank entry whose commit covers everything before it. A
        // damaged replica must not lead at once either: it may lack committed entries.
        Ok(vote.map(|v| Vote {
            leader_id: v.leader_id,
            committed: false,
        }))
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<KilnRaft>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut entries: Vec<Entry> = entries.into_iter().collect();
        let Some(last) = entries.last().map(|e| e.log_id) else {
            callback.log_io_completed(Ok(()));
            return Ok(());
        };
        let (_, cut) = self.adopt(&mut entries);
        if entries.is_empty() {
            flush::wait(&self.shared, last.index, callback);
            return Ok(());
        }
        if let Some(from) = cut {
            if let Err(e) = self.cut_from(from).await {
                callback.log_io_completed(Err(io::Error::other(e.to_string())));
                return Err(e);
            }
        }
        let mut news = match self.encode(&mut entries) {
            Ok(b) => b,
            Err(e) => {
                callback.log_io_completed(Err(io::Error::other(e.to_string())));
                return Err(e);
            }
        };
        let now = now_ms();
        let writing = self.shared.health.writing();
        let written = {
            let mut ahead = lock(&self.shared.write_gate);
            ahead.paused = false;
            assert!(
                ahead.written.is_empty(),
                "Raft writes at the log's end, past anything written ahead"
            );
            match self.shared.log.append(&mut news, now) {
                Ok(stored) => {
                    self.cache_written(entries, stored);
                    let p = Pending {
                        entries: news,
                        now_ms: now,
                        writing,
                    };
                    let queued = flush::queue(&self.shared, p);
                    flush::wait(&self.shared, last.index, callback);
                    Ok(queued)
                }
                Err(e) => {
                    // Waited out below, cutting the log back to what is durable: nothing may
                    // be written ahead meanwhile.
                    if matches!(e, LogError::DiskFull { .. }) {
                        ahead.paused = true;
                    }
                    Err((e, news, callback, writing))
                }
            }
        };
        match written {
            Ok(queued) => {
                if queued > FLUSHES_PENDING_MAX {
                    flush::drain(&self.shared).await;
                }
                Ok(())
            }
            Err((LogError::DiskFull { .. }, news, callback, writing)) => {
                let result = self.append_when_full(&news, now).await;
                lock(&self.shared.write_gate).paused = false;
                drop(writing);
                self.answer(result, last, callback)
            }
            Err((e, _, callback, writing)) => {
                drop(writing);
                self.answer(Err(e), last, callback)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // Raft cuts only entries it appended, so what was written ahead (past them) goes too.
        lock(&self.shared.write_gate).written.clear();
        self.cut_from(log_id.index).await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        flush::drain(&self.shared).await;
        lock(&self.shared.cache).purge_through(log_id.index);
        let log = self.shared.log.clone();
        off_the_runtime(&self.shared.dir, move || log.purge_through(log_id.index))
            .await
            .map_err(|e| StorageIOError::write_logs(io_err(e)))?;
        Ok(())
    }
}

fn payload_records(p: &EntryPayload<KilnRaft>) -> u32 {
    match p {
        EntryPayload::Normal(p) => p.record_count(),
        _ => 0,
    }
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use kiln_log::sim_fs::{SimFs, SyncBehaviour};
    use kiln_log::LogConfig;
    use openraft::storage::{RaftLogStorage, RaftLogStorageExt};

    use super::*;

    fn records(value: &str) -> Payload {
        let batch = crate::sim::build_batch(&[value.as_bytes().to_vec()], 1_000);
        Payload::records(Bytes::from(batch), 1)
    }

    fn entry(term: u64, index: u64, payload: EntryPayload<KilnRaft>) -> Entry {
        Entry {
            log_id: log_id(term, index),
            payload,
        }
    }

    /// A store whose vote says replica 1 leads term 1.
    async fn leading_store() -> LogStore {
        let fs = SimFs::new(Duration::from_millis(1), SyncBehaviour::Honest);
        let (mut store, _) =
            LogStore::open(Arc::new(fs), Path::new("/r"), LogConfig::default(), true)
                .await
                .unwrap();
        store.save_vote(&Vote::new_committed(1, 1)).await.unwrap();
        store
    }

    /// The values the log holds from `from` on, one per entry (`-` for a control entry).
    fn values(store: &LogStore, from: u64) -> Vec<String> {
        let end = store.shared.log.tail().next_index;
        store
            .read(from, end, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|e| match e.payload {
                EntryPayload::Normal(Payload::Records { batches, .. }) => {
                    let text = String::from_utf8_lossy(&batches).into_owned();
                    ["value-a", "value-b", "value-c"]
                        .into_iter()
                        .find(|v| text.contains(v))
                        .unwrap_or("?")
                        .to_string()
                }
                _ => "-".to_string(),
            })
            .collect()
    }

    /// An entry written ahead is in the log and syncing before Raft appends it; Raft's append
    /// adopts it in place (nothing written twice) and is reported flushed.
    #[tokio::test(start_paused = true)]
    async fn raft_adopts_the_entries_written_ahead_in_place() {
        let mut store = leading_store().await;
        let a = store.write_ahead(1, 1, records("value-a"));
        let b = store.write_ahead(1, 1, records("value-b"));
        assert!(matches!(a, Payload::WrittenAhead { .. }));
        assert!(matches!(b, Payload::WrittenAhead { .. }));
        assert_eq!(
            store.shared.log.tail().next_index,
            2,
            "written before Raft has them"
        );
        store
            .blocking_append([
                entry(1, 0, EntryPayload::Normal(a)),
                entry(1, 1, EntryPayload::Normal(b)),
            ])
            .await
            .unwrap();
        assert_eq!(
            store.shared.log.tail().next_index,
            2,
            "adopted, not written again"
        );
        assert!(store.shared.log.durable_tail().next_index >= 2);
        assert_eq!(values(&store, 0), ["value-a", "value-b"]);
        assert!(lock(&store.shared.write_gate).written.is_empty());
    }

    /// Raft appends an entry of its own where one was written ahead (a membership change that
    /// came first): what was written ahead is cut, and when Raft appends those entries next,
    /// they are written from the bytes they carry, at their Kafka offsets.
    #[tokio::test(start_paused = true)]
    async fn an_entry_of_raft_cuts_what_was_written_ahead_there() {
        let mut store = leading_store().await;
        let a = store.write_ahead(1, 1, records("value-a"));
        let b = store.write_ahead(1, 1, records("value-b"));
        store
            .blocking_append([entry(1, 0, EntryPayload::Blank)])
            .await
            .unwrap();
        assert_eq!(
            store.shared.log.tail().next_index,
            1,
            "the entries written ahead are cut"
        );
        assert!(lock(&store.shared.write_gate).written.is_empty());
        store
            .blocking_append([
                entry(1, 1, EntryPayload::Normal(a)),
                entry(1, 2, EntryPayload::Normal(b)),
            ])
            .await
            .unwrap();
        assert_eq!(values(&store, 0), ["-", "value-a", "value-b"]);
        assert_eq!(store.shared.log.tail().next_kafka, 2);
        // And writing ahead goes on after the cut.
        let c = store.write_ahead(1, 1, records("value-c"));
        assert!(matches!(c, Payload::WrittenAhead { .. }));
        store
            .blocking_append([entry(1, 3, EntryPayload::Normal(c))])
            .await
            .unwrap();
        assert_eq!(values(&store, 0), ["-", "value-a", "value-b", "value-c"]);
    }

    /// An entry handed to Raft unwritten (writing ahead was refused for it) and one written
    /// ahead after it, at the index Raft gives the first: Raft's append of the first cuts the
    /// second, which is then written behind it, stamped at its own Kafka offsets.
    #[tokio::test(start_paused = true)]
    async fn an_entry_written_ahead_behind_an_unwritten_one_is_stamped_where_it_lands() {
        let mut store = leading_store().await;
        let unwritten = records("value-a");
        let b = store.write_ahead(1, 1, records("value-b"));
        assert!(matches!(b, Payload::WrittenAhead { .. }));
        store
            .blocking_append([entry(1, 0, EntryPayload::Normal(unwritten))])
            .await
            .unwrap();
        store
            .blocking_append([entry(1, 1, EntryPayload::Normal(b))])
            .await
            .unwrap();
        assert_eq!(values(&store, 0), ["value-a", "value-b"]);
        let read = store.read(1, 2, usize::MAX).unwrap();
        assert!(matches!(
            read[0].payload,
            EntryPayload::Normal(Payload::Records {
                kafka_offset: Some(1),
                ..
            })
        ));
        // Read back from the segments too, not the cache: its batch is stamped at offset 1.
        let stored = store
            .shared
            .log
            .read_entries(1, 2, usize::MAX, ReadMode::Full)
            .unwrap();
        assert_eq!(stored[0].kafka_offset, 1);
        assert_eq!(store.shared.log.tail().next_kafka, 2);
    }

    /// A replica writes ahead only in a term its vote says it leads (the vote committed, for
    /// itself); otherwise the payload comes back as it was and nothing is written.
    #[tokio::test(start_paused = true)]
    async fn nothing_is_written_ahead_outside_a_term_the_replica_leads() {
        let mut store = leading_store().await;
        assert!(matches!(
            store.write_ahead(2, 1, records("value-a")),
            Payload::Records { .. }
        ));
        assert!(matches!(
            store.write_ahead(1, 2, records("value-a")),
            Payload::Records { .. }
        ));
        store.save_vote(&Vote::new(3, 1)).await.unwrap();
        assert!(matches!(
            store.write_ahead(3, 1, records("value-a")),
            Payload::Records { .. }
        ));
        assert_eq!(store.shared.log.tail().next_index, 0);
        // Bounded: past WRITTEN_AHEAD_MAX the payload comes back too.
        store.save_vote(&Vote::new_committed(3, 1)).await.unwrap();
        for _ in 0..WRITTEN_AHEAD_MAX {
            assert!(matches!(
                store.write_ahead(3, 1, records("value-a")),
                Payload::WrittenAhead { .. }
            ));
        }
        assert!(matches!(
            store.write_ahead(3, 1, records("value-a")),
            Payload::Records { .. }
        ));
        assert_eq!(store.shared.log.tail().next_index, WRITTEN_AHEAD_MAX as u64);
    }

    /// While Raft's append waits out a full disk (cutting the log back to what is durable
    /// before each try), nothing is written ahead; afterwards writing ahead goes on.
    #[tokio::test(start_paused = true)]
    async fn nothing_is_written_ahead_while_raft_waits_out_a_full_disk() {
        use kiln_log::faulty_fs::{Faults, FaultyFs, ENOSPC};
        let sim = SimFs::new(Duration::from_millis(1), SyncBehaviour::Honest);
        let faults = Faults::new(ENOSPC);
        let fs = FaultyFs::segments_only(Arc::new(sim), faults.clone());
        let (mut store, _) =
            LogStore::open(Arc::new(fs), Path::new("/r"), LogConfig::default(), true)
                .await
                .unwrap();
        store.save_vote(&Vote::new_committed(1, 1)).await.unwrap();
        // Two refused writes (the append's, then its first try's): it then waits before the
        // next try while the disk has room again, so only the pause keeps an entry from being
        // written ahead where that try cuts the log back.
        faults.fail_writes(2);
        let mut raft = store.clone();
        let append = tokio::spawn(async move {
            raft.blocking_append([entry(1, 0, EntryPayload::Normal(records("value-a")))])
                .await
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(store.health().disk_full(), "the append is waiting");
        assert_eq!(faults.writes_left(), 0, "the disk has room again");
        assert!(matches!(
            store.write_ahead(1, 1, records("value-b")),
            Payload::Records { .. }
        ));
        tokio::time::timeout(Duration::from_secs(30), append)
            .await
            .expect("the append ends once the disk has room")
            .unwrap()
            .unwrap();
        let b = store.write_ahead(1, 1, records("value-b"));
        assert!(matches!(b, Payload::WrittenAhead { .. }));
        store
            .blocking_append([entry(1, 1, EntryPayload::Normal(b))])
            .await
            .unwrap();
        assert_eq!(values(&store, 0), ["value-a", "value-b"]);
    }

    /// A vote that only becomes committed writes nothing (it is read back uncommitted anyway);
    /// a new term or candidate is written and synced, and is what a restart reads.
    #[tokio::test(start_paused = true)]
    async fn only_a_new_term_or_candidate_reaches_the_vote_file() {
        let fs = SimFs::new(Duration::from_millis(1), SyncBehaviour::Honest);
        let dir = Path::new("/r");
        let fs_arc: Arc<dyn Fs> = Arc::new(fs.clone());
        let len = || {
            kiln_log::fs::read_all(&fs, &dir.join(VOTE_FILE))
                .unwrap()
                .unwrap()
                .len()
        };
        let (mut store, _) = LogStore::open(fs_arc.clone(), dir, LogConfig::default(), true)
            .await
            .unwrap();
        store.save_vote(&Vote::new(3, 2)).await.unwrap();
        let after_vote = len();
        assert!(after_vote > 0);
        store.save_vote(&Vote::new_committed(3, 2)).await.unwrap();
        assert_eq!(len(), after_vote, "committing the same vote writes nothing");
        assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(3, 2)));
        store.save_vote(&Vote::new(4, 1)).await.unwrap();
        assert!(len() > after_vote, "a new term is written");
        drop(store);
        let (fs2, _) = fs.crash(|_| 0);
        let (mut store, _) = LogStore::open(Arc::new(fs2), dir, LogConfig::default(), true)
            .await
            .unwrap();
        assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(4, 1)));
    }
}
