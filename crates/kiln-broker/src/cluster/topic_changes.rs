//! Changes to an existing topic: its config (IncrementalAlterConfigs, AlterConfigs) and its
//! partition count (CreatePartitions). The controller validates and proposes them through the
//! metadata log; every broker's reconciler applies them to the replicas it holds (new roll
//! settings on open logs, replicas for new partitions), and retention reads the topic's new
//! settings on its next tick.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::metadata::{self, Command, TopicRecord};
use super::{write, Cluster, ClusterError, ClusterTopic};
use crate::topic_config::{self, PARTITIONS_PER_TOPIC_MAX};

/// Whether the reconciler has to act on a topic record it already opened.
pub(super) fn changed(topic: &ClusterTopic, record: &TopicRecord) -> bool {
    topic.overrides != record.overrides || topic.assignments.len() != record.assignments.len()
}

impl Cluster {
    /// Replaces a topic's overrides with what `change` makes of the current ones, through the
    /// metadata log. Controller only; `change` runs under the controller lock, so concurrent
    /// alters of one topic do not lose each other's keys.
    pub async fn alter_topic_config(
        &self,
        name: &str,
        validate_only: bool,
        change: impl FnOnce(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, ClusterError>,
    ) -> Result<(), ClusterError> {
        let _one_at_a_time = self.controller_lock.lock().await;
        let record = self.controlled_topic(name)?;
        let overrides = change(&record.overrides)?;
        topic_config::resolve(&self.log_defaults, self.default_max_batch_bytes, &overrides)
            .map_err(ClusterError::InvalidConfig)?;
        if validate_only || overrides == record.overrides {
            return Ok(());
        }
        self.propose(&Command::AlterTopicConfig {
            name: name.to_string(),
            id: record.id,
            overrides,
        })
        .await
    }

    /// Raises a topic's partition count to `count`, through the metadata log. Controller only.
    /// New partitions keep the topic's replication factor and continue its assignment pattern.
    pub async fn create_partitions(
        &self,
        name: &str,
        count: i32,
        validate_only: bool,
    ) -> Result<(), ClusterError> {
        let _one_at_a_time = self.controller_lock.lock().await;
        let record = self.controlled_topic(name)?;
        let current = record.assignments.len();
        let wanted = u32::try_from(count).unwrap_or(0);
        if wanted as usize <= current {
            return Err(ClusterError::InvalidPartitions(format!(
                "topic {name:?} has {current} partitions; the new count {count} must be larger"
            )));
        }
        if wanted > PARTITIONS_PER_TOPIC_MAX {
            return Err(ClusterError::InvalidPartitions(format!(
                "partition count {count} is over the limit of {PARTITIONS_PER_TOPIC_MAX}"
            )));
        }
        if validate_only {
            return Ok(());
        }
        let mut ids: Vec<i32> = self.brokers.iter().map(|b| b.id).collect();
        ids.sort_unstable();
        let rf = record.assignments.first().map_or(1, Vec::len);
        // The rotation that put partition 0's preferred leader where it is.
        let rotation = record
            .assignments
            .first()
            .and_then(|r| r.first())
            .and_then(|leader| ids.iter().position(|id| id == leader))
            .unwrap_or(0);
        let all = metadata::assign(&ids, wanted, rf, rotation);
        let command = Command::AddPartitions {
            name: name.to_string(),
            id: record.id,
            from: u32::try_from(current).unwrap_or(u32::MAX),
            assignments: all[current..].to_vec(),
        };
        self.propose(&command).await?;
        self.wait_for_local_leaders(name).await;
        Ok(())
    }

    /// Brings an open topic in line with its record: new settings on every local replica, new
    /// partitions opened. The topic is replaced whole so readers see one consistent version.
    pub(super) async fn update_topic(&self, topic: &ClusterTopic, record: &TopicRecord) {
        let Some(settings) = self.resolve_settings(&topic.name, record) else {
            return;
        };
        let log = settings.log.to_log_config();
        let roll = kiln_log::RollSettings {
            segment_bytes: log.segment_bytes,
            segment_ms: log.segment_ms,
            index_interval_bytes: log.index_interval_bytes,
        };
        let mut replicas = topic.replicas.clone();
        for r in replicas.iter().flatten() {
            if let Err(e) = r.partition.set_roll(roll) {
                tracing::error!(topic = %topic.name, group = %r.group, error = %e, "cannot apply the new segment settings; the replica keeps its old ones");
            }
        }
        // Partitions are only ever added (CreatePartitions refuses to shrink, the command
        // only extends).
        if record.assignments.len() < replicas.len() {
            debug_assert!(
                false,
                "a topic record with fewer partitions than its open topic"
            );
            tracing::error!(topic = %topic.name, "the metadata log shrank a topic; ignored");
            return;
        }
        for index in replicas.len()..record.assignments.len() {
            replicas.push(
                self.open_partition(&topic.name, record, index, &settings)
                    .await,
            );
        }
        tracing::info!(topic = %topic.name, partitions = replicas.len(), overrides = ?record.overrides, "topic changed");
        write(&self.topics).insert(
            topic.name.clone(),
            Arc::new(ClusterTopic {
                name: topic.name.clone(),
                id: topic.id,
                overrides: record.overrides.clone(),
                settings,
                assignments: record.assignments.clone(),
                replicas,
                traffic: topic.traffic.clone(),
            }),
        );
    }
}
