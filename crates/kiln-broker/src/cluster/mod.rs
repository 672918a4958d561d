//! The broker's topics and replicas. Every broker is one of a cluster: with a `[cluster]`
//! section one of N peers, without one a cluster of one. Every partition is a Raft group
//! (kiln-raft, on kiln-log segments), and so are the topic list and the consumer offsets.
//!
//! * `metadata`: the commands of the cluster metadata log, its table, replica assignment.
//! * `replica`: one local replica (directory, Raft node, proposer).
//!
//! Three kinds of Raft group run on every broker, over one Raft listener (`kiln_raft::net`)
//! when it has peers: `__cluster_metadata/0` (the controller is its leader; its table lists the
//! topics), `__consumer_offsets/0` (the group coordinator is its leader; its table is the
//! committed offsets) and `<topic id>/<partition>` for each partition this broker holds a
//! replica of. A reconciler follows the metadata table and opens or stops replicas as topics
//! come and go. docs/replication.md describes the whole.

pub mod acls;
pub mod elect;
mod fence;
mod forwarded;
pub mod join;
mod membership;
pub mod metadata;
pub mod moves;
pub mod producer_ids;
mod rebalance;
mod register;
pub mod replica;
mod topic_changes;
pub mod users;

pub use topic_changes::{ConfigChange, CONFIG_CHANGES_MAX};

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use futures_util::StreamExt;
use kiln_log::LogConfig;
use kiln_raft::net::{PeerAddrs, RaftGroups};
use kiln_raft::GroupKind;
use tokio::net::TcpListener;
use tokio::sync::watch;
use uuid::Uuid;

use crate::config::{split_host_port, ClusterSettings};
use crate::groups::offsets::OffsetsTable;
use crate::time::now_ms;
use crate::topic_config::{self, TopicSettings, PARTITIONS_PER_TOPIC_MAX};
use crate::traffic::TopicTraffic;
use crate::LogSettings;
use metadata::{Command, MetadataState, MetadataTable};
pub use replica::Replica;

pub const METADATA_GROUP: &str = "__cluster_metadata/0";
pub const OFFSETS_GROUP: &str = "__consumer_offsets/0";

/// Whether `group` is one of the internal groups every broker holds a replica of.
pub fn is_internal_group(group: &str) -> bool {
    group == METADATA_GROUP || group == OFFSETS_GROUP
}
/// The metadata group snapshots its table after this many commands.
const METADATA_SNAPSHOT_EVERY: u64 = 1_000;
/// Longest wait for a proposed topic change to be applied here.
pub(crate) const PROPOSE_WAIT: Duration = Duration::from_secs(30);
/// Longest wait, after a topic is created, for its local replicas to know their leaders.
const LEADER_WAIT: Duration = Duration::from_secs(5);
/// How often `wait_for_local_leaders` looks.
const LEADER_POLL: Duration = Duration::from_millis(5);

/// A topic as the metadata log defines it, with this broker's replicas of it.
pub struct ClusterTopic {
    pub name: String,
    pub id: Uuid,
    pub overrides: BTreeMap<String, String>,
    pub settings: TopicSettings,
    /// Per partition, the brokers holding a replica, the preferred leader first.
    pub assignments: Vec<Vec<i32>>,
    /// Moves under way, by partition: each one's target replicas (`moves.rs`).
    pub moves: BTreeMap<u32, Vec<i32>>,
    /// This broker's replica of each partition (`None` where it holds none), opened before
    /// the topic becomes visible: produce and fetch find it by index, not by group name.
    replicas: Vec<Option<Arc<Replica>>>,
    /// Shared with the topic's next version when its config or partitions change.
    pub traffic: Arc<TopicTraffic>,
}

impl ClusterTopic {
    pub fn partition_count(&self) -> i32 {
        i32::try_from(self.assignments.len()).unwrap_or(i32::MAX)
    }
}

/// A peer as clients see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerBroker {
    pub id: i32,
    /// Its main listener's advertised address.
    pub host: String,
    pub port: i32,
    /// Its addresses on `[[listeners]]`, by name.
    pub listeners: crate::listeners::Endpoints,
}

impl PeerBroker {
    /// Where a client of `listener` reaches this broker; `None` where it has no such listener.
    pub fn endpoint(&self, listener: &str) -> Option<(&str, i32)> {
        if listener == crate::listeners::MAIN_LISTENER {
            return Some((&self.host, self.port));
        }
        self.listeners
            .get(listener)
            .map(|(host, port)| (host.as_str(), *port))
    }
}

/// One topic of a CreateTopics request (or of a Metadata request that creates what it names),
/// checked on the controller ([`Cluster::create_topic`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NewTopic {
    pub name: String,
    pub partitions: u32,
    /// `None`: the cluster's `default_replication_factor`.
    pub replication_factor: Option<u16>,
    /// Topic settings that differ from the broker's defaults (`retention.ms`, ...).
    pub overrides: BTreeMap<String, String>,
    /// Checked and answered, not created.
    pub validate_only: bool,
}

/// Serializable: a controller's refusal of a forwarded change travels back as it is
/// (`forwarded.rs`).
#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
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
    /// A request Kiln does not carry out as asked (an operation that does not apply).
    #[error("{0}")]
    InvalidRequest(String),
    #[error("the metadata log did not take the change: {0}")]
    NotCommitted(String),
    #[error("timed out waiting for the change to be applied")]
    Timeout,
    /// A move's target that cannot be (`moves.rs`).
    #[error("{0}")]
    InvalidReplicaAssignment(String),
    #[error("{0}")]
    MoveInProgress(String),
    /// A cancel of a move that is not under way.
    #[error("{0}")]
    NoMoveInProgress(String),
    #[error("{0}")]
    UnknownBroker(String),
}

pub struct Cluster {
    pub node_id: i32,
    pub settings: ClusterSettings,
    /// How Raft traffic travels (mutual TLS with `[cluster.tls]`).
    pub raft_transport: kiln_raft::net::Transport,
    /// The brokers in the config's `[[cluster.peers]]` (`membership.rs`).
    founders: Vec<PeerBroker>,
    /// The cluster's brokers now: the founders and those that joined, less those removed
    /// (`membership.rs`), by id.
    brokers: RwLock<Arc<Vec<PeerBroker>>>,
    /// The members now (founders, registered, joined, less removed): the Raft listener
    /// treats any other node as a guest (`membership.rs`).
    members: Arc<RwLock<std::collections::BTreeSet<kiln_raft::NodeId>>>,
    /// Groups whose move this broker, leading them, is carrying out (`moves.rs`).
    moving: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// The one connection per peer that every replica's Raft RPCs share.
    raft_mesh: Arc<kiln_raft::net::Mesh>,
    /// The Raft timings of `settings`, checked.
    timings: kiln_raft::liveness::Timings,
    replicas_dir: PathBuf,
    log_defaults: LogSettings,
    default_max_batch_bytes: usize,
    groups: RwLock<HashMap<Arc<str>, Arc<Replica>>>,
    topics: RwLock<BTreeMap<String, Arc<ClusterTopic>>>,
    pub metadata: Arc<Replica>,
    metadata_table: Arc<MetadataTable>,
    pub offsets: Arc<Replica>,
    /// The metadata log offset the reconciler has acted on (the controller waits for its own
    /// commands to pass it).
    reconciled: watch::Sender<i64>,
    /// One topic change at a time on the controller, so "exists?" and "propose" cannot race.
    controller_lock: tokio::sync::Mutex<()>,
    /// Called with the cluster id once it is known (the broker persists it).
    on_cluster_id: Box<dyn Fn(&str) + Send + Sync>,
    /// This broker's block of producer ids (`producer_ids.rs`).
    producer_ids: tokio::sync::Mutex<producer_ids::Cursor>,
    /// Nodes whose registration this broker (as controller) is proposing.
    registering: std::sync::Mutex<std::collections::BTreeSet<i32>>,
    /// This run of the broker, named in its fence (`fence.rs`).
    boot: u64,
    /// Set once this run's fence is applied and acted on (`fence.rs`).
    current: std::sync::atomic::AtomicBool,
    /// The Raft listener, the reconciler and the cluster-id task, stopped by `shutdown`.
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // Maps are changed only by single inserts and removes: a panic elsewhere leaves them whole.
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

/// Replicas of one topic opened at once (see `open_topic`).
const REPLICA_OPENS_AT_ONCE_MAX: usize = 32;

/// Raft RPCs from peers find their group here.
struct Groups(Arc<Cluster>);

/// The pulse finds every replica of this broker here (kiln-raft `pulse.rs`).
struct Pulse(Arc<Cluster>);

impl kiln_raft::pulse::PulseGroups for Pulse {
    fn each(&self, f: &mut dyn FnMut(&Arc<str>, &kiln_raft::ReplicatedPartition)) {
        for replica in read(&self.0.groups).values() {
            f(&replica.group, &replica.partition);
        }
    }
}

impl RaftGroups for Groups {
    fn raft(&self, group: &str) -> Option<kiln_raft::types::Raft> {
        self.0.replica(group).map(|r| r.partition.raft().clone())
    }

    fn replica(&self, group: &str) -> Option<kiln_raft::ReplicatedPartition> {
        self.0.replica(group).map(|r| r.partition.clone())
    }

    // Every item looked up under one read of the table, nothing cloned: a beat carries the
    // broker's share of every group, thousands of them, several times a second.
    fn beat(
        &self,
        sender: kiln_raft::NodeId,
        items: &[kiln_raft::pulse::BeatItem],
        arrived: tokio::time::Instant,
    ) -> Vec<kiln_raft::pulse::BeatAnswer> {
        let groups = read(&self.0.groups);
        items
            .iter()
            .map(|item| {
                groups.get(&*item.group).map_or_else(Default::default, |r| {
                    r.partition.serve_beat(sender, item, arrived)
                })
            })
            .collect()
    }

    // Lets the server refuse votes while a replica repairs damaged files, and requests while
    // its disk is full.
    fn health(&self, group: &str) -> Option<kiln_raft::ReplicaHealth> {
        self.0.replica(group).map(|r| r.partition.health())
    }

    fn hello(&self, from: &kiln_raft::net::Hello) -> kiln_raft::net::HelloAnswer {
        self.0.answer_hello(from)
    }

    fn forward(&self, group: &str, payload: bytes::Bytes) -> kiln_raft::net::ForwardFuture {
        Box::pin(self.0.clone().take_forwarded(group.to_string(), payload))
    }
}

/// How this broker's Raft listener authenticates and bounds its peers: with mutual TLS a
/// certified node that is not in `members` (the configured peers, and the brokers the
/// metadata log lists) may only ask to join (`membership.rs`).
pub(crate) fn serve_options(
    settings: &ClusterSettings,
    transport: &kiln_raft::net::Transport,
    members: Arc<RwLock<std::collections::BTreeSet<kiln_raft::NodeId>>>,
) -> kiln_raft::net::ServeOptions {
    kiln_raft::net::ServeOptions {
        transport: transport.clone(),
        members: None,
        admits: Some(Arc::new(move |node| read(&members).contains(&node))),
        connections_per_peer_max: settings.raft_connections_per_peer_max,
    }
}

/// The configured peers' node ids: the members until the metadata log says more.
pub(crate) fn configured_members(
    settings: &ClusterSettings,
) -> Arc<RwLock<std::collections::BTreeSet<kiln_raft::NodeId>>> {
    let ids = settings
        .peers
        .iter()
        .filter_map(|p| replica::node(p.id))
        .collect();
    Arc::new(RwLock::new(ids))
}

/// Where a one-off request to `peer` goes.
pub(crate) fn peer_ref<'a>(
    transport: &'a kiln_raft::net::Transport,
    peer: &'a crate::config::PeerSettings,
) -> kiln_raft::net::PeerRef<'a> {
    kiln_raft::net::PeerRef {
        transport,
        node: replica::node(peer.id).unwrap_or_else(|| {
            unreachable!("peer ids were checked to be >= 0 at load, {} too", peer.id)
        }),
        addr: &peer.raft,
    }
}

pub struct StartParams {
    pub node_id: i32,
    pub settings: ClusterSettings,
    /// The bound Raft listener; `None` for a cluster of one (no peers to listen for).
    pub raft_listener: Option<TcpListener>,
    /// How Raft traffic travels, both directions.
    pub raft_transport: kiln_raft::net::Transport,
    pub data_dir: PathBuf,
    pub log_defaults: LogSettings,
    pub default_max_batch_bytes: usize,
    /// The offsets group applies to this table (the broker's offsets store reads it).
    pub offsets_table: Arc<OffsetsTable>,
    pub offsets_snapshot_every: u64,
    /// This broker's data-directory incarnation, registered in the metadata log.
    pub incarnation: u64,

    pub on_cluster_id: Box<dyn Fn(&str) + Send + Sync>,
}

/// The log settings of the internal groups: small segments, so snapshots purge their logs
/// soon; no retention (their tables are compacted instead).
fn internal_log_config() -> LogConfig {
    LogConfig {
        segment_bytes: 16 << 20,
        retention_ms: None,
        retention_bytes: None,
        checkpoint_interval_bytes: 4 << 20,
        ..LogConfig::default()
    }
}

impl Cluster {
    /// Binds the Raft listener (if the cluster has peers), opens the metadata and offsets
    /// groups and starts the reconciler. Topics appear as their creations are applied.
    pub async fn start(p: StartParams) -> anyhow::Result<Arc<Cluster>> {
        let settings = p.settings;
        let mut brokers = Vec::new();
        let mut raft_peers = BTreeMap::new();
        for peer in &settings.peers {
            let (host, port) = split_host_port(&peer.kafka).map_err(anyhow::Error::msg)?;
            let mut listeners = crate::listeners::Endpoints::new();
            for (name, address) in &peer.listeners {
                let endpoint = split_host_port(address).map_err(anyhow::Error::msg)?;
                listeners.insert(name.clone(), endpoint);
            }
            brokers.push(PeerBroker {
                id: peer.id,
                host,
                port,
                listeners,
            });
            let id = replica::node(peer.id).context("negative peer id")?;
            if !peer.raft.is_empty() {
                raft_peers.insert(id, peer.raft.clone());
            }
        }
        brokers.sort_by_key(|b| b.id);
        let raft_peers: PeerAddrs = Arc::new(raft_peers);
        let raft_mesh = Arc::new(kiln_raft::net::Mesh::new(
            raft_peers,
            p.raft_transport.clone(),
            kiln_raft::net::DEFAULT_CONNECT_TIMEOUT,
        ));
        let listener = p.raft_listener;
        let raft_addr = listener.as_ref().and_then(|l| l.local_addr().ok());
        let replicas_dir = p.data_dir.join("replicas");
        let all: Vec<i32> = brokers.iter().map(|b| b.id).collect();
        // Prefer different brokers as controller and as group coordinator.
        let coordinator_first = rotate(&all, 1);
        let metadata_table = Arc::new(MetadataTable::default());
        let timings = settings
            .timings()
            .map_err(|e| anyhow::anyhow!("cluster timings: {e}"))?;
        let node_id = replica::node(p.node_id)
            .ok_or_else(|| anyhow::anyhow!("node id {} is negative", p.node_id))?;
        // A broker joining a running cluster starts no group: the internal groups' leaders add
        // it as a learner (`membership.rs`).
        let founding = !settings.join;
        let open = |group: &str, dir: PathBuf, members: Vec<i32>, kind: GroupKind, every: u64| {
            replica::open(replica::OpenParams {
                node_id: p.node_id,
                group: group.to_string(),
                dir,
                members,
                mesh: raft_mesh.clone(),
                config: kiln_raft::partition::pulsed_config(&timings),
                timings,
                rpc_timeout: Duration::from_millis(settings.rpc_timeout_ms),
                max_entry_bytes: settings.max_entry_bytes,
                silence: silence(&settings),
                log: internal_log_config(),
                kind,
                table_snapshot_every: every,
                link_cuts: settings.link_cuts.clone(),
                may_initialize: founding,
            })
        };
        let metadata = open(
            METADATA_GROUP,
            replicas_dir.join("__cluster_metadata"),
            all.clone(),
            GroupKind::Table(metadata_table.clone()),
            METADATA_SNAPSHOT_EVERY,
        )
        .await
        .context("opening the cluster metadata replica")?;
        let offsets = open(
            OFFSETS_GROUP,
            replicas_dir.join("__consumer_offsets"),
            coordinator_first,
            GroupKind::Table(p.offsets_table.clone()),
            p.offsets_snapshot_every,
        )
        .await
        .context("opening the consumer offsets replica")?;
        let cluster = Arc::new(Cluster {
            node_id: p.node_id,
            raft_transport: p.raft_transport,
            members: configured_members(&settings),
            settings,
            brokers: RwLock::new(Arc::new(brokers.clone())),
            founders: brokers,
            moving: std::sync::Mutex::new(Default::default()),
            raft_mesh,
            timings,
            replicas_dir,
            log_defaults: p.log_defaults,
            default_max_batch_bytes: p.default_max_batch_bytes,
            groups: RwLock::new(HashMap::new()),
            topics: RwLock::new(BTreeMap::new()),
            metadata: metadata.clone(),
            metadata_table,
            offsets: offsets.clone(),
            reconciled: watch::channel(0).0,
            controller_lock: tokio::sync::Mutex::new(()),
            on_cluster_id: p.on_cluster_id,
            registering: std::sync::Mutex::new(Default::default()),
            boot: Uuid::new_v4().as_u64_pair().0,
            current: std::sync::atomic::AtomicBool::new(false),
            producer_ids: tokio::sync::Mutex::new(Default::default()),
            tasks: std::sync::Mutex::new(Vec::new()),
        });
        cluster.insert_replica(metadata);
        cluster.insert_replica(offsets);
        let mut tasks = vec![
            tokio::spawn(reconcile(cluster.clone())),
            tokio::spawn(ensure_cluster_id(cluster.clone())),
            tokio::spawn(fence::fence_self(cluster.clone())),
            tokio::spawn(rebalance::run(cluster.clone())),
            tokio::spawn(moves::run(cluster.clone())),
            tokio::spawn(membership::add_learners(cluster.clone())),
            tokio::spawn(kiln_raft::pulse::run(
                node_id,
                timings,
                Arc::new(Pulse(cluster.clone())),
                Arc::new(kiln_raft::net::MeshBeats {
                    mesh: cluster.raft_mesh.clone(),
                    cuts: cluster.settings.link_cuts.clone(),
                }),
            )),
        ];
        if let Some(listener) = listener {
            tasks.push(tokio::spawn(register::register_self(
                cluster.clone(),
                p.incarnation,
            )));
            tasks.push(tokio::spawn(kiln_raft::net::serve_with(
                listener,
                Arc::new(Groups(cluster.clone())),
                serve_options(
                    &cluster.settings,
                    &cluster.raft_transport,
                    cluster.members.clone(),
                ),
            )));
        }
        *cluster.tasks.lock().unwrap_or_else(|e| e.into_inner()) = tasks;
        tracing::info!(node_id = p.node_id, raft = ?raft_addr, peers = cluster.founders.len(), join = cluster.settings.join, "cluster started");
        Ok(cluster)
    }

    fn insert_replica(&self, replica: Arc<Replica>) {
        write(&self.groups).insert(replica.group.clone(), replica);
    }

    /// The replicated cluster id, once applied.
    pub fn cluster_id(&self) -> Option<String> {
        self.metadata_table.state().cluster_id
    }

    /// True once the metadata table is applied and acted on through its high watermark and
    /// its fence (`fence.rs`), and every replica this broker holds knows its leader (what a
    /// broker of one waits for).
    pub fn ready_alone(&self) -> bool {
        let caught_up = *self.reconciled.borrow() >= self.metadata.partition.high_watermark();
        caught_up && self.is_current() && self.replicas().iter().all(|r| r.leader().0 >= 0)
    }

    /// Each broker's registered data-directory incarnation, by node id (`cluster/join.rs`).
    pub fn registered_brokers(&self) -> BTreeMap<i32, u64> {
        self.metadata_table.state().brokers
    }

    pub fn replica(&self, group: &str) -> Option<Arc<Replica>> {
        read(&self.groups).get(group).cloned()
    }

    pub fn topic(&self, name: &str) -> Option<Arc<ClusterTopic>> {
        read(&self.topics).get(name).cloned()
    }

    /// Whether the metadata log (as applied here) has topic `name`, open here or not yet: a
    /// topic of thousands of partitions is committed seconds before its replicas are open.
    pub fn topic_committed(&self, name: &str) -> bool {
        self.metadata_table.state().topics.contains_key(name)
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

    /// The controller as Metadata and DescribeCluster name it to clients: the metadata
    /// group's leader, or this broker while none is known here (an election under way, or a
    /// follower that has not heard its leader lately). A client told -1 waits for its next
    /// metadata refresh before it sends any admin request: librdkafka's AdminClient waited
    /// out its whole request timeout (10 s) on a cluster formed a moment before. Told this
    /// broker, it asks here, is answered NOT_CONTROLLER at once, and refreshes.
    pub fn controller_hint(&self) -> i32 {
        match self.controller() {
            c if c >= 0 => c,
            _ => self.node_id,
        }
    }

    /// The cluster's brokers now, by id (`membership.rs`).
    pub fn brokers(&self) -> Arc<Vec<PeerBroker>> {
        read(&self.brokers).clone()
    }

    pub fn broker(&self, id: i32) -> Option<PeerBroker> {
        self.brokers().iter().find(|b| b.id == id).cloned()
    }

    /// Creates a topic through the metadata log; forwarded to the controller from any other
    /// broker (which answers once it has the topic too, or the time is up). Once it is committed
    /// it exists, so whatever is left of `answer_within` (the request's own timeout) is spent
    /// waiting for this broker to open its replicas and know their leaders, and no more: a
    /// topic of thousands of partitions takes seconds to open, and a client whose request
    /// timed out retries and is told the topic already exists.
    pub async fn create_topic(
        &self,
        topic: NewTopic,
        answer_within: Duration,
    ) -> Result<(), ClusterError> {
        let deadline = tokio::time::Instant::now() + answer_within;
        if !self.metadata.is_leader() {
            let (name, validate_only) = (topic.name.clone(), topic.validate_only);
            self.forward_topic_change(forwarded::TopicChange::CreateTopic {
                topic,
                answer_within_ms: u64::try_from(answer_within.as_millis()).unwrap_or(u64::MAX),
            })
            .await?;
            if !validate_only {
                // Created: answered once this broker knows it too, if that comes in time, so
                // the client's next Metadata here names it.
                self.wait_for_topic_until(&name, deadline).await;
            }
            return Ok(());
        }
        self.create_topic_here(topic, answer_within).await
    }

    /// [`Self::create_topic`] on the controller, where the request is checked.
    pub(super) async fn create_topic_here(
        &self,
        topic: NewTopic,
        answer_within: Duration,
    ) -> Result<(), ClusterError> {
        let NewTopic {
            name,
            partitions,
            replication_factor,
            overrides,
            validate_only,
        } = topic;
        let name = name.as_str();
        let deadline = tokio::time::Instant::now() + answer_within;
        topic_config::validate_topic_name(name).map_err(ClusterError::InvalidName)?;
        if partitions == 0 || partitions > PARTITIONS_PER_TOPIC_MAX {
            return Err(ClusterError::InvalidPartitions(format!(
                "partition count {partitions} must be between 1 and {PARTITIONS_PER_TOPIC_MAX}"
            )));
        }
        let rf =
            usize::from(replication_factor.unwrap_or(self.settings.default_replication_factor));
        let ids = self.assignable_brokers();
        if rf == 0 || rf > ids.len() {
            return Err(ClusterError::InvalidReplicationFactor(format!(
                "replication factor {rf} must be between 1 and the {} broker(s) of the cluster",
                ids.len()
            )));
        }
        topic_config::resolve(&self.log_defaults, self.default_max_batch_bytes, &overrides)
            .map_err(ClusterError::InvalidConfig)?;
        let _one_at_a_time = self.controller_lock.lock().await;
        if !self.metadata.is_leader() {
            return Err(ClusterError::NotController(self.controller()));
        }
        if self.topic(name).is_some() || self.metadata_table.state().topics.contains_key(name) {
            return Err(ClusterError::AlreadyExists(name.to_string()));
        }
        if validate_only {
            return Ok(());
        }
        let rotation = self.metadata_table.state().topics.len();
        let command = Command::CreateTopic {
            name: name.to_string(),
            id: Uuid::new_v4(),
            overrides,
            assignments: metadata::assign(&ids, partitions, rf, rotation),
        };
        let committed = self.commit(&command).await?;
        let applied = self.applied_here(committed, deadline).await;
        if applied {
            self.wait_for_local_leaders_until(name, deadline).await;
        } else {
            tracing::info!(topic = %name, partitions, "topic created; answered before this broker opened all its replicas (the request's timeout)");
        }
        Ok(())
    }

    /// Waits (at most [`LEADER_WAIT`]) until every replica of `topic` this broker holds knows
    /// its leader, so a client that produces right after CreateTopics (to a broker of one,
    /// most often) is not first told NOT_LEADER. Other brokers' partitions elect on their own;
    /// clients retry those.
    async fn wait_for_local_leaders(&self, topic: &str) {
        self.wait_for_local_leaders_until(topic, tokio::time::Instant::now() + LEADER_WAIT)
            .await
    }

    /// [`Self::wait_for_local_leaders`], until `deadline` at the latest.
    async fn wait_for_local_leaders_until(&self, topic: &str, deadline: tokio::time::Instant) {
        let deadline = deadline.min(tokio::time::Instant::now() + LEADER_WAIT);
        while tokio::time::Instant::now() < deadline {
            let Some(t) = self.topic(topic) else { return };
            if t.replicas.iter().flatten().all(|r| r.leader().0 >= 0) {
                return;
            }
            tokio::time::sleep(LEADER_POLL).await;
        }
        tracing::info!(%topic, "topic created; some of its partitions are still electing a leader");
    }

    /// `name`'s record, on the controller (NotController elsewhere, NotFound if it does not
    /// exist). Called with `controller_lock` held, so the record cannot change before the
    /// caller's proposal.
    pub(super) fn controlled_topic(
        &self,
        name: &str,
    ) -> Result<metadata::TopicRecord, ClusterError> {
        if !self.metadata.is_leader() {
            return Err(ClusterError::NotController(self.controller()));
        }
        self.metadata_table
            .state()
            .topics
            .get(name)
            .cloned()
            .ok_or_else(|| ClusterError::NotFound(name.to_string()))
    }

    /// Waits until this broker has opened topic `name`, until `deadline` at the latest.
    async fn wait_for_topic_until(&self, name: &str, deadline: tokio::time::Instant) {
        while self.topic(name).is_none() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(LEADER_POLL).await;
        }
    }

    /// Deletes a topic through the metadata log: forwarded to the controller from any other
    /// broker.
    pub async fn delete_topic(&self, name: &str) -> Result<(), ClusterError> {
        if !self.metadata.is_leader() {
            return self
                .forward_topic_change(forwarded::TopicChange::DeleteTopic {
                    name: name.to_string(),
                })
                .await;
        }
        self.delete_topic_here(name).await
    }

    /// [`Self::delete_topic`] on the controller.
    pub(super) async fn delete_topic_here(&self, name: &str) -> Result<(), ClusterError> {
        let _one_at_a_time = self.controller_lock.lock().await;
        let id = self.controlled_topic(name)?.id;
        let command = Command::DeleteTopic {
            name: name.to_string(),
            id,
        };
        self.propose(&command).await
    }

    /// Appends a command and waits until this broker has applied and acted on it.
    async fn propose(&self, command: &Command) -> Result<(), ClusterError> {
        let committed = self.commit(command).await?;
        let deadline = tokio::time::Instant::now() + PROPOSE_WAIT;
        if self.applied_here(committed, deadline).await {
            Ok(())
        } else {
            Err(ClusterError::Timeout)
        }
    }

    /// Proposes `command` and waits until it is committed; returns its offset in the metadata
    /// log.
    async fn commit(&self, command: &Command) -> Result<i64, ClusterError> {
        let batch = metadata::encode(command, now_ms()).map_err(ClusterError::NotCommitted)?;
        let ack = self
            .metadata
            .proposer()
            .submit(batch)
            .await
            .map_err(|_| ClusterError::NotCommitted("the metadata replica stopped".into()))?
            .map_err(|e| match e {
                kiln_raft::PartitionError::NotLeader { leader } => ClusterError::NotController(
                    leader.and_then(|l| i32::try_from(l).ok()).unwrap_or(-1),
                ),
                other => ClusterError::NotCommitted(other.to_string()),
            })?;
        Ok(ack.last_offset)
    }

    /// Whether this broker has applied and acted on the metadata log through `offset` by
    /// `deadline` (waits until then).
    async fn applied_here(&self, offset: i64, deadline: tokio::time::Instant) -> bool {
        let mut reconciled = self.reconciled.subscribe();
        let wait = async { reconciled.wait_for(|o| *o > offset).await.is_ok() };
        matches!(tokio::time::timeout_at(deadline, wait).await, Ok(true))
    }

    /// Opens the replicas of topics the metadata table has and this broker does not, and stops
    /// those of topics it no longer has.
    async fn reconcile_once(&self, state: &MetadataState) {
        self.note_membership(state);
        let current: Vec<(String, Uuid)> = read(&self.topics)
            .values()
            .map(|t| (t.name.clone(), t.id))
            .collect();
        for (name, id) in current {
            if state.topics.get(&name).map(|t| t.id) != Some(id) {
                self.stop_topic(&name, id).await;
            }
        }
        for (name, record) in &state.topics {
            match self.topic(name) {
                None => self.open_topic(name, record, state).await,
                Some(t)
                    if t.id == record.id && topic_changes::changed(&t, record, &state.moves) =>
                {
                    self.update_topic(&t, record, state).await
                }
                Some(_) => {}
            }
        }
    }

    /// The settings a topic record resolves to here; the broker defaults (logged) when its
    /// overrides are not valid on this broker (written by a broker of another version).
    fn resolve_settings(
        &self,
        name: &str,
        record: &metadata::TopicRecord,
    ) -> Option<TopicSettings> {
        match topic_config::resolve(
            &self.log_defaults,
            self.default_max_batch_bytes,
            &record.overrides,
        ) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(topic = %name, error = %e, "topic settings no longer valid here; using the broker defaults");
                topic_config::resolve(
                    &self.log_defaults,
                    self.default_max_batch_bytes,
                    &BTreeMap::new(),
                )
                .ok()
            }
        }
    }

    async fn open_topic(&self, name: &str, record: &metadata::TopicRecord, state: &MetadataState) {
        let Some(settings) = self.resolve_settings(name, record) else {
            return;
        };
        // Opening a replica is mostly waiting on fsyncs (its directory, files, the first
        // membership entry): a few at once keep the disk busy, and a topic of thousands of
        // partitions opens in seconds instead of minutes. `buffered` keeps partition order.
        let replicas: Vec<_> = futures_util::stream::iter(0..record.assignments.len())
            .map(|index| self.open_partition(name, record, index, &settings, state))
            .buffered(REPLICA_OPENS_AT_ONCE_MAX)
            .collect()
            .await;
        tracing::info!(topic = %name, id = %record.id, partitions = record.assignments.len(), "topic open");
        write(&self.topics).insert(
            name.to_string(),
            Arc::new(ClusterTopic {
                name: name.to_string(),
                id: record.id,
                overrides: record.overrides.clone(),
                settings,
                assignments: record.assignments.clone(),
                moves: moves::of_topic(record, &state.moves),
                replicas,
                traffic: Arc::default(),
            }),
        );
    }

    /// The members of partition `index` as this broker's replica of it knows them: a move's
    /// target that names this broker (the move adds or keeps a replica here), else the
    /// assignment if it names this broker, else a cancelled move's abandoned target that
    /// names it (kept until the move back ends, `moves.rs`); `None` where this broker holds
    /// no replica.
    fn local_members<'a>(
        &self,
        record: &'a metadata::TopicRecord,
        index: usize,
        state: &'a MetadataState,
    ) -> Option<&'a Vec<i32>> {
        let assigned = record.assignments.get(index)?;
        let group = partition_group(record.id, i32::try_from(index).unwrap_or(i32::MAX));
        match state.moves.get(&group) {
            Some(t) if t.contains(&self.node_id) => Some(t),
            _ if assigned.contains(&self.node_id) => Some(assigned),
            _ => state
                .cancelled
                .get(&group)
                .filter(|t| t.contains(&self.node_id)),
        }
    }

    /// Opens this broker's replica of partition `index`, if it is assigned one or a move
    /// under way is adding one here.
    async fn open_partition(
        &self,
        name: &str,
        record: &metadata::TopicRecord,
        index: usize,
        settings: &TopicSettings,
        state: &MetadataState,
    ) -> Option<Arc<Replica>> {
        let assigned = record.assignments.get(index)?;
        let members = self.local_members(record, index, state)?;
        let index = i32::try_from(index).unwrap_or(i32::MAX);
        let group = partition_group(record.id, index);
        // Started anew only by its first replicas, and only if no move ever touched it.
        let may_initialize = assigned.contains(&self.node_id)
            && u32::try_from(index).is_ok_and(|i| !record.moved.contains(&i));
        let dir = self
            .replicas_dir
            .join(record.id.to_string())
            .join(index.to_string());
        let opened = replica::open(replica::OpenParams {
            node_id: self.node_id,
            group: group.clone(),
            dir,
            members: members.clone(),
            mesh: self.raft_mesh.clone(),
            config: kiln_raft::partition::pulsed_config(&self.timings),
            timings: self.timings,
            rpc_timeout: Duration::from_millis(self.settings.rpc_timeout_ms),
            max_entry_bytes: self.settings.max_entry_bytes,
            silence: silence(&self.settings),
            log: settings.log.to_log_config(),
            kind: GroupKind::Data,
            table_snapshot_every: u64::MAX,
            link_cuts: self.settings.link_cuts.clone(),
            may_initialize,
        })
        .await;
        match opened {
            Ok(r) => {
                self.insert_replica(r.clone());
                Some(r)
            }
            Err(e) => {
                tracing::error!(topic = %name, partition = index, error = %e, "cannot open this broker's replica; it serves nothing for this partition");
                None
            }
        }
    }

    /// Stops a replica a move took away from this broker and deletes its directory.
    async fn remove_replica(&self, replica: &Arc<Replica>) {
        write(&self.groups).remove(&*replica.group);
        replica.partition.shutdown().await;
        if let Err(e) = tokio::fs::remove_dir_all(&replica.dir).await {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(group = %replica.group, dir = %replica.dir.display(), error = %e, "could not remove a moved replica's directory");
            }
        }
        tracing::info!(group = %replica.group, "replica moved away from this broker; removed");
    }

    async fn stop_topic(&self, name: &str, id: Uuid) {
        let removed = {
            let mut topics = write(&self.topics);
            match topics.get(name) {
                Some(t) if t.id == id => topics.remove(name),
                _ => None,
            }
        };
        let Some(topic) = removed else { return };
        for r in topic.replicas.iter().flatten() {
            write(&self.groups).remove(&*r.group);
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

    /// Stops the Raft listener and every Raft node (their logs stay on disk, closed cleanly).
    pub async fn shutdown(&self) {
        let tasks: Vec<_> = self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for task in &tasks {
            task.abort();
        }
        // An aborted task is dropped, with the listener it owns, only when the runtime next
        // gets to it: wait for that, so the Raft port is free when this returns (a broker
        // started again at once binds it).
        for task in tasks {
            let _ = task.await;
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

/// Follows the metadata table: opens and stops replicas, and reports the cluster id.
async fn reconcile(cluster: Arc<Cluster>) {
    let mut changes = cluster.metadata_table.subscribe();
    let mut reported: Option<String> = None;
    loop {
        let state = changes.borrow_and_update().clone();
        cluster.reconcile_once(&state).await;
        if state.cluster_id.is_some() && state.cluster_id != reported {
            if let Some(id) = &state.cluster_id {
                (cluster.on_cluster_id)(id);
            }
            reported = state.cluster_id.clone();
        }
        cluster.reconciled.send_replace(state.applied_offset);
        cluster.note_fence(&state);
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// The first controller names the cluster (unless it already has a name).
async fn ensure_cluster_id(cluster: Arc<Cluster>) {
    while cluster.cluster_id().is_none() {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let caught_up = *cluster.reconciled.borrow() >= cluster.metadata.partition.high_watermark();
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
