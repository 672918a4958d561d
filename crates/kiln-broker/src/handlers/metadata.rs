//! Metadata: every broker of the cluster, the controller, and per partition the leader and
//! epoch as this broker's replica knows them (a broker holding no replica names the preferred
//! one, epoch unknown). The cluster id is the replicated one (persisted
//! by every broker once learnt); before a new cluster has named itself it is null. A topic this
//! broker does not know is UNKNOWN_TOPIC_OR_PARTITION only once it has caught up with the
//! metadata log (`cluster/fence.rs`); before, LEADER_NOT_AVAILABLE.

use std::sync::Arc;

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeClusterResponse, MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::cluster::{Cluster, ClusterTopic, NewTopic};
use crate::errors::cluster_error_code;
use crate::server::Broker;

/// Metadata for a request that came in on `listener`.
pub async fn handle(
    broker: Arc<Broker>,
    cluster: Arc<Cluster>,
    listener: Arc<str>,
    request: MetadataRequest,
) -> MetadataResponse {
    let members = cluster.brokers();
    let ids: Vec<i32> = members.iter().map(|b| b.id).collect();
    let topics = match request.topics {
        None => cluster
            .topics()
            .iter()
            .map(|t| describe(&cluster, t, &ids))
            .collect(),
        Some(wanted) => {
            let mut out = Vec::with_capacity(wanted.len());
            for t in wanted {
                let Some(name) = t.name else {
                    out.push(
                        MetadataResponseTopic::default()
                            .with_topic_id(t.topic_id)
                            .with_error_code(ResponseError::UnknownTopicId.code()),
                    );
                    continue;
                };
                if let Some(topic) = cluster.topic(name.as_str()) {
                    out.push(describe(&cluster, &topic, &ids));
                    continue;
                }
                let code = if !cluster.is_current() || cluster.topic_committed(name.as_str()) {
                    // Not caught up with the metadata log yet (`cluster/fence.rs`): the topic
                    // may exist; or it exists and its replicas are still opening here. Either
                    // way the client asks again.
                    Some(ResponseError::LeaderNotAvailable)
                } else if broker.config.auto_create_topics && request.allow_auto_topic_creation {
                    // Only the controller creates; elsewhere the client is told to ask again
                    // (it refreshes metadata and reaches the controller in time).
                    match cluster
                        .create_topic(
                            NewTopic {
                                name: name.to_string(),
                                partitions: broker.config.default_partitions,
                                replication_factor: None,
                                overrides: Default::default(),
                                validate_only: false,
                            },
                            crate::cluster::PROPOSE_WAIT,
                        )
                        .await
                    {
                        Ok(()) | Err(crate::cluster::ClusterError::AlreadyExists(_)) => None,
                        Err(crate::cluster::ClusterError::NotController(_)) => {
                            Some(ResponseError::LeaderNotAvailable)
                        }
                        Err(e) => Some(cluster_error_code(&e)),
                    }
                } else {
                    Some(ResponseError::UnknownTopicOrPartition)
                };
                match (code, cluster.topic(name.as_str())) {
                    (None, Some(topic)) => out.push(describe(&cluster, &topic, &ids)),
                    (code, _) => out.push(
                        MetadataResponseTopic::default()
                            .with_name(Some(name))
                            .with_error_code(
                                code.unwrap_or(ResponseError::LeaderNotAvailable).code(),
                            ),
                    ),
                }
            }
            out
        }
    };
    // Each broker at its address on the listener this request came in on (a broker without
    // one is left out, as Kafka does).
    let brokers = members
        .iter()
        .filter_map(|b| {
            let (host, port) = b.endpoint(&listener)?;
            Some(
                MetadataResponseBroker::default()
                    .with_node_id(BrokerId(b.id))
                    .with_host(StrBytes::from_string(host.to_string()))
                    .with_port(port),
            )
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(brokers)
        .with_cluster_id(broker.cluster_id().map(StrBytes::from_string))
        .with_controller_id(BrokerId(cluster.controller_hint()))
        .with_topics(topics)
}

/// `topic`'s partitions; `brokers`: the ids of the cluster's brokers.
fn describe(cluster: &Cluster, topic: &ClusterTopic, brokers: &[i32]) -> MetadataResponseTopic {
    let partitions = topic
        .assignments
        .iter()
        .enumerate()
        .map(|(index, members)| {
            let index = i32::try_from(index).unwrap_or(i32::MAX);
            let replicas: Vec<BrokerId> = members.iter().map(|m| BrokerId(*m)).collect();
            let response = MetadataResponsePartition::default()
                .with_partition_index(index)
                .with_replica_nodes(replicas.clone());
            match cluster.partition(topic, index) {
                Some(replica) => {
                    let (leader, term) = replica.leader();
                    let isr = replica.in_sync().into_iter().map(BrokerId).collect();
                    let response = response
                        .with_leader_id(BrokerId(leader))
                        .with_leader_epoch(i32::try_from(term).unwrap_or(i32::MAX))
                        .with_isr_nodes(isr);
                    if leader < 0 {
                        response.with_error_code(ResponseError::LeaderNotAvailable.code())
                    } else {
                        response
                    }
                }
                // Not a replica here (a cluster of more brokers than the replication factor):
                // this broker does not follow the partition's elections. It names the preferred
                // replica, which leads it whenever it can (the leader balance), with an unknown
                // epoch: a client that finds another leader there is told NOT_LEADER and asks
                // again, and one that knows a leader of some epoch keeps it.
                None => match members.iter().find(|m| brokers.contains(m)) {
                    Some(&preferred) => response
                        .with_leader_id(BrokerId(preferred))
                        .with_leader_epoch(-1)
                        .with_isr_nodes(replicas),
                    None => response
                        .with_leader_id(BrokerId(-1))
                        .with_leader_epoch(-1)
                        .with_isr_nodes(replicas)
                        .with_error_code(ResponseError::LeaderNotAvailable.code()),
                },
            }
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(topic.name.clone()))))
        .with_topic_id(topic.id)
        .with_partitions(partitions)
}

/// DescribeCluster: the same brokers, cluster id and controller as Metadata, at their
/// addresses on the request's `listener` (every endpoint type gets those); no broker is fenced.
pub fn describe_cluster(
    broker: &Broker,
    cluster: &Cluster,
    listener: &str,
    include_operations: bool,
) -> DescribeClusterResponse {
    let brokers = cluster
        .brokers()
        .iter()
        .filter_map(|b| {
            let (host, port) = b.endpoint(listener)?;
            Some(
                DescribeClusterBroker::default()
                    .with_broker_id(BrokerId(b.id))
                    .with_host(StrBytes::from_string(host.to_string()))
                    .with_port(port),
            )
        })
        .collect();
    DescribeClusterResponse::default()
        .with_cluster_id(StrBytes::from_string(
            broker.cluster_id().unwrap_or_default(),
        ))
        .with_controller_id(BrokerId(cluster.controller_hint()))
        .with_brokers(brokers)
        // Kafka's value when they were not requested (Kiln has no ACLs; asked for, none).
        .with_cluster_authorized_operations(if include_operations { 0 } else { i32::MIN })
}
