//! Consumer lag, sampled over the Kafka protocol (ListGroups, FindCoordinator, OffsetFetch,
//! Metadata, ListOffsets with `kiln-client`), so it works against Kiln, Apache Kafka and
//! Redpanda alike. Lag of a partition = log end offset - the group's committed offset, in
//! records. The `burnin` group on `kiln.nodes` is always sampled; a partition it has never
//! committed counts from the log start (the agents' `auto.offset.reset` is `earliest`).
//! Other groups count only the partitions they have committed.
//!
//! The history lives only in memory (a bounded ring per series, see [`LagHistory`]): it
//! starts when the dashboard starts.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use anyhow::{bail, Context};
use kiln_client::kafka_protocol::messages::list_offsets_request::{
    ListOffsetsPartition, ListOffsetsTopic,
};
use kiln_client::kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kiln_client::kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup;
use kiln_client::kafka_protocol::messages::{
    ApiKey, BrokerId, FindCoordinatorRequest, GroupId, ListGroupsRequest, ListOffsetsRequest,
    MetadataRequest, OffsetFetchRequest, RequestKind, ResponseKind, TopicName,
};
use kiln_client::kafka_protocol::protocol::StrBytes;
use kiln_client::kafka_protocol::ResponseError;
use kiln_client::Connection;

/// The burn-in agents' group and topic: always sampled.
pub const BURNIN_GROUP: &str = "burnin";
pub const NODES_TOPIC: &str = "kiln.nodes";

/// One series: a group's lag on one partition.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeriesKey {
    pub group: String,
    pub topic: String,
    pub partition: i32,
}

impl SeriesKey {
    pub fn label(&self) -> String {
        format!("{} {}/{}", self.group, self.topic, self.partition)
    }
}

/// One partition's reading at one sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LagReading {
    pub key: SeriesKey,
    /// None: the group has not committed this partition (lag counted from the log start).
    pub committed: Option<i64>,
    pub log_end: i64,
    pub lag: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LagPoint {
    pub at_ms: i64,
    pub lag: i64,
}

/// Bounded in-memory lag history: at most `points_per_series` points per series (oldest
/// dropped first) and at most `max_series` series (new ones beyond that are not recorded and
/// counted in `dropped_series`), so memory stays bounded whatever the broker reports.
#[derive(Debug, Clone)]
pub struct LagHistory {
    pub started_ms: i64,
    pub points_per_series: usize,
    pub max_series: usize,
    pub series: BTreeMap<SeriesKey, VecDeque<LagPoint>>,
    /// The latest reading per series (committed offset and log end as well as lag).
    pub latest: BTreeMap<SeriesKey, LagReading>,
    pub last_sample_ms: Option<i64>,
    /// The last failed sample: when and why (cleared by the next good one).
    pub last_error: Option<(i64, String)>,
    pub dropped_series: usize,
}

impl LagHistory {
    pub fn new(started_ms: i64, points_per_series: usize, max_series: usize) -> LagHistory {
        LagHistory {
            started_ms,
            points_per_series: points_per_series.max(2),
            max_series,
            series: BTreeMap::new(),
            latest: BTreeMap::new(),
            last_sample_ms: None,
            last_error: None,
            dropped_series: 0,
        }
    }

    pub fn record(&mut self, at_ms: i64, readings: Vec<LagReading>) {
        for r in readings {
            if !self.series.contains_key(&r.key) && self.series.len() >= self.max_series {
                self.dropped_series += 1;
                continue;
            }
            let ring = self.series.entry(r.key.clone()).or_default();
            if ring.len() >= self.points_per_series {
                ring.pop_front();
            }
            ring.push_back(LagPoint { at_ms, lag: r.lag });
            self.latest.insert(r.key.clone(), r);
        }
        self.last_sample_ms = Some(at_ms);
        self.last_error = None;
    }

    pub fn record_error(&mut self, at_ms: i64, error: String) {
        self.last_error = Some((at_ms, error));
    }
}

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

fn error_name(code: i16) -> String {
    ResponseError::try_from_code(code).map_or_else(|| format!("error {code}"), |e| format!("{e:?}"))
}

/// Takes lag samples; keeps connections to the brokers it has talked to between samples.
pub struct LagSampler {
    bootstrap: String,
    timeout: Duration,
    conns: HashMap<String, Connection>,
}

impl LagSampler {
    pub fn new(bootstrap: impl Into<String>, timeout: Duration) -> LagSampler {
        LagSampler {
            bootstrap: bootstrap.into(),
            timeout,
            conns: HashMap::new(),
        }
    }

    async fn conn(&mut self, address: &str) -> anyhow::Result<&mut Connection> {
        if !self.conns.contains_key(address) {
            let conn = Connection::connect(address, self.timeout)
                .await
                .with_context(|| format!("connecting to {address}"))?;
            self.conns.insert(address.to_string(), conn);
        }
        match self.conns.get_mut(address) {
            Some(c) => Ok(c),
            None => bail!("no connection to {address}"),
        }
    }

    /// A request to `address`; a failed connection is dropped so the next sample reconnects.
    async fn call(&mut self, address: &str, body: RequestKind) -> anyhow::Result<ResponseKind> {
        let timeout = self.timeout;
        let result = self.conn(address).await?.call(body, timeout).await;
        if result.is_err() {
            self.conns.remove(address);
        }
        result.with_context(|| format!("request to {address}"))
    }

    async fn version(&mut self, address: &str, api: ApiKey) -> anyhow::Result<i16> {
        Ok(self.conn(address).await?.versions().pick(api)?)
    }

    /// One sample of every group's lag.
    pub async fn sample(&mut self) -> anyhow::Result<Vec<LagReading>> {
        let mut groups: BTreeSet<String> = self.list_groups().await?.into_iter().collect();
        groups.insert(BURNIN_GROUP.to_string());
        let mut committed: BTreeMap<SeriesKey, i64> = BTreeMap::new();
        for group in &groups {
            let coordinator = match self.coordinator(group).await {
                Ok(c) => c,
                // A group the coordinator does not know yet has nothing committed.
                Err(e) if group == BURNIN_GROUP => {
                    tracing::debug!("lag: no coordinator for {group}: {e:#}");
                    continue;
                }
                Err(e) => return Err(e),
            };
            for ((topic, partition), offset) in self.committed(&coordinator, group).await? {
                let key = SeriesKey {
                    group: group.clone(),
                    topic,
                    partition,
                };
                committed.insert(key, offset);
            }
        }
        let mut topics: BTreeSet<String> = committed.keys().map(|k| k.topic.clone()).collect();
        topics.insert(NODES_TOPIC.to_string());
        let metadata = self.metadata(&topics).await?;
        // burnin on every partition of kiln.nodes, committed or not.
        if let Some(parts) = metadata.get(NODES_TOPIC) {
            for p in parts.keys() {
                let key = SeriesKey {
                    group: BURNIN_GROUP.to_string(),
                    topic: NODES_TOPIC.to_string(),
                    partition: *p,
                };
                committed.entry(key).or_insert(-1);
            }
        }
        let mut wanted: BTreeMap<(String, i32), ()> = BTreeMap::new();
        for k in committed.keys() {
            wanted.insert((k.topic.clone(), k.partition), ());
        }
        let wanted: Vec<(String, i32)> = wanted.into_keys().collect();
        let ends = self.list_offsets(&metadata, &wanted, -1).await?;
        let uncommitted: Vec<(String, i32)> = committed
            .iter()
            .filter(|(_, o)| **o < 0)
            .map(|(k, _)| (k.topic.clone(), k.partition))
            .collect();
        let starts = self.list_offsets(&metadata, &uncommitted, -2).await?;
        let mut out = Vec::with_capacity(committed.len());
        for (key, offset) in committed {
            let tp = (key.topic.clone(), key.partition);
            // A topic deleted since the commit: no log end, no lag to show.
            let Some(&end) = ends.get(&tp) else { continue };
            let (committed, from) = if offset >= 0 {
                (Some(offset), offset)
            } else {
                (None, starts.get(&tp).copied().unwrap_or(0))
            };
            out.push(LagReading {
                key,
                committed,
                log_end: end,
                lag: (end - from).max(0),
            });
        }
        Ok(out)
    }

    async fn list_groups(&mut self) -> anyhow::Result<Vec<String>> {
        let bootstrap = self.bootstrap.clone();
        let ResponseKind::ListGroups(r) = self
            .call(
                &bootstrap,
                RequestKind::ListGroups(ListGroupsRequest::default()),
            )
            .await?
        else {
            bail!("unexpected response to ListGroups");
        };
        if r.error_code != 0 {
            bail!("ListGroups failed: {}", error_name(r.error_code));
        }
        Ok(r.groups.iter().map(|g| g.group_id.0.to_string()).collect())
    }

    async fn coordinator(&mut self, group: &str) -> anyhow::Result<String> {
        let bootstrap = self.bootstrap.clone();
        let version = self.version(&bootstrap, ApiKey::FindCoordinator).await?;
        let request = if version >= 4 {
            FindCoordinatorRequest::default().with_coordinator_keys(vec![s(group)])
        } else {
            FindCoordinatorRequest::default().with_key(s(group))
        };
        let ResponseKind::FindCoordinator(r) = self
            .call(&bootstrap, RequestKind::FindCoordinator(request))
            .await?
        else {
            bail!("unexpected response to FindCoordinator");
        };
        let (error, host, port) = match r.coordinators.first() {
            Some(c) if version >= 4 => (c.error_code, c.host.to_string(), c.port),
            _ => (r.error_code, r.host.to_string(), r.port),
        };
        if error != 0 {
            bail!("no coordinator for group {group:?}: {}", error_name(error));
        }
        Ok(format!("{host}:{port}"))
    }

    /// (topic, partition) -> committed offset, for every partition the group committed.
    async fn committed(
        &mut self,
        coordinator: &str,
        group: &str,
    ) -> anyhow::Result<BTreeMap<(String, i32), i64>> {
        let version = self.version(coordinator, ApiKey::OffsetFetch).await?;
        // Topics `None` (not the default empty list) asks for every committed partition.
        let request = if version >= 8 {
            OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
                .with_group_id(GroupId(s(group)))
                .with_topics(None)])
        } else {
            OffsetFetchRequest::default()
                .with_group_id(GroupId(s(group)))
                .with_topics(None)
        };
        let ResponseKind::OffsetFetch(r) = self
            .call(coordinator, RequestKind::OffsetFetch(request))
            .await?
        else {
            bail!("unexpected response to OffsetFetch");
        };
        let mut out = BTreeMap::new();
        let mut add = |topic: String, partition: i32, offset: i64, code: i16| {
            if code == 0 && offset >= 0 {
                out.insert((topic, partition), offset);
            }
        };
        if version >= 8 {
            for g in &r.groups {
                if g.error_code != 0 {
                    bail!("OffsetFetch of {group:?}: {}", error_name(g.error_code));
                }
                for t in &g.topics {
                    for p in &t.partitions {
                        add(
                            t.name.0.to_string(),
                            p.partition_index,
                            p.committed_offset,
                            p.error_code,
                        );
                    }
                }
            }
        } else {
            if r.error_code != 0 {
                bail!("OffsetFetch of {group:?}: {}", error_name(r.error_code));
            }
            for t in &r.topics {
                for p in &t.partitions {
                    add(
                        t.name.0.to_string(),
                        p.partition_index,
                        p.committed_offset,
                        p.error_code,
                    );
                }
            }
        }
        Ok(out)
    }

    /// topic -> partition -> leader address, for the topics that exist.
    async fn metadata(
        &mut self,
        topics: &BTreeSet<String>,
    ) -> anyhow::Result<BTreeMap<String, BTreeMap<i32, String>>> {
        let bootstrap = self.bootstrap.clone();
        let request = MetadataRequest::default().with_topics(Some(
            topics
                .iter()
                .map(|t| MetadataRequestTopic::default().with_name(Some(TopicName(s(t)))))
                .collect(),
        ));
        let ResponseKind::Metadata(m) = self
            .call(&bootstrap, RequestKind::Metadata(request))
            .await?
        else {
            bail!("unexpected response to Metadata");
        };
        let brokers: HashMap<i32, String> = m
            .brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
            .collect();
        let mut out = BTreeMap::new();
        for t in &m.topics {
            let Some(name) = &t.name else { continue };
            // Unknown topics (kiln.nodes not created yet, a deleted topic) are left out.
            if t.error_code != 0 {
                continue;
            }
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    let leader = brokers
                        .get(&p.leader_id.0)
                        .cloned()
                        .unwrap_or_else(|| bootstrap.clone());
                    (p.partition_index, leader)
                })
                .collect();
            out.insert(name.0.to_string(), parts);
        }
        Ok(out)
    }

    /// ListOffsets (`-1` latest, `-2` earliest) for `partitions`, asked of each leader.
    async fn list_offsets(
        &mut self,
        metadata: &BTreeMap<String, BTreeMap<i32, String>>,
        partitions: &[(String, i32)],
        timestamp: i64,
    ) -> anyhow::Result<HashMap<(String, i32), i64>> {
        let mut by_leader: BTreeMap<String, BTreeMap<String, Vec<i32>>> = BTreeMap::new();
        for (topic, p) in partitions {
            let Some(leader) = metadata.get(topic).and_then(|ps| ps.get(p)) else {
                continue;
            };
            by_leader
                .entry(leader.clone())
                .or_default()
                .entry(topic.clone())
                .or_default()
                .push(*p);
        }
        let mut out = HashMap::new();
        for (leader, topics) in by_leader {
            let request = ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(
                    topics
                        .iter()
                        .map(|(t, ps)| {
                            ListOffsetsTopic::default()
                                .with_name(TopicName(s(t)))
                                .with_partitions(
                                    ps.iter()
                                        .map(|&p| {
                                            ListOffsetsPartition::default()
                                                .with_partition_index(p)
                                                .with_timestamp(timestamp)
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                );
            let ResponseKind::ListOffsets(r) = self
                .call(&leader, RequestKind::ListOffsets(request))
                .await?
            else {
                bail!("unexpected response to ListOffsets");
            };
            for t in &r.topics {
                for p in &t.partitions {
                    if p.error_code != 0 {
                        tracing::debug!(
                            "lag: ListOffsets {}/{}: {}",
                            t.name.0.as_str(),
                            p.partition_index,
                            error_name(p.error_code)
                        );
                        continue;
                    }
                    out.insert((t.name.0.to_string(), p.partition_index), p.offset);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(partition: i32, lag: i64) -> LagReading {
        LagReading {
            key: SeriesKey {
                group: "burnin".into(),
                topic: "kiln.nodes".into(),
                partition,
            },
            committed: Some(0),
            log_end: lag,
            lag,
        }
    }

    #[test]
    fn history_is_bounded_in_points_and_series() {
        let mut h = LagHistory::new(0, 3, 2);
        for i in 0..5 {
            h.record(
                i * 1000,
                vec![reading(0, i), reading(1, 10 + i), reading(2, 99)],
            );
        }
        assert_eq!(h.series.len(), 2, "third series refused");
        assert_eq!(h.dropped_series, 5);
        let lags: Vec<i64> = h
            .series
            .values()
            .next()
            .map_or(vec![], |r| r.iter().map(|p| p.lag).collect());
        assert_eq!(lags, [2, 3, 4], "oldest points dropped first");
        assert_eq!(h.last_sample_ms, Some(4000));
        h.record_error(5000, "broker down".into());
        assert!(h.last_error.is_some());
        h.record(6000, vec![]);
        assert!(h.last_error.is_none(), "a good sample clears the error");
    }
}
