//! Flushing behind the writes (docs/replication.md, "Durability").
//!
//! [`LogStore::append`](super::LogStore) writes its entries and queues a [`Pending`] flush; one
//! flusher task per replica, started when the queue was empty, fsyncs everything written so
//! far and reports every append a sync covered flushed, in the order the appends came. Appends
//! that arrive while a sync runs are covered by the next one, so a leader writes its next
//! entries while the previous ones are fsynced, and one fsync covers all of them. (openraft
//! waits for a follower's flush itself: a follower has one append per sync.)
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

use bytes::Bytes;
use kiln_log::{ControlKind, EntryBody, LogError, NewEntry};
use openraft::storage::LogFlushed;

use super::{lock, Shared};
use crate::full_disk::retry_when_full;
use crate::guard::WriteMark;
use crate::types::KilnRaft;

/// Appends written and waiting for their flush, per replica. Past it an append waits for the
/// flusher to catch up before it returns (openraft's leader has a few entries in flight at
/// most, the proposer's `ENTRIES_IN_FLIGHT`, so this is a bound that is not expected to bite).
pub(super) const FLUSHES_PENDING_MAX: usize = 64;

/// One entry as written: what is written again after a failed sync.
pub(super) struct Body {
    pub(super) index: u64,
    pub(super) term: u64,
    pub(super) kind: Option<ControlKind>,
    pub(super) bytes: Bytes,
}

impl Body {
    pub(super) fn new_entry(&self) -> NewEntry<'_> {
        NewEntry {
            index: self.index,
            term: self.term,
            body: match self.kind {
                Some(k) => EntryBody::Control(k, &self.bytes),
                None => EntryBody::Records(&self.bytes),
            },
        }
    }
}

/// One append, written and not yet known durable.
pub(super) struct Pending {
    pub(super) bodies: Vec<Body>,
    /// The time the entries were stamped with (a rewrite stamps the same).
    pub(super) now_ms: i64,
    pub(super) callback: LogFlushed<KilnRaft>,
    /// The replica's write mark stays up until the flush (a stuck sync is a stuck write).
    pub(super) writing: WriteMark,
}

impl Pending {
    fn first_index(&self) -> u64 {
        self.bodies.first().map_or(0, |b| b.index)
    }

    fn last_index(&self) -> u64 {
        self.bodies.last().map_or(0, |b| b.index)
    }
}

#[derive(Default)]
pub(super) struct Flushes {
    queue: VecDeque<Pending>,
    /// A flusher task is running (one per replica at most).
    running: bool,
}

/// Queues `p` (its entries written just now, under the write gate) and starts the flusher if
/// none runs. Returns the number of appends queued.
pub(super) fn queue(shared: &Arc<Shared>, p: Pending) -> usize {
    assert!(!p.bodies.is_empty(), "an empty append is never queued");
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
        tokio::spawn(run(Arc::clone(shared)));
    }
    f.queue.len()
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

/// The flusher: syncs until the queue is empty.
async fn run(shared: Arc<Shared>) {
    let what = shared.dir.display().to_string();
    loop {
        let upto = {
            let mut f = lock(&shared.flushes);
            match f.queue.back() {
                Some(p) => p.last_index(),
                None => {
                    f.running = false;
                    drop(f);
                    shared.flushed.notify_waiters();
                    return;
                }
            }
        };
        let rewrite = AtomicBool::new(false);
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
        let durable = shared.log.durable_tail().next_index;
        let done: Vec<Pending> = {
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
                    done
                }
                Err(_) => f.queue.drain(..).collect(),
            }
        };
        match &result {
            Ok(()) => {
                for p in done {
                    p.callback.log_io_completed(Ok(()));
                    drop(p.writing);
                }
                if !shared.repairable {
                    super::schedule_claim(&shared);
                }
            }
            Err(e) => {
                tracing::error!(dir = %what, error = %e, "flushing the Raft log failed");
                for p in done {
                    p.callback
                        .log_io_completed(Err(io::Error::other(e.to_string())));
                }
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
    let f = lock(&shared.flushes);
    let durable = shared.log.tail().next_index;
    let mut next = durable;
    for p in f.queue.iter().skip_while(|p| p.last_index() < durable) {
        assert_eq!(
            p.first_index(),
            next,
            "the queued appends not durable start where the durable log ends (a sync never splits an append)"
        );
        let news: Vec<NewEntry<'_>> = p.bodies.iter().map(Body::new_entry).collect();
        shared.log.append(&news, p.now_ms)?;
        next = p.last_index() + 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::path::Path;
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use std::time::Duration;

    use kiln_log::fs::{Fs, FsFile, SyncFuture};
    use kiln_log::sim_fs::{SimFs, SyncBehaviour};
    use kiln_log::LogConfig;
    use openraft::storage::RaftLogStorageExt;
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::super::{lock, LogStore};
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

    /// SimFs whose log segments fail their next `fail_syncs` syncs (a delayed allocation
    /// failure: the bytes were written, the kernel could not place them) and their next
    /// `fail_writes` writes with ENOSPC.
    struct SyncsFail {
        sim: SimFs,
        fail_syncs: Arc<AtomicUsize>,
        fail_writes: Arc<AtomicUsize>,
    }

    struct SyncsFailFile {
        inner: Arc<dyn FsFile>,
        segment: bool,
        fail_syncs: Arc<AtomicUsize>,
        fail_writes: Arc<AtomicUsize>,
    }

    fn take(n: &AtomicUsize) -> bool {
        n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
            .is_ok()
    }

    impl FsFile for SyncsFailFile {
        fn len(&self) -> io::Result<u64> {
            self.inner.len()
        }
        fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
            self.inner.read_exact_at(buf, pos)
        }
        fn write_all_at(&self, bytes: &[u8], pos: u64) -> io::Result<()> {
            if self.segment && take(&self.fail_writes) {
                // ENOSPC
                return Err(io::Error::from_raw_os_error(28));
            }
            self.inner.write_all_at(bytes, pos)
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.inner.set_len(len)
        }
        fn sync(&self) -> SyncFuture {
            if self.segment && take(&self.fail_syncs) {
                // ENOSPC
                return Box::pin(async { Err(io::Error::from_raw_os_error(28)) });
            }
            self.inner.sync()
        }
        fn sync_now(&self) -> io::Result<()> {
            self.inner.sync_now()
        }
        fn describe(&self) -> String {
            self.inner.describe()
        }
    }

    impl Fs for SyncsFail {
        fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
            self.sim.create_dir_all(dir)
        }
        fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
            self.sim.list(dir)
        }
        fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn FsFile>> {
            Ok(Arc::new(SyncsFailFile {
                inner: self.sim.open(path, create)?,
                segment: path.extension().is_some_and(|e| e == "log"),
                fail_syncs: self.fail_syncs.clone(),
                fail_writes: self.fail_writes.clone(),
            }))
        }
        fn exists(&self, path: &Path) -> bool {
            self.sim.exists(path)
        }
        fn remove_file(&self, path: &Path) -> io::Result<()> {
            self.sim.remove_file(path)
        }
        fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
            self.sim.remove_dir_all(dir)
        }
        fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
            self.sim.rename(from, to)
        }
        fn sync_dir(&self, dir: &Path) -> io::Result<()> {
            self.sim.sync_dir(dir)
        }
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

    /// A sync that meets a full disk is not retried alone: the log is cut back and every
    /// queued append written again, and what is reported flushed survives a crash.
    #[tokio::test(start_paused = true)]
    async fn a_sync_on_a_full_disk_writes_the_queued_appends_again() {
        let sim = SimFs::new(Duration::from_millis(5), SyncBehaviour::Honest);
        let fail_syncs = Arc::new(AtomicUsize::new(0));
        let fs = SyncsFail {
            sim: sim.clone(),
            fail_syncs: fail_syncs.clone(),
            fail_writes: Arc::new(AtomicUsize::new(0)),
        };
        let store = open(Arc::new(fs)).await;
        fail_syncs.store(2, Ordering::SeqCst);
        let append = |index: u64, value: &'static str| {
            let mut store = store.clone();
            async move { store.blocking_append([entry(index, value)]).await.unwrap() }
        };
        tokio::join!(
            append(0, "value-a"),
            append(1, "value-b"),
            append(2, "value-c")
        );
        assert_eq!(fail_syncs.load(Ordering::SeqCst), 0, "both failures met");
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
        let fail_writes = Arc::new(AtomicUsize::new(0));
        let fs = SyncsFail {
            sim: sim.clone(),
            fail_syncs: Arc::new(AtomicUsize::new(0)),
            fail_writes: fail_writes.clone(),
        };
        let store = open(Arc::new(fs)).await;
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
        fail_writes.store(1, Ordering::SeqCst);
        // A flusher that panics never reports the append: fail rather than hang.
        tokio::time::timeout(Duration::from_secs(10), append)
            .await
            .expect("the append is reported flushed")
            .unwrap()
            .unwrap();
        assert_eq!(
            fail_writes.load(Ordering::SeqCst),
            0,
            "the claim was refused once"
        );
        assert_eq!(store.shared.log.durable_tail().next_index, 1);
        assert!(
            !store.shared.log.header_behind(),
            "the claim was made after all"
        );
        assert_holds(&store, &["value-a"]);
        assert!(lock(&store.shared.flushes).queue.is_empty());
    }
}
