//! Leader balance: leadership goes back to each partition's preferred replica (the first of
//! its replicas, spread over the brokers when the topic was created) once that broker is back
//! and caught up, as Kafka's `auto.leader.rebalance.enable` does.
//!
//! A failover hands a dead broker's partitions to the survivors, and nothing else would ever
//! move them back: one broker ends up leading most partitions and doing most of the work. So
//! every `leader_rebalance_interval_ms` each broker looks at the partitions it leads whose
//! preferred replica is another broker, and hands each over (kiln-raft `Liveness::hand_over`)
//! when that replica is in sync and acknowledged this leader within its lease: the leader
//! stops taking writes, beats on until the preferred replica holds and has applied its whole
//! log, falls silent, and the preferred replica, which stands first among the followers, is
//! elected about a second later. Every write the old leader took commits and is answered
//! before it falls silent; clients told NOT_LEADER_OR_FOLLOWER or "no leader" meanwhile ask
//! again. At most `leader_handovers_max` run at once per broker, so the pause spreads over
//! rounds instead of stopping a broker's partitions together; while handovers are under way or
//! more are waiting, the broker looks again every [`BUSY_PAUSE`] rather than every interval, so
//! a thousand partitions go back in about sixteen seconds, not sixteen intervals.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::replica::{node, Replica};
use super::Cluster;

/// Pause between looks while handovers are under way (each takes about a second).
const BUSY_PAUSE: Duration = Duration::from_secs(1);

/// Runs the leader balance of this broker until the task is aborted.
pub(super) async fn run(cluster: Arc<Cluster>) {
    let settings = &cluster.settings;
    if !settings.auto_leader_rebalance {
        return;
    }
    let every = Duration::from_millis(settings.leader_rebalance_interval_ms);
    let mut pause = every;
    loop {
        tokio::time::sleep(pause).await;
        let Round { started, busy } = round(&cluster, settings.leader_handovers_max);
        if started > 0 {
            tracing::info!(
                handovers = started,
                "leader balance: handing partitions back to their preferred replicas"
            );
        }
        pause = if busy { BUSY_PAUSE.min(every) } else { every };
    }
}

/// What one look did.
struct Round {
    /// Handovers started.
    started: usize,
    /// Handovers are under way, or more wait for a free slot.
    busy: bool,
}

/// One look at every partition this broker leads.
fn round(cluster: &Cluster, handovers_max: usize) -> Round {
    let leading: Vec<Arc<Replica>> = cluster
        .topics()
        .iter()
        .flat_map(|t| (0..t.partition_count()).filter_map(|i| cluster.partition(t, i)))
        .filter(|r| r.partition.leads() || r.handing_over())
        .collect();
    let mut running = leading.iter().filter(|r| r.handing_over()).count();
    let mut started = 0;
    let mut waiting = false;
    for replica in &leading {
        let Some(to) = replica.preferred_ready() else {
            continue;
        };
        if running >= handovers_max {
            waiting = true;
            break;
        }
        match replica.partition.hand_over(to) {
            Ok(()) => {
                running += 1;
                started += 1;
            }
            // Leadership or the lease moved since it was looked at: the next round sees.
            Err(e) => tracing::debug!(group = %replica.group, error = %e, "no handover"),
        }
    }
    Round {
        started,
        busy: running > 0 || waiting,
    }
}

impl Replica {
    /// Whether this replica, leading, is handing its partition over.
    pub fn handing_over(&self) -> bool {
        let term = self.partition.raft().metrics().borrow().current_term;
        self.partition.liveness().handing_over(term)
    }

    /// The preferred replica to hand over to, when this replica leads (lease held, no
    /// handover under way), is not the preferred one, and the preferred one is in sync and
    /// acknowledged it within the lease (it is up, not merely once was).
    pub fn preferred_ready(&self) -> Option<u64> {
        let preferred = *self.members().first()?;
        if preferred == self.node_id || !self.partition.leads() {
            return None;
        }
        let term = self.partition.raft().metrics().borrow().current_term;
        let acked = self.partition.liveness().acked_at(term, node(preferred)?)?;
        let fresh = Instant::now().saturating_duration_since(acked) <= self.partition.lease();
        (fresh && self.in_sync().contains(&preferred)).then_some(node(preferred)?)
    }
}
