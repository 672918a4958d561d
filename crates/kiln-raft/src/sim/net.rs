//! The simulated network: seeded delays and losses, cut links, replicas up or down.
//!
//! Every broker holds one replica of each Raft group (the data partition, group 0, and the
//! consumer offsets, group 1); both share the broker's links, so a cut or a crash hits both.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{Backoff, RPCOption};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{EmptyNode, RaftNetwork, RaftNetworkFactory};
use rand::Rng;

use crate::partition::{ReplicatedPartition, VoteRefused};
use crate::pulse::{BeatAnswer, BeatFuture, BeatItem, PulseGroups, PulseNetwork};
use crate::rng::StableRng;
use crate::types::{KilnRaft, NodeId};

pub(super) struct NetState {
    /// (group, broker) → the replica of that group the broker runs, while it is up.
    pub(super) up: BTreeMap<(usize, NodeId), ReplicatedPartition>,
    /// Cut links, stored as (low, high).
    pub(super) cut: BTreeSet<(NodeId, NodeId)>,
    rng: StableRng,
    pub(super) delay_max_ms: u64,
    pub(super) loss_percent: u32,
}

/// The simulated network: which replicas are up, which links are cut, delays and losses.
#[derive(Clone)]
pub struct SimRouter {
    state: Arc<Mutex<NetState>>,
}

pub(super) fn link(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    (a.min(b), a.max(b))
}

#[derive(Debug, thiserror::Error)]
#[error("simulated network: {0}")]
struct NetError(&'static str);

fn unreachable<E: std::error::Error>(why: &'static str) -> RPCError<NodeId, EmptyNode, E> {
    RPCError::Unreachable(Unreachable::new(&NetError(why)))
}

impl SimRouter {
    pub(super) fn new(seed: u64) -> SimRouter {
        SimRouter {
            state: Arc::new(Mutex::new(NetState {
                up: BTreeMap::new(),
                cut: BTreeSet::new(),
                rng: StableRng::seed(seed),
                delay_max_ms: 8,
                loss_percent: 1,
            })),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, NetState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The replicas of `group` that are up, in broker order.
    pub(super) fn replicas(&self, group: usize) -> Vec<ReplicatedPartition> {
        self.lock()
            .up
            .iter()
            .filter(|((g, _), _)| *g == group)
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// One network hop of `group`: a seeded delay, then whether it arrived (link up, not
    /// lost).
    async fn hop(&self, group: usize, from: NodeId, to: NodeId) -> bool {
        let (delay, lost) = {
            let mut s = self.lock();
            let max = s.delay_max_ms;
            let loss = s.loss_percent;
            let delay = s.rng.random_range(0..=max);
            let lost = s.rng.random_range(0..100) < loss;
            (delay, lost)
        };
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let s = self.lock();
        !lost
            && !s.cut.contains(&link(from, to))
            && s.up.contains_key(&(group, to))
            && s.up.contains_key(&(group, from))
    }

    async fn deliver<E: std::error::Error>(
        &self,
        group: usize,
        from: NodeId,
        to: NodeId,
    ) -> Result<ReplicatedPartition, RPCError<NodeId, EmptyNode, E>> {
        if !self.hop(group, from, to).await {
            return Err(unreachable("request lost"));
        }
        self.lock()
            .up
            .get(&(group, to))
            .cloned()
            .ok_or_else(|| unreachable("target down"))
    }

    async fn respond<E: std::error::Error>(
        &self,
        group: usize,
        from: NodeId,
        to: NodeId,
    ) -> Result<(), RPCError<NodeId, EmptyNode, E>> {
        if self.hop(group, to, from).await {
            Ok(())
        } else {
            Err(unreachable("response lost"))
        }
    }
}

/// openraft's network factory over [`SimRouter`].
pub struct SimNetworkFactory {
    pub(super) group: usize,
    pub(super) from: NodeId,
    pub(super) router: SimRouter,
}

/// One replica's connection to another of its group, over [`SimRouter`].
pub struct SimLink {
    group: usize,
    from: NodeId,
    to: NodeId,
    router: SimRouter,
}

impl RaftNetworkFactory<KilnRaft> for SimNetworkFactory {
    type Network = SimLink;

    async fn new_client(&mut self, target: NodeId, _node: &EmptyNode) -> SimLink {
        SimLink {
            group: self.group,
            from: self.from,
            to: target,
            router: self.router.clone(),
        }
    }
}

impl RaftNetwork<KilnRaft> for SimLink {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<KilnRaft>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId>>> {
        let target = self.router.deliver(self.group, self.from, self.to).await?;
        let resp = target
            .serve_append(rpc, tokio::time::Instant::now())
            .await
            .map_err(|_| unreachable("target stopped"))?;
        self.router.respond(self.group, self.from, self.to).await?;
        Ok(resp)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<KilnRaft>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, EmptyNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let target = self.router.deliver(self.group, self.from, self.to).await?;
        let resp = target
            .raft()
            .install_snapshot(rpc)
            .await
            .map_err(|_| unreachable("target stopped"))?;
        self.router.respond(self.group, self.from, self.to).await?;
        Ok(resp)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId>>> {
        let target = self.router.deliver(self.group, self.from, self.to).await?;
        // As `net::serve` does: a replica repairing damaged files grants no votes.
        if target.repairing() {
            return Err(unreachable("target is repairing"));
        }
        let resp = match target.serve_vote(rpc, tokio::time::Instant::now()).await {
            Ok(resp) => resp,
            Err(VoteRefused::Lease(_)) => return Err(unreachable("vote refused: lease")),
            Err(VoteRefused::Raft(_)) => return Err(unreachable("target stopped")),
        };
        self.router.respond(self.group, self.from, self.to).await?;
        Ok(resp)
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(Duration::from_millis(50)))
    }
}

impl PulseNetwork for SimRouter {
    /// One hop there, every item answered by the peer's replica of its group (none if that
    /// replica is down), one hop back; a lost hop loses the whole beat.
    fn beat(
        &self,
        from: NodeId,
        peer: NodeId,
        items: Vec<BeatItem>,
        deadline: tokio::time::Instant,
    ) -> BeatFuture {
        let router = self.clone();
        Box::pin(async move {
            let trip = async {
                let group = items
                    .first()
                    .and_then(|i| group_index(&i.group))
                    .unwrap_or(0);
                if !router.hop(group, from, peer).await {
                    return Err("beat lost".to_string());
                }
                let arrived = tokio::time::Instant::now();
                let answers: Vec<BeatAnswer> = {
                    let s = router.lock();
                    items
                        .iter()
                        .map(|item| {
                            group_index(&item.group)
                                .and_then(|g| s.up.get(&(g, peer)))
                                .map_or_else(BeatAnswer::default, |r| {
                                    r.serve_beat(from, item, arrived)
                                })
                        })
                        .collect()
                };
                if !router.hop(group, peer, from).await {
                    return Err("beat answer lost".to_string());
                }
                Ok(answers)
            };
            tokio::time::timeout_at(deadline, trip)
                .await
                .unwrap_or_else(|_| Err("beat timed out".to_string()))
        })
    }
}

/// A simulated group's name on the pulse: its index.
pub(super) fn group_name(group: usize) -> String {
    group.to_string()
}

fn group_index(name: &str) -> Option<usize> {
    name.parse().ok()
}

/// The replicas broker `node` runs, for its pulse.
pub(super) struct SimBroker {
    pub(super) node: NodeId,
    pub(super) router: SimRouter,
}

impl PulseGroups for SimBroker {
    fn each(&self, f: &mut dyn FnMut(&Arc<str>, &ReplicatedPartition)) {
        let replicas: Vec<(usize, ReplicatedPartition)> = self
            .router
            .lock()
            .up
            .iter()
            .filter(|((_, n), _)| *n == self.node)
            .map(|((g, _), r)| (*g, r.clone()))
            .collect();
        for (group, replica) in replicas {
            f(&Arc::from(group_name(group)), &replica);
        }
    }
}
