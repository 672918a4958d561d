//! A broker starting on an empty data directory under an id its peers know must not join as
//! if it were new when it has been a member before: it has lost its votes and its logs, and
//! counting it as a replica that holds what it acknowledged could lose committed records
//! (docs/operations.md, "Cluster: adding a broker, replacing a dead one").
//!
//! Every data directory has an incarnation, drawn at random when it is created, and every
//! broker registers its incarnation in the metadata log once it runs (`RegisterBroker`, first
//! one wins). Before it opens any group, a broker whose directory is new asks every peer's
//! Raft listener (Hello) which incarnation the cluster has registered for its node id:
//! - a different one: this node id was a member with another directory, now lost. It refuses
//!   to start, saying so (and keeps refusing: its identity is saved only once it may start).
//! - none: it was never a member, or the cluster is new. It goes ahead once at least one peer
//!   has answered, so brokers of a new cluster may be started in any order and at any time.
//!
//! The check has one gap, kept small: a broker that took part in groups but died (and lost its
//! disk) before its registration committed is not recognised. Registration is its first act
//! after start, so the gap is a few heartbeats long.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::net::TcpListener;

use kiln_raft::net::{Hello, HelloAnswer};

use crate::config::ClusterSettings;

/// How long one Hello may take.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between rounds while no peer has answered.
const ROUND_PAUSE: Duration = Duration::from_millis(500);
/// Log a waiting line this often.
const WAITING_LOG_EVERY: u32 = 10;

/// What a broker still checking its peers answers on its Raft listener: no groups, no cluster.
struct Joining(u64);

impl kiln_raft::net::RaftGroups for Joining {
    fn raft(&self, _group: &str) -> Option<kiln_raft::types::Raft> {
        None
    }

    fn hello(&self, _from: &Hello) -> HelloAnswer {
        HelloAnswer {
            node: self.0,
            cluster_id: None,
            sender_incarnation: None,
        }
    }
}

/// Binds the Raft listener at `addr`. A broker with a new data directory (`fresh`: its new
/// incarnation) first checks its peers (see the module docs), answering their own checks
/// meanwhile, and refuses to start if its node id was a member under another incarnation.
pub async fn bind_raft_listener(
    addr: SocketAddr,
    settings: &ClusterSettings,
    transport: &kiln_raft::net::Transport,
    node_id: i32,
    fresh: Option<u64>,
) -> anyhow::Result<TcpListener> {
    let std_listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("binding the Raft listener {addr}"))?;
    std_listener.set_nonblocking(true)?;
    if let Some(incarnation) = fresh {
        let answering = TcpListener::from_std(std_listener.try_clone()?)?;
        let me = u64::try_from(node_id).unwrap_or(0);
        let task = tokio::spawn(kiln_raft::net::serve_with(
            answering,
            Arc::new(Joining(me)),
            super::serve_options(settings, transport, super::configured_members(settings)),
        ));
        let checked = check_new_member(settings, transport, node_id, incarnation).await;
        task.abort();
        // Dropped (with its copy of the listening socket) only once the runtime gets to it:
        // wait, so a refused broker started again at once can bind its port.
        let _ = task.await;
        checked?;
    }
    Ok(TcpListener::from_std(std_listener)?)
}

/// Returns once it is safe for a broker with a new, empty data directory to take part (see the
/// module docs), or refuses.
async fn check_new_member(
    settings: &ClusterSettings,
    transport: &kiln_raft::net::Transport,
    node_id: i32,
    incarnation: u64,
) -> anyhow::Result<()> {
    let others: Vec<_> = settings.peers.iter().filter(|p| p.id != node_id).collect();
    if others.is_empty() {
        return Ok(());
    }
    let hello = Hello {
        sender: u64::try_from(node_id).context("negative node id")?,
        incarnation,
    };
    let mut round = 0u32;
    loop {
        let mut answered = Vec::new();
        for peer in &others {
            match kiln_raft::net::hello(super::peer_ref(transport, peer), hello, HELLO_TIMEOUT)
                .await
            {
                Ok(HelloAnswer {
                    cluster_id: Some(cluster_id),
                    sender_incarnation: Some(registered),
                    ..
                }) if registered != incarnation => bail!(
                    "this broker's data directory is new, but broker {} (raft {}) says node {node_id} is a member of \
                     cluster {cluster_id} with another data directory (incarnation {registered:016x}, this one is \
                     {incarnation:016x}): its data is gone. A broker whose disk was lost cannot rejoin with an empty \
                     directory under its old id (its votes and log are lost): restore its data directory, or start this \
                     broker under a new node id with [cluster] join = true and decommission node {node_id} \
                     (docs/operations.md, \"Cluster: adding a broker, replacing a dead one\")",
                    peer.id,
                    peer.raft
                ),
                Ok(answer) => {
                    tracing::debug!(peer = peer.id, ?answer, "peer answered");
                    answered.push(peer.id);
                }
                Err(e) => tracing::debug!(peer = peer.id, error = %e, "no answer yet"),
            }
        }
        if !answered.is_empty() {
            tracing::info!(peers = ?answered, "new data directory: no peer that answered knows this node id under another directory; joining");
            return Ok(());
        }
        if round.is_multiple_of(WAITING_LOG_EVERY) {
            tracing::warn!(peers = ?others.iter().map(|p| p.id).collect::<Vec<_>>(), "new data directory: waiting for a peer to say whether a cluster already exists");
        }
        round += 1;
        tokio::time::sleep(ROUND_PAUSE).await;
    }
}
