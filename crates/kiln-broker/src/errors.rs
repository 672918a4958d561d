//! Storage, replication and cluster errors as Kafka error codes: the one mapping the broker
//! uses.

use kafka_protocol::ResponseError;
use kiln_log::LogError;
use kiln_raft::PartitionError;

use crate::cluster::ClusterError;

pub fn log_error_code(error: &LogError) -> ResponseError {
    match error {
        LogError::InvalidBatch { .. } | LogError::CrcMismatch { .. } => {
            ResponseError::CorruptMessage
        }
        LogError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        LogError::Corrupt { .. }
        | LogError::DiskFull { .. }
        | LogError::Io { .. }
        | LogError::Poisoned(_)
        | LogError::OutOfOrder(_) => ResponseError::KafkaStorageError,
    }
}

pub fn partition_error_code(error: &PartitionError) -> ResponseError {
    match error {
        // Also a replica that stopped leading mid-request: the client refreshes metadata and
        // retries at the new leader.
        PartitionError::NotLeader { .. } => ResponseError::NotLeaderOrFollower,
        // Nothing written; the client retries (the quorum is slow or stalled).
        PartitionError::QueueFull { .. } | PartitionError::EarlierBatchUnwritten { .. } => {
            ResponseError::NotEnoughReplicas
        }
        PartitionError::InvalidBatch(e) => log_error_code(e),
        PartitionError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        PartitionError::OutOfOrderSequence { .. } => ResponseError::OutOfOrderSequenceNumber,
        PartitionError::InvalidProducerEpoch { .. } => ResponseError::InvalidProducerEpoch,
        PartitionError::UnknownProducerId { .. } => ResponseError::UnknownProducerId,
        PartitionError::Stopped(_) | PartitionError::Storage(_) => ResponseError::KafkaStorageError,
    }
}

pub fn cluster_error_code(error: &ClusterError) -> ResponseError {
    match error {
        ClusterError::NotController(_) => ResponseError::NotController,
        ClusterError::AlreadyExists(_) => ResponseError::TopicAlreadyExists,
        ClusterError::NotFound(_) => ResponseError::UnknownTopicOrPartition,
        ClusterError::InvalidName(_) => ResponseError::InvalidTopicException,
        ClusterError::InvalidPartitions(_) => ResponseError::InvalidPartitions,
        ClusterError::InvalidReplicationFactor(_) => ResponseError::InvalidReplicationFactor,
        ClusterError::InvalidConfig(_) => ResponseError::InvalidConfig,
        ClusterError::InvalidRequest(_) => ResponseError::InvalidRequest,
        ClusterError::NotCommitted(_) => ResponseError::NotController,
        ClusterError::Timeout => ResponseError::RequestTimedOut,
        ClusterError::InvalidReplicaAssignment(_) => ResponseError::InvalidReplicaAssignment,
        ClusterError::MoveInProgress(_) => ResponseError::ReassignmentInProgress,
        ClusterError::NoMoveInProgress(_) => ResponseError::NoReassignmentInProgress,
        ClusterError::UnknownBroker(_) => ResponseError::BrokerIdNotRegistered,
    }
}
