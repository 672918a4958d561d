//! Registering this broker's data-directory incarnation in the metadata log, and answering
//! peers' Hellos with theirs (`cluster/join.rs` says why both exist).
//!
//! Only the controller can append to the metadata log, so a broker that is not the controller
//! registers by saying Hello to its peers: the controller, answering, proposes the
//! registration for it. A broker keeps saying Hello until its own table holds its incarnation.

use std::sync::Arc;
use std::time::Duration;

use kiln_raft::net::{Hello, HelloAnswer};

use super::metadata::Command;
use super::Cluster;

/// Pause between registration attempts.
const REGISTER_PAUSE: Duration = Duration::from_millis(500);
/// How long one Hello to a peer may take.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a seed may take to get a joining broker's registration committed.
const JOIN_WAIT: Duration = Duration::from_secs(10);

impl Cluster {
    /// The answer to a peer's Hello. The controller proposes the registration of a configured
    /// peer it does not know yet (at most one proposal per peer in flight).
    pub(super) fn answer_hello(self: &Arc<Self>, from: &Hello) -> HelloAnswer {
        let state = self.metadata_table.state();
        let sender = i32::try_from(from.sender).ok();
        let registered = sender.and_then(|s| state.brokers.get(&s).copied());
        let is_peer = sender.is_some_and(|s| self.founders.iter().any(|b| b.id == s));
        if let (Some(node), None, true) = (sender, registered, is_peer) {
            if state.cluster_id.is_some() && self.metadata.is_leader() {
                self.register(node, from.incarnation);
            }
        }
        HelloAnswer {
            node: u64::try_from(self.node_id).unwrap_or(0),
            cluster_id: state.cluster_id,
            sender_incarnation: registered,
        }
    }

    /// Proposes `RegisterBroker` in the background unless one for `node` is in flight.
    fn register(self: &Arc<Self>, node: i32, incarnation: u64) {
        if !self
            .registering
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node)
        {
            return;
        }
        let cluster = self.clone();
        tokio::spawn(async move {
            let command = Command::RegisterBroker {
                node,
                incarnation,
                addresses: None,
            };
            if let Err(e) = cluster.propose(&command).await {
                tracing::debug!(node, error = %e, "registering a broker failed; it will ask again");
            }
            cluster
                .registering
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&node);
        });
    }
}

/// Runs until this broker's incarnation is in its own metadata table (see the module docs).
pub(super) async fn register_self(cluster: Arc<Cluster>, incarnation: u64) {
    let me = cluster.node_id;
    let hello = Hello {
        sender: u64::try_from(me).unwrap_or(0),
        incarnation,
    };
    let mut joined = false;
    loop {
        let state = cluster.metadata_table.state();
        match state.brokers.get(&me) {
            Some(&registered) if registered == incarnation => {
                tracing::info!(
                    incarnation = format!("{incarnation:016x}"),
                    "this broker's data directory is registered"
                );
                return;
            }
            // join.rs refuses a new directory whose node id is registered under another
            // incarnation, and an old directory keeps its incarnation: this cannot happen
            // unless two directories run under one node id.
            Some(&registered) => {
                tracing::error!(
                    registered = format!("{registered:016x}"),
                    this = format!("{incarnation:016x}"),
                    "the cluster registered another data directory for this node id: two brokers may share it"
                );
                return;
            }
            None => {}
        }
        if cluster.settings.join {
            // Once taken, the registration reaches this broker's table when the metadata
            // group's leader has added it as a learner.
            if !joined {
                joined = join(&cluster, incarnation).await;
            }
        } else if state.cluster_id.is_some() {
            if cluster.metadata.is_leader() {
                cluster.register(me, incarnation);
            } else {
                for peer in cluster.settings.peers.iter().filter(|p| p.id != me) {
                    let to = super::peer_ref(&cluster.raft_transport, peer);
                    if let Err(e) = kiln_raft::net::hello(to, hello, HELLO_TIMEOUT).await {
                        tracing::debug!(peer = peer.id, error = %e, "registration hello");
                    }
                }
            }
        }
        tokio::time::sleep(REGISTER_PAUSE).await;
    }
}

/// A joining broker's registration, with its addresses (`membership.rs`): it knows no
/// controller yet (it has no metadata log), so it asks every seed; the controller among them
/// proposes it, the others refuse.
async fn join(cluster: &Arc<Cluster>, incarnation: u64) -> bool {
    let me = cluster.node_id;
    let Some(addresses) = cluster.own_addresses() else {
        debug_assert!(false, "config validation puts this broker among its peers");
        return false;
    };
    let command = Command::RegisterBroker {
        node: me,
        incarnation,
        addresses: Some(addresses),
    };
    let payload = match serde_json::to_vec(&command) {
        Ok(p) => bytes::Bytes::from(p),
        Err(e) => {
            debug_assert!(false, "a registration does not encode: {e}");
            return false;
        }
    };
    let mut refusals = Vec::new();
    for peer in cluster.settings.peers.iter().filter(|p| p.id != me) {
        let to = super::peer_ref(&cluster.raft_transport, peer);
        match kiln_raft::net::forward(to, kiln_raft::net::JOIN_GROUP, payload.clone(), JOIN_WAIT)
            .await
        {
            Ok(_) => {
                tracing::info!(
                    seed = peer.id,
                    "joined the cluster; waiting for its metadata log"
                );
                return true;
            }
            Err(e) => refusals.push(format!("broker {}: {e}", peer.id)),
        }
    }
    tracing::warn!(answers = ?refusals, "joining the cluster: no seed took the registration yet; retrying");
    false
}
