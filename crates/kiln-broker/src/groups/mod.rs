//! Consumer groups: the coordinator state machine, the committed-offsets store, lag and
//! retention alerts. See docs/consumer-groups.md.

pub mod coordinator;
pub mod lag;
pub mod offsets;
pub mod records;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use coordinator::{Coordinator, GroupConfig};
pub use offsets::{OffsetsStore, StoreConfig};

use crate::cluster::Replica;
use crate::server::Broker;

/// Bytes read per step when a new coordinator rebuilds its view of committed offsets.
const REBUILD_READ_BYTES: usize = 4 << 20;

/// Where the offsets store lives under the data directory.
pub fn offsets_dir(data_dir: &Path) -> std::path::PathBuf {
    data_dir.join("internal").join("consumer-offsets")
}

/// Opens the offsets store (replaying it) and builds the coordinator. Blocking.
pub fn open(
    data_dir: &Path,
    groups: GroupConfig,
    store: StoreConfig,
    replicated: Option<Arc<Replica>>,
) -> Result<Coordinator, offsets::StoreError> {
    let dir = offsets_dir(data_dir);
    let (mut store, report) = OffsetsStore::open(&dir, store)?;
    if let Some(replica) = replicated {
        store.set_replicated(replica);
    }
    tracing::info!(
        generation = report.generation,
        records = report.records_replayed,
        skipped = report.records_skipped,
        live_keys = report.live_keys,
        elapsed_ms = report.elapsed.as_millis() as u64,
        "committed offsets loaded"
    );
    Ok(Coordinator::new(groups, store))
}

/// Session expiry, rebalance deadlines and offsets-log compaction, on a timer.
pub async fn run_timers(broker: Arc<Broker>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut compaction: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        ticker.tick().await;
        broker.groups.tick(tokio::time::Instant::now());
        let idle = compaction.as_ref().is_none_or(|h| h.is_finished());
        if idle && broker.groups.store().needs_compaction() {
            let b = broker.clone();
            compaction = Some(tokio::task::spawn_blocking(move || {
                match b.groups.store().compact() {
                    Ok(Some(r)) => tracing::info!(
                        generation = r.generation,
                        records_before = r.records_before,
                        live_keys = r.live_keys,
                        elapsed_ms = r.elapsed.as_millis() as u64,
                        "offsets log compacted"
                    ),
                    Ok(None) => {}
                    Err(e) => {
                        tracing::error!(error = %e, "offsets log compaction failed; the old log stays in use")
                    }
                }
            }));
        }
    }
}

/// Cluster mode: this broker coordinates every group while it leads the replicated offsets
/// group. On winning it, it waits until everything committed before its term is applied, rebuilds
/// the committed offsets from the group's log, forgets members (they rejoin) and serves; on
/// losing it, it stops serving at once (requests get NOT_COORDINATOR).
pub async fn follow_coordinator_leadership(broker: Arc<Broker>, replica: Arc<Replica>) {
    let mut metrics = replica.partition.raft().metrics();
    loop {
        let (leading, term) = {
            let m = metrics.borrow_and_update();
            (m.state == openraft::ServerState::Leader, m.current_term)
        };
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
                    match read_all(&replica) {
                        Ok(batches) => {
                            broker.groups.forget_members();
                            let (records, skipped) = store.rebuild(batches, term);
                            tracing::info!(term, records, skipped, "group coordinator: committed offsets rebuilt from the replicated log");
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "cannot read the replicated offsets log; not coordinating");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
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
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Every committed batch of the replicated offsets log.
fn read_all(replica: &Replica) -> Result<Vec<bytes::Bytes>, kiln_raft::PartitionError> {
    let high_watermark = replica.partition.high_watermark();
    let mut offset = 0;
    let mut out = Vec::new();
    while offset < high_watermark {
        let batches = replica.partition.read(offset, REBUILD_READ_BYTES)?;
        let Some(last) = batches.last() else { break };
        let next = last.base_offset
            + kiln_log::BatchHeader::parse(&last.bytes)
                .map(|h| i64::from(h.record_count))
                .unwrap_or(1);
        out.extend(batches.into_iter().map(|b| b.bytes));
        if next <= offset {
            break;
        }
        offset = next;
    }
    Ok(out)
}
