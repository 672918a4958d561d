//! `kiln topics`: a small admin CLI over the Kafka protocol (works against any Kafka broker).

use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    BrokerId, CreateTopicsRequest, DeleteTopicsRequest, ListOffsetsRequest, MetadataRequest,
    MetadataResponse, RequestKind, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use kiln_client::Connection;

use crate::broker_address::BrokerAddress;
use crate::topic_configs_cmd;

#[derive(Args, Debug)]
pub struct TopicsArgs {
    #[command(flatten)]
    broker: BrokerAddress,
    #[command(subcommand)]
    command: TopicsCommand,
}

#[derive(Subcommand, Debug)]
enum TopicsCommand {
    /// Create a topic.
    Create {
        name: String,
        #[arg(long, default_value_t = 1)]
        partitions: i32,
        /// Replicas per partition; -1 takes the broker's default (1 standalone, the cluster's
        /// `default_replication_factor` in cluster mode).
        #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
        replication_factor: i16,
        /// Topic setting as key=value (retention.ms, retention.bytes, segment.bytes, segment.ms, ...).
        #[arg(long = "config", value_name = "KEY=VALUE")]
        configs: Vec<String>,
    },
    /// List topics.
    List,
    /// Show a topic's partitions, leaders, offsets and configs.
    Describe { name: String },
    /// Change a topic's settings at run time (applied on every broker, kept across restarts).
    Alter {
        name: String,
        /// Setting to set, as key=value (retention.ms, retention.bytes, segment.bytes, ...).
        #[arg(long = "config", value_name = "KEY=VALUE")]
        configs: Vec<String>,
        /// Setting to remove from the topic, so the broker default applies again.
        #[arg(long = "delete-config", value_name = "KEY")]
        delete_configs: Vec<String>,
    },
    /// Delete a topic and all its data.
    Delete { name: String },
}

pub async fn run(args: TopicsArgs) -> anyhow::Result<()> {
    let timeout = args.broker.timeout();
    let security = args.broker.security()?;
    let mut conn = args.broker.connect().await?;
    // Topic changes go to the controller (in a cluster, other brokers refuse them).
    if matches!(
        args.command,
        TopicsCommand::Create { .. } | TopicsCommand::Delete { .. } | TopicsCommand::Alter { .. }
    ) {
        conn = connect_controller(conn, timeout, &security).await?;
    }
    match args.command {
        TopicsCommand::Create {
            name,
            partitions,
            replication_factor,
            configs,
        } => {
            create(
                &mut conn,
                timeout,
                name,
                partitions,
                replication_factor,
                &configs,
            )
            .await
        }
        TopicsCommand::List => list(&mut conn, timeout).await,
        TopicsCommand::Describe { name } => describe(&mut conn, timeout, &name).await,
        TopicsCommand::Delete { name } => delete(&mut conn, timeout, &name).await,
        TopicsCommand::Alter {
            name,
            configs,
            delete_configs,
        } => topic_configs_cmd::alter(&mut conn, timeout, &name, &configs, &delete_configs).await,
    }
}

/// The connection to the controller named in Metadata, or `conn` itself when it is the
/// controller (always so for a standalone broker) or none is named.
pub(crate) async fn connect_controller(
    mut conn: Connection,
    timeout: Duration,
    security: &kiln_client::Security,
) -> anyhow::Result<Connection> {
    let response = metadata(&mut conn, timeout, None).await?;
    let controller = response.controller_id;
    if controller.0 < 0 {
        bail!(
            "the cluster has no controller at the moment (no majority of brokers up?); try again"
        );
    }
    let Some(b) = response.brokers.iter().find(|b| b.node_id == controller) else {
        return Ok(conn);
    };
    let address = format!("{}:{}", b.host.as_str(), b.port);
    if response.brokers.len() == 1 {
        return Ok(conn);
    }
    Connection::open(&address, timeout, security)
        .await
        .with_context(|| {
            format!(
                "connecting to the controller, broker {} at {address}",
                controller.0
            )
        })
}

pub(crate) fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

pub(crate) fn error_text(code: i16, message: Option<&StrBytes>) -> String {
    let name = ResponseError::try_from_code(code)
        .map_or_else(|| format!("error {code}"), |e| format!("{e:?}"));
    match message {
        Some(m) => format!("{name}: {}", m.as_str()),
        None => name,
    }
}

async fn create(
    conn: &mut Connection,
    timeout: Duration,
    name: String,
    partitions: i32,
    replication_factor: i16,
    configs: &[String],
) -> anyhow::Result<()> {
    let topic_configs: Vec<CreatableTopicConfig> = topic_configs_cmd::parse_pairs(configs)?
        .into_iter()
        .map(|(k, v)| {
            CreatableTopicConfig::default()
                .with_name(StrBytes::from_string(k))
                .with_value(Some(StrBytes::from_string(v)))
        })
        .collect();
    let request = CreateTopicsRequest::default()
        .with_timeout_ms(timeout.as_millis() as i32)
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(&name))
            .with_num_partitions(partitions)
            .with_replication_factor(replication_factor)
            .with_configs(topic_configs)]);
    let ResponseKind::CreateTopics(response) = conn
        .call(RequestKind::CreateTopics(request), timeout)
        .await?
    else {
        bail!("unexpected response to CreateTopics");
    };
    for t in response.topics {
        if t.error_code != 0 {
            bail!(
                "cannot create topic {name:?}: {}",
                error_text(t.error_code, t.error_message.as_ref())
            );
        }
    }
    println!("created topic {name} with {partitions} partition(s)");
    Ok(())
}

pub(crate) async fn metadata(
    conn: &mut Connection,
    timeout: Duration,
    name: Option<&str>,
) -> anyhow::Result<MetadataResponse> {
    let request = MetadataRequest::default().with_topics(
        name.map(|n| vec![MetadataRequestTopic::default().with_name(Some(topic_name(n)))]),
    );
    match conn.call(RequestKind::Metadata(request), timeout).await? {
        ResponseKind::Metadata(m) => Ok(m),
        _ => bail!("unexpected response to Metadata"),
    }
}

async fn list(conn: &mut Connection, timeout: Duration) -> anyhow::Result<()> {
    let response = metadata(conn, timeout, None).await?;
    let mut names: Vec<_> = response
        .topics
        .iter()
        .filter_map(|t| {
            t.name
                .as_ref()
                .map(|n| (n.as_str().to_string(), t.partitions.len()))
        })
        .collect();
    names.sort();
    for (name, partitions) in names {
        println!("{name}\t{partitions} partition(s)");
    }
    Ok(())
}

async fn describe(conn: &mut Connection, timeout: Duration, name: &str) -> anyhow::Result<()> {
    let response = metadata(conn, timeout, Some(name)).await?;
    let Some(topic) = response.topics.first() else {
        bail!("the broker returned no metadata for {name:?}");
    };
    if topic.error_code != 0 {
        bail!(
            "cannot describe {name:?}: {}",
            error_text(topic.error_code, None)
        );
    }
    let mut partitions: Vec<i32> = topic.partitions.iter().map(|p| p.partition_index).collect();
    partitions.sort_unstable();
    let earliest = offsets(conn, timeout, name, &partitions, -2).await?;
    let latest = offsets(conn, timeout, name, &partitions, -1).await?;
    println!(
        "topic {name}  id {}  partitions {}",
        topic.topic_id,
        partitions.len()
    );
    println!(
        "{:>9}  {:>6}  {:>8}  {:>14}  {:>14}  {:>10}",
        "partition", "leader", "replicas", "start offset", "end offset", "records"
    );
    for p in topic.partitions.iter() {
        let replicas: Vec<String> = p
            .replica_nodes
            .iter()
            .map(|BrokerId(id)| id.to_string())
            .collect();
        let start = earliest.get(&p.partition_index).copied().unwrap_or(-1);
        let end = latest.get(&p.partition_index).copied().unwrap_or(-1);
        println!(
            "{:>9}  {:>6}  {:>8}  {:>14}  {:>14}  {:>10}",
            p.partition_index,
            p.leader_id.0,
            replicas.join(","),
            start,
            end,
            (end - start).max(0)
        );
    }
    topic_configs_cmd::print_configs(conn, timeout, name).await
}

async fn offsets(
    conn: &mut Connection,
    timeout: Duration,
    name: &str,
    partitions: &[i32],
    timestamp: i64,
) -> anyhow::Result<std::collections::HashMap<i32, i64>> {
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(topic_name(name))
            .with_partitions(
                partitions
                    .iter()
                    .map(|&p| {
                        ListOffsetsPartition::default()
                            .with_partition_index(p)
                            .with_timestamp(timestamp)
                    })
                    .collect(),
            )]);
    let ResponseKind::ListOffsets(response) = conn
        .call(RequestKind::ListOffsets(request), timeout)
        .await?
    else {
        bail!("unexpected response to ListOffsets");
    };
    Ok(response
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter())
        .filter(|p| p.error_code == 0)
        .map(|p| (p.partition_index, p.offset))
        .collect())
}

async fn delete(conn: &mut Connection, timeout: Duration, name: &str) -> anyhow::Result<()> {
    let request = DeleteTopicsRequest::default()
        .with_timeout_ms(timeout.as_millis() as i32)
        .with_topic_names(vec![topic_name(name)]);
    let ResponseKind::DeleteTopics(response) = conn
        .call(RequestKind::DeleteTopics(request), timeout)
        .await?
    else {
        bail!("unexpected response to DeleteTopics");
    };
    for r in response.responses {
        if r.error_code != 0 {
            bail!(
                "cannot delete topic {name:?}: {}",
                error_text(r.error_code, r.error_message.as_ref())
            );
        }
    }
    println!("deleted topic {name}");
    Ok(())
}
