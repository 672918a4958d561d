//! Mutual TLS between brokers (`kiln_raft::net::Transport::MutualTls`), over real sockets on
//! 127.0.0.1 with certificates from a throwaway cluster CA.
//!
//! * `three_brokers_replicate_over_mutual_tls_and_refuse_strangers`: a group of three replicates
//!   and fails over on TLS links; while it runs, a plain-TCP client, a client whose certificate
//!   another CA signed, a certified node that is not a member, and a member speaking as another
//!   node are all refused, and the group keeps taking writes.
//! * `a_peer_holds_at_most_its_connection_limit`: the per-peer connection bound.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kiln_log::fs::RealFs;
use kiln_raft::net::{serve_with, GroupTable, PeerAddrs, ServeOptions, TcpNetwork, Transport};
use kiln_raft::partition::raft_config;
use kiln_raft::sim::build_batch;
use kiln_raft::{NodeId, ReplicatedPartition, StartOptions};
use kiln_tls::{Ca, PeerTls, PeerTlsFiles};
use openraft::error::RPCError;
use openraft::network::RPCOption;
use openraft::raft::VoteRequest;
use openraft::{EmptyNode, RaftNetwork, RaftNetworkFactory, Vote};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

const GROUP: &str = "orders/0";
const WAIT: Duration = Duration::from_secs(20);

/// Writes `<dir>/node-<id>.crt|key` signed by `ca` and returns the transport that uses them
/// with `<dir>/ca.crt` as the trusted CA.
fn transport(dir: &Path, ca: &Ca, id: NodeId, trusted_ca: &Path) -> Transport {
    ca.issue_node(id)
        .unwrap()
        .write(dir, &format!("node-{id}"))
        .unwrap();
    let files = PeerTlsFiles {
        ca_file: trusted_ca.to_path_buf(),
        cert_file: dir.join(format!("node-{id}.crt")),
        key_file: dir.join(format!("node-{id}.key")),
    };
    Transport::MutualTls(Arc::new(PeerTls::load(files, id).unwrap()))
}

struct Node {
    replica: ReplicatedPartition,
    server: JoinHandle<()>,
}

async fn start_node(
    id: NodeId,
    dir: &Path,
    listener: TcpListener,
    peers: &PeerAddrs,
    transport: Transport,
) -> Node {
    let network = TcpNetwork::new(GROUP, peers.clone(), Duration::from_millis(500))
        .with_transport(transport.clone());
    let (replica, _) = ReplicatedPartition::start(
        StartOptions::data(
            id,
            raft_config(50, 150, 300),
            Arc::new(RealFs),
            dir.join(format!("node-{id}")),
        ),
        network,
    )
    .await
    .unwrap();
    let table = GroupTable::new();
    table.insert_replica(GROUP, &replica);
    let options = ServeOptions {
        transport,
        members: Some(Arc::new(BTreeSet::from([1, 2, 3]))),
        ..ServeOptions::default()
    };
    let server = tokio::spawn(serve_with(listener, Arc::new(table), options));
    Node { replica, server }
}

async fn wait_for_leader(nodes: &[&ReplicatedPartition]) -> ReplicatedPartition {
    tokio::time::timeout(WAIT, async {
        loop {
            for r in nodes {
                if r.leader_epoch().is_some() {
                    return (*r).clone();
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("no leader elected in time")
}

async fn append(leader: &ReplicatedPartition, i: usize) -> i64 {
    let batch = build_batch(&[format!("record-{i}").into_bytes()], 1_700_000_000_000);
    leader.append(Bytes::from(batch)).await.unwrap().base_offset
}

/// One vote request from a client over `transport` to node `target` at `addr`, as candidate
/// `candidate`: the error text, or "granted"/"refused" when the peer answered a vote.
async fn try_vote(
    transport: Transport,
    target: NodeId,
    addr: &str,
    candidate: NodeId,
) -> Result<(), String> {
    let peers: PeerAddrs = Arc::new(BTreeMap::from([(target, addr.to_string())]));
    let mut network =
        TcpNetwork::new(GROUP, peers, Duration::from_secs(3)).with_transport(transport);
    let mut link = network.new_client(target, &EmptyNode {}).await;
    let answer = link
        .vote(
            VoteRequest::new(Vote::new(1, candidate), None),
            RPCOption::new(Duration::from_secs(3)),
        )
        .await;
    match answer {
        Ok(_) => Ok(()),
        Err(RPCError::Unreachable(e)) => Err(e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_brokers_replicate_over_mutual_tls_and_refuse_strangers() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let ca = Ca::generate("cluster CA").unwrap();
    ca.write(&certs).unwrap();
    let trusted = certs.join("ca.crt");

    let mut listeners = Vec::new();
    let mut peers = BTreeMap::new();
    for id in 1..=3u64 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        peers.insert(id, listener.local_addr().unwrap().to_string());
        listeners.push((id, listener));
    }
    let peers: PeerAddrs = Arc::new(peers);
    let mut nodes = Vec::new();
    for (id, listener) in listeners {
        let t = transport(&certs, &ca, id, &trusted);
        nodes.push(start_node(id, dir.path(), listener, &peers, t).await);
        // Not in the same instant: see net.rs on split votes.
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    nodes[0]
        .replica
        .initialize(BTreeSet::from([1, 2, 3]))
        .await
        .unwrap();
    let replicas: Vec<&ReplicatedPartition> = nodes.iter().map(|n| &n.replica).collect();
    let leader = wait_for_leader(&replicas).await;
    for i in 0..100 {
        assert_eq!(append(&leader, i).await, i as i64);
    }
    let follower = *[1, 2, 3].iter().find(|id| **id != leader.id()).unwrap();
    let follower_addr = peers[&follower].clone();

    // Plain TCP to a TLS listener: the handshake fails, nothing is served.
    let err = try_vote(Transport::Plain, follower, &follower_addr, 9)
        .await
        .unwrap_err();
    assert!(err.contains("connection closed"), "{err}");

    // A certificate another CA signed, for a member's id, with the right CA trusted (so only
    // the listener can refuse it).
    let rogue_dir = dir.path().join("rogue");
    std::fs::create_dir_all(&rogue_dir).unwrap();
    let rogue_ca = Ca::generate("rogue CA").unwrap();
    let rogue = transport(&rogue_dir, &rogue_ca, 2, &trusted);
    let err = try_vote(rogue, follower, &follower_addr, 2)
        .await
        .unwrap_err();
    // The server's alert names the reason; a reset can overtake it when the client's request
    // arrived before the refusal (TLS 1.3 lets it write right after its Finished).
    assert!(
        err.contains("UnknownCA") || err.contains("reset by peer"),
        "{err}"
    );

    // A node the cluster CA certified but that is not a member.
    let stranger = transport(&certs, &ca, 9, &trusted);
    let err = try_vote(stranger, follower, &follower_addr, 9)
        .await
        .unwrap_err();
    // Closed right after the handshake, before any request is read: the client sees the
    // close, or a reset when its request was still unread in the server's socket buffer.
    assert!(
        err.contains("closed") || err.contains("reset by peer"),
        "{err}"
    );

    // A member whose certificate says node 2 cannot ask for votes as node 3 (nor as anyone
    // else it is not).
    let speaker = if follower == 2 { 3 } else { 2 };
    let member = transport(&certs, &ca, speaker, &trusted);
    let impostor = if speaker == 2 { 3 } else { 2 };
    let err = try_vote(member.clone(), follower, &follower_addr, impostor)
        .await
        .unwrap_err();
    assert!(
        err.contains(&format!("cannot send Vote request as node {impostor}")),
        "{err}"
    );
    // The same member speaking as itself gets through the listener: the replica itself
    // refuses the vote, as it hears from its leader (its vote lease), or answers it (its
    // stale term is simply not granted).
    if let Err(e) = try_vote(member, follower, &follower_addr, speaker).await {
        assert!(e.contains("heard from its leader"), "{e}");
    }

    // None of that disturbed the group: it keeps taking writes and every replica has them.
    for i in 100..150 {
        assert_eq!(append(&leader, i).await, i as i64);
    }
    tokio::time::timeout(WAIT, async {
        while !replicas.iter().all(|r| r.high_watermark() == 150) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("replicas converge on 150");

    // Fail over on TLS links: the leader goes, a follower leads with everything.
    let old = nodes
        .iter()
        .find(|n| n.replica.id() == leader.id())
        .unwrap();
    old.replica.shutdown().await;
    old.server.abort();
    let survivors: Vec<&ReplicatedPartition> = nodes
        .iter()
        .filter(|n| n.replica.id() != leader.id())
        .map(|n| &n.replica)
        .collect();
    let successor = wait_for_leader(&survivors).await;
    assert_ne!(successor.id(), leader.id());
    assert_eq!(
        tokio::time::timeout(WAIT, append(&successor, 150))
            .await
            .unwrap(),
        150
    );
    for n in &nodes {
        n.replica.shutdown().await;
        n.server.abort();
    }
}

#[tokio::test]
async fn a_peer_holds_at_most_its_connection_limit() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let options = ServeOptions {
        connections_per_peer_max: 2,
        ..ServeOptions::default()
    };
    let server = tokio::spawn(serve_with(listener, Arc::new(GroupTable::new()), options));
    let peers: PeerAddrs = Arc::new(BTreeMap::from([(1, addr)]));
    let option = RPCOption::new(Duration::from_secs(3));
    let mut links = Vec::new();
    let mut answers = Vec::new();
    for group in ["a/0", "b/0", "c/0"] {
        let mut network = TcpNetwork::new(group, peers.clone(), Duration::from_secs(3));
        let mut link = network.new_client(1, &EmptyNode {}).await;
        let answer = link
            .vote(VoteRequest::new(Vote::new(1, 2), None), option.clone())
            .await;
        answers.push(format!("{answer:?}"));
        // Each link keeps its connection open after an "unknown group" answer.
        links.push(link);
    }
    assert!(answers[0].contains("unknown group"), "{answers:?}");
    assert!(answers[1].contains("unknown group"), "{answers:?}");
    assert!(
        !answers[2].contains("unknown group"),
        "the third connection is refused before any request is read: {answers:?}"
    );
    // A slot frees when a connection closes.
    drop(links.remove(0));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut network = TcpNetwork::new("d/0", peers.clone(), Duration::from_secs(3));
    let mut link = network.new_client(1, &EmptyNode {}).await;
    let answer = link
        .vote(VoteRequest::new(Vote::new(1, 2), None), option)
        .await;
    assert!(
        format!("{answer:?}").contains("unknown group"),
        "{answer:?}"
    );
    server.abort();
}
