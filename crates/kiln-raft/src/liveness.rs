//! Liveness per replica: when it last heard from its leader, when its followers last
//! acknowledged it, and what follows: the leader's lease, the votes it must refuse, when it
//! stands for election.
//!
//! openraft keeps these facts inside its core and acts on them on a timer of its own per
//! group: a heartbeat to every follower each interval, an election check each tick. A broker
//! with thousands of groups would spend its CPU on those timers while nothing happens. So
//! Kiln keeps the facts here, written by the transport as messages arrive and leave, and one
//! task per broker (`pulse.rs`) acts on them for all its replicas at once. This module is the
//! one source of truth for them; `pulse.rs` and the transports only record and read.
//!
//! **Follower side.** `heard` is the (term, leader, arrival time) of the last message from a
//! leader this replica accepted: an AppendEntries it answered without a higher vote, a vote
//! it granted, or a beat (`pulse.rs`) naming the term and leader of its own committed vote.
//! While `heard` is younger than [`Timings::vote_lease`] the replica grants no vote to any
//! other candidate ([`Liveness::refuses_vote`]): a leader can count every acknowledgement as a
//! promise that no successor is elected within that time. openraft keeps the same rule for
//! the messages it sees; this one also covers beats, which openraft never sees.
//!
//! **Leader side.** `acks` holds, for one term, the send time of the latest message each
//! peer acknowledged (an AppendEntries answered without a higher vote, a vote granted, a beat
//! accepted). The lease holds ([`Liveness::lease_holds`]) while a quorum of the voters, this
//! replica counted, acknowledged something sent at most [`Timings::lease`] ago. Every time
//! is this replica's own clock reading, taken when it sent, so nothing depends on when
//! openraft last ran. Why the lease is early enough: a peer that acknowledged a message sent
//! at `s` received it at some `r >= s` and refuses other candidates until `r +
//! vote_lease`; the lease ends at `s + lease`, `lease < vote_lease` earlier, which leaves
//! room for clocks that run at slightly different rates.
//!
//! **Elections** ([`Liveness::election_due`]), openraft's own rules on this clock: a replica
//! stands once an election timeout drawn from `[election_min, election_max)` passed since it
//! last heard from a leader or candidate (or last stood), plus `vote_lease` when its vote is
//! committed (it followed an elected leader), plus twice `election_max` when a voter told it
//! of a longer log than its own at its last try and it has heard from no leader or candidate
//! since (let the replica with the longest log stand first: only it can win). The draw is
//! taken again after every try. Candidates (and followers of no elected leader) take turns a
//! range apart, in an order of the group and term every voter derives alike (the preferred
//! replica first in a group that never had a leader), so that after a split vote one asks
//! before the others stand. When an elected leader goes quiet, its followers stand once
//! their vote lease and a beat round (1.5 heartbeats) have passed since they last heard it:
//! by then every follower's vote lease has passed, since they heard the leader last at most
//! a round apart. Their times fall in slices of the range after that, one per follower, in an
//! order every replica of the group derives alike from the group's name (`stagger`) and the
//! leader's term: a dead broker's thousand groups then elect with hardly a split vote, and
//! their new leaders spread over the survivors. With the defaults a dead leader's first
//! follower stands 750-900 ms after it last heard it.
//!
//! **Handing over** ([`Liveness::hand_over`]). A leader hands its group to another voter (the
//! preferred replica, when leadership is rebalanced) without an election timeout's worth of
//! refusals on top: it stops taking new writes at once (`yielding`: clients are told there is
//! no leader), beats on until the successor reports holding and having applied its whole log
//! (so every write it took commits and is answered), then falls silent. The successor stands
//! first once the vote lease has passed, because a group's preferred replica heads the order
//! its followers stand in (`preferred`), and being caught up, wins. A handover that has not
//! ended in another leader within [`Timings::handover_max`] is given up and the leader serves
//! again. Its lease lapses meanwhile without counting as a lapse.
//!
//! **Quiet groups.** A leader whose followers that answered its last beat all reported holding
//! and having applied its whole log, as of the log's current end, and are a majority with it,
//! needs to send them nothing but the beat: the `quiet` mark says so until the log moves or a
//! follower reports otherwise (`pulse.rs`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand08::Rng;
use tokio::time::Instant;

use crate::types::{LogId, NodeId, ThreadRng};

/// The timings liveness is judged by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// How often a leader makes itself heard (a beat or a heartbeat to every follower).
    pub heartbeat: Duration,
    /// A follower stands after `vote_lease` plus a draw from `[election_min, election_max)`.
    pub election_min: Duration,
    pub election_max: Duration,
}

impl Timings {
    /// From milliseconds; an error unless `0 < heartbeat_ms < election_min_ms <
    /// election_max_ms` and the lease (below) is at least a heartbeat.
    pub fn from_ms(
        heartbeat_ms: u64,
        election_min_ms: u64,
        election_max_ms: u64,
    ) -> Result<Timings, String> {
        if heartbeat_ms == 0
            || election_min_ms <= heartbeat_ms
            || election_max_ms <= election_min_ms
        {
            return Err(format!(
                "timings must satisfy 0 < heartbeat ({heartbeat_ms} ms) < election_timeout_min \
                 ({election_min_ms} ms) < election_timeout_max ({election_max_ms} ms)"
            ));
        }
        let t = Timings {
            heartbeat: Duration::from_millis(heartbeat_ms),
            election_min: Duration::from_millis(election_min_ms),
            election_max: Duration::from_millis(election_max_ms),
        };
        if t.vote_lease() < t.margin() + t.heartbeat {
            return Err(format!(
                "election_timeout_max ({election_max_ms} ms) must be at least 2.5 heartbeats \
                 ({} ms): a leader's lease is election_timeout_max less 1.5 heartbeats, and \
                 must outlast a heartbeat",
                heartbeat_ms * 5 / 2
            ));
        }
        Ok(t)
    }

    /// How long a follower refuses other candidates after hearing from its leader (openraft's
    /// follower lease): the longest election timeout.
    pub fn vote_lease(&self) -> Duration {
        self.election_max
    }

    /// How long a leader serves clients after sending a message a quorum acknowledged: the
    /// vote lease less [`Timings::margin`].
    pub fn lease(&self) -> Duration {
        self.vote_lease().saturating_sub(self.margin())
    }

    /// What the lease leaves out of the vote lease: 1.5 heartbeats, for clocks that run at
    /// slightly different rates and a peer's refusal checked a little late.
    fn margin(&self) -> Duration {
        self.heartbeat * 3 / 2
    }

    /// Longest a handover may take before it is given up (see the module docs): the
    /// successor's catching up, the vote lease and its election timeout, four times over.
    pub fn handover_max(&self) -> Duration {
        (self.vote_lease() + self.election_max) * 4
    }
}

/// A leader's handover of its group (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Handover {
    /// The term it leads, in which it hands over.
    term: u64,
    to: NodeId,
    since: Instant,
    /// When the successor reported holding its whole log and the leader fell silent.
    released: Option<Instant>,
}

/// Where a leader's handover stands, as the pulse sees it ([`Check::Lead`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handing {
    /// Beating on until `to` holds and has applied the whole log.
    Draining { to: NodeId },
    /// Silent: its followers' leases run out and `to` stands first.
    Released,
}

/// What openraft last said of a replica's role: kept here so the pulse's checks, thousands a
/// second on a broker of many partitions, read one lock instead of openraft's metrics (whose
/// voter set openraft rebuilds on every read). Updated whenever openraft's server metrics
/// change (`partition.rs`, `follow_role`), which they do only with the vote, the state, the
/// leader or the membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    pub state: openraft::ServerState,
    /// The term of its vote.
    pub term: u64,
    /// Its vote is committed: it follows (or is) an elected leader.
    pub committed: bool,
    pub voters: Arc<[NodeId]>,
    /// While the membership is joint (a move under way: the old voter set and the new one),
    /// each set: a quorum is then a majority of *each*, not of `voters` (their union).
    /// Empty for a single configuration.
    pub joint: Arc<[Arc<[NodeId]>]>,
}

/// The leader and term a follower last heard from, and when the message arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heard {
    pub term: u64,
    pub leader: NodeId,
    pub at: Instant,
}

/// One replica's liveness (see the module docs). Cheap to share: the broker's pulse task and
/// both ends of the transport hold it.
#[derive(Debug)]
pub struct Liveness {
    id: NodeId,
    timings: Timings,
    /// The same on every replica of the group: orders its followers after a leader dies.
    stagger: u64,
    /// The voter clients should find leading (the first of the partition's replicas): it
    /// stands first among its leader's followers when the leader falls silent. Changed when a
    /// move gives the partition another first replica; [`NO_PREFERRED`] for none.
    preferred: std::sync::atomic::AtomicU64,
    state: Mutex<State>,
}

/// [`Liveness::preferred`]'s value for none (node ids come from non-negative broker ids).
const NO_PREFERRED: u64 = u64::MAX;

#[derive(Debug)]
struct State {
    role: Role,
    heard: Option<Heard>,
    /// The term `acks` are of, and per peer the send time of its latest acknowledged message.
    acks_term: u64,
    acks: BTreeMap<NodeId, Instant>,
    /// Leader: every follower held and had applied the log through this entry, in this term.
    quiet: Option<(u64, LogId)>,
    /// Leader: its last log index and applied log id at the last round, in that term.
    last_round: Option<(u64, Option<u64>, Option<LogId>)>,
    /// When the replica started, or last stood for election: the election clock starts there
    /// when nothing was heard since.
    since: Instant,
    /// Where in its election timeout range the next try falls, drawn from `[0, 1)`.
    draw: f64,
    /// Whether it may stand at all (not while repairing: `guard.rs`).
    may_stand: bool,
    /// A voter answered its last try with a longer log than its own, and no leader or
    /// candidate has been heard since (then the news is stale: it kept a preferred replica
    /// from ever standing first once one try of it had seen a longer log).
    greater_log: bool,
    /// Leader: the term in which it last held its lease, for counting lapses.
    held_in: Option<u64>,
    lapses: u64,
    /// Leader: its handover under way, if any.
    handover: Option<Handover>,
}

impl Liveness {
    /// `stagger`: the same number on every replica of the group (a hash of its name), which
    /// orders the followers that stand after their leader dies (see the module docs).
    pub fn new(id: NodeId, timings: Timings, stagger: u64) -> Liveness {
        Liveness {
            id,
            timings,
            stagger,
            preferred: std::sync::atomic::AtomicU64::new(NO_PREFERRED),
            state: Mutex::new(State {
                role: Role {
                    state: openraft::ServerState::Learner,
                    term: 0,
                    committed: false,
                    voters: Arc::from(Vec::new()),
                    joint: Arc::from(Vec::new()),
                },
                heard: None,
                acks_term: 0,
                acks: BTreeMap::new(),
                quiet: None,
                last_round: None,
                since: Instant::now(),
                draw: draw(),
                may_stand: true,
                greater_log: false,
                held_in: None,
                lapses: 0,
                handover: None,
            }),
        }
    }

    /// Names the group's preferred replica (see [`Liveness::hand_over`]).
    pub fn with_preferred(self, preferred: Option<NodeId>) -> Liveness {
        self.set_preferred(preferred);
        self
    }

    /// The group's preferred replica now (a move may change it).
    pub fn set_preferred(&self, preferred: Option<NodeId>) {
        debug_assert_ne!(
            preferred,
            Some(NO_PREFERRED),
            "node id {NO_PREFERRED} is reserved"
        );
        self.preferred.store(
            preferred.unwrap_or(NO_PREFERRED),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    pub fn preferred(&self) -> Option<NodeId> {
        Some(self.preferred.load(std::sync::atomic::Ordering::Relaxed))
            .filter(|&p| p != NO_PREFERRED)
    }

    pub fn timings(&self) -> Timings {
        self.timings
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is a few plain assignments: a panic elsewhere leaves the state whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// openraft's view of this replica's role changed. A handover ends with the term or the
    /// leadership it was made in.
    pub fn set_role(&self, role: Role) {
        let mut s = self.lock();
        if let Some(h) = s.handover {
            if role.state != openraft::ServerState::Leader || role.term != h.term {
                tracing::info!(
                    to = h.to,
                    term = h.term,
                    now_term = role.term,
                    "leadership handed over"
                );
                s.handover = None;
            }
        }
        s.role = role;
    }

    /// Leader of `term` (by its last known role), at `now`: hands its group to voter `to` (see
    /// the module docs). An error says why not: not leading that term, `to` not another
    /// voter, or a handover already under way.
    pub fn hand_over(&self, term: u64, to: NodeId, now: Instant) -> Result<(), String> {
        let mut s = self.lock();
        if s.role.state != openraft::ServerState::Leader || s.role.term != term {
            return Err(format!("node {} does not lead term {term}", self.id));
        }
        if to == self.id || !s.role.voters.contains(&to) {
            return Err(format!(
                "node {to} is not another voter of this group ({:?})",
                s.role.voters
            ));
        }
        if let Some(h) = s.handover {
            return Err(format!(
                "already handing over to node {} since term {}",
                h.to, h.term
            ));
        }
        s.handover = Some(Handover {
            term,
            to,
            since: now,
            released: None,
        });
        Ok(())
    }

    /// Whether this replica, leading `term`, is handing its group over: it takes no new writes
    /// and names no leader to clients.
    pub fn handing_over(&self, term: u64) -> bool {
        self.lock().handover.is_some_and(|h| h.term == term)
    }

    /// The successor `to` of a handover in `term` reported, at `now`, holding and having
    /// applied the whole log: the leader falls silent.
    pub fn successor_caught_up(&self, term: u64, to: NodeId, now: Instant) {
        let mut s = self.lock();
        if let Some(h) = s.handover.as_mut() {
            if h.term == term && h.to == to && h.released.is_none() {
                h.released = Some(now);
            }
        }
    }

    pub fn role(&self) -> Role {
        self.lock().role.clone()
    }

    /// Whether this replica is a voter of its group (not a learner), by its last known role.
    pub fn is_voter(&self) -> bool {
        self.lock().role.voters.contains(&self.id)
    }

    /// A message from `leader` of `term`, which arrived at `at`, was accepted.
    pub fn heard(&self, term: u64, leader: NodeId, at: Instant) {
        let mut s = self.lock();
        match s.heard {
            Some(h) if h.term > term => {}
            Some(h) if h.term == term && h.leader == leader && h.at >= at => {}
            _ => {
                s.heard = Some(Heard { term, leader, at });
                s.greater_log = false;
            }
        }
    }

    /// The last leader heard from, if it was heard within `within` of `now`.
    pub fn heard_within(&self, now: Instant, within: Duration) -> Option<Heard> {
        self.lock()
            .heard
            .filter(|h| now.saturating_duration_since(h.at) <= within)
    }

    /// Why a vote for `candidate` must be refused at `now`, if it must: its leader was heard
    /// within the vote lease, and the candidate is another replica.
    pub fn refuses_vote(&self, candidate: NodeId, now: Instant) -> Option<String> {
        let h = self.heard_within(now, self.timings.vote_lease())?;
        (h.leader != candidate).then(|| {
            format!(
                "node {} heard from its leader {} (term {}) {} ms ago: no vote for node {candidate} \
                 within {} ms of that",
                self.id,
                h.leader,
                h.term,
                now.saturating_duration_since(h.at).as_millis(),
                self.timings.vote_lease().as_millis()
            )
        })
    }

    /// `peer` acknowledged a message this replica sent at `sent` as leader (or candidate) of
    /// `term`.
    pub fn acked(&self, term: u64, peer: NodeId, sent: Instant) {
        let mut s = self.lock();
        if term < s.acks_term {
            return;
        }
        if term > s.acks_term {
            s.acks_term = term;
            s.acks.clear();
        }
        let at = s.acks.entry(peer).or_insert(sent);
        *at = (*at).max(sent);
    }

    /// Whether a leader of `term` whose voters are `voters` holds its lease at `now` (see the
    /// module docs). The caller checks that the replica is Raft leader of `term`.
    pub fn lease_holds(&self, term: u64, voters: &[NodeId], now: Instant) -> bool {
        let s = self.lock();
        lease_holds(&s, self.id, self.timings.lease(), term, voters, now)
    }

    /// [`Liveness::lease_holds`] with the voters of its last known role: the check on every
    /// client request (Metadata, Produce, Fetch), which must not rebuild openraft's voter set.
    pub fn leads(&self, term: u64, now: Instant) -> bool {
        let s = self.lock();
        lease_holds(&s, self.id, self.timings.lease(), term, &s.role.voters, now)
    }

    /// The send time of the latest message `peer` acknowledged in `term`.
    pub fn acked_at(&self, term: u64, peer: NodeId) -> Option<Instant> {
        let s = self.lock();
        (s.acks_term == term)
            .then(|| s.acks.get(&peer).copied())
            .flatten()
    }

    /// The pulse's look at this replica at `now` (by its last known role), under one lock:
    /// when to stand, if its election timeout passes within `horizon` (see
    /// [`Liveness::election_due`]); as a leader, count a lapse when it held its lease in its
    /// term and no longer does.
    pub fn check(&self, now: Instant, horizon: Duration) -> Check {
        let mut s = self.lock();
        if s.role.state != openraft::ServerState::Leader {
            // No election comes sooner than `election_min` after the replica last heard of a
            // leader or stood: a follower its leader beats every round stops here, without
            // working out its rank (most of a broker's replicas, every round).
            if quiet_since(&s) + self.timings.election_min > now + horizon {
                return Check::Idle;
            }
            return match election_at(&s, self.id, self.stagger, self.preferred(), &self.timings) {
                Some(at) if at <= now + horizon => Check::Stand(at),
                _ => Check::Idle,
            };
        }
        let term = s.role.term;
        let handing = match s.handover {
            Some(h) if h.term != term => {
                s.handover = None;
                None
            }
            Some(h) if now.saturating_duration_since(h.since) > self.timings.handover_max() => {
                tracing::warn!(
                    to = h.to,
                    term,
                    waited_ms = now.saturating_duration_since(h.since).as_millis(),
                    "handover given up: the successor did not catch up or was not elected; \
                     leading on"
                );
                s.handover = None;
                // The lease lapsed while silent on purpose: not a lapse to count.
                s.held_in = None;
                None
            }
            Some(h) => Some(match h.released {
                None => Handing::Draining { to: h.to },
                Some(_) => Handing::Released,
            }),
            None => None,
        };
        let holds = lease_holds(&s, self.id, self.timings.lease(), term, &s.role.voters, now);
        if handing.is_some() {
            // Silent on purpose once released: the lease runs out and is no lapse.
            s.held_in = None;
            return Check::Lead {
                term,
                voters: s.role.voters.clone(),
                lapsed: false,
                handing,
            };
        }
        let lapsed = match (holds, s.held_in) {
            (true, _) => {
                s.held_in = Some(term);
                false
            }
            (false, Some(t)) if t == term => {
                s.lapses += 1;
                s.held_in = None;
                true
            }
            (false, _) => false,
        };
        Check::Lead {
            term,
            voters: s.role.voters.clone(),
            lapsed,
            handing: None,
        }
    }

    /// Times this replica, leading, lost its lease within its term.
    pub fn lapses(&self) -> u64 {
        self.lock().lapses
    }

    /// Whether this replica should stand for election at `now`: a voter that follows or
    /// stands (by its last known role) whose election timeout passed. Never while standing is
    /// off.
    pub fn election_due(&self, now: Instant) -> bool {
        election_at(
            &self.lock(),
            self.id,
            self.stagger,
            self.preferred(),
            &self.timings,
        )
        .is_some_and(|at| at <= now)
    }

    /// The replica stood for election at `now`: the next try waits a fresh draw from here.
    pub fn stood(&self, now: Instant) {
        let mut s = self.lock();
        s.since = now;
        s.draw = draw();
        s.greater_log = false;
    }

    /// A voter answered a vote request with a longer log than this replica's.
    pub fn saw_greater_log(&self) {
        self.lock().greater_log = true;
    }

    /// Turns standing for election on or off (off while the replica repairs damaged files).
    pub fn set_may_stand(&self, may: bool) {
        self.lock().may_stand = may;
    }

    /// Leader, once a round, under one lock: whether it is quiet (every follower held and had
    /// applied the log through `applied` in `term` at the last beat), and whether its log
    /// stood still since the last round (no entry appended, none applied), which this one
    /// becomes. A group still being written needs no heartbeat: its next append carries the
    /// commit index and restarts a replication that failed. One that stopped needs one: so
    /// that its followers learn the commit of its last entry and the group can go quiet, and
    /// so that an entry whose replication failed is sent again (openraft retries a failed
    /// AppendEntries only when something new is to be sent).
    pub fn lead_round(
        &self,
        term: u64,
        last_log: Option<u64>,
        last_applied: Option<LogId>,
        applied: Option<LogId>,
    ) -> LeadRound {
        let mut s = self.lock();
        let quiet = applied.is_some_and(|a| s.quiet == Some((term, a)));
        let now = Some((term, last_log, last_applied));
        let still = s.last_round == now;
        s.last_round = now;
        LeadRound { quiet, still }
    }

    /// Leader: sets (`Some`) or clears the quiet mark after a round of beats.
    pub fn set_quiet(&self, mark: Option<(u64, LogId)>) {
        self.lock().quiet = mark;
    }
}

/// What the pulse does about a replica this round ([`Liveness::check`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    Idle,
    /// Its election timeout passes at this instant (or passed): stand then, if nothing is
    /// heard meanwhile.
    Stand(Instant),
    /// It leads `term` with `voters` (its last known role's); `lapsed`: its lease lapsed
    /// since the last check; `handing`: where its handover stands, if it hands over.
    Lead {
        term: u64,
        voters: Arc<[NodeId]>,
        lapsed: bool,
        handing: Option<Handing>,
    },
}

/// A leader's [`Liveness::lead_round`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeadRound {
    pub quiet: bool,
    pub still: bool,
}

/// When a replica stands if it hears nothing more; `None` when it does not stand at all.
fn election_at(
    s: &State,
    id: NodeId,
    stagger: u64,
    preferred: Option<NodeId>,
    timings: &Timings,
) -> Option<Instant> {
    let standing = matches!(
        s.role.state,
        openraft::ServerState::Follower | openraft::ServerState::Candidate
    );
    if !s.may_stand || !standing || !s.role.voters.contains(&id) {
        return None;
    }
    let quiet_since = quiet_since(s);
    let range = timings.election_max - timings.election_min;
    let mut wait;
    match (s.role.committed, s.heard) {
        // Its leader went quiet: every follower's timeout falls in its own slice of the range,
        // in an order the group's replicas agree on, so they seldom stand together and split
        // the vote (every group a dead broker led elects at once).
        (true, Some(h)) => {
            let mut followers: Vec<NodeId> = s
                .role
                .voters
                .iter()
                .copied()
                .filter(|&v| v != h.leader)
                .collect();
            // The order changes with the term, so leadership does not always pass the same way;
            // but the preferred replica goes first, so that a leader handing over to it (or
            // dying) leaves leadership where clients should find it.
            let order = mix(stagger ^ mix(h.term));
            followers.sort_by_key(|&v| (Some(v) != preferred, mix(order ^ v)));
            let n = u32::try_from(followers.len().max(1)).unwrap_or(u32::MAX);
            let rank = followers.iter().position(|&v| v == id).unwrap_or(0);
            let slice = range / n;
            // Its own vote lease must have passed (it promised the leader to vote for no one
            // before), and so must the other followers': they heard the leader last at most a
            // beat round later than this one (a round is 1.5 heartbeats, the margin), so a
            // candidate standing then is not refused for their leases. The slices follow.
            wait = timings.vote_lease() + timings.margin();
            wait += slice * u32::try_from(rank).unwrap_or(0) + slice.mul_f64(s.draw);
        }
        (true, None) => {
            wait = timings.election_min + range.mul_f64(s.draw) + timings.vote_lease();
        }
        // Standing again after a split vote (or with no elected leader known): the voters
        // take turns, a whole range apart, in an order of the group and term they agree on, so
        // that one candidate's request reaches the others before they stand themselves.
        // In a group that has never heard of a leader (a new partition, whose preferred
        // replica's first try failed because its peers had not opened the group yet), the
        // preferred replica takes the first turn, so the topic's leaders start where they
        // belong instead of waiting for the leader balance; later, when it may be the dead one,
        // it gets no precedence.
        (false, heard) => {
            let order = mix(stagger ^ mix(s.role.term));
            let first = if heard.is_none() { preferred } else { None };
            let mut voters: Vec<NodeId> = s.role.voters.to_vec();
            voters.sort_by_key(|&v| (Some(v) != first, mix(order ^ v)));
            let rank = voters.iter().position(|&v| v == id).unwrap_or(0);
            // Half the range drawn: turns are at least half a range apart.
            wait = timings.election_min
                + range * u32::try_from(rank).unwrap_or(0)
                + range.mul_f64(s.draw) / 2;
        }
    }
    if s.greater_log {
        wait += timings.election_max * 2;
    }
    Some(quiet_since + wait)
}

/// When the replica last heard of a leader, or stood itself: its election clock starts there.
fn quiet_since(s: &State) -> Instant {
    match s.heard {
        Some(h) if h.at > s.since => h.at,
        _ => s.since,
    }
}

/// A 64-bit mixer (splitmix64's finalizer): orders followers by group.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn lease_holds(
    s: &State,
    id: NodeId,
    lease: Duration,
    term: u64,
    voters: &[NodeId],
    now: Instant,
) -> bool {
    if voters.is_empty() {
        return false;
    }
    let fresh = |peer: &NodeId| {
        *peer == id
            || (s.acks_term == term
                && s.acks
                    .get(peer)
                    .is_some_and(|&sent| now.saturating_duration_since(sent) <= lease))
    };
    let majority = |set: &[NodeId]| set.iter().filter(|v| fresh(v)).count() * 2 > set.len();
    // A joint membership commits only with a majority of each set, so the lease needs one of
    // each too: a majority of the union can miss one side (three old voters and three new,
    // four of the six acknowledging but one of them old).
    majority(voters) && s.role.joint.iter().all(|set| majority(set))
}

fn draw() -> f64 {
    ThreadRng.gen_range(0.0..1.0)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn timings() -> Timings {
        Timings::from_ms(100, 300, 600).expect("valid")
    }

    fn log(term: u64, index: u64) -> LogId {
        LogId::new(openraft::CommittedLeaderId::new(term, 0), index)
    }

    #[test]
    fn timings_are_checked_and_the_lease_leaves_a_margin() {
        let t = timings();
        assert_eq!(t.vote_lease(), Duration::from_millis(600));
        assert_eq!(t.lease(), Duration::from_millis(450));
        assert!(Timings::from_ms(0, 300, 600).is_err());
        assert!(Timings::from_ms(100, 100, 600).is_err());
        assert!(Timings::from_ms(100, 300, 300).is_err());
        // 1.5 heartbeats of margin would leave less than a heartbeat of lease.
        assert!(Timings::from_ms(100, 150, 240).is_err());
        assert!(Timings::from_ms(100, 150, 250).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn the_lease_needs_a_quorum_of_fresh_acknowledgements_of_its_term() {
        let l = Liveness::new(1, timings(), 7);
        let voters = [1, 2, 3];
        let t0 = Instant::now();
        assert!(!l.lease_holds(5, &voters, t0), "no acknowledgement yet");
        l.acked(5, 2, t0);
        assert!(l.lease_holds(5, &voters, t0));
        assert!(
            !l.lease_holds(6, &voters, t0),
            "acknowledged in another term"
        );
        let lease = timings().lease();
        assert!(l.lease_holds(5, &voters, t0 + lease));
        assert!(!l.lease_holds(5, &voters, t0 + lease + Duration::from_millis(1)));
        // An older acknowledgement arriving late moves nothing back.
        l.acked(5, 2, t0 + Duration::from_millis(100));
        l.acked(5, 2, t0);
        assert!(l.lease_holds(5, &voters, t0 + lease + Duration::from_millis(100)));
        // A later term starts over; an earlier one is ignored.
        l.acked(6, 3, t0);
        assert!(!l.lease_holds(5, &voters, t0));
        l.acked(5, 2, t0 + Duration::from_millis(200));
        assert!(l.lease_holds(6, &voters, t0));
        assert_eq!(l.acked_at(6, 2), None);
        // A group of one is its own quorum.
        assert!(Liveness::new(1, timings(), 7).lease_holds(9, &[1], t0));
        // Five voters need two peers besides this one.
        let five = Liveness::new(1, timings(), 7);
        five.acked(1, 2, t0);
        assert!(!five.lease_holds(1, &[1, 2, 3, 4, 5], t0));
        five.acked(1, 4, t0);
        assert!(five.lease_holds(1, &[1, 2, 3, 4, 5], t0));
    }

    #[test]
    fn a_move_changes_the_preferred_replica() {
        let l = Liveness::new(2, timings(), 7).with_preferred(Some(3));
        assert_eq!(l.preferred(), Some(3));
        l.set_preferred(Some(4));
        assert_eq!(l.preferred(), Some(4));
        l.set_preferred(None);
        assert_eq!(l.preferred(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_joint_membership_needs_a_majority_of_each_set() {
        // Moving from {1, 2, 3} to {1, 5, 6}: the union is {1, 2, 3, 5, 6}.
        let l = Liveness::new(1, timings(), 7);
        l.set_role(Role {
            joint: Arc::from(vec![Arc::from(vec![1, 2, 3]), Arc::from(vec![1, 5, 6])]),
            voters: Arc::from(vec![1, 2, 3, 5, 6]),
            ..role(openraft::ServerState::Leader, 1, true)
        });
        let union = [1, 2, 3, 5, 6];
        let t0 = Instant::now();
        l.acked(1, 5, t0);
        l.acked(1, 6, t0);
        assert!(
            !l.lease_holds(1, &union, t0),
            "three of five, but only this replica of the old set"
        );
        assert!(!l.leads(1, t0));
        l.acked(1, 2, t0);
        assert!(l.lease_holds(1, &union, t0));
        assert!(l.leads(1, t0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_refuses_other_candidates_within_the_vote_lease() {
        let l = Liveness::new(2, timings(), 7);
        let t0 = Instant::now();
        assert_eq!(l.refuses_vote(3, t0), None, "nothing heard");
        l.heard(4, 1, t0);
        assert!(l.refuses_vote(3, t0 + Duration::from_millis(600)).is_some());
        assert_eq!(
            l.refuses_vote(1, t0),
            None,
            "its own leader may stand again"
        );
        assert_eq!(l.refuses_vote(3, t0 + Duration::from_millis(601)), None);
        // An older term's leader heard late does not replace the newer one.
        l.heard(3, 3, t0 + Duration::from_millis(10));
        assert_eq!(
            l.heard_within(t0, Duration::from_secs(1)).map(|h| h.leader),
            Some(1)
        );
    }

    fn role(state: openraft::ServerState, term: u64, committed: bool) -> Role {
        Role {
            state,
            term,
            committed,
            voters: Arc::from(vec![1, 2, 3]),
            joint: Arc::from(Vec::new()),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn elections_wait_the_vote_lease_and_a_fresh_draw() {
        use openraft::ServerState::{Candidate, Follower, Leader};
        let l = Liveness::new(2, timings(), 7);
        l.set_role(role(Follower, 1, true));
        let t0 = Instant::now();
        let min = Duration::from_millis(300);
        let max = Duration::from_millis(600);
        assert!(
            !l.election_due(t0 + max),
            "a follower of a committed vote waits the vote lease too"
        );
        assert!(l.election_due(t0 + max + max));
        l.heard(1, 1, t0 + max);
        assert!(!l.election_due(t0 + max + max));
        l.set_role(role(Candidate, 2, false));
        l.stood(t0 + Duration::from_secs(10));
        let at = t0 + Duration::from_secs(10);
        // A candidate's turn is one of three (voters 1, 2, 3), each a range (300 ms) long.
        assert!(!l.election_due(at + min - Duration::from_millis(1)));
        assert!(l.election_due(at + max * 2));
        l.saw_greater_log();
        assert!(
            !l.election_due(at + max * 2),
            "a longer log elsewhere: stand later"
        );
        assert!(l.election_due(at + max * 4));
        l.stood(at);
        assert!(l.election_due(at + max * 2), "the next try forgets it");
        l.saw_greater_log();
        l.heard(3, 3, at);
        l.set_role(role(Follower, 3, true));
        assert!(
            l.election_due(at + max * 3 + Duration::from_millis(1)),
            "a leader heard since: forgotten too"
        );
        l.set_role(role(Candidate, 2, false));
        l.set_role(role(Leader, 2, true));
        assert!(!l.election_due(at + max), "a leader does not stand");
        l.set_role(Role {
            voters: Arc::from(vec![1, 3, 4]),
            ..role(Follower, 2, false)
        });
        assert!(
            !l.election_due(at + max),
            "nor does a replica that is no voter"
        );
        l.set_role(role(Follower, 2, false));
        l.set_may_stand(false);
        assert!(!l.election_due(at + Duration::from_secs(60)));
    }

    /// After their leader dies, the followers of one group stand in an order they agree on,
    /// each in its own slice of the election range: never together, whatever they drew.
    #[tokio::test(start_paused = true)]
    async fn followers_of_a_dead_leader_stand_one_after_another() {
        use openraft::ServerState::Follower;
        let t0 = Instant::now();
        let horizon = Duration::from_secs(5);
        let mut first = BTreeMap::new();
        for stagger in 0..64 {
            let at: Vec<(Instant, NodeId)> = [2, 3]
                .into_iter()
                .map(|id| {
                    let l = Liveness::new(id, timings(), stagger);
                    l.set_role(role(Follower, 4, true));
                    l.heard(4, 1, t0);
                    match l.check(t0, horizon) {
                        Check::Stand(at) => (at, id),
                        other => panic!("{other:?}"),
                    }
                })
                .collect();
            let (early, late) = (at[0].0.min(at[1].0), at[0].0.max(at[1].0));
            // The vote lease (600 ms) and a beat round (150 ms), then a slice of 150 ms each.
            assert!(early >= t0 + Duration::from_millis(750), "{:?}", early - t0);
            assert!(early < t0 + Duration::from_millis(900), "{:?}", early - t0);
            assert!(late >= t0 + Duration::from_millis(900), "{:?}", late - t0);
            assert!(late < t0 + Duration::from_millis(1050), "{:?}", late - t0);
            *first.entry(at.iter().min().map(|a| a.1)).or_insert(0) += 1;
        }
        assert_eq!(
            first.len(),
            2,
            "groups differ in who stands first: {first:?}"
        );
    }

    /// Two candidates that split a vote stand again in turns they agree on (by group and term),
    /// at least half a range apart: the first one's request reaches the other first.
    #[tokio::test(start_paused = true)]
    async fn candidates_after_a_split_vote_take_turns() {
        use openraft::ServerState::Candidate;
        let t0 = Instant::now();
        let horizon = Duration::from_secs(5);
        let mut first = BTreeMap::new();
        for (stagger, term) in (0..32).zip(5..) {
            let at: Vec<(Instant, NodeId)> = [1, 3]
                .into_iter()
                .map(|id| {
                    let l = Liveness::new(id, timings(), stagger);
                    l.set_role(role(Candidate, term, false));
                    l.stood(t0);
                    match l.check(t0, horizon) {
                        Check::Stand(at) => (at, id),
                        other => panic!("{other:?}"),
                    }
                })
                .collect();
            let gap = at[0].0.max(at[1].0) - at[0].0.min(at[1].0);
            assert!(gap >= Duration::from_millis(150), "{gap:?}");
            *first.entry(at.iter().min().map(|a| a.1)).or_insert(0) += 1;
        }
        assert_eq!(first.len(), 2, "either may go first: {first:?}");
    }

    /// A leader's log that stands still for a round (nothing appended, nothing applied) wants
    /// a heartbeat, committed or not: an entry whose AppendEntries failed is sent again only
    /// then. One still moving does not.
    #[test]
    fn a_log_that_stood_still_for_a_round_is_noticed() {
        let l = Liveness::new(1, timings(), 7);
        let still = |term, last, applied| l.lead_round(term, last, applied, None).still;
        assert!(!still(2, Some(5), Some(log(2, 4))), "the first round");
        assert!(
            still(2, Some(5), Some(log(2, 4))),
            "entry 5 is stuck unapplied"
        );
        assert!(!still(2, Some(6), Some(log(2, 4))), "appended");
        assert!(!still(2, Some(6), Some(log(2, 6))), "applied");
        assert!(still(2, Some(6), Some(log(2, 6))));
        assert!(
            !still(3, Some(6), Some(log(2, 6))),
            "a new term starts over"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lapse_is_counted_once_per_loss_of_a_held_lease() {
        let l = Liveness::new(1, timings(), 7);
        let t0 = Instant::now();
        let h = Duration::from_millis(150);
        assert_eq!(l.check(t0, h), Check::Idle, "not a voter");
        l.set_role(role(openraft::ServerState::Follower, 1, false));
        assert_eq!(l.check(t0, h), Check::Idle, "an election timeout away");
        assert!(matches!(l.check(t0, Duration::from_secs(1)), Check::Stand(at) if at > t0));
        l.set_role(role(openraft::ServerState::Leader, 1, true));
        let lead = |lapsed| Check::Lead {
            term: 1,
            voters: Arc::from(vec![1, 2, 3]),
            lapsed,
            handing: None,
        };
        assert_eq!(l.check(t0, h), lead(false), "never held: no lapse");
        l.acked(1, 2, t0);
        assert_eq!(l.check(t0, h), lead(false), "held");
        let late = t0 + Duration::from_secs(1);
        assert_eq!(l.check(late, h), lead(true), "lapsed");
        assert_eq!(l.check(late, h), lead(false), "counted once");
        assert_eq!(l.lapses(), 1);
        let quiet = |applied| l.lead_round(1, Some(1), Some(log(1, 1)), applied).quiet;
        assert!(!quiet(Some(log(1, 1))));
        l.set_quiet(Some((1, log(1, 1))));
        assert!(quiet(Some(log(1, 1))));
        assert!(!quiet(Some(log(1, 2))));
        assert!(!quiet(None), "something unapplied is never quiet");
    }

    #[tokio::test(start_paused = true)]
    async fn a_handover_drains_falls_silent_and_ends_with_the_term_or_gives_up() {
        let l = Liveness::new(1, timings(), 7);
        let t0 = Instant::now();
        let h = Duration::from_millis(150);
        l.set_role(role(openraft::ServerState::Follower, 1, true));
        assert!(
            l.hand_over(1, 2, t0).is_err(),
            "a follower hands nothing over"
        );
        l.set_role(role(openraft::ServerState::Leader, 1, true));
        assert!(l.hand_over(2, 2, t0).is_err(), "not the term it leads");
        assert!(l.hand_over(1, 1, t0).is_err(), "not to itself");
        assert!(l.hand_over(1, 9, t0).is_err(), "not to a non-voter");
        l.acked(1, 2, t0);
        assert!(l.leads(1, t0));
        l.hand_over(1, 2, t0)
            .expect("leader of term 1 hands over to voter 2");
        assert!(l.hand_over(1, 3, t0).is_err(), "one handover at a time");
        assert!(l.handing_over(1));
        assert!(!l.handing_over(2));
        let handing = |c: Check| match c {
            Check::Lead {
                handing, lapsed, ..
            } => {
                assert!(!lapsed, "a handover's silence is no lapse");
                handing
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(handing(l.check(t0, h)), Some(Handing::Draining { to: 2 }));
        l.successor_caught_up(1, 3, t0);
        assert_eq!(
            handing(l.check(t0, h)),
            Some(Handing::Draining { to: 2 }),
            "not the successor"
        );
        l.successor_caught_up(1, 2, t0);
        let later = t0 + Duration::from_secs(1);
        assert_eq!(
            handing(l.check(later, h)),
            Some(Handing::Released),
            "silent, lease gone"
        );
        // The successor won: the handover ends with the leadership.
        l.set_role(role(openraft::ServerState::Follower, 2, true));
        assert!(!l.handing_over(1));
        assert_eq!(l.lapses(), 0);

        // One that does not end in another leader is given up, and the leader serves again.
        l.set_role(role(openraft::ServerState::Leader, 3, true));
        l.hand_over(3, 2, later).expect("hands over again");
        let late = later + l.timings().handover_max() + Duration::from_millis(1);
        assert_eq!(handing(l.check(late, h)), None, "given up");
        assert!(!l.handing_over(3));
        assert_eq!(
            l.check(late, h),
            Check::Lead {
                term: 3,
                voters: Arc::from(vec![1, 2, 3]),
                lapsed: false,
                handing: None,
            },
            "its lease was never held since: no lapse"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_preferred_replica_stands_first_when_its_leader_falls_silent() {
        // Whatever the group and term, follower 2 is first when preferred, and 3 otherwise
        // in about half the groups.
        let mut third_first = 0;
        for stagger in 0..64u64 {
            let at = |id: NodeId, preferred: Option<NodeId>| {
                let l = Liveness::new(id, timings(), stagger).with_preferred(preferred);
                l.set_role(role(openraft::ServerState::Follower, 4, true));
                let t0 = Instant::now();
                l.heard(4, 1, t0);
                l.check(t0, Duration::from_secs(5))
            };
            let (Check::Stand(two), Check::Stand(three)) = (at(2, Some(2)), at(3, Some(2))) else {
                panic!("both followers stand");
            };
            assert!(
                two < three,
                "group {stagger}: the preferred replica stands first"
            );
            let (Check::Stand(two), Check::Stand(three)) = (at(2, None), at(3, None)) else {
                panic!("both followers stand");
            };
            third_first += usize::from(three < two);
        }
        assert!((16..=48).contains(&third_first), "{third_first} of 64");
    }

    #[tokio::test(start_paused = true)]
    async fn in_a_group_that_never_had_a_leader_the_preferred_replica_takes_the_first_turn() {
        let mut preferred_first_later = 0;
        for stagger in 0..64u64 {
            let at = |id: NodeId, heard: bool| {
                let l = Liveness::new(id, timings(), stagger).with_preferred(Some(3));
                l.set_role(role(openraft::ServerState::Candidate, 1, false));
                let t0 = Instant::now();
                if heard {
                    l.heard(1, 2, t0);
                }
                match l.check(t0, Duration::from_secs(5)) {
                    Check::Stand(at) => at,
                    other => panic!("{other:?}"),
                }
            };
            let (one, two, three) = (at(1, false), at(2, false), at(3, false));
            assert!(
                three < one && three < two,
                "group {stagger}: preferred first"
            );
            // Once a leader was heard of, the turns are the group's and term's alone.
            let (one, two, three) = (at(1, true), at(2, true), at(3, true));
            preferred_first_later += usize::from(three < one && three < two);
        }
        assert!(
            (8..=40).contains(&preferred_first_later),
            "{preferred_first_later} of 64"
        );
    }
}
