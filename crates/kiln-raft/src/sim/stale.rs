//! Stale leaders: reads served on a lease, and the schedule that tries to make one stale.
//!
//! A broker answers Fetch, ListOffsets and OffsetFetch from a replica that leads with its
//! lease held and whose high watermark is of its own term (`leader_epoch()` and
//! `high_watermark_is_current()`), without a round trip to its followers. That is safe only
//! if no other replica can be elected, and commit anything, while the lease holds. The
//! schedule's stale-leader fault cuts every link of a group's current leader while clients
//! can still reach it (a broker whose Raft links fail but whose Kafka port answers); the
//! other two elect a leader and commit in a later term, and the isolated one still believes
//! it leads until its lease lapses.
//!
//! The lease reader plays every client that asks whichever replica claims to lead: every
//! 5-40 ms it asks *each* replica of both groups, the isolated one included, and records what
//! every replica that would serve the read answered: its high watermark, and for the offsets
//! group its table. The checker then asserts linearizable reads:
//! * data: a read that began after an append was acknowledged has a high watermark past that
//!   append's last offset;
//! * offsets: a read that began after a commit was acknowledged holds that key at that offset
//!   or higher (a client never sees its committed offset go backwards).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use super::{lock, log_line, Shared, SimRouter, DATA, OFFSETS};
use crate::rng::StableRng;
use crate::types::NodeId;

/// What one replica answered a read it would serve.
pub(super) struct LeaseRead {
    pub(super) group: usize,
    pub(super) by: NodeId,
    /// The term it led in.
    pub(super) term: u64,
    pub(super) at: Instant,
    pub(super) high_watermark: i64,
    /// The offsets group's table (latest offset per key); empty for the data group.
    pub(super) values: BTreeMap<String, i64>,
}

/// Reads every replica that would serve one, every 5-40 ms until `until`.
pub(super) async fn lease_reader(
    router: SimRouter,
    shared: Arc<Mutex<Shared>>,
    until: Instant,
    seed: u64,
    ignore_lease: bool,
) {
    let mut rng = StableRng::seed(seed);
    loop {
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..40))).await;
        let at = Instant::now();
        if at >= until {
            return;
        }
        for group in [DATA, OFFSETS] {
            for r in router.replicas(group) {
                let term = if ignore_lease {
                    let m = r.raft().metrics().borrow().clone();
                    if m.state != openraft::ServerState::Leader {
                        continue;
                    }
                    m.current_term
                } else {
                    match r.leader_epoch() {
                        Some(term) => term,
                        None => continue,
                    }
                };
                if !r.high_watermark_is_current() {
                    continue;
                }
                let high_watermark = r.high_watermark();
                let mut s = lock(&shared);
                let values = if group == OFFSETS {
                    match s.off.tables.get(&r.id()) {
                        Some(t) => t.values(),
                        None => continue,
                    }
                } else {
                    BTreeMap::new()
                };
                s.lease_reads.push(LeaseRead {
                    group,
                    by: r.id(),
                    term,
                    at,
                    high_watermark,
                    values,
                });
            }
        }
    }
}

/// Records that replica `id`, leading `group` in `term`, was isolated (for the trace).
pub(super) fn log_isolated(
    shared: &Arc<Mutex<Shared>>,
    start: Instant,
    group: usize,
    id: NodeId,
    term: u64,
) {
    let name = if group == DATA { "data" } else { "offsets" };
    log_line(
        shared,
        start,
        format!(
            "stale leader: replica {id} (the {name} leader in term {term}) isolated; clients still reach it"
        ),
    );
}

/// The checks in the module docs; returns the number of reads checked.
pub(super) fn check_lease_reads(s: &Shared, start: Instant, v: &mut Vec<String>) -> usize {
    let since = |at: Instant| at.saturating_duration_since(start).as_millis();
    // Data: acknowledgements in time order, with the highest last offset acknowledged so far.
    let mut acks: Vec<(Instant, i64)> = s
        .acks
        .iter()
        .map(|(_, ack, _, acked_at, _)| (*acked_at, ack.last_offset))
        .collect();
    acks.sort();
    let mut highest = Vec::with_capacity(acks.len());
    let mut top = -1;
    for &(at, last) in &acks {
        top = top.max(last);
        highest.push((at, top));
    }
    // Offsets: per key, the same.
    let mut commits: BTreeMap<&str, Vec<(Instant, i64)>> = BTreeMap::new();
    for (key, offset, at) in &s.off.commits {
        commits
            .entry(key.as_str())
            .or_default()
            .push((*at, *offset));
    }
    for list in commits.values_mut() {
        list.sort();
        let mut top = i64::MIN;
        for entry in list.iter_mut() {
            top = top.max(entry.1);
            entry.1 = top;
        }
    }
    // The highest value acknowledged strictly before `at` (an acknowledgement at the same
    // instant is concurrent with the read).
    let before = |list: &[(Instant, i64)], at: Instant| -> Option<i64> {
        let n = list.partition_point(|&(t, _)| t < at);
        n.checked_sub(1).map(|i| list[i].1)
    };
    for r in &s.lease_reads {
        if r.group == DATA {
            if let Some(last) = before(&highest, r.at) {
                if r.high_watermark <= last {
                    v.push(format!(
                        "STALE READ: data replica {} (leader in term {}) served high watermark {} at {} ms, after offset {last} was acknowledged",
                        r.by, r.term, r.high_watermark, since(r.at)
                    ));
                }
            }
            continue;
        }
        for (key, list) in &commits {
            let Some(acked) = before(list, r.at) else {
                continue;
            };
            let seen = r.values.get(*key).copied();
            if seen.is_none_or(|o| o < acked) {
                v.push(format!(
                    "STALE READ: offsets replica {} (leader in term {}) served {key}={seen:?} at {} ms, after {acked} was acknowledged",
                    r.by, r.term, since(r.at)
                ));
            }
        }
    }
    s.lease_reads.len()
}
