//! The repair guard: a replica whose files lost data it may have acknowledged (or the record
//! of a vote it may have cast) neither grants votes nor stands for election until a leader has
//! made it whole again. Otherwise it could help elect a leader that lacks an acknowledged
//! record, or vote twice in one term. docs/replication.md, "Damage and full disks".
//!
//! Enforced in four places, so that no transport can skip it:
//! * openraft's election timer is off while the guard holds (`Config::enable_elect`), and so
//!   is standing in the broker's pulse (`Liveness::set_may_stand`);
//! * [`GuardedNetwork`] wraps whatever network the replica is started with and refuses to
//!   send its vote requests;
//! * the receiving side of each transport asks [`ReplicaHealth::repairing`] before handing a
//!   vote request to openraft (`net::serve` through `RaftGroups::health`, the simulation's
//!   router directly), and answers with an error instead;
//! * the log store hands openraft its vote uncommitted while the guard is set, so that a
//!   damaged replica that led before is not restored as leader without an election.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{Backoff, RPCOption};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{EmptyNode, RaftMetrics, RaftNetwork, RaftNetworkFactory};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::liveness::Liveness;
use crate::log_store::LogStore;
use crate::types::{KilnRaft, NodeId, Raft};

/// What a replica must see before it takes part in elections again. Persisted in the `vote`
/// file with every save, so a restart mid-repair keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Guard {
    /// The log lost entries up to this Raft index (the highest the damaged file held): hold
    /// until this replica has applied it, that is, until its log again holds every committed
    /// entry it may have acknowledged ...
    pub repair_until: Option<u64>,
    /// ... or until it has applied an entry of a term above this one (the highest term its
    /// vote or its log had reached when the damage was found). It acknowledged entries only in
    /// terms up to this; a leader of a later term was elected by a majority that excludes this
    /// replica, so it holds every entry committed with this replica's help, and applying one of
    /// its entries means holding its log up to there. Lifts the guard when the entries up to
    /// `repair_until` were never committed and the partition is idle. `None`: unknown (the
    /// vote record was damaged too), only `repair_until` counts.
    pub repair_term: Option<u64>,
    /// The latest vote record was lost, and with it possibly a vote cast in a term at least
    /// this (the highest term any surviving record names): hold until this replica has
    /// followed a leader of such a term since it started.
    pub vote_floor: Option<u64>,
}

impl Guard {
    /// Repair of a log that held entries up to `until`, in terms up to `term` (if known).
    pub fn repair(until: u64, term: Option<u64>) -> Guard {
        Guard {
            repair_until: Some(until),
            repair_term: term,
            vote_floor: None,
        }
    }

    /// `repair_until` when the index the damaged log reached is unknown (the save that held the
    /// guard is lost): only the term rule can lift the guard.
    pub const INDEX_UNKNOWN: u64 = u64::MAX;

    /// Repair after the latest save of the `vote` file was lost: the repair guard it may have
    /// held is unknown, with the index its log had reached. Hold until this replica has applied
    /// an entry of a term above `term`, the highest term of its surviving records and of its
    /// log: it acknowledged entries only in terms it had saved a vote for and that its log
    /// shows, and a leader of a later term was elected while this replica granted no vote, so
    /// holds everything committed with its help.
    pub fn repair_unknown(term: u64) -> Guard {
        Guard {
            repair_until: Some(Self::INDEX_UNKNOWN),
            repair_term: Some(term),
            vote_floor: None,
        }
    }

    /// The guard after a lost vote record whose surviving records reach term `floor`.
    pub fn vote_floor(floor: u64) -> Guard {
        Guard {
            vote_floor: Some(floor),
            ..Guard::default()
        }
    }

    pub fn is_clear(&self) -> bool {
        self.repair_until.is_none() && self.vote_floor.is_none()
    }

    /// The stricter of two guards: the higher targets; a term rule only if both know it.
    pub fn merge(self, other: Guard) -> Guard {
        let repair_term = match (self.repair_until, other.repair_until) {
            (Some(_), Some(_)) => self
                .repair_term
                .zip(other.repair_term)
                .map(|(a, b)| a.max(b)),
            (Some(_), None) => self.repair_term,
            (None, _) => other.repair_term,
        };
        Guard {
            repair_until: self.repair_until.max(other.repair_until),
            repair_term,
            vote_floor: self.vote_floor.max(other.vote_floor),
        }
    }

    /// True once `m` shows the conditions met. `last_applied` is empty after every start until
    /// a leader's commit index reaches this replica (the applied state is not persisted), so
    /// "applied something" means "followed a leader since starting".
    pub fn met_by(&self, m: &RaftMetrics<NodeId, EmptyNode>) -> bool {
        let applied = m.last_applied;
        let repaired = self.repair_until.is_none_or(|h| {
            applied.is_some_and(|a| {
                a.index >= h || self.repair_term.is_some_and(|t| a.leader_id.term > t)
            })
        });
        let vote_known = self.vote_floor.is_none_or(|floor| {
            applied.is_some() && m.vote.is_committed() && m.vote.leader_id.term >= floor
        });
        repaired && vote_known
    }
}

#[derive(Default)]
struct HealthInner {
    guard: Mutex<Guard>,
    /// Off only in the simulation's demonstration that the guard matters.
    unenforced: AtomicBool,
    metrics: OnceLock<watch::Receiver<RaftMetrics<NodeId, EmptyNode>>>,
    /// Writes waiting for disk space now.
    full_waits: AtomicUsize,
    /// Writes to the log or the vote file under way (written and not yet synced): how many
    /// began at each instant. Under load a replica's writes overlap (the next is written while
    /// the previous is fsynced), so the oldest is tracked, not the start of the busy spell. At
    /// most one per append queued for a flush (`log_store::flush::FLUSHES_PENDING_MAX`) and
    /// the vote file's one save.
    writes: Mutex<BTreeMap<Instant, usize>>,
}

/// One replica's health as its transport and its broker see it: the repair guard and whether
/// a write is waiting for disk space. Cheap to clone.
#[derive(Clone, Default)]
pub struct ReplicaHealth {
    inner: Arc<HealthInner>,
}

impl ReplicaHealth {
    /// True while the replica must neither grant votes nor stand for election (see the
    /// module docs): a guard is set and the Raft metrics do not yet show it met.
    pub fn repairing(&self) -> bool {
        if self.inner.unenforced.load(Ordering::Relaxed) {
            return false;
        }
        let guard = self.guard();
        if guard.is_clear() {
            return false;
        }
        match self.inner.metrics.get() {
            Some(m) => !guard.met_by(&m.borrow()),
            None => true,
        }
    }

    /// True while a write to this replica's files is waiting for disk space.
    pub fn disk_full(&self) -> bool {
        self.inner.full_waits.load(Ordering::Relaxed) > 0
    }

    /// The guard as persisted now (cleared only once it was met).
    pub fn guard(&self) -> Guard {
        *self.inner.guard.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_guard(&self, guard: Guard) {
        *self.inner.guard.lock().unwrap_or_else(|p| p.into_inner()) = guard;
    }

    pub(crate) fn set_enforced(&self, enforced: bool) {
        self.inner.unenforced.store(!enforced, Ordering::Relaxed);
    }

    pub(crate) fn attach(&self, metrics: watch::Receiver<RaftMetrics<NodeId, EmptyNode>>) {
        let _ = self.inner.metrics.set(metrics);
    }

    /// When the oldest write under way began, if one is: a leader whose write has not come
    /// back for long has a Raft core stuck in it, which sends nothing, and must not be kept
    /// alive by the broker's pulse either (`pulse.rs`).
    pub fn writing_since(&self) -> Option<Instant> {
        self.inner
            .writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .next()
            .copied()
    }

    /// Marks a write (and its sync) under way until the mark is dropped.
    pub(crate) fn writing(&self) -> WriteMark {
        let began = Instant::now();
        let mut w = self.inner.writes.lock().unwrap_or_else(|p| p.into_inner());
        *w.entry(began).or_insert(0) += 1;
        WriteMark {
            health: self.clone(),
            began,
        }
    }

    pub(crate) fn full_wait_began(&self) {
        self.inner.full_waits.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn full_wait_ended(&self) {
        self.inner.full_waits.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A write under way ([`ReplicaHealth::writing`]) until dropped.
pub(crate) struct WriteMark {
    health: ReplicaHealth,
    began: Instant,
}

impl Drop for WriteMark {
    fn drop(&mut self) {
        let mut w = self
            .health
            .inner
            .writes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let Some(n) = w.get_mut(&self.began) else {
            panic!("a write mark dropped twice");
        };
        *n -= 1;
        if *n == 0 {
            w.remove(&self.began);
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("this replica is repairing damaged files: it stands for no election")]
struct Repairing;

/// Wraps a replica's network: it sends no vote request while the replica is repairing, and
/// records every acknowledgement a peer sends back in the replica's [`Liveness`] (the
/// leader's lease is counted from them: `liveness.rs`).
pub struct GuardedNetwork<N> {
    pub(crate) inner: N,
    pub(crate) health: ReplicaHealth,
    pub(crate) liveness: Arc<Liveness>,
}

/// One link of a [`GuardedNetwork`].
pub struct GuardedLink<L> {
    inner: L,
    target: NodeId,
    health: ReplicaHealth,
    liveness: Arc<Liveness>,
}

impl<N: RaftNetworkFactory<KilnRaft>> RaftNetworkFactory<KilnRaft> for GuardedNetwork<N> {
    type Network = GuardedLink<N::Network>;

    async fn new_client(&mut self, target: NodeId, node: &EmptyNode) -> Self::Network {
        GuardedLink {
            inner: self.inner.new_client(target, node).await,
            target,
            health: self.health.clone(),
            liveness: self.liveness.clone(),
        }
    }
}

impl<L: RaftNetwork<KilnRaft>> RaftNetwork<KilnRaft> for GuardedLink<L> {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<KilnRaft>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId>>> {
        let (sent, term) = (Instant::now(), rpc.vote.leader_id.term);
        let answer = self.inner.append_entries(rpc, option).await;
        // Anything but a higher vote means the peer took this replica as its leader.
        if matches!(&answer, Ok(a) if !matches!(a, AppendEntriesResponse::HigherVote(_))) {
            self.liveness.acked(term, self.target, sent);
        }
        answer
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<KilnRaft>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, EmptyNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.inner.install_snapshot(rpc, option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId>>> {
        if self.health.repairing() {
            return Err(RPCError::Unreachable(Unreachable::new(&Repairing)));
        }
        let (sent, term, last) = (Instant::now(), rpc.vote.leader_id.term, rpc.last_log_id);
        let answer = self.inner.vote(rpc, option).await;
        if let Ok(a) = &answer {
            // A voter refuses every other candidate for its vote lease after granting: that
            // counts toward the lease of the term it voted in.
            if a.vote_granted {
                self.liveness.acked(term, self.target, sent);
            }
            if a.last_log_id > last {
                self.liveness.saw_greater_log();
            }
        }
        answer
    }

    fn backoff(&self) -> Backoff {
        self.inner.backoff()
    }
}

/// Waits until the guard is met, then makes that durable. False if the Raft node stopped
/// first, or the record could not be written (the guard then stays, which is safe).
pub(crate) async fn lift_when_met(raft: &Raft, log: &LogStore) -> bool {
    let guard = log.health().guard();
    let mut metrics = raft.metrics();
    loop {
        if guard.met_by(&metrics.borrow_and_update()) {
            break;
        }
        if metrics.changed().await.is_err() {
            return false;
        }
    }
    let applied = metrics.borrow().last_applied.map(|l| l.index);
    if let Err(e) = log.lift_guard().await {
        tracing::error!(error = %e, ?guard, "could not record the end of a repair");
        return false;
    }
    tracing::info!(
        ?guard,
        ?applied,
        "repair complete: the log holds everything it held before the damage; voting again"
    );
    true
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;
    use crate::types::Vote;

    /// Overlapping writes (the next written while the previous is fsynced): the oldest one
    /// still under way is what `writing_since` reports, not the start of the busy spell, so a
    /// leader under steady load is never taken for one stuck in a write.
    #[tokio::test(start_paused = true)]
    async fn writing_since_is_the_oldest_write_still_under_way() {
        let health = ReplicaHealth::default();
        assert_eq!(health.writing_since(), None);
        let t0 = Instant::now();
        let first = health.writing();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let second = health.writing();
        let also_second = health.writing();
        assert_eq!(health.writing_since(), Some(t0));
        drop(first);
        let t1 = t0 + Duration::from_millis(10);
        assert_eq!(health.writing_since(), Some(t1));
        tokio::time::sleep(Duration::from_millis(10)).await;
        let third = health.writing();
        drop(second);
        assert_eq!(
            health.writing_since(),
            Some(t1),
            "one write of t1 is still under way"
        );
        drop(also_second);
        assert_eq!(health.writing_since(), Some(t1 + Duration::from_millis(10)));
        drop(third);
        assert_eq!(health.writing_since(), None);
    }

    /// A link that answers every vote with a grant and counts what it was asked.
    #[derive(Clone, Default)]
    struct Counting(Arc<AtomicUsize>);

    impl RaftNetwork<KilnRaft> for Counting {
        async fn append_entries(
            &mut self,
            _rpc: AppendEntriesRequest<KilnRaft>,
            _option: RPCOption,
        ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId>>>
        {
            Ok(AppendEntriesResponse::Success)
        }

        async fn install_snapshot(
            &mut self,
            _rpc: InstallSnapshotRequest<KilnRaft>,
            _option: RPCOption,
        ) -> Result<
            InstallSnapshotResponse<NodeId>,
            RPCError<NodeId, EmptyNode, RaftError<NodeId, InstallSnapshotError>>,
        > {
            Err(RPCError::Unreachable(Unreachable::new(&Repairing)))
        }

        async fn vote(
            &mut self,
            rpc: VoteRequest<NodeId>,
            _option: RPCOption,
        ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId>>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(VoteResponse::new(rpc.vote, None, true))
        }
    }

    impl RaftNetworkFactory<KilnRaft> for Counting {
        type Network = Counting;
        async fn new_client(&mut self, _target: NodeId, _node: &EmptyNode) -> Counting {
            self.clone()
        }
    }

    #[tokio::test]
    async fn a_repairing_replica_sends_no_vote_request_on_any_network() {
        let inner = Counting::default();
        let health = ReplicaHealth::default();
        health.set_guard(Guard::repair(10, Some(2)));
        let liveness = Arc::new(Liveness::new(
            1,
            crate::liveness::Timings::from_ms(100, 300, 600).unwrap(),
            0,
        ));
        let mut network = GuardedNetwork {
            inner: inner.clone(),
            health: health.clone(),
            liveness: liveness.clone(),
        };
        let mut link = network.new_client(2, &EmptyNode {}).await;
        let ask = || VoteRequest::new(Vote::new(3, 1), None);
        let option = || RPCOption::new(Duration::from_secs(1));
        assert!(matches!(
            link.vote(ask(), option()).await,
            Err(RPCError::Unreachable(_))
        ));
        assert_eq!(
            inner.0.load(Ordering::SeqCst),
            0,
            "nothing reached the network"
        );
        // Appends still flow: a repairing replica that somehow led could step down cleanly.
        let append = AppendEntriesRequest {
            vote: Vote::new_committed(3, 1),
            prev_log_id: None,
            leader_commit: None,
            entries: vec![],
        };
        assert!(link.append_entries(append, option()).await.is_ok());
        assert!(
            liveness.acked_at(3, 2).is_some(),
            "an answered append counts toward the lease"
        );
        assert_eq!(liveness.acked_at(4, 2), None);
        // The guard met (here: cleared), votes go through; unenforced, they always do.
        health.set_guard(Guard::default());
        assert!(link.vote(ask(), option()).await.is_ok());
        health.set_guard(Guard::vote_floor(3));
        health.set_enforced(false);
        assert!(!health.repairing());
        assert!(link.vote(ask(), option()).await.is_ok());
        assert_eq!(inner.0.load(Ordering::SeqCst), 2);
        let granted = liveness.acked_at(3, 2);
        assert!(granted.is_some(), "a granted vote counts toward the lease");
    }
}
