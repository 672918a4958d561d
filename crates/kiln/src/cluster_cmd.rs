//! `kiln cluster`: operations on a replicated cluster over the Kafka protocol.
//!
//! `elect-leaders` sends ElectLeaders (preferred) to any broker: each named partition's
//! leadership goes back to its preferred replica (the first of its replicas) if that replica
//! is in sync, as the leader balance does on its own every `leader_rebalance_interval_ms`
//! (docs/replication.md, "Leader balance"). Works against Kafka brokers too.
//!
//! `reassign`, `decommission` and `status` move replicas (`cluster_moves.rs`).

use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
use kafka_protocol::messages::{ElectLeadersRequest, RequestKind, ResponseKind};
use kafka_protocol::ResponseError;
use kiln_client::Connection;

use crate::broker_address::BrokerAddress;
use crate::cluster_moves;
use crate::topics_cmd::{error_text, metadata, topic_name};

/// Longest `--wait-s` (the brokers cap their own wait at 60 s).
const WAIT_S_MAX: u64 = 60;
/// ElectLeaders' election type for the preferred replica.
const PREFERRED: i8 = 0;

#[derive(Args, Debug)]
pub struct ClusterArgs {
    #[command(flatten)]
    broker: BrokerAddress,
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Move leadership back to each partition's preferred replica (the first of its replicas)
    /// now, for every partition, a topic's, or some of a topic's. Exits 1 if any partition
    /// could not be moved (its preferred replica down or behind, or no leader at the moment).
    ElectLeaders {
        /// Only this topic's partitions (repeat for several topics).
        #[arg(long = "topic", value_name = "TOPIC")]
        topics: Vec<String>,
        /// Only these partitions of the one --topic (repeat for several).
        #[arg(long = "partition", value_name = "N", requires = "topics")]
        partitions: Vec<i32>,
        /// How long the brokers may take to move every leader, in seconds (at most 60).
        #[arg(long, default_value_t = 30)]
        wait_s: u64,
    },
    /// Move one partition's replicas to the given brokers (the first is the preferred
    /// leader). The group keeps a majority throughout; a new broker counts toward nothing
    /// until it holds the log. With --cancel, call off the partition's move under way: it
    /// goes back to the replicas it had.
    Reassign {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        partition: i32,
        /// Broker ids, comma-separated: `--replicas 1,2,4`.
        #[arg(
            long,
            value_delimiter = ',',
            required_unless_present = "cancel",
            conflicts_with = "cancel"
        )]
        replicas: Vec<i32>,
        /// Call off the move under way instead (its new brokers are removed again).
        #[arg(long)]
        cancel: bool,
        /// Wait until the move has ended, printing progress.
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this many seconds.
        #[arg(long, default_value_t = 3600)]
        wait_s: u64,
    },
    /// Decommission a broker: every replica it holds (the cluster's metadata and offsets
    /// logs included) moves to the other brokers, then it is removed from the cluster. Works
    /// with the broker dead (its disk lost): the others hold a majority of each of its groups.
    Decommission {
        /// The broker's node id.
        node: i32,
        /// Wait until the broker is removed, printing progress.
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this many seconds.
        #[arg(long, default_value_t = 3600)]
        wait_s: u64,
    },
    /// The cluster's brokers and the replica moves under way.
    Status,
}

pub async fn run(args: ClusterArgs) -> anyhow::Result<bool> {
    let timeout = args.broker.timeout();
    let mut conn = args.broker.connect().await?;
    match args.command {
        ClusterCommand::ElectLeaders {
            topics,
            partitions,
            wait_s,
        } => elect_leaders(&mut conn, timeout, &topics, &partitions, wait_s).await,
        ClusterCommand::Reassign {
            topic,
            partition,
            replicas,
            cancel,
            wait,
            wait_s,
        } => {
            check_wait(wait_s)?;
            let replicas = (!cancel).then_some(replicas.as_slice());
            cluster_moves::reassign(&mut conn, timeout, &topic, partition, replicas).await?;
            if wait {
                cluster_moves::wait(&mut conn, timeout, None, Duration::from_secs(wait_s)).await?;
            }
            Ok(true)
        }
        ClusterCommand::Decommission { node, wait, wait_s } => {
            check_wait(wait_s)?;
            cluster_moves::decommission(&mut conn, timeout, node).await?;
            if wait {
                cluster_moves::wait(&mut conn, timeout, Some(node), Duration::from_secs(wait_s))
                    .await?;
            }
            Ok(true)
        }
        ClusterCommand::Status => {
            cluster_moves::status(&mut conn, timeout, None).await?;
            Ok(true)
        }
    }
}

fn check_wait(wait_s: u64) -> anyhow::Result<()> {
    if wait_s == 0 || wait_s > cluster_moves::WAIT_S_MAX {
        bail!(
            "--wait-s must be 1 to {} seconds, not {wait_s}",
            cluster_moves::WAIT_S_MAX
        );
    }
    Ok(())
}

/// Sends ElectLeaders and prints a line per partition; whether every one ended well.
async fn elect_leaders(
    conn: &mut Connection,
    timeout: Duration,
    topics: &[String],
    partitions: &[i32],
    wait_s: u64,
) -> anyhow::Result<bool> {
    if wait_s == 0 || wait_s > WAIT_S_MAX {
        bail!("--wait-s must be 1 to {WAIT_S_MAX} seconds, not {wait_s}");
    }
    if !partitions.is_empty() && topics.len() != 1 {
        bail!(
            "--partition needs exactly one --topic ({} given)",
            topics.len()
        );
    }
    if let Some(p) = partitions.iter().find(|p| **p < 0) {
        bail!("--partition {p}: partitions are numbered from 0");
    }
    let named = if topics.is_empty() {
        None
    } else if !partitions.is_empty() {
        Some(vec![TopicPartitions::default()
            .with_topic(topic_name(&topics[0]))
            .with_partitions(partitions.to_vec())])
    } else {
        let mut named = Vec::with_capacity(topics.len());
        for t in topics {
            let count = partition_count(conn, timeout, t).await?;
            named.push(
                TopicPartitions::default()
                    .with_topic(topic_name(t))
                    .with_partitions((0..count).collect()),
            );
        }
        Some(named)
    };
    let wait = Duration::from_secs(wait_s);
    let request = ElectLeadersRequest::default()
        .with_election_type(PREFERRED)
        .with_topic_partitions(named)
        .with_timeout_ms(i32::try_from(wait.as_millis()).unwrap_or(i32::MAX));
    let ResponseKind::ElectLeaders(response) = conn
        .call(RequestKind::ElectLeaders(request), wait + timeout)
        .await
        .context("ElectLeaders")?
    else {
        bail!("unexpected response to ElectLeaders");
    };
    if response.error_code != 0 {
        bail!(
            "leader election refused: {}",
            error_text(response.error_code, None)
        );
    }
    let (mut elected, mut not_needed, mut failed) = (0usize, 0usize, 0usize);
    for t in &response.replica_election_results {
        for p in &t.partition_result {
            let what = if p.error_code == 0 {
                elected += 1;
                "elected its preferred replica".to_string()
            } else if p.error_code == ResponseError::ElectionNotNeeded.code() {
                not_needed += 1;
                "already led by its preferred replica".to_string()
            } else {
                failed += 1;
                error_text(p.error_code, p.error_message.as_ref())
            };
            println!("{}/{}: {what}", t.topic.as_str(), p.partition_id);
        }
    }
    println!(
        "{elected} elected, {not_needed} already led by their preferred replica, {failed} failed"
    );
    Ok(failed == 0)
}

async fn partition_count(
    conn: &mut Connection,
    timeout: Duration,
    topic: &str,
) -> anyhow::Result<i32> {
    let m = metadata(conn, timeout, Some(topic)).await?;
    let Some(t) = m.topics.first() else {
        bail!("the broker did not describe topic {topic:?}");
    };
    if t.error_code == ResponseError::UnknownTopicOrPartition.code() {
        bail!("no topic {topic:?}");
    }
    if t.error_code != 0 && t.partitions.is_empty() {
        bail!("topic {topic:?}: {}", error_text(t.error_code, None));
    }
    i32::try_from(t.partitions.len()).context("partition count")
}
