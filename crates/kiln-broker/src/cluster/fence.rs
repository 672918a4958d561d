//! The fence: a broker tells clients a topic does not exist only once it has caught up with the
//! metadata log.
//!
//! A restarted broker opens its metadata replica from disk and serves Kafka requests at once,
//! while what was committed during its absence is still on its way from the controller; until
//! then a topic created meanwhile looks absent, and a client told UNKNOWN_TOPIC_OR_PARTITION may
//! fail its messages for good (librdkafka's producer does). So every run of a broker proposes
//! `Fence { node, boot }` with a fresh `boot` through the controller (Kafka's KRaft brokers
//! fence themselves the same way until they have fetched up to the controller's high
//! watermark). Everything committed before the fence precedes it in the log, so once this
//! broker has applied and acted on its own fence, its view of topics is at least as new as
//! the controller's when the fence was written. Until then Metadata answers a topic it does not
//! know with the retriable LEADER_NOT_AVAILABLE.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::metadata::{Command, MetadataState};
use super::{Cluster, METADATA_GROUP};

/// Pause between attempts to get the fence written.
const FENCE_PAUSE: Duration = Duration::from_millis(200);
/// Longest wait for one forwarded proposal.
const FENCE_FORWARD_WAIT: Duration = Duration::from_secs(5);

impl Cluster {
    /// True once this run's fence is applied and acted on here (see the module docs).
    pub fn is_current(&self) -> bool {
        self.current.load(Ordering::Acquire)
    }

    /// Called by the reconciler after acting on `state`.
    pub(super) fn note_fence(&self, state: &MetadataState) {
        if state.fences.get(&self.node_id) == Some(&self.boot)
            && !self.current.swap(true, Ordering::AcqRel)
        {
            tracing::info!("caught up with the metadata log");
        }
    }

    /// Whether a forwarded command is a fence this controller may write: for a configured
    /// broker.
    pub(super) fn fence_for_peer(&self, command: &Command) -> bool {
        matches!(command, Command::Fence { node, .. } if self.brokers().iter().any(|b| b.id == *node))
    }
}

/// Runs until this run's fence is applied here.
pub(super) async fn fence_self(cluster: Arc<Cluster>) {
    let command = Command::Fence {
        node: cluster.node_id,
        boot: cluster.boot,
    };
    let payload = match serde_json::to_vec(&command) {
        Ok(p) => Bytes::from(p),
        Err(e) => {
            debug_assert!(false, "a fence does not encode: {e}");
            return;
        }
    };
    let mut changes = cluster.metadata_table.subscribe();
    while !cluster.is_current() {
        let state = changes.borrow_and_update().clone();
        if state.fences.get(&cluster.node_id) == Some(&cluster.boot) {
            // Written and applied; the reconciler sets `current` once it has acted on it.
            if changes.changed().await.is_err() {
                return;
            }
            continue;
        }
        if state.cluster_id.is_some() {
            if cluster.metadata.is_leader() {
                if let Err(e) = cluster.propose(&command).await {
                    tracing::debug!(error = %e, "writing this broker's fence failed; retrying");
                }
            } else {
                let controller = cluster.controller();
                if controller >= 0 {
                    if let Err(e) = cluster
                        .forward_to(
                            controller,
                            METADATA_GROUP,
                            payload.clone(),
                            FENCE_FORWARD_WAIT,
                        )
                        .await
                    {
                        tracing::debug!(controller, error = %e, "forwarding this broker's fence failed; retrying");
                    }
                }
            }
        }
        tokio::time::sleep(FENCE_PAUSE).await;
    }
}
