//! DescribeConfigs, IncrementalAlterConfigs and AlterConfigs. Topic configs are the topic's
//! overrides in the metadata log on top of the broker's defaults (`topic_config`); any broker
//! describes them, any broker takes a change (others forward it to the controller). Broker
//! configs are the broker's own settings file, read-only here.

use std::sync::Arc;

use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{
    alter_configs_response, AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest,
    DescribeConfigsResponse, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
    ResponseKind,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::cluster::{Cluster, ConfigChange, CONFIG_CHANGES_MAX};
use crate::config::BrokerConfig;
use crate::errors::cluster_error_code;
use crate::handlers::Reply;
use crate::topic_config::{self, LIST_CONFIG_KEYS};

/// Resources one request may name; a bound on the work (and metadata proposals) of one request.
pub const CONFIG_RESOURCES_PER_REQUEST_MAX: usize = 100;

// Kafka's resource types, config sources and config types (DescribeConfigs v3+).
const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
const SOURCE_DYNAMIC_TOPIC: i8 = 1;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;
const TYPE_STRING: i8 = 2;
const TYPE_INT: i8 = 3;
const TYPE_LONG: i8 = 5;
const TYPE_LIST: i8 = 7;
// IncrementalAlterConfigs operations.
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

/// One resource's outcome: error code and message (none on success).
type Outcome = (i16, Option<String>);

fn failure(code: ResponseError, message: impl Into<String>) -> Outcome {
    (code.code(), Some(message.into()))
}

fn too_many(n: usize) -> String {
    format!("{n} resources in one request; the limit is {CONFIG_RESOURCES_PER_REQUEST_MAX}")
}

pub fn describe_configs(
    cluster: &Cluster,
    config: &BrokerConfig,
    request: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let over = request.resources.len() > CONFIG_RESOURCES_PER_REQUEST_MAX;
    let results = request
        .resources
        .into_iter()
        .map(|r| {
            let result = DescribeConfigsResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            let described = if over {
                Err(failure(
                    ResponseError::InvalidRequest,
                    too_many(CONFIG_RESOURCES_PER_REQUEST_MAX + 1),
                ))
            } else {
                describe_one(cluster, config, r.resource_type, r.resource_name.as_str())
            };
            match described {
                Ok(mut configs) => {
                    if let Some(keys) = &r.configuration_keys {
                        configs.retain(|c| keys.iter().any(|k| k == &c.name));
                    }
                    result.with_configs(configs)
                }
                Err((code, message)) => result
                    .with_error_code(code)
                    .with_error_message(message.map(StrBytes::from_string)),
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

fn entry(name: &str, value: String, source: i8, config_type: i8) -> DescribeConfigsResourceResult {
    DescribeConfigsResourceResult::default()
        .with_name(StrBytes::from_string(name.to_string()))
        .with_value(Some(StrBytes::from_string(value)))
        .with_config_source(source)
        .with_config_type(config_type)
}

fn describe_one(
    cluster: &Cluster,
    config: &BrokerConfig,
    resource_type: i8,
    name: &str,
) -> Result<Vec<DescribeConfigsResourceResult>, Outcome> {
    match resource_type {
        RESOURCE_TOPIC => {
            let topic = cluster.topic(name).ok_or_else(|| {
                failure(
                    ResponseError::UnknownTopicOrPartition,
                    format!("topic {name:?} does not exist"),
                )
            })?;
            Ok(topic_config::effective(&topic.settings)
                .into_iter()
                .map(|(key, value)| {
                    let source = if topic.overrides.contains_key(key) {
                        SOURCE_DYNAMIC_TOPIC
                    } else {
                        SOURCE_DEFAULT
                    };
                    let config_type = match key {
                        k if LIST_CONFIG_KEYS.contains(&k) => TYPE_LIST,
                        "index.interval.bytes" | "max.message.bytes" => TYPE_INT,
                        _ => TYPE_LONG,
                    };
                    entry(key, value, source, config_type)
                })
                .collect())
        }
        RESOURCE_BROKER => {
            if !name.is_empty() && name != config.node_id.to_string() {
                return Err(failure(
                    ResponseError::InvalidRequest,
                    format!(
                        "this is broker {}; ask broker {name} for its configs",
                        config.node_id
                    ),
                ));
            }
            Ok(broker_configs(config)
                .into_iter()
                .map(|(key, value, t)| {
                    entry(key, value, SOURCE_STATIC_BROKER, t).with_read_only(true)
                })
                .collect())
        }
        other => Err(failure(
            ResponseError::InvalidRequest,
            format!("resource type {other} is not supported; topics (2) and brokers (4) are"),
        )),
    }
}

/// The broker settings DescribeConfigs shows, by their Kafka names.
fn broker_configs(c: &BrokerConfig) -> Vec<(&'static str, String, i8)> {
    vec![
        ("broker.id", c.node_id.to_string(), TYPE_INT),
        ("num.partitions", c.default_partitions.to_string(), TYPE_INT),
        (
            "auto.create.topics.enable",
            c.auto_create_topics.to_string(),
            TYPE_STRING,
        ),
        ("message.max.bytes", c.max_batch_bytes.to_string(), TYPE_INT),
        (
            "socket.request.max.bytes",
            c.max_frame_bytes.to_string(),
            TYPE_INT,
        ),
        (
            "log.retention.ms",
            c.log.retention_ms.to_string(),
            TYPE_LONG,
        ),
        (
            "log.retention.bytes",
            c.log.retention_bytes.to_string(),
            TYPE_LONG,
        ),
        (
            "log.segment.bytes",
            c.log.segment_bytes.to_string(),
            TYPE_LONG,
        ),
        ("log.roll.ms", c.log.segment_ms.to_string(), TYPE_LONG),
        (
            "log.index.interval.bytes",
            c.log.index_interval_bytes.to_string(),
            TYPE_INT,
        ),
        (
            "log.retention.check.interval.ms",
            c.retention_check_interval_ms.to_string(),
            TYPE_LONG,
        ),
        (
            "group.min.session.timeout.ms",
            c.group_min_session_timeout_ms.to_string(),
            TYPE_INT,
        ),
        (
            "group.max.session.timeout.ms",
            c.group_max_session_timeout_ms.to_string(),
            TYPE_INT,
        ),
        (
            "group.initial.rebalance.delay.ms",
            c.group_initial_rebalance_delay_ms.to_string(),
            TYPE_INT,
        ),
        ("group.max.size", c.group_max_size.to_string(), TYPE_INT),
    ]
}

/// Runs one topic resource's change through the controller (or refuses a broker resource).
async fn alter_one(
    cluster: &Cluster,
    resource_type: i8,
    name: &str,
    changes: Result<Vec<ConfigChange>, Outcome>,
    replace: bool,
    validate_only: bool,
) -> Outcome {
    match resource_type {
        RESOURCE_TOPIC => {}
        RESOURCE_BROKER => return failure(
            ResponseError::InvalidRequest,
            "broker configs are read-only here; change the broker's settings file and restart it",
        ),
        other => {
            return failure(
                ResponseError::InvalidRequest,
                format!("resource type {other} is not supported"),
            )
        }
    }
    let changes = match changes {
        Ok(c) => c,
        Err(outcome) => return outcome,
    };
    let outcome = cluster
        .alter_topic_config(name, changes, replace, validate_only)
        .await;
    match outcome {
        Ok(()) => (0, None),
        Err(e) => {
            tracing::info!(topic = %name, error = %e, "topic config change refused");
            (cluster_error_code(&e).code(), Some(e.to_string()))
        }
    }
}

fn bounded<T>(configs: Vec<T>) -> Result<Vec<T>, Outcome> {
    if configs.len() > CONFIG_CHANGES_MAX {
        return Err(failure(
            ResponseError::InvalidRequest,
            format!(
                "{} configs in one resource; the limit is {CONFIG_CHANGES_MAX}",
                configs.len()
            ),
        ));
    }
    Ok(configs)
}

pub fn incremental_alter_configs(
    cluster: &Arc<Cluster>,
    request: IncrementalAlterConfigsRequest,
) -> Reply {
    let cluster = cluster.clone();
    Reply::Later(Box::pin(async move {
        let over = request.resources.len() > CONFIG_RESOURCES_PER_REQUEST_MAX;
        let mut responses = Vec::with_capacity(request.resources.len());
        for r in request.resources {
            let changes = bounded(r.configs).and_then(|configs| {
                configs
                    .into_iter()
                    .map(|c| {
                        let (k, v) = (c.name.to_string(), c.value.map(|v| v.to_string()));
                        let value = |v: Option<String>| {
                            v.ok_or_else(|| {
                                failure(
                                    ResponseError::InvalidConfig,
                                    format!("config {k} has no value"),
                                )
                            })
                        };
                        Ok(match c.config_operation {
                            OP_SET => ConfigChange::Set(k.clone(), value(v)?),
                            OP_DELETE => ConfigChange::Delete(k),
                            OP_APPEND => ConfigChange::Append(k.clone(), value(v)?),
                            OP_SUBTRACT => ConfigChange::Subtract(k.clone(), value(v)?),
                            op => {
                                return Err(failure(
                                    ResponseError::InvalidRequest,
                                    format!("unknown config operation {op}"),
                                ))
                            }
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()
            });
            let (code, message) = if over {
                failure(
                    ResponseError::InvalidRequest,
                    too_many(CONFIG_RESOURCES_PER_REQUEST_MAX + 1),
                )
            } else {
                alter_one(
                    &cluster,
                    r.resource_type,
                    r.resource_name.as_str(),
                    changes,
                    false,
                    request.validate_only,
                )
                .await
            };
            responses.push(
                AlterConfigsResourceResponse::default()
                    .with_resource_type(r.resource_type)
                    .with_resource_name(r.resource_name)
                    .with_error_code(code)
                    .with_error_message(message.map(StrBytes::from_string)),
            );
        }
        ResponseKind::IncrementalAlterConfigs(
            IncrementalAlterConfigsResponse::default().with_responses(responses),
        )
    }))
}

/// AlterConfigs (the older API): the resource's configs become exactly the ones given.
pub fn alter_configs(cluster: &Arc<Cluster>, request: AlterConfigsRequest) -> Reply {
    let cluster = cluster.clone();
    Reply::Later(Box::pin(async move {
        let over = request.resources.len() > CONFIG_RESOURCES_PER_REQUEST_MAX;
        let mut responses = Vec::with_capacity(request.resources.len());
        for r in request.resources {
            let changes = bounded(r.configs).and_then(|configs| {
                configs
                    .into_iter()
                    .map(|c| match c.value {
                        Some(v) => Ok(ConfigChange::Set(c.name.to_string(), v.to_string())),
                        None => Err(failure(
                            ResponseError::InvalidConfig,
                            format!("config {} has no value", c.name.as_str()),
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()
            });
            let (code, message) = if over {
                failure(
                    ResponseError::InvalidRequest,
                    too_many(CONFIG_RESOURCES_PER_REQUEST_MAX + 1),
                )
            } else {
                alter_one(
                    &cluster,
                    r.resource_type,
                    r.resource_name.as_str(),
                    changes,
                    true,
                    request.validate_only,
                )
                .await
            };
            responses.push(
                alter_configs_response::AlterConfigsResourceResponse::default()
                    .with_resource_type(r.resource_type)
                    .with_resource_name(r.resource_name)
                    .with_error_code(code)
                    .with_error_message(message.map(StrBytes::from_string)),
            );
        }
        ResponseKind::AlterConfigs(AlterConfigsResponse::default().with_responses(responses))
    }))
}
