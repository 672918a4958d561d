//! Consumer groups: the coordinator state machine, the committed-offsets store, lag and
//! retention alerts. See docs/consumer-groups.md.

pub mod coordinator;
pub mod lag;
pub mod offsets;
pub mod records;

use std::sync::Arc;
use std::time::Duration;

pub use coordinator::{Coordinator, GroupConfig};
pub use offsets::{OffsetsStore, StoreConfig};

use crate::cluster::Replica;
use crate::server::Broker;

/// Builds the coordinator around an empty offsets store; the offsets group's replica fills
/// its table as it applies (and is attached once the cluster has opened it).
pub fn open(groups: GroupConfig, store: StoreConfig) -> Coordinator {
    Coordinator::new(groups, OffsetsStore::new(store))
}

/// Session expiry and rebalance deadlines, on a timer.
pub async fn run_timers(broker: Arc<Broker>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        broker.groups.tick(tokio::time::Instant::now());
    }
}

/// This broker coordinates every group while it leads the replicated offsets group (its lease
/// held). On winning it, it waits until its term's first entry is applied (so the table holds
/// every commit made before the term), forgets members (they rejoin) and serves; on losing it,
/// or its lease, it stops serving at once (requests get NOT_COORDINATOR). Every replica applies the table all along, so there is
/// nothing to rebuild. A commit write that fails while it leads also stops serving
/// (`offsets::OffsetsStore::wait`); it then starts again as on winning, from the table.
pub async fn follow_coordinator_leadership(broker: Arc<Broker>, replica: Arc<Replica>) {
    let mut metrics = replica.partition.raft().metrics();
    loop {
        // Leading with its lease held (kiln-raft `liveness.rs`): a coordinator cut off from its
        // quorum stops serving before another can start, instead of keeping its own generation
        // of every group and serving a stale table. A lapse changes no Raft metric, so the
        // lease is also looked at every quarter lease (below).
        let term = metrics.borrow_and_update().current_term;
        let leading = replica.partition.leads();
        let store = broker.groups.store();
        let serving = store.serving_term();
        if !leading && serving.is_some() {
            store.stop_serving();
            broker.groups.forget_members();
            tracing::info!(term, "no longer the group coordinator");
        }
        if leading && serving != Some(term) {
            store.stop_serving();
            let ready = tokio::time::timeout(
                Duration::from_secs(10),
                replica.partition.raft().ensure_linearizable(),
            )
            .await;
            match ready {
                Ok(Ok(_)) => {
                    broker.groups.forget_members();
                    let keys = store.start_serving(term);
                    tracing::info!(term, keys, "group coordinator: committed offsets caught up");
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "not the offsets leader after all");
                    // The metrics may still say leader for a moment: do not spin on them.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(_) => tracing::warn!(term, "offsets group not caught up within 10 s; retrying"),
            }
            continue;
        }
        // A failed commit write stops serving without a change of leadership: look again.
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            () = store.resync_needed() => {}
            () = tokio::time::sleep(replica.partition.lease() / 4) => {}
        }
    }
}
