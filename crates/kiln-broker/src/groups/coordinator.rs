//! The group coordinator: Kafka's classic group membership protocol as a state machine.
//!
//! ```text
//!             first member joins              every member rejoined (or rebalance timeout)
//!   Empty ───────────────────────► Preparing ─────────────────────────────► Completing
//!     ▲                            Rebalance ◄──────────────┐                Rebalance
//!     │  last member leaves /         ▲   member joins, leaves, times out,    │ leader's
//!     │  times out                    │   or changes its subscription         │ SyncGroup
//!     └───────────────────────────────┴──────────────────────────── Stable ◄──┘
//! ```
//!
//! The coordinator never computes an assignment: the leader member runs the client's assignor
//! and sends the result in SyncGroup; the coordinator hands each member its part. Members are
//! removed when they stop heartbeating for their session timeout (checked by [`Coordinator::tick`]
//! on a timer) or fail to rejoin within the rebalance timeout.
//!
//! Membership lives in memory only; committed offsets live in the [`OffsetsStore`]. After a
//! broker restart every group is Empty and members rejoin (their member ids are unknown, so they
//! get UNKNOWN_MEMBER_ID and join afresh); their committed offsets are all there.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::{ConsumerProtocolAssignment, ConsumerProtocolSubscription};
use kafka_protocol::protocol::Decodable;
use kafka_protocol::ResponseError;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::offsets::{CommitKind, CommitOutcome, CommitRequest, OffsetsStore, StoreError, Ticket};
use super::records::{OffsetKey, GROUP_ID_LEN_MAX};

/// Protocols one member may offer in JoinGroup.
const PROTOCOLS_PER_MEMBER_MAX: usize = 64;
/// Longest rebalance timeout honoured (Kafka's max.poll.interval.ms is 5 min by default).
const REBALANCE_TIMEOUT_MAX: Duration = Duration::from_secs(30 * 60);
/// Member ids are `<client id>-<uuid>`; the client id part is cut to this many bytes.
const MEMBER_ID_CLIENT_PART_MAX: usize = 128;
/// The protocol type whose assignments the coordinator can read (Kafka consumers).
pub const CONSUMER_PROTOCOL_TYPE: &str = "consumer";

#[derive(Debug, Clone)]
pub struct GroupConfig {
    pub min_session_timeout_ms: i32,
    pub max_session_timeout_ms: i32,
    /// How long the first rebalance of an empty group waits for more members.
    pub initial_rebalance_delay_ms: u64,
    /// Members (joined or pending) one group may have.
    pub max_size: usize,
    pub offset_metadata_max_bytes: usize,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            min_session_timeout_ms: 6_000,
            max_session_timeout_ms: 1_800_000,
            initial_rebalance_delay_ms: 0,
            max_size: 1_000,
            offset_metadata_max_bytes: 4096,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl GroupState {
    /// The names Kafka uses in ListGroups and DescribeGroups.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

fn code(e: ResponseError) -> i16 {
    e.code()
}

/// An answer now, or one that arrives when the group moves on.
pub enum Answer<T> {
    Now(T),
    Later(oneshot::Receiver<T>),
}

pub struct JoinParams {
    pub group_id: String,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a member without an id first gets one back with MEMBER_ID_REQUIRED.
    pub require_known_member_id: bool,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct JoinOutcome {
    pub error_code: i16,
    pub generation_id: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// Filled for the leader only: every member with its metadata for the chosen protocol.
    pub members: Vec<(String, Option<String>, Bytes)>,
}

impl JoinOutcome {
    pub fn error(error: ResponseError, member_id: &str) -> Self {
        Self {
            error_code: code(error),
            generation_id: -1,
            member_id: member_id.to_string(),
            ..Default::default()
        }
    }
}

pub struct SyncParams {
    pub group_id: String,
    pub generation_id: i32,
    pub member_id: String,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignments: Vec<(String, Bytes)>,
}

#[derive(Debug, Clone, Default)]
pub struct SyncOutcome {
    pub error_code: i16,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncOutcome {
    pub fn error(error: ResponseError) -> Self {
        Self {
            error_code: code(error),
            ..Default::default()
        }
    }
}

pub struct CommitPartition {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
}

pub struct CommitParams {
    pub group_id: String,
    pub generation_id: i32,
    pub member_id: String,
    pub partitions: Vec<CommitPartition>,
}

pub struct MemberDescription {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

pub struct GroupDescription {
    pub group_id: String,
    pub state: &'static str,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<MemberDescription>,
}

/// Partitions a member may commit: its assignment in this generation and in the one before
/// (a cooperative rebalance first takes partitions away, and the member commits them as it lets
/// go). `checked` is false when the assignment could not be read (not the consumer protocol).
#[derive(Debug, Default)]
struct Ownership {
    checked: bool,
    current: HashSet<(String, i32)>,
    previous: HashSet<(String, i32)>,
}

impl Ownership {
    fn allows(&self, topic: &str, partition: i32) -> bool {
        if !self.checked {
            return true;
        }
        let key = (topic.to_string(), partition);
        self.current.contains(&key) || self.previous.contains(&key)
    }
}

struct Member {
    group_instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    ownership: Ownership,
    last_heard: Instant,
    join_waiter: Option<oneshot::Sender<JoinOutcome>>,
    sync_waiter: Option<oneshot::Sender<SyncOutcome>>,
    /// Order of arrival; the earliest member becomes leader when there is none.
    join_seq: u64,
}

impl Member {
    fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(name, _)| name == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }

    fn same_protocols(&self, protocols: &[(String, Bytes)]) -> bool {
        self.protocols == protocols
    }
}

struct Group {
    state: GroupState,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    members: HashMap<String, Member>,
    /// Member ids handed out with MEMBER_ID_REQUIRED, with when they lapse if unused.
    pending: HashMap<String, Instant>,
    rebalance_deadline: Instant,
    /// The first rebalance of an empty group waits until then for more members.
    join_not_before: Option<Instant>,
    rebalance_started: Option<Instant>,
    next_join_seq: u64,
}

impl Group {
    fn new(now: Instant) -> Self {
        Self {
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: HashMap::new(),
            pending: HashMap::new(),
            rebalance_deadline: now,
            join_not_before: None,
            rebalance_started: None,
            next_join_seq: 0,
        }
    }

    /// Protocol names every member supports.
    fn common_protocols(&self, except: Option<&str>) -> Option<HashSet<String>> {
        let mut common: Option<HashSet<String>> = None;
        for (id, m) in &self.members {
            if Some(id.as_str()) == except {
                continue;
            }
            let names: HashSet<String> = m.protocols.iter().map(|(n, _)| n.clone()).collect();
            common = Some(match common {
                None => names,
                Some(c) => c.intersection(&names).cloned().collect(),
            });
        }
        common
    }

    /// The protocol with the most first-choice votes among those every member supports.
    fn select_protocol(&self) -> Option<String> {
        let common = self.common_protocols(None)?;
        let mut members: Vec<&Member> = self.members.values().collect();
        members.sort_by_key(|m| m.join_seq);
        let mut votes: Vec<(String, usize)> = Vec::new();
        for m in &members {
            if let Some((name, _)) = m.protocols.iter().find(|(n, _)| common.contains(n)) {
                match votes.iter_mut().find(|(n, _)| n == name) {
                    Some((_, v)) => *v += 1,
                    None => votes.push((name.clone(), 1)),
                }
            }
        }
        // Ties go to the earliest member's choice (votes are in arrival order).
        let best = votes.iter().map(|(_, v)| *v).max()?;
        votes.into_iter().find(|(_, v)| *v == best).map(|(n, _)| n)
    }
}

pub struct Coordinator {
    config: GroupConfig,
    groups: Mutex<HashMap<String, Group>>,
    store: OffsetsStore,
}

fn valid_group_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= GROUP_ID_LEN_MAX
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Coordinator {
    pub fn new(config: GroupConfig, store: OffsetsStore) -> Self {
        Self {
            config,
            groups: Mutex::new(HashMap::new()),
            store,
        }
    }

    pub fn config(&self) -> &GroupConfig {
        &self.config
    }

    pub fn store(&self) -> &OffsetsStore {
        &self.store
    }

    /// Forgets every group's members (cluster mode, on a coordinator change: members were
    /// known only to the previous coordinator, and rejoin here).
    pub fn forget_members(&self) {
        self.groups().clear();
    }

    fn groups(&self) -> MutexGuard<'_, HashMap<String, Group>> {
        // Every change to a group happens under this lock in whole steps; a panic elsewhere
        // cannot leave one half-changed.
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    // ---------------------------------------------------------------- JoinGroup

    pub fn join(&self, p: JoinParams, now: Instant) -> Answer<JoinOutcome> {
        let fail = |e: ResponseError| Answer::Now(JoinOutcome::error(e, &p.member_id));
        if !valid_group_id(&p.group_id) {
            return fail(ResponseError::InvalidGroupId);
        }
        if p.session_timeout_ms < self.config.min_session_timeout_ms
            || p.session_timeout_ms > self.config.max_session_timeout_ms
        {
            return fail(ResponseError::InvalidSessionTimeout);
        }
        if p.protocol_type.is_empty()
            || p.protocols.is_empty()
            || p.protocols.len() > PROTOCOLS_PER_MEMBER_MAX
            || p.protocols.iter().any(|(name, _)| name.is_empty())
        {
            return fail(ResponseError::InconsistentGroupProtocol);
        }
        let session_timeout =
            Duration::from_millis(u64::try_from(p.session_timeout_ms).unwrap_or(0));
        let rebalance_timeout = match u64::try_from(p.rebalance_timeout_ms) {
            Ok(v) if v > 0 => Duration::from_millis(v).min(REBALANCE_TIMEOUT_MAX),
            // JoinGroup v0 has no rebalance timeout: the session timeout bounds the join phase.
            _ => session_timeout,
        };

        let mut groups = self.groups();
        if !groups.contains_key(&p.group_id) {
            if !p.member_id.is_empty() {
                return fail(ResponseError::UnknownMemberId);
            }
            groups.insert(p.group_id.clone(), Group::new(now));
        }
        let Some(group) = groups.get_mut(&p.group_id) else {
            return fail(ResponseError::CoordinatorNotAvailable);
        };
        let is_known = group.members.contains_key(&p.member_id);
        if !group.members.is_empty() {
            if group.protocol_type.as_deref() != Some(p.protocol_type.as_str()) {
                return fail(ResponseError::InconsistentGroupProtocol);
            }
            let except = is_known.then_some(p.member_id.as_str());
            if let Some(common) = group.common_protocols(except) {
                if !p.protocols.iter().any(|(n, _)| common.contains(n)) {
                    return fail(ResponseError::InconsistentGroupProtocol);
                }
            }
        }

        if p.member_id.is_empty() {
            if group.members.len() + group.pending.len() >= self.config.max_size {
                return fail(ResponseError::GroupMaxSizeReached);
            }
            let member_id = new_member_id(&p.client_id);
            if p.require_known_member_id {
                group
                    .pending
                    .insert(member_id.clone(), now + session_timeout);
                tracing::debug!(group = %p.group_id, member = %member_id, "member id handed out (MEMBER_ID_REQUIRED)");
                return Answer::Now(JoinOutcome::error(
                    ResponseError::MemberIdRequired,
                    &member_id,
                ));
            }
            let group_id = p.group_id.clone();
            return self.add_member(
                &group_id,
                group,
                member_id,
                p,
                session_timeout,
                rebalance_timeout,
                now,
            );
        }
        if group.pending.remove(&p.member_id).is_some() {
            let member_id = p.member_id.clone();
            let group_id = p.group_id.clone();
            return self.add_member(
                &group_id,
                group,
                member_id,
                p,
                session_timeout,
                rebalance_timeout,
                now,
            );
        }
        if !is_known {
            return fail(ResponseError::UnknownMemberId);
        }
        let group_id = p.group_id.clone();
        self.rejoin(&group_id, group, p, session_timeout, rebalance_timeout, now)
    }

    #[allow(clippy::too_many_arguments)]
    fn add_member(
        &self,
        group_id: &str,
        group: &mut Group,
        member_id: String,
        p: JoinParams,
        session_timeout: Duration,
        rebalance_timeout: Duration,
        now: Instant,
    ) -> Answer<JoinOutcome> {
        let (tx, rx) = oneshot::channel();
        if group.members.is_empty() {
            group.protocol_type = Some(p.protocol_type.clone());
        }
        let was_empty = group.state == GroupState::Empty;
        group.next_join_seq += 1;
        group.members.insert(
            member_id.clone(),
            Member {
                group_instance_id: p.group_instance_id,
                client_id: p.client_id,
                client_host: p.client_host,
                session_timeout,
                rebalance_timeout,
                protocols: p.protocols,
                assignment: Bytes::new(),
                ownership: Ownership::default(),
                last_heard: now,
                join_waiter: Some(tx),
                sync_waiter: None,
                join_seq: group.next_join_seq,
            },
        );
        tracing::info!(group = group_id, member = %member_id, members = group.members.len(), "member joined");
        if group.state != GroupState::PreparingRebalance {
            if was_empty && self.config.initial_rebalance_delay_ms > 0 {
                let delay = Duration::from_millis(self.config.initial_rebalance_delay_ms)
                    .min(rebalance_timeout);
                group.join_not_before = Some(now + delay);
            }
            prepare_rebalance(group_id, group, now, "a member joined");
        }
        complete_join_if_ready(group_id, group, now);
        Answer::Later(rx)
    }

    fn rejoin(
        &self,
        group_id: &str,
        group: &mut Group,
        p: JoinParams,
        session_timeout: Duration,
        rebalance_timeout: Duration,
        now: Instant,
    ) -> Answer<JoinOutcome> {
        let is_leader = group.leader.as_deref() == Some(p.member_id.as_str());
        let state = group.state;
        let unchanged = match group.members.get_mut(&p.member_id) {
            Some(member) => {
                member.last_heard = now;
                member.same_protocols(&p.protocols)
            }
            None => {
                return Answer::Now(JoinOutcome::error(
                    ResponseError::UnknownMemberId,
                    &p.member_id,
                ))
            }
        };
        match state {
            // A member that lost its JoinGroup answer (or a follower with nothing new) gets the
            // current generation again; nothing else is disturbed.
            GroupState::CompletingRebalance if unchanged => {
                return Answer::Now(join_outcome(group, &p.member_id))
            }
            GroupState::Stable if unchanged && !is_leader => {
                return Answer::Now(join_outcome(group, &p.member_id))
            }
            _ => {}
        }
        let Some(member) = group.members.get_mut(&p.member_id) else {
            return Answer::Now(JoinOutcome::error(
                ResponseError::UnknownMemberId,
                &p.member_id,
            ));
        };
        let (tx, rx) = oneshot::channel();
        member.protocols = p.protocols;
        member.session_timeout = session_timeout;
        member.rebalance_timeout = rebalance_timeout;
        if let Some(old) = member.join_waiter.replace(tx) {
            let _ = old.send(JoinOutcome::error(
                ResponseError::RebalanceInProgress,
                &p.member_id,
            ));
        }
        if state != GroupState::PreparingRebalance {
            let reason = match (&p.reason, unchanged) {
                (Some(r), _) => format!("member rejoined: {r}"),
                (None, false) => "a member changed its subscription".to_string(),
                (None, true) => "the leader rejoined".to_string(),
            };
            prepare_rebalance(group_id, group, now, &reason);
        }
        complete_join_if_ready(group_id, group, now);
        Answer::Later(rx)
    }

    // ---------------------------------------------------------------- SyncGroup

    pub fn sync(&self, p: SyncParams, now: Instant) -> Answer<SyncOutcome> {
        let fail = |e: ResponseError| Answer::Now(SyncOutcome::error(e));
        if !valid_group_id(&p.group_id) {
            return fail(ResponseError::InvalidGroupId);
        }
        let mut groups = self.groups();
        let Some(group) = groups.get_mut(&p.group_id) else {
            return fail(ResponseError::UnknownMemberId);
        };
        if !group.members.contains_key(&p.member_id) {
            return fail(ResponseError::UnknownMemberId);
        }
        if p.generation_id != group.generation {
            return fail(ResponseError::IllegalGeneration);
        }
        let type_mismatch = p
            .protocol_type
            .as_ref()
            .is_some_and(|t| group.protocol_type.as_ref() != Some(t));
        let name_mismatch = p
            .protocol_name
            .as_ref()
            .is_some_and(|n| group.protocol.as_ref() != Some(n));
        if type_mismatch || name_mismatch {
            return fail(ResponseError::InconsistentGroupProtocol);
        }
        match group.state {
            GroupState::Empty => fail(ResponseError::UnknownMemberId),
            GroupState::PreparingRebalance => fail(ResponseError::RebalanceInProgress),
            GroupState::Stable => {
                let Some(member) = group.members.get_mut(&p.member_id) else {
                    return fail(ResponseError::UnknownMemberId);
                };
                member.last_heard = now;
                Answer::Now(SyncOutcome {
                    error_code: 0,
                    protocol_type: group.protocol_type.clone(),
                    protocol_name: group.protocol.clone(),
                    assignment: member.assignment.clone(),
                })
            }
            GroupState::CompletingRebalance => {
                let (tx, rx) = oneshot::channel();
                if let Some(member) = group.members.get_mut(&p.member_id) {
                    member.last_heard = now;
                    if let Some(old) = member.sync_waiter.replace(tx) {
                        let _ = old.send(SyncOutcome::error(ResponseError::RebalanceInProgress));
                    }
                }
                if group.leader.as_deref() == Some(p.member_id.as_str()) {
                    self.install_assignments(&p.group_id, group, p.assignments, now);
                }
                Answer::Later(rx)
            }
        }
    }

    /// The leader's SyncGroup: every member gets its part and the group is Stable.
    fn install_assignments(
        &self,
        group_id: &str,
        group: &mut Group,
        assignments: Vec<(String, Bytes)>,
        now: Instant,
    ) {
        let mut given: HashMap<String, Bytes> = HashMap::new();
        for (member_id, assignment) in assignments {
            if group.members.contains_key(&member_id) {
                given.insert(member_id, assignment);
            } else {
                tracing::debug!(group = group_id, member = %member_id, "leader assigned to a member that is not in the group; ignored");
            }
        }
        let consumer = group.protocol_type.as_deref() == Some(CONSUMER_PROTOCOL_TYPE);
        for (member_id, member) in group.members.iter_mut() {
            let assignment = given.remove(member_id).unwrap_or_default();
            let decoded = if consumer {
                decode_assignment(&assignment)
            } else {
                None
            };
            let previous = std::mem::take(&mut member.ownership.current);
            member.ownership = match decoded {
                Some(current) => Ownership {
                    checked: true,
                    current,
                    previous,
                },
                None => Ownership::default(),
            };
            member.assignment = assignment;
            member.last_heard = now;
            if let Some(waiter) = member.sync_waiter.take() {
                let _ = waiter.send(SyncOutcome {
                    error_code: 0,
                    protocol_type: group.protocol_type.clone(),
                    protocol_name: group.protocol.clone(),
                    assignment: member.assignment.clone(),
                });
            }
        }
        group.state = GroupState::Stable;
        let took_ms = group
            .rebalance_started
            .take()
            .map(|t| ms(now.saturating_duration_since(t)));
        tracing::info!(
            group = group_id,
            generation = group.generation,
            members = group.members.len(),
            rebalance_ms = took_ms,
            "group stable: assignments delivered"
        );
    }

    // ---------------------------------------------------------------- Heartbeat, LeaveGroup

    pub fn heartbeat(
        &self,
        group_id: &str,
        member_id: &str,
        generation_id: i32,
        now: Instant,
    ) -> i16 {
        if !valid_group_id(group_id) {
            return code(ResponseError::InvalidGroupId);
        }
        let mut groups = self.groups();
        let Some(group) = groups.get_mut(group_id) else {
            return code(ResponseError::UnknownMemberId);
        };
        if group.pending.contains_key(member_id) {
            return code(ResponseError::RebalanceInProgress);
        }
        let state = group.state;
        let generation = group.generation;
        let Some(member) = group.members.get_mut(member_id) else {
            return code(ResponseError::UnknownMemberId);
        };
        if generation_id != generation {
            return code(ResponseError::IllegalGeneration);
        }
        member.last_heard = now;
        match state {
            GroupState::Empty => code(ResponseError::UnknownMemberId),
            GroupState::PreparingRebalance => code(ResponseError::RebalanceInProgress),
            GroupState::CompletingRebalance | GroupState::Stable => 0,
        }
    }

    /// One error per member id; `Err` with a group-wide error when the group id is invalid or
    /// the group does not exist.
    pub fn leave(
        &self,
        group_id: &str,
        member_ids: &[String],
        now: Instant,
    ) -> Result<Vec<i16>, i16> {
        if !valid_group_id(group_id) {
            return Err(code(ResponseError::InvalidGroupId));
        }
        let mut groups = self.groups();
        let Some(group) = groups.get_mut(group_id) else {
            return Err(code(ResponseError::UnknownMemberId));
        };
        let mut errors = Vec::with_capacity(member_ids.len());
        for id in member_ids {
            if group.pending.remove(id).is_some() {
                errors.push(0);
            } else if group.members.contains_key(id) {
                remove_member(group_id, group, id, now, "a member left the group");
                errors.push(0);
            } else {
                errors.push(code(ResponseError::UnknownMemberId));
            }
        }
        Ok(errors)
    }

    // ---------------------------------------------------------------- OffsetCommit, OffsetFetch

    /// Checks and appends a commit. Returns one error code per partition (in request order) and,
    /// when anything was written or kept, the ticket to wait on before answering.
    pub fn commit(
        &self,
        p: &CommitParams,
        high_watermark: impl Fn(&str, i32) -> Option<i64>,
        now: Instant,
        now_ms: i64,
    ) -> (Vec<i16>, Option<Ticket>) {
        let all = |e: ResponseError| (vec![code(e); p.partitions.len()], None);
        if !valid_group_id(&p.group_id) {
            return all(ResponseError::InvalidGroupId);
        }
        let mut groups = self.groups();
        let group = groups.get_mut(&p.group_id);
        let kind = match group {
            None if p.generation_id < 0 => CommitKind::Reset,
            None if !p.member_id.is_empty() => return all(ResponseError::UnknownMemberId),
            None => return all(ResponseError::IllegalGeneration),
            Some(g) => {
                if p.generation_id < 0 && g.members.is_empty() {
                    CommitKind::Reset
                } else if g.pending.contains_key(&p.member_id) {
                    return all(ResponseError::RebalanceInProgress);
                } else if !g.members.contains_key(&p.member_id) {
                    return all(ResponseError::UnknownMemberId);
                } else if p.generation_id != g.generation {
                    return all(ResponseError::IllegalGeneration);
                } else if g.state == GroupState::CompletingRebalance {
                    return all(ResponseError::RebalanceInProgress);
                } else {
                    CommitKind::Member
                }
            }
        };
        // Re-borrow for the ownership check (a commit also counts as a heartbeat).
        let member = match kind {
            CommitKind::Member => groups
                .get_mut(&p.group_id)
                .and_then(|g| g.members.get_mut(&p.member_id)),
            CommitKind::Reset => None,
        };
        let member = member.map(|m| {
            m.last_heard = now;
            &*m
        });

        let mut errors = vec![0i16; p.partitions.len()];
        let mut requests = Vec::with_capacity(p.partitions.len());
        let mut slots = Vec::with_capacity(p.partitions.len());
        for (i, part) in p.partitions.iter().enumerate() {
            let Some(hw) = high_watermark(&part.topic, part.partition) else {
                errors[i] = code(ResponseError::UnknownTopicOrPartition);
                continue;
            };
            if part
                .metadata
                .as_ref()
                .is_some_and(|m| m.len() > self.config.offset_metadata_max_bytes)
            {
                errors[i] = code(ResponseError::OffsetMetadataTooLarge);
                continue;
            }
            if part.offset < 0 || part.offset > hw {
                errors[i] = code(ResponseError::OffsetOutOfRange);
                continue;
            }
            if member.is_some_and(|m| !m.ownership.allows(&part.topic, part.partition)) {
                tracing::info!(group = %p.group_id, member = %p.member_id, topic = %part.topic, partition = part.partition,
                    "commit refused: the partition is not assigned to this member");
                errors[i] = code(ResponseError::IllegalGeneration);
                continue;
            }
            slots.push(i);
            requests.push(CommitRequest {
                key: OffsetKey {
                    group: p.group_id.clone(),
                    topic: part.topic.clone(),
                    partition: part.partition,
                },
                offset: part.offset,
                leader_epoch: part.leader_epoch,
                metadata: part.metadata.clone(),
                kind,
            });
        }
        if requests.is_empty() {
            return (errors, None);
        }
        // Appended while the group lock is held, so a reset cannot race a member joining.
        match self.store.commit(&requests, now_ms) {
            Ok((outcomes, ticket)) => {
                for (r, outcome) in requests.iter().zip(&outcomes) {
                    if let CommitOutcome::KeptHigher { kept } = outcome {
                        tracing::info!(group = %p.group_id, topic = %r.key.topic, partition = r.key.partition,
                            offered = r.offset, kept, "commit would move the offset backwards; the higher offset is kept");
                    }
                }
                if kind == CommitKind::Reset && p.member_id.is_empty() {
                    for r in &requests {
                        tracing::info!(group = %p.group_id, topic = %r.key.topic, partition = r.key.partition,
                            offset = r.offset, "offset set while the group has no members (reset)");
                    }
                }
                (errors, Some(ticket))
            }
            Err(e) => {
                let error = match e {
                    StoreError::TooLarge(_) => ResponseError::InvalidCommitOffsetSize,
                    _ => ResponseError::CoordinatorNotAvailable,
                };
                tracing::error!(group = %p.group_id, error = %e, "offset commit failed");
                for i in slots {
                    errors[i] = code(error);
                }
                (errors, None)
            }
        }
    }

    // ---------------------------------------------------------------- List, Describe, Delete

    /// (group id, protocol type, state) for every group, sorted by id.
    pub fn list(&self) -> Vec<(String, String, &'static str)> {
        let groups = self.groups();
        let mut out: Vec<(String, String, &'static str)> = groups
            .iter()
            .map(|(id, g)| {
                (
                    id.clone(),
                    g.protocol_type.clone().unwrap_or_default(),
                    g.state.as_str(),
                )
            })
            .collect();
        for id in self.store.groups() {
            if !groups.contains_key(&id) {
                out.push((id, String::new(), GroupState::Empty.as_str()));
            }
        }
        out.sort();
        out
    }

    /// `None` when the group does not exist (no members and no committed offsets).
    pub fn describe(&self, group_id: &str) -> Option<GroupDescription> {
        let groups = self.groups();
        let Some(group) = groups.get(group_id) else {
            return self.store.has_group(group_id).then(|| GroupDescription {
                group_id: group_id.to_string(),
                state: GroupState::Empty.as_str(),
                protocol_type: String::new(),
                protocol: String::new(),
                members: Vec::new(),
            });
        };
        // As Kafka does: metadata and assignments only for a Stable group.
        let stable = group.state == GroupState::Stable;
        let protocol = group.protocol.clone().unwrap_or_default();
        let mut members: Vec<(&String, &Member)> = group.members.iter().collect();
        members.sort_by_key(|(_, m)| m.join_seq);
        Some(GroupDescription {
            group_id: group_id.to_string(),
            state: group.state.as_str(),
            protocol_type: group.protocol_type.clone().unwrap_or_default(),
            protocol: if stable {
                protocol.clone()
            } else {
                String::new()
            },
            members: members
                .into_iter()
                .map(|(id, m)| MemberDescription {
                    member_id: id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: if stable {
                        m.metadata_for(&protocol)
                    } else {
                        Bytes::new()
                    },
                    assignment: if stable {
                        m.assignment.clone()
                    } else {
                        Bytes::new()
                    },
                })
                .collect(),
        })
    }

    /// Deletes groups that have no members. One error code per group, and the tombstone writes to
    /// wait for before answering.
    pub fn delete(&self, group_ids: &[String], now_ms: i64) -> (Vec<i16>, Vec<(usize, Ticket)>) {
        let mut groups = self.groups();
        let mut errors = Vec::with_capacity(group_ids.len());
        let mut tickets = Vec::new();
        for (index, id) in group_ids.iter().enumerate() {
            if !valid_group_id(id) {
                errors.push(code(ResponseError::InvalidGroupId));
                continue;
            }
            let live = groups.get(id);
            if live.is_some_and(|g| !g.members.is_empty() || !g.pending.is_empty()) {
                errors.push(code(ResponseError::NonEmptyGroup));
                continue;
            }
            if live.is_none() && !self.store.has_group(id) {
                errors.push(code(ResponseError::GroupIdNotFound));
                continue;
            }
            match self.store.delete_group(id, now_ms) {
                Ok(ticket) => {
                    groups.remove(id);
                    tickets.extend(ticket.map(|t| (index, t)));
                    tracing::info!(group = %id, "group deleted with its committed offsets");
                    errors.push(0);
                }
                Err(e) => {
                    tracing::error!(group = %id, error = %e, "deleting a group's offsets failed");
                    errors.push(code(ResponseError::CoordinatorNotAvailable));
                }
            }
        }
        (errors, tickets)
    }

    /// OffsetDelete: removes `group`'s committed offsets of `partitions`. Err: the group-level
    /// error; Ok: one error code per partition (GROUP_SUBSCRIBED_TO_TOPIC for a topic a live
    /// member subscribes to) and the tombstones to wait for.
    pub fn delete_offsets(
        &self,
        group_id: &str,
        partitions: &[(String, i32)],
        now_ms: i64,
    ) -> Result<(Vec<i16>, Ticket), ResponseError> {
        if !valid_group_id(group_id) {
            return Err(ResponseError::InvalidGroupId);
        }
        let groups = self.groups();
        let live = groups.get(group_id);
        if live.is_none() && !self.store.has_group(group_id) {
            return Err(ResponseError::GroupIdNotFound);
        }
        let subscribed = live.map(subscribed_topics).unwrap_or_default();
        let (mut errors, mut deletable) = (Vec::with_capacity(partitions.len()), Vec::new());
        for tp in partitions {
            if subscribed.contains(&tp.0) {
                errors.push(code(ResponseError::GroupSubscribedToTopic));
            } else {
                errors.push(0);
                deletable.push(tp.clone());
            }
        }
        // Under the groups lock, so no member joins subscribed between the check and the write.
        let ticket = self
            .store
            .delete_offsets(group_id, &deletable, now_ms)
            .map_err(|e| {
                tracing::error!(group = %group_id, error = %e, "deleting offsets failed");
                ResponseError::CoordinatorNotAvailable
            })?;
        drop(groups);
        Ok((errors, ticket))
    }

    /// Live member count per group (for metrics and the CLI's refusal message).
    pub fn member_counts(&self) -> Vec<(String, usize)> {
        let groups = self.groups();
        let mut out: Vec<(String, usize)> = groups
            .iter()
            .map(|(id, g)| (id.clone(), g.members.len()))
            .collect();
        out.sort();
        out
    }

    // ---------------------------------------------------------------- timers

    /// Expires sessions and pending member ids, ends join phases whose rebalance timeout passed,
    /// and forgets empty groups that have no offsets. Called on a timer.
    pub fn tick(&self, now: Instant) {
        let mut groups = self.groups();
        for (group_id, group) in groups.iter_mut() {
            let before = group.pending.len();
            group.pending.retain(|_, lapses| *lapses > now);
            let pending_lapsed = group.pending.len() != before;
            let expired: Vec<(String, u64)> = group
                .members
                .iter()
                .filter(|(_, m)| {
                    m.join_waiter.is_none()
                        && m.sync_waiter.is_none()
                        && now.saturating_duration_since(m.last_heard) > m.session_timeout
                })
                .map(|(id, m)| (id.clone(), ms(now.saturating_duration_since(m.last_heard))))
                .collect();
            for (member_id, silent_ms) in expired {
                tracing::warn!(group = %group_id, member = %member_id, silent_ms,
                    "member removed: no heartbeat within its session timeout");
                remove_member(
                    group_id,
                    group,
                    &member_id,
                    now,
                    "a member's session timed out",
                );
            }
            if pending_lapsed || group.state == GroupState::PreparingRebalance {
                complete_join_if_ready(group_id, group, now);
            }
        }
        groups.retain(|id, g| {
            !(g.state == GroupState::Empty && g.members.is_empty() && g.pending.is_empty())
                || self.store.has_group(id)
        });
    }
}

/// A JoinGroup answer for a member of the current generation.
fn join_outcome(group: &Group, member_id: &str) -> JoinOutcome {
    let protocol = group.protocol.clone().unwrap_or_default();
    let leader = group.leader.clone().unwrap_or_default();
    let members = if leader == member_id {
        let mut ms: Vec<(&String, &Member)> = group.members.iter().collect();
        ms.sort_by_key(|(_, m)| m.join_seq);
        ms.into_iter()
            .map(|(id, m)| {
                (
                    id.clone(),
                    m.group_instance_id.clone(),
                    m.metadata_for(&protocol),
                )
            })
            .collect()
    } else {
        Vec::new()
    };
    JoinOutcome {
        error_code: 0,
        generation_id: group.generation,
        protocol_type: group.protocol_type.clone(),
        protocol_name: group.protocol.clone(),
        leader,
        member_id: member_id.to_string(),
        members,
    }
}

fn prepare_rebalance(group_id: &str, group: &mut Group, now: Instant, reason: &str) {
    if group.state == GroupState::CompletingRebalance {
        // Members waiting for the leader's assignment must rejoin instead.
        for m in group.members.values_mut() {
            if let Some(w) = m.sync_waiter.take() {
                let _ = w.send(SyncOutcome::error(ResponseError::RebalanceInProgress));
            }
        }
    }
    let timeout = group
        .members
        .values()
        .map(|m| m.rebalance_timeout)
        .max()
        .unwrap_or(Duration::ZERO);
    group.state = GroupState::PreparingRebalance;
    group.rebalance_deadline = now + timeout;
    group.rebalance_started.get_or_insert(now);
    tracing::info!(
        group = group_id,
        generation = group.generation,
        members = group.members.len(),
        rebalance_timeout_ms = ms(timeout),
        reason,
        "rebalance started"
    );
}

fn remove_member(group_id: &str, group: &mut Group, member_id: &str, now: Instant, reason: &str) {
    let Some(member) = group.members.remove(member_id) else {
        return;
    };
    if let Some(w) = member.join_waiter {
        let _ = w.send(JoinOutcome::error(
            ResponseError::UnknownMemberId,
            member_id,
        ));
    }
    if let Some(w) = member.sync_waiter {
        let _ = w.send(SyncOutcome::error(ResponseError::UnknownMemberId));
    }
    if group.leader.as_deref() == Some(member_id) {
        group.leader = None;
    }
    match group.state {
        GroupState::Stable | GroupState::CompletingRebalance => {
            prepare_rebalance(group_id, group, now, reason)
        }
        GroupState::PreparingRebalance | GroupState::Empty => {}
    }
    complete_join_if_ready(group_id, group, now);
}

/// Ends the join phase once every member has rejoined (or the rebalance timeout passed, which
/// removes those that did not): the generation advances, the leader gets the member list.
fn complete_join_if_ready(group_id: &str, group: &mut Group, now: Instant) {
    if group.state != GroupState::PreparingRebalance {
        return;
    }
    let all_joined =
        group.members.values().all(|m| m.join_waiter.is_some()) && group.pending.is_empty();
    let delayed = group.join_not_before.is_some_and(|t| now < t);
    let timed_out = now >= group.rebalance_deadline;
    if !(timed_out || (all_joined && !delayed)) {
        return;
    }
    let stragglers: Vec<String> = group
        .members
        .iter()
        .filter(|(_, m)| m.join_waiter.is_none())
        .map(|(id, _)| id.clone())
        .collect();
    for id in &stragglers {
        tracing::warn!(group = group_id, member = %id, "member removed: it did not rejoin within the rebalance timeout");
        group.members.remove(id);
        if group.leader.as_deref() == Some(id.as_str()) {
            group.leader = None;
        }
    }
    group.join_not_before = None;
    group.generation = group.generation.wrapping_add(1).max(1);
    if group.members.is_empty() {
        group.state = GroupState::Empty;
        group.protocol = None;
        group.leader = None;
        group.rebalance_started = None;
        tracing::info!(
            group = group_id,
            generation = group.generation,
            "group is empty"
        );
        return;
    }
    group.protocol = group.select_protocol();
    if group
        .leader
        .as_ref()
        .is_none_or(|l| !group.members.contains_key(l))
    {
        group.leader = group
            .members
            .iter()
            .min_by_key(|(_, m)| m.join_seq)
            .map(|(id, _)| id.clone());
    }
    group.state = GroupState::CompletingRebalance;
    let ids: Vec<String> = group.members.keys().cloned().collect();
    for id in &ids {
        let outcome = join_outcome(group, id);
        if let Some(m) = group.members.get_mut(id) {
            m.assignment = Bytes::new();
            m.last_heard = now;
            if let Some(w) = m.join_waiter.take() {
                let _ = w.send(outcome);
            }
        }
    }
    tracing::info!(
        group = group_id,
        generation = group.generation,
        members = group.members.len(),
        protocol = group.protocol.as_deref().unwrap_or(""),
        leader = group.leader.as_deref().unwrap_or(""),
        "join phase complete; waiting for the leader's assignment"
    );
}

fn new_member_id(client_id: &str) -> String {
    let mut cut = client_id.len().min(MEMBER_ID_CLIENT_PART_MAX);
    while !client_id.is_char_boundary(cut) {
        cut -= 1;
    }
    let client = client_id.get(..cut).unwrap_or_default();
    let prefix = if client.is_empty() { "member" } else { client };
    format!("{prefix}-{}", uuid::Uuid::new_v4())
}

/// The topics a group's live members subscribe to (consumer protocol), or hold partitions of
/// when their subscription does not parse. Empty for a group without members.
fn subscribed_topics(group: &Group) -> HashSet<String> {
    let mut topics = HashSet::new();
    for member in group.members.values() {
        let metadata = group
            .protocol
            .as_deref()
            .map(|p| member.metadata_for(p))
            .or_else(|| member.protocols.first().map(|(_, m)| m.clone()))
            .unwrap_or_default();
        match decode_subscription(&metadata) {
            Some(subscribed) => topics.extend(subscribed),
            None => topics.extend(
                decode_assignment(&member.assignment)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(topic, _)| topic),
            ),
        }
    }
    topics
}

/// The topics of a consumer-protocol subscription; `None` when it does not parse.
fn decode_subscription(bytes: &Bytes) -> Option<Vec<String>> {
    let mut buf = bytes.clone();
    if buf.len() < 2 {
        return None;
    }
    let version = bytes::Buf::get_i16(&mut buf).clamp(0, 3);
    let decoded = ConsumerProtocolSubscription::decode(&mut buf, version).ok()?;
    Some(decoded.topics.into_iter().map(|t| t.to_string()).collect())
}

/// The partitions in a consumer-protocol assignment; `None` when it does not parse (then the
/// coordinator does not check ownership for that member).
pub fn decode_assignment(bytes: &Bytes) -> Option<HashSet<(String, i32)>> {
    if bytes.is_empty() {
        return Some(HashSet::new());
    }
    let mut buf = bytes.clone();
    if buf.len() < 2 {
        return None;
    }
    let version = i16::from_be_bytes([buf[0], buf[1]]);
    let _ = bytes::Buf::get_i16(&mut buf);
    // Newer versions only append fields, so they read as the newest version this codec knows.
    let version = version.clamp(0, 3);
    let decoded = ConsumerProtocolAssignment::decode(&mut buf, version).ok()?;
    Some(
        decoded
            .assigned_partitions
            .into_iter()
            .flat_map(|tp| {
                let topic = tp.topic.0.to_string();
                tp.partitions.into_iter().map(move |p| (topic.clone(), p))
            })
            .collect(),
    )
}
