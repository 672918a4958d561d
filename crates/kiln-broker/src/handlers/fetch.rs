//! Fetch with long poll, served by the partition's leader: answer once `min_bytes` are
//! available or `max_wait_ms` has passed. Only committed data (below the high watermark, the Raft
//! commit point translated to an offset) is ever returned, CRC checked.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::select_all;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse, ResponseKind};
use kafka_protocol::ResponseError;
use tokio::sync::watch;

use crate::cluster::Cluster;
use crate::errors::partition_error_code;
use crate::handlers::Reply;
use crate::traffic::TopicTraffic;

pub fn handle(cluster: &Arc<Cluster>, cap_ms: u64, request: FetchRequest) -> Reply {
    let cluster = cluster.clone();
    Reply::Later(Box::pin(async move {
        let response = wait_for_data(&request, cap_ms, |watchers| {
            read_once(&cluster, &request, watchers)
        })
        .await;
        count_traffic(&cluster, &response);
        ResponseKind::Fetch(response)
    }))
}

/// Once per request, whatever the long poll did: one request and the bytes returned, per topic.
fn count_traffic(cluster: &Cluster, response: &FetchResponse) {
    for t in &response.responses {
        let Some(topic) = cluster.topic(t.topic.as_str()) else {
            continue;
        };
        let bytes: usize = t
            .partitions
            .iter()
            .filter_map(|p| p.records.as_ref().map(|r| r.len()))
            .sum();
        TopicTraffic::add(&topic.traffic.fetch_requests, 1);
        TopicTraffic::add(&topic.traffic.fetch_bytes, bytes as u64);
    }
}

/// The long poll: `read` reads every requested partition
/// once and returns (response, record bytes, whether any partition failed), pushing a watcher
/// of each partition's high watermark; an answer goes back once `min_bytes` are there, on an
/// error, or at the deadline (the request's wait, capped at `cap_ms`).
pub(crate) async fn wait_for_data(
    request: &FetchRequest,
    cap_ms: u64,
    mut read: impl FnMut(&mut Vec<watch::Receiver<i64>>) -> (FetchResponse, usize, bool),
) -> FetchResponse {
    let wait_ms = u64::try_from(request.max_wait_ms).unwrap_or(0).min(cap_ms);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    let min_bytes = usize::try_from(request.min_bytes).unwrap_or(0);
    loop {
        // Subscribe before reading so an fsync landing between the read and the wait still wakes us.
        let mut watchers = Vec::new();
        let (response, bytes, had_error) = read(&mut watchers);
        let expired = tokio::time::Instant::now() >= deadline;
        if bytes >= min_bytes || had_error || expired || watchers.is_empty() {
            return response;
        }
        let changed = select_all(
            watchers
                .into_iter()
                .map(|mut rx| Box::pin(async move { rx.changed().await })),
        );
        if tokio::time::timeout_at(deadline, changed).await.is_err() {
            // Timed out: answer with whatever is there now (usually nothing).
            let (response, _, _) = read(&mut Vec::new());
            return response;
        }
    }
}

/// Bytes one partition may return: its own limit within what is left of the request's. KIP-74:
/// while nothing has been returned yet (`returned == 0`) at least one whole batch goes back, so a
/// batch larger than the limits can never wedge a consumer.
pub(crate) fn partition_limit(partition_max_bytes: i32, budget: usize, returned: usize) -> usize {
    let limit = usize::try_from(partition_max_bytes)
        .unwrap_or(0)
        .min(budget);
    if returned == 0 {
        limit.max(1)
    } else {
        limit
    }
}

fn read_once(
    cluster: &Cluster,
    request: &FetchRequest,
    watchers: &mut Vec<watch::Receiver<i64>>,
) -> (FetchResponse, usize, bool) {
    let mut budget = usize::try_from(request.max_bytes).unwrap_or(0);
    let mut total = 0usize;
    let mut had_error = false;
    let mut topics = Vec::with_capacity(request.topics.len());
    for wanted in &request.topics {
        let topic = cluster.topic(wanted.topic.as_str());
        let mut partitions = Vec::with_capacity(wanted.partitions.len());
        for p in &wanted.partitions {
            let data = PartitionData::default()
                .with_partition_index(p.partition)
                .with_high_watermark(-1)
                .with_last_stable_offset(-1)
                .with_log_start_offset(-1);
            let Some(topic) = topic
                .as_ref()
                .filter(|t| p.partition >= 0 && p.partition < t.partition_count())
            else {
                had_error = true;
                partitions
                    .push(data.with_error_code(ResponseError::UnknownTopicOrPartition.code()));
                continue;
            };
            let Some(replica) = cluster
                .partition(topic, p.partition)
                .filter(|r| r.is_leader())
            else {
                had_error = true;
                partitions.push(data.with_error_code(ResponseError::NotLeaderOrFollower.code()));
                continue;
            };
            let partition = &replica.partition;
            watchers.push(partition.subscribe_high_watermark());
            let high_watermark = partition.high_watermark();
            let data = data
                .with_high_watermark(high_watermark)
                .with_last_stable_offset(high_watermark)
                .with_log_start_offset(partition.log_start_offset())
                .with_current_leader(
                    kafka_protocol::messages::fetch_response::LeaderIdAndEpoch::default()
                        .with_leader_id(kafka_protocol::messages::BrokerId(cluster.node_id))
                        .with_leader_epoch(i32::try_from(replica.leader().1).unwrap_or(i32::MAX)),
                );
            let max_bytes = partition_limit(p.partition_max_bytes, budget, total);
            // A new leader's high watermark can trail the old one's for a moment; offsets up to
            // its log end are waited on, not refused.
            if p.fetch_offset < partition.log_start_offset()
                || p.fetch_offset > partition.log_end_offset().max(high_watermark)
            {
                had_error = true;
                partitions.push(data.with_error_code(ResponseError::OffsetOutOfRange.code()));
                continue;
            }
            if p.fetch_offset >= high_watermark || max_bytes == 0 {
                partitions.push(data.with_records(Some(Default::default())));
                continue;
            }
            match partition.read(p.fetch_offset, max_bytes) {
                Ok(read) => {
                    total += read.records.len();
                    budget = budget.saturating_sub(read.records.len());
                    partitions.push(data.with_records(Some(read.records)));
                }
                Err(e) => {
                    had_error = true;
                    tracing::warn!(topic = %wanted.topic.as_str(), partition = p.partition, error = %e, "read refused");
                    partitions.push(data.with_error_code(partition_error_code(&e).code()));
                }
            }
        }
        topics.push(
            FetchableTopicResponse::default()
                .with_topic(wanted.topic.clone())
                .with_topic_id(wanted.topic_id)
                .with_partitions(partitions),
        );
    }
    (
        FetchResponse::default().with_responses(topics),
        total,
        had_error,
    )
}
