//! CreatePartitions (controller only, through the metadata log) and DeleteRecords (each
//! partition's leader, through its Raft group: every replica moves its log start at the same
//! entry, and ListOffsets EARLIEST and Fetch's log_start_offset report it).

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, DeleteRecordsRequest, DeleteRecordsResponse,
    ResponseKind,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::cluster::Cluster;
use crate::errors::{cluster_error_code, partition_error_code};
use crate::handlers::Reply;

/// Topics one CreatePartitions request may name, and partitions one DeleteRecords request may.
pub const TOPICS_PER_REQUEST_MAX: usize = 100;
pub const DELETE_RECORDS_PARTITIONS_MAX: usize = 10_000;
/// Longest a DeleteRecords partition waits for its new start to commit, whatever the client's
/// timeout says.
const DELETE_RECORDS_WAIT_MAX: Duration = Duration::from_secs(30);
/// DeleteRecords' offset -1: up to the high watermark.
const HIGH_WATERMARK: i64 = -1;

pub fn create_partitions(cluster: &Arc<Cluster>, request: CreatePartitionsRequest) -> Reply {
    let cluster = cluster.clone();
    Reply::Later(Box::pin(async move {
        let over = request.topics.len() > TOPICS_PER_REQUEST_MAX;
        let mut results = Vec::with_capacity(request.topics.len());
        for t in request.topics {
            let outcome = if over {
                Err((
                    ResponseError::InvalidRequest,
                    format!("at most {TOPICS_PER_REQUEST_MAX} topics per request"),
                ))
            } else if t.assignments.is_some() {
                Err((
                    ResponseError::InvalidRequest,
                    "manual replica assignments are not supported; Kiln assigns new partitions"
                        .to_string(),
                ))
            } else {
                cluster
                    .create_partitions(t.name.as_str(), t.count, request.validate_only)
                    .await
                    .map_err(|e| (cluster_error_code(&e), e.to_string()))
            };
            let result = CreatePartitionsTopicResult::default().with_name(t.name.clone());
            results.push(match outcome {
                Ok(()) => result,
                Err((code, message)) => {
                    tracing::info!(topic = %t.name.as_str(), %message, "create partitions refused");
                    result
                        .with_error_code(code.code())
                        .with_error_message(Some(StrBytes::from_string(message)))
                }
            });
        }
        ResponseKind::CreatePartitions(CreatePartitionsResponse::default().with_results(results))
    }))
}

pub fn delete_records(cluster: &Arc<Cluster>, request: DeleteRecordsRequest) -> Reply {
    let cluster = cluster.clone();
    let wait = Duration::from_millis(u64::try_from(request.timeout_ms).unwrap_or(0))
        .clamp(Duration::from_millis(1), DELETE_RECORDS_WAIT_MAX);
    let count: usize = request.topics.iter().map(|t| t.partitions.len()).sum();
    let over = count > DELETE_RECORDS_PARTITIONS_MAX;
    Reply::Later(Box::pin(async move {
        let mut topics = Vec::with_capacity(request.topics.len());
        for t in request.topics {
            let mut partitions = Vec::with_capacity(t.partitions.len());
            for p in t.partitions {
                let (low_watermark, code) = if over {
                    (-1, ResponseError::InvalidRequest.code())
                } else {
                    match delete_one(&cluster, t.name.as_str(), p.partition_index, p.offset, wait)
                        .await
                    {
                        Ok(low) => (low, 0),
                        Err(code) => (-1, code.code()),
                    }
                };
                partitions.push(
                    DeleteRecordsPartitionResult::default()
                        .with_partition_index(p.partition_index)
                        .with_low_watermark(low_watermark)
                        .with_error_code(code),
                );
            }
            topics.push(
                DeleteRecordsTopicResult::default()
                    .with_name(t.name)
                    .with_partitions(partitions),
            );
        }
        ResponseKind::DeleteRecords(DeleteRecordsResponse::default().with_topics(topics))
    }))
}

/// Moves one partition's log start to `offset` (-1: the high watermark); the new low watermark.
async fn delete_one(
    cluster: &Cluster,
    topic: &str,
    index: i32,
    offset: i64,
    wait: Duration,
) -> Result<i64, ResponseError> {
    let topic = cluster
        .topic(topic)
        .filter(|t| index >= 0 && index < t.partition_count())
        .ok_or(ResponseError::UnknownTopicOrPartition)?;
    let replica = cluster
        .partition(&topic, index)
        .filter(|r| r.is_leader())
        .ok_or(ResponseError::NotLeaderOrFollower)?;
    let high_watermark = replica.partition.high_watermark();
    let offset = if offset == HIGH_WATERMARK {
        high_watermark
    } else {
        offset
    };
    if offset < 0 || offset > high_watermark {
        tracing::info!(topic = %topic.name, partition = index, offset, high_watermark, "delete records past the high watermark refused");
        return Err(ResponseError::OffsetOutOfRange);
    }
    match tokio::time::timeout(wait, replica.partition.delete_records(offset)).await {
        Ok(Ok(low_watermark)) => {
            tracing::info!(topic = %topic.name, partition = index, low_watermark, "records deleted");
            Ok(low_watermark)
        }
        Ok(Err(e)) => {
            tracing::warn!(topic = %topic.name, partition = index, error = %e, "delete records not committed");
            Err(partition_error_code(&e))
        }
        Err(_) => Err(ResponseError::RequestTimedOut),
    }
}
