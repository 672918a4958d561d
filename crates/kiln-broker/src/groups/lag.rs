//! Lag and retention risk per group and partition, computed from the committed offsets and the
//! partition logs; a timer task logs warnings, `metrics` exposes the same numbers.
//!
//! - lag in records = high watermark - committed offset
//! - lag in seconds = now - timestamp of the first unconsumed record (the record at the committed
//!   offset; for a compressed batch, the batch's first timestamp)
//! - retention fraction = age of that record / the topic's retention.ms, and, when
//!   retention.bytes is set, the estimated bytes from the committed offset to the end /
//!   retention.bytes (the larger of the two). Retention deletes a segment only once its newest
//!   record is older than retention.ms, so the time fraction reaches 1 no later than the data
//!   is deleted: it warns early, never late.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::records::RecordBatchDecoder;
use kiln_log::BatchHeader;
use kiln_raft::ReplicatedPartition;
use tokio::time::Instant;

use crate::cluster::Cluster;
use crate::server::Broker;
use crate::time::now_ms;

/// Attributes bits 0-2: the compression codec; 0 is none.
const COMPRESSION_MASK: i16 = 0b111;

#[derive(Debug, Clone)]
pub struct PartitionLag {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    pub committed: i64,
    pub log_start: i64,
    pub high_watermark: i64,
    pub lag_records: i64,
    pub lag_seconds: f64,
    /// Timestamp of the first unconsumed record still in the log, if there is one.
    pub first_unconsumed_ms: Option<i64>,
    pub retention_ms: Option<i64>,
    /// How far the first unconsumed record is through the retention window (1.0 = due for
    /// deletion); `None` when the topic keeps data forever.
    pub retention_fraction: Option<f64>,
    /// retention.ms minus the record's age; negative once it is due.
    pub time_left_ms: Option<i64>,
    /// The committed offset is below the log start: records were deleted before the group read them.
    pub lost: bool,
}

/// Lag of every committed offset whose topic partition still exists here, against this
/// broker's replica (the leader's high watermark, or a follower's a moment behind it).
pub fn compute(broker: &Broker) -> Vec<PartitionLag> {
    let now = now_ms();
    let cluster: &Cluster = &broker.cluster;
    let mut out = Vec::new();
    for (key, committed) in broker.groups.store().snapshot() {
        let Some(topic) = cluster.topic(&key.topic) else {
            continue;
        };
        let Some(replica) = cluster.partition(&topic, key.partition) else {
            continue;
        };
        out.push(partition_lag(
            &replica.partition,
            key.group,
            key.topic,
            key.partition,
            committed.offset,
            topic.settings.log.retention_ms,
            topic.settings.log.retention_bytes,
            now,
        ));
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn partition_lag(
    log: &ReplicatedPartition,
    group: String,
    topic: String,
    partition: i32,
    committed: i64,
    retention_ms: i64,
    retention_bytes: i64,
    now: i64,
) -> PartitionLag {
    let log_start = log.log_start_offset();
    let high_watermark = log.high_watermark();
    let lost = committed < log_start;
    let lag_records = (high_watermark - committed).max(0);
    let first_unread = committed.max(log_start);
    let first_unconsumed_ms = if first_unread < high_watermark {
        record_timestamp(log, first_unread, high_watermark)
    } else {
        None
    };
    let age_ms = first_unconsumed_ms.map(|ts| (now - ts).max(0));
    let lag_seconds = age_ms.map_or(0.0, |a| a as f64 / 1000.0);
    let retention_ms = (retention_ms > 0).then_some(retention_ms);
    let time_fraction = match (retention_ms, age_ms) {
        (Some(r), Some(age)) => Some(age as f64 / r as f64),
        (Some(_), None) => Some(0.0),
        _ => None,
    };
    let bytes_fraction = (retention_bytes > 0).then(|| {
        let total = (high_watermark - log_start).max(1) as f64;
        let unread = (high_watermark - first_unread).max(0) as f64;
        log.size_bytes() as f64 * (unread / total) / retention_bytes as f64
    });
    let mut retention_fraction = match (time_fraction, bytes_fraction) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    if lost {
        retention_fraction = Some(retention_fraction.unwrap_or(1.0).max(1.0));
    }
    PartitionLag {
        group,
        topic,
        partition,
        committed,
        log_start,
        high_watermark,
        lag_records,
        lag_seconds,
        first_unconsumed_ms,
        retention_ms,
        retention_fraction,
        time_left_ms: match (retention_ms, age_ms) {
            (Some(r), Some(age)) => Some(r - age),
            _ => None,
        },
        lost,
    }
}

/// The timestamp of the record at `offset`: exact for uncompressed batches, the batch's first
/// timestamp for compressed ones (decompressing here would let one producer make the broker
/// allocate without bound).
fn record_timestamp(log: &ReplicatedPartition, offset: i64, high_watermark: i64) -> Option<i64> {
    if offset >= high_watermark {
        return None;
    }
    let read = log.read(offset, 1).ok()?;
    let header = BatchHeader::parse(&read.records).ok()?;
    let fallback = (header.base_timestamp >= 0).then_some(header.base_timestamp);
    if header.attributes & COMPRESSION_MASK != 0 {
        return fallback;
    }
    let mut bytes = read
        .records
        .slice(..header.total_len().min(read.records.len()));
    let Ok(set) = RecordBatchDecoder::decode(&mut bytes) else {
        return fallback;
    };
    set.records
        .iter()
        .find(|r| r.offset >= offset)
        .map(|r| r.timestamp)
        .filter(|ts| *ts >= 0)
        .or(fallback)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Ok,
    Warn,
    Lost,
}

struct Alerted {
    level: Level,
    logged: Instant,
}

/// Logs a WARN when a group's first unconsumed record is past `warn_fraction` of its topic's
/// retention, an ERROR once the committed offset is below the log start; repeats every `repeat`
/// while it lasts and logs an INFO when it clears.
pub async fn run_alerts(
    broker: Arc<Broker>,
    interval: Duration,
    warn_fraction: f64,
    repeat: Duration,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut alerted: HashMap<(String, String, i32), Alerted> = HashMap::new();
    loop {
        ticker.tick().await;
        let b = broker.clone();
        let lags = match tokio::task::spawn_blocking(move || compute(&b)).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "group lag check failed to run");
                continue;
            }
        };
        let now = Instant::now();
        let mut seen = HashMap::with_capacity(lags.len());
        for lag in &lags {
            let level = if lag.lost {
                Level::Lost
            } else if lag.retention_fraction.is_some_and(|f| f >= warn_fraction) {
                Level::Warn
            } else {
                Level::Ok
            };
            let key = (lag.group.clone(), lag.topic.clone(), lag.partition);
            let previous = alerted.remove(&key);
            let due = match &previous {
                None => level != Level::Ok,
                Some(p) => {
                    level > p.level
                        || (level != Level::Ok && now.saturating_duration_since(p.logged) >= repeat)
                }
            };
            if due {
                log_alert(lag, level, warn_fraction);
            } else if level == Level::Ok && previous.as_ref().is_some_and(|p| p.level != Level::Ok)
            {
                tracing::info!(group = %lag.group, topic = %lag.topic, partition = lag.partition, committed_offset = lag.committed,
                    "group offset no longer near retention");
            }
            let logged = if due {
                now
            } else {
                previous.map_or(now, |p| p.logged)
            };
            if level != Level::Ok {
                seen.insert(key, Alerted { level, logged });
            }
        }
        alerted = seen;
    }
}

fn log_alert(lag: &PartitionLag, level: Level, warn_fraction: f64) {
    let age_ms = lag.first_unconsumed_ms.map(|ts| (now_ms() - ts).max(0));
    match level {
        Level::Lost => tracing::error!(
            group = %lag.group,
            topic = %lag.topic,
            partition = lag.partition,
            committed_offset = lag.committed,
            log_start_offset = lag.log_start,
            records_lost = lag.log_start - lag.committed,
            "group offset below log start: unconsumed records were deleted by retention before the group read them"
        ),
        Level::Warn => tracing::warn!(
            group = %lag.group,
            topic = %lag.topic,
            partition = lag.partition,
            committed_offset = lag.committed,
            lag_records = lag.lag_records,
            oldest_unconsumed_age_ms = age_ms,
            retention_ms = lag.retention_ms,
            time_left_ms = lag.time_left_ms,
            retention_fraction = lag.retention_fraction,
            warn_fraction,
            "group offset near retention: unconsumed records will soon be deleted"
        ),
        Level::Ok => {}
    }
}
