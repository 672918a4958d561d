//! Deterministic simulation of one replicated partition, with an invariant checker.
//!
//! Three replicas run in one current-thread tokio runtime with paused (virtual) time; the
//! caller builds that runtime (`tokio::runtime::Builder::new_current_thread().enable_time()
//! .start_paused(true)`) and runs [`run`] in it. Everything random comes from the seed: the
//! fault schedule, message delays and losses, fsync latency, how much of an unsynced tail a
//! crash leaves, the client's timing and batch sizes, and openraft's election timeouts
//! ([`crate::types::seed_thread_rng`]). So a seed replays the same run, and [`SimReport::trace`]
//! (with [`SimReport::trace_hash`]) is the evidence.
//!
//! Faults: crashes of one replica, power loss of all three (every unsynced write dropped, a
//! torn prefix of the unsynced tail kept at random), restarts, network partitions (one replica
//! isolated, or one link cut), healing, message loss, and delay spikes. Most crashes and power
//! losses are aimed at a write in flight: the schedule slows the next fsync of the replica it
//! picked and waits for that replica to hold written but unsynced bytes, since a crash at a
//! random moment seldom lands between a write and its fsync (the moment that loses data).
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
//! * convergence: every replica's committed log equals the leader's.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{Backoff, RPCOption};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{EmptyNode, RaftNetwork, RaftNetworkFactory, ServerState};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::disk::{SimDisk, SyncBehaviour};
use crate::partition::{raft_config, AppendAck, PartitionError, ReadBatch, ReplicatedPartition};
use crate::types::{seed_thread_rng, KilnRaft, NodeId, Raft};

const NODES: [NodeId; 3] = [1, 2, 3];

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
}

impl SimOptions {
    pub fn new(seed: u64) -> SimOptions {
        SimOptions {
            seed,
            sync: SyncBehaviour::Honest,
            fault_ms: 6_000,
            appends: 150,
            aimed_percent: 75,
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
}

// ----- simulated network -----

struct NetState {
    up: BTreeMap<NodeId, Raft>,
    /// Cut links, stored as (low, high).
    cut: BTreeSet<(NodeId, NodeId)>,
    rng: StdRng,
    delay_max_ms: u64,
    loss_percent: u32,
}

/// The simulated network: which replicas are up, which links are cut, delays and losses.
#[derive(Clone)]
pub struct SimRouter {
    state: Arc<Mutex<NetState>>,
}

fn link(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    (a.min(b), a.max(b))
}

#[derive(Debug, thiserror::Error)]
#[error("simulated network: {0}")]
struct NetError(&'static str);

fn unreachable<E: std::error::Error>(why: &'static str) -> RPCError<NodeId, EmptyNode, E> {
    RPCError::Unreachable(Unreachable::new(&NetError(why)))
}

impl SimRouter {
    fn new(seed: u64) -> SimRouter {
        SimRouter {
            state: Arc::new(Mutex::new(NetState {
                up: BTreeMap::new(),
                cut: BTreeSet::new(),
                rng: StdRng::seed_from_u64(seed),
                delay_max_ms: 8,
                loss_percent: 1,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, NetState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One network hop: a seeded delay, then whether it arrived (link up, not lost).
    async fn hop(&self, from: NodeId, to: NodeId) -> bool {
        let (delay, lost) = {
            let mut s = self.lock();
            let max = s.delay_max_ms;
            let loss = s.loss_percent;
            let delay = s.rng.random_range(0..=max);
            let lost = s.rng.random_range(0..100) < loss;
            (delay, lost)
        };
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let s = self.lock();
        !lost
            && !s.cut.contains(&link(from, to))
            && s.up.contains_key(&to)
            && s.up.contains_key(&from)
    }

    async fn deliver<E: std::error::Error>(
        &self,
        from: NodeId,
        to: NodeId,
    ) -> Result<Raft, RPCError<NodeId, EmptyNode, E>> {
        if !self.hop(from, to).await {
            return Err(unreachable("request lost"));
        }
        self.lock()
            .up
            .get(&to)
            .cloned()
            .ok_or_else(|| unreachable("target down"))
    }

    async fn respond<E: std::error::Error>(
        &self,
        from: NodeId,
        to: NodeId,
    ) -> Result<(), RPCError<NodeId, EmptyNode, E>> {
        if self.hop(to, from).await {
            Ok(())
        } else {
            Err(unreachable("response lost"))
        }
    }
}

/// openraft's network factory over [`SimRouter`].
pub struct SimNetworkFactory {
    from: NodeId,
    router: SimRouter,
}

/// One replica's connection to another, over [`SimRouter`].
pub struct SimLink {
    from: NodeId,
    to: NodeId,
    router: SimRouter,
}

impl RaftNetworkFactory<KilnRaft> for SimNetworkFactory {
    type Network = SimLink;

    async fn new_client(&mut self, target: NodeId, _node: &EmptyNode) -> SimLink {
        SimLink {
            from: self.from,
            to: target,
            router: self.router.clone(),
        }
    }
}

impl RaftNetwork<KilnRaft> for SimLink {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<KilnRaft>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId>>> {
        let target = self.router.deliver(self.from, self.to).await?;
        let resp = target
            .append_entries(rpc)
            .await
            .map_err(|_| unreachable("target stopped"))?;
        self.router.respond(self.from, self.to).await?;
        Ok(resp)
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<KilnRaft>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, EmptyNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        // The log is never purged, so a follower is always caught up from the log.
        Err(unreachable("snapshots are not used"))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId>>> {
        let target = self.router.deliver(self.from, self.to).await?;
        let resp = target
            .vote(rpc)
            .await
            .map_err(|_| unreachable("target stopped"))?;
        self.router.respond(self.from, self.to).await?;
        Ok(resp)
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(Duration::from_millis(50)))
    }
}

// ----- test batches -----

fn put_varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        let byte = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A valid RecordBatch v2 (no compression) holding `values` as records with no key.
pub fn build_batch(values: &[Vec<u8>], timestamp_ms: i64) -> Vec<u8> {
    let mut records = Vec::new();
    for (i, value) in values.iter().enumerate() {
        let mut r = Vec::new();
        r.push(0); // attributes
        put_varint(&mut r, 0); // timestamp delta
        put_varint(&mut r, i as i64); // offset delta
        put_varint(&mut r, -1); // no key
        put_varint(&mut r, value.len() as i64);
        r.extend_from_slice(value);
        put_varint(&mut r, 0); // no headers
        put_varint(&mut records, r.len() as i64);
        records.extend_from_slice(&r);
    }
    let count = values.len() as i32;
    let mut b = Vec::with_capacity(61 + records.len());
    b.extend_from_slice(&0i64.to_be_bytes()); // base offset, stamped on read
    b.extend_from_slice(&((49 + records.len()) as i32).to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes()); // partition leader epoch
    b.push(2); // magic
    b.extend_from_slice(&0u32.to_be_bytes()); // crc, below
    b.extend_from_slice(&0i16.to_be_bytes()); // attributes
    b.extend_from_slice(&(count - 1).to_be_bytes()); // last offset delta
    b.extend_from_slice(&timestamp_ms.to_be_bytes());
    b.extend_from_slice(&timestamp_ms.to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
    b.extend_from_slice(&(-1i16).to_be_bytes()); // producer epoch
    b.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    b.extend_from_slice(&count.to_be_bytes());
    b.extend_from_slice(&records);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

/// The bytes of a batch that reading does not stamp: everything but the base offset and the
/// partition leader epoch.
fn unstamped(bytes: &[u8]) -> (&[u8], &[u8]) {
    (
        bytes.get(8..12).unwrap_or(&[]),
        bytes.get(16..).unwrap_or(&[]),
    )
}

// ----- the world -----

struct Slot {
    log_disk: SimDisk,
    vote_disk: SimDisk,
    replica: Option<ReplicatedPartition>,
    watcher: Option<JoinHandle<()>>,
    /// Virtual ms at which a crashed replica comes back.
    restart_at: Option<u64>,
}

#[derive(Default)]
struct Shared {
    trace: Vec<String>,
    violations: Vec<String>,
    /// term → the replica that was leader in it.
    leaders: BTreeMap<u64, NodeId>,
    /// (append number, ack, started at, acknowledged at, the batch sent).
    acks: Vec<(usize, AppendAck, Instant, Instant, Bytes)>,
    failed: usize,
    /// (replica, batch) every read returned.
    reads: Vec<(NodeId, ReadBatch)>,
}

struct World {
    start: Instant,
    router: SimRouter,
    rng: StdRng,
    slots: BTreeMap<NodeId, Slot>,
    shared: Arc<Mutex<Shared>>,
    report: SimReport,
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

    fn up(&self) -> Vec<ReplicatedPartition> {
        self.slots
            .values()
            .filter_map(|s| s.replica.clone())
            .collect()
    }

    async fn start_node(&mut self, id: NodeId) {
        let config = raft_config(50, 150, 300);
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        slot.restart_at = None;
        let network = SimNetworkFactory {
            from: id,
            router: self.router.clone(),
        };
        let started = ReplicatedPartition::start(
            id,
            config,
            Arc::new(slot.log_disk.clone()),
            Arc::new(slot.vote_disk.clone()),
            network,
        )
        .await;
        let (replica, recovery) = match started {
            Ok(r) => r,
            Err(e) => {
                lock(&self.shared)
                    .violations
                    .push(format!("replica {id} failed to start: {e}"));
                return;
            }
        };
        self.router.lock().up.insert(id, replica.raft().clone());
        let mut metrics = replica.raft().metrics();
        let shared = Arc::clone(&self.shared);
        let start = self.start;
        slot.watcher = Some(tokio::spawn(async move {
            loop {
                let seen = {
                    let m = metrics.borrow_and_update();
                    (m.state == ServerState::Leader).then_some(m.current_term)
                };
                if let Some(term) = seen {
                    let mut s = lock(&shared);
                    match s.leaders.get(&term) {
                        Some(&other) if other != id => s.violations.push(format!(
                            "TWO LEADERS in term {term}: replicas {other} and {id}"
                        )),
                        Some(_) => {}
                        None => {
                            s.leaders.insert(term, id);
                            drop(s);
                            log_line(&shared, start, format!("replica {id} leads term {term}"));
                        }
                    }
                }
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        }));
        slot.replica = Some(replica);
        self.log(format!(
            "start replica {id}: recovered {} entries, cut {} bytes",
            recovery.entries, recovery.cut_bytes
        ));
    }

    /// Crashes replica `id` (if up); `why` goes into the trace.
    fn crash_node(&mut self, id: NodeId, why: &str) {
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        let Some(replica) = slot.replica.take() else {
            return;
        };
        self.router.lock().up.remove(&id);
        let unsynced = slot.log_disk.unsynced_len();
        let vote_unsynced = slot.vote_disk.unsynced_len();
        let keep_log = self.rng.random_range(0..=unsynced);
        let log = slot.log_disk.crash_counting(|_| keep_log);
        let vote = slot.vote_disk.crash_counting(|_| 0);
        slot.log_disk = log.disk;
        slot.vote_disk = vote.disk;
        if let Some(w) = slot.watcher.take() {
            w.abort();
        }
        let now = self.start.elapsed().as_millis() as u64;
        slot.restart_at = Some(now + self.rng.random_range(100..1500));
        tokio::spawn(async move { replica.shutdown().await });
        let dropped = log.dropped_bytes + vote.dropped_bytes;
        self.report.crashes += 1;
        if dropped > 0 {
            self.report.crashes_losing_unsynced += 1;
            self.report.unsynced_bytes_dropped += dropped as u64;
        }
        self.log(format!(
            "crash replica {id} ({why}): {unsynced} unsynced log bytes, {keep_log} of them \
             survive; {vote_unsynced} unsynced vote bytes dropped"
        ));
    }

    /// Up replicas holding written but unsynced bytes, in either file.
    fn in_flight(&self) -> Vec<NodeId> {
        self.slots
            .iter()
            .filter(|(_, s)| {
                s.replica.is_some()
                    && (s.log_disk.unsynced_len() > 0 || s.vote_disk.unsynced_len() > 0)
            })
            .map(|(&id, _)| id)
            .collect()
    }

    /// Slows the next fsync of `id`'s files by a seeded 2-40 ms (or disarms it), so that the
    /// write it covers is still unsynced at the next 1 ms step of the fault loop.
    fn stall_next_sync(&mut self, id: NodeId, arm: bool) {
        let (log_ms, vote_ms) = if arm {
            (self.rng.random_range(2..=40), self.rng.random_range(2..=40))
        } else {
            (0, 0)
        };
        if let Some(slot) = self.slots.get(&id) {
            slot.log_disk.stall_next_sync(Duration::from_millis(log_ms));
            slot.vote_disk
                .stall_next_sync(Duration::from_millis(vote_ms));
        }
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
    world_up: Vec<ReplicatedPartition>,
    n: usize,
    batch: Bytes,
    shared: Arc<Mutex<Shared>>,
    start: Instant,
) {
    let began = Instant::now();
    let mut target = leader_of(&world_up).or_else(|| world_up.first().cloned());
    let mut tries = 0;
    let res = loop {
        let Some(t) = target.clone() else {
            lock(&shared).failed += 1;
            return;
        };
        tries += 1;
        let res = tokio::time::timeout(Duration::from_secs(3), t.append(batch.clone())).await;
        // Follow the leader hint, as a Kafka client does after NOT_LEADER_OR_FOLLOWER.
        if let Ok(Err(PartitionError::NotLeader { leader: Some(l) })) = &res {
            if tries < 3 {
                if let Some(next) = world_up.iter().find(|r| r.id() == *l) {
                    target = Some(next.clone());
                    continue;
                }
            }
        }
        break res;
    };
    let Some(target) = target else {
        return;
    };
    match res {
        Ok(Ok(ack)) => {
            log_line(
                &shared,
                start,
                format!(
                    "ack append {n} via replica {}: offsets {}..={} epoch {}",
                    target.id(),
                    ack.base_offset,
                    ack.last_offset,
                    ack.leader_epoch
                ),
            );
            lock(&shared)
                .acks
                .push((n, ack, began, Instant::now(), batch));
        }
        Ok(Err(e)) => {
            let why = match e {
                PartitionError::NotLeader { .. } => "not leader".to_string(),
                other => other.to_string(),
            };
            log_line(&shared, start, format!("append {n} failed: {why}"));
            lock(&shared).failed += 1;
        }
        Err(_) => {
            log_line(
                &shared,
                start,
                format!("append {n} timed out (outcome unknown)"),
            );
            lock(&shared).failed += 1;
        }
    }
}

/// Runs one seeded simulation and checks the invariants. Must run inside a current-thread
/// tokio runtime with paused time (see the module docs).
pub async fn run(opts: SimOptions) -> SimReport {
    seed_thread_rng(opts.seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let router = SimRouter::new(rng.random());
    let mut slots = BTreeMap::new();
    for id in NODES {
        let sync_delay = Duration::from_millis(rng.random_range(1..=12));
        slots.insert(
            id,
            Slot {
                log_disk: SimDisk::new(sync_delay, opts.sync),
                vote_disk: SimDisk::new(sync_delay, opts.sync),
                replica: None,
                watcher: None,
                restart_at: None,
            },
        );
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
    let mut next_read = 0u64;
    let mut next_fault = world.rng.random_range(100..400);
    let mut plan = client_plan.into_iter().peekable();
    let mut spike_until = 0u64;
    let mut hunt: Option<Hunt> = None;
    // The fault phase, in 1 ms steps of virtual time.
    for now in 0..opts.fault_ms {
        tokio::time::sleep_until(world.start + Duration::from_millis(now)).await;
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
                world.up(),
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
                if let Ok(batches) = r.read(0, usize::MAX) {
                    let mut s = lock(&world.shared);
                    s.reads.extend(batches.into_iter().map(|b| (r.id(), b)));
                }
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
                for id in NODES {
                    world.stall_next_sync(id, false);
                }
                let why = if hit {
                    "aimed, write in flight"
                } else {
                    "aimed, no write came"
                };
                match h.target {
                    Some(id) => world.crash_node(id, why),
                    None => world.power_loss(why),
                }
                if hit {
                    world.report.aimed_crashes += in_flight.len();
                }
                next_fault = now + world.rng.random_range(100..500);
            }
            continue;
        }
        if now >= next_fault {
            next_fault = now + world.rng.random_range(100..500);
            let roll = world.rng.random_range(0..100);
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
                    let id = NODES[world.rng.random_range(0..NODES.len())];
                    let mut net = world.router.lock();
                    for other in NODES.iter().filter(|&&o| o != id) {
                        net.cut.insert(link(id, *other));
                    }
                    drop(net);
                    world.report.partitions += 1;
                    world.log(format!("partition: replica {id} isolated"));
                }
                75..=79 => {
                    let a = NODES[world.rng.random_range(0..NODES.len())];
                    let b =
                        NODES[(NODES.iter().position(|&x| x == a).unwrap_or(0) + 1) % NODES.len()];
                    world.router.lock().cut.insert(link(a, b));
                    world.report.partitions += 1;
                    world.log(format!("partition: link {a}-{b} cut"));
                }
                80..=94 => {
                    world.router.lock().cut.clear();
                    world.log("network healed".to_string());
                }
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
    for t in client_tasks {
        let _ = t.await;
    }

    // Converge: a leader commits one more entry in its term (so everything before it is
    // committed), then every replica's high watermark reaches the leader's.
    let mut leader = None;
    for attempt in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let up = world.up();
        if let Some(l) = leader_of(&up) {
            let marker = Bytes::from(build_batch(&[b"final marker".to_vec()], -1));
            if let Ok(Ok(ack)) =
                tokio::time::timeout(Duration::from_secs(2), l.append(marker.clone())).await
            {
                world.log(format!(
                    "final marker committed at {} by replica {} (attempt {attempt})",
                    ack.base_offset,
                    l.id()
                ));
                lock(&world.shared).acks.push((
                    usize::MAX,
                    ack,
                    Instant::now(),
                    Instant::now(),
                    marker,
                ));
                leader = Some(l);
                break;
            }
        }
    }
    let mut report = std::mem::take(&mut world.report);
    let Some(leader) = leader else {
        let mut s = lock(&world.shared);
        s.violations
            .push("LIVENESS: no leader committed an entry within 10 s after healing".to_string());
        report.trace = std::mem::take(&mut s.trace);
        report.violations = std::mem::take(&mut s.violations);
        return report;
    };
    let target_hw = leader.high_watermark();
    for _ in 0..100 {
        if world.up().iter().all(|r| r.high_watermark() >= target_hw) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    check(&world, &leader, &mut report);
    for id in NODES {
        world.crash_node(id, "end of run");
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    report
}

fn check(world: &World, leader: &ReplicatedPartition, report: &mut SimReport) {
    let mut s = lock(&world.shared);
    let mut v: Vec<String> = Vec::new();
    let final_log = match leader.read(0, usize::MAX) {
        Ok(b) => b,
        Err(e) => {
            v.push(format!("leader read failed: {e}"));
            Vec::new()
        }
    };
    // Order: contiguous offsets from 0, every batch valid.
    let mut expect = 0i64;
    let mut by_offset: BTreeMap<i64, &ReadBatch> = BTreeMap::new();
    for b in &final_log {
        if b.base_offset != expect {
            v.push(format!(
                "ORDER: batch at {} but expected {expect}",
                b.base_offset
            ));
        }
        match kiln_log::batch::validate_batches(&b.bytes) {
            Ok(batches) => {
                let count = batches.first().map_or(0, |x| x.header.record_count);
                expect = b.base_offset + i64::from(count);
            }
            Err(e) => v.push(format!("CORRUPT: batch at {}: {e}", b.base_offset)),
        }
        by_offset.insert(b.base_offset, b);
    }
    let hw = leader.high_watermark();
    if expect != hw {
        v.push(format!(
            "HW: log ends at {expect} but the high watermark is {hw}"
        ));
    }
    report.final_high_watermark = hw;
    // No acknowledged record lost.
    let mut seen_offsets = BTreeMap::new();
    for (n, ack, _, _, sent) in &s.acks {
        match by_offset.get(&ack.base_offset) {
            Some(b) if unstamped(&b.bytes) == unstamped(sent) => {}
            Some(_) => v.push(format!(
                "LOST acknowledged append {n}: offset {} holds other bytes",
                ack.base_offset
            )),
            None => v.push(format!(
                "LOST acknowledged append {n}: nothing at offset {} (log ends at {expect})",
                ack.base_offset
            )),
        }
        if let Some(other) = seen_offsets.insert(ack.base_offset, *n) {
            v.push(format!(
                "ORDER: appends {other} and {n} both acknowledged at offset {}",
                ack.base_offset
            ));
        }
    }
    // Real-time order of acknowledgements.
    for (n1, a1, _, done1, _) in &s.acks {
        for (n2, a2, began2, _, _) in &s.acks {
            if done1 < began2 && a1.base_offset >= a2.base_offset {
                v.push(format!(
                    "ORDER: append {n1} acknowledged before append {n2} started, but offsets {} >= {}",
                    a1.base_offset, a2.base_offset
                ));
            }
        }
    }
    // Every read served only data that is in the final log.
    for (node, b) in &s.reads {
        match by_offset.get(&b.base_offset) {
            Some(f) if unstamped(&f.bytes) == unstamped(&b.bytes) => {}
            _ => v.push(format!(
                "READ of data not in the final log: replica {node} served offset {}",
                b.base_offset
            )),
        }
    }
    report.reads_checked = s.reads.len();
    // Convergence.
    for r in world.up() {
        match r.read(0, usize::MAX) {
            Ok(batches) => {
                let same = batches.len() == final_log.len()
                    && batches.iter().zip(&final_log).all(|(a, b)| {
                        a.base_offset == b.base_offset && unstamped(&a.bytes) == unstamped(&b.bytes)
                    });
                if !same {
                    v.push(format!(
                        "CONVERGENCE: replica {} holds {} committed batches, the leader {}",
                        r.id(),
                        batches.len(),
                        final_log.len()
                    ));
                }
            }
            Err(e) => v.push(format!("replica {} read failed: {e}", r.id())),
        }
    }
    report.acknowledged = s.acks.len();
    report.failed_appends = s.failed;
    report.leaders = s.leaders.len();
    let mut summary = String::new();
    let _ = write!(
        summary,
        "check: {} acknowledged, {} failed, log end {expect}, {} leaders, {} reads, {} violations",
        s.acks.len(),
        s.failed,
        s.leaders.len(),
        s.reads.len(),
        v.len() + s.violations.len()
    );
    let ms = world.start.elapsed().as_millis();
    s.trace.push(format!("{ms:>6}ms {summary}"));
    s.violations.extend(v);
    report.trace = std::mem::take(&mut s.trace);
    report.violations = std::mem::take(&mut s.violations);
}
