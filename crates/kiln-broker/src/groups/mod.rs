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

use crate::server::Broker;

/// Where the offsets store lives under the data directory.
pub fn offsets_dir(data_dir: &Path) -> std::path::PathBuf {
    data_dir.join("internal").join("consumer-offsets")
}

/// Opens the offsets store (replaying it) and builds the coordinator. Blocking.
pub fn open(
    data_dir: &Path,
    groups: GroupConfig,
    store: StoreConfig,
) -> Result<Coordinator, offsets::StoreError> {
    let dir = offsets_dir(data_dir);
    let (store, report) = OffsetsStore::open(&dir, store)?;
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
