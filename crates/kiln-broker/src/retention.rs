//! Periodic retention: whole segments are deleted by age and size, never on read.

use std::sync::Arc;
use std::time::Duration;

use crate::server::Broker;
use crate::time::now_ms;

pub async fn run(broker: Arc<Broker>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let broker = broker.clone();
        // Deleting files is blocking work; keep it off the request threads.
        let joined = tokio::task::spawn_blocking(move || apply_once(&broker)).await;
        if let Err(e) = joined {
            tracing::error!(error = %e, "retention pass failed to run");
        }
    }
}

pub fn apply_once(broker: &Broker) {
    let now = now_ms();
    for topic in broker.catalog.list() {
        for (index, log) in topic.partitions.iter().enumerate() {
            match log.apply_retention(now) {
                Ok(report) if report.segments_deleted > 0 => tracing::info!(
                    topic = %topic.name,
                    partition = index,
                    segments = report.segments_deleted,
                    bytes = report.bytes_deleted,
                    log_start_offset = report.log_start_offset,
                    "retention deleted segments"
                ),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(topic = %topic.name, partition = index, error = %e, "retention failed")
                }
            }
        }
    }
}
