//! [`Proposer`]: the ordered, coalescing front door of a replicated partition's leader.
//!
//! Producers pipeline requests, and a partition's order is the order in which its appends
//! reach Raft. `ReplicatedPartition::append` proposes when its future is first polled, so two
//! appends awaited on different tasks may reach Raft in either order. The proposer fixes the
//! order at [`Proposer::submit`] (a synchronous call, made while the broker dispatches requests
//! in arrival order) and proposes from one task, in that order.
//!
//! It also coalesces: appends that queue up while earlier entries are being replicated are
//! joined into one Raft entry (up to `max_entry_bytes`), so one round of AppendEntries and one
//! fsync per replica covers many producer requests. Each append still gets its own offsets:
//! the entry's base offset plus the records of the appends before it in the entry.

use bytes::{Bytes, BytesMut};
use openraft::error::ClientWriteError;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::partition::{AppendAck, PartitionError, ReplicatedPartition};
use crate::record::record_count;
use crate::types::Batches;

/// Entries proposed and not yet committed, per partition. Two keep the leader's log busy
/// (one being fsynced and replicated, the next one waiting) while the rest queue up here.
const ENTRIES_IN_FLIGHT: usize = 4;

/// What a submitted append resolves to.
pub type AppendReceiver = oneshot::Receiver<Result<AppendAck, PartitionError>>;

struct Proposal {
    batches: Bytes,
    records: u32,
    reply: oneshot::Sender<Result<AppendAck, PartitionError>>,
}

/// Cheap to clone; the proposing task ends when every clone is dropped.
#[derive(Clone)]
pub struct Proposer {
    queue: mpsc::UnboundedSender<Proposal>,
}

impl Proposer {
    /// Starts the proposing task for `partition` (on the current tokio runtime).
    pub fn start(partition: ReplicatedPartition, max_entry_bytes: usize) -> Proposer {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(partition, rx, max_entry_bytes.max(1)));
        Proposer { queue }
    }

    /// Queues `batches` (validated here: lengths, magic, CRC32C) behind every earlier submit.
    /// The receiver resolves once the append is committed (fsynced on a majority) or refused.
    pub fn submit(&self, batches: Bytes) -> AppendReceiver {
        let (reply, rx) = oneshot::channel();
        let records = kiln_log::batch::validate_batches(&batches)
            .map_err(PartitionError::from)
            .and_then(|_| record_count(&batches).map_err(PartitionError::from));
        match records {
            Err(e) => {
                let _ = reply.send(Err(e));
            }
            Ok(records) => {
                let proposal = Proposal {
                    batches,
                    records,
                    reply,
                };
                if let Err(mpsc::error::SendError(p)) = self.queue.send(proposal) {
                    let _ = p.reply.send(Err(PartitionError::Stopped(
                        "the partition's proposer has stopped".into(),
                    )));
                }
            }
        }
        rx
    }
}

async fn run(
    partition: ReplicatedPartition,
    mut rx: mpsc::UnboundedReceiver<Proposal>,
    max_entry_bytes: usize,
) {
    let slots = Arc::new(Semaphore::new(ENTRIES_IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        // openraft 0.9 appends and fsyncs one client write at a time. Proposing every request
        // at once would give each its own entry and its own fsync; waiting for a free slot
        // lets the requests that arrive meanwhile join the next entry (group commit).
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let mut size = first.batches.len();
        let mut group = vec![first];
        // Join what is already queued, in order, up to the entry size bound.
        while size < max_entry_bytes {
            match rx.try_recv() {
                Ok(next) => {
                    size += next.batches.len();
                    group.push(next);
                }
                Err(_) => break,
            }
        }
        let payload = if group.len() == 1 {
            group[0].batches.clone()
        } else {
            let mut joined = BytesMut::with_capacity(size);
            for p in &group {
                joined.extend_from_slice(&p.batches);
            }
            joined.freeze()
        };
        // `client_write_ff` hands the entry to Raft before it returns, so entries enter the
        // log in the order of this loop; only the wait for the commit runs concurrently.
        match partition.raft().client_write_ff(Batches(payload)).await {
            Err(fatal) => {
                drop(slot);
                let reason = fatal.to_string();
                for p in group {
                    let _ = p.reply.send(Err(PartitionError::Stopped(reason.clone())));
                }
            }
            Ok(committed) => {
                tokio::spawn(async move {
                    let outcome = committed.await;
                    drop(slot);
                    let outcome = match outcome {
                        Ok(Ok(resp)) => Ok(resp.data),
                        Ok(Err(ClientWriteError::ForwardToLeader(f))) => {
                            Err(PartitionError::NotLeader {
                                leader: f.leader_id,
                            })
                        }
                        Ok(Err(e)) => Err(PartitionError::Stopped(e.to_string())),
                        // Raft dropped the request: this replica stopped leading before the
                        // entry's fate was known. It may still commit under the next leader.
                        Err(_) => Err(PartitionError::NotLeader { leader: None }),
                    };
                    let mut base = match &outcome {
                        Ok(applied) => applied.base_offset,
                        Err(_) => 0,
                    };
                    for p in group {
                        let answer = match &outcome {
                            Ok(applied) => {
                                let ack = AppendAck {
                                    base_offset: base,
                                    last_offset: base + i64::from(p.records) - 1,
                                    leader_epoch: applied.leader_epoch,
                                };
                                base += i64::from(p.records);
                                Ok(ack)
                            }
                            Err(e) => Err(e.duplicate()),
                        };
                        let _ = p.reply.send(answer);
                    }
                });
            }
        }
    }
}
