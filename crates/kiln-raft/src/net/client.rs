//! The sending side: openraft's network factory and one lazily connected stream per target.

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

use super::codec::{self, CodecError, KindName, Message};
use super::transport::{BoxStream, Transport};
use super::{Hello, HelloAnswer, PeerAddrs};
use crate::types::{KilnRaft, NodeId};

/// How long a connection attempt may take before the peer counts as unreachable.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The pause openraft takes before retrying a peer that was unreachable. Short enough that a
/// restarted broker is caught up quickly, long enough that a dead one costs a few connection
/// attempts a second per group rather than a busy loop.
const BACKOFF: Duration = Duration::from_millis(200);

/// openraft's network factory for one Raft group: every link it makes names the group in each
/// RPC, so all groups of a broker share one listener per peer.
#[derive(Clone)]
pub struct TcpNetwork {
    group: Arc<str>,
    peers: PeerAddrs,
    rpc_timeout: Duration,
    connect_timeout: Duration,
    transport: Transport,
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
    /// A network for the group named `group`, reaching node `n` at `peers[n]`. Each RPC is
    /// bounded by `rpc_timeout` (or openraft's own deadline for it, if that is shorter).
    pub fn new(group: impl Into<String>, peers: PeerAddrs, rpc_timeout: Duration) -> Self {
        TcpNetwork {
            group: Arc::from(group.into()),
            peers,
            rpc_timeout,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            transport: Transport::Plain,
            cuts: None,
        }
    }

    /// Carries this network's RPCs over `transport` (plain TCP unless set).
    pub fn with_transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    /// Subjects this network (node `from`'s) to `cuts` (a test hook).
    pub fn with_cuts(mut self, from: NodeId, cuts: Arc<LinkCuts>) -> Self {
        self.cuts = Some((from, cuts));
        self
    }

    /// Replaces the connection timeout ([`DEFAULT_CONNECT_TIMEOUT`] unless set).
    pub fn with_connect_timeout(mut self, connect_timeout: Duration) -> Self {
        self.connect_timeout = connect_timeout;
        self
    }

    pub fn group(&self) -> &str {
        &self.group
    }
}

impl RaftNetworkFactory<KilnRaft> for TcpNetwork {
    type Network = TcpLink;

    async fn new_client(&mut self, target: NodeId, _node: &EmptyNode) -> TcpLink {
        // No connection yet: openraft creates clients eagerly and expects them not to fail.
        TcpLink {
            group: self.group.clone(),
            target,
            addr: self.peers.get(&target).cloned(),
            rpc_timeout: self.rpc_timeout,
            connect_timeout: self.connect_timeout,
            transport: self.transport.clone(),
            stream: None,
            cuts: self.cuts.clone(),
        }
    }
}

/// One group's link to one target: a stream (TCP, or TLS over it), connected on first use and
/// again after any failure.
pub struct TcpLink {
    group: Arc<str>,
    target: NodeId,
    addr: Option<String>,
    rpc_timeout: Duration,
    connect_timeout: Duration,
    transport: Transport,
    /// `None` until connected, and after any failure: a stream whose request or response may
    /// be half sent or half read is never reused.
    stream: Option<BoxStream>,
    cuts: Option<(NodeId, Arc<LinkCuts>)>,
}

#[derive(Debug, thiserror::Error)]
#[error("raft transport to node {target} ({group}): {reason}")]
struct TransportError {
    target: NodeId,
    group: Arc<str>,
    reason: String,
}

enum CallError {
    /// Connection refused or failed, the peer answered with an error, or the exchange broke:
    /// openraft backs off before trying this peer again.
    Unreachable(String),
    /// Connected, but no answer in time.
    Timeout(Duration),
    /// The request would not fit in one frame.
    TooLarge,
}

impl TcpLink {
    pub fn target(&self) -> NodeId {
        self.target
    }

    fn rpc_error<E: std::error::Error>(
        &self,
        err: CallError,
        action: RPCTypes,
        from: NodeId,
    ) -> RPCError<NodeId, EmptyNode, E> {
        match err {
            CallError::Timeout(timeout) => RPCError::Timeout(Timeout {
                action,
                id: from,
                target: self.target,
                timeout,
            }),
            CallError::Unreachable(reason) => self.unreachable(reason),
            CallError::TooLarge => self.unreachable("request over the frame size limit".into()),
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

    async fn connect(&self, deadline: Instant) -> Result<BoxStream, CallError> {
        let Some(addr) = self.addr.as_deref() else {
            return Err(CallError::Unreachable(format!(
                "no address for node {}",
                self.target
            )));
        };
        let limit = self
            .connect_timeout
            .min(deadline.saturating_duration_since(Instant::now()));
        self.transport
            .connect(addr, self.target, limit)
            .await
            .map_err(CallError::Unreachable)
    }

    /// Sends `request` and returns the response, which is of kind `expect`.
    async fn call(
        &mut self,
        request: &Message,
        expect: u8,
        option: &RPCOption,
    ) -> Result<Message, CallError> {
        if let Some((from, cuts)) = &self.cuts {
            if cuts.blocks(*from, self.target) {
                self.stream = None;
                return Err(CallError::Unreachable("link cut (test hook)".into()));
            }
        }
        let frame = match codec::encode(&self.group, request) {
            Ok(frame) => frame,
            Err(CodecError::TooLarge { .. }) => return Err(CallError::TooLarge),
            Err(e) => return Err(CallError::Unreachable(e.to_string())),
        };
        let budget = self.rpc_timeout.min(option.hard_ttl());
        let deadline = Instant::now() + budget;
        // Taken out for the exchange: if openraft drops this future part way (its own
        // deadline), the stream goes with it instead of staying behind out of step.
        let mut stream = match self.stream.take() {
            Some(stream) => stream,
            None => self.connect(deadline).await?,
        };
        let exchange = async {
            stream.write_all(&frame).await?;
            codec::read_frame(&mut stream).await
        };
        let (group, response) = match tokio::time::timeout_at(deadline, exchange).await {
            Err(_) => return Err(CallError::Timeout(budget)),
            Ok(Err(e)) => return Err(CallError::Unreachable(e.to_string())),
            Ok(Ok(None)) => {
                return Err(CallError::Unreachable(
                    "connection closed by the peer".into(),
                ))
            }
            Ok(Ok(Some(frame))) => frame,
        };
        if let Message::Error(reason) = response {
            // An error naming this group ("unknown group" while the peer is still creating
            // it, a stopped node) leaves the connection usable, which spares a reconnect per
            // retry; one naming no group comes before the server closes its end.
            if *group == *self.group {
                self.stream = Some(stream);
            }
            return Err(CallError::Unreachable(format!("peer refused: {reason}")));
        }
        if response.kind() != expect || *group != *self.group {
            return Err(CallError::Unreachable(format!(
                "protocol error: expected {} for {:?}, got {} for {group:?}",
                KindName(expect),
                self.group,
                KindName(response.kind()),
            )));
        }
        self.stream = Some(stream);
        Ok(response)
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
        match self
            .call(&request, codec::KIND_APPEND_RESPONSE, &option)
            .await
        {
            Ok(Message::AppendEntriesResponse(resp)) => Ok(resp),
            Ok(other) => Err(self.unreachable(format!("unexpected response {other:?}"))),
            // openraft retries at once with at most this many entries.
            Err(CallError::TooLarge) if entries > 1 => Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(entries / 2),
            )),
            Err(e) => Err(self.rpc_error(e, RPCTypes::AppendEntries, from)),
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
        match self
            .call(&request, codec::KIND_SNAPSHOT_RESPONSE, &option)
            .await
        {
            Ok(Message::InstallSnapshotResponse(resp)) => Ok(resp),
            Ok(other) => Err(self.unreachable(format!("unexpected response {other:?}"))),
            Err(e) => Err(self.rpc_error(e, RPCTypes::InstallSnapshot, from)),
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
        match self
            .call(&request, codec::KIND_VOTE_RESPONSE, &option)
            .await
        {
            Ok(Message::VoteResponse(resp)) => Ok(resp),
            Ok(other) => Err(self.unreachable(format!("unexpected response {other:?}"))),
            Err(e) => Err(self.rpc_error(e, RPCTypes::Vote, from)),
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

/// Asks `peer` to make `payload`, a proposal for `group`'s leader (see `codec.rs`, kind 10).
/// `Ok` once that peer has made and applied it.
pub async fn forward(
    peer: PeerRef<'_>,
    group: &str,
    payload: bytes::Bytes,
    timeout: Duration,
) -> Result<(), String> {
    let addr = peer.addr;
    let exchange = async {
        let mut stream = peer.transport.connect(addr, peer.node, timeout).await?;
        let frame = codec::encode(group, &Message::Forward(payload)).map_err(|e| e.to_string())?;
        stream
            .write_all(&frame)
            .await
            .map_err(|e| format!("write to {addr}: {e}"))?;
        match codec::read_frame(&mut stream).await {
            Ok(Some((_, Message::ForwardResponse(result)))) => result,
            Ok(Some((_, other))) => Err(format!("{addr} answered {other:?}")),
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
        let frame = codec::encode("", &Message::Hello(hello)).map_err(|e| e.to_string())?;
        stream
            .write_all(&frame)
            .await
            .map_err(|e| format!("write to {addr}: {e}"))?;
        match codec::read_frame(&mut stream).await {
            Ok(Some((_, Message::HelloResponse(answer)))) => Ok(answer),
            Ok(Some((_, other))) => Err(format!("{addr} answered {other:?}")),
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
    /// long as that takes: the link keeps its connection rather than reconnecting per retry.
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
            assert!(link.stream.is_some());
        }
        server.abort();
    }
}
