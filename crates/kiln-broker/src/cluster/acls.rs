//! ACLs: the bindings live in the metadata log (`Command::Acls`), so every broker authorizes
//! against the same set, and CreateAcls or DeleteAcls at any broker reaches the controller as
//! any other metadata change does (proposed there, or forwarded: `forwarded.rs`).
//!
//! DeleteAcls: the broker that took the request finds the bindings its filters select in its
//! own copy of the table and asks the controller to delete exactly those. A binding created a
//! moment earlier at another broker that this broker has not applied yet is not deleted;
//! Kafka's brokers answer from their own copy the same way.

use serde::{Deserialize, Serialize};

use super::forwarded::TopicChange;
use super::metadata::Command;
use super::{Cluster, ClusterError};

/// One CreateAcls or DeleteAcls, as proposed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AclChange {
    pub create: Vec<kiln_acl::Binding>,
    pub delete: Vec<kiln_acl::Binding>,
}

impl Cluster {
    pub fn authorize(&self, request: kiln_acl::Request<'_>, allow_everyone: bool) -> bool {
        self.metadata_table.authorize(request, allow_everyone)
    }

    pub fn authorize_any(
        &self,
        principal: &str,
        host: &str,
        operation: kiln_acl::Operation,
        resource_type: kiln_acl::ResourceType,
    ) -> bool {
        self.metadata_table
            .authorize_any(principal, host, operation, resource_type)
    }

    /// The bindings `filter` selects, as this broker has applied the metadata log.
    pub fn acls_matching(&self, filter: &kiln_acl::Filter) -> Vec<kiln_acl::Binding> {
        self.metadata_table.acls_matching(filter)
    }

    /// Applies `change` through the metadata log; forwarded to the controller from any other
    /// broker.
    pub async fn change_acls(&self, change: AclChange) -> Result<(), ClusterError> {
        if change.create.is_empty() && change.delete.is_empty() {
            return Ok(());
        }
        if !self.metadata.is_leader() {
            return self
                .forward_topic_change(TopicChange::Acls { change })
                .await;
        }
        self.change_acls_here(change).await
    }

    pub(super) async fn change_acls_here(&self, change: AclChange) -> Result<(), ClusterError> {
        for b in &change.create {
            b.validate()
                .map_err(|e| ClusterError::InvalidRequest(format!("ACL {b}: {e}")))?;
        }
        let _one_at_a_time = self.controller_lock.lock().await;
        let after = self.metadata_table.acl_count() + change.create.len();
        if after.saturating_sub(change.delete.len()) > kiln_acl::BINDINGS_MAX {
            return Err(ClusterError::InvalidRequest(format!(
                "the cluster would hold more than {} ACLs, its limit",
                kiln_acl::BINDINGS_MAX
            )));
        }
        self.propose(&Command::Acls {
            create: change.create,
            delete: change.delete,
        })
        .await
    }
}
