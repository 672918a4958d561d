//! Raft RPCs between brokers over TCP.
//!
//! Every broker has one listener ([`serve`]) shared by all its Raft groups (one per partition,
//! plus the metadata group); each RPC names its group (`"orders/3"`, `"__cluster_metadata/0"`)
//! and the node it is for. The sending side is openraft's network for one group
//! ([`TcpNetwork`], a [`TcpLink`] per target); every group's links share the broker's one
//! connection per peer ([`Mesh`], `net/mux.rs`), which carries many requests at once, each
//! answered by its id. Connections are plain TCP or
//! mutual TLS with the cluster CA (`net/transport.rs`). The wire format is in `net/codec.rs`;
//! docs/replication.md ("Transport") has the failure behaviour, docs/security.md the trust.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use tokio::time::Instant;

use crate::guard::ReplicaHealth;
use crate::partition::ReplicatedPartition;
use crate::pulse::{BeatAnswer, BeatItem};
use crate::types::{NodeId, Raft};

mod client;
pub(crate) mod codec;
mod mux;
mod server;
mod transport;

pub use client::{
    forward, hello, LinkCuts, MeshBeats, PeerRef, TcpLink, TcpNetwork, DEFAULT_CONNECT_TIMEOUT,
};
pub use codec::MAX_FRAME_BYTES;
pub use mux::{Mesh, IN_FLIGHT_MAX, OUTBOX_BYTES_MAX, RECONNECT_PAUSE, SILENCE_MAX};
pub use server::{
    serve, serve_with, Admits, ServeOptions, CONNECTIONS_PER_PEER_MAX, HANDSHAKES_MAX,
    HANDSHAKE_TIMEOUT, JOIN_GROUP,
};
pub use transport::Transport;

/// Where each peer's Raft listener is (`host:port`). Shared by every group of a broker.
/// A broker asking a peer who it is. `incarnation` names the sender's data directory: it is
/// drawn at random when the directory is created, so a broker whose disk was replaced comes
/// back under its old node id with a new incarnation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub sender: NodeId,
    pub incarnation: u64,
}

/// A peer's answer to a [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloAnswer {
    pub node: NodeId,
    /// The cluster the peer belongs to, once it knows it.
    pub cluster_id: Option<String>,
    /// The incarnation the peer's cluster has registered for the sender's node id: a different
    /// one than the sender's means the sender's data directory was lost.
    pub sender_incarnation: Option<u64>,
}

/// What [`RaftGroups::forward`] resolves to.
pub type ForwardFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<bytes::Bytes, String>> + Send>>;

pub type PeerAddrs = Arc<BTreeMap<NodeId, String>>;

/// The server side's view of a broker's groups: the Raft handle for a group name, if this
/// broker has created that group.
pub trait RaftGroups: Send + Sync + 'static {
    fn raft(&self, group: &str) -> Option<Raft>;

    /// The group's replica, if it is served with one: then its AppendEntries and votes go
    /// through [`ReplicatedPartition::serve_append`] and [`ReplicatedPartition::serve_vote`],
    /// which keep its liveness (`liveness.rs`), and beats reach it. `None` (the default) serves
    /// the Raft handle alone and answers beats with nothing accepted.
    fn replica(&self, _group: &str) -> Option<ReplicatedPartition> {
        None
    }

    /// Answers a beat from `sender` (`pulse.rs`), which arrived at `arrived`: each item by
    /// its group's replica, an unknown group's with nothing accepted.
    fn beat(&self, sender: NodeId, items: &[BeatItem], arrived: Instant) -> Vec<BeatAnswer> {
        items
            .iter()
            .map(|item| {
                self.replica(&item.group)
                    .map_or_else(BeatAnswer::default, |r| r.serve_beat(sender, item, arrived))
            })
            .collect()
    }

    /// The group's replica health ([`ReplicatedPartition::health`]). With it the server
    /// refuses vote requests while the replica repairs damaged files, and every request while
    /// its disk is full (its Raft core is stuck in a write; queued requests would only pile
    /// up). `None` (the default) means neither check is made: implement it.
    fn health(&self, _group: &str) -> Option<ReplicaHealth> {
        None
    }

    /// Does what a peer forwarded for `group` (see `codec.rs`, kind 10: a proposal for its
    /// leader, or a request the group name stands for) and answers with the bytes the group
    /// defines. The default refuses: implement it for the groups that take forwarded requests.
    fn forward(&self, group: &str, _payload: bytes::Bytes) -> ForwardFuture {
        let group = group.to_string();
        Box::pin(async move { Err(format!("group {group} takes no forwarded proposals")) })
    }

    /// The answer to a peer's [`Hello`]: this broker's node id, its cluster's id if it knows
    /// one, and the incarnation its cluster has registered for the sender, if any.
    fn hello(&self, _from: &Hello) -> HelloAnswer {
        HelloAnswer {
            node: 0,
            cluster_id: None,
            sender_incarnation: None,
        }
    }
}

/// A [`RaftGroups`] that groups are added to and removed from as they are created and dropped.
#[derive(Default)]
pub struct GroupTable {
    groups: RwLock<HashMap<String, Served>>,
}

/// How a group is served: by its Raft handle alone, or by its replica.
#[derive(Clone)]
enum Served {
    Raft(Raft),
    Replica(ReplicatedPartition),
}

impl Served {
    fn raft(&self) -> Raft {
        match self {
            Served::Raft(r) => r.clone(),
            Served::Replica(r) => r.raft().clone(),
        }
    }
}

impl GroupTable {
    pub fn new() -> Self {
        Self::default()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Served>> {
        self.groups.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Served>> {
        self.groups.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves `group` from `raft` (with no health checks and no liveness: prefer
    /// [`GroupTable::insert_replica`]); returns the handle it replaces, if any.
    pub fn insert(&self, group: impl Into<String>, raft: Raft) -> Option<Raft> {
        self.write()
            .insert(group.into(), Served::Raft(raft))
            .map(|s| s.raft())
    }

    /// Serves `group` from `replica`: votes refused while it repairs, every request while its
    /// disk is full, and its liveness kept.
    pub fn insert_replica(
        &self,
        group: impl Into<String>,
        replica: &ReplicatedPartition,
    ) -> Option<Raft> {
        self.write()
            .insert(group.into(), Served::Replica(replica.clone()))
            .map(|s| s.raft())
    }

    /// Stops serving `group`: its RPCs get "unknown group" from now on.
    pub fn remove(&self, group: &str) -> Option<Raft> {
        self.write().remove(group).map(|s| s.raft())
    }
}

impl RaftGroups for GroupTable {
    fn raft(&self, group: &str) -> Option<Raft> {
        self.read().get(group).map(Served::raft)
    }

    fn replica(&self, group: &str) -> Option<ReplicatedPartition> {
        match self.read().get(group) {
            Some(Served::Replica(r)) => Some(r.clone()),
            _ => None,
        }
    }

    fn health(&self, group: &str) -> Option<ReplicaHealth> {
        self.replica(group).map(|r| r.health())
    }
}
