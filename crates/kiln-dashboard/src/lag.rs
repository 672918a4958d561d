//! Consumer lag, sampled over the Kafka protocol (ListGroups, FindCoordinator, OffsetFetch,
//! Metadata, ListOffsets with `kiln-client`), so it works against Kiln, Apache Kafka and
//! Redpanda alike. Lag of a partition = log end offset - the group's committed offset, in
//! records. The `burnin` group on `kiln.nodes` is always sampled; a partition it has never
//! committed counts from the log start (the agents' `auto.offset.reset` is `earliest`).
//! Other groups count only the partitions they have committed.
//!
//! The history lives only in memory (a bounded ring per series, see [`LagHistory`]): it
//! starts when the dashboard starts.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use kiln_client::admin::{error_name, Cluster, Leaders, EARLIEST, LATEST};

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

/// Takes lag samples; keeps connections to the brokers it has talked to between samples.
pub struct LagSampler {
    cluster: Cluster,
}

impl LagSampler {
    /// Samples from `bootstrap`, over TLS and with a SASL login as `security` says.
    pub fn new(
        bootstrap: impl Into<String>,
        timeout: Duration,
        security: kiln_client::Security,
    ) -> LagSampler {
        LagSampler {
            cluster: Cluster::new(bootstrap, timeout).with_security(security),
        }
    }

    /// One sample of every group's lag.
    pub async fn sample(&mut self) -> anyhow::Result<Vec<LagReading>> {
        let mut groups: BTreeSet<String> = self
            .cluster
            .list_groups()
            .await?
            .into_iter()
            .map(|g| g.group_id)
            .collect();
        groups.insert(BURNIN_GROUP.to_string());
        let mut committed: BTreeMap<SeriesKey, i64> = BTreeMap::new();
        for group in &groups {
            let coordinator = match self.cluster.coordinator(group).await {
                Ok(c) => c,
                // A group the coordinator does not know yet has nothing committed.
                Err(e) if group == BURNIN_GROUP => {
                    tracing::debug!("lag: no coordinator for {group}: {e:#}");
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let offsets = self.cluster.committed(&coordinator, group, None).await?;
            // A partition whose offset could not be read is skipped rather than failing the
            // whole sample; the next sample asks again.
            for c in offsets.into_iter().filter(|c| c.error_code == 0) {
                if c.offset < 0 {
                    continue;
                }
                let key = SeriesKey {
                    group: group.clone(),
                    topic: c.topic,
                    partition: c.partition,
                };
                committed.insert(key, c.offset);
            }
        }
        let mut topics: BTreeSet<String> = committed.keys().map(|k| k.topic.clone()).collect();
        topics.insert(NODES_TOPIC.to_string());
        // Unknown topics (kiln.nodes not created yet, a deleted topic) are left out.
        let leaders: BTreeMap<String, Leaders> = self
            .cluster
            .metadata(topics.iter().map(String::as_str))
            .await?
            .into_iter()
            .filter_map(|(topic, leaders)| Some((topic, leaders.ok()?)))
            .collect();
        // burnin on every partition of kiln.nodes, committed or not.
        if let Some(parts) = leaders.get(NODES_TOPIC) {
            for p in parts.keys() {
                let key = SeriesKey {
                    group: BURNIN_GROUP.to_string(),
                    topic: NODES_TOPIC.to_string(),
                    partition: *p,
                };
                committed.entry(key).or_insert(-1);
            }
        }
        let wanted: BTreeSet<(String, i32)> = committed
            .keys()
            .map(|k| (k.topic.clone(), k.partition))
            .collect();
        let wanted: Vec<(String, i32)> = wanted.into_iter().collect();
        let ends = self.offsets(&leaders, &wanted, LATEST).await?;
        let uncommitted: Vec<(String, i32)> = committed
            .iter()
            .filter(|(_, o)| **o < 0)
            .map(|(k, _)| (k.topic.clone(), k.partition))
            .collect();
        let starts = self.offsets(&leaders, &uncommitted, EARLIEST).await?;
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

    /// ListOffsets for `partitions`; a partition its leader answered with an error is left
    /// out (logged), as if its topic were gone.
    async fn offsets(
        &mut self,
        leaders: &BTreeMap<String, Leaders>,
        partitions: &[(String, i32)],
        timestamp: i64,
    ) -> anyhow::Result<BTreeMap<(String, i32), i64>> {
        let answered = self
            .cluster
            .list_offsets(leaders, partitions, timestamp)
            .await?;
        let mut out = BTreeMap::new();
        for ((topic, partition), offset) in answered {
            match offset {
                Ok(offset) => {
                    out.insert((topic, partition), offset);
                }
                Err(code) => {
                    tracing::debug!("lag: ListOffsets {topic}/{partition}: {}", error_name(code));
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
