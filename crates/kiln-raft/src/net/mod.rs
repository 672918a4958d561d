//! Raft RPCs between brokers over TCP.
//!
//! Every broker has one listener ([`serve`]) shared by all its Raft groups (one per partition,
//! plus the metadata group); each RPC names its group (`"orders/3"`, `"__cluster_metadata/0"`)
//! and the node it is for. The sending side is openraft's network for one group
//! ([`TcpNetwork`]), which keeps one TCP stream per target ([`TcpLink`]). The wire format is in
//! `net/codec.rs`; docs/replication.md ("Transport") has the failure behaviour.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use crate::types::{NodeId, Raft};

mod client;
pub(crate) mod codec;
mod server;

pub use client::{TcpLink, TcpNetwork, DEFAULT_CONNECT_TIMEOUT};
pub use codec::MAX_FRAME_BYTES;
pub use server::serve;

/// Where each peer's Raft listener is (`host:port`). Shared by every group of a broker.
pub type PeerAddrs = Arc<BTreeMap<NodeId, String>>;

/// The server side's view of a broker's groups: the Raft handle for a group name, if this
/// broker has created that group.
pub trait RaftGroups: Send + Sync + 'static {
    fn raft(&self, group: &str) -> Option<Raft>;
}

/// A [`RaftGroups`] that groups are added to and removed from as they are created and dropped.
#[derive(Default)]
pub struct GroupTable {
    groups: RwLock<HashMap<String, Raft>>,
}

impl GroupTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `group` from `raft`; returns the handle it replaces, if any.
    pub fn insert(&self, group: impl Into<String>, raft: Raft) -> Option<Raft> {
        self.groups
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(group.into(), raft)
    }

    /// Stops serving `group`: its RPCs get "unknown group" from now on.
    pub fn remove(&self, group: &str) -> Option<Raft> {
        self.groups
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(group)
    }
}

impl RaftGroups for GroupTable {
    fn raft(&self, group: &str) -> Option<Raft> {
        self.groups
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(group)
            .cloned()
    }
}
