//! `kiln topics alter` and the config part of `kiln topics describe`: IncrementalAlterConfigs
//! and DescribeConfigs over the Kafka protocol (so they work against any Kafka broker too).

use std::time::Duration;

use anyhow::bail;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::{
    DescribeConfigsRequest, IncrementalAlterConfigsRequest, RequestKind, ResponseKind,
};
use kafka_protocol::protocol::StrBytes;
use kiln_client::Connection;

use crate::topics_cmd::error_text;

const RESOURCE_TOPIC: i8 = 2;
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
/// Kafka's config source for a topic's own setting (DescribeConfigs).
const SOURCE_DYNAMIC_TOPIC: i8 = 1;

/// Splits `--config KEY=VALUE` arguments (shared with `kiln topics create`).
pub fn parse_pairs(configs: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    configs
        .iter()
        .map(|c| match c.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim().to_string()))
            }
            _ => bail!("--config {c:?} is not KEY=VALUE"),
        })
        .collect()
}

/// Sets and deletes (back to the broker default) topic configs in one request.
pub async fn alter(
    conn: &mut Connection,
    timeout: Duration,
    name: &str,
    set: &[String],
    delete: &[String],
) -> anyhow::Result<()> {
    if set.is_empty() && delete.is_empty() {
        bail!("nothing to change: give --config KEY=VALUE or --delete-config KEY");
    }
    let mut configs: Vec<AlterableConfig> = parse_pairs(set)?
        .into_iter()
        .map(|(k, v)| {
            AlterableConfig::default()
                .with_name(StrBytes::from_string(k))
                .with_config_operation(OP_SET)
                .with_value(Some(StrBytes::from_string(v)))
        })
        .collect();
    configs.extend(delete.iter().map(|k| {
        AlterableConfig::default()
            .with_name(StrBytes::from_string(k.clone()))
            .with_config_operation(OP_DELETE)
            .with_value(None)
    }));
    let request = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(RESOURCE_TOPIC)
            .with_resource_name(StrBytes::from_string(name.to_string()))
            .with_configs(configs),
    ]);
    let ResponseKind::IncrementalAlterConfigs(response) = conn
        .call(RequestKind::IncrementalAlterConfigs(request), timeout)
        .await?
    else {
        bail!("unexpected response to IncrementalAlterConfigs");
    };
    for r in response.responses {
        if r.error_code != 0 {
            bail!(
                "cannot alter topic {name:?}: {}",
                error_text(r.error_code, r.error_message.as_ref())
            );
        }
    }
    println!("altered topic {name}");
    Ok(())
}

/// Prints a topic's effective configs, marking those the topic sets itself.
pub async fn print_configs(
    conn: &mut Connection,
    timeout: Duration,
    name: &str,
) -> anyhow::Result<()> {
    let request =
        DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(RESOURCE_TOPIC)
            .with_resource_name(StrBytes::from_string(name.to_string()))
            .with_configuration_keys(None)]);
    let ResponseKind::DescribeConfigs(response) = conn
        .call(RequestKind::DescribeConfigs(request), timeout)
        .await?
    else {
        bail!("unexpected response to DescribeConfigs");
    };
    for r in response.results {
        if r.error_code != 0 {
            bail!(
                "cannot describe the configs of {name:?}: {}",
                error_text(r.error_code, r.error_message.as_ref())
            );
        }
        println!("configs (* set on the topic):");
        for c in r.configs {
            let mark = if c.config_source == SOURCE_DYNAMIC_TOPIC {
                "*"
            } else {
                " "
            };
            let value = c.value.as_ref().map_or("(null)", |v| v.as_str());
            println!("  {mark} {} = {value}", c.name.as_str());
        }
    }
    Ok(())
}
