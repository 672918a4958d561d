//! The sending side: openraft's network factory, whose links share the broker's one connection
//! per peer (`net/mux.rs`), and the one-off exchanges (hello, forward) on short connections.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, PayloadTooLarge, RPCError, RaftError, Timeout, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RPCTypes};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{EmptyNode, RaftNetwork, RaftNetworkFactory};
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use super::codec::{self, Frame, KindName, Message};
use super::mux::{Mesh, MuxError};
use super::transport::Transport;
use super::{Hello, HelloAnswer, PeerAddrs};
use crate::pulse::{BeatFuture, BeatItem, PulseNetwork};
use crate::types::{KilnRaft, NodeId};

/// How long a connection attempt may take before the peer counts as unreachable.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The pause openraft takes before retrying a peer that was unreachable. Short enough that a
/// restarted broker is caught up quickly, long enough that a dead one costs each group a few
/// failed calls a second rather than a busy loop (the connection itself is retried at most
/// every `mux::RECONNECT_PAUSE`, for all groups at once).
const BACKOFF: Duration = Duration::from_millis(200);

/// openraft's network factory for one Raft group: every link it makes names the group in each
/// RPC and sends it over the broker's one connection to that peer ([`Mesh`]).
#[derive(Clone)]
pub struct TcpNetwork {
    group: Arc<str>,
    mesh: Arc<Mesh>,
    rpc_timeout: Duration,
    /// This node's id and the links a test has cut ([`LinkCuts`]), if any.
    cuts: Option<(NodeId, Arc<LinkCuts>)>,
}

/// A test hook: nodes whose Raft links are cut. Every RPC to or from an isolated node fails as
/// unreachable before anything is sent, as if the network between the brokers were down, while
/// the node itself runs on (its Kafka clients still reach it). Both directions need the hook in
/// both nodes' networks: each node's network sees only what it sends.
#[derive(Debug, Default)]
pub struct LinkCuts {
    isolated: std::sync::Mutex<std::collections::BTreeSet<NodeId>>,
}

impl LinkCuts {
    pub fn isolate(&self, node: NodeId) {
        self.lock().insert(node);
    }

    pub fn heal(&self, node: NodeId) {
        self.lock().remove(&node);
    }

    fn blocks(&self, from: NodeId, to: NodeId) -> bool {
        let isolated = self.lock();
        isolated.contains(&from) || isolated.contains(&to)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<NodeId>> {
        // A set of ids: a panic while it was held leaves it whole.
        self.isolated
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl TcpNetwork {
    /// A network for the group named `group` over the broker's connections `mesh`. Each RPC is
    /// bounded by `rpc_timeout` (or openraft's own deadline for it, if that is shorter).
    pub fn on(group: impl Into<String>, mesh: Arc<Mesh>, rpc_timeout: Duration) -> Self {
        TcpNetwork {
            group: Arc::from(group.into()),
            mesh,
            rpc_timeout,
            cuts: None,
        }
    }

    /// A network for the group named `group` with connections of its own (plain TCP), reaching
    /// node `n` at `peers[n]`: for a group that shares a process with no other.
    pub fn new(group: impl Into<String>, peers: PeerAddrs, rpc_timeout: Duration) -> Self {
        let mesh = Mesh::new(peers, Transport::Plain, DEFAULT_CONNECT_TIMEOUT);
        Self::on(group, Arc::new(mesh), rpc_timeout)
    }

    /// Carries this network's RPCs over `transport`, on connections of its own.
    pub fn with_transport(mut self, transport: Transport) -> Self {
        let mesh = Mesh::new(self.mesh.peers(), transport, self.mesh.connect_timeout());
        self.mesh = Arc::new(mesh);
        self
    }

    /// Subjects this network (node `from`'s) to `cuts` (a test hook).
    pub fn with_cuts(mut self, from: NodeId, cuts: Arc<LinkCuts>) -> Self {
        self.cuts = Some((from, cuts));
        self
    }

    /// Replaces the connection timeout ([`DEFAULT_CONNECT_TIMEOUT`] unless set), on
    /// connections of its own.
    pub fn with_connect_timeout(mut self, connect_timeout: Duration) -> Self {
        let mesh = Mesh::new(
            self.mesh.peers(),
            self.mesh.transport().clone(),
            connect_timeout,
        );
        self.mesh = Arc::new(mesh);
        self
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    /// The connections this network's RPCs travel on.
    pub fn mesh(&self) -> &Arc<Mesh> {
        &self.mesh
    }
}

impl RaftNetworkFactory<KilnRaft> for TcpNetwork {
    type Network = TcpLink;

    async fn new_client(&mut self, target: NodeId, _node: &EmptyNode) -> TcpLink {
        // No connection yet: openraft creates clients eagerly and expects them not to fail.
        TcpLink {
            group: self.group.clone(),
            target,
            mesh: self.mesh.clone(),
            rpc_timeout: self.rpc_timeout,
            cuts: self.cuts.clone(),
        }
    }
}

/// The pulse's beats (`pulse.rs`) over the broker's connections, cut where a test cut the
/// Raft links ([`LinkCuts`]) like every other Raft message.
pub struct MeshBeats {
    pub mesh: Arc<Mesh>,
    pub cuts: Option<Arc<LinkCuts>>,
}

impl PulseNetwork for MeshBeats {
    fn beat(
        &self,
        from: NodeId,
        peer: NodeId,
        items: Vec<BeatItem>,
        deadline: Instant,
    ) -> BeatFuture {
        let mesh = self.mesh.clone();
        let cut = self.cuts.as_ref().is_some_and(|c| c.blocks(from, peer));
        Box::pin(async move {
            if cut {
                return Err("link cut (test hook)".to_string());
            }
            let want = items.len();
            let request = Message::Beat {
                sender: from,
                items,
            };
            match mesh.call(peer, "", &request, deadline).await {
                Ok(Frame {
                    message: Message::BeatResponse(answers),
                    ..
                }) if answers.len() == want => Ok(answers),
                Ok(Frame { message, .. }) => Err(format!(
                    "protocol error: {} answered a beat of {want} groups with {message:?}",
                    peer
                )),
                Err(MuxError::Timeout) => Err("beat timed out".to_string()),
                Err(MuxError::Unreachable(why)) => Err(why),
                Err(MuxError::TooLarge) => Err("beat over the frame size limit".to_string()),
            }
        })
    }
}

/// One group's link to one target, over the broker's connection to it.
pub struct TcpLink {
    group: Arc<str>,
    target: NodeId,
    mesh: Arc<Mesh>,
    rpc_timeout: Duration,
    cuts: Option<(NodeId, Arc<LinkCuts>)>,
}

#[derive(Debug, thiserror::Error)]
#[error("raft transport to node {target} ({group}): {reason}")]
struct TransportError {
    target: NodeId,
    group: Arc<str>,
    reason: String,
}

impl TcpLink {
    pub fn target(&self) -> NodeId {
        self.target
    }

    fn rpc_error<E: std::error::Error>(
        &self,
        err: MuxError,
        action: RPCTypes,
        from: NodeId,
        timeout: Duration,
    ) -> RPCError<NodeId, EmptyNode, E> {
        match err {
            MuxError::Timeout => RPCError::Timeout(Timeout {
                action,
                id: from,
                target: self.target,
                timeout,
            }),
            MuxError::Unreachable(reason) => self.unreachable(reason),
            MuxError::TooLarge => self.unreachable("request over the frame size limit".into()),
        }
    }

    fn unreachable<E: std::error::Error>(&self, reason: String) -> RPCError<NodeId, EmptyNode, E> {
        tracing::debug!(target_node = self.target, group = %self.group, %reason, "raft rpc failed");
        RPCError::Unreachable(Unreachable::new(&TransportError {
            target: self.target,
            group: self.group.clone(),
            reason,
        }))
    }

    /// How long an RPC under `option` may take.
    fn budget(&self, option: &RPCOption) -> Duration {
        self.rpc_timeout.min(option.hard_ttl())
    }

    /// Sends `request` and returns the response, which is of kind `expect`.
    async fn call(
        &mut self,
        request: &Message,
        expect: u8,
        budget: Duration,
    ) -> Result<Message, MuxError> {
        if let Some((from, cuts)) = &self.cuts {
            if cuts.blocks(*from, self.target) {
                return Err(MuxError::Unreachable("link cut (test hook)".into()));
            }
        }
        let deadline = Instant::now() + budget;
        let Frame { group, message, .. } = self
            .mesh
            .call(self.target, &self.group, request, deadline)
            .await?;
        if let Message::Error(reason) = message {
            return Err(MuxError::Unreachable(format!("peer refused: {reason}")));
        }
        if message.kind() != expect || *group != *self.group {
            return Err(MuxError::Unreachable(format!(
                "protocol error: expected {} for {:?}, got {} for {group:?}",
                KindName(expect),
                self.group,
                KindName(message.kind()),
            )));
        }
        Ok(message)
    }
}

impl RaftNetwork<KilnRaft> for TcpLink {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<KilnRaft>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId>>> {
        // The sender is the leader the request's vote names (the network is not told its own
        // id); it only labels a timeout error.
        let from = rpc.vote.leader_id.voted_for.unwrap_or_default();
        let entries = rpc.entries.len() as u64;
        let request = Message::AppendEntries {
            target: self.target,
            rpc,
        };
        let budget = self.budget(&option);
        match self
            .call(&request, codec::KIND_APPEND_RESPONSE, budget)
            .await
        {
            Ok(Message::AppendEntriesResponse(resp)) => Ok(resp),
            Ok(other) => Err(self.unreachable(format!("unexpected response {other:?}"))),
            // openraft retries at once with at most this many entries.
            Err(MuxError::TooLarge) if entries > 1 => Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(entries / 2),
            )),
            Err(e) => Err(self.rpc_error(e, RPCTypes::AppendEntries, from, budget)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<KilnRaft>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, EmptyNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        // A follower behind the leader's log start (retention, a table's compaction).
        let from = rpc.vote.leader_id.voted_for.unwrap_or_default();
        let request = Message::InstallSnapshot {
            target: self.target,
            rpc,
        };
        let budget = self.budget(&option);
        match self
            .call(&request, codec::KIND_SNAPSHOT_RESPONSE, budget)
            .await
        {
            Ok(Message::InstallSnapshotResponse(resp)) => Ok(resp),
            Ok(other) => Err(self.unreachable(format!("unexpected response {other:?}"))),
            Err(e) => Err(self.rpc_error(e, RPCTypes::InstallSnapshot, from, budget)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId>>> {
        let from = rpc.vote.leader_id.voted_for.unwrap_or_default();
        let request = Message::Vote {
            target: self.target,
            rpc,
        };
        let budget = self.budget(&option);
        match self.call(&request, codec::KIND_VOTE_RESPONSE, budget).await {
            Ok(Message::VoteResponse(resp)) => Ok(resp),
            Ok(other) => Err(self.unreachable(format!("unexpected response {other:?}"))),
            Err(e) => Err(self.rpc_error(e, RPCTypes::Vote, from, budget)),
        }
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(BACKOFF))
    }
}

/// Where a one-off request goes: node `node`'s Raft listener at `addr`, over `transport`.
#[derive(Debug, Clone, Copy)]
pub struct PeerRef<'a> {
    pub transport: &'a Transport,
    pub node: NodeId,
    pub addr: &'a str,
}

/// Asks `peer` to do `payload` for `group` (see `codec.rs`, kind 10): a proposal for the
/// group's leader, or a request the group name stands for. `Ok` with the peer's answer
/// (empty for a proposal) once that peer has done it.
pub async fn forward(
    peer: PeerRef<'_>,
    group: &str,
    payload: bytes::Bytes,
    timeout: Duration,
) -> Result<bytes::Bytes, String> {
    let addr = peer.addr;
    let exchange = async {
        let mut stream = peer.transport.connect(addr, peer.node, timeout).await?;
        let frame =
            codec::encode(0, group, &Message::Forward(payload)).map_err(|e| e.to_string())?;
        stream
            .write_all(&frame)
            .await
            .map_err(|e| format!("write to {addr}: {e}"))?;
        match codec::read_frame(&mut stream).await {
            Ok(Some(Frame {
                message: Message::ForwardResponse(result),
                ..
            })) => result,
            Ok(Some(frame)) => Err(format!("{addr} answered {:?}", frame.message)),
            Ok(None) => Err(format!("{addr} closed the connection")),
            Err(e) => Err(format!("{addr}: {e}")),
        }
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("{addr} did not answer within {} ms", timeout.as_millis()))?
}

/// Asks `peer` who it is, which cluster it belongs to, and which incarnation that cluster has
/// registered for the sender.
pub async fn hello(
    peer: PeerRef<'_>,
    hello: Hello,
    timeout: Duration,
) -> Result<HelloAnswer, String> {
    let addr = peer.addr;
    let exchange = async {
        let mut stream = peer.transport.connect(addr, peer.node, timeout).await?;
        let frame = codec::encode(0, "", &Message::Hello(hello)).map_err(|e| e.to_string())?;
        stream
            .write_all(&frame)
            .await
            .map_err(|e| format!("write to {addr}: {e}"))?;
        match codec::read_frame(&mut stream).await {
            Ok(Some(Frame {
                message: Message::HelloResponse(answer),
                ..
            })) => Ok(answer),
            Ok(Some(frame)) => Err(format!("{addr} answered {:?}", frame.message)),
            Ok(None) => Err(format!("{addr} closed the connection")),
            Err(e) => Err(format!("{addr}: {e}")),
        }
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("{addr} did not answer within {} ms", timeout.as_millis()))?
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeMap;

    use super::*;
    use crate::net::{serve, GroupTable};
    use crate::types::Vote;

    /// "Unknown group" is what a peer answers while it is still creating the group, for as
    /// long as that takes: the connection stays open rather than reconnecting per retry.
    #[tokio::test]
    async fn an_error_for_this_group_keeps_the_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(serve(listener, Arc::new(GroupTable::new())));
        let peers = Arc::new(BTreeMap::from([(2, addr)]));
        let mut network = TcpNetwork::new("orders/1", peers, Duration::from_secs(5));
        let mut link = network.new_client(2, &EmptyNode {}).await;
        let option = RPCOption::new(Duration::from_secs(5));
        for _ in 0..3 {
            let answer = link
                .vote(VoteRequest::new(Vote::new(1, 1), None), option.clone())
                .await;
            assert!(matches!(answer, Err(RPCError::Unreachable(_))));
            assert_eq!(network.mesh().connections(), 1);
        }
        server.abort();
    }
}
