//! One local replica of a Raft group: its log directory, its Raft node and its proposer.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kiln_log::fs::RealFs;
use kiln_log::{LogConfig, LogTail};
use kiln_raft::net::TcpNetwork;
use kiln_raft::{GroupKind, NodeId, PartitionError, Proposer, ReplicatedPartition, StartOptions};

/// A replica hosted by this broker.
pub struct Replica {
    /// The group's name on the Raft transport, e.g. `<topic id>/3` (shared with every beat
    /// that carries it: `kiln_raft::pulse`).
    pub group: Arc<str>,
    /// Broker ids holding a replica, the preferred leader first: replaced when a move of the
    /// group finishes (`cluster/moves.rs`).
    members: std::sync::RwLock<Arc<[i32]>>,
    pub partition: ReplicatedPartition,
    pub dir: PathBuf,
    /// This broker's id.
    pub node_id: i32,
    /// Times the leader this replica knows of changed to another broker (or to none).
    pub leader_changes: Arc<AtomicU64>,
    /// A follower that has heard nothing from its leader for this long no longer names it.
    silence: std::time::Duration,
}

impl Replica {
    /// Broker ids holding a replica, the preferred leader first.
    pub fn members(&self) -> Arc<[i32]> {
        self.members
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// After a move: `members` hold the group now, the first of them preferred (it stands
    /// first when the leader falls silent, and the leader balance hands over to it).
    pub fn set_members(&self, members: &[i32]) {
        *self
            .members
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::from(members);
        self.partition
            .liveness()
            .set_preferred(members.first().and_then(|m| node(*m)));
    }

    /// The leader's ordered, coalescing append queue.
    pub fn proposer(&self) -> &Proposer {
        self.partition.proposer()
    }

    /// Whether this replica is the group's leader now.
    pub fn is_leader(&self) -> bool {
        self.partition.leader_and_term().0 == node(self.node_id)
    }

    /// The leader as a broker id (-1 when none is known) and the current term. A follower
    /// whose leader has been silent for several heartbeats says -1 rather than naming it: a
    /// client told "no leader" asks again within milliseconds, one told the name of a dead
    /// broker waits on its own timers, which adds up to a second to every failover.
    pub fn leader(&self) -> (i32, u64) {
        let (leader, term) = self.partition.leader_and_term();
        let leader = leader.and_then(|l| i32::try_from(l).ok()).unwrap_or(-1);
        // A leader whose disk is full is stuck in a write and will be replaced; naming it
        // would keep clients asking it (its own view of the term does not move meanwhile).
        if leader == self.node_id && self.partition.disk_full() {
            return (-1, term);
        }
        // A learner (a replica a move or a join is adding) gets no beats while its group is
        // idle: silence says nothing of its leader.
        if leader >= 0 && leader != self.node_id && self.is_voter() {
            let heard = self
                .partition
                .liveness()
                .heard_within(tokio::time::Instant::now(), self.silence);
            if heard.is_none() {
                return (-1, term);
            }
        }
        (leader, term)
    }

    /// Whether this replica is one of its group's voters (not a learner).
    pub fn is_voter(&self) -> bool {
        self.partition.liveness().is_voter()
    }

    /// Replicas that hold everything committed, as the leader sees it (Kafka's ISR). Followers
    /// do not know; they report every member.
    pub fn leader_changes(&self) -> u64 {
        self.leader_changes.load(Ordering::Relaxed)
    }

    /// Times this replica, leading, lost its lease within its term (kiln-raft `liveness.rs`):
    /// no quorum acknowledged it in time. Cut off, or its peers or disk too slow: each stops
    /// it serving until a quorum answers again.
    pub fn lease_lapses(&self) -> u64 {
        self.partition.liveness().lapses()
    }

    pub fn in_sync(&self) -> Vec<i32> {
        let metrics = self.partition.raft().metrics();
        let m = metrics.borrow();
        let Some(progress) = &m.replication else {
            return self.members().to_vec();
        };
        let committed = m.last_applied.map(|l| l.index);
        self.members()
            .iter()
            .copied()
            .filter(|id| {
                *id == self.node_id
                    || node(*id).is_some_and(|n| {
                        progress
                            .get(&n)
                            .is_some_and(|matched| matched.map(|l| l.index) >= committed)
                    })
            })
            .collect()
    }
}

/// Broker ids are i32 in Kafka and u64 in Raft; negative ids never reach Raft (config checks).
pub fn node(id: i32) -> Option<NodeId> {
    u64::try_from(id).ok()
}

pub struct OpenParams {
    pub node_id: i32,
    pub group: String,
    pub dir: PathBuf,
    pub members: Vec<i32>,
    /// The broker's connections to its peers, shared by every replica.
    pub mesh: Arc<kiln_raft::net::Mesh>,
    pub config: openraft::Config,
    pub timings: kiln_raft::liveness::Timings,
    pub rpc_timeout: std::time::Duration,
    pub max_entry_bytes: usize,
    /// See [`Replica::leader`].
    pub silence: std::time::Duration,
    pub log: LogConfig,
    pub kind: GroupKind,
    /// A table group snapshots after this many entries.
    pub table_snapshot_every: u64,
    /// The test hook that cuts Raft links (`ClusterSettings::link_cuts`).
    pub link_cuts: Option<Arc<kiln_raft::net::LinkCuts>>,
    /// Whether an empty directory may start the group with `members` as its voters: true
    /// only for a group the metadata log created with this broker among its first replicas.
    /// A replica a move added, or any replica of a broker that joined a running cluster, is
    /// filled by the group's leader instead (as a learner first), never started anew.
    pub may_initialize: bool,
}

/// Opens (recovering) or creates a replica, initializes a brand-new group with `members`, and
/// has the preferred leader (the first member) stand for election at once, which spreads
/// leaders over the brokers when a topic is created.
pub async fn open(p: OpenParams) -> Result<Arc<Replica>, PartitionError> {
    let id = node(p.node_id).ok_or_else(|| PartitionError::Stopped("negative node id".into()))?;
    let mut network = TcpNetwork::on(p.group.clone(), p.mesh, p.rpc_timeout);
    if let Some(cuts) = p.link_cuts {
        network = network.with_cuts(id, cuts);
    }
    let opts = StartOptions {
        id,
        config: p.config,
        timings: p.timings,
        stagger: kiln_raft::partition::stagger_of(&p.group),
        fs: Arc::new(RealFs),
        dir: p.dir.clone(),
        log: p.log,
        kind: p.kind,
        // A single replica has nobody to be repaired from (see kiln_raft::LogStore::open).
        repairable: p.members.len() > 1,
        enforce_guard: true,
        max_entry_bytes: p.max_entry_bytes,
        max_queued_bytes: kiln_raft::partition::PROPOSER_QUEUE_BYTES_MAX,
        table_snapshot_every: p.table_snapshot_every,
        preferred: p.members.first().and_then(|m| node(*m)),
    };
    let (partition, recovery) = ReplicatedPartition::start(opts, network).await?;
    match &recovery.log.tail {
        LogTail::Clean => {}
        LogTail::Torn => {
            tracing::warn!(group = %p.group, cut_bytes = recovery.log.cut_bytes, "replica log had a torn tail (an unsynced write cut short); cut it")
        }
        // kiln-log has logged the damage itself; this says what the broker does about it.
        LogTail::Damaged(_) => {
            tracing::error!(group = %p.group, cut_bytes = recovery.log.cut_bytes, "replica log was damaged: the damaged part is cut and never served; the replica neither votes nor stands for election until its peers have refilled it")
        }
    }
    // Damage can cut a log to nothing: such a replica is not pristine and must not initialize.
    let pristine =
        recovery.entries() == 0 && recovery.log.first_index == 0 && !recovery.repairing();
    if pristine && !p.may_initialize {
        tracing::info!(group = %p.group, "new replica; waiting for the group's leader to add it");
    }
    if pristine && p.may_initialize {
        let members: BTreeSet<NodeId> = p.members.iter().filter_map(|m| node(*m)).collect();
        partition.initialize(members).await?;
        // A forced election would bypass the repair guard's timer and raise the term.
        if p.members.first() == Some(&p.node_id) && !partition.repairing() {
            if let Err(e) = partition.raft().trigger().elect().await {
                tracing::warn!(group = %p.group, error = %e, "could not stand for election");
            }
        }
    }
    let leader_changes = Arc::new(AtomicU64::new(0));
    tokio::spawn(count_leader_changes(
        p.group.clone(),
        partition.raft().clone(),
        leader_changes.clone(),
    ));
    tracing::info!(group = %p.group, entries = recovery.entries(), members = ?p.members, "replica open");
    Ok(Arc::new(Replica {
        group: Arc::from(p.group),
        members: std::sync::RwLock::new(Arc::from(p.members)),
        partition,
        dir: p.dir,
        node_id: p.node_id,
        leader_changes,
        silence: p.silence,
    }))
}

/// Counts changes of the known leader until the Raft node stops.
async fn count_leader_changes(
    group: String,
    raft: kiln_raft::types::Raft,
    changes: Arc<AtomicU64>,
) {
    // The server metrics change only with the vote, state, leader or membership: the full
    // metrics would wake this task on every event the core handles.
    let mut server = raft.server_metrics();
    let mut last = server.borrow().current_leader;
    while server.changed().await.is_ok() {
        let (now, term) = {
            let m = server.borrow_and_update();
            (m.current_leader, m.vote.leader_id().get_term())
        };
        if now != last {
            if last.is_some() {
                changes.fetch_add(1, Ordering::Relaxed);
            }
            tracing::info!(%group, leader = ?now, previous = ?last, term, "leader changed");
            last = now;
        }
    }
}
