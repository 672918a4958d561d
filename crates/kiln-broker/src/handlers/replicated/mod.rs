//! The cluster-mode side of the APIs whose answers depend on replication: topics live in the
//! metadata log (`crate::cluster`), partitions are Raft groups, only leaders accept produce and
//! serve fetch, and topic changes go to the controller.

pub mod admin;
pub mod fetch;
pub mod groups;
pub mod list_offsets;
pub mod metadata;
pub mod produce;

use kafka_protocol::ResponseError;
use kiln_raft::PartitionError;

use crate::cluster::ClusterError;

pub fn partition_error_code(error: &PartitionError) -> ResponseError {
    match error {
        // Also a replica that stopped leading mid-request: the client refreshes metadata and
        // retries at the new leader.
        PartitionError::NotLeader { .. } => ResponseError::NotLeaderOrFollower,
        PartitionError::InvalidBatch(e) => crate::errors::log_error_code(e),
        PartitionError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
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
        ClusterError::NotCommitted(_) => ResponseError::NotController,
        ClusterError::Timeout => ResponseError::RequestTimedOut,
    }
}
