//! A three-broker cluster over real sockets and files, for the damage and full-disk tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kiln_log::faulty_fs::{Faults, FaultyFs, ENOSPC};
use kiln_log::fs::RealFs;
use kiln_log::LogConfig;
use kiln_raft::log_store::LogRecovery;
use kiln_raft::net::{serve, GroupTable, LinkCuts, PeerAddrs, TcpNetwork};
use kiln_raft::partition::raft_config;
use kiln_raft::sim::build_batch;
use kiln_raft::{NodeId, ReplicatedPartition, StartOptions};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub const GROUP: &str = "orders/0";
pub const WAIT: Duration = Duration::from_secs(20);

pub struct Broker {
    pub id: NodeId,
    pub dir: PathBuf,
    pub replica: ReplicatedPartition,
    pub recovery: LogRecovery,
    pub server: JoinHandle<()>,
    /// Its log segments' faults: `set_full(true)` and every segment write fails with ENOSPC,
    /// as on a full filesystem.
    pub faults: Arc<Faults>,
}

impl Broker {
    /// Stops the replica and its listener (awaited, so its port can be bound again).
    pub async fn stop(&self) {
        self.replica.shutdown().await;
        self.server.abort();
        while !self.server.is_finished() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Starts broker `id` on `listener` with its files in `dir`.
pub async fn start_broker(
    id: NodeId,
    dir: &Path,
    listener: TcpListener,
    peers: &PeerAddrs,
) -> Broker {
    start_broker_with(id, dir, listener, peers, LogConfig::default()).await
}

/// As [`start_broker`], with the log settings `log`.
pub async fn start_broker_with(
    id: NodeId,
    dir: &Path,
    listener: TcpListener,
    peers: &PeerAddrs,
    log: LogConfig,
) -> Broker {
    start_broker_timed(
        id,
        dir,
        listener,
        peers,
        log,
        raft_config(50, 150, 300),
        None,
    )
    .await
}

/// As [`start_broker`], for a replica that stands for no election for its first 5 s: a test
/// whose leader must keep its term while a follower restarts. (The leader's transport may
/// wait out a reconnect backoff before it reaches the restarted follower, longer than the
/// usual 150–300 ms election timeout.)
pub async fn start_patient_follower(
    id: NodeId,
    dir: &Path,
    listener: TcpListener,
    peers: &PeerAddrs,
) -> Broker {
    let config = raft_config(50, 5_000, 6_000);
    start_broker_timed(id, dir, listener, peers, LogConfig::default(), config, None).await
}

/// Starts three new brokers under `root` whose Raft links `cuts` can cut.
pub async fn start_cluster_cuttable(root: &Path, cuts: &Arc<LinkCuts>) -> Vec<Broker> {
    let (listeners, peers) = listeners(None).await;
    let mut brokers = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let id = i as u64 + 1;
        let dir = root.join(format!("broker-{id}"));
        let config = raft_config(50, 150, 300);
        let cut = Some(cuts.clone());
        let log = LogConfig::default();
        brokers.push(start_broker_timed(id, &dir, listener, &peers, log, config, cut).await);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    brokers[0]
        .replica
        .initialize(BTreeSet::from([1, 2, 3]))
        .await
        .unwrap();
    brokers
}

async fn start_broker_timed(
    id: NodeId,
    dir: &Path,
    listener: TcpListener,
    peers: &PeerAddrs,
    log: LogConfig,
    config: openraft::Config,
    cuts: Option<Arc<LinkCuts>>,
) -> Broker {
    std::fs::create_dir_all(dir).unwrap();
    let faults = Faults::new(ENOSPC);
    let fs = Arc::new(FaultyFs::segments_only(Arc::new(RealFs), faults.clone()));
    let mut network = TcpNetwork::new(GROUP, peers.clone(), Duration::from_millis(500));
    if let Some(cuts) = cuts {
        network = network.with_cuts(id, cuts);
    }
    let mut opts = StartOptions::data(id, config, fs, dir);
    opts.log = log;
    let (replica, recovery) = ReplicatedPartition::start(opts, network).await.unwrap();
    let table = GroupTable::new();
    table.insert_replica(GROUP, &replica);
    let server = tokio::spawn(serve(listener, Arc::new(table)));
    Broker {
        id,
        dir: dir.to_path_buf(),
        replica,
        recovery,
        server,
        faults,
    }
}

/// Binds three listeners (or rebinds `addrs`) and returns them with the address book.
pub async fn listeners(addrs: Option<&PeerAddrs>) -> (Vec<TcpListener>, PeerAddrs) {
    let mut out = Vec::new();
    let mut peers = BTreeMap::new();
    for id in 1..=3u64 {
        let at = addrs.map_or("127.0.0.1:0".to_string(), |a| a[&id].clone());
        let listener = TcpListener::bind(&at).await.unwrap();
        peers.insert(id, listener.local_addr().unwrap().to_string());
        out.push(listener);
    }
    (out, Arc::new(peers))
}

/// Starts three brokers under `root` (new, or restarted on their files and addresses).
pub async fn start_cluster(root: &Path, addrs: Option<&PeerAddrs>) -> (Vec<Broker>, PeerAddrs) {
    start_cluster_with(root, addrs, LogConfig::default()).await
}

/// As [`start_cluster`], with the log settings `log`.
pub async fn start_cluster_with(
    root: &Path,
    addrs: Option<&PeerAddrs>,
    log: LogConfig,
) -> (Vec<Broker>, PeerAddrs) {
    start_cluster_timed(root, addrs, log, raft_config(50, 150, 300)).await
}

/// A new cluster whose leader's lease (`election_timeout_max` less a tick) outlasts a stall of
/// a few seconds: for tests that stop the followers and expect the leader to keep its term
/// until they are back.
pub async fn start_cluster_long_lease(root: &Path) -> (Vec<Broker>, PeerAddrs) {
    start_cluster_timed(
        root,
        None,
        LogConfig::default(),
        raft_config(50, 150, 8_000),
    )
    .await
}

async fn start_cluster_timed(
    root: &Path,
    addrs: Option<&PeerAddrs>,
    log: LogConfig,
    config: openraft::Config,
) -> (Vec<Broker>, PeerAddrs) {
    let (listeners, peers) = listeners(addrs).await;
    let mut brokers = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let id = i as u64 + 1;
        let dir = root.join(format!("broker-{id}"));
        let (log, config) = (log.clone(), config.clone());
        brokers.push(start_broker_timed(id, &dir, listener, &peers, log, config, None).await);
        // Replicas started in the same millisecond tick in phase and split votes (see
        // tests/net.rs); brokers never start together.
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    if addrs.is_none() {
        brokers[0]
            .replica
            .initialize(BTreeSet::from([1, 2, 3]))
            .await
            .unwrap();
    }
    (brokers, peers)
}

/// Waits until every replica in `replicas` names the same leader, one of them, and returns it.
pub async fn wait_for_leader(replicas: &[&ReplicatedPartition]) -> ReplicatedPartition {
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

/// [`wait_for_leader`] among the replicas of `brokers`.
pub async fn wait_for_leader_of(brokers: &[Broker]) -> ReplicatedPartition {
    let all: Vec<&ReplicatedPartition> = brokers.iter().map(|b| &b.replica).collect();
    wait_for_leader(&all).await
}

pub async fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let done = tokio::time::timeout(WAIT, async {
        while !ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(done.is_ok(), "timed out waiting for {what}");
}

pub fn record(i: usize) -> Vec<u8> {
    build_batch(
        &[format!("record-{i}").into_bytes()],
        1_700_000_000_000 + i as i64,
    )
}

/// Checks that `replica` holds `expected` (offset → single-record batch) below its high
/// watermark, which must be `expected.len()`. Only the bytes the batch CRC covers are
/// compared (base offset and leader epoch are stamped on read).
pub fn assert_log_holds(replica: &ReplicatedPartition, expected: &BTreeMap<i64, Vec<u8>>) {
    let hw = replica.high_watermark();
    assert_eq!(hw, expected.len() as i64, "replica {}", replica.id());
    let mut offset = 0i64;
    while offset < hw {
        let read = replica.read(offset, 64 << 10).unwrap();
        assert!(!read.records.is_empty(), "nothing read at {offset}");
        for b in kiln_log::batch::batches(&read.records) {
            let b = b.unwrap();
            assert_eq!(b.header.base_offset, offset);
            let want = &expected[&offset];
            assert_eq!(
                &b.bytes[16..],
                &want[16..],
                "replica {} offset {offset}",
                replica.id()
            );
            offset += 1;
        }
    }
}
