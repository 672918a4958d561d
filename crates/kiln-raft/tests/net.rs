//! The TCP transport for Raft RPCs (`kiln_raft::net`), over real sockets on 127.0.0.1.
//!
//! * `three_brokers_replicate_and_fail_over`: three replicas of two groups that share one
//!   listener and one connection per peer on each broker, real files; 200 acknowledged
//!   appends, convergence, the leader shut down, a new leader that keeps the old records and
//!   takes new ones.
//! * the others: an unknown group, a wrong target node, a refused connection, a peer that never
//!   answers, and frames the server must refuse.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kiln_log::fs::RealFs;
use kiln_raft::net::{serve, GroupTable, Mesh, PeerAddrs, TcpNetwork, Transport};
use kiln_raft::partition::raft_config;
use kiln_raft::sim::build_batch;
use kiln_raft::{NodeId, ReplicatedPartition, StartOptions};
use openraft::error::RPCError;
use openraft::network::RPCOption;
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::{EmptyNode, RaftNetwork, RaftNetworkFactory, Vote};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const ORDERS: &str = "orders/3";
const METADATA: &str = "__cluster_metadata/0";
const WAIT: Duration = Duration::from_secs(20);

struct Broker {
    id: NodeId,
    orders: ReplicatedPartition,
    metadata: ReplicatedPartition,
    /// The connections both groups' RPCs share.
    mesh: Arc<Mesh>,
    server: JoinHandle<()>,
}

async fn start_replica(
    id: NodeId,
    dir: &Path,
    group: &str,
    mesh: &Arc<Mesh>,
) -> ReplicatedPartition {
    let dir = dir.join(group.replace('/', "-"));
    let network = TcpNetwork::on(group, mesh.clone(), Duration::from_millis(500));
    let (partition, _) = ReplicatedPartition::start(
        StartOptions::data(id, raft_config(50, 150, 300), Arc::new(RealFs), dir),
        network,
    )
    .await
    .unwrap();
    partition
}

async fn start_cluster(dir: &Path) -> (Vec<Broker>, PeerAddrs) {
    let mut listeners = Vec::new();
    let mut peers = BTreeMap::new();
    for id in 1..=3u64 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        peers.insert(id, listener.local_addr().unwrap().to_string());
        listeners.push((id, listener));
    }
    let peers: PeerAddrs = Arc::new(peers);
    let mut brokers = Vec::new();
    for (id, listener) in listeners {
        let home = dir.join(format!("broker-{id}"));
        let mesh = Arc::new(Mesh::new(
            peers.clone(),
            Transport::Plain,
            kiln_raft::net::DEFAULT_CONNECT_TIMEOUT,
        ));
        let orders = start_replica(id, &home, ORDERS, &mesh).await;
        let metadata = start_replica(id, &home, METADATA, &mesh).await;
        let table = GroupTable::new();
        table.insert(ORDERS, orders.raft().clone());
        table.insert(METADATA, metadata.raft().clone());
        let server = tokio::spawn(serve(listener, Arc::new(table)));
        brokers.push(Broker {
            id,
            orders,
            metadata,
            mesh,
            server,
        });
        // openraft 0.9 checks election timeouts only on its tick (every 1.5 heartbeats, 75 ms
        // here) and draws each node's timeout once, at start. Replicas started in the same
        // instant tick in phase, and two whose timeouts round to the same tick keep splitting
        // the vote (seen: 20 terms, 6 s). Brokers never start in the same millisecond; these
        // do not either.
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let members = BTreeSet::from([1, 2, 3]);
    brokers[0].orders.initialize(members.clone()).await.unwrap();
    brokers[0].metadata.initialize(members).await.unwrap();
    (brokers, peers)
}

/// Waits until every replica in `replicas` names the same leader, one of them, and returns it.
async fn wait_for_leader(replicas: &[&ReplicatedPartition]) -> ReplicatedPartition {
    let found = tokio::time::timeout(WAIT, async {
        loop {
            let leaders: Vec<Option<NodeId>> = replicas
                .iter()
                .map(|r| r.raft().metrics().borrow().current_leader)
                .collect();
            if let Some(Some(leader)) = leaders.first() {
                if leaders.iter().all(|l| *l == Some(*leader)) {
                    if let Some(r) = replicas
                        .iter()
                        .find(|r| r.id() == *leader && r.leader_epoch().is_some())
                    {
                        return (*r).clone();
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    found.expect("no leader elected in time")
}

async fn wait_for_high_watermark(replicas: &[&ReplicatedPartition], hw: i64) {
    let done = tokio::time::timeout(WAIT, async {
        while !replicas.iter().all(|r| r.high_watermark() == hw) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let now: Vec<i64> = replicas.iter().map(|r| r.high_watermark()).collect();
    assert!(done.is_ok(), "replicas did not converge on {hw}: {now:?}");
}

fn record(i: usize) -> Vec<u8> {
    build_batch(
        &[format!("record-{i}").into_bytes()],
        1_700_000_000_000 + i as i64,
    )
}

/// Reads everything below the high watermark and checks it is `expected[offset]`, one
/// single-record batch per offset. The base offset and leader epoch are stamped on read, so
/// only the bytes from the magic byte on (which the batch CRC covers) are compared.
fn assert_log_holds(replica: &ReplicatedPartition, expected: &[Vec<u8>]) {
    let hw = replica.high_watermark();
    assert_eq!(hw, expected.len() as i64);
    let mut offset = 0i64;
    while offset < hw {
        let read = replica.read(offset, 64 << 10).unwrap();
        assert!(!read.records.is_empty(), "nothing read at {offset}");
        for b in kiln_log::batch::batches(&read.records) {
            let b = b.unwrap();
            assert_eq!(b.header.base_offset, offset);
            let want = &expected[offset as usize];
            assert_eq!(&b.bytes[16..], &want[16..], "record at offset {offset}");
            offset += 1;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_brokers_replicate_and_fail_over() {
    let dir = tempfile::tempdir().unwrap();
    let (brokers, _peers) = start_cluster(dir.path()).await;
    let orders: Vec<&ReplicatedPartition> = brokers.iter().map(|b| &b.orders).collect();
    let metadata: Vec<&ReplicatedPartition> = brokers.iter().map(|b| &b.metadata).collect();

    let leader = wait_for_leader(&orders).await;
    let mut expected = Vec::new();
    for i in 0..200 {
        let batch = record(i);
        let ack = leader.append(Bytes::from(batch.clone())).await.unwrap();
        assert_eq!((ack.base_offset, ack.last_offset), (i as i64, i as i64));
        expected.push(batch);
    }
    wait_for_high_watermark(&orders, 200).await;
    for replica in &orders {
        assert_log_holds(replica, &expected);
    }

    // The second group on the same listeners replicates independently.
    let meta_leader = wait_for_leader(&metadata).await;
    for i in 0..5 {
        let ack = meta_leader.append(Bytes::from(record(i))).await.unwrap();
        assert_eq!(ack.base_offset, i as i64);
    }
    wait_for_high_watermark(&metadata, 5).await;
    for b in &brokers {
        assert!(
            b.mesh.connections() <= 2,
            "broker {} holds {} connections for its two peers",
            b.id,
            b.mesh.connections()
        );
    }

    let old_epoch = leader.leader_epoch().expect("still the leader");
    // The leader's broker goes away: its Raft node stops and its listener closes.
    let old = brokers.iter().find(|b| b.id == leader.id()).unwrap();
    old.orders.shutdown().await;
    old.metadata.shutdown().await;
    old.server.abort();
    let survivors: Vec<&ReplicatedPartition> = brokers
        .iter()
        .filter(|b| b.id != old.id)
        .map(|b| &b.orders)
        .collect();
    let new_leader = wait_for_leader(&survivors).await;
    assert_ne!(new_leader.id(), old.id);
    for i in 200..250 {
        let batch = record(i);
        let ack = new_leader.append(Bytes::from(batch.clone())).await.unwrap();
        assert_eq!(ack.base_offset, i as i64);
        assert!(
            ack.leader_epoch > old_epoch,
            "{ack:?} after epoch {old_epoch}"
        );
        expected.push(batch);
    }
    wait_for_high_watermark(&survivors, 250).await;
    for replica in &survivors {
        assert_log_holds(replica, &expected);
    }

    for b in &brokers {
        b.orders.shutdown().await;
        b.metadata.shutdown().await;
        b.server.abort();
    }
}

fn vote_request() -> VoteRequest<NodeId> {
    VoteRequest::new(Vote::new(1, 2), None)
}

fn one_peer(id: NodeId, addr: String) -> PeerAddrs {
    Arc::new(BTreeMap::from([(id, addr)]))
}

#[tokio::test]
async fn an_unknown_group_gets_an_error_not_a_hang() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(serve(listener, Arc::new(GroupTable::new())));
    let mut network = TcpNetwork::new("orders/9", one_peer(1, addr), Duration::from_secs(5));
    let mut link = network.new_client(1, &EmptyNode {}).await;
    let option = RPCOption::new(Duration::from_secs(5));

    let answer = tokio::time::timeout(
        Duration::from_secs(2),
        link.vote(vote_request(), option.clone()),
    )
    .await
    .expect("an unknown group must be answered, not left to time out");
    match answer {
        Err(RPCError::Unreachable(e)) => {
            assert!(e.to_string().contains("unknown group"), "{e}")
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }
    let append = AppendEntriesRequest {
        vote: Vote::new_committed(1, 2),
        prev_log_id: None,
        leader_commit: None,
        entries: vec![],
    };
    let answer = tokio::time::timeout(Duration::from_secs(2), link.append_entries(append, option))
        .await
        .expect("answered");
    assert!(
        matches!(&answer, Err(RPCError::Unreachable(e)) if e.to_string().contains("unknown group")),
        "{answer:?}"
    );
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_address_pointing_at_the_wrong_node_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mesh = Arc::new(Mesh::new(
        one_peer(1, addr.clone()),
        Transport::Plain,
        kiln_raft::net::DEFAULT_CONNECT_TIMEOUT,
    ));
    let node1 = start_replica(1, dir.path(), ORDERS, &mesh).await;
    let table = GroupTable::new();
    table.insert(ORDERS, node1.raft().clone());
    let server = tokio::spawn(serve(listener, Arc::new(table)));
    // This sender believes node 2 listens where node 1 does.
    let mut network = TcpNetwork::new(ORDERS, one_peer(2, addr), Duration::from_secs(5));
    let mut link = network.new_client(2, &EmptyNode {}).await;
    let answer = tokio::time::timeout(
        Duration::from_secs(2),
        link.vote(vote_request(), RPCOption::new(Duration::from_secs(5))),
    )
    .await
    .expect("answered");
    assert!(
        matches!(&answer, Err(RPCError::Unreachable(e)) if e.to_string().contains("this is node 1")),
        "{answer:?}"
    );
    node1.shutdown().await;
    server.abort();
}

#[tokio::test]
async fn a_refused_connection_is_unreachable_at_once() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let mut network = TcpNetwork::new(ORDERS, one_peer(2, addr), Duration::from_secs(5));
    let mut link = network.new_client(2, &EmptyNode {}).await;
    let answer = tokio::time::timeout(
        Duration::from_secs(2),
        link.vote(vote_request(), RPCOption::new(Duration::from_secs(5))),
    )
    .await
    .expect("answered");
    assert!(
        matches!(answer, Err(RPCError::Unreachable(_))),
        "{answer:?}"
    );
    // A target missing from the address book is unreachable too.
    let mut link = network.new_client(3, &EmptyNode {}).await;
    let answer = link
        .vote(vote_request(), RPCOption::new(Duration::from_secs(5)))
        .await;
    assert!(
        matches!(&answer, Err(RPCError::Unreachable(e)) if e.to_string().contains("no address")),
        "{answer:?}"
    );
}

#[tokio::test]
async fn a_peer_that_never_answers_times_out_within_the_smaller_deadline() {
    // Bound but never accepted: the kernel completes the handshake, nobody reads.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut network = TcpNetwork::new(ORDERS, one_peer(2, addr), Duration::from_millis(200));
    let mut link = network.new_client(2, &EmptyNode {}).await;
    let started = tokio::time::Instant::now();
    let answer = link
        .vote(vote_request(), RPCOption::new(Duration::from_secs(10)))
        .await;
    match answer {
        Err(RPCError::Timeout(t)) => assert_eq!(t.timeout, Duration::from_millis(200)),
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(2));
    // openraft's own deadline wins when it is the smaller one.
    let answer = link
        .vote(vote_request(), RPCOption::new(Duration::from_millis(80)))
        .await;
    match answer {
        Err(RPCError::Timeout(t)) => assert_eq!(t.timeout, Duration::from_millis(80)),
        other => panic!("expected Timeout, got {other:?}"),
    }
    drop(listener);
}

/// Sends raw bytes to a fresh server and returns everything it answers before it closes.
async fn server_answer_to(bytes: &[u8]) -> Vec<u8> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(serve(listener, Arc::new(GroupTable::new())));
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("the server closes the connection")
        .unwrap();
    server.abort();
    answer
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[tokio::test]
async fn the_server_refuses_bad_frames_and_closes_the_connection() {
    // A body of kind 3 (Vote request), request id 9, for group "g", whose header carries the
    // wrong CRC.
    let body = [3u8, 0, 0, 0, 9, 0, 1, b'g'];
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&(crc32c::crc32c(&body) ^ 1).to_be_bytes());
    frame.extend_from_slice(&body);
    let answer = server_answer_to(&frame).await;
    assert!(
        contains(&answer, "checksum"),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );

    // A length past the limit: refused from the header alone.
    let mut header = (u32::MAX).to_be_bytes().to_vec();
    header.extend_from_slice(&0u32.to_be_bytes());
    let answer = server_answer_to(&header).await;
    assert!(
        contains(&answer, "limit"),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );

    // A valid CRC over a payload that ends early.
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
    frame.extend_from_slice(&body);
    let answer = server_answer_to(&frame).await;
    assert!(
        contains(&answer, "malformed"),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
}
