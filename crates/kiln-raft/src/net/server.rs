//! The receiving side: one listener per broker, one task per connection, requests dispatched
//! to the named group's Raft node.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::RaftError;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::codec::{self, KindName, Message};
use super::RaftGroups;
use crate::types::NodeId;

/// A connection that carries no request for this long is closed. Replication streams send a
/// heartbeat every heartbeat interval, so only a dead or vanished client (a host that crashed
/// without closing its end) is ever this quiet; closing frees its task.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// How long writing a response may take before the client counts as gone.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause after a failed accept (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Accepts connections on `listener` and serves Raft RPCs for the groups in `groups` until
/// this future is dropped or its task aborted; the connections' tasks end with it. Requests
/// on one connection are answered one at a time, in order.
pub async fn serve(listener: TcpListener, groups: Arc<dyn RaftGroups>) {
    // Connections live in this set so that aborting `serve` closes them all: a broker that
    // stops serving must look down to its peers, not keep answering on old connections.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    connections.spawn(serve_connection(stream, peer, groups.clone()));
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

async fn serve_connection(mut stream: TcpStream, peer: SocketAddr, groups: Arc<dyn RaftGroups>) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "raft connection: set TCP_NODELAY failed");
    }
    loop {
        let (group, request) = match tokio::time::timeout(
            IDLE_TIMEOUT,
            codec::read_frame(&mut stream),
        )
        .await
        {
            Ok(Ok(Some(frame))) => frame,
            Ok(Ok(None)) => return,
            Err(_) => {
                tracing::debug!(%peer, "raft connection idle; closing it");
                return;
            }
            Ok(Err(e)) => {
                // The stream can no longer be trusted to be at a frame boundary: say why,
                // then close it. The client reconnects.
                tracing::warn!(%peer, error = %e, "raft connection: refusing a bad frame; closing the connection");
                let reply = Message::Error(format!("bad frame: {e}"));
                if let Ok(bytes) = codec::encode("", &reply) {
                    let _ = tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&bytes)).await;
                }
                return;
            }
        };
        let (reply, keep_open) = handle(&*groups, &group, request).await;
        // An error before closing names no group: that tells the client not to reuse the
        // connection (see the client's handling of Error frames).
        let reply_group = if keep_open { group.as_str() } else { "" };
        let bytes = match codec::encode(reply_group, &reply) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::error!(%peer, %group, error = %e, "raft connection: cannot encode a response");
                return;
            }
        };
        match tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&bytes)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "raft connection: write failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "raft connection: write timed out");
                return;
            }
        }
        if !keep_open {
            return;
        }
    }
}

/// Serves one request; the flag says whether the connection stays open after the reply.
async fn handle(groups: &dyn RaftGroups, group: &str, request: Message) -> (Message, bool) {
    if let Message::Hello(hello) = &request {
        let answer = groups.hello(hello);
        tracing::debug!(?hello, ?answer, "raft listener: hello");
        return (Message::HelloResponse(answer), true);
    }
    if let Message::Forward(payload) = request {
        let result = groups.forward(group, payload).await;
        return (Message::ForwardResponse(result), true);
    }
    let target = match &request {
        Message::AppendEntries { target, .. }
        | Message::Vote { target, .. }
        | Message::InstallSnapshot { target, .. } => *target,
        other => {
            // A response kind sent as a request: the peer does not speak this protocol.
            return (
                Message::Error(format!("{} is not a request", KindName(other.kind()))),
                false,
            );
        }
    };
    let Some(raft) = groups.raft(group) else {
        return (Message::Error(format!("unknown group {group:?}")), true);
    };
    let id: NodeId = raft.metrics().borrow().id;
    if id != target {
        // The sender's address book points at the wrong broker. Answering would count this
        // node's vote or log as the target's.
        return (
            Message::Error(format!(
                "node {target} was asked for, but this is node {id} (group {group:?})"
            )),
            true,
        );
    }
    if let Some(health) = groups.health(group) {
        if health.disk_full() {
            // Its core is stuck in a write until space returns; a request handed to it now
            // would wait there (and the sender's retries pile up behind it).
            return (
                Message::Error(format!("node {id}'s disk is full (group {group:?})")),
                true,
            );
        }
        if matches!(request, Message::Vote { .. }) && health.repairing() {
            // Its log lost entries it may have acknowledged: its vote could elect a leader
            // without them (docs/replication.md, "Damage and full disks").
            return (
                Message::Error(format!(
                    "node {id} is repairing damaged files and grants no votes (group {group:?})"
                )),
                true,
            );
        }
    }
    let reply = match request {
        Message::AppendEntries { rpc, .. } => match raft.append_entries(rpc).await {
            Ok(resp) => Message::AppendEntriesResponse(resp),
            Err(e) => raft_error(e),
        },
        Message::Vote { rpc, .. } => match raft.vote(rpc).await {
            Ok(resp) => Message::VoteResponse(resp),
            Err(e) => raft_error(e),
        },
        Message::InstallSnapshot { rpc, .. } => match raft.install_snapshot(rpc).await {
            Ok(resp) => Message::InstallSnapshotResponse(resp),
            Err(e) => Message::Error(format!("raft: {e}")),
        },
        other => Message::Error(format!("{} is not a request", KindName(other.kind()))),
    };
    (reply, true)
}

fn raft_error(e: RaftError<NodeId>) -> Message {
    Message::Error(format!("raft: {e}"))
}
