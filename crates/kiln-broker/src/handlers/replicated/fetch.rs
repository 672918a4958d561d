//! Fetch in cluster mode: served by the partition's leader, only below the high watermark
//! (the Raft commit point translated to an offset), with the same long poll as standalone.

use std::sync::Arc;

use bytes::BytesMut;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse, ResponseKind};
use kafka_protocol::ResponseError;
use tokio::sync::watch;

use super::partition_error_code;
use crate::cluster::Cluster;
use crate::handlers::Reply;
use crate::traffic::TopicTraffic;

pub fn handle(cluster: &Arc<Cluster>, cap_ms: u64, request: FetchRequest) -> Reply {
    let cluster = cluster.clone();
    Reply::Later(Box::pin(async move {
        let response = long_poll(&cluster, cap_ms, &request).await;
        for t in &response.responses {
            if let Some(topic) = cluster.topic(t.topic.as_str()) {
                let bytes: usize = t
                    .partitions
                    .iter()
                    .filter_map(|p| p.records.as_ref().map(|r| r.len()))
                    .sum();
                TopicTraffic::add(&topic.traffic.fetch_requests, 1);
                TopicTraffic::add(&topic.traffic.fetch_bytes, bytes as u64);
            }
        }
        ResponseKind::Fetch(response)
    }))
}

async fn long_poll(cluster: &Cluster, cap_ms: u64, request: &FetchRequest) -> FetchResponse {
    crate::handlers::fetch::wait_for_data(request, cap_ms, |watchers| {
        read_once(cluster, request, watchers)
    })
    .await
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
                .with_log_start_offset(0)
                .with_current_leader(
                    kafka_protocol::messages::fetch_response::LeaderIdAndEpoch::default()
                        .with_leader_id(kafka_protocol::messages::BrokerId(cluster.node_id))
                        .with_leader_epoch(i32::try_from(replica.leader().1).unwrap_or(i32::MAX)),
                );
            let max_bytes =
                crate::handlers::fetch::partition_limit(p.partition_max_bytes, budget, total);
            // A new leader's high watermark can trail the old one's for a moment; offsets up to
            // its log end are waited on, not refused.
            if p.fetch_offset < 0 || p.fetch_offset > partition.log_end_offset().max(high_watermark)
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
                Ok(batches) => {
                    let mut records = BytesMut::new();
                    for b in batches {
                        records.extend_from_slice(&b.bytes);
                    }
                    total += records.len();
                    budget = budget.saturating_sub(records.len());
                    partitions.push(data.with_records(Some(records.freeze())));
                }
                Err(e) => {
                    had_error = true;
                    tracing::warn!(topic = %wanted.topic.as_str(), partition = p.partition, error = %e, "replicated read failed");
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
