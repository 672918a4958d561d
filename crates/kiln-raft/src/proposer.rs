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

use crate::partition::{AppendAck, PartitionError};
use crate::payload::{Command, Payload};
use crate::types::Raft;

/// Entries proposed and not yet committed, per partition. Two keep the leader's log busy
/// (one being fsynced and replicated, the next one waiting) while the rest queue up here.
const ENTRIES_IN_FLIGHT: usize = 4;

/// What a submitted append resolves to.
pub type AppendReceiver = oneshot::Receiver<Result<AppendAck, PartitionError>>;

struct Proposal {
    /// Records to join with their neighbours, or a command that goes alone.
    what: What,
    reply: oneshot::Sender<Result<AppendAck, PartitionError>>,
}

enum What {
    Records { batches: Bytes, records: u32 },
    Command(Command),
}

impl Proposal {
    fn len(&self) -> usize {
        match &self.what {
            What::Records { batches, .. } => batches.len(),
            What::Command(_) => 0,
        }
    }

    fn records(&self) -> u32 {
        match &self.what {
            What::Records { records, .. } => *records,
            What::Command(_) => 0,
        }
    }
}

/// Cheap to clone; the proposing task ends when every clone is dropped.
#[derive(Clone)]
pub struct Proposer {
    /// Unbounded here because `submit` must not wait (it runs while requests are dispatched in
    /// order); the bound is the caller's: the broker has at most `max_connections` ×
    /// `max_in_flight_per_connection` requests in flight, each at most `max_batch_bytes`.
    queue: mpsc::UnboundedSender<Proposal>,
}

impl Proposer {
    /// Starts the proposing task for the Raft node `raft` (on the current tokio runtime). The
    /// task holds only the Raft handle, so a partition can own its proposer.
    pub fn start(raft: Raft, max_entry_bytes: usize) -> Proposer {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(raft, rx, max_entry_bytes.max(1)));
        Proposer { queue }
    }

    /// Queues `batches` (validated here: lengths, magic, CRC32C) behind every earlier submit.
    /// The receiver resolves once the append is committed (fsynced on a majority) or refused.
    pub fn submit(&self, batches: Bytes) -> AppendReceiver {
        let (reply, rx) = oneshot::channel();
        let records = kiln_log::batch::validate_batches(&batches)
            .map_err(PartitionError::from)
            .and_then(|_| kiln_log::batch::count_records(&batches).map_err(PartitionError::from));
        match records {
            Err(e) => {
                let _ = reply.send(Err(e));
            }
            Ok(records) => self.enqueue(Proposal {
                what: What::Records { batches, records },
                reply,
            }),
        }
        rx
    }

    /// Queues a command behind every earlier submit (it is never joined with records).
    pub fn submit_command(&self, command: Command) -> AppendReceiver {
        let (reply, rx) = oneshot::channel();
        self.enqueue(Proposal {
            what: What::Command(command),
            reply,
        });
        rx
    }

    fn enqueue(&self, proposal: Proposal) {
        if let Err(mpsc::error::SendError(p)) = self.queue.send(proposal) {
            let _ = p.reply.send(Err(PartitionError::Stopped(
                "the partition's proposer has stopped".into(),
            )));
        }
    }
}

async fn run(raft: Raft, mut rx: mpsc::UnboundedReceiver<Proposal>, max_entry_bytes: usize) {
    let slots = Arc::new(Semaphore::new(ENTRIES_IN_FLIGHT));
    let mut held: Option<Proposal> = None;
    loop {
        let first = match held.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        // openraft 0.9 appends and fsyncs one client write at a time. Proposing every request
        // at once would give each its own entry and its own fsync; waiting for a free slot
        // lets the requests that arrive meanwhile join the next entry (group commit).
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let mut size = first.len();
        let is_command = matches!(first.what, What::Command(_));
        let mut group = vec![first];
        // Join what is already queued, in order, up to the entry size bound; a command goes
        // in an entry of its own.
        while size < max_entry_bytes && !is_command {
            match rx.try_recv() {
                Ok(next) if matches!(next.what, What::Command(_)) => {
                    held = Some(next);
                    break;
                }
                Ok(next) => {
                    size += next.len();
                    group.push(next);
                }
                Err(_) => break,
            }
        }
        let payload = match &group[0].what {
            What::Command(c) => Payload::Command(*c),
            What::Records { batches, .. } if group.len() == 1 => {
                Payload::records(batches.clone(), group[0].records())
            }
            What::Records { .. } => {
                let mut joined = BytesMut::with_capacity(size);
                let mut records = 0u32;
                for p in &group {
                    if let What::Records {
                        batches,
                        records: n,
                    } = &p.what
                    {
                        joined.extend_from_slice(batches);
                        records = records.saturating_add(*n);
                    }
                }
                Payload::records(joined.freeze(), records)
            }
        };
        // `client_write_ff` hands the entry to Raft before it returns, so entries enter the
        // log in the order of this loop; only the wait for the commit runs concurrently.
        match raft.client_write_ff(payload).await {
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
                                    last_offset: base + i64::from(p.records()) - 1,
                                    leader_epoch: applied.leader_epoch,
                                };
                                base += i64::from(p.records());
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
