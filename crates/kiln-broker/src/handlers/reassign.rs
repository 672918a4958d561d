//! AlterPartitionReassignments, ListPartitionReassignments (KIP-455) and UnregisterBroker
//! (KIP-631): replica moves and decommissioning (`cluster/moves.rs`). Any broker takes them;
//! changes go to the controller. The internal groups are named as topics `__cluster_metadata`
//! and `__consumer_offsets`, partition 0.
//!
//! A null replica list cancels a partition's move: it goes back to the replicas it had
//! (NO_REASSIGNMENT_IN_PROGRESS where none is under way; docs/replication.md, "Moving
//! replicas").
//! UnregisterBroker decommissions the broker: its replicas move to the others first, then it
//! is removed (Kafka's brokers must be stopped first; Kiln moves their data instead).

use std::sync::Arc;

use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId,
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, ResponseKind,
    UnregisterBrokerRequest, UnregisterBrokerResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::cluster::Cluster;
use crate::errors::cluster_error_code;
use crate::handlers::Reply;

/// Partitions one AlterPartitionReassignments may name.
pub const MOVES_PER_REQUEST_MAX: usize = 10_000;

fn text(s: String) -> Option<StrBytes> {
    Some(StrBytes::from_string(s))
}

pub fn alter(cluster: &Arc<Cluster>, request: AlterPartitionReassignmentsRequest) -> Reply {
    let cluster = cluster.clone();
    Reply::Later(Box::pin(async move {
        let count: usize = request.topics.iter().map(|t| t.partitions.len()).sum();
        let mut response = AlterPartitionReassignmentsResponse::default().with_error_message(None);
        if count > MOVES_PER_REQUEST_MAX {
            response.error_code = ResponseError::InvalidRequest.code();
            response.error_message = text(format!(
                "{count} partitions in one request; the limit is {MOVES_PER_REQUEST_MAX}"
            ));
            return ResponseKind::AlterPartitionReassignments(response);
        }
        for t in request.topics {
            let mut partitions = Vec::with_capacity(t.partitions.len());
            for p in t.partitions {
                let outcome = match p.replicas {
                    None => cluster
                        .cancel_move(t.name.as_str(), p.partition_index)
                        .await
                        .map_err(|e| (cluster_error_code(&e), e.to_string())),
                    Some(replicas) => {
                        let target = replicas.into_iter().map(|b| b.0).collect();
                        cluster
                            .move_replicas(t.name.as_str(), p.partition_index, target)
                            .await
                            .map_err(|e| (cluster_error_code(&e), e.to_string()))
                    }
                };
                let mut answer = ReassignablePartitionResponse::default()
                    .with_partition_index(p.partition_index)
                    .with_error_message(None);
                if let Err((code, message)) = outcome {
                    answer.error_code = code.code();
                    answer.error_message = text(message);
                }
                partitions.push(answer);
            }
            response.responses.push(
                ReassignableTopicResponse::default()
                    .with_name(t.name)
                    .with_partitions(partitions),
            );
        }
        ResponseKind::AlterPartitionReassignments(response)
    }))
}

pub fn list(
    cluster: &Arc<Cluster>,
    request: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    let ids = |v: &[i32]| v.iter().map(|b| BrokerId(*b)).collect::<Vec<_>>();
    let wanted = |topic: &str, partition: i32| match &request.topics {
        None => true,
        Some(topics) => topics
            .iter()
            .any(|t| t.name.as_str() == topic && t.partition_indexes.contains(&partition)),
    };
    let mut topics: Vec<OngoingTopicReassignment> = Vec::new();
    for m in cluster.moves_under_way() {
        if !wanted(&m.topic, m.partition) {
            continue;
        }
        // Kafka's `replicas` during a move: the target followed by those being removed.
        let mut replicas = m.target.clone();
        replicas.extend(m.removing());
        let ongoing = OngoingPartitionReassignment::default()
            .with_partition_index(m.partition)
            .with_replicas(ids(&replicas))
            .with_adding_replicas(ids(&m.adding()))
            .with_removing_replicas(ids(&m.removing()));
        match topics.iter_mut().find(|t| t.name.as_str() == m.topic) {
            Some(t) => t.partitions.push(ongoing),
            None => topics.push(
                OngoingTopicReassignment::default()
                    .with_name(StrBytes::from_string(m.topic).into())
                    .with_partitions(vec![ongoing]),
            ),
        }
    }
    ListPartitionReassignmentsResponse::default()
        .with_error_message(None)
        .with_topics(topics)
}

pub fn unregister(cluster: &Arc<Cluster>, request: UnregisterBrokerRequest) -> Reply {
    let cluster = cluster.clone();
    Reply::Later(Box::pin(async move {
        let mut response = UnregisterBrokerResponse::default().with_error_message(None);
        if let Err(e) = cluster.decommission(request.broker_id.0).await {
            response.error_code = cluster_error_code(&e).code();
            response.error_message = text(e.to_string());
        }
        ResponseKind::UnregisterBroker(response)
    }))
}
