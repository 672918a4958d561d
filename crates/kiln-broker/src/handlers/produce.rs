//! Produce: validate and append in arrival order, then wait for durability (acks != 0).

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, ResponseKind};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use kiln_log::{batch, PartitionLog};

use crate::errors::log_error_code;
use crate::handlers::Reply;
use crate::server::Broker;
use crate::time::now_ms;
use crate::traffic::TopicTraffic;

/// Shortest durability wait granted, whatever timeout the client sent.
const ACK_TIMEOUT_MIN: Duration = Duration::from_secs(1);

/// An appended batch whose response waits for its fsync.
struct Waiting {
    topic: usize,
    partition: usize,
    log: PartitionLog,
    next_offset: i64,
}

pub fn handle(broker: &Arc<Broker>, request: ProduceRequest) -> Reply {
    let now = now_ms();
    let mut waiting = Vec::new();
    let mut responses = Vec::with_capacity(request.topic_data.len());
    for (topic_slot, topic_data) in request.topic_data.into_iter().enumerate() {
        let topic = broker.catalog.get(topic_data.name.as_str());
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
            let Some(log) = topic.as_ref().and_then(|t| t.partition(data.index)) else {
                partitions
                    .push(response.with_error_code(ResponseError::UnknownTopicOrPartition.code()));
                continue;
            };
            let max_batch_bytes = topic.as_ref().map_or(broker.config.max_batch_bytes, |t| {
                t.settings.max_batch_bytes
            });
            let Some(records) = data.records else {
                partitions.push(error(
                    response,
                    ResponseError::InvalidRecord,
                    "no records".into(),
                ));
                continue;
            };
            if let Some(message) = oversized(&records, max_batch_bytes) {
                partitions.push(error(response, ResponseError::MessageTooLarge, message));
                continue;
            }
            match log.append(&records, now) {
                Ok(info) => {
                    if let Some(t) = &topic {
                        TopicTraffic::add(&t.traffic.produce_records, info.record_count);
                        TopicTraffic::add(&t.traffic.produce_bytes, records.len() as u64);
                    }
                    waiting.push(Waiting {
                        topic: topic_slot,
                        partition: partition_slot,
                        log: log.clone(),
                        next_offset: info.last_offset + 1,
                    });
                    partitions.push(
                        response
                            .with_base_offset(info.base_offset)
                            .with_log_start_offset(log.log_start_offset()),
                    );
                }
                Err(e) => {
                    tracing::warn!(topic = %topic_data.name.as_str(), partition = data.index, error = %e, "produce refused");
                    partitions.push(error(response, log_error_code(&e), e.to_string()));
                }
            }
        }
        if let Some(t) = &topic {
            let refused = partitions.iter().filter(|p| p.error_code != 0).count();
            TopicTraffic::add(&t.traffic.produce_errors, refused as u64);
        }
        responses.push(
            TopicProduceResponse::default()
                .with_name(topic_data.name)
                .with_partition_responses(partitions),
        );
    }

    if request.acks == 0 {
        // The batches are written; the flusher makes them durable without anyone waiting.
        return Reply::Silent;
    }
    let response = ProduceResponse::default().with_responses(responses);
    if waiting.is_empty() {
        return Reply::Now(Box::new(ResponseKind::Produce(response)));
    }
    let timeout =
        Duration::from_millis(u64::try_from(request.timeout_ms).unwrap_or(0)).max(ACK_TIMEOUT_MIN);
    Reply::Later(Box::pin(wait_durable(response, waiting, timeout)))
}

/// acks=1 and acks=all both wait for the fsync: on one node the leader is the whole quorum.
async fn wait_durable(
    mut response: ProduceResponse,
    waiting: Vec<Waiting>,
    timeout: Duration,
) -> ResponseKind {
    let deadline = tokio::time::Instant::now() + timeout;
    for w in waiting {
        let outcome = tokio::time::timeout_at(deadline, w.log.wait_durable(w.next_offset)).await;
        let failure = match outcome {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => (log_error_code(&e), e.to_string()),
            Err(_) => (
                ResponseError::RequestTimedOut,
                format!("not fsynced within {} ms", timeout.as_millis()),
            ),
        };
        if let Some(p) = response
            .responses
            .get_mut(w.topic)
            .and_then(|t| t.partition_responses.get_mut(w.partition))
        {
            tracing::warn!(partition = p.index, error = %failure.1, "produce not acknowledged");
            *p = error(p.clone().with_base_offset(-1), failure.0, failure.1);
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
