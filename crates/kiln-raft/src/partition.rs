//! [`ReplicatedPartition`]: one replica of a partition replicated by Raft.

use std::collections::BTreeSet;
use std::io;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{Config, EntryPayload, RaftNetworkFactory, ServerState, SnapshotPolicy};

use crate::disk::Disk;
use crate::guard::{GuardedNetwork, ReplicaHealth};
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
    health: ReplicaHealth,
}

impl ReplicatedPartition {
    /// Recovers the log from `log_disk` and `vote_disk` and starts the Raft node. If recovery
    /// found damage, the replica starts repairing ([`ReplicatedPartition::repairing`]).
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
        Self::start_guarded(id, config, log_disk, vote_disk, network, true).await
    }

    /// [`ReplicatedPartition::start`], with the repair guard enforced or not. Only the
    /// simulation turns it off, to show what it prevents.
    #[doc(hidden)]
    pub async fn start_guarded<N>(
        id: NodeId,
        config: Config,
        log_disk: Arc<dyn Disk>,
        vote_disk: Arc<dyn Disk>,
        network: N,
        enforce_guard: bool,
    ) -> Result<(ReplicatedPartition, LogRecovery), PartitionError>
    where
        N: RaftNetworkFactory<KilnRaft>,
    {
        let mut config = config
            .validate()
            .map_err(|e| PartitionError::Stopped(e.to_string()))?;
        let (log, recovery) = LogStore::open(log_disk, vote_disk).await?;
        let health = log.health();
        health.set_enforced(enforce_guard);
        let guarded = enforce_guard && !health.guard().is_clear();
        let elect_wanted = config.enable_elect;
        let pause_max = std::time::Duration::from_millis(config.election_timeout_max);
        if guarded {
            // No election timer until the guard is met (openraft reads this at start).
            config.enable_elect = false;
        }
        let state = StateMachine::new(log.clone());
        let network = GuardedNetwork {
            inner: network,
            health: health.clone(),
        };
        let raft = Raft::new(id, Arc::new(config), network, log.clone(), state.clone())
            .await
            .map_err(|e| PartitionError::Stopped(e.to_string()))?;
        health.attach(raft.metrics());
        tokio::spawn(crate::elections::run(
            raft.clone(),
            log.clone(),
            guarded,
            elect_wanted,
            pause_max,
        ));
        Ok((
            ReplicatedPartition {
                id,
                raft,
                log,
                state,
                health,
            },
            recovery,
        ))
    }

    /// True while this replica repairs damaged files: it grants no votes and stands for no
    /// election until a leader has refilled its log past everything it held before the damage
    /// and it has applied that (and, after a lost vote record, followed a leader of a term at
    /// least as high as any it recorded). Its transport must refuse vote requests meanwhile:
    /// `net::serve` does when [`crate::net::RaftGroups::health`] answers for the group.
    pub fn repairing(&self) -> bool {
        self.health.repairing()
    }

    /// True while a write to this replica's files waits for disk space. A leader in this
    /// state cannot take appends (its Raft core waits for the write): refuse produce requests
    /// with a clear error rather than queue them.
    pub fn disk_full(&self) -> bool {
        self.health.disk_full()
    }

    /// The handle the transport asks about repair and a full disk (cheap to clone).
    pub fn health(&self) -> ReplicaHealth {
        self.health.clone()
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
