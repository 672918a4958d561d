//! CreateTopics and DeleteTopics: proposed to the metadata log by the controller; other brokers
//! answer NOT_CONTROLLER and clients retry at the controller.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{
    CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
    ResponseKind,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::cluster::{Cluster, NewTopic};
use crate::errors::cluster_error_code;
use crate::handlers::Reply;

pub fn create_topics(
    cluster: &Arc<Cluster>,
    default_partitions: u32,
    request: CreateTopicsRequest,
    version: i16,
) -> Reply {
    let cluster = cluster.clone();
    Reply::Later(Box::pin(async move {
        let mut results = Vec::with_capacity(request.topics.len());
        // Answered within the request's own timeout (most of it: the answer still has to
        // travel), as Kafka does; a topic committed by then exists and is answered created.
        let timeout = Duration::from_millis(u64::try_from(request.timeout_ms).unwrap_or(0));
        let answer_within = timeout.mul_f64(CREATE_ANSWER_SHARE);
        for topic in request.topics {
            results.push(
                create_one(
                    &cluster,
                    default_partitions,
                    topic,
                    request.validate_only,
                    version,
                    answer_within,
                )
                .await,
            );
        }
        ResponseKind::CreateTopics(CreateTopicsResponse::default().with_topics(results))
    }))
}

/// The share of a CreateTopics request's `timeout_ms` spent waiting for the new topic's
/// replicas here; the rest is left for the answer's way back.
const CREATE_ANSWER_SHARE: f64 = 0.8;

async fn create_one(
    cluster: &Cluster,
    default_partitions: u32,
    topic: CreatableTopic,
    validate_only: bool,
    version: i16,
    answer_within: Duration,
) -> CreatableTopicResult {
    let result = CreatableTopicResult::default().with_name(topic.name.clone());
    let fail = |code: ResponseError, message: String| {
        tracing::info!(topic = %topic.name.as_str(), %message, "create topic refused");
        result
            .clone()
            .with_error_code(code.code())
            .with_error_message(Some(StrBytes::from_string(message)))
    };
    let spec = match parse_create(&topic, default_partitions) {
        Ok(spec) => spec,
        Err((code, message)) => return fail(code, message),
    };
    let (partitions, replication_factor, overrides) =
        (spec.partitions, spec.replication_factor, spec.overrides);
    let outcome = cluster
        .create_topic(
            NewTopic {
                name: topic.name.to_string(),
                partitions,
                replication_factor,
                overrides: overrides.clone(),
                validate_only,
            },
            answer_within,
        )
        .await;
    match outcome {
        Ok(()) => {
            let configs = (version >= 5).then(|| {
                overrides
                    .iter()
                    .map(|(k, v)| {
                        CreatableTopicConfigs::default()
                            .with_name(StrBytes::from_string(k.clone()))
                            .with_value(Some(StrBytes::from_string(v.clone())))
                    })
                    .collect()
            });
            let rf = replication_factor.unwrap_or(cluster.settings.default_replication_factor);
            let mut r = result
                .with_num_partitions(i32::try_from(partitions).unwrap_or(i32::MAX))
                .with_replication_factor(i16::try_from(rf).unwrap_or(i16::MAX))
                .with_configs(configs);
            if let Some(t) = cluster.topic(topic.name.as_str()) {
                r = r.with_topic_id(t.id);
            }
            r
        }
        Err(e) => fail(cluster_error_code(&e), e.to_string()),
    }
}

/// A CreateTopics entry, checked: what standalone and cluster mode both need from it.
pub(crate) struct CreateSpec {
    pub partitions: u32,
    /// `None`: the broker's default (-1 in the request).
    pub replication_factor: Option<u16>,
    pub overrides: BTreeMap<String, String>,
}

/// Checks the parts of a CreateTopics entry that do not depend on the catalog: no manual
/// assignments, a partition count (-1 = `default_partitions`), a replication factor, and a value
/// for every config.
pub(crate) fn parse_create(
    topic: &CreatableTopic,
    default_partitions: u32,
) -> Result<CreateSpec, (ResponseError, String)> {
    if !topic.assignments.is_empty() {
        return Err((
            ResponseError::InvalidRequest,
            "manual replica assignments are not supported".into(),
        ));
    }
    let replication_factor = match topic.replication_factor {
        -1 => None,
        rf => Some(u16::try_from(rf).ok().filter(|rf| *rf > 0).ok_or_else(|| {
            (
                ResponseError::InvalidReplicationFactor,
                format!("replication factor {rf} must be at least 1"),
            )
        })?),
    };
    let partitions = if topic.num_partitions == -1 {
        default_partitions
    } else {
        u32::try_from(topic.num_partitions).map_err(|_| {
            (
                ResponseError::InvalidPartitions,
                format!(
                    "partition count {} must be at least 1",
                    topic.num_partitions
                ),
            )
        })?
    };
    let mut overrides = BTreeMap::new();
    for c in &topic.configs {
        let Some(value) = &c.value else {
            return Err((
                ResponseError::InvalidConfig,
                format!("config {} has no value", c.name.as_str()),
            ));
        };
        overrides.insert(c.name.to_string(), value.to_string());
    }
    Ok(CreateSpec {
        partitions,
        replication_factor,
        overrides,
    })
}

pub fn delete_topics(cluster: &Arc<Cluster>, request: DeleteTopicsRequest) -> Reply {
    let cluster = cluster.clone();
    Reply::Later(Box::pin(async move {
        let mut results = Vec::with_capacity(request.topic_names.len());
        for name in request.topic_names {
            let result = DeletableTopicResult::default().with_name(Some(name.clone()));
            results.push(match cluster.delete_topic(name.as_str()).await {
                Ok(()) => result,
                Err(e) => result
                    .with_error_code(cluster_error_code(&e).code())
                    .with_error_message(Some(StrBytes::from_string(e.to_string()))),
            });
        }
        ResponseKind::DeleteTopics(DeleteTopicsResponse::default().with_responses(results))
    }))
}
