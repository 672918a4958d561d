//! Topic changes (topics created and deleted, config alterations, new partitions, moves)
//! that reach a broker which is not the controller. Kafka's brokers forward admin requests to their controller (KIP-590), and
//! clients count on it: the Java admin client and kafka-python send AlterConfigs and
//! IncrementalAlterConfigs to any broker, the least loaded one. So the broker forwards the
//! change over the Raft transport (a `Forward` frame addressed to [`TOPIC_CHANGES_GROUP`]),
//! the controller runs it exactly as if a client had sent it there, and its answer, error
//! kind included, travels back as the serialized [`ClusterError`].
//!
//! The answer comes once the controller has applied the change; the forwarding broker applies
//! it when its own copy of the metadata log gets there, a moment later (as in Kafka). A
//! forwarded change is not forwarded again: a broker that is no longer the controller answers
//! NOT_CONTROLLER, which clients retry.

use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::topic_changes::ConfigChange;
use super::{Cluster, ClusterError, NewTopic};

/// The `Forward` frame's group name for topic changes (no Raft group has this name).
pub(super) const TOPIC_CHANGES_GROUP: &str = "__topic_changes";
/// How long a forwarded change may take, the controller's own wait for its proposal included.
const FORWARD_WAIT: Duration = Duration::from_secs(35);

/// A change as forwarded: the arguments of the controller's own call.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum TopicChange {
    /// CreateTopics (`Cluster::create_topic`); `answer_within_ms`: what is left of the
    /// client's request timeout.
    CreateTopic {
        /// Flattened: the JSON is the one brokers exchanged before the struct existed.
        #[serde(flatten)]
        topic: NewTopic,
        answer_within_ms: u64,
    },
    /// DeleteTopics (`Cluster::delete_topic`).
    DeleteTopic { name: String },
    AlterConfig {
        name: String,
        changes: Vec<ConfigChange>,
        replace: bool,
        validate_only: bool,
    },
    CreatePartitions {
        name: String,
        count: i32,
        validate_only: bool,
    },
    /// AlterUserScramCredentials (`users.rs`).
    Scram { change: super::users::ScramChange },
    /// CreateAcls and DeleteAcls (`acls.rs`).
    Acls { change: super::acls::AclChange },
    /// AlterPartitionReassignments (`moves.rs`).
    Move {
        topic: String,
        partition: i32,
        target: Vec<i32>,
    },
    /// AlterPartitionReassignments with no replicas: a move called off (`moves.rs`).
    CancelMove { topic: String, partition: i32 },
    /// UnregisterBroker: decommission (`moves.rs`).
    Decommission { node: i32 },
}

impl Cluster {
    /// Sends `change` to the controller and waits for its answer.
    pub(super) async fn forward_topic_change(
        &self,
        change: TopicChange,
    ) -> Result<(), ClusterError> {
        let controller = self.controller();
        if controller < 0 || controller == self.node_id {
            // No controller known (an election under way), or this broker's stale belief that
            // it is one: the client refreshes its metadata and retries.
            return Err(ClusterError::NotController(controller));
        }
        let payload = serde_json::to_vec(&change)
            .map_err(|e| ClusterError::NotCommitted(format!("cannot encode the change: {e}")))?;
        tracing::debug!(
            controller,
            ?change,
            "forwarding a topic change to the controller"
        );
        self.forward_to(
            controller,
            TOPIC_CHANGES_GROUP,
            Bytes::from(payload),
            FORWARD_WAIT,
        )
        .await
        .map(|_answer| ())
        .map_err(|reason| {
            // The controller's own refusal parses; anything else is the transport's (the
            // controller unreachable or gone): retriable.
            serde_json::from_str::<ClusterError>(&reason).unwrap_or(ClusterError::NotCommitted(
                format!("forwarding to the controller (node {controller}): {reason}"),
            ))
        })
    }

    /// A change another broker forwarded: run here if this broker is the controller.
    pub(super) async fn take_topic_change(&self, payload: &[u8]) -> Result<Bytes, String> {
        let change: TopicChange = serde_json::from_slice(payload)
            .map_err(|e| format!("a forwarded topic change that does not parse: {e}"))?;
        tracing::debug!(?change, "a topic change forwarded by a peer");
        let result = match change {
            TopicChange::CreateTopic {
                topic,
                answer_within_ms,
            } => {
                self.create_topic_here(topic, Duration::from_millis(answer_within_ms))
                    .await
            }
            TopicChange::DeleteTopic { name } => self.delete_topic_here(&name).await,
            TopicChange::AlterConfig {
                name,
                changes,
                replace,
                validate_only,
            } => {
                self.alter_topic_config_here(&name, changes, replace, validate_only)
                    .await
            }
            TopicChange::CreatePartitions {
                name,
                count,
                validate_only,
            } => {
                self.create_partitions_here(&name, count, validate_only)
                    .await
            }
            TopicChange::Scram { change } => self.alter_scram_here(change).await,
            TopicChange::Acls { change } => self.change_acls_here(change).await,
            TopicChange::Move {
                topic,
                partition,
                target,
            } => self.move_replicas_here(&topic, partition, target).await,
            TopicChange::CancelMove { topic, partition } => {
                self.cancel_move_here(&topic, partition).await
            }
            TopicChange::Decommission { node } => self.decommission_here(node).await,
        };
        result
            .map(|()| Bytes::new())
            .map_err(|e| serde_json::to_string(&e).unwrap_or_else(|_| e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A broker that forwards CreateTopics sends the JSON it always sent: a controller of the
    /// previous release reads it, and so does this one.
    #[test]
    fn a_forwarded_create_topic_keeps_its_flat_json() {
        let earlier = r#"{"CreateTopic":{"name":"kiln.nodes","partitions":3,"replication_factor":null,"overrides":{"retention.ms":"1000"},"validate_only":false,"answer_within_ms":30000}}"#;
        let change: TopicChange = serde_json::from_str(earlier).unwrap();
        let TopicChange::CreateTopic {
            topic,
            answer_within_ms,
        } = &change
        else {
            panic!("not a CreateTopic: {change:?}");
        };
        assert_eq!(topic.name, "kiln.nodes");
        assert_eq!(topic.partitions, 3);
        assert_eq!(topic.overrides["retention.ms"], "1000");
        assert_eq!(*answer_within_ms, 30_000);
        assert_eq!(serde_json::to_string(&change).unwrap(), earlier);
    }
}
