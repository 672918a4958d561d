//! Produce: the partition's leader submits the batches to its proposer in arrival order; the
//! answer waits until a majority of replicas has them fsynced (acks=1 and acks=all alike: an
//! answer never promises less than a majority; on a broker without peers the majority is its
//! own fsync).

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, ResponseKind};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use kiln_log::batch;
use kiln_raft::proposer::AppendReceiver;

use crate::cluster::{Cluster, ClusterTopic};
use crate::errors::partition_error_code;
use crate::handlers::Reply;
use crate::traffic::TopicTraffic;

/// Shortest replication wait granted, whatever timeout the client sent.
const ACK_TIMEOUT_MIN: Duration = Duration::from_secs(1);

struct Waiting {
    topic: usize,
    partition: usize,
    receiver: AppendReceiver,
    /// For its traffic counters once the outcome is known.
    counted: Arc<ClusterTopic>,
}

pub fn handle(cluster: &Arc<Cluster>, request: ProduceRequest) -> Reply {
    let mut waiting = Vec::new();
    let mut responses = Vec::with_capacity(request.topic_data.len());
    for (topic_slot, topic_data) in request.topic_data.into_iter().enumerate() {
        let topic = cluster.topic(topic_data.name.as_str());
        if let Some(t) = &topic {
            TopicTraffic::add(&t.traffic.produce_requests, 1);
        }
        let mut partitions = Vec::with_capacity(topic_data.partition_data.len());
        for (partition_slot, data) in topic_data.partition_data.into_iter().enumerate() {
            let response = PartitionProduceResponse::default()
                .with_index(data.index)
                .with_base_offset(-1)
                .with_log_append_time_ms(-1)
                .with_log_start_offset(-1);
            let Some(topic) = topic
                .as_ref()
                .filter(|t| data.index >= 0 && data.index < t.partition_count())
            else {
                partitions
                    .push(response.with_error_code(ResponseError::UnknownTopicOrPartition.code()));
                if let Some(t) = &topic {
                    TopicTraffic::add(&t.traffic.produce_errors, 1);
                }
                continue;
            };
            let local = cluster.partition(topic, data.index);
            // The replica's disk is full: its Raft core is stuck retrying a write, so nothing
            // would be acknowledged; say why at once instead of timing out. Said whether or not
            // it still leads: a leader stuck so loses its lease (kiln-raft `liveness.rs`), and
            // the client is better told why than only that another should lead.
            let full = local.as_ref().is_some_and(|r| r.partition.disk_full());
            let Some(replica) = local.filter(|r| full || r.is_leader()) else {
                partitions
                    .push(response.with_error_code(ResponseError::NotLeaderOrFollower.code()));
                TopicTraffic::add(&topic.traffic.produce_errors, 1);
                continue;
            };
            let refusal = if full {
                Some((
                    ResponseError::KafkaStorageError,
                    format!("disk full on broker {}: writes to this partition resume when space is freed", cluster.node_id),
                ))
            } else {
                match &data.records {
                    None => Some((ResponseError::InvalidRecord, "no records".to_string())),
                    Some(records) => oversized(records, topic.settings.max_batch_bytes)
                        .map(|m| (ResponseError::MessageTooLarge, m)),
                }
            };
            let records = match (refusal, data.records) {
                (None, Some(records)) => records,
                (refusal, _) => {
                    let (code, message) =
                        refusal.unwrap_or((ResponseError::InvalidRecord, "no records".into()));
                    tracing::debug!(topic = %topic.name, partition = data.index, %message, "produce refused");
                    TopicTraffic::add(&topic.traffic.produce_errors, 1);
                    partitions.push(error(response, code, message));
                    continue;
                }
            };
            TopicTraffic::add(&topic.traffic.produce_bytes, records.len() as u64);
            waiting.push(Waiting {
                topic: topic_slot,
                partition: partition_slot,
                receiver: replica
                    .proposer()
                    .submit_produce(records, request.acks != 0),
                counted: topic.clone(),
            });
            partitions.push(response.with_log_start_offset(replica.partition.log_start_offset()));
        }
        responses.push(
            TopicProduceResponse::default()
                .with_name(topic_data.name)
                .with_partition_responses(partitions),
        );
    }
    if request.acks == 0 {
        return Reply::Silent;
    }
    let response = ProduceResponse::default().with_responses(responses);
    if waiting.is_empty() {
        return Reply::Now(Box::new(ResponseKind::Produce(response)));
    }
    let timeout =
        Duration::from_millis(u64::try_from(request.timeout_ms).unwrap_or(0)).max(ACK_TIMEOUT_MIN);
    Reply::Later(Box::pin(wait_committed(response, waiting, timeout)))
}

async fn wait_committed(
    mut response: ProduceResponse,
    waiting: Vec<Waiting>,
    timeout: Duration,
) -> ResponseKind {
    let deadline = tokio::time::Instant::now() + timeout;
    for w in waiting {
        let outcome = match tokio::time::timeout_at(deadline, w.receiver).await {
            Ok(Ok(Ok(ack))) => Ok(ack),
            Ok(Ok(Err(e))) => Err((partition_error_code(&e), e.to_string())),
            Ok(Err(_)) => Err((
                ResponseError::NotLeaderOrFollower,
                "the partition's replica stopped".to_string(),
            )),
            // Not known to be committed: the client retries, which may write it twice.
            Err(_) => Err((
                ResponseError::RequestTimedOut,
                format!(
                    "not replicated to a majority within {} ms",
                    timeout.as_millis()
                ),
            )),
        };
        let Some(topic) = response.responses.get_mut(w.topic) else {
            continue;
        };
        let counted = &w.counted.traffic;
        let Some(p) = topic.partition_responses.get_mut(w.partition) else {
            continue;
        };
        match outcome {
            Ok(ack) => {
                p.base_offset = ack.base_offset;
                TopicTraffic::add(
                    &counted.produce_records,
                    u64::try_from(ack.last_offset - ack.base_offset + 1).unwrap_or(0),
                );
            }
            Err((code, message)) => {
                // A sequence or epoch refusal makes the client reset its producer state (a
                // new epoch, KIP-360): rare, and worth seeing when records are duplicated.
                if matches!(
                    code,
                    ResponseError::OutOfOrderSequenceNumber
                        | ResponseError::InvalidProducerEpoch
                        | ResponseError::UnknownProducerId
                ) {
                    tracing::info!(topic = %topic.name.0.as_str(), partition = p.index, error = %message, "idempotent produce refused");
                } else {
                    tracing::debug!(partition = p.index, error = %message, "produce not acknowledged");
                }
                TopicTraffic::add(&counted.produce_errors, 1);
                *p = error(p.clone().with_base_offset(-1), code, message);
            }
        }
    }
    ResponseKind::Produce(response)
}

/// The refusal for a request holding a batch over `max_batch_bytes` (max.message.bytes).
pub(crate) fn oversized(records: &[u8], max_batch_bytes: usize) -> Option<String> {
    batch::batches(records)
        .filter_map(Result::ok)
        .map(|b| b.bytes.len())
        .find(|&len| len > max_batch_bytes)
        .map(|too_big| {
            format!("record batch of {too_big} bytes exceeds max.message.bytes {max_batch_bytes}")
        })
}

pub(crate) fn error(
    response: PartitionProduceResponse,
    code: ResponseError,
    message: String,
) -> PartitionProduceResponse {
    response
        .with_error_code(code.code())
        .with_error_message(Some(StrBytes::from_string(message)))
}
