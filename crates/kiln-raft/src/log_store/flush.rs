//! Flushing behind the writes (docs/replication.md, "Durability").
//!
//! [`LogStore::append`](super::LogStore) writes its entries and queues a [`Pending`] flush; one
//! flusher per replica, started when the queue was empty, fsyncs everything written so far and
//! reports every append a sync covered flushed, in the order the appends came. Appends that
//! arrive while a sync runs are covered by the next one, so a leader writes its next entries
//! while the previous ones are fsynced, and one fsync covers all of them. (openraft waits for a
//! follower's flush itself: a follower has one append per sync.)
//!
//! On a multi-threaded runtime (a broker) the flusher is a round on one of
//! [`threads::FLUSHER_THREADS`] threads shared by every replica of the process: the thread fsyncs in
//! place and, while appends are queued, puts the replica back in line for its next round, so
//! a busy log's fsyncs follow each other without waiting for a runtime worker to schedule the
//! next one. (Measured on a 2-core machine: a task that hands each fsync to the blocking pool
//! kept a standalone broker's logs fsyncing 76% of the time, the threads 91%.) On a
//! current-thread runtime (the simulation, most tests) it is a task on the runtime, so a seed
//! replays exactly.
//!
//! A sync that meets a full disk is not simply retried: after a failed fsync Linux may drop the
//! pages it could not write and report the next fsync clean. The log is cut back to what is
//! durable and every queued append is written again, byte for byte (same entries, offsets and
//! time), before the next sync; the disk-full backoff is `full_disk.rs`'s.
//!
//! Invariants (asserted): the queue holds appends in log order, the first not yet durable
//! starting where the durable log ends (a sync never splits an append); a successful sync
//! covers every append queued before it began.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kiln_log::{LogError, NewEntry};
use openraft::storage::LogFlushed;

use super::{lock, Shared};
use crate::full_disk::retry_when_full;
use crate::guard::WriteMark;
use crate::types::KilnRaft;

/// Appends written and waiting for their flush, per replica. Past it an append waits for the
/// flusher to catch up before it returns (openraft's leader has a few entries in flight at
/// most, the proposer's `ENTRIES_IN_FLIGHT`, so this is a bound that is not expected to bite).
pub(super) const FLUSHES_PENDING_MAX: usize = 64;

/// One append, written and not yet known durable.
pub(super) struct Pending {
    /// Its entries as written (records stamped): what is written again after a failed sync.
    pub(super) entries: Vec<NewEntry>,
    /// The time the entries were stamped with (a rewrite stamps the same).
    pub(super) now_ms: i64,
    /// The replica's write mark stays up until the flush (a stuck sync is a stuck write).
    pub(super) writing: WriteMark,
}

impl Pending {
    fn first_index(&self) -> u64 {
        self.entries.first().map_or(0, |e| e.index)
    }

    fn last_index(&self) -> u64 {
        self.entries.last().map_or(0, |e| e.index)
    }
}

#[derive(Default)]
pub(super) struct Flushes {
    queue: VecDeque<Pending>,
    /// openraft's appends waiting to be reported flushed, each by its last index, in log order.
    /// Apart from `queue` because an entry written ahead (`LogStore::write_ahead`) is queued
    /// for its sync when it is written and reported when Raft appends it, before or after.
    waiters: VecDeque<(u64, LogFlushed<KilnRaft>)>,
    /// A flusher is running (one per replica at most).
    running: bool,
    /// A sync failed: what is written and not durable never will be (openraft stops the
    /// replica on the first failed append); every later waiter hears the same.
    failed: Option<String>,
}

/// Queues `p` (its entries written just now, under the write gate) and starts the flusher if
/// none runs. Returns the number of appends queued.
pub(super) fn queue(shared: &Arc<Shared>, p: Pending) -> usize {
    assert!(!p.entries.is_empty(), "an empty append is never queued");
    let mut f = lock(&shared.flushes);
    if let Some(prev) = f.queue.back() {
        assert_eq!(
            prev.last_index() + 1,
            p.first_index(),
            "appends are queued in log order"
        );
    }
    f.queue.push_back(p);
    if !f.running {
        f.running = true;
        start(Arc::clone(shared));
    }
    f.queue.len()
}

/// Starts the replica's flusher (see the module docs for which).
fn start(shared: Arc<Shared>) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            threads::push(Round { shared, runtime });
        }
        _ => {
            tokio::spawn(run(shared, false));
        }
    }
}

/// Reports `callback` flushed once a sync covers the entries up to `last_index` (written and
/// queued already): at once if one did.
pub(super) fn wait(shared: &Shared, last_index: u64, callback: LogFlushed<KilnRaft>) {
    let mut f = lock(&shared.flushes);
    if let Some(why) = &f.failed {
        let why = why.clone();
        drop(f);
        callback.log_io_completed(Err(io::Error::other(why)));
        return;
    }
    if shared.log.durable_tail().next_index > last_index {
        drop(f);
        callback.log_io_completed(Ok(()));
        return;
    }
    // Not durable, so still queued: the flusher that syncs it takes the waiter too.
    assert!(
        f.queue.back().is_some_and(|p| p.last_index() >= last_index),
        "a waiter for entry {last_index}, which is neither durable nor queued"
    );
    if let Some((prev, _)) = f.waiters.back() {
        assert!(*prev < last_index, "waiters are in log order");
    }
    f.waiters.push_back((last_index, callback));
}

/// Waits until every queued append is flushed (or failed) and the flusher has stopped.
pub(super) async fn drain(shared: &Shared) {
    loop {
        let idle = shared.flushed.notified();
        tokio::pin!(idle);
        idle.as_mut().enable();
        {
            let f = lock(&shared.flushes);
            if !f.running && f.queue.is_empty() {
                return;
            }
        }
        idle.await;
    }
}

/// The last append queued: what the next sync covers. `None` (and the flusher stopped) when
/// nothing is queued.
fn next_round(shared: &Shared) -> Option<u64> {
    let mut f = lock(&shared.flushes);
    match f.queue.back() {
        Some(p) => Some(p.last_index()),
        None => {
            f.running = false;
            drop(f);
            shared.flushed.notify_waiters();
            None
        }
    }
}

/// The flusher as a task: syncs until the queue is empty. `rewrite_first`: a thread's sync met
/// a full disk, so the queued appends are written again before the next sync.
async fn run(shared: Arc<Shared>, rewrite_first: bool) {
    let what = shared.dir.display().to_string();
    let rewrite = AtomicBool::new(rewrite_first);
    while let Some(upto) = next_round(&shared) {
        let result = retry_when_full(&what, &shared.health, || {
            let shared = &shared;
            let rewrite = &rewrite;
            async move {
                if rewrite.load(Ordering::Acquire) {
                    write_again(shared)?;
                    rewrite.store(false, Ordering::Release);
                }
                let synced = match shared.log.sync().await {
                    Ok(()) if shared.repairable => shared.log.sync_header().await,
                    other => other,
                };
                if matches!(synced, Err(LogError::DiskFull { .. })) {
                    rewrite.store(true, Ordering::Release);
                }
                synced
            }
        })
        .await;
        finish(&shared, upto, result);
    }
}

/// Reports what a sync that covered the appends queued up to `upto` did: every append it made
/// durable flushed, in order; after an error every queued append failed.
fn finish(shared: &Arc<Shared>, upto: u64, result: Result<(), LogError>) {
    let durable = shared.log.durable_tail().next_index;
    let (done, waiters) = {
        let mut f = lock(&shared.flushes);
        match &result {
            Ok(()) => {
                assert!(
                    durable > upto,
                    "a sync covers every append queued before it (durable to {durable}, queued to {upto})"
                );
                let mut done = Vec::new();
                while f.queue.front().is_some_and(|p| p.last_index() < durable) {
                    done.extend(f.queue.pop_front());
                }
                let mut waiters = Vec::new();
                while f.waiters.front().is_some_and(|(last, _)| *last < durable) {
                    waiters.extend(f.waiters.pop_front());
                }
                (done, waiters)
            }
            Err(e) => {
                f.failed = Some(e.to_string());
                (f.queue.drain(..).collect(), f.waiters.drain(..).collect())
            }
        }
    };
    // The write marks come down once durable (or failed).
    for p in done {
        drop(p.writing);
    }
    match &result {
        Ok(()) => {
            for (_, callback) in waiters {
                callback.log_io_completed(Ok(()));
            }
            if !shared.repairable {
                super::schedule_claim(shared);
            }
        }
        Err(e) => {
            tracing::error!(dir = %shared.dir.display(), error = %e, "flushing the Raft log failed");
            for (_, callback) in waiters {
                callback.log_io_completed(Err(io::Error::other(e.to_string())));
            }
        }
    }
}

/// One sync of one replica on a flusher thread.
struct Round {
    shared: Arc<Shared>,
    /// The runtime the replica's appends come from: where its callbacks and header claims run,
    /// and where a full disk is waited out.
    runtime: tokio::runtime::Handle,
}

impl Round {
    /// Syncs what is queued, in place, and reports it. Returns the round back when more is
    /// queued; on a full disk hands the replica to a flusher task, which waits it out.
    fn run(self) -> Option<Round> {
        let upto = next_round(&self.shared)?;
        let log = &self.shared.log;
        let synced = match log.sync_in_place() {
            Ok(()) if self.shared.repairable => log.sync_header_in_place(),
            other => other,
        };
        if matches!(synced, Err(LogError::DiskFull { .. })) {
            self.runtime.spawn(run(self.shared, true));
            return None;
        }
        let _inside = self.runtime.enter();
        finish(&self.shared, upto, synced);
        Some(self)
    }
}

/// The process's flusher threads and the replicas waiting for a round, first come first served
/// (a replica is in line at most once: its flusher is running while it is).
mod threads {
    use std::collections::VecDeque;
    use std::sync::{Condvar, Mutex, OnceLock};

    use super::{lock, Round};

    /// Flusher threads per process. Each spends its time in `fdatasync`; a replica with
    /// appends queued waits for a free one. Enough for the logs a broker writes at once to
    /// fsync in parallel (a disk serves several fsyncs at a time), bounded so a broker with
    /// thousands of partitions does not run thousands of threads.
    pub const FLUSHER_THREADS: usize = 8;

    #[derive(Default)]
    struct Line {
        rounds: Mutex<VecDeque<Round>>,
        ready: Condvar,
    }

    fn line() -> &'static Line {
        static LINE: OnceLock<&'static Line> = OnceLock::new();
        LINE.get_or_init(|| {
            let line: &'static Line = Box::leak(Box::default());
            for i in 0..FLUSHER_THREADS {
                let spawned = std::thread::Builder::new()
                    .name(format!("kiln-flush-{i}"))
                    .spawn(move || work(line));
                if let Err(e) = spawned {
                    // Fewer threads serve the same line; none at all would hang every append.
                    assert!(i > 0, "no flusher thread could start: {e}");
                    tracing::warn!(error = %e, threads = i, "fewer flusher threads than planned");
                    break;
                }
            }
            line
        })
    }

    /// Puts a replica in line for a round.
    pub(super) fn push(round: Round) {
        let line = line();
        lock(&line.rounds).push_back(round);
        line.ready.notify_one();
    }

    fn work(line: &'static Line) {
        loop {
            let round = {
                let mut rounds = lock(&line.rounds);
                loop {
                    if let Some(r) = rounds.pop_front() {
                        break r;
                    }
                    rounds = line.ready.wait(rounds).unwrap_or_else(|p| p.into_inner());
                }
            };
            if let Some(again) = round.run() {
                lock(&line.rounds).push_back(again);
            }
        }
    }
}

/// After a sync met a full disk: cuts the log back to what is durable and writes every queued
/// append again, with the bytes and offsets they had. Appends the failed round made durable
/// before it failed (the data fsynced, the header claim refused) stay as they are.
fn write_again(shared: &Shared) -> Result<(), LogError> {
    let _gate = lock(&shared.write_gate);
    shared.log.rewind_unsynced()?;
    let mut f = lock(&shared.flushes);
    let durable = shared.log.tail().next_index;
    let mut next = durable;
    for p in f.queue.iter_mut().skip_while(|p| p.last_index() < durable) {
        assert_eq!(
            p.first_index(),
            next,
            "the queued appends not durable start where the durable log ends (a sync never splits an append)"
        );
        shared.log.append(&mut p.entries, p.now_ms)?;
        next = p.last_index() + 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::path::Path;
    use std::time::Duration;

    use bytes::Bytes;
    use kiln_log::faulty_fs::{Faults, FaultyFs, ENOSPC};
    use kiln_log::fs::Fs;
    use kiln_log::sim_fs::{SimFs, SyncBehaviour};
    use kiln_log::LogConfig;
    use openraft::storage::RaftLogStorageExt;
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::super::{lock, LogStore};
    use super::*;
    use crate::payload::Payload;
    use crate::sim::build_batch;
    use crate::types::{Entry, LogId};

    fn entry(index: u64, value: &str) -> Entry {
        let batch = build_batch(&[value.as_bytes().to_vec()], 1_000);
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Payload::records(Bytes::from(batch), 1)),
        }
    }

    /// A store on `sim` whose log segments fail with ENOSPC as the returned faults say.
    async fn open_faulty(sim: &SimFs) -> (LogStore, Arc<Faults>) {
        let faults = Faults::new(ENOSPC);
        let fs = FaultyFs::segments_only(Arc::new(sim.clone()), faults.clone());
        (open(Arc::new(fs)).await, faults)
    }

    async fn open(fs: Arc<dyn Fs>) -> LogStore {
        let (store, _) = LogStore::open(fs, Path::new("/r"), LogConfig::default(), true)
            .await
            .unwrap();
        store
    }

    /// Asserts that `store`'s entries `0..` are one valid batch each holding `values`, in
    /// order, read back from the segments.
    fn assert_holds(store: &LogStore, values: &[&str]) {
        let end = values.len() as u64;
        let entries = store
            .shared
            .log
            .read_entries(0, end, usize::MAX, kiln_log::ReadMode::Full)
            .unwrap();
        assert_eq!(entries.len(), values.len());
        for (e, value) in entries.into_iter().zip(values) {
            let kiln_log::StoredBody::Records { batches, .. } = e.body else {
                panic!("entry {} is not records", e.index);
            };
            kiln_log::batch::validate_batches(&batches).unwrap();
            assert!(
                batches.windows(value.len()).any(|w| w == value.as_bytes()),
                "entry {} does not hold {value}",
                e.index
            );
        }
    }

    /// Three appends made while the first one's sync runs: each is reported flushed only once
    /// a sync covers it, and the second sync covers the other two.
    #[tokio::test(start_paused = true)]
    async fn appends_during_a_sync_share_the_next_one_and_are_reported_once_synced() {
        let sim = SimFs::new(Duration::from_millis(5), SyncBehaviour::Honest);
        let store = open(Arc::new(sim.clone())).await;
        let syncs_before = sim.syncs();
        let append = |index: u64, value: &'static str| {
            let mut store = store.clone();
            async move {
                store.blocking_append([entry(index, value)]).await.unwrap();
                let durable = store.shared.log.durable_tail().next_index;
                assert!(
                    durable > index,
                    "entry {index} reported flushed, durable to {durable}"
                );
            }
        };
        tokio::join!(
            append(0, "value-a"),
            append(1, "value-b"),
            append(2, "value-c")
        );
        assert_eq!(store.shared.log.durable_tail().next_index, 3);
        // A replica with peers also syncs the header claim after each data sync.
        let syncs = sim.syncs() - syncs_before;
        assert!(
            syncs <= 4,
            "{syncs} syncs for three appends, two rounds at most"
        );
        assert_holds(&store, &["value-a", "value-b", "value-c"]);
        assert!(lock(&store.shared.flushes).queue.is_empty());
    }

    /// On a multi-threaded runtime the flusher threads sync in place: concurrent appends to
    /// several replicas on real files are each reported flushed once durable.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_flusher_threads_report_appends_on_real_files_once_durable() {
        let dir = tempfile::tempdir().unwrap();
        let mut writers = Vec::new();
        for r in 0..3 {
            let (store, _) = LogStore::open(
                Arc::new(kiln_log::fs::RealFs),
                &dir.path().join(format!("r{r}")),
                LogConfig::default(),
                r == 0,
            )
            .await
            .unwrap();
            writers.push(tokio::spawn(async move {
                let mut s = store.clone();
                for i in 0..50u64 {
                    s.blocking_append([entry(i, "value-a")]).await.unwrap();
                    assert!(s.shared.log.durable_tail().next_index > i);
                }
                drain(&s.shared).await;
                assert!(lock(&s.shared.flushes).queue.is_empty());
                assert!(lock(&s.shared.flushes).waiters.is_empty());
                store
            }));
        }
        for w in writers {
            let store = w.await.unwrap();
            assert_eq!(store.shared.log.durable_tail().next_index, 50);
        }
    }

    /// A sync that meets a full disk is not retried alone: the log is cut back and every
    /// queued append written again, and what is reported flushed survives a crash.
    #[tokio::test(start_paused = true)]
    async fn a_sync_on_a_full_disk_writes_the_queued_appends_again() {
        let sim = SimFs::new(Duration::from_millis(5), SyncBehaviour::Honest);
        let (store, faults) = open_faulty(&sim).await;
        faults.fail_syncs(2);
        let append = |index: u64, value: &'static str| {
            let mut store = store.clone();
            async move { store.blocking_append([entry(index, value)]).await.unwrap() }
        };
        tokio::join!(
            append(0, "value-a"),
            append(1, "value-b"),
            append(2, "value-c")
        );
        assert_eq!(faults.syncs_left(), 0, "both failures met");
        assert!(!store.health().disk_full(), "the wait is over");
        assert_eq!(store.shared.log.durable_tail().next_index, 3);
        assert_holds(&store, &["value-a", "value-b", "value-c"]);
        drop(store);
        // Only what was synced survives: all three, once each.
        let (crashed, _) = sim.crash(|_| 0);
        let store = open(Arc::new(crashed)).await;
        assert_eq!(store.shared.log.tail().next_index, 3);
        assert_holds(&store, &["value-a", "value-b", "value-c"]);
    }

    /// A round whose data fsync succeeded but whose header claim met a full disk: the append it
    /// made durable stays (it is not written again over itself), the claim is made on the next
    /// try, and the append is reported flushed once.
    #[tokio::test(start_paused = true)]
    async fn a_claim_refused_after_the_data_is_synced_keeps_the_synced_append() {
        let sim = SimFs::new(Duration::from_millis(5), SyncBehaviour::Honest);
        let (store, faults) = open_faulty(&sim).await;
        let mut writer = store.clone();
        let append =
            tokio::spawn(async move { writer.blocking_append([entry(0, "value-a")]).await });
        // The entry is written and its data fsync is under way (5 ms): the next segment write
        // is the header claim that follows it.
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(store.shared.log.tail().next_index, 1, "written");
        assert_eq!(
            store.shared.log.durable_tail().next_index,
            0,
            "not synced yet"
        );
        faults.fail_writes(1);
        // A flusher that panics never reports the append: fail rather than hang.
        tokio::time::timeout(Duration::from_secs(10), append)
            .await
            .expect("the append is reported flushed")
            .unwrap()
            .unwrap();
        assert_eq!(faults.writes_left(), 0, "the claim was refused once");
        assert_eq!(store.shared.log.durable_tail().next_index, 1);
        assert!(
            !store.shared.log.header_behind(),
            "the claim was made after all"
        );
        assert_holds(&store, &["value-a"]);
        assert!(lock(&store.shared.flushes).queue.is_empty());
    }
}
