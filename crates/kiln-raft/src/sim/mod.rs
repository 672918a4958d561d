//! Deterministic simulation of a three-broker cluster running two Raft groups, with an
//! invariant checker.
//!
//! Three brokers, each holding a replica of the data partition (group 0) and of the consumer
//! offsets (group 1, `offsets.rs`), run in one current-thread tokio runtime with paused (virtual) time; the
//! caller builds that runtime (`tokio::runtime::Builder::new_current_thread().enable_time()
//! .start_paused(true)`) and runs [`run`] in it. Everything random comes from the seed: the
//! fault schedule, message delays and losses, fsync latency, how much of an unsynced tail a
//! crash leaves, the client's timing and batch sizes, and openraft's election timeouts
//! ([`crate::types::seed_thread_rng`]). So a seed replays the same run, and [`SimReport::trace`]
//! (with [`SimReport::trace_hash`]) is the evidence.
//!
//! Faults: crashes of one replica, power loss of all three (every unsynced write dropped, a
//! torn prefix of the unsynced tail kept at random), restarts, network partitions (one replica
//! isolated, or one link cut), healing, message loss, delay spikes, and handovers of each
//! group's leadership (to its preferred replica, as the broker's leader balance does, or from
//! it to another). Most crashes and power
//! losses are aimed at a write in flight: the schedule slows the next fsync of the replica it
//! picked and waits for that replica to hold written but unsynced bytes, since a crash at a
//! random moment seldom lands between a write and its fsync (the moment that loses data).
//!
//! Replacing a broker (`replace`): a broker's disk is lost for good. It is crashed and never
//! comes back; a broker with a new node id starts on an empty disk, its replicas starting no
//! group, and a task plays the broker's move driver (`cluster/moves.rs` in kiln-broker): for
//! each group, whichever replica leads adds the new one as a learner, waits for it to catch
//! up, and changes the voters to the survivors and the new one through a joint configuration,
//! retrying through crashes, partitions and elections. Faults go on meanwhile. A lost disk is
//! a failure like rot, so the two never overlap: a replacement waits until no replica is
//! damaged or repairing, and nothing rots until the replacement's membership is final.
//!
//! Bit rot (`rot.rs`): while a crashed replica is down, its synced log bytes (or its vote
//! file) are damaged, and it must repair from its peers after it restarts. At most one replica
//! is damaged at a time (the invariants hold while a majority keep their disks): another is
//! damaged only once the last one has finished its repair. The aimed variant cuts the leader
//! from one follower, waits for an acknowledgement (the entry is then on the leader and the
//! other follower only), crashes that follower and damages the entry in its log, and isolates
//! the leader: without the repair guard the two followers elect a leader without the entry.
//!
//! The checker (run after healing everything and waiting for the replicas to converge):
//! * no acknowledged record lost: every acknowledged batch is in the leader's log at its
//!   acknowledged offset with the same bytes;
//! * order: the log's offsets are contiguous from 0; an append acknowledged before another
//!   started has the lower offset; no two acknowledgements share an offset;
//! * no read of uncommitted or truncated data: every batch any replica ever served to a reader
//!   is in the final log at the same offset with the same bytes, and reads start at 0 with no
//!   gap;
//! * at most one leader per term (leader epoch);
//! * convergence: every replica's committed log equals the leader's;
//! * idempotence: beside the plain clients, an idempotent producer (one batch in flight,
//!   rising sequence numbers) resends each batch to whichever replica leads until it is
//!   acknowledged, whatever became of its earlier attempts; none is ever refused as out of
//!   order or fenced, and each of its batches is in the log once.
//!
//! The first five hold for both groups. A crash, power loss, restart or isolation hits a
//! broker, so both of its replicas (each group has its own log and vote files on the broker's
//! disk, with the same fsync latency). For the offsets group the checker also asserts:
//! * no acknowledged commit lost: the final rebuild holds, per key, at least every
//!   acknowledged offset, and so does every rebuild that began after the acknowledgement;
//! * committed offsets monotonic: per key, the offsets successive rebuilds saw never
//!   decrease, and never exceed the highest offset the consumer submitted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use std::path::Path;

use bytes::Bytes;
use kiln_log::sim_fs::SimFs;
pub use kiln_log::sim_fs::SyncBehaviour;
use kiln_log::{LogConfig, LogTail};
use openraft::ServerState;
use rand::Rng;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::partition::{
    production_config, production_timings, AppendAck, PartitionError, ReplicatedPartition,
    StartOptions,
};
use crate::rng::StableRng;
use crate::state_machine::GroupKind;
use crate::types::{seed_thread_rng, NodeId};

mod batch;
mod check;
mod net;
mod offsets;
mod rot;
mod stale;

pub use batch::{build_batch, build_idempotent_batch};
pub use net::{SimLink, SimNetworkFactory, SimRouter};

use check::check;
use net::link;
use offsets::SimTable;
use rot::{RotHunt, RotKind};

/// The brokers a run starts with; replacements get the next ids.
const NODES: [NodeId; 3] = [1, 2, 3];
/// Longest a replacement's membership change may take, faults included, before the run
/// reports it stuck.
const REPLACE_DEADLINE: Duration = Duration::from_secs(30);

/// The Raft groups every broker holds a replica of: the data partition and the consumer
/// offsets.
const DATA: usize = 0;
const OFFSETS: usize = 1;
/// Each group's preferred replica (the first of its members in a broker): the one that takes
/// the first turn in a new group, stands first when its leader falls silent, and is handed
/// leadership by the handover faults, as the broker's leader balance does.
const PREFERRED: [NodeId; 2] = [1, 2];
/// Virtual ms between faults: scaled to the production election timeouts (300-600 ms), so
/// that the cluster elects leaders between faults as a real one does.
const FAULT_GAP_MS: std::ops::Range<u64> = 300..1200;
/// How long a client keeps retrying an append (following leader hints, waiting out elections),
/// as a Kafka producer does within its delivery timeout.
const CLIENT_DEADLINE: Duration = Duration::from_secs(5);

/// Where each broker keeps its replica of each group, on its simulated disk.
const DATA_DIR: &str = "/data";
const OFFSETS_DIR: &str = "/offsets";

/// One batch as a reader saw it: its Kafka offset and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadBatch {
    pub base_offset: i64,
    pub bytes: Bytes,
}

/// The batches of a read.
pub(super) fn split(records: &Bytes) -> Vec<ReadBatch> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while let Some(rest) = records.get(at..) {
        let Ok(h) = kiln_log::BatchHeader::parse(rest) else {
            break;
        };
        let len = h.total_len();
        if rest.len() < len {
            break;
        }
        out.push(ReadBatch {
            base_offset: h.base_offset,
            bytes: records.slice(at..at + len),
        });
        at += len;
    }
    out
}

/// The log settings the simulated replicas use: small segments, so rolls, seals and purges
/// happen within a run, and every segment CRC-checked at each start, so rot anywhere in the
/// synced log is found (production checks only what lies past the checkpoints, and the rest on
/// read).
fn sim_log_config() -> LogConfig {
    LogConfig {
        segment_bytes: 16 << 10,
        index_interval_bytes: 512,
        checkpoint_interval_bytes: 8 << 10,
        verify_all_on_open: true,
        ..LogConfig::default()
    }
}

/// An acknowledged append: (number, ack, started at, acknowledged at, the batch sent).
type Ack = (usize, AppendAck, Instant, Instant, Bytes);

/// What one simulated run does.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub seed: u64,
    /// How the simulated disks answer fsync (`LyingWriteCache` only to prove the checker).
    pub sync: SyncBehaviour,
    /// Virtual time during which faults are injected and the client appends.
    pub fault_ms: u64,
    /// Appends the client starts (spread over `fault_ms`).
    pub appends: usize,
    /// Percent of crashes and power losses aimed at a write in flight; with 0 every one falls
    /// at a random moment.
    pub aimed_percent: u32,
    /// Percent of single-replica crashes after which the down replica's synced bytes rot.
    pub rot_percent: u32,
    /// Weight of the aimed bit-rot scenario among the faults (the others weigh 100 together).
    pub aimed_rot_weight: u32,
    /// Weight of leadership handovers among the faults (out of 100 plus the three weights).
    pub handover_weight: u32,
    /// Weight of broker replacements (a disk lost for good, a new broker in its place) among
    /// the faults.
    pub replace_weight: u32,
    /// Weight of the stale-leader fault (a group's leader cut from its peers while clients
    /// still reach it, `stale.rs`). Above 0 the lease reader runs too, asking every replica
    /// that would serve a read, and the checker asserts that none served a stale one.
    pub stale_leader_weight: u32,
    /// Whether the lease reader serves from any replica that is Raft leader, its lease held or
    /// not, as a broker without leases would. On only to show the checker catches it.
    #[doc(hidden)]
    pub reads_ignore_lease: bool,
    /// Whether replicas enforce the repair guard. Off only to show what it prevents.
    #[doc(hidden)]
    pub repair_guard: bool,
    /// Whether the offsets coordinator's rebuild reads past the high watermark (everything
    /// its replica has written). On only to show the checker catches it.
    #[doc(hidden)]
    pub rebuild_past_high_watermark: bool,
    /// Percent of fault rounds in which the data leader applies retention (removes every
    /// closed segment), so followers behind it catch up from a snapshot.
    pub retention_percent: u32,
    /// The offsets group snapshots (and purges its log) after this many entries.
    pub offsets_snapshot_every: u64,
}

impl SimOptions {
    pub fn new(seed: u64) -> SimOptions {
        SimOptions {
            seed,
            sync: SyncBehaviour::Honest,
            fault_ms: 15_000,
            appends: 300,
            aimed_percent: 75,
            rot_percent: 35,
            aimed_rot_weight: 8,
            handover_weight: 10,
            replace_weight: 3,
            stale_leader_weight: 0,
            reads_ignore_lease: false,
            repair_guard: true,
            rebuild_past_high_watermark: false,
            retention_percent: 4,
            offsets_snapshot_every: 40,
        }
    }
}

/// The outcome of one run.
#[derive(Debug, Clone, Default)]
pub struct SimReport {
    pub seed: u64,
    /// Every invariant violation the checker found (empty: the run passed).
    pub violations: Vec<String>,
    /// Timestamped events: faults, acknowledgements, leaders, checks.
    pub trace: Vec<String>,
    pub acknowledged: usize,
    /// Batches of the idempotent producer acknowledged (each checked to be written once).
    pub idempotent_acknowledged: usize,
    pub failed_appends: usize,
    /// Replica crashes, each replica of a power loss counted.
    pub crashes: usize,
    pub power_losses: usize,
    /// Crashes the schedule aimed at a write in flight that found one: the schedule waited
    /// for the replica to hold written but unsynced bytes (in a power loss, each replica that
    /// held some counts).
    pub aimed_crashes: usize,
    /// Crashes that dropped written but unsynced bytes (the log's or the vote's).
    pub crashes_losing_unsynced: usize,
    /// Written but unsynced bytes those crashes dropped, in all.
    pub unsynced_bytes_dropped: u64,
    pub partitions: usize,
    pub leaders: usize,
    pub final_high_watermark: i64,
    pub reads_checked: usize,
    /// Bit-rot faults injected into a down replica's synced log bytes.
    pub log_rots: usize,
    /// Of those, the ones that destroyed a committed entry (at or below the highest index any
    /// replica had applied): an entry this replica may have acknowledged.
    pub rots_hitting_committed: usize,
    /// Of the log rots, the aimed ones (the scenario the repair guard exists for).
    pub aimed_rots: usize,
    /// Rots of the vote file, and those that lost the latest save (both copies).
    pub vote_rots: usize,
    pub vote_saves_lost: usize,
    /// Restarts that found damage and began a repair, and repairs seen to finish.
    pub repairs_started: usize,
    pub repairs_finished: usize,
    /// The offsets group: commits acknowledged and failed (or of unknown outcome), rebuilds
    /// of the committed offsets observed, leaders, and its final high watermark.
    pub commits_acknowledged: usize,
    /// Times the data leader moved the log start (retention).
    pub retentions: usize,
    /// Handovers of a group's leadership started (either group).
    pub handovers: usize,
    /// Brokers replaced (disk lost, a new broker added), and replacements whose membership
    /// change finished in both groups.
    pub replacements: usize,
    pub replacements_finished: usize,
    /// Stale-leader faults (a group's leader isolated), and the lease reads checked.
    pub stale_leaders: usize,
    pub lease_reads_checked: usize,
    pub failed_commits: usize,
    pub rebuilds: usize,
    pub offsets_leaders: usize,
    pub offsets_high_watermark: i64,
}

impl SimReport {
    /// FNV-1a over the trace: equal hashes mean the run replayed the same way.
    pub fn trace_hash(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for line in &self.trace {
            for b in line.bytes().chain(std::iter::once(b'\n')) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        h
    }

    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// True when a violation says an acknowledged record was lost.
    pub fn lost_acknowledged(&self) -> bool {
        self.violations.iter().any(|v| v.starts_with("LOST"))
    }

    /// True when a violation says an acknowledged offset commit was lost or a rebuild saw
    /// committed offsets move backwards (or beyond what was submitted).
    pub fn offsets_violated(&self) -> bool {
        self.violations
            .iter()
            .any(|v| v.starts_with("LOST COMMIT") || v.starts_with("MONOTONIC"))
    }
}

struct Slot {
    /// The broker's disk: both replicas' files (`/data`, `/offsets`).
    fs: SimFs,
    replica: Option<ReplicatedPartition>,
    watcher: Option<JoinHandle<()>>,
    /// Virtual ms at which a crashed replica comes back.
    restart_at: Option<u64>,
    /// The index it had applied when it last crashed.
    applied_at_crash: Option<u64>,
    /// The broker's replica of the offsets group.
    offsets: Member,
    /// The broker's pulse (`pulse.rs`), while it is up.
    pulse: Option<JoinHandle<()>>,
}

/// A broker's replica of the offsets group.
struct Member {
    replica: Option<ReplicatedPartition>,
    watcher: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    trace: Vec<String>,
    violations: Vec<String>,
    /// Per group: term → the replica that was leader in it.
    leaders: [BTreeMap<u64, NodeId>; 2],
    /// (append number, ack, started at, acknowledged at, the batch sent).
    acks: Vec<Ack>,
    failed: usize,
    /// (replica, batch) every read returned.
    reads: Vec<(NodeId, ReadBatch)>,
    /// The offsets group's commits and rebuilds.
    off: offsets::OffsetsShared,
    /// What every replica that would serve a read on its lease answered (`stale.rs`).
    lease_reads: Vec<stale::LeaseRead>,
    /// Batches of the idempotent producer the leader refused (a well-behaved producer that
    /// only retries what it sent must never see OUT_OF_ORDER or a fenced epoch).
    idempotent_refusals: Vec<String>,
    /// Its batches acknowledged, and given up on.
    idempotent_acked: usize,
    idempotent_abandoned: usize,
}

struct World {
    start: Instant,
    router: SimRouter,
    rng: StableRng,
    slots: BTreeMap<NodeId, Slot>,
    shared: Arc<Mutex<Shared>>,
    report: SimReport,
    opts: SimOptions,
    /// Replicas damaged by rot whose repair has not been seen to finish.
    damaged: BTreeSet<NodeId>,
    /// Replicas that started under the repair guard and have not been seen to lift it.
    repairing: BTreeSet<NodeId>,
    /// The replacement under way: its membership change, driven by its own task.
    replacing: Option<JoinHandle<bool>>,
    /// The node id the next replacement gets.
    next_id: NodeId,
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

fn log_line(shared: &Mutex<Shared>, start: Instant, line: String) {
    let ms = start.elapsed().as_millis();
    lock(shared).trace.push(format!("{ms:>6}ms {line}"));
}

impl World {
    fn log(&self, line: String) {
        log_line(&self.shared, self.start, line);
    }

    /// The data partition's replicas that are up.
    fn up(&self) -> Vec<ReplicatedPartition> {
        self.up_in(DATA)
    }

    /// `group`'s replicas that are up.
    fn up_in(&self, group: usize) -> Vec<ReplicatedPartition> {
        self.slots
            .values()
            .filter_map(|s| {
                if group == DATA {
                    s.replica.clone()
                } else {
                    s.offsets.replica.clone()
                }
            })
            .collect()
    }

    /// Starts broker `id`: its replica of each group.
    async fn start_node(&mut self, id: NodeId) {
        self.start_data(id).await;
        self.start_offsets(id).await;
        let broker = net::SimBroker {
            node: id,
            router: self.router.clone(),
        };
        let pulse = tokio::spawn(crate::pulse::run(
            id,
            production_timings(),
            Arc::new(broker),
            Arc::new(self.router.clone()),
        ));
        if let Some(slot) = self.slots.get_mut(&id) {
            if let Some(old) = slot.pulse.replace(pulse) {
                old.abort();
            }
        }
    }

    /// The options of broker `id`'s replica in `dir` on `fs`.
    fn options(&self, id: NodeId, fs: &SimFs, dir: &str, kind: GroupKind) -> StartOptions {
        StartOptions {
            id,
            config: production_config(),
            timings: production_timings(),
            stagger: crate::partition::stagger_of(dir),
            fs: Arc::new(fs.clone()),
            dir: Path::new(dir).to_path_buf(),
            log: sim_log_config(),
            kind,
            repairable: true,
            enforce_guard: self.opts.repair_guard,
            max_entry_bytes: crate::partition::ENTRY_BYTES_MAX,
            max_queued_bytes: crate::partition::PROPOSER_QUEUE_BYTES_MAX,
            table_snapshot_every: self.opts.offsets_snapshot_every,
            preferred: Some(if dir == DATA_DIR {
                PREFERRED[DATA]
            } else {
                PREFERRED[OFFSETS]
            }),
        }
    }

    /// Starts broker `id`'s replica of the offsets group (its files are never rotted).
    async fn start_offsets(&mut self, id: NodeId) {
        let Some(fs) = self.slots.get(&id).map(|s| s.fs.clone()) else {
            return;
        };
        let table = Arc::new(SimTable::default());
        let opts = self.options(id, &fs, OFFSETS_DIR, GroupKind::Table(table.clone()));
        let network = SimNetworkFactory {
            group: OFFSETS,
            from: id,
            router: self.router.clone(),
        };
        let started = ReplicatedPartition::start(opts, network).await;
        let (replica, recovery) = match started {
            Ok(r) => r,
            Err(e) => {
                lock(&self.shared)
                    .violations
                    .push(format!("offsets replica {id} failed to start: {e}"));
                return;
            }
        };
        self.router.lock().up.insert((OFFSETS, id), replica.clone());
        lock(&self.shared).off.tables.insert(id, table);
        let watcher = watch_leaders(OFFSETS, &replica, Arc::clone(&self.shared), self.start);
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        slot.offsets.watcher = Some(watcher);
        slot.offsets.replica = Some(replica);
        self.log(format!(
            "start offsets replica {id}: recovered {} entries, cut {} bytes{}",
            recovery.entries(),
            recovery.log.cut_bytes,
            if recovery.repairing() {
                "; repairing"
            } else {
                ""
            }
        ));
    }

    /// Starts broker `id`'s replica of the data partition.
    async fn start_data(&mut self, id: NodeId) {
        let Some(fs) = self.slots.get(&id).map(|s| s.fs.clone()) else {
            return;
        };
        let opts = self.options(id, &fs, DATA_DIR, GroupKind::Data);
        if let Some(slot) = self.slots.get_mut(&id) {
            slot.restart_at = None;
        }
        let network = SimNetworkFactory {
            group: DATA,
            from: id,
            router: self.router.clone(),
        };
        let started = ReplicatedPartition::start(opts, network).await;
        let (replica, recovery) = match started {
            Ok(r) => r,
            Err(e) => {
                lock(&self.shared)
                    .violations
                    .push(format!("replica {id} failed to start: {e}"));
                return;
            }
        };
        self.router.lock().up.insert((DATA, id), replica.clone());
        let watcher = watch_leaders(DATA, &replica, Arc::clone(&self.shared), self.start);
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        slot.watcher = Some(watcher);
        slot.replica = Some(replica);
        let mut line = format!(
            "start replica {id}: recovered {} entries, cut {} bytes",
            recovery.entries(),
            recovery.log.cut_bytes
        );
        if let LogTail::Damaged(d) = &recovery.log.tail {
            line += &format!(
                "; DAMAGE at byte {} of {}: entries from {} lost, synced through {:?} ({})",
                d.position, d.path, d.first_lost_index, d.synced_through, d.reason
            );
        }
        if recovery.vote.latest_lost {
            line += "; the latest vote save is lost";
        }
        if recovery.repairing() {
            line += &format!("; repairing: {:?}", recovery.guard);
            if self.repairing.insert(id) {
                self.report.repairs_started += 1;
            }
        }
        self.log(line);
    }

    /// Notes the damaged replicas whose repair is over: up, with the end of the repair on
    /// record (the guard is cleared in memory only once the record is synced; a crash before
    /// that brings the guard back). Without the guard, a damaged replica counts as repaired
    /// once it is up again.
    fn note_repairs(&mut self) {
        let guard_on = self.opts.repair_guard;
        let done: Vec<NodeId> = self
            .damaged
            .union(&self.repairing)
            .copied()
            .filter(|id| {
                self.slots
                    .get(id)
                    .and_then(|s| s.replica.as_ref())
                    .is_some_and(|r| !guard_on || r.health().guard().is_clear())
            })
            .collect();
        for id in done {
            self.damaged.remove(&id);
            if self.repairing.remove(&id) {
                self.report.repairs_finished += 1;
                self.log(format!("replica {id} repaired: it votes again"));
            }
        }
    }

    /// Whether `id` may be damaged now: no other replica's damage is still unrepaired, and no
    /// replacement (a lost disk) is under way.
    fn may_rot(&mut self, id: NodeId) -> bool {
        self.note_repairs();
        self.note_replacement();
        self.replacing.is_none() && self.damaged.iter().all(|&d| d == id)
    }

    /// The brokers of the cluster now.
    fn members(&self) -> Vec<NodeId> {
        self.slots.keys().copied().collect()
    }

    /// Ends the record of a replacement whose task has finished.
    fn note_replacement(&mut self) {
        if self.replacing.as_ref().is_some_and(|t| t.is_finished()) {
            self.replacing = None;
            self.report.replacements_finished += 1;
            self.log("replacement: membership final in both groups".to_string());
        }
    }

    /// Replaces a broker drawn at random (see the module docs), unless one is being replaced
    /// or a replica is damaged or repairing.
    async fn replace(&mut self) {
        self.note_repairs();
        self.note_replacement();
        if self.replacing.is_some() || !self.damaged.is_empty() || !self.repairing.is_empty() {
            return;
        }
        let members = self.members();
        let gone = members[self.rng.random_range(0..members.len())];
        let new = self.next_id;
        self.next_id += 1;
        self.crash_node(gone, "its disk is lost for good");
        if let Some(slot) = self.slots.remove(&gone) {
            for t in [slot.watcher, slot.offsets.watcher, slot.pulse]
                .into_iter()
                .flatten()
            {
                t.abort();
            }
        }
        let sync_delay = Duration::from_millis(self.rng.random_range(1..=12));
        self.slots
            .insert(new, Slot::new(SimFs::new(sync_delay, self.opts.sync)));
        self.report.replacements += 1;
        self.log(format!(
            "replace: broker {gone} lost its disk; broker {new} starts empty in its place"
        ));
        self.start_node(new).await;
        let target: BTreeSet<NodeId> = self.members().into_iter().collect();
        self.replacing = Some(tokio::spawn(change_members(
            self.router.clone(),
            new,
            target,
            Arc::clone(&self.shared),
            self.start,
        )));
    }

    /// The highest index any replica has applied (a down one as of its crash): entries at or
    /// below it are committed.
    fn committed_index(&self) -> Option<u64> {
        self.slots
            .values()
            .map(|s| match &s.replica {
                Some(r) => r.raft().metrics().borrow().last_applied.map(|l| l.index),
                None => s.applied_at_crash,
            })
            .max()
            .flatten()
    }

    /// Records a rot of `id`'s files in the report and the trace.
    fn note_rot(&mut self, id: NodeId, rotted: rot::Rotted, aimed: bool) {
        let committed = self.committed_index();
        let hit = rotted
            .first_lost
            .is_some_and(|lost| committed.is_some_and(|c| lost <= c));
        match rotted.kind {
            RotKind::Vote | RotKind::VoteBoth => {
                self.report.vote_rots += 1;
                if rotted.kind == RotKind::VoteBoth {
                    self.report.vote_saves_lost += 1;
                }
            }
            _ => {
                self.report.log_rots += 1;
                self.report.aimed_rots += usize::from(aimed);
                self.report.rots_hitting_committed += usize::from(hit);
            }
        }
        self.damaged.insert(id);
        self.log(format!(
            "ROT replica {id} ({:?}{}): {} (byte {}); first lost index {:?}, committed through {:?}",
            rotted.kind,
            if aimed { ", aimed" } else { "" },
            rotted.detail,
            rotted.at,
            rotted.first_lost,
            committed
        ));
    }

    /// After a crash of `id`: sometimes its synced bytes rot while it is down.
    fn maybe_rot(&mut self, id: NodeId) {
        if self.rng.random_range(0..100) >= self.opts.rot_percent || !self.may_rot(id) {
            return;
        }
        let Some(fs) = self.slots.get(&id).map(|s| s.fs.clone()) else {
            return;
        };
        if let Some(rotted) = rot::rot_at_random(&mut self.rng, &fs, Path::new(DATA_DIR)) {
            self.note_rot(id, rotted, false);
        }
    }

    /// Starts the aimed rot: cuts the leader's link to one follower (`lagging`), so that the
    /// next acknowledged entry is on the leader and the other follower (`victim`) only.
    fn begin_rot_hunt(&mut self, now: u64) -> Option<RotHunt> {
        let up = self.up();
        let leader = leader_of(&up)?.id();
        let others: Vec<NodeId> = self
            .members()
            .into_iter()
            .filter(|&n| n != leader)
            .collect();
        if up.len() < 3 || others.len() != 2 {
            return None;
        }
        let pick = self.rng.random_range(0..2);
        let (victim, lagging) = (others[pick], others[1 - pick]);
        if !self.may_rot(victim) {
            return None;
        }
        self.router.lock().cut.insert(link(leader, lagging));
        self.report.partitions += 1;
        self.log(format!(
            "rot hunt: link {leader}-{lagging} cut; waiting for an acknowledgement on leader \
             {leader} and replica {victim}"
        ));
        Some(RotHunt {
            leader,
            victim,
            lagging,
            acks_before: lock(&self.shared).acks.len(),
            until: now + self.rng.random_range(100..400),
        })
    }

    /// Ends the aimed rot: with a new acknowledgement, crashes the victim, damages the first
    /// entry the lagging replica lacks, and isolates the leader; without one, heals the cut.
    fn finish_rot_hunt(&mut self, h: RotHunt, acked: bool) {
        if !acked {
            self.router.lock().cut.remove(&link(h.leader, h.lagging));
            self.log("rot hunt: no acknowledgement came; link restored".to_string());
            return;
        }
        let lagging_last = self
            .slots
            .get(&h.lagging)
            .and_then(|s| s.replica.as_ref())
            .and_then(|r| r.raft().metrics().borrow().last_log_index);
        self.crash_node(h.victim, "rot hunt");
        let Some(fs) = self.slots.get(&h.victim).map(|s| s.fs.clone()) else {
            return;
        };
        if let Some(rotted) = rot::rot_aimed(&mut self.rng, &fs, Path::new(DATA_DIR), lagging_last)
        {
            self.note_rot(h.victim, rotted, true);
        }
        self.router.lock().cut.insert(link(h.leader, h.victim));
        self.log(format!(
            "rot hunt: leader {} isolated; replicas {} and {} hold none of the entries after {:?}",
            h.leader, h.victim, h.lagging, lagging_last
        ));
    }

    /// Crashes broker `id` (if up), both of its replicas; `why` goes into the trace.
    fn crash_node(&mut self, id: NodeId, why: &str) {
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        let replica = slot.replica.take();
        let off_replica = slot.offsets.replica.take();
        if replica.is_none() && off_replica.is_none() {
            return;
        }
        {
            let mut net = self.router.lock();
            net.up.remove(&(DATA, id));
            net.up.remove(&(OFFSETS, id));
        }
        if let Some(r) = &replica {
            slot.applied_at_crash = r.raft().metrics().borrow().last_applied.map(|l| l.index);
        }
        let unsynced = slot.fs.unsynced_bytes();
        let rng = &mut self.rng;
        let (fs, crash) = slot.fs.crash(|n| rng.random_range(0..=n));
        slot.fs = fs;
        let off = &mut slot.offsets;
        for w in [slot.watcher.take(), off.watcher.take(), slot.pulse.take()]
            .into_iter()
            .flatten()
        {
            w.abort();
        }
        let now = self.start.elapsed().as_millis() as u64;
        slot.restart_at = Some(now + self.rng.random_range(100..1500));
        tokio::spawn(async move {
            for r in [replica, off_replica].into_iter().flatten() {
                r.shutdown().await;
            }
        });
        let dropped = crash.dropped_bytes;
        self.report.crashes += 1;
        if dropped > 0 {
            self.report.crashes_losing_unsynced += 1;
            self.report.unsynced_bytes_dropped += dropped;
        }
        self.log(format!(
            "crash replica {id} ({why}): {unsynced} unsynced bytes in {} files, {dropped} of them lost",
            crash.files_with_unsynced
        ));
    }

    /// Up brokers holding written but unsynced bytes, in any file of either group.
    fn in_flight(&self) -> Vec<NodeId> {
        self.slots
            .iter()
            .filter(|(_, s)| s.replica.is_some() && s.fs.unsynced_bytes() > 0)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Slows the next fsync of `id`'s files by a seeded 2-40 ms (or disarms it), so that the
    /// write it covers is still unsynced at the next 1 ms step of the fault loop.
    fn stall_next_sync(&mut self, id: NodeId, arm: bool) {
        let ms = if arm {
            self.rng.random_range(2..=40)
        } else {
            0
        };
        if let Some(slot) = self.slots.get(&id) {
            slot.fs.stall_next_sync(Duration::from_millis(ms));
        }
    }

    /// Retention on the data leader: every closed segment goes (the leader proposes the new
    /// log start; every replica applies it, and one that lacks those entries later installs a
    /// snapshot instead).
    fn apply_retention(&mut self) {
        let Some(leader) = leader_of(&self.up()) else {
            return;
        };
        let Some(command) = leader.retention_command(i64::MAX, Some(0), None) else {
            return;
        };
        self.report.retentions += 1;
        self.log(format!("retention on leader {}: {command:?}", leader.id()));
        // Not awaited: the command is queued either way, and the run goes on.
        drop(leader.proposer().submit_command(command));
    }

    /// Each group's leader hands its leadership over (kiln-raft `Liveness::hand_over`): to
    /// the preferred replica, as the broker's leader balance and ElectLeaders do, or, when it
    /// is the preferred one, to another replica drawn at random. The leader stops taking
    /// writes, waits for the other to catch up, and falls silent.
    fn hand_over(&mut self) {
        for group in [DATA, OFFSETS] {
            let Some(leader) = leader_of(&self.up_in(group)) else {
                continue;
            };
            let to = if leader.id() == PREFERRED[group] {
                let others: Vec<NodeId> = self
                    .members()
                    .into_iter()
                    .filter(|&n| n != leader.id())
                    .collect();
                others[self.rng.random_range(0..others.len())]
            } else {
                PREFERRED[group]
            };
            let name = if group == DATA { "data" } else { "offsets" };
            match leader.hand_over(to) {
                Ok(()) => {
                    self.report.handovers += 1;
                    self.log(format!(
                        "handover: {name} leader {} hands over to {to}",
                        leader.id()
                    ));
                }
                Err(e) => self.log(format!(
                    "handover: {name} leader {} refused: {e}",
                    leader.id()
                )),
            }
        }
    }

    /// The stale-leader fault: one group's leader (drawn) loses every link to its peers, while
    /// the lease reader, like a client, still reaches it (`stale.rs`).
    fn isolate_leader(&mut self) {
        let group = if self.rng.random_range(0..2) == 0 {
            DATA
        } else {
            OFFSETS
        };
        let Some(leader) = leader_of(&self.up_in(group)) else {
            self.log("stale leader: no leader to isolate".to_string());
            return;
        };
        let id = leader.id();
        let term = leader.leader_epoch().unwrap_or(0);
        let members = self.members();
        let mut net = self.router.lock();
        for other in members.iter().filter(|&&o| o != id) {
            net.cut.insert(link(id, *other));
        }
        drop(net);
        self.report.partitions += 1;
        self.report.stale_leaders += 1;
        stale::log_isolated(&self.shared, self.start, group, id, term);
    }

    fn power_loss(&mut self, why: &str) {
        self.log(format!("power loss of every replica ({why})"));
        self.report.power_losses += 1;
        for id in self.up().iter().map(|r| r.id()).collect::<Vec<_>>() {
            self.crash_node(id, why);
        }
    }

    fn down(&self) -> Vec<NodeId> {
        self.slots
            .iter()
            .filter(|(_, s)| s.replica.is_none())
            .map(|(&id, _)| id)
            .collect()
    }
}

impl Slot {
    /// A broker on `fs`, not started.
    fn new(fs: SimFs) -> Slot {
        Slot {
            fs,
            replica: None,
            watcher: None,
            restart_at: None,
            applied_at_crash: None,
            offsets: Member {
                replica: None,
                watcher: None,
            },
            pulse: None,
        }
    }
}

/// The broker's move driver, as a replacement needs it: in each group, whichever replica
/// leads adds `new` as a learner (waiting until it holds the log) and makes `target` the
/// voters through a joint configuration; tried again on any failure (no leader, leadership
/// lost, a step timed out) until [`REPLACE_DEADLINE`]. True when both groups are done.
async fn change_members(
    router: SimRouter,
    new: NodeId,
    target: BTreeSet<NodeId>,
    shared: Arc<Mutex<Shared>>,
    start: Instant,
) -> bool {
    let deadline = Instant::now() + REPLACE_DEADLINE;
    for group in [DATA, OFFSETS] {
        let name = if group == DATA { "data" } else { "offsets" };
        loop {
            if Instant::now() >= deadline {
                lock(&shared).violations.push(format!(
                    "LIVENESS: the {name} group's voters did not become {target:?} within {REPLACE_DEADLINE:?}"
                ));
                return false;
            }
            let leader = {
                let net = router.lock();
                let up: Vec<ReplicatedPartition> = net
                    .up
                    .iter()
                    .filter(|((g, _), _)| *g == group)
                    .map(|(_, r)| r.clone())
                    .collect();
                leader_of(&up)
            };
            let Some(leader) = leader else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let raft = leader.raft().clone();
            let (voters, joint) = {
                let m = raft.metrics();
                let m = m.borrow();
                let membership = m.membership_config.membership();
                (
                    membership.voter_ids().collect::<BTreeSet<_>>(),
                    membership.get_joint_config().len() > 1,
                )
            };
            if voters == target && !joint {
                log_line(
                    &shared,
                    start,
                    format!("replace: {name} voters are {target:?}"),
                );
                break;
            }
            let step = async {
                raft.add_learner(new, openraft::EmptyNode {}, true)
                    .await
                    .map_err(|e| format!("adding learner {new}: {e}"))?;
                raft.change_membership(target.clone(), false)
                    .await
                    .map_err(|e| format!("changing the voters: {e}"))?;
                Ok::<(), String>(())
            };
            match tokio::time::timeout(Duration::from_secs(3), step).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => log_line(&shared, start, format!("replace: {name} step failed: {e}")),
                Err(_) => log_line(&shared, start, format!("replace: {name} step timed out")),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    true
}

/// Watches `replica`'s metrics and records who leads each term of `group`, reporting a
/// second leader in a term.
fn watch_leaders(
    group: usize,
    replica: &ReplicatedPartition,
    shared: Arc<Mutex<Shared>>,
    start: Instant,
) -> JoinHandle<()> {
    let id = replica.id();
    let mut metrics = replica.raft().metrics();
    let (name, of_group) = if group == DATA {
        ("", "")
    } else {
        ("offsets ", " of the offsets group")
    };
    tokio::spawn(async move {
        loop {
            let seen = {
                let m = metrics.borrow_and_update();
                (m.state == ServerState::Leader).then_some(m.current_term)
            };
            if let Some(term) = seen {
                let mut s = lock(&shared);
                match s.leaders[group].get(&term) {
                    Some(&other) if other != id => s.violations.push(format!(
                        "TWO LEADERS in term {term}{of_group}: replicas {other} and {id}"
                    )),
                    Some(_) => {}
                    None => {
                        s.leaders[group].insert(term, id);
                        drop(s);
                        log_line(
                            &shared,
                            start,
                            format!("{name}replica {id} leads term {term}"),
                        );
                    }
                }
            }
            if metrics.changed().await.is_err() {
                return;
            }
        }
    })
}

/// A crash (of `target`) or a power loss (`None`) waiting for a write in flight, until the
/// virtual ms `until`, when it falls anyway.
#[derive(Clone, Copy)]
struct Hunt {
    target: Option<NodeId>,
    until: u64,
}

/// The replica that is leader now, if any (the one in the highest term).
fn leader_of(replicas: &[ReplicatedPartition]) -> Option<ReplicatedPartition> {
    replicas
        .iter()
        .filter_map(|r| r.leader_epoch().map(|e| (e, r)))
        .max_by_key(|(e, _)| *e)
        .map(|(_, r)| r.clone())
}

async fn client_append(
    router: SimRouter,
    n: usize,
    batch: Bytes,
    shared: Arc<Mutex<Shared>>,
    start: Instant,
) {
    let began = Instant::now();
    let deadline = began + CLIENT_DEADLINE;
    let mut hint: Option<NodeId> = None;
    let (res, via) = loop {
        let up = router.replicas(DATA);
        let target = hint
            .and_then(|h| up.iter().find(|r| r.id() == h).cloned())
            .or_else(|| leader_of(&up));
        let Some(t) = target else {
            if Instant::now() >= deadline {
                break (Err(PartitionError::NotLeader { leader: None }), None);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let res = match tokio::time::timeout(left, t.proposer().submit(batch.clone())).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(PartitionError::Stopped("the proposer stopped".into())),
            Err(_) => {
                log_line(
                    &shared,
                    start,
                    format!("append {n} timed out (outcome unknown)"),
                );
                lock(&shared).failed += 1;
                return;
            }
        };
        match res {
            // Follow the leader hint, as a Kafka client does after NOT_LEADER_OR_FOLLOWER, or
            // wait for an election.
            Err(PartitionError::NotLeader { leader }) if Instant::now() < deadline => {
                hint = leader;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => break (other, Some(t.id())),
        }
    };
    match res {
        Ok(ack) => {
            log_line(
                &shared,
                start,
                format!(
                    "ack append {n} via replica {}: offsets {}..={} epoch {}",
                    via.unwrap_or(0),
                    ack.base_offset,
                    ack.last_offset,
                    ack.leader_epoch
                ),
            );
            lock(&shared)
                .acks
                .push((n, ack, began, Instant::now(), batch));
        }
        Err(e) => {
            let why = match e {
                PartitionError::NotLeader { .. } => "not leader".to_string(),
                other => other.to_string(),
            };
            log_line(&shared, start, format!("append {n} failed: {why}"));
            lock(&shared).failed += 1;
        }
    }
}

/// The simulated idempotent producer's id, and the number space of its appends in `acks`.
const IDEMPOTENT_PRODUCER_ID: i64 = 4242;
const IDEMPOTENT_APPEND_BASE: usize = 1_000_000;
/// How long after the fault phase it keeps retrying an unanswered batch.
const IDEMPOTENT_GRACE: Duration = Duration::from_secs(8);

/// An idempotent producer, as librdkafka's with one request in flight: batches with rising
/// sequence numbers, each retried (the same bytes, at whatever replica leads) until it is
/// acknowledged, however its earlier attempts ended (refused, lost, timed out with its outcome
/// unknown). The checker then asserts each of its batches is in the log exactly once.
async fn idempotent_producer(
    router: SimRouter,
    shared: Arc<Mutex<Shared>>,
    start: Instant,
    until_ms: u64,
    seed: u64,
) {
    let mut rng = StableRng::seed(seed);
    let mut sequence: i32 = 0;
    let mut k = 0usize;
    while start.elapsed() < Duration::from_millis(until_ms) {
        let records = rng.random_range(1..=3usize);
        let values: Vec<Vec<u8>> = (0..records)
            .map(|r| format!("idempotent batch {k} record {r}").into_bytes())
            .collect();
        let batch = Bytes::from(batch::build_idempotent_batch(
            &values,
            k as i64,
            IDEMPOTENT_PRODUCER_ID,
            sequence,
        ));
        let began = Instant::now();
        let give_up = start + Duration::from_millis(until_ms) + IDEMPOTENT_GRACE;
        let mut attempts = 0u32;
        let outcome = loop {
            if Instant::now() >= give_up {
                break None;
            }
            attempts += 1;
            let Some(t) = leader_of(&router.replicas(DATA)) else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let answer =
                tokio::time::timeout(Duration::from_secs(2), t.proposer().submit(batch.clone()))
                    .await;
            match answer {
                Ok(Ok(Ok(ack))) => break Some((ack, t.id())),
                Ok(Ok(Err(
                    e @ (PartitionError::OutOfOrderSequence { .. }
                    | PartitionError::InvalidProducerEpoch { .. }
                    | PartitionError::UnknownProducerId { .. }),
                ))) => {
                    lock(&shared).idempotent_refusals.push(format!(
                        "batch {k} (sequence {sequence}, attempt {attempts}) refused by replica {}: {e}",
                        t.id()
                    ));
                    return;
                }
                // Not the leader, stopped, or no answer in time (its outcome unknown): the
                // same batch again.
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let Some((ack, via)) = outcome else {
            log_line(
                &shared,
                start,
                format!("idempotent batch {k} abandoned after {attempts} attempts"),
            );
            lock(&shared).idempotent_abandoned += 1;
            return;
        };
        log_line(
            &shared,
            start,
            format!(
                "ack idempotent batch {k} (sequence {sequence}, attempt {attempts}) via replica {via}: offsets {}..={}",
                ack.base_offset, ack.last_offset
            ),
        );
        {
            let mut s = lock(&shared);
            s.acks.push((
                IDEMPOTENT_APPEND_BASE + k,
                ack,
                began,
                Instant::now(),
                batch,
            ));
            s.idempotent_acked += 1;
        }
        sequence += records as i32;
        k += 1;
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..=60))).await;
    }
}

/// Commits a marker entry in `group` through its leader, retrying for up to 10 s; returns the
/// leader that committed it.
async fn commit_marker(world: &World, group: usize) -> Option<ReplicatedPartition> {
    let name = if group == DATA { "" } else { "offsets " };
    for attempt in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some(l) = leader_of(&world.up_in(group)) else {
            continue;
        };
        let marker = if group == DATA {
            Bytes::from(build_batch(&[b"final marker".to_vec()], -1))
        } else {
            offsets::commit_batch(offsets::MARKER_KEY, -1)
        };
        let outcome =
            tokio::time::timeout(Duration::from_secs(2), l.proposer().submit(marker.clone())).await;
        let ack = match outcome {
            Ok(Ok(Ok(ack))) => Some(ack),
            Ok(Ok(Err(e))) => {
                if attempt % 20 == 0 {
                    world.log(format!(
                        "{name}final marker refused by replica {} (attempt {attempt}): {e}",
                        l.id()
                    ));
                }
                None
            }
            Ok(Err(_)) => {
                if attempt % 20 == 0 {
                    world.log(format!(
                        "{name}final marker dropped by replica {} (attempt {attempt})",
                        l.id()
                    ));
                }
                None
            }
            Err(_) => {
                if attempt % 20 == 0 {
                    world.log(format!(
                        "{name}final marker timed out on replica {} (attempt {attempt})",
                        l.id()
                    ));
                }
                None
            }
        };
        if let Some(ack) = ack {
            world.log(format!(
                "{name}final marker committed at {} by replica {} (attempt {attempt})",
                ack.base_offset,
                l.id()
            ));
            let entry = (usize::MAX, ack, Instant::now(), Instant::now(), marker);
            let mut s = lock(&world.shared);
            if group == DATA {
                s.acks.push(entry);
            } else {
                s.off.acks.push(entry);
            }
            return Some(l);
        }
    }
    None
}

/// Runs one seeded simulation and checks the invariants. Must run inside a current-thread
/// tokio runtime with paused time (see the module docs).
pub async fn run(opts: SimOptions) -> SimReport {
    seed_thread_rng(opts.seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut rng = StableRng::seed(opts.seed);
    let router = SimRouter::new(rng.random());
    let mut slots = BTreeMap::new();
    for id in NODES {
        let sync_delay = Duration::from_millis(rng.random_range(1..=12));
        slots.insert(id, Slot::new(SimFs::new(sync_delay, opts.sync)));
    }
    let mut world = World {
        start: Instant::now(),
        router,
        rng,
        slots,
        shared: Arc::new(Mutex::new(Shared::default())),
        report: SimReport {
            seed: opts.seed,
            ..SimReport::default()
        },
        opts: opts.clone(),
        damaged: BTreeSet::new(),
        repairing: BTreeSet::new(),
        replacing: None,
        next_id: NODES.len() as NodeId + 1,
    };
    for id in NODES {
        world.start_node(id).await;
    }
    if let Some(first) = world.slots.get(&1).and_then(|s| s.replica.clone()) {
        if let Err(e) = first.initialize(NODES.into_iter().collect()).await {
            lock(&world.shared)
                .violations
                .push(format!("initialize failed: {e}"));
        }
    }
    if let Some(first) = world.slots.get(&1).and_then(|s| s.offsets.replica.clone()) {
        if let Err(e) = first.initialize(NODES.into_iter().collect()).await {
            lock(&world.shared)
                .violations
                .push(format!("offsets initialize failed: {e}"));
        }
    }

    // The offsets group's consumer (one task per key) and coordinator, over the fault phase.
    let until = world.start + Duration::from_millis(opts.fault_ms);
    let mut offsets_tasks = Vec::new();
    for key in offsets::KEYS {
        let seed = world.rng.random();
        offsets_tasks.push(tokio::spawn(offsets::consumer(
            key,
            world.router.clone(),
            Arc::clone(&world.shared),
            world.start,
            until,
            seed,
        )));
    }
    if opts.stale_leader_weight > 0 {
        // Its own seed, not one drawn from the schedule's: runs without it keep their schedules.
        offsets_tasks.push(tokio::spawn(stale::lease_reader(
            world.router.clone(),
            Arc::clone(&world.shared),
            until,
            opts.seed ^ 0x57A1E,
            opts.reads_ignore_lease,
        )));
    }
    let seed = world.rng.random();
    offsets_tasks.push(tokio::spawn(offsets::coordinator(
        world.router.clone(),
        Arc::clone(&world.shared),
        world.start,
        until,
        seed,
        opts.rebuild_past_high_watermark,
    )));

    // The client: appends spread over the fault phase, each on its own task.
    let mut client_plan = Vec::new();
    let mut at = 0u64;
    for n in 0..opts.appends {
        at += world
            .rng
            .random_range(0..=(2 * opts.fault_ms / opts.appends.max(1) as u64));
        let records = world.rng.random_range(1..=3usize);
        let values: Vec<Vec<u8>> = (0..records)
            .map(|r| format!("seed {} append {n} record {r}", opts.seed).into_bytes())
            .collect();
        client_plan.push((
            at.min(opts.fault_ms),
            n,
            Bytes::from(build_batch(&values, n as i64)),
        ));
    }
    let mut client_tasks = Vec::new();
    let seed = world.rng.random();
    client_tasks.push(tokio::spawn(idempotent_producer(
        world.router.clone(),
        Arc::clone(&world.shared),
        world.start,
        opts.fault_ms,
        seed,
    )));
    let mut next_read = 0u64;
    let mut next_fault = world.rng.random_range(FAULT_GAP_MS);
    let mut plan = client_plan.into_iter().peekable();
    let mut spike_until = 0u64;
    let mut hunt: Option<Hunt> = None;
    let mut rot_hunt: Option<RotHunt> = None;
    // The fault phase, in 1 ms steps of virtual time.
    for now in 0..opts.fault_ms {
        tokio::time::sleep_until(world.start + Duration::from_millis(now)).await;
        world.note_repairs();
        let due: Vec<NodeId> = world
            .slots
            .iter()
            .filter(|(_, s)| s.replica.is_none() && s.restart_at.is_some_and(|t| t <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            world.start_node(id).await;
        }
        while let Some((when, n, batch)) = plan.next_if(|(w, _, _)| *w <= now) {
            let _ = when;
            client_tasks.push(tokio::spawn(client_append(
                world.router.clone(),
                n,
                batch,
                Arc::clone(&world.shared),
                world.start,
            )));
        }
        if now >= next_read {
            next_read = now + world.rng.random_range(20..120);
            let up = world.up();
            if !up.is_empty() {
                let r = &up[world.rng.random_range(0..up.len())];
                if let Ok(read) = r.read(r.log_start_offset(), usize::MAX) {
                    let mut s = lock(&world.shared);
                    s.reads
                        .extend(split(&read.records).into_iter().map(|b| (r.id(), b)));
                }
            }
            if world.rng.random_range(0..1000) < opts.retention_percent * 10 {
                world.apply_retention();
            }
        }
        if spike_until != 0 && now >= spike_until {
            spike_until = 0;
            world.router.lock().delay_max_ms = 8;
            world.log("delays back to normal".to_string());
        }
        // An aimed crash waits (and holds back the other faults) until a write is in flight
        // on its target, or its time runs out.
        if let Some(h) = &hunt {
            let mut in_flight = world.in_flight();
            let hit = match h.target {
                Some(id) => {
                    in_flight.retain(|&x| x == id);
                    !in_flight.is_empty()
                }
                // A power loss waits for two replicas with a write in flight (or the only one
                // up), so that it drops unsynced data on a majority at once.
                None => in_flight.len() >= 2.min(world.up().len()).max(1),
            };
            if hit || now >= h.until {
                let h = *h;
                hunt = None;
                for id in world.members() {
                    world.stall_next_sync(id, false);
                }
                let why = if hit {
                    "aimed, write in flight"
                } else {
                    "aimed, no write came"
                };
                match h.target {
                    Some(id) => {
                        world.crash_node(id, why);
                        world.maybe_rot(id);
                    }
                    None => world.power_loss(why),
                }
                if hit {
                    world.report.aimed_crashes += in_flight.len();
                }
                next_fault = now + world.rng.random_range(FAULT_GAP_MS);
            }
            continue;
        }
        // The aimed rot waits (and holds back the other faults) for an acknowledgement.
        if let Some(h) = rot_hunt {
            let acked = lock(&world.shared).acks.len() > h.acks_before;
            if acked || now >= h.until {
                rot_hunt = None;
                world.finish_rot_hunt(h, acked);
                next_fault = now + world.rng.random_range(FAULT_GAP_MS);
            }
            continue;
        }
        if now >= next_fault {
            next_fault = now + world.rng.random_range(FAULT_GAP_MS);
            let roll = world.rng.random_range(
                0..100
                    + opts.aimed_rot_weight
                    + opts.handover_weight
                    + opts.replace_weight
                    + opts.stale_leader_weight,
            );
            let members = world.members();
            let up: Vec<NodeId> = world.up().iter().map(|r| r.id()).collect();
            let down = world.down();
            // Drawn only when aiming is on, so that with it off no fault moves.
            let aimed =
                opts.aimed_percent > 0 && world.rng.random_range(0..100) < opts.aimed_percent;
            match roll {
                0..=24 if !up.is_empty() => {
                    let id = up[world.rng.random_range(0..up.len())];
                    if aimed {
                        world.stall_next_sync(id, true);
                        hunt = Some(Hunt {
                            target: Some(id),
                            until: now + world.rng.random_range(50..400),
                        });
                    } else {
                        world.crash_node(id, "random moment");
                        world.maybe_rot(id);
                    }
                }
                25..=29 if !up.is_empty() => {
                    if aimed {
                        for &id in &up {
                            world.stall_next_sync(id, true);
                        }
                        hunt = Some(Hunt {
                            target: None,
                            until: now + world.rng.random_range(50..400),
                        });
                    } else {
                        world.power_loss("random moment");
                    }
                }
                30..=59 if !down.is_empty() => {
                    let id = down[world.rng.random_range(0..down.len())];
                    world.start_node(id).await;
                }
                60..=74 => {
                    let id = members[world.rng.random_range(0..members.len())];
                    let mut net = world.router.lock();
                    for other in members.iter().filter(|&&o| o != id) {
                        net.cut.insert(link(id, *other));
                    }
                    drop(net);
                    world.report.partitions += 1;
                    world.log(format!("partition: replica {id} isolated"));
                }
                75..=79 => {
                    let at = world.rng.random_range(0..members.len());
                    let (a, b) = (members[at], members[(at + 1) % members.len()]);
                    world.router.lock().cut.insert(link(a, b));
                    world.report.partitions += 1;
                    world.log(format!("partition: link {a}-{b} cut"));
                }
                80..=94 => {
                    world.router.lock().cut.clear();
                    world.log("network healed".to_string());
                }
                r if r
                    >= 100 + opts.aimed_rot_weight + opts.handover_weight + opts.replace_weight =>
                {
                    world.isolate_leader()
                }
                r if r >= 100 + opts.aimed_rot_weight + opts.handover_weight => {
                    world.replace().await
                }
                r if r >= 100 + opts.aimed_rot_weight => world.hand_over(),
                100.. => rot_hunt = world.begin_rot_hunt(now),
                _ => {
                    let max = world.rng.random_range(50..300);
                    world.router.lock().delay_max_ms = max;
                    spike_until = now + world.rng.random_range(200..1000);
                    world.log(format!("delay spike: up to {max} ms"));
                }
            }
        }
    }

    // Heal: network whole, every replica up, then let the client's last appends finish.
    {
        let mut net = world.router.lock();
        net.cut.clear();
        net.delay_max_ms = 8;
        net.loss_percent = 0;
    }
    world.log("heal: network whole, restarting every replica".to_string());
    for id in world.down() {
        world.start_node(id).await;
    }
    for t in client_tasks.into_iter().chain(offsets_tasks) {
        let _ = t.await;
    }
    if let Some(replacing) = world.replacing.take() {
        if matches!(replacing.await, Ok(true)) {
            world.report.replacements_finished += 1;
            world.log("replacement: membership final in both groups".to_string());
        }
    }

    // Converge: in each group, a leader commits one more entry in its term (so everything
    // before it is committed), then every replica's high watermark reaches the leader's.
    let leader = commit_marker(&world, DATA).await;
    let off_leader = commit_marker(&world, OFFSETS).await;
    let mut report = std::mem::take(&mut world.report);
    let (Some(leader), Some(off_leader)) = (leader, off_leader) else {
        // What each replica believed, so a stall explains itself in the trace.
        for group in [DATA, OFFSETS] {
            for r in world.up_in(group) {
                let m = r.raft().metrics().borrow().clone();
                world.log(format!(
                    "{}replica {} at the end: {:?} term {} vote {} last log {:?} committed {:?} applied {:?} purged {:?} guard {:?} repairing {} proposer slots taken {}",
                    if group == DATA { "" } else { "offsets " },
                    r.id(),
                    m.state,
                    m.current_term,
                    m.vote,
                    m.last_log_index,
                    m.millis_since_quorum_ack,
                    m.last_applied,
                    m.purged,
                    r.health().guard(),
                    r.repairing(),
                    r.proposer().entries_in_flight()
                ));
            }
        }
        let mut s = lock(&world.shared);
        s.violations.push(
            "LIVENESS: no leader committed an entry within 10 s after healing (in one of the groups)"
                .to_string(),
        );
        report.trace = std::mem::take(&mut s.trace);
        report.violations = std::mem::take(&mut s.violations);
        return report;
    };
    let target_hw = leader.high_watermark();
    let off_target_hw = off_leader.high_watermark();
    for _ in 0..100 {
        if world.up().iter().all(|r| r.high_watermark() >= target_hw)
            && world
                .up_in(OFFSETS)
                .iter()
                .all(|r| r.high_watermark() >= off_target_hw)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The last coordinator: a rebuild on the offsets leader, everything healed.
    let began = Instant::now();
    let ready = tokio::time::timeout(
        Duration::from_secs(2),
        off_leader.raft().ensure_linearizable(),
    )
    .await;
    if matches!(ready, Ok(Ok(_))) {
        offsets::record_rebuild(
            &off_leader,
            &world.shared,
            world.start,
            began,
            opts.rebuild_past_high_watermark,
        );
    } else {
        lock(&world.shared).violations.push(
            "LIVENESS: the final offsets rebuild could not ensure linearizability".to_string(),
        );
    }

    world.note_repairs();
    for id in world.repairing.clone() {
        world.log(format!(
            "replica {id} is still repairing at the end of the run"
        ));
    }
    // The report was taken before the convergence wait; repairs seen since count too.
    report.repairs_started += world.report.repairs_started;
    report.repairs_finished += world.report.repairs_finished;
    check(&world, &leader, &off_leader, &mut report);
    for id in world.members() {
        world.crash_node(id, "end of run");
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    report
}
