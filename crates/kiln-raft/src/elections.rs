//! The one task per replica that turns its standing for election off and on: off while the
//! repair guard holds (`guard.rs`), and, when openraft runs its own timers, off for a random
//! while after each election this replica stood in failed.
//!
//! Why the second: openraft 0.9 draws a replica's election timeout once, at start, and checks
//! it only on its tick. Two replicas whose timeouts fall on the same tick, with ticks in phase,
//! start every election together and split the vote every time. A third voter breaks the tie,
//! but not while it is down or repairing, and then the group stays without a leader (the
//! simulation found one such run). A random pause after a failed election is the randomized
//! retry Raft relies on. A pulsed replica (`pulse.rs`) needs no pause: the pulse draws a fresh
//! timeout for every try (`liveness.rs`).

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use rand08::RngCore;

use crate::guard::lift_when_met;
use crate::liveness::Liveness;
use crate::log_store::LogStore;
use crate::types::{Raft, ThreadRng};

/// How a replica's elections run.
pub(crate) struct Plan {
    /// It started under the repair guard, not standing.
    pub guarded: bool,
    /// The configuration has elections on.
    pub elect_wanted: bool,
    /// The broker's pulse holds its elections (openraft's timers are off).
    pub pulsed: bool,
    /// The longest pause after a failed election (openraft's timers only).
    pub pause_max: Duration,
}

/// Runs until the Raft node stops.
pub(crate) async fn run(raft: Raft, log: LogStore, liveness: Arc<Liveness>, plan: Plan) {
    if plan.guarded {
        if !lift_when_met(&raft, &log).await {
            return;
        }
        if plan.elect_wanted {
            raft.runtime_config().elect(true);
            liveness.set_may_stand(true);
        }
    }
    if plan.elect_wanted {
        lead_alone_at_once(&raft).await;
        if !plan.pulsed {
            break_split_votes(&raft, plan.pause_max).await;
        }
    }
}

/// A group whose only voter is this replica stands at once on start instead of waiting out an
/// election timeout: nobody else can lead it, and a broker of one should serve as soon as its
/// logs are open.
async fn lead_alone_at_once(raft: &Raft) {
    let alone = {
        let m = raft.metrics();
        let m = m.borrow();
        let voters: Vec<_> = m.membership_config.membership().voter_ids().collect();
        voters == [m.id] && m.current_leader.is_none()
    };
    if alone {
        let _ = raft.trigger().elect().await;
    }
}

async fn break_split_votes(raft: &Raft, pause_max: Duration) {
    // The server metrics change only with the vote, state, leader or membership; the full
    // metrics change on every event the core handles (each heartbeat), and waking this task
    // on each would cost every idle replica a wake per heartbeat.
    let mut metrics = raft.server_metrics();
    // The term of the last election this replica stood in, with no leader seen since.
    let mut stood_in: Option<u64> = None;
    let pause_max_ms = pause_max.as_millis() as u64;
    while metrics.changed().await.is_ok() {
        let (state, term, leader) = {
            let m = metrics.borrow_and_update();
            (m.state, m.vote.leader_id().get_term(), m.current_leader)
        };
        if state != ServerState::Candidate {
            if leader.is_some() {
                stood_in = None;
            }
            continue;
        }
        match stood_in {
            Some(t) if term > t => {
                // Standing again with no leader since the last try: that one failed. Wait a
                // random while (up to twice the longest election timeout, so the pause, not
                // openraft's fixed per-node timer, decides who goes first), then stand at once
                // if still nobody leads: the candidate with the shorter pause asks first, and
                // the other, paused, grants its vote.
                let pause = Duration::from_millis(ThreadRng.next_u64() % (2 * pause_max_ms + 1));
                raft.runtime_config().elect(false);
                tokio::time::sleep(pause).await;
                raft.runtime_config().elect(true);
                let leaderless = raft.metrics().borrow().current_leader.is_none();
                if leaderless {
                    let _ = raft.trigger().elect().await;
                }
                stood_in = Some(metrics.borrow_and_update().vote.leader_id().get_term());
            }
            Some(_) => {}
            None => stood_in = Some(term),
        }
    }
}
