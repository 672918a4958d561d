//! [`ReplicatedPartition`]: one replica of a Raft group whose log is a kiln-log directory.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use kiln_log::fs::Fs;
use kiln_log::{LogConfig, ReadResult, SegmentInfo, TimestampLookup};
use openraft::error::{InitializeError, RaftError};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
use openraft::{Config, RaftMetrics, RaftNetworkFactory, ServerState, SnapshotPolicy};
use tokio::time::Instant;

use crate::guard::{GuardedNetwork, ReplicaHealth};
use crate::liveness::{Check, Handing, LeadRound, Liveness, Role, Timings};
use crate::log_store::{LogRecovery, LogStore};
use crate::payload::Command;
use crate::proposer::Proposer;
use crate::pulse::{BeatAnswer, BeatItem};
use crate::state_machine::{core_read_mode, GroupKind, StateMachine};
use crate::types::{KilnRaft, LogId, NodeId, Raft};

type Metrics = RaftMetrics<NodeId, openraft::EmptyNode>;

/// Why a replica refused a vote request without asking openraft.
#[derive(Debug, thiserror::Error)]
pub enum VoteRefused {
    /// It heard from its leader within its vote lease, or leads with its lease held.
    #[error("{0}")]
    Lease(String),
    #[error("raft: {0}")]
    Raft(#[from] RaftError<NodeId>),
}

/// What the pulse should do about one replica this round (`pulse.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PulseDue {
    /// Nothing.
    Idle,
    /// It follows (or stands) and its election timeout passes at this instant (before the
    /// next round): stand then, unless it hears from a leader meanwhile.
    Stand(Instant),
    /// It leads `term` but its Raft core is stuck in a write: no beat, no heartbeat, so that
    /// its followers elect another.
    Stuck { term: u64, lapsed: bool },
    /// It leads `term`: make it heard by its other `voters`; `applied` when its whole log is
    /// applied (the log id a follower must hold for the group to be quiet).
    Lead {
        term: u64,
        applied: Option<LogId>,
        voters: Arc<[NodeId]>,
        /// Every follower held and had applied `applied` at the last beat: no heartbeat due.
        quiet: bool,
        /// Not quiet, and its log stood still since the last round: an openraft heartbeat is
        /// due (see `Liveness::lead_round`).
        heartbeat: bool,
        /// Its lease lapsed since the last check (counted in [`Liveness::lapses`]).
        lapsed: bool,
        /// It hands over to this voter, which has yet to report holding its whole log.
        successor: Option<NodeId>,
    },
}

/// An acknowledged append: committed on a majority, each of which had it fsynced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendAck {
    pub base_offset: i64,
    pub last_offset: i64,
    /// The Raft term it was written in: the Kafka leader epoch.
    pub leader_epoch: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    /// The batches failed kiln-log's validation (nothing was written).
    #[error("invalid batch: {0}")]
    InvalidBatch(#[from] kiln_log::LogError),
    /// This replica is not the leader (Kafka: NOT_LEADER_OR_FOLLOWER); `leader` if known.
    #[error("not the leader; the leader is {leader:?}")]
    NotLeader { leader: Option<NodeId> },
    /// The Raft node stopped (shutdown or a storage failure).
    #[error("replication stopped: {0}")]
    Stopped(String),
    #[error("storage: {0}")]
    Storage(#[from] io::Error),
    #[error("offset {offset} is out of range: the log holds [{log_start}, {log_end})")]
    OffsetOutOfRange {
        offset: i64,
        log_start: i64,
        log_end: i64,
    },
    /// An idempotent producer's batch does not follow its last one (Kafka:
    /// OUT_OF_ORDER_SEQUENCE_NUMBER). `expected` is -1 when no single sequence would do.
    #[error("producer {producer_id}: sequence {got} where {expected} was expected")]
    OutOfOrderSequence {
        producer_id: i64,
        expected: i32,
        got: i32,
    },
    /// The proposer's queue is full (the quorum is slow or stalled): nothing was written; retry
    /// later (Kafka: NOT_ENOUGH_REPLICAS, retriable).
    #[error("{queued} bytes are queued for replication (at most {max}): retry later")]
    QueueFull { queued: usize, max: usize },
    /// An idempotent producer's batch of an older epoch than its last (Kafka:
    /// INVALID_PRODUCER_EPOCH): a fenced instance.
    #[error("producer {producer_id}: epoch {got} is older than its epoch {current}")]
    InvalidProducerEpoch {
        producer_id: i64,
        current: i16,
        got: i16,
    },
    /// A batch at sequence `got` (not 0) from a producer this partition holds no state for:
    /// never seen, or forgotten after `EXPIRATION_MS` of silence (Kafka: UNKNOWN_PRODUCER_ID;
    /// the client takes a new producer id and starts again at 0).
    #[error(
        "producer {producer_id}: unknown here (expired or never seen), and sequence {got} is not 0"
    )]
    UnknownProducerId { producer_id: i64, got: i32 },
    /// A batch behind one of the same producer that this leader did not write (its produce
    /// timed out in the queue, or it was refused while leadership was settling): nothing was
    /// written; the producer resends both, in order (Kafka: NOT_ENOUGH_REPLICAS, retriable and
    /// not persisted). Not OUT_OF_ORDER_SEQUENCE_NUMBER: librdkafka answers that, for any
    /// request but the first in flight, by bumping its epoch for every partition, which resends
    /// under the new epoch batches another partition may already hold (librdkafka issue 4953).
    #[error(
        "producer {producer_id}: an earlier batch was not written (sequence {expected} expected, {got} given); resend both in order"
    )]
    EarlierBatchUnwritten {
        producer_id: i64,
        expected: i32,
        got: i32,
    },
}

impl PartitionError {
    /// The same error for another waiter (the I/O and log errors inside are not `Clone`).
    pub fn duplicate(&self) -> PartitionError {
        match self {
            PartitionError::NotLeader { leader } => PartitionError::NotLeader { leader: *leader },
            PartitionError::OffsetOutOfRange {
                offset,
                log_start,
                log_end,
            } => PartitionError::OffsetOutOfRange {
                offset: *offset,
                log_start: *log_start,
                log_end: *log_end,
            },
            PartitionError::OutOfOrderSequence {
                producer_id,
                expected,
                got,
            } => PartitionError::OutOfOrderSequence {
                producer_id: *producer_id,
                expected: *expected,
                got: *got,
            },
            PartitionError::InvalidProducerEpoch {
                producer_id,
                current,
                got,
            } => PartitionError::InvalidProducerEpoch {
                producer_id: *producer_id,
                current: *current,
                got: *got,
            },
            PartitionError::UnknownProducerId { producer_id, got } => {
                PartitionError::UnknownProducerId {
                    producer_id: *producer_id,
                    got: *got,
                }
            }
            PartitionError::QueueFull { queued, max } => PartitionError::QueueFull {
                queued: *queued,
                max: *max,
            },
            PartitionError::EarlierBatchUnwritten {
                producer_id,
                expected,
                got,
            } => PartitionError::EarlierBatchUnwritten {
                producer_id: *producer_id,
                expected: *expected,
                got: *got,
            },
            other => PartitionError::Stopped(other.to_string()),
        }
    }
}

/// The Raft timings and sizes a broker runs with unless configured otherwise (the broker's
/// `[cluster]` defaults and the simulation both use these). A 100 ms heartbeat: openraft gives
/// each AppendEntries one heartbeat to finish, a follower's fsync included.
pub const HEARTBEAT_MS: u64 = 100;
pub const ELECTION_TIMEOUT_MIN_MS: u64 = 300;
pub const ELECTION_TIMEOUT_MAX_MS: u64 = 600;
/// Entries per AppendEntries: with entries of up to [`ENTRY_BYTES_MAX`], one message stays
/// within what a heartbeat interval can carry and fsync.
pub const PAYLOAD_ENTRIES_MAX: u64 = 4;
/// The proposer joins queued appends into entries of up to this many bytes.
pub const ENTRY_BYTES_MAX: usize = 1 << 20;
/// Record bytes a partition's proposer holds queued (submitted, not yet proposed); past it an
/// append is refused at once with [`PartitionError::QueueFull`] (retriable), so a stalled
/// quorum with producers retrying costs bounded memory.
pub const PROPOSER_QUEUE_BYTES_MAX: usize = 64 << 20;

/// The production timings: [`HEARTBEAT_MS`] and the election timeouts above.
pub fn production_timings() -> Timings {
    match Timings::from_ms(
        HEARTBEAT_MS,
        ELECTION_TIMEOUT_MIN_MS,
        ELECTION_TIMEOUT_MAX_MS,
    ) {
        Ok(t) => t,
        Err(e) => unreachable!("the production timings are valid: {e}"),
    }
}

/// The production settings: [`pulsed_config`] of [`production_timings`].
pub fn production_config() -> Config {
    pulsed_config(&production_timings())
}

/// The Raft settings of a replica whose timers the broker's pulse runs (`pulse.rs`): openraft
/// neither ticks nor sends heartbeats of its own; the pulse makes the leader heard every
/// heartbeat, holds elections on [`Liveness`]'s clock and counts the lease. openraft's
/// `heartbeat_interval` then only bounds each AppendEntries (openraft gives one that long):
/// just under the shortest election timeout, so a follower's fsync under load fits in it.
pub fn pulsed_config(t: &Timings) -> Config {
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let min = ms(t.election_min);
    let mut c = raft_config(min - 1, min, ms(t.election_max));
    c.enable_tick = false;
    c.enable_heartbeat = false;
    c.max_payload_entries = PAYLOAD_ENTRIES_MAX;
    c
}

/// How far behind its leader's log, in entries, a learner may be and count as holding it
/// (openraft's `replication_lag_threshold`, read only by a blocking `add_learner`). A replica
/// move makes the learner a voter once this says it holds the log; openraft's default, 5,000
/// entries of up to [`ENTRY_BYTES_MAX`] each, called a learner that held nothing caught up
/// at once. A few entries' slack lets a learner behind a leader that keeps writing count as
/// caught up without waiting for a moment with nothing in flight.
pub const LEARNER_LAG_ENTRIES_MAX: u64 = 16;

/// The Raft settings Kiln uses for a group. Snapshots are asked for by the state machine
/// (retention moved the log start, or a table's log grew), never on openraft's own schedule,
/// and the log up to a snapshot is purged at once. openraft runs its own timers (a replica
/// without the broker's pulse: tests of one group); [`pulsed_config`] turns them off.
pub fn raft_config(heartbeat_ms: u64, election_min_ms: u64, election_max_ms: u64) -> Config {
    Config {
        cluster_name: "kiln".to_string(),
        heartbeat_interval: heartbeat_ms,
        election_timeout_min: election_min_ms,
        election_timeout_max: election_max_ms,
        snapshot_policy: SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: 0,
        max_payload_entries: 64,
        replication_lag_threshold: LEARNER_LAG_ENTRIES_MAX,
        ..Config::default()
    }
}

/// A group's [`StartOptions::stagger`] from its name (FNV-1a: the same on every broker and
/// every build).
pub fn stagger_of(group: &str) -> u64 {
    group.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// How to start a replica.
pub struct StartOptions {
    pub id: NodeId,
    pub config: Config,
    /// The timings liveness is judged by. With openraft's timers on, they must be the ones
    /// in `config`; with them off ([`pulsed_config`]), the pulse runs on these.
    pub timings: Timings,
    /// The same on every replica of the group, different between groups (a hash of the
    /// group's name: [`stagger_of`]): orders the followers that stand when their leader dies.
    pub stagger: u64,
    pub fs: Arc<dyn Fs>,
    /// The replica's directory: its log segments, `vote` and `state`.
    pub dir: PathBuf,
    pub log: LogConfig,
    pub kind: GroupKind,
    /// The group has other replicas to repair from (see [`LogStore::open`]).
    pub repairable: bool,
    /// Whether the repair guard is enforced. Off only in the simulation's demonstration that it
    /// matters.
    pub enforce_guard: bool,
    /// The proposer's entry size bound ([`ENTRY_BYTES_MAX`] by default).
    pub max_entry_bytes: usize,
    /// The proposer's queue bound ([`PROPOSER_QUEUE_BYTES_MAX`] by default).
    pub max_queued_bytes: usize,
    /// A table group snapshots after this many applied entries.
    pub table_snapshot_every: u64,
    /// The voter clients should find leading (a partition's first replica): it stands first
    /// when its leader falls silent, and leaders hand over to it (`Liveness::hand_over`).
    pub preferred: Option<NodeId>,
}

impl StartOptions {
    /// A data partition's replica in `dir` with the default log settings, repairable from its
    /// peers, the guard enforced, running openraft's own timers of `config` (its heartbeat
    /// interval and election timeouts are the timings).
    pub fn data(
        id: NodeId,
        config: Config,
        fs: Arc<dyn Fs>,
        dir: impl Into<PathBuf>,
    ) -> StartOptions {
        let timings = Timings::from_ms(
            config.heartbeat_interval,
            config.election_timeout_min,
            config.election_timeout_max,
        );
        let dir = dir.into();
        StartOptions {
            id,
            // An invalid config is refused by `start`, which validates it first.
            timings: timings.unwrap_or_else(|_| production_timings()),
            stagger: stagger_of(&dir.file_name().unwrap_or_default().to_string_lossy()),
            config,
            fs,
            dir,
            log: LogConfig::default(),
            kind: GroupKind::Data,
            repairable: true,
            enforce_guard: true,
            max_entry_bytes: ENTRY_BYTES_MAX,
            max_queued_bytes: PROPOSER_QUEUE_BYTES_MAX,
            table_snapshot_every: crate::state_machine::TABLE_SNAPSHOT_EVERY_ENTRIES,
            preferred: None,
        }
    }
}

/// One replica: a Raft node whose log holds the group's record batches.
#[derive(Clone)]
pub struct ReplicatedPartition {
    id: NodeId,
    raft: Raft,
    store: LogStore,
    state: StateMachine,
    health: ReplicaHealth,
    proposer: Proposer,
    /// Who heard from whom, the lease and elections (`liveness.rs`).
    liveness: Arc<Liveness>,
    /// openraft's timers are off: the broker's pulse must run (`pulse.rs`).
    pulsed: bool,
}

impl ReplicatedPartition {
    /// Recovers the replica's files and starts its Raft node. If recovery found damage, the
    /// replica starts repairing ([`ReplicatedPartition::repairing`]).
    pub async fn start<N>(
        opts: StartOptions,
        network: N,
    ) -> Result<(ReplicatedPartition, LogRecovery), PartitionError>
    where
        N: RaftNetworkFactory<KilnRaft>,
    {
        let mut config = opts
            .config
            .validate()
            .map_err(|e| PartitionError::Stopped(e.to_string()))?;
        // With openraft's timers on, the timings are the config's own; with them off, the
        // pulse runs on the timings and openraft keeps only the election timeouts (its vote
        // lease) from them.
        let pulsed = !config.enable_tick;
        let timings = opts.timings;
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let consistent = config.election_timeout_min == ms(timings.election_min)
            && config.election_timeout_max == ms(timings.election_max)
            && (pulsed || config.heartbeat_interval == ms(timings.heartbeat));
        if !consistent {
            return Err(PartitionError::Stopped(format!(
                "the timings {timings:?} are not those of the Raft settings (heartbeat {} ms, \
                 elections {}-{} ms)",
                config.heartbeat_interval, config.election_timeout_min, config.election_timeout_max
            )));
        }
        let liveness =
            Arc::new(Liveness::new(opts.id, timings, opts.stagger).with_preferred(opts.preferred));
        let (store, recovery) =
            LogStore::open(opts.fs, &opts.dir, opts.log, opts.repairable).await?;
        let health = store.health();
        health.set_enforced(opts.enforce_guard);
        let guarded = opts.enforce_guard && !health.guard().is_clear();
        let elect_wanted = config.enable_elect;
        liveness.set_may_stand(elect_wanted && !guarded);
        let pause_max = std::time::Duration::from_millis(config.election_timeout_max);
        if guarded {
            // No election timer until the guard is met (openraft reads this at start).
            config.enable_elect = false;
        }
        let state =
            StateMachine::open(store.clone(), opts.kind.clone(), opts.table_snapshot_every)?;
        let network = GuardedNetwork {
            inner: network,
            health: health.clone(),
            liveness: liveness.clone(),
        };
        let core_store = store.with_mode(core_read_mode(&opts.kind));
        let raft = Raft::new(
            opts.id,
            Arc::new(config),
            network,
            core_store,
            state.clone(),
        )
        .await
        .map_err(|e| PartitionError::Stopped(e.to_string()))?;
        health.attach(raft.metrics());
        tokio::spawn(crate::elections::run(
            raft.clone(),
            store.clone(),
            liveness.clone(),
            crate::elections::Plan {
                guarded,
                elect_wanted,
                pulsed,
                pause_max,
            },
        ));
        liveness.set_role(role_of(&raft.server_metrics().borrow()));
        tokio::spawn(take_snapshots(
            raft.clone(),
            state.clone(),
            liveness.clone(),
        ));
        let proposer = Proposer::start(
            raft.clone(),
            store.clone(),
            state.clone(),
            opts.max_entry_bytes,
            opts.max_queued_bytes,
            liveness.clone(),
        );
        Ok((
            ReplicatedPartition {
                id: opts.id,
                raft,
                store,
                state,
                health,
                proposer,
                liveness,
                pulsed,
            },
            recovery,
        ))
    }

    /// True while this replica repairs damaged files: it grants no votes and stands for no
    /// election until a leader has refilled its log past everything it held before the damage
    /// and it has applied that (and, after a lost vote record, followed a leader of a term at
    /// least as high as any it recorded). Its transport must refuse vote requests meanwhile:
    /// `net::serve` does when [`crate::net::RaftGroups::health`] answers for the group.
    pub fn repairing(&self) -> bool {
        self.health.repairing()
    }

    /// True while a write to this replica's files waits for disk space. A leader in this
    /// state cannot take appends (its Raft core waits for the write): refuse produce requests
    /// with a clear error rather than queue them.
    pub fn disk_full(&self) -> bool {
        self.health.disk_full()
    }

    /// The handle the transport asks about repair and a full disk (cheap to clone).
    pub fn health(&self) -> ReplicaHealth {
        self.health.clone()
    }

    /// Makes `members` the voters of a brand-new group. Call on one replica, once.
    pub async fn initialize(&self, members: BTreeSet<NodeId>) -> Result<(), PartitionError> {
        match self.raft.initialize(members).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(PartitionError::Stopped(e.to_string())),
        }
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// The leader's ordered, coalescing append queue (see [`Proposer`]).
    pub fn proposer(&self) -> &Proposer {
        &self.proposer
    }

    pub fn dir(&self) -> &Path {
        self.store.log().dir()
    }

    /// Appends one or more concatenated RecordBatch v2 (as a producer sends them) through Raft.
    /// Validated first (kiln-log's checks: lengths, magic, CRC32C); returns once the entry is
    /// committed, that is fsynced on a majority, with the offsets it took.
    /// Through the proposer, the one write path (offsets and producers are counted there).
    pub async fn append(&self, batches: Bytes) -> Result<AppendAck, PartitionError> {
        self.proposer
            .submit(batches)
            .await
            .map_err(|_| PartitionError::Stopped("the partition's proposer stopped".into()))?
    }

    /// Proposes a command (a control entry every replica applies), through the proposer.
    pub async fn propose(&self, command: Command) -> Result<AppendAck, PartitionError> {
        self.proposer
            .submit_command(command)
            .await
            .map_err(|_| PartitionError::Stopped("the partition's proposer stopped".into()))?
    }

    /// Offset below which records are committed: consumers never read at or past it.
    pub fn high_watermark(&self) -> i64 {
        self.state.high_watermark()
    }

    pub fn subscribe_high_watermark(&self) -> tokio::sync::watch::Receiver<i64> {
        self.state.subscribe_high_watermark()
    }

    /// The offset the next record will take here (uncommitted entries included).
    pub fn log_end_offset(&self) -> i64 {
        self.store.log().log_end_offset()
    }

    /// The first offset a client may read (retention moves it; the same on every replica once
    /// applied).
    pub fn log_start_offset(&self) -> i64 {
        self.store.log().log_start_offset()
    }

    /// Changes when this replica's log rolls segments (topic configs altered at run time).
    pub fn set_roll(&self, roll: kiln_log::RollSettings) -> Result<(), String> {
        self.store.log().set_roll(roll)
    }

    pub fn size_bytes(&self) -> u64 {
        self.store.log().size_bytes()
    }

    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.store.log().segments()
    }

    /// The last applied entry's index, if any.
    pub fn applied_index(&self) -> Option<u64> {
        self.state.last_applied().map(|l| l.index)
    }

    /// The Kafka leader epoch if this replica leads now (its lease holds, `liveness.rs`): its
    /// Raft term.
    pub fn leader_epoch(&self) -> Option<u64> {
        let m = self.raft.metrics();
        let m = m.borrow();
        self.holds_lease(&m, Instant::now())
            .then_some(m.current_term)
    }

    /// How long it leads for clients after a quorum's last acknowledgement (`liveness.rs`).
    pub fn lease(&self) -> std::time::Duration {
        self.liveness.timings().lease()
    }

    /// Who heard from whom: the lease, elections, beats (`liveness.rs`).
    pub fn liveness(&self) -> &Arc<Liveness> {
        &self.liveness
    }

    /// Whether openraft's own timers are off, so the broker's pulse must run (`pulse.rs`).
    pub fn pulsed(&self) -> bool {
        self.pulsed
    }

    /// Whether this replica leads for clients: Raft leader with its lease held (`liveness.rs`).
    pub fn leads(&self) -> bool {
        self.holds_lease(&self.raft.metrics().borrow(), Instant::now())
    }

    /// Whether `m` is this replica leading with its lease held at `now`, and not handing over
    /// (`Liveness::hand_over`: clients are told there is no leader meanwhile).
    fn holds_lease(&self, m: &Metrics, now: Instant) -> bool {
        m.state == ServerState::Leader
            && self.liveness.leads(m.current_term, now)
            && !self.liveness.handing_over(m.current_term)
    }

    /// Hands leadership to voter `to` (`Liveness::hand_over`): this replica takes no new
    /// writes from now, and `to` is elected once it holds everything and the vote lease has
    /// passed, about a second. An error says why not (not leading with its lease held, `to`
    /// not another voter, a handover under way); a handover that does not end in another
    /// leader is given up on its own.
    pub fn hand_over(&self, to: NodeId) -> Result<(), String> {
        let now = Instant::now();
        let term = {
            let m = self.raft.metrics();
            let m = m.borrow();
            if !self.holds_lease(&m, now) {
                return Err(format!(
                    "node {} does not lead with its lease held",
                    self.id
                ));
            }
            m.current_term
        };
        self.liveness.hand_over(term, to, now)
    }

    /// Hands a leader's AppendEntries (which arrived at `arrived`) to openraft and notes that
    /// the leader was heard unless it was refused for a higher vote. Every transport serves
    /// appends through here.
    ///
    /// A replica that already follows the sender in its term is heard on arrival, before
    /// openraft answers: under a saturating producer the answer waits behind the follower's
    /// own fsyncs, and a leader heard only once that write is done would look silent for as
    /// long as the disk is slow, which costs it votes it should keep.
    pub async fn serve_append(
        &self,
        rpc: AppendEntriesRequest<KilnRaft>,
        arrived: Instant,
    ) -> Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        let (term, leader) = (rpc.vote.leader_id.term, rpc.vote.leader_id.voted_for);
        if let Some(leader) = leader {
            if self.follows(term, leader) {
                self.liveness.heard(term, leader, arrived);
            }
        }
        let answer = self.raft.append_entries(rpc).await?;
        if let (false, Some(leader)) = (
            matches!(answer, AppendEntriesResponse::HigherVote(_)),
            leader,
        ) {
            self.liveness.heard(term, leader, arrived);
        }
        Ok(answer)
    }

    /// Answers a candidate's vote request (which arrived at `arrived`): refused without asking
    /// openraft while this replica heard from its leader within its vote lease or leads with
    /// its lease held (`liveness.rs`); a vote granted counts as hearing from the candidate.
    /// Every transport serves votes through here.
    pub async fn serve_vote(
        &self,
        rpc: VoteRequest<NodeId>,
        arrived: Instant,
    ) -> Result<VoteResponse<NodeId>, VoteRefused> {
        let (term, candidate) = (rpc.vote.leader_id.term, rpc.vote.leader_id.voted_for);
        let Some(candidate) = candidate else {
            return Err(VoteRefused::Lease(
                "a vote request names no candidate".into(),
            ));
        };
        if let Some(why) = self.liveness.refuses_vote(candidate, arrived) {
            return Err(VoteRefused::Lease(why));
        }
        if candidate != self.id && self.leads() {
            return Err(VoteRefused::Lease(format!(
                "node {} leads with its lease held: no vote for node {candidate}",
                self.id
            )));
        }
        let answer = self.raft.vote(rpc).await?;
        if answer.vote_granted {
            self.liveness.heard(term, candidate, arrived);
        }
        Ok(answer)
    }

    /// Answers one item of a leader's beat (`pulse.rs`), which arrived from `from` at
    /// `arrived`: accepted when this replica follows `from` in the item's term with its vote
    /// committed (then the leader was heard), caught up when it also holds and has applied
    /// the leader's whole log.
    pub fn serve_beat(&self, from: NodeId, item: &BeatItem, arrived: Instant) -> BeatAnswer {
        let m = self.raft.metrics();
        let m = m.borrow();
        let accepted = follows(&m, item.term, from);
        if !accepted {
            return BeatAnswer::default();
        }
        self.liveness.heard(item.term, from, arrived);
        let caught_up = item.applied.is_some_and(|applied| {
            m.last_log_index == Some(applied.index) && m.last_applied == Some(applied)
        });
        BeatAnswer {
            accepted,
            caught_up,
        }
    }

    /// Whether this replica follows `leader` in `term` with its vote committed.
    fn follows(&self, term: u64, leader: NodeId) -> bool {
        follows(&self.raft.metrics().borrow(), term, leader)
    }

    /// What the pulse should do about this replica at `now`, once per round (`pulse.rs`);
    /// `round`: the time to the next. As a leader, a lapse of its lease is counted here.
    pub fn pulse_due(&self, now: Instant, round: std::time::Duration) -> PulseDue {
        let (term, voters, lapsed, successor) = match self.liveness.check(now, round) {
            Check::Idle => return PulseDue::Idle,
            Check::Stand(at) => return PulseDue::Stand(at),
            // Handed over and silent: its followers' leases run out, its successor stands.
            Check::Lead {
                handing: Some(Handing::Released),
                ..
            } => return PulseDue::Idle,
            Check::Lead {
                term,
                voters,
                lapsed,
                handing,
            } => {
                let successor = match handing {
                    Some(Handing::Draining { to }) => Some(to),
                    _ => None,
                };
                (term, voters, lapsed, successor)
            }
        };
        // A leader whose Raft core is stuck in a write (a full or stalled disk) sends nothing
        // of its own; beats must not keep it leader either, or its followers never elect
        // another. Not stuck yet if the write began within a lease: an fsync on a loaded,
        // shared disk takes a round or two, and a leader that stopped beating for each one
        // would lose its lease (and its clients) under every burst of load. A stalled disk
        // costs the lease more before its followers stand.
        let stuck_after = self.liveness.timings().lease();
        let stuck = self.health.disk_full()
            || self
                .health
                .writing_since()
                .is_some_and(|since| now.saturating_duration_since(since) > stuck_after);
        if stuck {
            return PulseDue::Stuck { term, lapsed };
        }
        let (last_log, last_applied) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            if m.state != ServerState::Leader || m.current_term != term {
                // The role just changed; its watcher is about to say so.
                return PulseDue::Idle;
            }
            (m.last_log_index, m.last_applied)
        };
        let applied = last_applied.filter(|a| last_log == Some(a.index));
        let LeadRound { quiet, still } =
            self.liveness
                .lead_round(term, last_log, last_applied, applied);
        PulseDue::Lead {
            term,
            applied,
            voters,
            quiet,
            heartbeat: !quiet && still,
            lapsed,
            successor,
        }
    }

    /// Whether the high watermark is of the current term: an entry of this term is applied. A
    /// new leader learns that earlier terms' entries are committed only when its own first
    /// entry (Raft's blank entry) commits, so until then its high watermark trails what the
    /// previous leader acknowledged.
    pub fn high_watermark_is_current(&self) -> bool {
        let term = self.raft.metrics().borrow().current_term;
        self.state
            .last_applied()
            .is_some_and(|applied| applied.leader_id.term == term)
    }

    /// The leader this replica knows of (itself included, only while its lease holds:
    /// `liveness.rs`) and the current term.
    pub fn leader_and_term(&self) -> (Option<NodeId>, u64) {
        let m = self.raft.metrics();
        let m = m.borrow();
        let leader = m
            .current_leader
            .filter(|&l| l != self.id || self.holds_lease(&m, Instant::now()));
        (leader, m.current_term)
    }

    /// Whole batches from the one holding `offset`, up to `max_bytes` (at least one batch when
    /// one exists), never at or past the high watermark, CRC checked, epoch stamped.
    pub fn read(&self, offset: i64, max_bytes: usize) -> Result<ReadResult, PartitionError> {
        let high_watermark = self.high_watermark();
        self.store
            .log()
            .read(offset, max_bytes, high_watermark)
            .map_err(|e| match e {
                kiln_log::LogError::OffsetOutOfRange {
                    requested,
                    log_start,
                    log_end,
                } => PartitionError::OffsetOutOfRange {
                    offset: requested,
                    log_start,
                    log_end,
                },
                other => PartitionError::InvalidBatch(other),
            })
    }

    /// Everything this replica's log holds from `offset`, committed or not. Only the
    /// simulation's demonstration that the checker catches such a read uses it.
    #[doc(hidden)]
    pub fn read_past_high_watermark(
        &self,
        offset: i64,
        max_bytes: usize,
    ) -> Result<ReadResult, PartitionError> {
        Ok(self.store.log().read(offset, max_bytes, i64::MAX)?)
    }

    /// The first batch whose max timestamp is at or after `ts_ms`, below the high watermark.
    pub fn lookup_timestamp(&self, ts_ms: i64) -> Result<Option<TimestampLookup>, PartitionError> {
        Ok(self
            .store
            .log()
            .lookup_timestamp(ts_ms, self.high_watermark())?)
    }

    /// Where retention would move the log start at `now_ms` (entries applied here only): the
    /// command to propose, if any. Closed segments wholly below a DeleteRecords start go too,
    /// whatever the retention settings.
    pub fn retention_command(
        &self,
        now_ms: i64,
        retention_ms: Option<u64>,
        retention_bytes: Option<u64>,
    ) -> Option<Command> {
        let applied = self.applied_index()?;
        let log = self.store.log();
        let by_retention = log.retention_point(now_ms, retention_ms, retention_bytes, applied);
        let (index, kafka_offset) = by_retention
            .into_iter()
            .chain(self.deleted_segments_point(applied))
            .max_by_key(|(index, _)| *index)?;
        let read = log.read_entries(index, index + 1, 0, kiln_log::ReadMode::Summary);
        let term = match read {
            Ok(entries) => entries.first()?.term,
            Err(e) => {
                tracing::error!(dir = %self.dir().display(), index, error = %e, "retention cannot read the entry it would start after; not moving the log start");
                return None;
            }
        };
        Some(Command::LogStart {
            index,
            term,
            kafka_offset,
        })
    }

    /// The last closed, applied segment whose records all lie below the log start clients see
    /// (DeleteRecords moves it inside segments) and that is not purged yet.
    fn deleted_segments_point(&self, applied: u64) -> Option<(u64, i64)> {
        let visible_start = self.log_start_offset();
        let purged = self.state.purged_kafka();
        self.segments()
            .iter()
            .take_while(|s| {
                !s.active
                    && s.next_index > 0
                    && s.next_index - 1 <= applied
                    && s.next_kafka <= visible_start
            })
            .filter(|s| s.next_kafka > purged)
            .last()
            .map(|s| (s.next_index - 1, s.next_kafka))
    }

    /// DeleteRecords on the leader: proposes that clients read from `kafka_offset` on (at most
    /// the high watermark; the caller checks) and waits until it is committed here.
    pub async fn delete_records(&self, kafka_offset: i64) -> Result<i64, PartitionError> {
        if kafka_offset > self.log_start_offset() {
            self.propose(Command::DeleteRecords { kafka_offset })
                .await?;
        }
        Ok(self.log_start_offset())
    }

    /// Stops the Raft node, saves what is applied and closes the log (it stays on disk).
    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
        if let Err(e) = self.state.save_now() {
            tracing::warn!(dir = %self.dir().display(), error = %e, "could not save the applied position at shutdown");
        }
        if let Err(e) = self.store.log().close() {
            tracing::warn!(dir = %self.dir().display(), error = %e, "could not close the log cleanly");
        }
    }
}

/// Builds a snapshot whenever the state machine says one is due (and so purges the log up to
/// it), and keeps the replica's role in its liveness current (`Liveness::set_role`). Ends with
/// the Raft node.
async fn take_snapshots(raft: Raft, state: StateMachine, liveness: Arc<Liveness>) {
    let wanted = state.snapshot_wanted();
    // The server metrics change only with the vote, state, leader or membership, unlike the
    // full metrics, which change on every event the core handles.
    let mut metrics = raft.server_metrics();
    liveness.set_role(role_of(&metrics.borrow_and_update()));
    loop {
        tokio::select! {
            _ = wanted.notified() => {
                if raft.trigger().snapshot().await.is_err() {
                    return;
                }
            }
            changed = metrics.changed() => {
                if changed.is_err() {
                    return;
                }
                liveness.set_role(role_of(&metrics.borrow_and_update()));
            }
        }
    }
}

fn role_of(m: &openraft::metrics::RaftServerMetrics<NodeId, openraft::EmptyNode>) -> Role {
    Role {
        state: m.state,
        term: m.vote.leader_id.term,
        committed: m.vote.committed,
        voters: m.membership_config.membership().voter_ids().collect(),
        joint: {
            let configs = m.membership_config.membership().get_joint_config();
            if configs.len() > 1 {
                configs
                    .iter()
                    .map(|set| set.iter().copied().collect::<Arc<[NodeId]>>())
                    .collect()
            } else {
                Arc::from(Vec::new())
            }
        },
    }
}

/// Whether the replica whose metrics are `m` follows `leader` in `term` with its vote
/// committed: only then is a message from `leader` proof that the leader is alive.
fn follows(m: &Metrics, term: u64, leader: NodeId) -> bool {
    m.state == ServerState::Follower
        && m.vote.committed
        && m.vote.leader_id.term == term
        && m.vote.leader_id.voted_for == Some(leader)
}
