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
    pub(super) callback: LogFlushed<KilnRaft>,
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
    /// A flusher task is running (one per replica at most).
    running: bool,
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
