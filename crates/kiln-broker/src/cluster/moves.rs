//! Moving replicas from broker to broker (docs/replication.md, "Moving replicas").
//!
//! A move changes one Raft group's voters to a target set. It is asked of the controller
//! (AlterPartitionReassignments, or a decommission), which writes `StartMove` to the metadata
//! log; from then on:
//!
//! 1. every broker in the target opens a replica of the group, empty, never starting the
//!    group anew (`may_initialize` false): the leader fills it;
//! 2. the group's leader, wherever it is, adds each new broker as a learner and waits until
//!    it holds the log (openraft `add_learner`), then changes the voters to the target
//!    through a joint configuration (`change_membership`): the old and the new set must both
//!    agree on every entry until the new set alone decides, so the group keeps a majority
//!    throughout and a learner counts toward nothing;
//! 3. once the target alone is committed in the group's own log, the leader writes
//!    `FinishMove`: the partition's replicas in the metadata table are the target, and the
//!    brokers no longer in it stop their replica and delete it.
//!
//! A leader that dies at any step is replaced by one that finds the move in the table and
//! carries on from the group's membership as committed: every step is safe to repeat.
//!
//! A move of a partition can be called off (`CancelMove`, AlterPartitionReassignments with no
//! replicas) at any step: its target becomes the replicas it had before, and the leader drives
//! the group back there the same way (learners for what left, a joint configuration, then the
//! learners of the abandoned target removed). The brokers of the abandoned target keep their
//! replica until `FinishMove` of the move back: one of them may be a voter until then, and a
//! voter's log is never deleted while it may hold the only other copy of a committed entry.
//!
//! Decommissioning broker N (`Decommission`) asks the controller to move every replica N
//! holds, internal groups included, to the assignable broker holding the fewest, at most
//! [`MOVES_IN_FLIGHT_MAX`] at a time, and to remove N (`RemoveBroker`) once it holds none.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kiln_raft::partition::LEARNER_LAG_ENTRIES_MAX;
use uuid::Uuid;

use super::metadata::{Command, MetadataState, TopicRecord};
use super::{
    partition_group, replica, Cluster, ClusterError, Replica, METADATA_GROUP, OFFSETS_GROUP,
};

/// Moves the controller keeps under way at once while brokers are decommissioned: each
/// copies a partition's whole log to its new broker, so a few at a time keep the disks and
/// the network busy without starving the producers.
pub const MOVES_IN_FLIGHT_MAX: usize = 8;
/// Moves one broker, leading their groups, drives at once.
const DRIVERS_MAX: usize = 16;
/// How often each broker looks at the moves under way.
const MOVE_POLL: Duration = Duration::from_millis(250);
/// Longest wait for one step of a move (a learner catching up, a membership change); past
/// it the step is tried again.
const STEP_WAIT: Duration = Duration::from_secs(600);
/// How often a driver waiting for a learner looks at its progress.
const LEARNER_POLL: Duration = Duration::from_millis(100);
/// How often a driver waiting for a learner logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Longest wait for the controller to take a forwarded `FinishMove`.
const FINISH_WAIT: Duration = Duration::from_secs(10);
/// Replicas one move's target may name.
pub const TARGET_REPLICAS_MAX: usize = 7;

/// The topic name clients use for the internal groups in AlterPartitionReassignments and
/// ListPartitionReassignments (partition 0 each).
pub const METADATA_TOPIC: &str = "__cluster_metadata";
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// Partition index of group `group` if it is one of topic `id`'s.
pub fn partition_of(group: &str, id: Uuid) -> Option<u32> {
    let rest = group.strip_prefix(&id.to_string())?.strip_prefix('/')?;
    rest.parse().ok()
}

/// Topic `record`'s moves under way, by partition.
pub fn of_topic(
    record: &TopicRecord,
    moves: &BTreeMap<String, Vec<i32>>,
) -> BTreeMap<u32, Vec<i32>> {
    let prefix = format!("{}/", record.id);
    moves
        .range(prefix.clone()..)
        .take_while(|(g, _)| g.starts_with(&prefix))
        .filter_map(|(g, t)| Some((partition_of(g, record.id)?, t.clone())))
        .collect()
}

/// A move under way, as ListPartitionReassignments reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveStatus {
    pub topic: String,
    pub partition: i32,
    /// The group's replicas before the move.
    pub replicas: Vec<i32>,
    pub target: Vec<i32>,
    /// A cancelled move's abandoned target (empty otherwise): its brokers that are not in
    /// `target` are being removed.
    pub cancelled: Vec<i32>,
}

impl MoveStatus {
    pub fn adding(&self) -> Vec<i32> {
        self.target
            .iter()
            .copied()
            .filter(|b| !self.replicas.contains(b))
            .collect()
    }

    pub fn removing(&self) -> Vec<i32> {
        let mut out: Vec<i32> = Vec::new();
        for &b in self.replicas.iter().chain(&self.cancelled) {
            if !self.target.contains(&b) && !out.contains(&b) {
                out.push(b);
            }
        }
        out
    }
}

impl Cluster {
    /// The Raft group of `topic`'s partition `partition`, internal topics included.
    fn group_of(
        &self,
        state: &MetadataState,
        topic: &str,
        partition: i32,
    ) -> Result<String, ClusterError> {
        let internal = match topic {
            METADATA_TOPIC => Some(METADATA_GROUP),
            OFFSETS_TOPIC => Some(OFFSETS_GROUP),
            _ => None,
        };
        if let Some(group) = internal {
            if partition != 0 {
                return Err(ClusterError::NotFound(format!("{topic}/{partition}")));
            }
            return Ok(group.to_string());
        }
        let record = state
            .topics
            .get(topic)
            .ok_or_else(|| ClusterError::NotFound(topic.to_string()))?;
        if partition < 0 || partition as usize >= record.assignments.len() {
            return Err(ClusterError::NotFound(format!("{topic}/{partition}")));
        }
        Ok(partition_group(record.id, partition))
    }

    /// The voters of `group` now: a partition's as the metadata table says, an internal
    /// group's as its membership in this broker's replica says.
    fn current_replicas(&self, state: &MetadataState, group: &str) -> Option<Vec<i32>> {
        if super::is_internal_group(group) {
            let r = self.replica(group)?;
            return Some(voters(&r).into_iter().collect());
        }
        state.topics.values().find_map(|t| {
            let index = partition_of(group, t.id)?;
            t.assignments.get(index as usize).cloned()
        })
    }

    /// Moves `topic`'s partition `partition` to `target` (the preferred leader first):
    /// AlterPartitionReassignments. Forwarded to the controller from any other broker.
    pub async fn move_replicas(
        &self,
        topic: &str,
        partition: i32,
        target: Vec<i32>,
    ) -> Result<(), ClusterError> {
        if !self.metadata.is_leader() {
            return self
                .forward_topic_change(super::forwarded::TopicChange::Move {
                    topic: topic.to_string(),
                    partition,
                    target,
                })
                .await;
        }
        self.move_replicas_here(topic, partition, target).await
    }

    /// [`Self::move_replicas`] on the controller.
    pub(super) async fn move_replicas_here(
        &self,
        topic: &str,
        partition: i32,
        target: Vec<i32>,
    ) -> Result<(), ClusterError> {
        let _one_at_a_time = self.controller_lock.lock().await;
        if !self.metadata.is_leader() {
            return Err(ClusterError::NotController(self.controller()));
        }
        let state = self.metadata_table.state();
        let group = self.group_of(&state, topic, partition)?;
        self.check_target(&target)?;
        if state.moves.contains_key(&group) {
            return Err(ClusterError::MoveInProgress(format!(
                "{topic}/{partition} is already being moved"
            )));
        }
        if self.current_replicas(&state, &group).as_deref() == Some(target.as_slice()) {
            return Ok(());
        }
        self.propose(&Command::StartMove { group, target }).await
    }

    /// Calls off the move of `topic`'s partition `partition` under way: its replicas go back
    /// to those it had before (AlterPartitionReassignments with no replicas). Forwarded to the
    /// controller from any other broker.
    pub async fn cancel_move(&self, topic: &str, partition: i32) -> Result<(), ClusterError> {
        if !self.metadata.is_leader() {
            return self
                .forward_topic_change(super::forwarded::TopicChange::CancelMove {
                    topic: topic.to_string(),
                    partition,
                })
                .await;
        }
        self.cancel_move_here(topic, partition).await
    }

    /// [`Self::cancel_move`] on the controller.
    pub(super) async fn cancel_move_here(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<(), ClusterError> {
        let _one_at_a_time = self.controller_lock.lock().await;
        if !self.metadata.is_leader() {
            return Err(ClusterError::NotController(self.controller()));
        }
        let state = self.metadata_table.state();
        let group = self.group_of(&state, topic, partition)?;
        let Some(target) = state.moves.get(&group) else {
            return Err(ClusterError::NoMoveInProgress(format!(
                "{topic}/{partition} is not being moved"
            )));
        };
        if super::is_internal_group(&group) {
            // Their voters before the move are not in the table (a founder's are in its config).
            return Err(ClusterError::InvalidRequest(format!(
                "a move of {topic} cannot be cancelled; move it again once it has ended"
            )));
        }
        let original = self.current_replicas(&state, &group).unwrap_or_default();
        if let Some(b) = original.iter().find(|b| state.leaving.contains(b)) {
            return Err(ClusterError::InvalidRequest(format!(
                "{topic}/{partition} is moving off broker {b}, which is being decommissioned; \
                 cancelling would only start the move again"
            )));
        }
        if *target == original {
            // Cancelled already; the move back is under way.
            return Ok(());
        }
        self.propose(&Command::CancelMove { group }).await
    }

    /// A target names 1 to [`TARGET_REPLICAS_MAX`] distinct brokers that may take replicas.
    fn check_target(&self, target: &[i32]) -> Result<(), ClusterError> {
        if target.is_empty() || target.len() > TARGET_REPLICAS_MAX {
            return Err(ClusterError::InvalidReplicaAssignment(format!(
                "a partition needs 1 to {TARGET_REPLICAS_MAX} replicas, not {}",
                target.len()
            )));
        }
        let distinct: BTreeSet<i32> = target.iter().copied().collect();
        if distinct.len() != target.len() {
            return Err(ClusterError::InvalidReplicaAssignment(format!(
                "replicas {target:?} name a broker twice"
            )));
        }
        let assignable = self.assignable_brokers();
        if let Some(b) = target.iter().find(|b| !assignable.contains(b)) {
            return Err(ClusterError::InvalidReplicaAssignment(format!(
                "broker {b} cannot take replicas (not a member, or leaving); the brokers that can: {assignable:?}"
            )));
        }
        Ok(())
    }

    /// Starts decommissioning broker `node` (UnregisterBroker): forwarded to the controller
    /// from any other broker. Returns once the decision is committed; the moves follow.
    pub async fn decommission(&self, node: i32) -> Result<(), ClusterError> {
        if !self.metadata.is_leader() {
            return self
                .forward_topic_change(super::forwarded::TopicChange::Decommission { node })
                .await;
        }
        self.decommission_here(node).await
    }

    /// [`Self::decommission`] on the controller.
    pub(super) async fn decommission_here(&self, node: i32) -> Result<(), ClusterError> {
        let _one_at_a_time = self.controller_lock.lock().await;
        if !self.metadata.is_leader() {
            return Err(ClusterError::NotController(self.controller()));
        }
        let state = self.metadata_table.state();
        if state.removed.contains(&node) || state.leaving.contains(&node) {
            return Ok(());
        }
        if !self.brokers().iter().any(|b| b.id == node) {
            return Err(ClusterError::UnknownBroker(format!(
                "broker {node} is not a member of this cluster"
            )));
        }
        if self.assignable_brokers().len() < 2 {
            return Err(ClusterError::InvalidRequest(format!(
                "broker {node} is the cluster's last broker"
            )));
        }
        self.propose(&Command::Decommission { node }).await
    }

    /// This broker's replica of `topic`'s partition `partition`, internal topics included.
    pub fn replica_of(&self, topic: &str, partition: i32) -> Option<Arc<Replica>> {
        match topic {
            METADATA_TOPIC if partition == 0 => Some(self.metadata.clone()),
            OFFSETS_TOPIC if partition == 0 => Some(self.offsets.clone()),
            _ => {
                let t = self.topic(topic)?;
                self.partition(&t, partition)
            }
        }
    }

    /// Every move under way.
    pub fn moves_under_way(&self) -> Vec<MoveStatus> {
        let state = self.metadata_table.state();
        let mut out = Vec::new();
        for (group, target) in &state.moves {
            let (topic, partition) = match group.as_str() {
                METADATA_GROUP => (METADATA_TOPIC.to_string(), 0),
                OFFSETS_GROUP => (OFFSETS_TOPIC.to_string(), 0),
                _ => match state
                    .topics
                    .iter()
                    .find_map(|(name, t)| Some((name.clone(), partition_of(group, t.id)?)))
                {
                    Some((name, p)) => (name, i32::try_from(p).unwrap_or(i32::MAX)),
                    None => continue,
                },
            };
            let replicas = self.current_replicas(&state, group).unwrap_or_default();
            out.push(MoveStatus {
                topic,
                partition,
                replicas,
                target: target.clone(),
                cancelled: state.cancelled.get(group).cloned().unwrap_or_default(),
            });
        }
        out
    }

    /// Controller: starts moves off the brokers leaving, and removes a leaving broker that
    /// holds nothing any more.
    async fn plan(&self) {
        let _one_at_a_time = self.controller_lock.lock().await;
        if !self.metadata.is_leader() {
            return;
        }
        let state = self.metadata_table.state();
        if state.leaving.is_empty() {
            return;
        }
        let assignable = self.assignable_brokers();
        let mut groups: Vec<(String, Vec<i32>)> = Vec::new();
        for g in [METADATA_GROUP, OFFSETS_GROUP] {
            if let Some(current) = self.current_replicas(&state, g) {
                groups.push((g.to_string(), current));
            }
        }
        let mut load: BTreeMap<i32, usize> = assignable.iter().map(|b| (*b, 0)).collect();
        for t in state.topics.values() {
            for (index, replicas) in t.assignments.iter().enumerate() {
                for b in replicas {
                    *load.entry(*b).or_default() += 1;
                }
                let index = i32::try_from(index).unwrap_or(i32::MAX);
                groups.push((partition_group(t.id, index), replicas.clone()));
            }
        }
        for target in state.moves.values() {
            for b in target {
                *load.entry(*b).or_default() += 1;
            }
        }
        let mut in_flight = state.moves.len();
        let mut commands = Vec::new();
        for &leaving in &state.leaving {
            let mut holds = state.moves.values().any(|t| t.contains(&leaving));
            for (group, current) in &groups {
                if !current.contains(&leaving) {
                    continue;
                }
                holds = true;
                if state.moves.contains_key(group) || in_flight >= MOVES_IN_FLIGHT_MAX {
                    continue;
                }
                let Some(&to) = assignable
                    .iter()
                    .filter(|b| !current.contains(b))
                    .min_by_key(|b| (load.get(b).copied().unwrap_or(0), **b))
                else {
                    tracing::warn!(%group, leaving, "no broker can take this replica; add a broker to finish the decommission");
                    continue;
                };
                *load.entry(to).or_default() += 1;
                in_flight += 1;
                let target = current
                    .iter()
                    .map(|&b| if b == leaving { to } else { b })
                    .collect();
                commands.push(Command::StartMove {
                    group: group.clone(),
                    target,
                });
            }
            if !holds {
                commands.push(Command::RemoveBroker { node: leaving });
            }
        }
        for command in commands {
            if let Err(e) = self.propose(&command).await {
                tracing::info!(?command, error = %e, "planning a move failed; will retry");
                return;
            }
        }
    }

    /// Ends a move whose target is committed: written by the controller, forwarded to it
    /// from anywhere else.
    async fn finish_move(&self, group: &str, target: &[i32]) -> Result<(), String> {
        let command = Command::FinishMove {
            group: group.to_string(),
            replicas: target.to_vec(),
        };
        if self.metadata.is_leader() {
            return self.propose(&command).await.map_err(|e| e.to_string());
        }
        let payload = serde_json::to_vec(&command).map_err(|e| e.to_string())?;
        self.forward_to(
            self.controller(),
            METADATA_GROUP,
            Bytes::from(payload),
            FINISH_WAIT,
        )
        .await
        .map(|_| ())
    }

    /// Whether a forwarded `FinishMove` ends the move under way as asked.
    pub(super) fn finish_allowed(&self, command: &Command) -> Result<(), String> {
        let Command::FinishMove { group, replicas } = command else {
            return Err("not a FinishMove".into());
        };
        match self.metadata_table.move_target(group) {
            Some(target) if target == *replicas => Ok(()),
            Some(target) => Err(format!(
                "the move of {group} is to {target:?}, not {replicas:?}"
            )),
            // Finished already (a retry): proposing it again changes nothing.
            None => Ok(()),
        }
    }
}

/// The voters of `replica`'s group, as its membership says.
fn voters(replica: &Replica) -> BTreeSet<i32> {
    let m = replica.partition.raft().metrics();
    let m = m.borrow();
    m.membership_config
        .membership()
        .voter_ids()
        .filter_map(|n| i32::try_from(n).ok())
        .collect()
}

/// Runs on every broker: drives the moves of the groups it leads and, as controller, plans
/// the moves of brokers leaving.
pub(super) async fn run(cluster: Arc<Cluster>) {
    let mut changes = cluster.metadata_table.subscribe();
    loop {
        tokio::time::sleep(MOVE_POLL).await;
        let (moves, leaving) = {
            let state = changes.borrow_and_update();
            (state.moves.clone(), !state.leaving.is_empty())
        };
        for (group, target) in moves {
            let Some(replica) = cluster.replica(&group) else {
                continue;
            };
            if !replica.is_leader() {
                continue;
            }
            {
                let mut moving = cluster.moving.lock().unwrap_or_else(|e| e.into_inner());
                if moving.len() >= DRIVERS_MAX || !moving.insert(group.clone()) {
                    continue;
                }
            }
            let cluster = cluster.clone();
            tokio::spawn(async move {
                if let Err(e) = drive(&cluster, &replica, &target).await {
                    tracing::info!(%group, error = %e, "a move step failed; will retry");
                }
                cluster
                    .moving
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&group);
            });
        }
        if leaving && cluster.metadata.is_leader() {
            cluster.plan().await;
        }
    }
}

/// Carries out one move as the group's leader (see the module docs): each step is skipped if
/// the group's committed membership shows it done.
async fn drive(cluster: &Cluster, replica: &Replica, target: &[i32]) -> Result<(), String> {
    let group = &replica.group;
    let raft = replica.partition.raft().clone();
    let want: BTreeSet<kiln_raft::NodeId> =
        target.iter().filter_map(|b| replica::node(*b)).collect();
    let (voters, nodes, joint) = {
        let m = raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        (
            membership.voter_ids().collect::<BTreeSet<_>>(),
            membership.nodes().map(|(n, _)| *n).collect::<BTreeSet<_>>(),
            membership.get_joint_config().len() > 1,
        )
    };
    if voters != want || joint {
        for &node in want.difference(&voters) {
            if !nodes.contains(&node) {
                tracing::info!(%group, node, "move: adding a learner");
                tokio::time::timeout(
                    STEP_WAIT,
                    raft.add_learner(node, openraft::EmptyNode {}, false),
                )
                .await
                .map_err(|_| format!("adding learner {node} timed out"))?
                .map_err(|e| format!("adding learner {node}: {e}"))?;
            }
            wait_caught_up(cluster, replica, node, target).await?;
        }
        tracing::info!(%group, voters = ?want, "move: changing the voters");
        tokio::time::timeout(STEP_WAIT, raft.change_membership(want.clone(), false))
            .await
            .map_err(|_| "changing the voters timed out".to_string())?
            .map_err(|e| format!("changing the voters: {e}"))?;
    }
    // Learners that are not in the target: a cancelled move's.
    let learners: BTreeSet<kiln_raft::NodeId> = {
        let m = raft.metrics();
        let m = m.borrow();
        m.membership_config
            .membership()
            .learner_ids()
            .filter(|n| !want.contains(n))
            .collect()
    };
    if !learners.is_empty() {
        tracing::info!(%group, ?learners, "move: removing learners");
        tokio::time::timeout(
            STEP_WAIT,
            raft.change_membership(openraft::ChangeMembers::RemoveNodes(learners), false),
        )
        .await
        .map_err(|_| "removing learners timed out".to_string())?
        .map_err(|e| format!("removing learners: {e}"))?;
    }
    cluster.finish_move(group, target).await?;
    tracing::info!(%group, replicas = ?target, "move: done");
    Ok(())
}

/// Waits until learner `node` holds the log of `replica`'s group (all but at most
/// [`LEARNER_LAG_ENTRIES_MAX`] entries, so a leader that keeps writing does not hold it off),
/// logging progress every [`PROGRESS_EVERY`]. Gives up when the move's target is no longer
/// `target` (cancelled), when this replica stops leading, or after [`STEP_WAIT`]. A learner
/// added by a broker's joining (`membership.rs`) is waited for the same way: only a learner
/// that holds the log may become a voter.
async fn wait_caught_up(
    cluster: &Cluster,
    replica: &Replica,
    node: kiln_raft::NodeId,
    target: &[i32],
) -> Result<(), String> {
    let group = &replica.group;
    let started = tokio::time::Instant::now();
    let mut logged = started;
    loop {
        let (leading, matched, last) = {
            let m = replica.partition.raft().metrics();
            let m = m.borrow();
            let matched = m
                .replication
                .as_ref()
                .and_then(|r| r.get(&node).copied().flatten())
                .map(|l| l.index);
            (m.replication.is_some(), matched, m.last_log_index)
        };
        if !leading {
            return Err(format!("no longer leads while learner {node} catches up"));
        }
        let caught_up = match last {
            None => true,
            Some(last) => {
                matched.is_some_and(|m| m.saturating_add(LEARNER_LAG_ENTRIES_MAX) >= last)
            }
        };
        if caught_up {
            tracing::info!(%group, node, elapsed = ?started.elapsed(), "move: learner caught up");
            return Ok(());
        }
        let asked = cluster.metadata_table.move_target(group);
        if asked.as_deref() != Some(target) {
            // Cancelled (a learner that cannot catch up is the usual reason): the next
            // round drives the group to the new target.
            return Err(format!("the move to {target:?} was cancelled"));
        }
        if started.elapsed() > STEP_WAIT {
            return Err(format!(
                "learner {node} did not catch up within {STEP_WAIT:?}"
            ));
        }
        if logged.elapsed() >= PROGRESS_EVERY {
            logged = tokio::time::Instant::now();
            tracing::info!(%group, node, ?matched, ?last, "move: learner catching up");
        }
        tokio::time::sleep(LEARNER_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_map_back_to_partitions() {
        let id = Uuid::new_v4();
        assert_eq!(partition_of(&partition_group(id, 7), id), Some(7));
        assert_eq!(partition_of(&partition_group(id, 7), Uuid::new_v4()), None);
        assert_eq!(partition_of(METADATA_GROUP, id), None);
        let record = TopicRecord {
            id,
            overrides: BTreeMap::new(),
            assignments: vec![vec![1, 2, 3]; 12],
            moved: BTreeSet::new(),
        };
        let moves = BTreeMap::from([
            (partition_group(id, 2), vec![1, 2, 4]),
            (partition_group(id, 11), vec![4, 2, 3]),
            (partition_group(Uuid::new_v4(), 2), vec![9]),
            (OFFSETS_GROUP.to_string(), vec![1, 2, 4]),
        ]);
        assert_eq!(
            of_topic(&record, &moves),
            BTreeMap::from([(2, vec![1, 2, 4]), (11, vec![4, 2, 3])])
        );
        let status = MoveStatus {
            topic: "t".into(),
            partition: 2,
            replicas: vec![3, 1, 2],
            target: vec![4, 1, 2],
            cancelled: Vec::new(),
        };
        assert_eq!(status.adding(), vec![4]);
        assert_eq!(status.removing(), vec![3]);
        // Cancelled: back to the replicas it had, the abandoned target's new broker leaving.
        let back = MoveStatus {
            topic: "t".into(),
            partition: 2,
            replicas: vec![3, 1, 2],
            target: vec![3, 1, 2],
            cancelled: vec![4, 1, 2],
        };
        assert_eq!(back.adding(), Vec::<i32>::new());
        assert_eq!(back.removing(), vec![4]);
    }
}
