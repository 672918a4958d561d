//! `kiln groups`: list, describe, reset offsets and delete consumer groups, over the Kafka
//! protocol only (ListGroups, DescribeGroups, OffsetFetch, ListOffsets, Fetch, OffsetCommit,
//! DeleteGroups), so it works against Apache Kafka and Redpanda as well as Kiln.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::{ArgGroup, Args, Subcommand};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    BrokerId, ConsumerProtocolAssignment, DeleteGroupsRequest, DescribeGroupsRequest, FetchRequest,
    GroupId, OffsetCommitRequest, RequestKind, ResponseKind, TopicName,
};
use kafka_protocol::protocol::Decodable;
use kafka_protocol::records::RecordBatchDecoder;
use kafka_protocol::ResponseError;
use kiln_client::admin::{error_name, str_bytes as s, Cluster, Leaders, EARLIEST, LATEST};

use crate::broker_address::BrokerAddress;

#[derive(Args, Debug)]
pub struct GroupsArgs {
    #[command(flatten)]
    broker: BrokerAddress,
    #[command(subcommand)]
    command: GroupsCommand,
}

#[derive(Subcommand, Debug)]
enum GroupsCommand {
    /// List consumer groups with their state.
    List,
    /// Show a group's members and assignments, and per partition its committed offset, the log
    /// end, and the lag in records and in seconds.
    Describe { group: String },
    /// Move a group's committed offsets. Refused while the group has live members.
    #[command(group(ArgGroup::new("target").required(true).args(["to_earliest", "to_latest", "to_datetime", "to_offset"])))]
    ResetOffsets {
        group: String,
        #[arg(long)]
        topic: String,
        /// Only these partitions (comma-separated); all of the topic's partitions by default.
        #[arg(long, value_delimiter = ',')]
        partitions: Vec<i32>,
        /// The first offset still in the log.
        #[arg(long)]
        to_earliest: bool,
        /// The log end (skip everything not yet read).
        #[arg(long)]
        to_latest: bool,
        /// The first record with a timestamp at or after this ISO 8601 time
        /// (2024-05-01T12:00:00Z, 2024-05-01T14:00:00+02:00; no zone means UTC).
        #[arg(long, value_name = "ISO")]
        to_datetime: Option<String>,
        /// This offset (clamped into the range the log holds).
        #[arg(long, value_name = "N")]
        to_offset: Option<i64>,
        /// Print what would change without committing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete a group (it must have no members) and its committed offsets.
    Delete { group: String },
}

pub async fn run(args: GroupsArgs) -> anyhow::Result<()> {
    let timeout = args.broker.timeout();
    let security = args.broker.security()?;
    let mut cluster = Cluster::new(args.broker.bootstrap, timeout).with_security(security);
    match args.command {
        GroupsCommand::List => list(&mut cluster).await,
        GroupsCommand::Describe { group } => describe(&mut cluster, &group).await,
        GroupsCommand::ResetOffsets {
            group,
            topic,
            partitions,
            to_earliest,
            to_latest,
            to_datetime,
            to_offset,
            dry_run,
        } => {
            let target = match (to_earliest, to_latest, to_datetime, to_offset) {
                (true, _, _, _) => Target::Earliest,
                (_, true, _, _) => Target::Latest,
                (_, _, Some(iso), _) => Target::Timestamp(
                    parse_iso8601_ms(&iso).with_context(|| format!("--to-datetime {iso:?}"))?,
                ),
                (_, _, _, Some(n)) => Target::Offset(n),
                _ => bail!("give one of --to-earliest, --to-latest, --to-datetime, --to-offset"),
            };
            reset_offsets(&mut cluster, &group, &topic, &partitions, target, dry_run).await
        }
        GroupsCommand::Delete { group } => delete(&mut cluster, &group).await,
    }
}

/// ListOffsets at `timestamp` for some partitions of one topic whose `leaders` are known:
/// partition -> offset (-1 when no record has a timestamp that late). Any partition's error
/// fails the whole call, as a reset must not go ahead on a guess.
async fn list_offsets(
    cluster: &mut Cluster,
    topic: &str,
    leaders: &Leaders,
    partitions: &[i32],
    timestamp: i64,
) -> anyhow::Result<BTreeMap<i32, i64>> {
    let leaders = BTreeMap::from([(topic.to_string(), leaders.clone())]);
    let wanted: Vec<(String, i32)> = partitions.iter().map(|p| (topic.to_string(), *p)).collect();
    let mut out = BTreeMap::new();
    for ((_, p), offset) in cluster.list_offsets(&leaders, &wanted, timestamp).await? {
        match offset {
            Ok(offset) => {
                out.insert(p, offset);
            }
            Err(code) => bail!("{topic}/{p}: ListOffsets failed: {}", error_name(code)),
        }
    }
    Ok(out)
}

/// The timestamp of the record at `offset` (Fetch from the leader; for batches this client
/// cannot decode, the batch's first timestamp).
async fn record_timestamp(
    cluster: &mut Cluster,
    leader: &str,
    topic: &str,
    partition: i32,
    offset: i64,
) -> anyhow::Result<Option<i64>> {
    let request = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(0)
        .with_max_bytes(256 * 1024)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(s(topic)))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(256 * 1024)])]);
    let ResponseKind::Fetch(r) = cluster.call(leader, RequestKind::Fetch(request)).await? else {
        bail!("unexpected response to Fetch");
    };
    let Some(p) = r.responses.first().and_then(|t| t.partitions.first()) else {
        return Ok(None);
    };
    if p.error_code != 0 {
        return Ok(None);
    }
    let Some(records) = p.records.clone() else {
        return Ok(None);
    };
    Ok(first_timestamp_at(records, offset))
}

fn first_timestamp_at(records: Bytes, offset: i64) -> Option<i64> {
    // Batch header: base offset (8) length (4) epoch (4) magic (1) crc (4) attributes (2)
    // last offset delta (4), then the first timestamp (8).
    let base_timestamp = records
        .get(27..35)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(i64::from_be_bytes)
        .filter(|ts| *ts >= 0);
    let mut buf = records;
    let mut batches = Vec::new();
    // A fetch may end in a partial batch; decode whole ones until the first failure.
    while !buf.is_empty() {
        match RecordBatchDecoder::decode(&mut buf) {
            Ok(set) => batches.push(set),
            Err(_) => break,
        }
    }
    batches
        .iter()
        .flat_map(|b| b.records.iter())
        .find(|r| r.offset >= offset)
        .map(|r| r.timestamp)
        .filter(|ts| *ts >= 0)
        .or(base_timestamp)
}

async fn list(cluster: &mut Cluster) -> anyhow::Result<()> {
    let mut groups = cluster.list_groups().await?;
    groups.sort_by(|a, b| a.group_id.cmp(&b.group_id));
    println!("{:<40}  {:<20}  PROTOCOL-TYPE", "GROUP", "STATE");
    for g in groups {
        println!(
            "{:<40}  {:<20}  {}",
            g.group_id,
            g.state.as_deref().unwrap_or("?"),
            g.protocol_type
        );
    }
    Ok(())
}

struct Member {
    id: String,
    client_id: String,
    host: String,
    partitions: Vec<(String, i32)>,
}

struct Described {
    state: String,
    protocol_type: String,
    protocol: String,
    members: Vec<Member>,
}

async fn describe_group(
    cluster: &mut Cluster,
    coordinator: &str,
    group: &str,
) -> anyhow::Result<Described> {
    let request = DescribeGroupsRequest::default().with_groups(vec![GroupId(s(group))]);
    let ResponseKind::DescribeGroups(r) = cluster
        .call(coordinator, RequestKind::DescribeGroups(request))
        .await?
    else {
        bail!("unexpected response to DescribeGroups");
    };
    let Some(g) = r.groups.into_iter().next() else {
        bail!("the broker returned nothing for group {group:?}");
    };
    if g.error_code != 0 {
        bail!(
            "cannot describe group {group:?}: {}",
            error_name(g.error_code)
        );
    }
    let members = g
        .members
        .into_iter()
        .map(|m| Member {
            id: m.member_id.to_string(),
            client_id: m.client_id.to_string(),
            host: m.client_host.to_string(),
            partitions: decode_assignment(&m.member_assignment),
        })
        .collect();
    Ok(Described {
        state: g.group_state.to_string(),
        protocol_type: g.protocol_type.to_string(),
        protocol: g.protocol_data.to_string(),
        members,
    })
}

fn decode_assignment(bytes: &Bytes) -> Vec<(String, i32)> {
    let mut buf = bytes.clone();
    let Some(version) = buf.get(..2).map(|v| i16::from_be_bytes([v[0], v[1]])) else {
        return Vec::new();
    };
    let _ = buf.split_to(2);
    let Ok(a) = ConsumerProtocolAssignment::decode(&mut buf, version.clamp(0, 3)) else {
        return Vec::new();
    };
    let mut out: Vec<(String, i32)> = a
        .assigned_partitions
        .into_iter()
        .flat_map(|tp| {
            let topic = tp.topic.0.to_string();
            tp.partitions.into_iter().map(move |p| (topic.clone(), p))
        })
        .collect();
    out.sort();
    out
}

/// Committed offsets of a group: (topic, partition) -> (offset, metadata). `topics` None = all.
/// Any partition's error fails the call: a partial table would read as "nothing committed".
async fn committed(
    cluster: &mut Cluster,
    coordinator: &str,
    group: &str,
    topics: Option<&BTreeMap<String, Vec<i32>>>,
) -> anyhow::Result<BTreeMap<(String, i32), (i64, String)>> {
    let mut out = BTreeMap::new();
    for c in cluster.committed(coordinator, group, topics).await? {
        if c.error_code != 0 {
            bail!(
                "OffsetFetch for group {group:?} failed: {}",
                error_name(c.error_code)
            );
        }
        if c.offset >= 0 {
            out.insert((c.topic, c.partition), (c.offset, c.metadata));
        }
    }
    Ok(out)
}

async fn describe(cluster: &mut Cluster, group: &str) -> anyhow::Result<()> {
    let coordinator = cluster.coordinator(group).await?;
    let d = describe_group(cluster, &coordinator, group).await?;
    let offsets = committed(cluster, &coordinator, group, None).await?;
    if d.state == "Dead" && offsets.is_empty() {
        bail!("group {group:?} does not exist (no members and no committed offsets)");
    }
    let protocol = match (d.protocol_type.as_str(), d.protocol.as_str()) {
        ("", _) => "-".to_string(),
        (t, "") => t.to_string(),
        (t, p) => format!("{t}/{p}"),
    };
    println!(
        "group {group}  state {}  protocol {protocol}  members {}  coordinator {coordinator}",
        d.state,
        d.members.len()
    );
    println!();
    println!(
        "{:<50}  {:<24}  {:<16}  ASSIGNMENT",
        "MEMBER", "CLIENT-ID", "HOST"
    );
    let mut owner: HashMap<(String, i32), String> = HashMap::new();
    for m in &d.members {
        let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for (t, p) in &m.partitions {
            by_topic.entry(t.as_str()).or_default().push(*p);
            owner.insert((t.clone(), *p), m.id.clone());
        }
        let assignment: Vec<String> = by_topic
            .iter()
            .map(|(t, ps)| {
                format!(
                    "{t}[{}]",
                    ps.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
                )
            })
            .collect();
        let host = if m.host.is_empty() {
            "-"
        } else {
            m.host.as_str()
        };
        let assignment = if assignment.is_empty() {
            "-".to_string()
        } else {
            assignment.join(" ")
        };
        println!(
            "{:<50}  {:<24}  {:<16}  {assignment}",
            m.id, m.client_id, host
        );
    }
    if d.members.is_empty() {
        println!("(no live members)");
    }
    println!();

    // Every partition the group has committed or been assigned.
    let mut partitions: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    for (t, p) in offsets.keys().chain(owner.keys()) {
        partitions.entry(t.clone()).or_default().insert(*p);
    }
    println!(
        "{:<30}  {:>9}  {:>12}  {:>12}  {:>10}  {:>12}  OWNER",
        "TOPIC", "PARTITION", "COMMITTED", "LOG-END", "LAG", "LAG-SECONDS"
    );
    let now = now_ms();
    for (topic, ps) in &partitions {
        let ps: Vec<i32> = ps.iter().copied().collect();
        let read = match cluster.leaders(topic).await {
            Ok(leaders) => list_offsets(cluster, topic, &leaders, &ps, LATEST)
                .await
                .map(|ends| (ends, leaders)),
            Err(e) => Err(e.into()),
        };
        let (ends, leaders) = match read {
            Ok(read) => read,
            Err(e) => {
                println!("{topic:<30}  (cannot read the topic: {e:#})");
                continue;
            }
        };
        for p in ps {
            let committed = offsets.get(&(topic.clone(), p)).map(|(o, _)| *o);
            let end = ends.get(&p).copied();
            let lag = match (committed, end) {
                (Some(c), Some(e)) => Some((e - c).max(0)),
                _ => None,
            };
            let lag_seconds = match (committed, lag, leaders.get(&p)) {
                (Some(c), Some(l), Some(leader)) if l > 0 => {
                    let leader = leader.clone();
                    match record_timestamp(cluster, &leader, topic, p, c).await {
                        Ok(Some(ts)) => format!("{:.1}", (now - ts).max(0) as f64 / 1000.0),
                        _ => "?".to_string(),
                    }
                }
                (Some(_), Some(_), _) => "0.0".to_string(),
                _ => "-".to_string(),
            };
            let show = |v: Option<i64>| v.map_or("-".to_string(), |v| v.to_string());
            println!(
                "{topic:<30}  {p:>9}  {:>12}  {:>12}  {:>10}  {lag_seconds:>12}  {}",
                show(committed),
                show(end),
                show(lag),
                owner.get(&(topic.clone(), p)).map_or("-", String::as_str)
            );
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy)]
enum Target {
    Earliest,
    Latest,
    Timestamp(i64),
    Offset(i64),
}

async fn reset_offsets(
    cluster: &mut Cluster,
    group: &str,
    topic: &str,
    only: &[i32],
    target: Target,
    dry_run: bool,
) -> anyhow::Result<()> {
    let coordinator = cluster.coordinator(group).await?;
    let d = describe_group(cluster, &coordinator, group).await?;
    if !d.members.is_empty() {
        let ids: Vec<&str> = d.members.iter().map(|m| m.id.as_str()).collect();
        bail!(
            "refusing to reset offsets of group {group:?}: it has {} live member(s) ({}), state {}. \
             Stop its consumers (or wait for their session timeout) and try again: offsets can only be \
             reset while the group is empty.",
            d.members.len(),
            ids.join(", "),
            d.state
        );
    }
    let leaders = cluster.leaders(topic).await?;
    let partitions: Vec<i32> = if only.is_empty() {
        leaders.keys().copied().collect()
    } else {
        for p in only {
            if !leaders.contains_key(p) {
                bail!(
                    "topic {topic:?} has no partition {p} (it has {})",
                    leaders.len()
                );
            }
        }
        only.to_vec()
    };
    let earliest = list_offsets(cluster, topic, &leaders, &partitions, EARLIEST).await?;
    let latest = list_offsets(cluster, topic, &leaders, &partitions, LATEST).await?;
    let by_time = match target {
        Target::Timestamp(ts) => {
            Some(list_offsets(cluster, topic, &leaders, &partitions, ts).await?)
        }
        _ => None,
    };
    let wanted: BTreeMap<String, Vec<i32>> =
        BTreeMap::from([(topic.to_string(), partitions.clone())]);
    let before = committed(cluster, &coordinator, group, Some(&wanted)).await?;

    let mut plan = Vec::with_capacity(partitions.len());
    for p in &partitions {
        let lo = earliest.get(p).copied().unwrap_or(0);
        let hi = latest.get(p).copied().unwrap_or(lo);
        let after = match target {
            Target::Earliest => lo,
            Target::Latest => hi,
            // No record that late: the end, as Kafka's tool does.
            Target::Timestamp(_) => by_time
                .as_ref()
                .and_then(|m| m.get(p).copied())
                .filter(|o| *o >= 0)
                .unwrap_or(hi),
            Target::Offset(n) => {
                let clamped = n.clamp(lo, hi);
                if clamped != n {
                    eprintln!("note: {topic}/{p}: offset {n} is outside the log [{lo}, {hi}]; using {clamped}");
                }
                clamped
            }
        };
        plan.push((
            *p,
            before.get(&(topic.to_string(), *p)).map(|(o, _)| *o),
            after,
        ));
    }

    println!(
        "{:<30}  {:>9}  {:>12}  {:>12}",
        "TOPIC", "PARTITION", "BEFORE", "AFTER"
    );
    for (p, b, a) in &plan {
        let b = b.map_or("-".to_string(), |v| v.to_string());
        println!("{topic:<30}  {p:>9}  {b:>12}  {a:>12}");
    }
    if dry_run {
        println!("dry run: nothing committed");
        return Ok(());
    }
    // Generation -1 with no member id is how Kafka's own tools commit for a group with no members.
    let request = OffsetCommitRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_generation_id_or_member_epoch(-1)
        .with_member_id(s(""))
        .with_retention_time_ms(-1)
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(s(topic)))
            .with_partitions(
                plan.iter()
                    .map(|(p, _, a)| {
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(*p)
                            .with_committed_offset(*a)
                            .with_committed_leader_epoch(-1)
                            .with_committed_metadata(Some(s("")))
                    })
                    .collect(),
            )]);
    let ResponseKind::OffsetCommit(r) = cluster
        .call(&coordinator, RequestKind::OffsetCommit(request))
        .await?
    else {
        bail!("unexpected response to OffsetCommit");
    };
    let failures: Vec<String> = r
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| (t.name.0.to_string(), p)))
        .filter(|(_, p)| p.error_code != 0)
        .map(|(t, p)| format!("{t}/{}: {}", p.partition_index, error_name(p.error_code)))
        .collect();
    if !failures.is_empty() {
        let hint = if r
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter())
            .any(|p| p.error_code == ResponseError::UnknownMemberId.code())
        {
            " (a consumer joined the group meanwhile: the reset is refused while it has live members)"
        } else {
            ""
        };
        bail!(
            "reset of group {group:?} failed: {}{hint}",
            failures.join(", ")
        );
    }
    println!(
        "reset {} partition(s) of {topic} for group {group}",
        plan.len()
    );
    Ok(())
}

async fn delete(cluster: &mut Cluster, group: &str) -> anyhow::Result<()> {
    let coordinator = cluster.coordinator(group).await?;
    let request = DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s(group))]);
    let ResponseKind::DeleteGroups(r) = cluster
        .call(&coordinator, RequestKind::DeleteGroups(request))
        .await?
    else {
        bail!("unexpected response to DeleteGroups");
    };
    for result in r.results {
        if result.error_code != 0 {
            bail!(
                "cannot delete group {group:?}: {}",
                error_name(result.error_code)
            );
        }
    }
    println!("deleted group {group}");
    Ok(())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Days from 1970-01-01 to the given civil date (proleptic Gregorian; Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Parses `YYYY-MM-DD[(T| )HH:MM[:SS[.fff]]][Z|±HH:MM|±HHMM]` to Unix milliseconds (no zone: UTC).
pub fn parse_iso8601_ms(text: &str) -> anyhow::Result<i64> {
    let t = text.trim();
    let bad = || anyhow::anyhow!("expected an ISO 8601 time like 2024-05-01T12:00:00Z");
    let num = |s: &str| -> anyhow::Result<i64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse::<i64>().map_err(|_| bad())
    };
    let (date, rest) = match t.find(['T', 't', ' ']) {
        Some(i) => (&t[..i], &t[i + 1..]),
        None => (t, ""),
    };
    let mut d = date.split('-');
    let (y, mo, da) = match (d.next(), d.next(), d.next(), d.next()) {
        (Some(y), Some(m), Some(d), None) if y.len() == 4 && m.len() == 2 && d.len() == 2 => {
            (num(y)?, num(m)?, num(d)?)
        }
        _ => return Err(bad()),
    };
    let days_in_month = match mo {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => return Err(anyhow::anyhow!("month {mo} is not 1-12")),
    };
    if !(1..=days_in_month).contains(&da) {
        return Err(anyhow::anyhow!("day {da} is not in month {mo}"));
    }
    // Split the zone off the time.
    let (time, offset_min) = if let Some(stripped) = rest.strip_suffix(['Z', 'z']) {
        (stripped, 0)
    } else if let Some(i) = rest.rfind(['+', '-']) {
        let (time, zone) = rest.split_at(i);
        let sign = if zone.starts_with('-') { -1 } else { 1 };
        let zone = zone[1..].replace(':', "");
        if zone.len() != 4 {
            return Err(bad());
        }
        let (h, m) = (num(&zone[..2])?, num(&zone[2..])?);
        if h > 23 || m > 59 {
            return Err(bad());
        }
        (time, sign * (h * 60 + m))
    } else {
        (rest, 0)
    };
    let (mut h, mut mi, mut sec, mut ms) = (0, 0, 0, 0);
    if !time.is_empty() {
        let (hms, frac) = match time.split_once(['.', ',']) {
            Some((a, b)) => (a, Some(b)),
            None => (time, None),
        };
        let parts: Vec<&str> = hms.split(':').collect();
        match parts.as_slice() {
            [hh, mm] if hh.len() == 2 && mm.len() == 2 => (h, mi) = (num(hh)?, num(mm)?),
            [hh, mm, ss] if hh.len() == 2 && mm.len() == 2 && ss.len() == 2 => {
                (h, mi, sec) = (num(hh)?, num(mm)?, num(ss)?)
            }
            _ => return Err(bad()),
        }
        if let Some(f) = frac {
            let digits: String = f.chars().take(3).collect();
            num(f)?;
            ms = num(&format!("{digits:0<3}"))?;
        }
        if h > 23 || mi > 59 || sec > 60 {
            return Err(bad());
        }
    }
    let days = days_from_civil(y, mo, da);
    Ok((((days * 24 + h) * 60 + mi) * 60 + sec) * 1000 + ms - offset_min * 60_000)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::parse_iso8601_ms;

    #[test]
    fn iso8601() {
        assert_eq!(parse_iso8601_ms("1970-01-01T00:00:00Z").unwrap(), 0);
        assert_eq!(parse_iso8601_ms("1970-01-01").unwrap(), 0);
        assert_eq!(
            parse_iso8601_ms("2024-05-01T12:00:00Z").unwrap(),
            1_714_564_800_000
        );
        assert_eq!(
            parse_iso8601_ms("2024-05-01T14:00:00+02:00").unwrap(),
            1_714_564_800_000
        );
        assert_eq!(
            parse_iso8601_ms("2024-05-01T07:30:00-0430").unwrap(),
            1_714_564_800_000
        );
        assert_eq!(
            parse_iso8601_ms("2024-05-01 12:00:00.250").unwrap(),
            1_714_564_800_250
        );
        assert_eq!(
            parse_iso8601_ms("2024-02-29T00:00").unwrap(),
            1_709_164_800_000
        );
        for bad in [
            "",
            "2024-13-01",
            "2023-02-29",
            "2024-05-01T25:00:00Z",
            "yesterday",
            "2024-05-01T12:00:00+2",
            "2024-5-1",
        ] {
            assert!(parse_iso8601_ms(bad).is_err(), "{bad}");
        }
    }
}
