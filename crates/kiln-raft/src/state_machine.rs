//! The state machine of a replicated partition. The records already live in the Raft log
//! (`log_store`), so applying a committed entry only moves the high watermark: the Kafka
//! offset after the last applied record. It is kept in memory and rebuilt on start by
//! re-applying the log (openraft re-applies from `applied_state`, which starts empty).

use std::io::Cursor;
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::RaftStateMachine;
use openraft::{
    AnyError, EmptyNode, EntryPayload, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta,
    StorageIOError, StoredMembership,
};
use tokio::sync::watch;

use crate::log_store::LogStore;
use crate::record::record_count;
use crate::types::{Applied, Batches, Entry, KilnRaft, LogId, NodeId, StorageError};

#[derive(Debug)]
struct SmInner {
    last_applied: Option<LogId>,
    membership: StoredMembership<NodeId, EmptyNode>,
    /// The high watermark: the offset after every applied record.
    next_offset: i64,
}

/// See the module docs. Cheap to clone.
#[derive(Clone)]
pub struct StateMachine {
    inner: Arc<Mutex<SmInner>>,
    high_watermark: Arc<watch::Sender<i64>>,
    log: LogStore,
}

#[derive(Debug, thiserror::Error)]
#[error("entry {index}: the log translated it to offsets {log:?}, applying gives {applied:?}")]
struct OffsetMismatch {
    index: u64,
    log: Option<std::ops::Range<i64>>,
    applied: std::ops::Range<i64>,
}

#[derive(Debug, thiserror::Error)]
#[error("snapshots are not supported: the log is never purged")]
struct NoSnapshots;

impl StateMachine {
    pub fn new(log: LogStore) -> StateMachine {
        let (tx, _) = watch::channel(0);
        StateMachine {
            inner: Arc::new(Mutex::new(SmInner {
                last_applied: None,
                membership: StoredMembership::default(),
                next_offset: 0,
            })),
            high_watermark: Arc::new(tx),
            log,
        }
    }

    fn lock(&self) -> MutexGuard<'_, SmInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Kafka offset below which records are committed and applied: consumers read below it.
    pub fn high_watermark(&self) -> i64 {
        self.lock().next_offset
    }

    /// Changes of the high watermark (fetch long polls, acks).
    pub fn subscribe_high_watermark(&self) -> watch::Receiver<i64> {
        self.high_watermark.subscribe()
    }

    pub fn last_applied(&self) -> Option<LogId> {
        self.lock().last_applied
    }
}

impl RaftSnapshotBuilder<KilnRaft> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<KilnRaft>, StorageError> {
        let inner = self.lock();
        let meta = SnapshotMeta {
            last_log_id: inner.last_applied,
            last_membership: inner.membership.clone(),
            snapshot_id: format!("{:?}", inner.last_applied),
        };
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(Vec::new())),
        })
    }
}

impl RaftStateMachine<KilnRaft> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, EmptyNode>), StorageError> {
        let inner = self.lock();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut out = Vec::new();
        let hw = {
            let mut inner = self.lock();
            for entry in entries {
                let index = entry.log_id.index;
                let term = entry.log_id.leader_id.term;
                let count = match &entry.payload {
                    EntryPayload::Normal(Batches(bytes)) => record_count(bytes).map_err(|e| {
                        StorageIOError::read_log_entry(entry.log_id, AnyError::new(&e))
                    })?,
                    EntryPayload::Membership(m) => {
                        inner.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                        0
                    }
                    EntryPayload::Blank => 0,
                };
                let base = inner.next_offset;
                let applied = base..base + i64::from(count);
                // Pair assertion: the translation made when the entry was written must agree
                // with the offsets applying it in order gives.
                if count > 0 {
                    let log = self.log.lock().translator().offsets_of(index);
                    if log.as_ref() != Some(&applied) {
                        let e = OffsetMismatch {
                            index,
                            log,
                            applied,
                        };
                        return Err(StorageIOError::apply(entry.log_id, AnyError::new(&e)).into());
                    }
                }
                inner.next_offset = applied.end;
                inner.last_applied = Some(entry.log_id);
                out.push(Applied {
                    base_offset: base,
                    record_count: count,
                    leader_epoch: term,
                });
            }
            inner.next_offset
        };
        self.high_watermark.send_replace(hw);
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        _meta: &SnapshotMeta<NodeId, EmptyNode>,
        _snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        Err(StorageIOError::write_snapshot(None, AnyError::new(&NoSnapshots)).into())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<KilnRaft>>, StorageError> {
        Ok(None)
    }
}
