//! Changes to an existing topic: its config (IncrementalAlterConfigs, AlterConfigs) and its
//! partition count (CreatePartitions). The controller validates and proposes them through the
//! metadata log; any other broker forwards them to it (`forwarded.rs`), as Kafka's brokers
//! do. Every broker's reconciler applies them to the replicas it holds (new roll settings on
//! open logs, replicas for new partitions), and retention reads the topic's new settings on
//! its next tick.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::forwarded::TopicChange;
use super::metadata::{self, Command, MetadataState, TopicRecord};
use super::{write, Cluster, ClusterError, ClusterTopic};
use crate::topic_config::{self, LIST_CONFIG_KEYS, PARTITIONS_PER_TOPIC_MAX, TOPIC_CONFIG_KEYS};

/// Config changes one alteration of one topic may carry: a bound on the request (and on a
/// forwarded change, which the controller checks again).
pub const CONFIG_CHANGES_MAX: usize = 100;

/// A change to one topic's overrides: IncrementalAlterConfigs' operations; AlterConfigs is a
/// list of `Set` that replaces all of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConfigChange {
    Set(String, String),
    Delete(String),
    Append(String, String),
    Subtract(String, String),
}

/// Whether the reconciler has to act on a topic record it already opened: new overrides,
/// new partitions, replicas moved, or a move begun or ended (`moves`: every group's).
pub(super) fn changed(
    topic: &ClusterTopic,
    record: &TopicRecord,
    moves: &BTreeMap<String, Vec<i32>>,
) -> bool {
    topic.overrides != record.overrides
        || topic.assignments != record.assignments
        || topic.moves != super::moves::of_topic(record, moves)
}

impl Cluster {
    /// Replaces a topic's overrides with what `changes` make of the current ones (all of them
    /// when `replace`), through the metadata log; forwarded to the controller from any other
    /// broker.
    pub async fn alter_topic_config(
        &self,
        name: &str,
        changes: Vec<ConfigChange>,
        replace: bool,
        validate_only: bool,
    ) -> Result<(), ClusterError> {
        if !self.metadata.is_leader() {
            return self
                .forward_topic_change(TopicChange::AlterConfig {
                    name: name.to_string(),
                    changes,
                    replace,
                    validate_only,
                })
                .await;
        }
        self.alter_topic_config_here(name, changes, replace, validate_only)
            .await
    }

    /// [`Self::alter_topic_config`] on the controller. The changes apply under the controller
    /// lock, so concurrent alters of one topic do not lose each other's keys.
    pub(super) async fn alter_topic_config_here(
        &self,
        name: &str,
        changes: Vec<ConfigChange>,
        replace: bool,
        validate_only: bool,
    ) -> Result<(), ClusterError> {
        if changes.len() > CONFIG_CHANGES_MAX {
            return Err(ClusterError::InvalidRequest(format!(
                "{} config changes for one topic; the limit is {CONFIG_CHANGES_MAX}",
                changes.len()
            )));
        }
        let _one_at_a_time = self.controller_lock.lock().await;
        let record = self.controlled_topic(name)?;
        let overrides = apply_changes(&record.overrides, changes, replace)?;
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

    /// Raises a topic's partition count to `count`, through the metadata log; forwarded to the
    /// controller from any other broker. New partitions keep the topic's replication factor
    /// and continue its assignment pattern.
    pub async fn create_partitions(
        &self,
        name: &str,
        count: i32,
        validate_only: bool,
    ) -> Result<(), ClusterError> {
        if !self.metadata.is_leader() {
            return self
                .forward_topic_change(TopicChange::CreatePartitions {
                    name: name.to_string(),
                    count,
                    validate_only,
                })
                .await;
        }
        self.create_partitions_here(name, count, validate_only)
            .await
    }

    /// [`Self::create_partitions`] on the controller.
    pub(super) async fn create_partitions_here(
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
        let mut ids = self.assignable_brokers();
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
    /// partitions opened, replicas a move adds here opened and those it took away stopped and
    /// deleted. The topic is replaced whole so readers see one consistent version.
    pub(super) async fn update_topic(
        &self,
        topic: &ClusterTopic,
        record: &TopicRecord,
        state: &MetadataState,
    ) {
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
        for (index, slot) in replicas.iter_mut().enumerate() {
            match (slot.as_ref(), self.local_members(record, index, state)) {
                (Some(r), Some(members)) => r.set_members(members),
                (None, Some(_)) => {
                    *slot = self
                        .open_partition(&topic.name, record, index, &settings, state)
                        .await;
                }
                (Some(r), None) => {
                    self.remove_replica(r).await;
                    *slot = None;
                }
                (None, None) => {}
            }
        }
        for index in replicas.len()..record.assignments.len() {
            replicas.push(
                self.open_partition(&topic.name, record, index, &settings, state)
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
                moves: super::moves::of_topic(record, &state.moves),
                replicas,
                traffic: topic.traffic.clone(),
            }),
        );
    }
}

fn known_key(name: &str) -> Result<(), ClusterError> {
    if TOPIC_CONFIG_KEYS.contains(&name) {
        Ok(())
    } else {
        Err(ClusterError::InvalidConfig(format!(
            "unknown topic config {name:?}; supported: {}",
            TOPIC_CONFIG_KEYS.join(", ")
        )))
    }
}

/// The overrides after `changes`, which the caller validates with `topic_config::resolve`.
fn apply_changes(
    current: &BTreeMap<String, String>,
    changes: Vec<ConfigChange>,
    replace: bool,
) -> Result<BTreeMap<String, String>, ClusterError> {
    let mut next = if replace {
        BTreeMap::new()
    } else {
        current.clone()
    };
    for change in changes {
        match change {
            ConfigChange::Set(k, v) => {
                known_key(&k)?;
                next.insert(k, v);
            }
            ConfigChange::Delete(k) => {
                known_key(&k)?;
                next.remove(&k);
            }
            ConfigChange::Append(k, _) | ConfigChange::Subtract(k, _)
                if !LIST_CONFIG_KEYS.contains(&k.as_str()) =>
            {
                known_key(&k)?;
                return Err(ClusterError::InvalidRequest(format!(
                    "{k} is not a list config; APPEND and SUBTRACT apply to {} only",
                    LIST_CONFIG_KEYS.join(", ")
                )));
            }
            ConfigChange::Append(k, v) => {
                let mut items = list_value(&next, &k);
                if !items.contains(&v) {
                    items.push(v);
                }
                next.insert(k, items.join(","));
            }
            ConfigChange::Subtract(k, v) => {
                let mut items = list_value(&next, &k);
                items.retain(|i| *i != v);
                next.insert(k, items.join(","));
            }
        }
    }
    Ok(next)
}

/// A list config's items; the default of the only list config (cleanup.policy) is "delete".
fn list_value(overrides: &BTreeMap<String, String>, key: &str) -> Vec<String> {
    overrides
        .get(key)
        .map_or("delete", String::as_str)
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn changes_set_delete_and_lists() {
        let current: BTreeMap<String, String> =
            [("retention.ms".to_string(), "5".to_string())].into();
        let next = apply_changes(
            &current,
            vec![
                ConfigChange::Set("segment.bytes".into(), "9000".into()),
                ConfigChange::Delete("retention.ms".into()),
                ConfigChange::Append("cleanup.policy".into(), "delete".into()),
            ],
            false,
        )
        .unwrap();
        assert_eq!(next.get("segment.bytes").map(String::as_str), Some("9000"));
        assert!(!next.contains_key("retention.ms"));
        assert_eq!(
            next.get("cleanup.policy").map(String::as_str),
            Some("delete")
        );
        let err = apply_changes(
            &current,
            vec![ConfigChange::Append("retention.ms".into(), "1".into())],
            false,
        )
        .unwrap_err();
        assert!(matches!(err, ClusterError::InvalidRequest(_)), "{err}");
        let err = apply_changes(
            &current,
            vec![ConfigChange::Set("retention.typo".into(), "1".into())],
            false,
        )
        .unwrap_err();
        assert!(matches!(err, ClusterError::InvalidConfig(_)), "{err}");
        let replaced = apply_changes(
            &current,
            vec![ConfigChange::Set("segment.ms".into(), "10".into())],
            true,
        )
        .unwrap();
        assert_eq!(replaced.len(), 1);
    }
}
