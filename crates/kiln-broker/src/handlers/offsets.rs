//! OffsetCommit, OffsetFetch and OffsetDelete.
//!
//! A commit is checked and appended in arrival order and answered only once the offsets log has
//! fsynced it. OffsetFetch reads only durable offsets.

use std::sync::Arc;

use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse,
    OffsetFetchRequest, OffsetFetchResponse, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use tokio::time::Instant;

use crate::groups::coordinator::{CommitParams, CommitPartition};
use crate::groups::records::{Committed, OffsetKey, GROUP_ID_LEN_MAX};
use crate::handlers::Reply;
use crate::server::Broker;
use crate::time::now_ms;

pub fn offset_commit(broker: &Arc<Broker>, request: OffsetCommitRequest) -> Reply {
    let mut partitions = Vec::new();
    for t in &request.topics {
        for p in &t.partitions {
            partitions.push(CommitPartition {
                topic: t.name.0.to_string(),
                partition: p.partition_index,
                offset: p.committed_offset,
                leader_epoch: p.committed_leader_epoch,
                metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
            });
        }
    }
    let params = CommitParams {
        group_id: request.group_id.0.to_string(),
        generation_id: request.generation_id_or_member_epoch,
        member_id: request.member_id.to_string(),
        partitions,
    };
    let high_watermark = |topic: &str, partition: i32| broker.high_watermark(topic, partition);
    let (mut errors, ticket) =
        broker
            .groups
            .commit(&params, high_watermark, Instant::now(), now_ms());
    let broker = broker.clone();
    Reply::Later(Box::pin(async move {
        if let Some(ticket) = ticket {
            if let Err(e) = broker.groups.store().wait(ticket).await {
                tracing::error!(group = %params.group_id, error = %e, "offset commit not durable");
                for slot in errors.iter_mut().filter(|e| **e == 0) {
                    *slot = ResponseError::CoordinatorNotAvailable.code();
                }
            }
        }
        let mut errors = errors.into_iter();
        let topics = request
            .topics
            .into_iter()
            .map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        OffsetCommitResponsePartition::default()
                            .with_partition_index(p.partition_index)
                            .with_error_code(errors.next().unwrap_or(0))
                    })
                    .collect();
                OffsetCommitResponseTopic::default()
                    .with_name(t.name)
                    .with_partitions(partitions)
            })
            .collect();
        ResponseKind::OffsetCommit(OffsetCommitResponse::default().with_topics(topics))
    }))
}

fn valid_group(id: &str) -> bool {
    !id.is_empty() && id.len() <= GROUP_ID_LEN_MAX
}

/// (partition, committed offset or -1, leader epoch, metadata) for the requested partitions, or
/// for every committed partition of the group when `wanted` is `None`.
type Found = Vec<(String, Vec<(i32, Option<Committed>)>)>;

fn lookup(broker: &Broker, group: &str, wanted: Option<Vec<(String, Vec<i32>)>>) -> Found {
    let store = broker.groups.store();
    match wanted {
        Some(topics) => topics
            .into_iter()
            .map(|(topic, partitions)| {
                let found = partitions
                    .into_iter()
                    .map(|p| {
                        let key = OffsetKey {
                            group: group.to_string(),
                            topic: topic.clone(),
                            partition: p,
                        };
                        (p, store.committed(&key))
                    })
                    .collect();
                (topic, found)
            })
            .collect(),
        None => {
            let mut out: Found = Vec::new();
            for (topic, partition, c) in store.group_offsets(group) {
                match out.last_mut() {
                    Some((t, ps)) if *t == topic => ps.push((partition, Some(c))),
                    _ => out.push((topic, vec![(partition, Some(c))])),
                }
            }
            out
        }
    }
}

fn metadata(c: &Option<Committed>) -> Option<StrBytes> {
    // Kafka answers "" (not null) when there is no metadata.
    Some(StrBytes::from_string(
        c.as_ref()
            .and_then(|c| c.metadata.clone())
            .unwrap_or_default(),
    ))
}

pub fn offset_fetch(
    broker: &Arc<Broker>,
    request: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    let epoch = |c: &Option<Committed>| {
        if version >= 5 {
            c.as_ref().map_or(-1, |c| c.leader_epoch)
        } else {
            -1
        }
    };
    if version >= 8 {
        let groups = request
            .groups
            .into_iter()
            .map(|g| {
                let id = g.group_id.0.to_string();
                let response = OffsetFetchResponseGroup::default().with_group_id(g.group_id);
                if !valid_group(&id) {
                    return response.with_error_code(ResponseError::InvalidGroupId.code());
                }
                let wanted = g.topics.map(|ts| {
                    ts.into_iter()
                        .map(|t| (t.name.0.to_string(), t.partition_indexes))
                        .collect()
                });
                let topics = lookup(broker, &id, wanted)
                    .into_iter()
                    .map(|(topic, found)| {
                        OffsetFetchResponseTopics::default()
                            .with_name(TopicName(StrBytes::from_string(topic)))
                            .with_partitions(
                                found
                                    .into_iter()
                                    .map(|(p, c)| {
                                        OffsetFetchResponsePartitions::default()
                                            .with_partition_index(p)
                                            .with_committed_offset(
                                                c.as_ref().map_or(-1, |c| c.offset),
                                            )
                                            .with_committed_leader_epoch(epoch(&c))
                                            .with_metadata(metadata(&c))
                                    })
                                    .collect(),
                            )
                    })
                    .collect();
                response.with_topics(topics)
            })
            .collect();
        return OffsetFetchResponse::default().with_groups(groups);
    }
    let id = request.group_id.0.to_string();
    let wanted = request.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name.0.to_string(), t.partition_indexes))
            .collect::<Vec<_>>()
    });
    let invalid = !valid_group(&id);
    let found = if invalid {
        // v1 has no top-level error: every requested partition carries it.
        wanted
            .unwrap_or_default()
            .into_iter()
            .map(|(t, ps)| (t, ps.into_iter().map(|p| (p, None)).collect()))
            .collect()
    } else {
        lookup(broker, &id, wanted)
    };
    let partition_error = if invalid && version < 2 {
        ResponseError::InvalidGroupId.code()
    } else {
        0
    };
    let topics = found
        .into_iter()
        .map(|(topic, found)| {
            OffsetFetchResponseTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic)))
                .with_partitions(
                    found
                        .into_iter()
                        .map(|(p, c)| {
                            OffsetFetchResponsePartition::default()
                                .with_partition_index(p)
                                .with_committed_offset(c.as_ref().map_or(-1, |c| c.offset))
                                .with_committed_leader_epoch(epoch(&c))
                                .with_metadata(metadata(&c))
                                .with_error_code(partition_error)
                        })
                        .collect(),
                )
        })
        .collect();
    let response = OffsetFetchResponse::default().with_topics(topics);
    if invalid && version >= 2 {
        response.with_error_code(ResponseError::InvalidGroupId.code())
    } else {
        response
    }
}

/// Partitions one OffsetDelete request may name.
pub const OFFSET_DELETE_PARTITIONS_MAX: usize = 10_000;

/// OffsetDelete: tombstones for a group's committed offsets of the given partitions, through
/// the offsets log like commits, answered once committed. A group with live members keeps the
/// offsets of topics they subscribe to (GROUP_SUBSCRIBED_TO_TOPIC).
pub fn offset_delete(broker: &Arc<Broker>, request: OffsetDeleteRequest) -> Reply {
    let partitions: Vec<(String, i32)> = request
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.name.to_string(), p.partition_index))
        })
        .collect();
    let group = request.group_id.to_string();
    let top_level = |code: ResponseError| {
        Reply::Now(Box::new(ResponseKind::OffsetDelete(
            OffsetDeleteResponse::default().with_error_code(code.code()),
        )))
    };
    if partitions.len() > OFFSET_DELETE_PARTITIONS_MAX {
        tracing::info!(%group, partitions = partitions.len(), "offset delete over the partition limit");
        return top_level(ResponseError::InvalidRequest);
    }
    let (mut errors, ticket) = match broker.groups.delete_offsets(&group, &partitions, now_ms()) {
        Ok(answer) => answer,
        Err(code) => return top_level(code),
    };
    let broker = broker.clone();
    Reply::Later(Box::pin(async move {
        if let Err(e) = broker.groups.store().wait(ticket).await {
            tracing::error!(%group, error = %e, "offset deletion not durable");
            return ResponseKind::OffsetDelete(
                OffsetDeleteResponse::default()
                    .with_error_code(ResponseError::CoordinatorNotAvailable.code()),
            );
        }
        let mut codes = errors.drain(..);
        let topics = request
            .topics
            .into_iter()
            .map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        OffsetDeleteResponsePartition::default()
                            .with_partition_index(p.partition_index)
                            .with_error_code(codes.next().unwrap_or_default())
                    })
                    .collect();
                OffsetDeleteResponseTopic::default()
                    .with_name(t.name)
                    .with_partitions(partitions)
            })
            .collect();
        ResponseKind::OffsetDelete(OffsetDeleteResponse::default().with_topics(topics))
    }))
}
