//! Periodic retention: on every partition this broker leads, the closed segments that are past
//! the topic's `retention.ms` or beyond its `retention.bytes` are dropped by proposing a new log
//! start through Raft. Every replica applies it at the same point of the log, so the log start
//! is the same everywhere; each then deletes its whole segments below it, and a follower that
//! lacked them catches up from a snapshot of the new start. Reads never delete.

use std::sync::Arc;
use std::time::Duration;

use crate::server::Broker;
use crate::time::now_ms;

/// Longest wait for one log-start command to be committed.
const PROPOSE_WAIT: Duration = Duration::from_secs(10);

pub async fn run(broker: Arc<Broker>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        apply_once(&broker).await;
    }
}

pub async fn apply_once(broker: &Broker) {
    let now = now_ms();
    for topic in broker.cluster.topics() {
        let log = &topic.settings.log;
        // Without retention limits the timer still purges segments DeleteRecords emptied.
        let retention_ms = u64::try_from(log.retention_ms).ok();
        let retention_bytes = u64::try_from(log.retention_bytes).ok();
        for index in 0..topic.partition_count() {
            let Some(replica) = broker.cluster.partition(&topic, index) else {
                continue;
            };
            if !replica.is_leader() {
                continue;
            }
            let Some(command) =
                replica
                    .partition
                    .retention_command(now, retention_ms, retention_bytes)
            else {
                continue;
            };
            let kiln_raft::Command::LogStart {
                kafka_offset: log_start_offset,
                index: through_index,
                ..
            } = command
            else {
                debug_assert!(false, "retention_command proposes log starts only");
                continue;
            };
            let receiver = replica.proposer().submit_command(command);
            match tokio::time::timeout(PROPOSE_WAIT, receiver).await {
                Ok(Ok(Ok(_))) => {
                    tracing::info!(topic = %topic.name, partition = index, log_start_offset, through_index, "retention moved the log start")
                }
                Ok(Ok(Err(e))) => {
                    tracing::warn!(topic = %topic.name, partition = index, error = %e, "retention's log start was not committed")
                }
                Ok(Err(_)) => {
                    tracing::warn!(topic = %topic.name, partition = index, "retention: the partition's proposer stopped")
                }
                Err(_) => {
                    tracing::warn!(topic = %topic.name, partition = index, "retention: the log start was not committed in time")
                }
            }
        }
    }
}
