//! DescribeLogDirs: the replicas this broker holds in its one log directory
//! (`data_dir/replicas`), with their sizes. Kafka tools read it to follow replica moves
//! (`kiln cluster status` prints each new replica's bytes against its leader's). The internal
//! logs are named as topics `__cluster_metadata` and `__consumer_offsets`, partition 0.

use std::sync::Arc;

use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{DescribeLogDirsRequest, DescribeLogDirsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::cluster::moves::{METADATA_TOPIC, OFFSETS_TOPIC};
use crate::cluster::{Cluster, Replica};

/// Partitions one request may name.
pub const PARTITIONS_PER_REQUEST_MAX: usize = 100_000;

fn partition(index: i32, replica: &Replica) -> DescribeLogDirsPartition {
    let size = i64::try_from(replica.partition.size_bytes()).unwrap_or(i64::MAX);
    // How far this replica's log end is behind the partition's high watermark as it knows it.
    let lag = (replica.partition.high_watermark() - replica.partition.log_end_offset()).max(0);
    DescribeLogDirsPartition::default()
        .with_partition_index(index)
        .with_partition_size(size)
        .with_offset_lag(lag)
}

pub fn describe(
    cluster: &Arc<Cluster>,
    log_dir: &str,
    request: DescribeLogDirsRequest,
) -> DescribeLogDirsResponse {
    let wanted = |topic: &str, index: i32| match &request.topics {
        None => true,
        Some(topics) => topics
            .iter()
            .any(|t| t.topic.as_str() == topic && t.partitions.contains(&index)),
    };
    let asked: usize = request
        .topics
        .iter()
        .flatten()
        .map(|t| t.partitions.len())
        .sum();
    let mut result = DescribeLogDirsResult::default()
        .with_log_dir(StrBytes::from_string(log_dir.to_string()))
        .with_total_bytes(-1)
        .with_usable_bytes(-1);
    if asked > PARTITIONS_PER_REQUEST_MAX {
        return DescribeLogDirsResponse::default()
            .with_error_code(kafka_protocol::ResponseError::InvalidRequest.code());
    }
    let mut push = |name: &str, partitions: Vec<DescribeLogDirsPartition>| {
        if !partitions.is_empty() {
            result.topics.push(
                DescribeLogDirsTopic::default()
                    .with_name(StrBytes::from_string(name.to_string()).into())
                    .with_partitions(partitions),
            );
        }
    };
    for (name, replica) in [
        (METADATA_TOPIC, &cluster.metadata),
        (OFFSETS_TOPIC, &cluster.offsets),
    ] {
        if wanted(name, 0) {
            push(name, vec![partition(0, replica)]);
        }
    }
    for topic in cluster.topics() {
        let partitions = (0..topic.partition_count())
            .filter(|&i| wanted(&topic.name, i))
            .filter_map(|i| cluster.partition(&topic, i).map(|r| partition(i, &r)))
            .collect();
        push(&topic.name, partitions);
    }
    DescribeLogDirsResponse::default().with_results(vec![result])
}
