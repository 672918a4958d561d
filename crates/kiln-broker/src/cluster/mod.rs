//! Cluster mode: this broker is one of N, every partition is a Raft group of (up to) three
//! replicas, and the topic list is itself a replicated log.
//!
//! * `metadata`: the commands of the cluster metadata log and replica assignment.
//! * `replica`: one local replica (files, Raft node, proposer).
//!
//! Three kinds of Raft group run on every broker, all over one Raft listener
//! (`kiln_raft::net`): `__cluster_metadata/0` (the controller is its leader),
//! `__consumer_offsets/0` (the group coordinator is its leader; groups::offsets writes through
//! it) and `<topic id>/<partition>` for each partition this broker holds a replica of.
//! docs/replication.md describes the whole.

pub mod metadata;
pub mod replica;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use kiln_raft::net::{PeerAddrs, RaftGroups};
use tokio::net::TcpListener;
use tokio::sync::watch;
use uuid::Uuid;

use crate::catalog::PARTITIONS_PER_TOPIC_MAX;
use crate::config::{split_host_port, ClusterSettings};
use crate::time::now_ms;
use crate::topic_config::{self, TopicSettings};
use crate::traffic::TopicTraffic;
use crate::LogSettings;
use metadata::Command;
pub use replica::Replica;

pub const METADATA_GROUP: &str = "__cluster_metadata/0";
pub const OFFSETS_GROUP: &str = "__consumer_offsets/0";
/// Bytes the metadata applier reads per step.
const METADATA_READ_BYTES: usize = 4 << 20;

/// A topic as the metadata log defines it.
pub struct ClusterTopic {
    pub name: String,
    pub id: Uuid,
    pub overrides: BTreeMap<String, String>,
    pub settings: TopicSettings,
    /// Per partition, the brokers holding a replica, the preferred leader first.
    pub assignments: Vec<Vec<i32>>,
    /// This broker's replica of each partition (`None` where it holds none), opened before
    /// the topic becomes visible: produce and fetch find it by index, not by group name.
    replicas: Vec<Option<Arc<Replica>>>,
    pub traffic: TopicTraffic,
}

impl ClusterTopic {
    pub fn partition_count(&self) -> i32 {
        i32::try_from(self.assignments.len()).unwrap_or(i32::MAX)
    }
}

/// A peer as clients see it.
#[derive(Debug, Clone)]
pub struct PeerBroker {
    pub id: i32,
    pub host: String,
    pub port: i32,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("this broker is not the controller; the controller is {0}")]
    NotController(i32),
    #[error("topic {0:?} already exists")]
    AlreadyExists(String),
    #[error("topic {0:?} does not exist")]
    NotFound(String),
    #[error("{0}")]
    InvalidName(String),
    #[error("{0}")]
    InvalidPartitions(String),
    #[error("{0}")]
    InvalidReplicationFactor(String),
    #[error("{0}")]
    InvalidConfig(String),
    #[error("the metadata log did not take the change: {0}")]
    NotCommitted(String),
    #[error("timed out waiting for the change to be applied")]
    Timeout,
}

pub struct Cluster {
    pub node_id: i32,
    pub settings: ClusterSettings,
    pub brokers: Vec<PeerBroker>,
    raft_peers: PeerAddrs,
    replicas_dir: PathBuf,
    log_defaults: LogSettings,
    default_max_batch_bytes: usize,
    groups: RwLock<HashMap<String, Arc<Replica>>>,
    topics: RwLock<BTreeMap<String, Arc<ClusterTopic>>>,
    pub metadata: Arc<Replica>,
    pub offsets: Arc<Replica>,
    /// The metadata log offset applied so far (the controller waits for its own commands).
    applied: watch::Sender<i64>,
    /// One topic change at a time on the controller, so "exists?" and "propose" cannot race.
    controller_lock: tokio::sync::Mutex<()>,
    /// The id every broker reports, from the metadata log.
    cluster_id: RwLock<Option<String>>,
    /// The Raft listener and the metadata appliers, stopped by `shutdown`.
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // Maps are changed only by single inserts and removes: a panic elsewhere leaves them whole.
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

/// Raft RPCs from peers find their group here.
struct Groups(Arc<Cluster>);

impl RaftGroups for Groups {
    fn raft(&self, group: &str) -> Option<kiln_raft::types::Raft> {
        self.0.replica(group).map(|r| {
            r.heard_from_peer();
            r.partition.raft().clone()
        })
    }

    // Lets the server refuse votes while a replica repairs damaged files, and requests while
    // its disk is full.
    fn health(&self, group: &str) -> Option<kiln_raft::ReplicaHealth> {
        self.0.replica(group).map(|r| r.partition.health())
    }
}

pub struct StartParams {
    pub node_id: i32,
    pub settings: ClusterSettings,
    pub data_dir: PathBuf,
    pub log_defaults: LogSettings,
    pub default_max_batch_bytes: usize,
}

impl Cluster {
    /// Binds the Raft listener, opens the metadata and offsets groups and starts applying the
    /// metadata log. Topics appear as their creations are applied.
    pub async fn start(p: StartParams) -> anyhow::Result<Arc<Cluster>> {
        let settings = p.settings;
        let mut brokers = Vec::new();
        let mut raft_peers = BTreeMap::new();
        for peer in &settings.peers {
            let (host, port) = split_host_port(&peer.kafka).map_err(anyhow::Error::msg)?;
            brokers.push(PeerBroker {
                id: peer.id,
                host,
                port,
            });
            let id = replica::node(peer.id).context("negative peer id")?;
            raft_peers.insert(id, peer.raft.clone());
        }
        brokers.sort_by_key(|b| b.id);
        let raft_peers: PeerAddrs = Arc::new(raft_peers);
        let listener = TcpListener::bind(settings.raft_listen)
            .await
            .with_context(|| format!("binding the Raft listener {}", settings.raft_listen))?;
        let replicas_dir = p.data_dir.join("replicas");
        let all: Vec<i32> = brokers.iter().map(|b| b.id).collect();
        // Prefer different brokers as controller and as group coordinator.
        let coordinator_first = rotate(&all, 1);
        let open = |group: &str, dir: PathBuf, members: Vec<i32>| {
            replica::open(replica::OpenParams {
                node_id: p.node_id,
                group: group.to_string(),
                dir,
                members,
                peers: raft_peers.clone(),
                config: raft_config(&settings),
                rpc_timeout: Duration::from_millis(settings.rpc_timeout_ms),
                max_entry_bytes: settings.max_entry_bytes,
                silence: silence(&settings),
            })
        };
        // Serve RPCs before the groups exist: peers retry "unknown group" until they do.
        let metadata = open(
            METADATA_GROUP,
            replicas_dir.join("__cluster_metadata"),
            all.clone(),
        )
        .await
        .context("opening the cluster metadata replica")?;
        let offsets = open(
            OFFSETS_GROUP,
            replicas_dir.join("__consumer_offsets"),
            coordinator_first,
        )
        .await
        .context("opening the consumer offsets replica")?;
        let (applied, _) = watch::channel(0);
        let cluster = Arc::new(Cluster {
            node_id: p.node_id,
            settings,
            brokers,
            raft_peers,
            replicas_dir,
            log_defaults: p.log_defaults,
            default_max_batch_bytes: p.default_max_batch_bytes,
            groups: RwLock::new(HashMap::new()),
            topics: RwLock::new(BTreeMap::new()),
            metadata: metadata.clone(),
            offsets: offsets.clone(),
            applied,
            controller_lock: tokio::sync::Mutex::new(()),
            cluster_id: RwLock::new(None),
            tasks: std::sync::Mutex::new(Vec::new()),
        });
        cluster.insert_replica(metadata);
        cluster.insert_replica(offsets);
        let tasks = vec![
            tokio::spawn(kiln_raft::net::serve(
                listener,
                Arc::new(Groups(cluster.clone())),
            )),
            tokio::spawn(apply_metadata(cluster.clone())),
            tokio::spawn(ensure_cluster_id(cluster.clone())),
        ];
        *cluster.tasks.lock().unwrap_or_else(|e| e.into_inner()) = tasks;
        tracing::info!(node_id = p.node_id, raft = %cluster.settings.raft_listen, peers = cluster.brokers.len(), "cluster mode: Raft listener up");
        Ok(cluster)
    }

    fn insert_replica(&self, replica: Arc<Replica>) {
        write(&self.groups).insert(replica.group.clone(), replica);
    }

    /// The replicated cluster id, once applied.
    pub fn cluster_id(&self) -> Option<String> {
        read(&self.cluster_id).clone()
    }

    pub fn replica(&self, group: &str) -> Option<Arc<Replica>> {
        read(&self.groups).get(group).cloned()
    }

    pub fn topic(&self, name: &str) -> Option<Arc<ClusterTopic>> {
        read(&self.topics).get(name).cloned()
    }

    pub fn topics(&self) -> Vec<Arc<ClusterTopic>> {
        read(&self.topics).values().cloned().collect()
    }

    /// The local replica of a topic's partition, if this broker holds one.
    pub fn partition(&self, topic: &ClusterTopic, index: i32) -> Option<Arc<Replica>> {
        usize::try_from(index)
            .ok()
            .and_then(|i| topic.replicas.get(i))
            .and_then(Option::clone)
    }

    /// Every replica this broker holds, groups of the metadata and offsets logs included.
    pub fn replicas(&self) -> Vec<Arc<Replica>> {
        read(&self.groups).values().cloned().collect()
    }

    /// The controller's broker id, or -1 while the metadata group has no leader.
    pub fn controller(&self) -> i32 {
        self.metadata.leader().0
    }

    pub fn broker(&self, id: i32) -> Option<&PeerBroker> {
        self.brokers.iter().find(|b| b.id == id)
    }

    /// Creates a topic through the metadata log. Controller only.
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        replication_factor: Option<u16>,
        overrides: BTreeMap<String, String>,
        validate_only: bool,
    ) -> Result<(), ClusterError> {
        topic_config::validate_topic_name(name).map_err(ClusterError::InvalidName)?;
        if partitions == 0 || partitions > PARTITIONS_PER_TOPIC_MAX {
            return Err(ClusterError::InvalidPartitions(format!(
                "partition count {partitions} must be between 1 and {PARTITIONS_PER_TOPIC_MAX}"
            )));
        }
        let rf =
            usize::from(replication_factor.unwrap_or(self.settings.default_replication_factor));
        if rf == 0 || rf > self.brokers.len() {
            return Err(ClusterError::InvalidReplicationFactor(format!(
                "replication factor {rf} must be between 1 and the {} brokers of the cluster",
                self.brokers.len()
            )));
        }
        topic_config::resolve(&self.log_defaults, self.default_max_batch_bytes, &overrides)
            .map_err(ClusterError::InvalidConfig)?;
        let _one_at_a_time = self.controller_lock.lock().await;
        if !self.metadata.is_leader() {
            return Err(ClusterError::NotController(self.controller()));
        }
        if self.topic(name).is_some() {
            return Err(ClusterError::AlreadyExists(name.to_string()));
        }
        if validate_only {
            return Ok(());
        }
        let ids: Vec<i32> = self.brokers.iter().map(|b| b.id).collect();
        let rotation = read(&self.topics).len();
        let command = Command::CreateTopic {
            name: name.to_string(),
            id: Uuid::new_v4(),
            overrides,
            assignments: metadata::assign(&ids, partitions, rf, rotation),
        };
        self.propose(&command).await
    }

    /// Deletes a topic through the metadata log. Controller only.
    pub async fn delete_topic(&self, name: &str) -> Result<(), ClusterError> {
        let _one_at_a_time = self.controller_lock.lock().await;
        if !self.metadata.is_leader() {
            return Err(ClusterError::NotController(self.controller()));
        }
        let topic = self
            .topic(name)
            .ok_or_else(|| ClusterError::NotFound(name.to_string()))?;
        let command = Command::DeleteTopic {
            name: name.to_string(),
            id: topic.id,
        };
        self.propose(&command).await
    }

    /// Appends a command and waits until this broker has applied it.
    async fn propose(&self, command: &Command) -> Result<(), ClusterError> {
        let batch = metadata::encode(command, now_ms()).map_err(ClusterError::NotCommitted)?;
        let ack = self
            .metadata
            .proposer
            .submit(batch)
            .await
            .map_err(|_| ClusterError::NotCommitted("the metadata replica stopped".into()))?
            .map_err(|e| match e {
                kiln_raft::PartitionError::NotLeader { leader } => ClusterError::NotController(
                    leader.and_then(|l| i32::try_from(l).ok()).unwrap_or(-1),
                ),
                other => ClusterError::NotCommitted(other.to_string()),
            })?;
        let mut applied = self.applied.subscribe();
        let wait = async {
            applied
                .wait_for(|offset| *offset > ack.last_offset)
                .await
                .is_ok()
        };
        match tokio::time::timeout(Duration::from_secs(30), wait).await {
            Ok(true) => Ok(()),
            _ => Err(ClusterError::Timeout),
        }
    }

    /// Applies committed metadata commands, in log order.
    async fn apply(&self, commands: Vec<Command>) {
        for command in commands {
            match command {
                Command::InitCluster { cluster_id } => {
                    let mut current = write(&self.cluster_id);
                    if current.is_none() {
                        tracing::info!(%cluster_id, "cluster id");
                        *current = Some(cluster_id);
                    }
                }
                Command::CreateTopic {
                    name,
                    id,
                    overrides,
                    assignments,
                } => {
                    if self.topic(&name).is_some() {
                        continue;
                    }
                    let settings = match topic_config::resolve(
                        &self.log_defaults,
                        self.default_max_batch_bytes,
                        &overrides,
                    ) {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::error!(topic = %name, error = %e, "topic settings no longer valid here; using the broker defaults");
                            match topic_config::resolve(
                                &self.log_defaults,
                                self.default_max_batch_bytes,
                                &BTreeMap::new(),
                            ) {
                                Ok(s) => s,
                                Err(_) => continue,
                            }
                        }
                    };
                    let mut replicas = Vec::with_capacity(assignments.len());
                    for (index, members) in assignments.iter().enumerate() {
                        if !members.contains(&self.node_id) {
                            replicas.push(None);
                            continue;
                        }
                        let index = i32::try_from(index).unwrap_or(i32::MAX);
                        let group = partition_group(id, index);
                        let dir = self
                            .replicas_dir
                            .join(id.to_string())
                            .join(index.to_string());
                        let opened = replica::open(replica::OpenParams {
                            node_id: self.node_id,
                            group: group.clone(),
                            dir,
                            members: members.clone(),
                            peers: self.raft_peers.clone(),
                            config: raft_config(&self.settings),
                            rpc_timeout: Duration::from_millis(self.settings.rpc_timeout_ms),
                            max_entry_bytes: self.settings.max_entry_bytes,
                            silence: silence(&self.settings),
                        })
                        .await;
                        match opened {
                            Ok(r) => {
                                self.insert_replica(r.clone());
                                replicas.push(Some(r));
                            }
                            Err(e) => {
                                tracing::error!(topic = %name, partition = index, error = %e, "cannot open this broker's replica; it serves nothing for this partition");
                                replicas.push(None);
                            }
                        }
                    }
                    tracing::info!(topic = %name, %id, partitions = assignments.len(), "topic created");
                    write(&self.topics).insert(
                        name.clone(),
                        Arc::new(ClusterTopic {
                            name,
                            id,
                            overrides,
                            settings,
                            assignments,
                            replicas,
                            traffic: TopicTraffic::default(),
                        }),
                    );
                }
                Command::DeleteTopic { name, id } => {
                    let removed = {
                        let mut topics = write(&self.topics);
                        match topics.get(&name) {
                            Some(t) if t.id == id => topics.remove(&name),
                            _ => None,
                        }
                    };
                    let Some(topic) = removed else { continue };
                    for r in topic.replicas.iter().flatten() {
                        write(&self.groups).remove(&r.group);
                        r.partition.shutdown().await;
                    }
                    let dir = self.replicas_dir.join(id.to_string());
                    if let Err(e) = tokio::fs::remove_dir_all(&dir).await {
                        if e.kind() != std::io::ErrorKind::NotFound {
                            tracing::warn!(topic = %name, dir = %dir.display(), error = %e, "could not remove a deleted topic's replicas");
                        }
                    }
                    tracing::info!(topic = %name, %id, "topic deleted");
                }
            }
        }
    }

    /// Stops the Raft listener and every Raft node (their logs stay on disk).
    pub async fn shutdown(&self) {
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            task.abort();
        }
        for replica in self.replicas() {
            replica.partition.shutdown().await;
        }
    }
}

/// The Raft group name of a topic partition: by id, so a topic deleted and created again under
/// the same name never meets the old one's replicas.
pub fn partition_group(topic_id: Uuid, index: i32) -> String {
    format!("{topic_id}/{index}")
}

fn rotate(ids: &[i32], by: usize) -> Vec<i32> {
    let n = ids.len().max(1);
    (0..ids.len()).map(|i| ids[(i + by) % n]).collect()
}

/// How long a follower trusts a leader it has not heard from: four heartbeats.
fn silence(s: &ClusterSettings) -> Duration {
    Duration::from_millis(s.heartbeat_ms.saturating_mul(4))
}

fn raft_config(s: &ClusterSettings) -> openraft::Config {
    let mut config = kiln_raft::partition::raft_config(
        s.heartbeat_ms,
        s.election_timeout_min_ms,
        s.election_timeout_max_ms,
    );
    // openraft gives each AppendEntries one heartbeat interval to complete, the follower's
    // fsync included: keep one message to a few entries of at most max_entry_bytes.
    config.max_payload_entries = 4;
    config
}

/// The first controller names the cluster; until then brokers report their own ids.
async fn ensure_cluster_id(cluster: Arc<Cluster>) {
    while cluster.cluster_id().is_none() {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let caught_up = *cluster.applied.borrow() >= cluster.metadata.partition.high_watermark();
        if cluster.cluster_id().is_none() && caught_up && cluster.metadata.is_leader() {
            let command = Command::InitCluster {
                cluster_id: format!("kiln-{}", Uuid::new_v4().simple()),
            };
            if let Err(e) = cluster.propose(&command).await {
                tracing::debug!(error = %e, "naming the cluster failed; retrying");
            }
        }
    }
}

/// Follows the metadata group's high watermark and applies each new command.
async fn apply_metadata(cluster: Arc<Cluster>) {
    let mut high_watermark = cluster.metadata.partition.subscribe_high_watermark();
    let mut next = 0i64;
    loop {
        let target = *high_watermark.borrow_and_update();
        while next < target {
            let batches = match cluster.metadata.partition.read(next, METADATA_READ_BYTES) {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(offset = next, error = %e, "reading the metadata log failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
            };
            if batches.is_empty() {
                break;
            }
            let mut commands = Vec::new();
            for batch in batches {
                let end = match kiln_log::BatchHeader::parse(&batch.bytes) {
                    Ok(h) => batch.base_offset + i64::from(h.record_count),
                    Err(_) => batch.base_offset + 1,
                };
                for (offset, parsed) in metadata::decode(batch.bytes) {
                    if offset >= 0 && offset < next {
                        continue;
                    }
                    match parsed {
                        Ok(c) => commands.push(c),
                        Err(e) => {
                            tracing::error!(offset, error = %e, "skipping a metadata record that does not parse")
                        }
                    }
                }
                next = next.max(end);
            }
            cluster.apply(commands).await;
            cluster.applied.send_replace(next);
        }
        if high_watermark.changed().await.is_err() {
            return;
        }
    }
}
