use std::sync::Arc;

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::catalog::{CatalogError, Topic};
use crate::errors::catalog_error_code;
use crate::server::Broker;

pub fn handle(broker: &Arc<Broker>, request: MetadataRequest) -> MetadataResponse {
    let node = BrokerId(broker.config.node_id);
    let topics = match request.topics {
        None => broker
            .catalog
            .list()
            .iter()
            .map(|t| describe(t, node))
            .collect(),
        Some(wanted) => wanted
            .into_iter()
            .map(|t| {
                let Some(name) = t.name else {
                    // Lookups by topic id alone arrive with Metadata v10+; ids are not indexed yet.
                    return MetadataResponseTopic::default()
                        .with_topic_id(t.topic_id)
                        .with_error_code(ResponseError::UnknownTopicId.code());
                };
                match lookup_or_create(broker, name.as_str(), request.allow_auto_topic_creation) {
                    Ok(topic) => describe(&topic, node),
                    Err(e) => MetadataResponseTopic::default()
                        .with_name(Some(name))
                        .with_error_code(catalog_error_code(&e).code()),
                }
            })
            .collect(),
    };
    MetadataResponse::default()
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(node)
            .with_host(StrBytes::from_string(broker.advertised_host.clone()))
            .with_port(broker.advertised_port)])
        .with_cluster_id(Some(StrBytes::from_string(broker.cluster_id())))
        .with_controller_id(node)
        .with_topics(topics)
}

fn lookup_or_create(
    broker: &Broker,
    name: &str,
    client_allows: bool,
) -> Result<Arc<Topic>, CatalogError> {
    if let Some(topic) = broker.catalog.get(name) {
        return Ok(topic);
    }
    if !(broker.config.auto_create_topics && client_allows) {
        return Err(CatalogError::NotFound(name.to_string()));
    }
    match broker
        .catalog
        .create(name, broker.config.default_partitions, Default::default())
    {
        // Another connection may have created it a moment ago.
        Err(CatalogError::AlreadyExists(_)) => broker
            .catalog
            .get(name)
            .ok_or_else(|| CatalogError::NotFound(name.to_string())),
        other => other,
    }
}

fn describe(topic: &Topic, node: BrokerId) -> MetadataResponseTopic {
    let partitions = (0..topic.partitions.len() as i32)
        .map(|index| {
            MetadataResponsePartition::default()
                .with_partition_index(index)
                .with_leader_id(node)
                .with_leader_epoch(0)
                .with_replica_nodes(vec![node])
                .with_isr_nodes(vec![node])
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(topic.name.clone()))))
        .with_topic_id(topic.id)
        .with_partitions(partitions)
}
