//! The receiving side: one listener per broker, one task per connection, each request run on
//! its own task against the named group's Raft node and answered, with its id, when done.
//!
//! Every connection is bounded before it costs much: at most [`HANDSHAKES_MAX`] connections
//! are between accept and a finished handshake, each for at most [`HANDSHAKE_TIMEOUT`]; a
//! peer (the node its certificate names, or with plain TCP its IP address) holds at most
//! [`ServeOptions::connections_per_peer_max`] connections; and each frame is bounded by its
//! kind before its body is read (`codec.rs`). Each refusal is logged with the peer's address.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::RaftError;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::codec::{self, Frame, KindName, Message};
use super::transport::{BoxStream, Transport};
use super::RaftGroups;
use crate::partition::VoteRefused;
use crate::types::NodeId;

/// A connection that carries no request for this long is closed. Replication streams send a
/// heartbeat every heartbeat interval, so only a dead or vanished client (a host that crashed
/// without closing its end) is ever this quiet; closing frees its task.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// How long writing the queued responses may take before the client counts as gone.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// The writer's buffer: answers ready together are copied into it and written at once.
const WRITE_BUFFER_BYTES: usize = 256 << 10;

/// Requests one connection may have in progress at once. The connection carries every RPC of
/// a peer's groups, at most one per group link at a time, so this is far above what a broker
/// sized for thousands of partitions sends; past it the connection stops reading until one
/// finishes, and TCP pushes back on the peer.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 4096;

/// Longest one request may run (a group whose core is stuck, for example in a write): its
/// answer is an error then, and its slot is free again. Senders give up far sooner.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause after a failed accept (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Connections between accept and a finished handshake, at once. A peer's links connect a
/// few at a time (each group's on first use), so this is only reached by a flood; past it,
/// new connections are closed at once.
pub const HANDSHAKES_MAX: usize = 64;

/// Longest a TLS handshake may take (a peer's own connect budget is shorter).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Default for [`ServeOptions::connections_per_peer_max`]: a peer keeps one connection for all
/// its groups' RPCs (`net/mux.rs`) and opens short-lived ones for hellos and forwarded
/// proposals; a reconnect may overlap the old connection's close.
pub const CONNECTIONS_PER_PEER_MAX: usize = 16;

/// Whether a node is a member now ([`ServeOptions::admits`]).
pub type Admits = Arc<dyn Fn(NodeId) -> bool + Send + Sync>;

/// The `Forward` group a broker that is not a member yet sends its request to join to: the
/// only request a guest may make besides Hello.
pub const JOIN_GROUP: &str = "__join";

/// How a listener authenticates and bounds its peers.
#[derive(Clone)]
pub struct ServeOptions {
    pub transport: Transport,
    /// The nodes allowed to connect, when the transport names them (mutual TLS); `None`:
    /// any node the cluster CA certified.
    pub members: Option<Arc<BTreeSet<NodeId>>>,
    /// The members now, when they change while the listener runs (a broker joins, one is
    /// removed): asked on every request from a node the transport names. A certified node it
    /// does not admit is a *guest*: it may only say Hello as itself and forward to
    /// [`JOIN_GROUP`] (a broker asking to join); anything else closes its connection without
    /// an answer.
    pub admits: Option<Admits>,
    /// Open connections per peer; more are closed as they arrive.
    pub connections_per_peer_max: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            transport: Transport::Plain,
            members: None,
            admits: None,
            connections_per_peer_max: CONNECTIONS_PER_PEER_MAX,
        }
    }
}

/// Who a connection counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum PeerKey {
    Node(NodeId),
    Address(IpAddr),
}

/// Open connections per peer, released when a connection's guard drops.
#[derive(Default)]
struct PeerCounts(Mutex<HashMap<PeerKey, usize>>);

struct PeerSlot {
    counts: Arc<PeerCounts>,
    key: PeerKey,
}

impl PeerCounts {
    fn take(self: &Arc<Self>, key: PeerKey, max: usize) -> Option<PeerSlot> {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let count = counts.entry(key).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            counts: self.clone(),
            key,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().unwrap_or_else(|p| p.into_inner());
        let Some(count) = counts.get_mut(&self.key) else {
            unreachable!("a held slot's peer {:?} is counted", self.key);
        };
        assert!(*count > 0, "peer {:?} holds a slot", self.key);
        *count -= 1;
        if *count == 0 {
            counts.remove(&self.key);
        }
    }
}

/// Accepts connections on `listener` and serves Raft RPCs for the groups in `groups`, over
/// plain TCP with the default bounds; see [`serve_with`].
pub async fn serve(listener: TcpListener, groups: Arc<dyn RaftGroups>) {
    serve_with(listener, groups, ServeOptions::default()).await
}

/// Accepts connections on `listener` and serves Raft RPCs for the groups in `groups` until
/// this future is dropped or its task aborted; the connections' tasks end with it. Requests
/// on one connection run at once (at most [`REQUESTS_IN_FLIGHT_MAX`]), answered as they finish.
pub async fn serve_with(listener: TcpListener, groups: Arc<dyn RaftGroups>, options: ServeOptions) {
    assert!(options.connections_per_peer_max > 0);
    if !options.transport.is_authenticated() {
        if let Ok(addr) = listener.local_addr() {
            if !addr.ip().is_loopback() {
                tracing::warn!(%addr, "the Raft listener takes plain TCP on a non-loopback address: any host that reaches it can act as a broker; set [cluster.tls] (docs/security.md)");
            }
        }
    }
    let options = Arc::new(options);
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES_MAX));
    let counts = Arc::new(PeerCounts::default());
    // Connections live in this set so that aborting `serve` closes them all: a broker that
    // stops serving must look down to its peers, not keep answering on old connections.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Ok(permit) = handshakes.clone().try_acquire_owned() else {
                        tracing::warn!(%peer, limit = HANDSHAKES_MAX, "raft listener: refused a connection: too many handshakes in progress");
                        drop(stream);
                        continue;
                    };
                    let (groups, options, counts) = (groups.clone(), options.clone(), counts.clone());
                    connections.spawn(async move {
                        let Some((stream, node, _slot)) =
                            admit(stream, peer, &options, &counts).await
                        else {
                            return;
                        };
                        drop(permit);
                        serve_connection(stream, peer, node, groups, options.admits.clone()).await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "raft listener: accept failed");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                }
            },
            Some(done) = connections.join_next(), if !connections.is_empty() => {
                if let Err(e) = done {
                    if e.is_panic() {
                        tracing::error!(error = %e, "raft connection task panicked");
                    }
                }
            }
        }
    }
}

/// The handshake and the admission checks; `None` (the refusal logged) if the connection is
/// not to be served.
async fn admit(
    tcp: TcpStream,
    peer: SocketAddr,
    options: &ServeOptions,
    counts: &Arc<PeerCounts>,
) -> Option<(BoxStream, Option<NodeId>, PeerSlot)> {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "raft connection: set TCP_NODELAY failed");
    }
    let (stream, node) = match tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        options.transport.accept(tcp),
    )
    .await
    {
        Ok(Ok(accepted)) => accepted,
        Ok(Err(reason)) => {
            tracing::warn!(%peer, %reason, "raft listener: refused a connection");
            return None;
        }
        Err(_) => {
            tracing::warn!(%peer, timeout = ?HANDSHAKE_TIMEOUT, "raft listener: refused a connection: handshake timed out");
            return None;
        }
    };
    let key = match node {
        Some(node) => {
            if let Some(members) = &options.members {
                if !members.contains(&node) {
                    tracing::warn!(%peer, node, "raft listener: refused a connection: node {node} is not a member of this cluster");
                    return None;
                }
            }
            PeerKey::Node(node)
        }
        None => PeerKey::Address(peer.ip()),
    };
    let Some(slot) = counts.take(key, options.connections_per_peer_max) else {
        tracing::warn!(%peer, ?node, limit = options.connections_per_peer_max, "raft listener: refused a connection: the peer holds as many connections as it may");
        return None;
    };
    Some((stream, node, slot))
}

/// Serves one connection: requests are read in order and each runs as its own task (a peer's
/// groups share the connection, and one group's slow request must not hold up the others);
/// answers go back as they are ready, each with its request's id. A frame that cannot be
/// trusted closes the connection after an error with id 0.
async fn serve_connection(
    stream: BoxStream,
    peer: SocketAddr,
    node: Option<NodeId>,
    groups: Arc<dyn RaftGroups>,
    admits: Option<Admits>,
) {
    let (mut read, write) = tokio::io::split(stream);
    // Every request task sends at most one answer, and at most REQUESTS_IN_FLIGHT_MAX run at
    // once: with one slot more (the closing error), a send never waits for room.
    let (replies, queued) = mpsc::channel::<Vec<u8>>(REQUESTS_IN_FLIGHT_MAX + 1);
    let reader = async move {
        let in_flight = Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_MAX));
        let mut requests = JoinSet::new();
        let closing = loop {
            while let Some(done) = requests.try_join_next() {
                if let Err(e) = done {
                    if e.is_panic() {
                        tracing::error!(%peer, error = %e, "raft request task panicked");
                    }
                }
            }
            let frame = match tokio::time::timeout(IDLE_TIMEOUT, codec::read_frame(&mut read)).await
            {
                Ok(Ok(Some(frame))) => frame,
                Ok(Ok(None)) => break None,
                Err(_) => {
                    tracing::debug!(%peer, "raft connection idle; closing it");
                    break None;
                }
                Ok(Err(e)) if is_guest(node, &admits) => {
                    // A stranger gets no answer at all, not even why.
                    tracing::warn!(%peer, ?node, error = %e, "raft listener: refused a connection: node {} is not a member of this cluster", node.unwrap_or_default());
                    break None;
                }
                Ok(Err(e)) => {
                    // The stream can no longer be trusted to be at a frame boundary: say why,
                    // then close it. The client reconnects.
                    tracing::warn!(%peer, error = %e, "raft connection: refusing a bad frame; closing the connection");
                    break Some(format!("bad frame: {e}"));
                }
            };
            // When it arrived: what a follower counts its vote lease from (`liveness.rs`).
            let arrived = Instant::now();
            if let Some(node) = node.filter(|_| is_guest(node, &admits)) {
                if !guest_may(node, &frame) {
                    tracing::warn!(%peer, node, kind = %KindName(frame.message.kind()), "raft listener: refused a connection: node {node} is not a member of this cluster");
                    break None;
                }
            }
            if let Some(node) = node {
                if let Err(reason) = sender_is(node, &frame.message) {
                    tracing::warn!(%peer, node, %reason, "raft connection: refusing a request; closing the connection");
                    break Some(reason);
                }
            }
            if !frame.message.is_request() {
                // A response kind sent as a request: the peer does not speak this protocol.
                break Some(format!(
                    "{} is not a request",
                    KindName(frame.message.kind())
                ));
            }
            let Ok(permit) = in_flight.clone().acquire_owned().await else {
                unreachable!("a connection's request semaphore is never closed");
            };
            let (groups, replies) = (groups.clone(), replies.clone());
            requests.spawn(async move {
                let Frame { id, group, message } = frame;
                let reply = match tokio::time::timeout(
                    REQUEST_TIMEOUT,
                    handle(&*groups, &group, message, arrived),
                )
                .await
                {
                    Ok(reply) => reply,
                    Err(_) => Message::Error(format!(
                        "no answer within {REQUEST_TIMEOUT:?} (group {group:?})"
                    )),
                };
                match codec::encode(id, &group, &reply) {
                    // Fails only once the writer is gone: the connection is closing.
                    Ok(bytes) => drop(replies.send(bytes).await),
                    Err(e) => {
                        tracing::error!(%peer, %group, error = %e, "raft connection: cannot encode a response");
                    }
                }
                drop(permit);
            });
        };
        // Requests still running are for a connection about to close: their answers could
        // not be sent anyway.
        drop(requests);
        if let Some(reason) = closing {
            // Id 0 and no group: the client closes the connection and fails what it awaits.
            if let Ok(bytes) = codec::encode(0, "", &Message::Error(reason)) {
                let _ = replies.send(bytes).await;
            }
        }
        // Dropping the last sender ends the writer once it has written what is queued.
    };
    // One task for both halves, so that aborting the connection's task closes it whole.
    tokio::join!(reader, write_replies(write, queued, peer));
}

/// Writes answers as they come; what is queued together goes out in one write. Ends when every
/// sender is gone (the queue drained) or a write fails.
async fn write_replies(
    write: tokio::io::WriteHalf<BoxStream>,
    mut queued: mpsc::Receiver<Vec<u8>>,
    peer: SocketAddr,
) {
    let mut out = BufWriter::with_capacity(WRITE_BUFFER_BYTES, write);
    while let Some(first) = queued.recv().await {
        let batch = async {
            out.write_all(&first).await?;
            while let Ok(next) = queued.try_recv() {
                out.write_all(&next).await?;
            }
            out.flush().await
        };
        match tokio::time::timeout(WRITE_TIMEOUT, batch).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "raft connection: write failed");
                break;
            }
            Err(_) => {
                tracing::debug!(%peer, "raft connection: write timed out");
                break;
            }
        }
    }
    // Closing the queue fails the request tasks' sends at once instead of leaving them
    // waiting for room.
    queued.close();
    let _ = out.shutdown().await;
}

/// Whether the connection's node is certified but not a member now.
fn is_guest(node: Option<NodeId>, admits: &Option<Admits>) -> bool {
    matches!((node, admits), (Some(n), Some(admits)) if !admits(n))
}

/// Whether a node that is not a member may send `frame`: a Hello as itself, or a request to
/// join (see [`ServeOptions::admits`]).
fn guest_may(node: NodeId, frame: &Frame) -> bool {
    match &frame.message {
        Message::Hello(hello) => hello.sender == node,
        Message::Forward(_) => frame.group == JOIN_GROUP,
        _ => false,
    }
}

/// Checks that a request from an authenticated `node` speaks for that node: a vote, an
/// AppendEntries or a snapshot names its sender (the candidate or leader) in its vote, and a
/// hello or a beat names its sender; a forwarded proposal speaks for nobody.
fn sender_is(node: NodeId, request: &Message) -> Result<(), String> {
    let claimed = match request {
        Message::AppendEntries { rpc, .. } => rpc.vote.leader_id.voted_for,
        Message::Vote { rpc, .. } => rpc.vote.leader_id.voted_for,
        Message::InstallSnapshot { rpc, .. } => rpc.vote.leader_id.voted_for,
        Message::Hello(hello) => Some(hello.sender),
        Message::Beat { sender, .. } => Some(*sender),
        _ => return Ok(()),
    };
    match claimed {
        Some(sender) if sender == node => Ok(()),
        other => Err(format!(
            "node {node}'s certificate cannot send {} as {}",
            KindName(request.kind()),
            other.map_or("no node".to_string(), |n| format!("node {n}")),
        )),
    }
}

/// Serves one request (one of [`Message::is_request`]'s kinds).
async fn handle(
    groups: &dyn RaftGroups,
    group: &str,
    request: Message,
    arrived: Instant,
) -> Message {
    if let Message::Beat { sender, items } = &request {
        return Message::BeatResponse(groups.beat(*sender, items, arrived));
    }
    if let Message::Hello(hello) = &request {
        let answer = groups.hello(hello);
        tracing::debug!(?hello, ?answer, "raft listener: hello");
        return Message::HelloResponse(answer);
    }
    if let Message::Forward(payload) = request {
        let result = groups.forward(group, payload).await;
        return Message::ForwardResponse(result);
    }
    let target = match &request {
        Message::AppendEntries { target, .. }
        | Message::Vote { target, .. }
        | Message::InstallSnapshot { target, .. } => *target,
        other => {
            unreachable!(
                "the reader passes requests only, not {}",
                KindName(other.kind())
            )
        }
    };
    let Some(raft) = groups.raft(group) else {
        return Message::Error(format!("unknown group {group:?}"));
    };
    let id: NodeId = raft.metrics().borrow().id;
    if id != target {
        // The sender's address book points at the wrong broker. Answering would count this
        // node's vote or log as the target's.
        return Message::Error(format!(
            "node {target} was asked for, but this is node {id} (group {group:?})"
        ));
    }
    if let Some(health) = groups.health(group) {
        if health.disk_full() {
            // Its core is stuck in a write until space returns; a request handed to it now
            // would wait there (and the sender's retries pile up behind it).
            return Message::Error(format!("node {id}'s disk is full (group {group:?})"));
        }
        if matches!(request, Message::Vote { .. }) && health.repairing() {
            // Its log lost entries it may have acknowledged: its vote could elect a leader
            // without them (docs/replication.md, "Damage and full disks").
            return Message::Error(format!(
                "node {id} is repairing damaged files and grants no votes (group {group:?})"
            ));
        }
    }
    // A group served with its replica goes through it, so that liveness sees every message
    // (`liveness.rs`); one served with only its Raft handle (tests) goes to openraft directly.
    let replica = groups.replica(group);
    let reply = match request {
        Message::AppendEntries { rpc, .. } => {
            let answer = match &replica {
                Some(r) => r.serve_append(rpc, arrived).await,
                None => raft.append_entries(rpc).await,
            };
            match answer {
                Ok(resp) => Message::AppendEntriesResponse(resp),
                Err(e) => raft_error(e),
            }
        }
        Message::Vote { rpc, .. } => {
            let answer = match &replica {
                Some(r) => r.serve_vote(rpc, arrived).await,
                None => raft.vote(rpc).await.map_err(VoteRefused::from),
            };
            match answer {
                Ok(resp) => Message::VoteResponse(resp),
                Err(e) => Message::Error(e.to_string()),
            }
        }
        Message::InstallSnapshot { rpc, .. } => match raft.install_snapshot(rpc).await {
            Ok(resp) => Message::InstallSnapshotResponse(resp),
            Err(e) => Message::Error(format!("raft: {e}")),
        },
        other => unreachable!("{} was matched as a request above", KindName(other.kind())),
    };
    reply
}

fn raft_error(e: RaftError<NodeId>) -> Message {
    Message::Error(format!("raft: {e}"))
}
