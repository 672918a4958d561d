//! Who the cluster's brokers are. The founders are the brokers in every founding broker's
//! `[[cluster.peers]]`; a broker that joins later (`[cluster] join = true`) registers its
//! addresses in the metadata log (`RegisterBroker` with addresses), and a decommissioned one
//! is removed there (`RemoveBroker`, `moves.rs`). Every broker derives the same list from
//! its config and its copy of the table: the brokers clients are told about, where Raft
//! traffic goes (`Mesh::set_peers`), and who the Raft listener refuses.
//!
//! A joining broker holds no replica of the internal groups at first, so it cannot read the
//! metadata log: the leader of each internal group adds every registered broker that is not
//! yet a member as a learner ([`add_learners`]). A learner receives the log and counts
//! toward no quorum; a move (`moves.rs`) makes it a voter.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::metadata::{BrokerAddresses, Command, MetadataState};
use super::{read, replica, write, Cluster, PeerBroker};
use crate::config::split_host_port;

/// How often an internal group's leader looks for brokers to add as learners.
const LEARNER_POLL: Duration = Duration::from_secs(1);
/// Longest wait for one learner to be added (a membership entry committed).
const ADD_LEARNER_WAIT: Duration = Duration::from_secs(10);

/// A broker as clients see it, from the addresses it registered; `None` (logged) where they
/// do not parse (written by a broker of another version).
fn joined_broker(id: i32, a: &BrokerAddresses) -> Option<PeerBroker> {
    let parsed = split_host_port(&a.kafka).and_then(|(host, port)| {
        let mut listeners = crate::listeners::Endpoints::new();
        for (name, address) in &a.listeners {
            listeners.insert(name.clone(), split_host_port(address)?);
        }
        Ok(PeerBroker {
            id,
            host,
            port,
            listeners,
        })
    });
    match parsed {
        Ok(b) => Some(b),
        Err(e) => {
            tracing::error!(node = id, error = %e, "a joined broker's addresses do not parse; it is left out");
            None
        }
    }
}

impl Cluster {
    /// Brings the broker list, the Raft peers' addresses and the members in line with
    /// `state` (the reconciler calls this on every change).
    pub(super) fn note_membership(&self, state: &MetadataState) {
        let mut brokers: BTreeMap<i32, PeerBroker> =
            self.founders.iter().map(|b| (b.id, b.clone())).collect();
        for (id, a) in &state.joined {
            if let Some(b) = joined_broker(*id, a) {
                brokers.insert(*id, b);
            }
        }
        brokers.retain(|id, _| !state.removed.contains(id));
        let brokers: Vec<PeerBroker> = brokers.into_values().collect();
        if **read(&self.brokers) != brokers {
            tracing::info!(brokers = ?brokers.iter().map(|b| b.id).collect::<Vec<_>>(), "cluster brokers");
            *write(&self.brokers) = Arc::new(brokers);
        }
        let mut peers = BTreeMap::new();
        for p in &self.settings.peers {
            if let Some(n) = replica::node(p.id) {
                peers.insert(n, p.raft.clone());
            }
        }
        for (id, a) in &state.joined {
            if let Some(n) = replica::node(*id) {
                peers.insert(n, a.raft.clone());
            }
        }
        for id in &state.removed {
            if let Some(n) = replica::node(*id) {
                peers.remove(&n);
            }
        }
        if *self.raft_mesh.peers() != peers {
            self.raft_mesh.set_peers(Arc::new(peers.clone()));
        }
        let mut members: BTreeSet<kiln_raft::NodeId> = peers.keys().copied().collect();
        members.extend(state.brokers.keys().filter_map(|id| replica::node(*id)));
        for id in &state.removed {
            if let Some(n) = replica::node(*id) {
                members.remove(&n);
            }
        }
        if *read(&self.members) != members {
            *write(&self.members) = members;
        }
    }

    /// Brokers new replicas may be placed on: the cluster's, less those leaving.
    pub(super) fn assignable_brokers(&self) -> Vec<i32> {
        let leaving = self.metadata_table.leaving();
        self.brokers()
            .iter()
            .map(|b| b.id)
            .filter(|id| !leaving.contains(id))
            .collect()
    }

    /// Where broker `id`'s Raft listener is, if it is a member.
    pub(super) fn raft_address(&self, id: i32) -> Option<String> {
        let node = replica::node(id)?;
        self.raft_mesh.peers().get(&node).cloned()
    }

    /// Forwards `payload` for `group` to broker `id` over the Raft transport.
    pub(super) async fn forward_to(
        &self,
        id: i32,
        group: &str,
        payload: Bytes,
        wait: Duration,
    ) -> Result<Bytes, String> {
        let addr = self
            .raft_address(id)
            .ok_or_else(|| format!("broker {id} is not a member of this cluster"))?;
        let node = replica::node(id).ok_or_else(|| format!("broker id {id} is negative"))?;
        let peer = kiln_raft::net::PeerRef {
            transport: &self.raft_transport,
            node,
            addr: &addr,
        };
        kiln_raft::net::forward(peer, group, payload, wait).await
    }

    /// This broker's addresses, as a joining broker registers them (its own `[[cluster.peers]]`
    /// entry).
    pub(super) fn own_addresses(&self) -> Option<BrokerAddresses> {
        let me = self.settings.peers.iter().find(|p| p.id == self.node_id)?;
        Some(BrokerAddresses {
            kafka: me.kafka.clone(),
            raft: me.raft.clone(),
            listeners: me.listeners.clone(),
        })
    }

    /// A joining broker's registration, forwarded to [`kiln_raft::net::JOIN_GROUP`]: proposed
    /// if this broker is the controller and the registration may be.
    pub(super) async fn take_join(&self, payload: &[u8]) -> Result<Bytes, String> {
        let command: Command = serde_json::from_slice(payload)
            .map_err(|e| format!("a request to join that does not parse: {e}"))?;
        self.registration_allowed(&command)?;
        self.propose_forwarded(&command).await
    }

    /// Whether a forwarded registration may be proposed: a broker joining with its addresses,
    /// not removed, and not registered under another incarnation.
    pub(super) fn registration_allowed(&self, command: &Command) -> Result<(), String> {
        let Command::RegisterBroker {
            node,
            incarnation,
            addresses: Some(addresses),
        } = command
        else {
            return Err("only a registration with addresses may be forwarded".into());
        };
        if *node < 0 {
            return Err(format!("broker id {node} is negative"));
        }
        let state = self.metadata_table.state();
        if state.removed.contains(node) {
            return Err(format!(
                "broker {node} was removed from this cluster; give the new broker a new node id"
            ));
        }
        if let Some(registered) = state.brokers.get(node) {
            if registered != incarnation {
                return Err(format!(
                    "broker {node} is registered with another data directory (incarnation {registered:016x})"
                ));
            }
        }
        if self.founders.iter().any(|b| b.id == *node) {
            return Err(format!(
                "broker {node} is a founding broker; it does not join, it registers itself"
            ));
        }
        split_host_port(&addresses.kafka).map_err(|e| format!("kafka address: {e}"))?;
        split_host_port(&addresses.raft).map_err(|e| format!("raft address: {e}"))?;
        Ok(())
    }
}

/// Runs on every broker: as leader of an internal group, adds each broker of the cluster that
/// is not a member of it as a learner, one at a time, so a joining broker gets the metadata
/// and offsets logs.
pub(super) async fn add_learners(cluster: Arc<Cluster>) {
    loop {
        tokio::time::sleep(LEARNER_POLL).await;
        for group in [cluster.metadata.clone(), cluster.offsets.clone()] {
            if !group.is_leader() {
                continue;
            }
            let raft = group.partition.raft().clone();
            let (nodes, voters) = {
                let m = raft.metrics();
                let m = m.borrow();
                let membership = m.membership_config.membership();
                let nodes: BTreeSet<kiln_raft::NodeId> =
                    membership.nodes().map(|(n, _)| *n).collect();
                let voters: BTreeSet<kiln_raft::NodeId> = membership.voter_ids().collect();
                (nodes, voters)
            };
            let wanted: BTreeSet<kiln_raft::NodeId> = cluster
                .assignable_brokers()
                .into_iter()
                .filter_map(replica::node)
                .collect();
            // A learner of a broker that left: replicating to it is wasted.
            let gone: BTreeSet<kiln_raft::NodeId> = nodes
                .iter()
                .filter(|n| !voters.contains(n) && !wanted.contains(n))
                .copied()
                .collect();
            if !gone.is_empty() {
                tracing::info!(group = %group.group, learners = ?gone, "removing the learners of brokers that left");
                let removed = tokio::time::timeout(
                    ADD_LEARNER_WAIT,
                    raft.change_membership(openraft::ChangeMembers::RemoveNodes(gone), false),
                )
                .await;
                if !matches!(removed, Ok(Ok(_))) {
                    tracing::info!(group = %group.group, "removing learners failed; will retry");
                }
                continue;
            }
            let Some(node) = wanted.into_iter().find(|n| !nodes.contains(n)) else {
                continue;
            };
            tracing::info!(group = %group.group, node, "adding a broker as a learner");
            let added = tokio::time::timeout(
                ADD_LEARNER_WAIT,
                raft.add_learner(node, openraft::EmptyNode {}, false),
            )
            .await;
            match added {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::info!(group = %group.group, node, error = %e, "adding a learner failed; will retry")
                }
                Err(_) => {
                    tracing::info!(group = %group.group, node, "adding a learner timed out; will retry")
                }
            }
        }
    }
}
