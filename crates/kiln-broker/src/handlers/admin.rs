//! CreateTopics and DeleteTopics. File-system work runs on the blocking pool.

use std::collections::BTreeMap;
use std::sync::Arc;

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

use crate::catalog::CatalogError;
use crate::errors::catalog_error_code;
use crate::handlers::Reply;
use crate::server::Broker;

/// Replicas a topic can have on this single-node broker.
const BROKERS_AVAILABLE: i16 = 1;

pub fn create_topics(broker: &Arc<Broker>, request: CreateTopicsRequest, version: i16) -> Reply {
    let broker = broker.clone();
    Reply::Later(Box::pin(async move {
        let results = tokio::task::spawn_blocking(move || {
            request
                .topics
                .into_iter()
                .map(|t| create_one(&broker, t, request.validate_only, version))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "create topics task failed");
            Vec::new()
        });
        ResponseKind::CreateTopics(CreateTopicsResponse::default().with_topics(results))
    }))
}

fn create_one(
    broker: &Broker,
    topic: CreatableTopic,
    validate_only: bool,
    version: i16,
) -> CreatableTopicResult {
    let result = CreatableTopicResult::default().with_name(topic.name.clone());
    let fail = |code: ResponseError, message: String| {
        tracing::info!(topic = %topic.name.as_str(), %message, "create topic refused");
        result
            .clone()
            .with_error_code(code.code())
            .with_error_message(Some(StrBytes::from_string(message)))
    };
    let spec = match parse_create(&topic, broker.config.default_partitions) {
        Ok(spec) => spec,
        Err((code, message)) => return fail(code, message),
    };
    if !matches!(spec.replication_factor, None | Some(1)) {
        return fail(
            ResponseError::InvalidReplicationFactor,
            format!(
                "replication factor {} exceeds the {BROKERS_AVAILABLE} broker(s) available",
                topic.replication_factor
            ),
        );
    }
    let (partitions, overrides) = (spec.partitions, spec.overrides);
    let outcome = if validate_only {
        broker
            .catalog
            .validate_create(topic.name.as_str(), partitions, &overrides)
            .map(|_| None)
    } else {
        broker
            .catalog
            .create(topic.name.as_str(), partitions, overrides.clone())
            .map(Some)
    };
    match outcome {
        Ok(created) => {
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
            let mut r = result
                .with_num_partitions(partitions as i32)
                .with_replication_factor(1)
                .with_configs(configs);
            if let Some(t) = created {
                r = r.with_topic_id(t.id);
            }
            r
        }
        Err(e) => fail(catalog_error_code(&e), e.to_string()),
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

pub fn delete_topics(broker: &Arc<Broker>, request: DeleteTopicsRequest) -> Reply {
    let broker = broker.clone();
    Reply::Later(Box::pin(async move {
        let results = tokio::task::spawn_blocking(move || {
            request
                .topic_names
                .into_iter()
                .map(|name| {
                    let result = DeletableTopicResult::default().with_name(Some(name.clone()));
                    match broker.catalog.delete(name.as_str()) {
                        Ok(()) => result,
                        Err(e) => {
                            if !matches!(e, CatalogError::NotFound(_)) {
                                tracing::error!(topic = %name.as_str(), error = %e, "delete topic failed");
                            }
                            result
                                .with_error_code(catalog_error_code(&e).code())
                                .with_error_message(Some(StrBytes::from_string(e.to_string())))
                        }
                    }
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "delete topics task failed");
            Vec::new()
        });
        ResponseKind::DeleteTopics(DeleteTopicsResponse::default().with_responses(results))
    }))
}
