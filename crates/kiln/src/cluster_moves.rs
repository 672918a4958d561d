//! `kiln cluster reassign | decommission | status`: replica moves over the Kafka protocol
//! (AlterPartitionReassignments, ListPartitionReassignments, UnregisterBroker, Metadata;
//! docs/replication.md, "Moving replicas"). `--wait` polls until the moves end, printing
//! what is left.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kafka_protocol::messages::alter_partition_reassignments_request::{
    ReassignablePartition, ReassignableTopic,
};
use std::collections::BTreeMap;

use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, BrokerId, DescribeLogDirsRequest,
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, RequestKind,
    ResponseKind, UnregisterBrokerRequest,
};
use kiln_client::Connection;

use crate::topics_cmd::{error_text, metadata, topic_name};

/// How often `--wait` asks again.
const POLL: Duration = Duration::from_secs(1);
/// Longest `--wait-s`.
pub const WAIT_S_MAX: u64 = 24 * 3600;

/// Starts moving `topic`/`partition` to `replicas`, or cancels its move under way (`None`).
pub async fn reassign(
    conn: &mut Connection,
    timeout: Duration,
    topic: &str,
    partition: i32,
    replicas: Option<&[i32]>,
) -> anyhow::Result<()> {
    if partition < 0 {
        bail!("--partition {partition}: partitions are numbered from 0");
    }
    if replicas.is_some_and(<[i32]>::is_empty) {
        bail!("--replicas needs at least one broker id");
    }
    let request = AlterPartitionReassignmentsRequest::default()
        .with_timeout_ms(i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX))
        .with_topics(vec![ReassignableTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(vec![ReassignablePartition::default()
                .with_partition_index(partition)
                .with_replicas(
                    replicas.map(|r| r.iter().map(|b| BrokerId(*b)).collect()),
                )])]);
    let ResponseKind::AlterPartitionReassignments(response) = conn
        .call(RequestKind::AlterPartitionReassignments(request), timeout)
        .await
        .context("AlterPartitionReassignments")?
    else {
        bail!("unexpected response to AlterPartitionReassignments");
    };
    if response.error_code != 0 {
        bail!(
            "move refused: {}",
            error_text(response.error_code, response.error_message.as_ref())
        );
    }
    for t in &response.responses {
        for p in &t.partitions {
            if p.error_code != 0 {
                bail!(
                    "{}/{}: {}",
                    t.name.as_str(),
                    p.partition_index,
                    error_text(p.error_code, p.error_message.as_ref())
                );
            }
        }
    }
    match replicas {
        Some(replicas) => println!("{topic}/{partition}: moving to brokers {replicas:?}"),
        None => println!("{topic}/{partition}: move cancelled, going back to the replicas it had"),
    }
    Ok(())
}

/// Starts decommissioning broker `node`.
pub async fn decommission(
    conn: &mut Connection,
    timeout: Duration,
    node: i32,
) -> anyhow::Result<()> {
    let request = UnregisterBrokerRequest::default().with_broker_id(BrokerId(node));
    let ResponseKind::UnregisterBroker(response) = conn
        .call(RequestKind::UnregisterBroker(request), timeout)
        .await
        .context("UnregisterBroker")?
    else {
        bail!("unexpected response to UnregisterBroker");
    };
    if response.error_code != 0 {
        bail!(
            "decommission of broker {node} refused: {}",
            error_text(response.error_code, response.error_message.as_ref())
        );
    }
    println!("broker {node}: decommissioning (its replicas move to the other brokers, then it is removed)");
    Ok(())
}

async fn list(
    conn: &mut Connection,
    timeout: Duration,
) -> anyhow::Result<ListPartitionReassignmentsResponse> {
    let request = ListPartitionReassignmentsRequest::default()
        .with_timeout_ms(i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX));
    let ResponseKind::ListPartitionReassignments(response) = conn
        .call(RequestKind::ListPartitionReassignments(request), timeout)
        .await
        .context("ListPartitionReassignments")?
    else {
        bail!("unexpected response to ListPartitionReassignments");
    };
    if response.error_code != 0 {
        bail!(
            "listing moves refused: {}",
            error_text(response.error_code, response.error_message.as_ref())
        );
    }
    Ok(response)
}

/// Bytes each broker holds of each named partition (DescribeLogDirs, asked of every broker;
/// one that does not answer is left out).
async fn sizes(
    brokers: &[(i32, String)],
    timeout: Duration,
    partitions: &BTreeMap<String, Vec<i32>>,
) -> BTreeMap<(String, i32, i32), i64> {
    let topics: Vec<DescribableLogDirTopic> = partitions
        .iter()
        .map(|(t, ps)| {
            DescribableLogDirTopic::default()
                .with_topic(topic_name(t))
                .with_partitions(ps.clone())
        })
        .collect();
    let mut out = BTreeMap::new();
    for (id, addr) in brokers {
        let Ok(mut conn) = Connection::connect(addr, timeout).await else {
            continue;
        };
        let request = DescribeLogDirsRequest::default().with_topics(Some(topics.clone()));
        let Ok(ResponseKind::DescribeLogDirs(r)) = conn
            .call(RequestKind::DescribeLogDirs(request), timeout)
            .await
        else {
            continue;
        };
        for dir in &r.results {
            for t in &dir.topics {
                for p in &t.partitions {
                    out.insert(
                        (t.name.as_str().to_string(), p.partition_index, *id),
                        p.partition_size,
                    );
                }
            }
        }
    }
    out
}

fn mib(bytes: i64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

/// Prints the brokers and the moves under way, with the bytes each new replica holds against
/// the most any current replica holds; returns the number of moves and whether `gone` (a
/// broker being decommissioned) is still listed.
pub async fn status(
    conn: &mut Connection,
    timeout: Duration,
    gone: Option<i32>,
) -> anyhow::Result<(usize, bool)> {
    let m = metadata(conn, timeout, None).await?;
    let mut brokers: Vec<i32> = m.brokers.iter().map(|b| b.node_id.0).collect();
    brokers.sort_unstable();
    println!("brokers: {brokers:?}, controller: {}", m.controller_id.0);
    let moves = list(conn, timeout).await?;
    let mut moving: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for t in &moves.topics {
        let partitions = t.partitions.iter().map(|p| p.partition_index).collect();
        moving.insert(t.name.as_str().to_string(), partitions);
    }
    let held = if moving.is_empty() {
        BTreeMap::new()
    } else {
        let addrs: Vec<(i32, String)> = m
            .brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
            .collect();
        sizes(&addrs, timeout, &moving).await
    };
    let mut count = 0;
    for t in &moves.topics {
        let name = t.name.as_str();
        for p in &t.partitions {
            count += 1;
            let ids = |v: &[BrokerId]| v.iter().map(|b| b.0).collect::<Vec<_>>();
            let size = |b: i32| held.get(&(name.to_string(), p.partition_index, b)).copied();
            let full = p
                .replicas
                .iter()
                .filter(|b| !p.adding_replicas.contains(b))
                .filter_map(|b| size(b.0))
                .max();
            let progress: Vec<String> = p
                .adding_replicas
                .iter()
                .map(|b| match (size(b.0), full) {
                    (Some(have), Some(full)) => format!(
                        "broker {} holds {:.1} of {:.1} MiB ({:.1} MiB to copy)",
                        b.0,
                        mib(have),
                        mib(full),
                        mib((full - have).max(0))
                    ),
                    _ => format!("broker {}: size not known yet", b.0),
                })
                .collect();
            println!(
                "  moving {name}/{}: replicas {:?}, adding {:?}, removing {:?}; {}",
                p.partition_index,
                ids(&p.replicas),
                ids(&p.adding_replicas),
                ids(&p.removing_replicas),
                progress.join("; ")
            );
        }
    }
    println!("{count} move(s) under way");
    Ok((count, gone.is_some_and(|g| brokers.contains(&g))))
}

/// Polls [`status`] until no move is under way and `gone` is no longer listed, or `wait`
/// passes (an error).
pub async fn wait(
    conn: &mut Connection,
    timeout: Duration,
    gone: Option<i32>,
    wait: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let (moves, listed) = status(conn, timeout, gone).await?;
        if moves == 0 && !listed {
            println!("done in {:.1} s", started.elapsed().as_secs_f64());
            return Ok(());
        }
        if started.elapsed() > wait {
            bail!("still {moves} move(s) under way after {wait:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}
