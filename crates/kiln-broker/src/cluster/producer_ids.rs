//! Producer ids for idempotent producers (InitProducerId). They come in blocks allocated through
//! the metadata log (`AllocateProducerIds`), so no two brokers, and no two runs of one broker,
//! ever hand out the same id: a broker takes a new block after every start and whenever its
//! block runs out. Only the controller appends to the metadata log; another broker forwards
//! its request there over the Raft transport (`kiln_raft::net::forward`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::metadata::Command;
use super::{Cluster, ClusterError, METADATA_GROUP};

/// Producer ids per block (Kafka's ProducerIdManager hands out 1,000 at a time too).
pub const PRODUCER_ID_BLOCK: u32 = 1000;
/// Longest wait for a block: the controller's append, and this broker applying it.
const BLOCK_WAIT: Duration = Duration::from_secs(10);

/// This broker's current block: the next id and the end (exclusive).
#[derive(Default)]
pub(super) struct Cursor {
    next: i64,
    end: i64,
}

impl Cluster {
    /// A producer id no other producer of the cluster has had.
    pub async fn next_producer_id(&self) -> Result<i64, ClusterError> {
        let mut cursor = self.producer_ids.lock().await;
        if cursor.next >= cursor.end {
            let (first, count) = self.new_block().await?;
            cursor.next = first;
            cursor.end = first + i64::from(count);
        }
        let id = cursor.next;
        cursor.next += 1;
        debug_assert!(cursor.next <= cursor.end);
        Ok(id)
    }

    /// Asks for a new block (itself as controller, else through the controller) and waits for
    /// it to be applied here.
    async fn new_block(&self) -> Result<(i64, u32), ClusterError> {
        let before = self
            .metadata_table
            .state()
            .producer_id_blocks
            .get(&self.node_id)
            .copied();
        let command = Command::AllocateProducerIds {
            node: self.node_id,
            count: PRODUCER_ID_BLOCK,
        };
        if self.metadata.is_leader() {
            self.propose(&command).await?;
        } else {
            let controller = self.controller();
            if controller < 0 || controller == self.node_id {
                return Err(ClusterError::NotController(controller));
            }
            let payload = serde_json::to_vec(&command)
                .map_err(|e| ClusterError::NotCommitted(e.to_string()))?;
            self.forward_to(controller, METADATA_GROUP, Bytes::from(payload), BLOCK_WAIT)
                .await
                .map_err(ClusterError::NotCommitted)?;
        }
        let mut changes = self.metadata_table.subscribe();
        let me = self.node_id;
        let newer = |s: &super::metadata::MetadataState| {
            s.producer_id_blocks
                .get(&me)
                .copied()
                .filter(|b| Some(b.0) > before.map(|b| b.0))
        };
        let applied = async {
            loop {
                if let Some(block) = newer(&changes.borrow_and_update()) {
                    return Some(block);
                }
                if changes.changed().await.is_err() {
                    return None;
                }
            }
        };
        match tokio::time::timeout(BLOCK_WAIT, applied).await {
            Ok(Some(block)) => Ok(block),
            _ => Err(ClusterError::Timeout),
        }
    }

    /// What another broker forwarded (`RaftGroups::forward`): a topic change
    /// (`forwarded.rs`), or a producer id block or fence (`fence.rs`) for a configured peer,
    /// only on the controller; or preferred leader elections (`elect.rs`), on any broker.
    pub(super) async fn take_forwarded(
        self: Arc<Self>,
        group: String,
        payload: Bytes,
    ) -> Result<Bytes, String> {
        if group == super::forwarded::TOPIC_CHANGES_GROUP {
            return self.take_topic_change(&payload).await;
        }
        if group == super::elect::ELECT_GROUP {
            return self.take_elections(&payload).await;
        }
        if group == kiln_raft::net::JOIN_GROUP {
            return self.take_join(&payload).await;
        }
        if group != METADATA_GROUP {
            return Err(format!("group {group} takes no forwarded proposals"));
        }
        let command: Command = serde_json::from_slice(&payload)
            .map_err(|e| format!("a forwarded proposal that does not parse: {e}"))?;
        match command {
            Command::AllocateProducerIds { node, count } => {
                if !self.brokers().iter().any(|b| b.id == node) || count != PRODUCER_ID_BLOCK {
                    return Err(format!(
                        "a block of {count} producer ids for node {node} is not one to give"
                    ));
                }
            }
            Command::Fence { node, .. } if !self.fence_for_peer(&command) => {
                return Err(format!("a fence for node {node}, which is not a peer"));
            }
            Command::Fence { .. } => {}
            Command::FinishMove { .. } => self.finish_allowed(&command)?,
            _ => {
                return Err(
                    "only producer id blocks, fences and finished moves may be forwarded".into(),
                )
            }
        }
        self.propose_forwarded(&command).await
    }

    /// Proposes a forwarded command the caller has checked, if this broker is the controller.
    pub(super) async fn propose_forwarded(&self, command: &Command) -> Result<Bytes, String> {
        if !self.metadata.is_leader() {
            return Err(format!(
                "not the controller; the controller is {}",
                self.controller()
            ));
        }
        self.propose(command)
            .await
            .map(|()| Bytes::new())
            .map_err(|e| e.to_string())
    }
}
