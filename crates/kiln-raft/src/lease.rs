//! Check-quorum as a lease: a leader serves clients only while a quorum acknowledged it lately.
//!
//! openraft 0.9 has no check-quorum: a leader cut off from its peers keeps calling itself
//! leader until it hears of a later term, which may be never. Clients that can still reach it
//! would read a stale high watermark, committed offsets that go backwards, or wait forever for
//! commits. So a replica leads, for clients, only while [`holds`]: its Raft state is Leader and
//! a quorum acknowledged one of its messages sent at most [`lease`] ago.
//!
//! Why that is early enough: a follower grants no vote for `election_timeout_max` after it
//! last heard from its leader (openraft's follower lease) and then waits an election timeout
//! more, so a successor is elected no sooner than `election_timeout_max + election_timeout_min`
//! after the deposed leader's last message that a quorum received, itself no earlier than the
//! last one it acknowledged. openraft measures `millis_since_quorum_ack` from the time the
//! acknowledged message was sent, but reports it only when its core runs, at least every tick
//! (`heartbeat_interval * 3 / 2`); the value read may be one tick old. [`lease`] leaves that
//! tick out: the deposed leader stops serving at most `election_timeout_max` after the message,
//! an election timeout before any successor can lead.
//!
//! A group of one replica is its own quorum: openraft reports its lease renewed every time.

use std::time::Duration;

use openraft::{RaftMetrics, ServerState};

use crate::types::NodeId;

/// How long a leader serves clients after the send of the last message a quorum acknowledged;
/// an error for timings that leave no lease.
pub fn lease(config: &openraft::Config) -> Result<Duration, String> {
    let tick = config.heartbeat_interval.saturating_mul(3) / 2;
    if config.election_timeout_max <= tick {
        return Err(format!(
            "election_timeout_max ({} ms) must exceed 1.5 heartbeats ({tick} ms): a leader's \
             lease is the difference",
            config.election_timeout_max
        ));
    }
    Ok(Duration::from_millis(config.election_timeout_max - tick))
}

/// Whether `m` is a leader whose lease holds (see the module docs).
pub fn holds(m: &RaftMetrics<NodeId, openraft::EmptyNode>, lease: Duration) -> bool {
    m.state == ServerState::Leader
        && m.millis_since_quorum_ack
            .is_some_and(|ms| u128::from(ms) <= lease.as_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_leaves_out_one_tick_of_stale_metrics() {
        let c = crate::partition::production_config();
        assert_eq!(lease(&c), Ok(Duration::from_millis(600 - 150)));
    }

    #[test]
    fn an_election_timeout_within_one_tick_is_refused() {
        let c = crate::partition::raft_config(100, 100, 150);
        let err = lease(&c).expect_err("no lease left");
        assert!(err.contains("must exceed"), "{err}");
    }
}
