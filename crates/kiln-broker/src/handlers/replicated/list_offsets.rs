//! ListOffsets in cluster mode, answered by the leader: earliest is 0 (replicated partitions
//! are not aged out yet), latest is the high watermark, a timestamp finds the first batch whose
//! newest record is at or after it.

use std::sync::Arc;

use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
use kafka_protocol::ResponseError;
use kiln_log::BatchHeader;
use kiln_raft::ReplicatedPartition;

use crate::cluster::Cluster;

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
/// Bytes read per step of a timestamp scan.
const SCAN_BYTES: usize = 1 << 20;

pub fn handle(cluster: &Arc<Cluster>, request: ListOffsetsRequest) -> ListOffsetsResponse {
    let topics = request
        .topics
        .into_iter()
        .map(|wanted| {
            let topic = cluster.topic(wanted.name.as_str());
            let partitions = wanted
                .partitions
                .iter()
                .map(|p| {
                    let response = ListOffsetsPartitionResponse::default()
                        .with_partition_index(p.partition_index)
                        .with_timestamp(-1)
                        .with_offset(-1);
                    let Some(topic) = topic.as_ref().filter(|t| {
                        p.partition_index >= 0 && p.partition_index < t.partition_count()
                    }) else {
                        return response
                            .with_error_code(ResponseError::UnknownTopicOrPartition.code());
                    };
                    let Some(replica) = cluster
                        .partition(topic, p.partition_index)
                        .filter(|r| r.is_leader())
                    else {
                        return response.with_error_code(ResponseError::NotLeaderOrFollower.code());
                    };
                    match lookup(&replica.partition, p.timestamp) {
                        Some((offset, timestamp)) => {
                            response.with_offset(offset).with_timestamp(timestamp)
                        }
                        None => response,
                    }
                })
                .collect();
            ListOffsetsTopicResponse::default()
                .with_name(wanted.name)
                .with_partitions(partitions)
        })
        .collect();
    ListOffsetsResponse::default().with_topics(topics)
}

fn lookup(partition: &ReplicatedPartition, timestamp: i64) -> Option<(i64, i64)> {
    let high_watermark = partition.high_watermark();
    match timestamp {
        EARLIEST => Some((0, -1)),
        LATEST => Some((high_watermark, -1)),
        ts if ts >= 0 => {
            let mut offset = 0;
            while offset < high_watermark {
                let batches = partition.read(offset, SCAN_BYTES).ok()?;
                if batches.is_empty() {
                    return None;
                }
                for b in batches {
                    let header = BatchHeader::parse(&b.bytes).ok()?;
                    if header.max_timestamp >= ts {
                        return Some((b.base_offset, header.max_timestamp));
                    }
                    offset = b.base_offset + i64::from(header.record_count);
                }
            }
            None
        }
        _ => None,
    }
}
