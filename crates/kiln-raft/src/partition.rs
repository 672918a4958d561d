//! [`ReplicatedPartition`]: one replica of a partition replicated by Raft.

use std::collections::BTreeSet;
use std::io;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{Config, EntryPayload, RaftNetworkFactory, ServerState, SnapshotPolicy};

use crate::disk::Disk;
use crate::log_store::{LogRecovery, LogStore};
use crate::state_machine::StateMachine;
use crate::types::{Batches, KilnRaft, NodeId, Raft};

/// Kafka's partitionLeaderEpoch field of a RecordBatch v2 header.
const PARTITION_LEADER_EPOCH: std::ops::Range<usize> = 12..16;

/// An acknowledged append: committed on a majority, each of which had it fsynced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendAck {
    pub base_offset: i64,
    pub last_offset: i64,
    /// The Raft term it was written in: the Kafka leader epoch.
    pub leader_epoch: u64,
}

/// One batch as read: bytes as stored, with the base offset and leader epoch stamped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadBatch {
    pub base_offset: i64,
    pub leader_epoch: u64,
    pub bytes: Bytes,
}

#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    /// The batches failed kiln-log's validation (nothing was written).
    #[error("invalid batch: {0}")]
    InvalidBatch(#[from] kiln_log::LogError),
    /// This replica is not the leader (Kafka: NOT_LEADER_OR_FOLLOWER); `leader` if known.
    #[error("not the leader; the leader is {leader:?}")]
    NotLeader { leader: Option<NodeId> },
    /// The Raft node stopped (shutdown or a storage failure).
    #[error("replication stopped: {0}")]
    Stopped(String),
    #[error("storage: {0}")]
    Storage(#[from] io::Error),
    #[error("offset {offset} is out of range (high watermark {high_watermark})")]
    OffsetOutOfRange { offset: i64, high_watermark: i64 },
}

impl PartitionError {
    /// The same error for another waiter (the I/O and log errors inside are not `Clone`).
    pub fn duplicate(&self) -> PartitionError {
        match self {
            PartitionError::NotLeader { leader } => PartitionError::NotLeader { leader: *leader },
            PartitionError::OffsetOutOfRange {
                offset,
                high_watermark,
            } => PartitionError::OffsetOutOfRange {
                offset: *offset,
                high_watermark: *high_watermark,
            },
            other => PartitionError::Stopped(other.to_string()),
        }
    }
}

/// The Raft settings Kiln uses for a partition. Snapshots are never built (the log is the
/// partition, so there is nothing to compact into one).
pub fn raft_config(heartbeat_ms: u64, election_min_ms: u64, election_max_ms: u64) -> Config {
    Config {
        cluster_name: "kiln-partition".to_string(),
        heartbeat_interval: heartbeat_ms,
        election_timeout_min: election_min_ms,
        election_timeout_max: election_max_ms,
        snapshot_policy: SnapshotPolicy::Never,
        max_payload_entries: 64,
        ..Config::default()
    }
}

/// One replica of a partition: a Raft node whose log holds the partition's record batches.
#[derive(Clone)]
pub struct ReplicatedPartition {
    id: NodeId,
    raft: Raft,
    log: LogStore,
    state: StateMachine,
}

impl ReplicatedPartition {
    /// Recovers the log from `log_disk` and `vote_disk` and starts the Raft node.
    pub async fn start<N>(
        id: NodeId,
        config: Config,
        log_disk: Arc<dyn Disk>,
        vote_disk: Arc<dyn Disk>,
        network: N,
    ) -> Result<(ReplicatedPartition, LogRecovery), PartitionError>
    where
        N: RaftNetworkFactory<KilnRaft>,
    {
        let config = config
            .validate()
            .map_err(|e| PartitionError::Stopped(e.to_string()))?;
        let (log, recovery) = LogStore::open(log_disk, vote_disk).await?;
        let state = StateMachine::new(log.clone());
        let raft = Raft::new(id, Arc::new(config), network, log.clone(), state.clone())
            .await
            .map_err(|e| PartitionError::Stopped(e.to_string()))?;
        Ok((
            ReplicatedPartition {
                id,
                raft,
                log,
                state,
            },
            recovery,
        ))
    }

    /// Makes `members` the voters of a brand-new group. Call on one replica, once.
    pub async fn initialize(&self, members: BTreeSet<NodeId>) -> Result<(), PartitionError> {
        match self.raft.initialize(members).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(PartitionError::Stopped(e.to_string())),
        }
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// Appends one or more concatenated RecordBatch v2 (as a producer sends them) through Raft.
    /// Validated first (kiln-log's checks: lengths, magic, CRC32C); returns once the entry is
    /// committed, that is fsynced on a majority, with the offsets it took.
    pub async fn append(&self, batches: Bytes) -> Result<AppendAck, PartitionError> {
        kiln_log::batch::validate_batches(&batches)?;
        match self.raft.client_write(Batches(batches)).await {
            Ok(resp) => {
                let applied = resp.data;
                Ok(AppendAck {
                    base_offset: applied.base_offset,
                    last_offset: applied.base_offset + i64::from(applied.record_count) - 1,
                    leader_epoch: applied.leader_epoch,
                })
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(PartitionError::NotLeader {
                    leader: f.leader_id,
                })
            }
            Err(e) => Err(PartitionError::Stopped(e.to_string())),
        }
    }

    /// Offset below which records are committed: consumers never read at or past it.
    pub fn high_watermark(&self) -> i64 {
        self.state.high_watermark()
    }

    pub fn subscribe_high_watermark(&self) -> tokio::sync::watch::Receiver<i64> {
        self.state.subscribe_high_watermark()
    }

    /// The offset the next record will take here (uncommitted entries included).
    pub fn log_end_offset(&self) -> i64 {
        self.log.log_end_offset()
    }

    /// The Kafka leader epoch if this replica is the leader now: its Raft term.
    pub fn leader_epoch(&self) -> Option<u64> {
        let m = self.raft.metrics();
        let m = m.borrow();
        (m.state == ServerState::Leader).then_some(m.current_term)
    }

    /// The leader this replica knows of (itself included) and the current term.
    pub fn leader_and_term(&self) -> (Option<NodeId>, u64) {
        let m = self.raft.metrics();
        let m = m.borrow();
        (m.current_leader, m.current_term)
    }

    /// Whole batches from the one holding `offset`, up to `max_bytes` (at least one batch when
    /// one exists), never at or past the high watermark.
    pub fn read(&self, offset: i64, max_bytes: usize) -> Result<Vec<ReadBatch>, PartitionError> {
        let high_watermark = self.high_watermark();
        if offset < 0 || offset > high_watermark {
            return Err(PartitionError::OffsetOutOfRange {
                offset,
                high_watermark,
            });
        }
        let inner = self.log.lock();
        let mut out = Vec::new();
        let mut bytes_out = 0usize;
        for row in inner.translator().data_entries_from_offset(offset) {
            if row.base_offset >= high_watermark {
                break;
            }
            let Some(entry) = inner.entry(row.raft_index) else {
                break;
            };
            let EntryPayload::Normal(Batches(buf)) = &entry.payload else {
                break;
            };
            let epoch = entry.log_id.leader_id.term;
            let mut base = row.base_offset;
            for batch in kiln_log::batch::batches(buf) {
                let batch = batch?;
                let next = base + i64::from(batch.header.record_count);
                if next > offset && base < high_watermark {
                    if !out.is_empty() && bytes_out + batch.bytes.len() > max_bytes {
                        return Ok(out);
                    }
                    let mut stamped = BytesMut::from(batch.bytes);
                    kiln_log::batch::set_base_offset(&mut stamped, base);
                    if let Some(field) = stamped.get_mut(PARTITION_LEADER_EPOCH) {
                        field.copy_from_slice(&(epoch as i32).to_be_bytes());
                    }
                    bytes_out += stamped.len();
                    out.push(ReadBatch {
                        base_offset: base,
                        leader_epoch: epoch,
                        bytes: stamped.freeze(),
                    });
                }
                base = next;
            }
        }
        Ok(out)
    }

    /// Stops the Raft node (the log stays on disk).
    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
    }
}
