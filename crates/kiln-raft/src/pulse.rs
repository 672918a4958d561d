//! The pulse: one task per broker that keeps every replica it runs heard, elected and honest.
//!
//! openraft runs two timers per group: a leader's heartbeat to each follower every interval,
//! and every replica's tick, on which a follower checks its election timeout. Each is cheap,
//! but a broker with thousands of groups pays them thousands of times over, every interval,
//! while nothing happens (Redpanda's heartbeat manager exists for the same reason). A pulsed
//! replica ([`crate::partition::pulsed_config`]) runs neither; this task does, for all of a
//! broker's replicas at once:
//!
//! * **Beats.** Every round (1.5 heartbeats, openraft's own heartbeat period) each leader's
//!   group goes into one beat message per peer: the group, the term, and the log id of its
//!   whole applied log (if everything is applied). A follower answers every item in one reply
//!   ([`crate::ReplicatedPartition::serve_beat`]): accepted (it follows this leader in this
//!   term: the leader was heard, and the answer counts toward its lease) and caught up (it
//!   holds and has applied that log). A group whose followers that answered were all caught
//!   up at the last round, a majority with the leader, and whose log has not moved since is
//!   *quiet*: it sends nothing else. A group whose
//!   log stood still for a round without being quiet also gets an openraft heartbeat (an empty
//!   AppendEntries), which carries the commit index of its last entry and repairs a follower
//!   that fell behind; one still being written needs none (its next append carries the
//!   commit index, and openraft retries a failed one on its own). So an idle broker sends a
//!   message or two per peer per round, whatever its number of partitions, and a busy one
//!   adds no heartbeats to its appends.
//! * **Elections.** Every round, each follower or candidate whose election timeout passed on
//!   [`Liveness`]'s clock stands ([`crate::partition::PulseDue::Stand`]): openraft checked its
//!   own on its tick, which is the same period.
//!   A broker has a bounded, adaptive number of elections in flight at once
//!   ([`CANDIDACIES_MAX`]); the replicas due past it stand in later rounds, earliest first.
//! * **Lease lapses.** Every round, each leader's lease is looked at, and a lapse counted.
//! * **Handovers** (`Liveness::hand_over`). A leader handing its group over beats on until its
//!   successor answers caught up, then sends nothing more for the group.
//!
//! A round costs a lock or two per replica and a message per peer: at 3,000 partitions on
//! three brokers, an idle broker spends about 4 % of a core in all (`kiln-bench partitions`,
//! docs/benchmarks.md), most of it on these rounds.
//!
//! The transport of beats is a [`PulseNetwork`]: the broker's connection per peer
//! (`net::Mesh`) in production, the simulated network in the simulation. Each beat is bounded
//! by [`BEAT_ITEMS_MAX`] items and waits at most a lease for its answer; a peer whose last
//! beat is still unanswered is skipped, so a dead peer holds no more than one beat.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::{Instant, MissedTickBehavior};

use openraft::ServerState;

use crate::liveness::Timings;
use crate::partition::{PulseDue, ReplicatedPartition};
use crate::types::{LogId, NodeId};

/// Items in one beat message: a peer that shares more groups with this broker gets several.
/// Each item is a group name (at most 256 bytes, `net/codec.rs`) and 25 bytes more, so a beat
/// stays well inside the 1 MiB control frame.
pub const BEAT_ITEMS_MAX: usize = 2048;

/// The most elections one broker has in flight at once: stands whose outcome (a leader of a
/// later term known, or [`Timings::election_min`] passed: the vote requests' own deadline) is
/// not known yet.
///
/// Why: each stand costs its voters a vote request each, and a granted vote an fsync. When
/// thousands of groups are leaderless at once on a saturated machine (brokers opening a
/// thousand replicas each on two busy cores let their leases lapse), unbounded stands make the
/// vote requests themselves time out, every group stands again in a higher term, and the load
/// that broke the elections grows with each try: terms climbed past 200 with no leader after
/// two minutes. So the number in flight is a window that adapts as TCP's does: it halves
/// (down to [`CANDIDACIES_MIN`]) in a round in which elections timed out, and grows by one for
/// each election that ended with a leader, up to this bound. A dead broker's thousand groups
/// elect within the failover target all the same: an election that succeeds ends within a
/// round trip and frees its place.
pub const CANDIDACIES_MAX: usize = 128;

/// The window never shrinks below this many elections in flight: even a machine that answers
/// nothing in time keeps trying.
pub const CANDIDACIES_MIN: usize = 4;

/// One group's part of a beat: its leader says it leads `term` and has applied its whole log
/// through `applied` (`None` while anything is unapplied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeatItem {
    pub group: Arc<str>,
    pub term: u64,
    pub applied: Option<LogId>,
}

/// A follower's answer to one [`BeatItem`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BeatAnswer {
    /// It follows the sender in the item's term (its vote committed): the sender was heard.
    pub accepted: bool,
    /// It also holds and has applied the sender's whole log.
    pub caught_up: bool,
}

/// What a beat resolves to: the answers in the order of the items.
pub type BeatFuture = Pin<Box<dyn Future<Output = Result<Vec<BeatAnswer>, String>> + Send>>;

/// How beats travel between brokers.
pub trait PulseNetwork: Send + Sync + 'static {
    /// Sends `items` from broker `from` to broker `peer` as one message, and resolves to the
    /// answers by `deadline`.
    fn beat(
        &self,
        from: NodeId,
        peer: NodeId,
        items: Vec<BeatItem>,
        deadline: Instant,
    ) -> BeatFuture;
}

/// The replicas a broker runs.
pub trait PulseGroups: Send + Sync + 'static {
    /// Calls `f` with every replica this broker runs now and its group name (shared, so that
    /// a beat item costs no copy of it).
    fn each(&self, f: &mut dyn FnMut(&Arc<str>, &ReplicatedPartition));
}

/// Runs the pulse of broker `node` until the task is aborted.
pub async fn run(
    node: NodeId,
    timings: Timings,
    groups: Arc<dyn PulseGroups>,
    network: Arc<dyn PulseNetwork>,
) {
    let round = timings.heartbeat * 3 / 2;
    assert!(!round.is_zero(), "the heartbeat is checked at load");
    let mut ticker = tokio::time::interval(round);
    // A round that ran late (a busy runtime) is not made up with a burst.
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // Peers whose last beat is still unanswered.
    let busy: Arc<Mutex<BTreeSet<NodeId>>> = Arc::default();
    let mut candidacies = Candidacies::default();
    loop {
        ticker.tick().await;
        let now = Instant::now();
        let mut stand = Vec::new();
        let mut leading = Vec::new();
        groups.each(&mut |name, replica| match replica.pulse_due(now, round) {
            PulseDue::Idle => {}
            PulseDue::Stand(at) => stand.push(Stand {
                at,
                term: replica.liveness().role().term,
                replica: replica.clone(),
            }),
            PulseDue::Stuck { term, lapsed } => {
                if lapsed {
                    self::lapsed(name, term, &timings);
                }
            }
            PulseDue::Lead {
                term,
                applied,
                voters,
                quiet: _,
                heartbeat,
                lapsed,
                successor,
            } => {
                if lapsed {
                    self::lapsed(name, term, &timings);
                }
                let item = BeatItem {
                    group: name.clone(),
                    term,
                    applied,
                };
                leading.push(Led {
                    replica: replica.clone(),
                    item,
                    voters,
                    heartbeat,
                    successor,
                });
            }
        });
        let due = stand.len();
        let stand = candidacies.admit(now, timings.election_min, stand, |replica, term| {
            let role = replica.liveness().role();
            if role.term > term && (role.state == ServerState::Leader || role.committed) {
                Outcome::Elected
            } else if role.state == ServerState::Candidate {
                Outcome::Standing
            } else {
                Outcome::Other
            }
        });
        if stand.len() < due {
            tracing::debug!(
                deferred = due - stand.len(),
                in_flight = candidacies.open.len(),
                window = candidacies.window,
                "elections deferred: the broker has its window of them in flight"
            );
        }
        // Each at its own moment, not at the round's: candidates that stood together at every
        // round boundary would split their votes half the time.
        for Stand { at, replica, .. } in stand {
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                let now = Instant::now();
                // Something may have been heard meanwhile.
                if replica.liveness().election_due(now) {
                    replica.liveness().stood(now);
                    // Fire and forget: openraft only queues the command.
                    let _ = replica.raft().trigger().elect().await;
                }
            });
        }
        if !leading.is_empty() {
            tokio::spawn(beat_round(
                node,
                leading,
                network.clone(),
                busy.clone(),
                timings.lease(),
            ));
        }
    }
}

/// A replica due to stand at `at`, in `term` (its vote's term when admitted).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stand<R> {
    at: Instant,
    term: u64,
    replica: R,
}

/// Where a replica let stand is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// A leader of a later term than it stood from is known (itself or another).
    Elected,
    /// Still a candidate.
    Standing,
    /// Neither: it heard from its leader before its moment and did not stand, or lost.
    Other,
}

/// The elections a broker has in flight, and how many it may have (see [`CANDIDACIES_MAX`]).
struct Candidacies<R> {
    open: Vec<Stand<R>>,
    window: usize,
}

impl<R> Default for Candidacies<R> {
    fn default() -> Self {
        Candidacies {
            open: Vec::new(),
            window: CANDIDACIES_MAX,
        }
    }
}

impl<R: Clone> Candidacies<R> {
    /// Of the replicas `due` to stand, those that may, earliest first: as many as the window
    /// has room for once the finished elections are dropped. An election is finished once its
    /// moment passed and `outcome(replica, term)` says a leader of a later term than it stood
    /// from is known (the window grows by one), or `timeout` after its moment: if it is still
    /// a candidate its vote requests timed out (the window halves, once per round), otherwise
    /// it did not stand or lost (no change). The rest wait for a later round.
    fn admit(
        &mut self,
        now: Instant,
        timeout: Duration,
        mut due: Vec<Stand<R>>,
        outcome: impl Fn(&R, u64) -> Outcome,
    ) -> Vec<Stand<R>> {
        let (mut won, mut timed_out) = (0usize, 0usize);
        self.open.retain(|c| {
            if c.at > now {
                return true;
            }
            match outcome(&c.replica, c.term) {
                Outcome::Elected => {
                    won += 1;
                    false
                }
                _ if now < c.at + timeout => true,
                Outcome::Standing => {
                    timed_out += 1;
                    false
                }
                Outcome::Other => false,
            }
        });
        self.window = if timed_out > 0 {
            (self.window / 2).max(CANDIDACIES_MIN)
        } else {
            (self.window + won).min(CANDIDACIES_MAX)
        };
        assert!((CANDIDACIES_MIN..=CANDIDACIES_MAX).contains(&self.window));
        due.sort_by_key(|c| c.at);
        due.truncate(self.window.saturating_sub(self.open.len()));
        self.open.extend(due.iter().cloned());
        assert!(
            self.open.len() <= CANDIDACIES_MAX,
            "admitted past the bound"
        );
        due
    }
}

fn lapsed(group: &str, term: u64, timings: &Timings) {
    tracing::warn!(
        group,
        term,
        lease_ms = timings.lease().as_millis(),
        "leader lease lapsed: not serving until a quorum acknowledges this leader again"
    );
}

fn lock(busy: &Mutex<BTreeSet<NodeId>>) -> MutexGuard<'_, BTreeSet<NodeId>> {
    // Single inserts and removes: a panic elsewhere leaves the set whole.
    busy.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A group this broker leads, in one round.
struct Led {
    replica: ReplicatedPartition,
    item: BeatItem,
    /// The group's voters, this broker among them: the others are beaten.
    voters: Arc<[NodeId]>,
    /// An openraft heartbeat is due (`PulseDue::Lead`).
    heartbeat: bool,
    /// It hands over to this peer once it answers caught up (`Liveness::hand_over`).
    successor: Option<NodeId>,
}

/// One round of beats: an openraft heartbeat for every group that stopped but is not quiet yet, one beat
/// per peer (in pieces of [`BEAT_ITEMS_MAX`]) for all, then what the answers say: the
/// followers that accepted count toward each leader's lease, and a group whose followers
/// all caught up is quiet until its log moves.
async fn beat_round(
    node: NodeId,
    leading: Vec<Led>,
    network: Arc<dyn PulseNetwork>,
    busy: Arc<Mutex<BTreeSet<NodeId>>>,
    lease: Duration,
) {
    let sent = Instant::now();
    for led in leading.iter().filter(|l| l.heartbeat) {
        // Fire and forget: openraft only queues the command.
        let _ = led.replica.raft().trigger().heartbeat().await;
    }
    // Per peer, the indexes into `leading` of the groups it follows; per group, how many
    // followers it has.
    let mut by_peer: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
    let mut followers = vec![0usize; leading.len()];
    for (i, led) in leading.iter().enumerate() {
        for &peer in led.voters.iter().filter(|&&v| v != node) {
            by_peer.entry(peer).or_default().push(i);
            followers[i] += 1;
        }
    }
    let deadline = sent + lease;
    let beats = by_peer.iter().map(|(&peer, indexes)| {
        let network = network.clone();
        let busy = busy.clone();
        let items: Vec<Vec<BeatItem>> = indexes
            .chunks(BEAT_ITEMS_MAX)
            .map(|chunk| chunk.iter().map(|&i| leading[i].item.clone()).collect())
            .collect();
        async move {
            if !lock(&busy).insert(peer) {
                // Its last beat is still unanswered: one at a time per peer.
                return (peer, None);
            }
            let mut answers = Vec::new();
            for piece in items {
                let want = piece.len();
                match network.beat(node, peer, piece, deadline).await {
                    Ok(a) if a.len() == want => answers.extend(a),
                    Ok(a) => {
                        tracing::warn!(
                            peer,
                            want,
                            got = a.len(),
                            "a beat's answer does not match its items"
                        );
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(peer, error = %e, "beat not answered");
                        break;
                    }
                }
            }
            lock(&busy).remove(&peer);
            (peer, Some(answers))
        }
    });
    let answered = join_all(beats).await;
    // Per group, how many followers answered, and how many of them answered caught up.
    let mut answering = vec![0usize; leading.len()];
    let mut caught_up = vec![0usize; leading.len()];
    for (peer, answers) in answered {
        let Some(answers) = answers else { continue };
        let Some(indexes) = by_peer.get(&peer) else {
            unreachable!("answers come only from peers beaten");
        };
        for (&i, answer) in indexes.iter().zip(answers) {
            let led = &leading[i];
            answering[i] += 1;
            if answer.accepted {
                led.replica.liveness().acked(led.item.term, peer, sent);
            }
            if answer.accepted && answer.caught_up {
                caught_up[i] += 1;
                if led.successor == Some(peer) {
                    led.replica
                        .liveness()
                        .successor_caught_up(led.item.term, peer, Instant::now());
                }
            }
        }
    }
    for (i, led) in leading.iter().enumerate() {
        assert!(caught_up[i] <= answering[i] && answering[i] <= followers[i]);
        let quiet = led
            .item
            .applied
            .filter(|_| quiet(caught_up[i], answering[i], followers[i]))
            .map(|applied| (led.item.term, applied));
        led.replica.liveness().set_quiet(quiet);
    }
}

/// Whether a group whose log is whole and applied is quiet after a round of beats to its
/// `followers`: every follower that answered is caught up, and with the leader they are a
/// majority of the voters, so the group's whole log is committed where a quorum can see it.
///
/// A follower that did not answer (a dead broker, a beat still in flight) is not waited for:
/// an openraft heartbeat cannot reach it either, and while a broker is down every group it
/// follows would otherwise send one every round, to no one. Once it answers again, not
/// caught up, the group is loud again and the heartbeats repair it.
fn quiet(caught_up: usize, answering: usize, followers: usize) -> bool {
    let voters = followers + 1;
    caught_up == answering && (caught_up + 1) * 2 > voters
}

#[cfg(test)]
mod tests {
    use super::{quiet, Candidacies, Outcome, Stand, CANDIDACIES_MAX, CANDIDACIES_MIN};
    use std::time::Duration;
    use tokio::time::Instant;

    fn stands(at: Instant, replicas: std::ops::Range<u32>) -> Vec<Stand<u32>> {
        replicas
            .map(|replica| Stand {
                at,
                term: 1,
                replica,
            })
            .collect()
    }

    #[test]
    fn candidacies_stay_within_the_window_and_free_their_places_as_elections_end() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let timeout = ms(300);
        let mut c = Candidacies::default();
        // More due than the window: the earliest go.
        let mut due = stands(now, 0..CANDIDACIES_MAX as u32 + 10);
        due[CANDIDACIES_MAX + 5].at = now - ms(10);
        let admitted = c.admit(now, timeout, due, |_, _| Outcome::Standing);
        assert_eq!(admitted.len(), CANDIDACIES_MAX);
        assert_eq!(admitted[0].replica, CANDIDACIES_MAX as u32 + 5);
        // A round later, nothing decided: no room.
        let later = now + ms(150);
        assert!(c
            .admit(later, timeout, stands(later, 500..501), |_, _| {
                Outcome::Standing
            })
            .is_empty());
        // Replica 3's election ended with a leader of a later term: its place is free, and
        // the window (at its bound) stays.
        let admitted = c.admit(later, timeout, stands(later, 500..501), |r, _| {
            if *r == 3 {
                Outcome::Elected
            } else {
                Outcome::Standing
            }
        });
        assert_eq!(admitted.len(), 1);
        assert_eq!(c.window, CANDIDACIES_MAX);
    }

    #[test]
    fn the_window_halves_when_elections_time_out_and_grows_as_they_succeed() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let timeout = ms(300);
        let mut c = Candidacies::default();
        c.admit(now, timeout, stands(now, 0..100), |_, _| Outcome::Standing);
        // All timed out: half the window, once per round however many.
        let t1 = now + ms(300);
        let admitted = c.admit(t1, timeout, stands(t1, 100..300), |_, _| Outcome::Standing);
        assert_eq!(c.window, CANDIDACIES_MAX / 2);
        assert_eq!(admitted.len(), CANDIDACIES_MAX / 2);
        // Again and again: never below the floor.
        let mut t = t1;
        for round in 0..10u32 {
            t += ms(300);
            let first = 1_000 + round * 100;
            c.admit(t, timeout, stands(t, first..first + 100), |_, _| {
                Outcome::Standing
            });
        }
        assert_eq!(c.window, CANDIDACIES_MIN);
        // Elections that win grow it by one each.
        t += ms(10);
        c.admit(t, timeout, Vec::new(), |_, _| Outcome::Elected);
        assert_eq!(c.window, CANDIDACIES_MIN + CANDIDACIES_MIN);
        assert!(c.open.is_empty());
        // A replica that did not stand after all (it heard from its leader) changes nothing,
        // and holds its place until the timeout.
        c.admit(t, timeout, stands(t, 0..3), |_, _| Outcome::Other);
        t += ms(150);
        c.admit(t, timeout, Vec::new(), |_, _| Outcome::Other);
        assert_eq!(c.open.len(), 3);
        t += ms(150);
        c.admit(t, timeout, Vec::new(), |_, _| Outcome::Other);
        assert!(c.open.is_empty());
        assert_eq!(c.window, CANDIDACIES_MIN + CANDIDACIES_MIN);
    }

    #[test]
    fn quiet_waits_for_every_follower_that_answered_and_a_majority() {
        // Three voters: both followers answered caught up.
        assert!(quiet(2, 2, 2));
        // One answered behind: the group stays loud, and heartbeats repair it.
        assert!(!quiet(1, 2, 2));
        // One follower dead: the other caught up is a majority with the leader.
        assert!(quiet(1, 1, 2));
        // Both dead: no majority holds the log.
        assert!(!quiet(0, 0, 2));
        // Five voters, two of four followers answered caught up: a majority of three.
        assert!(quiet(2, 2, 4));
        assert!(!quiet(1, 1, 4));
        // A single-voter group has nobody to wait for.
        assert!(quiet(0, 0, 0));
    }
}
