//! Per-partition tuning knobs.

use std::time::Duration;

const DAY_MS: u64 = 24 * 60 * 60 * 1000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// Roll when the active segment would exceed this many bytes (at most `u32::MAX`: index positions are u32).
    pub segment_bytes: u64,
    /// Roll when the active segment's first append is older than this.
    pub segment_ms: u64,
    /// Delete closed segments whose largest timestamp is older than this; `None` keeps them forever.
    pub retention_ms: Option<u64>,
    /// Delete the oldest closed segments while the partition is larger than this.
    pub retention_bytes: Option<u64>,
    /// One sparse index entry per this many bytes of log.
    pub index_interval_bytes: u32,
    pub flush: FlushPolicy,
    /// At most this much fsynced data lies past the recovery checkpoint, which bounds the scan on open.
    pub checkpoint_interval_bytes: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            segment_ms: 7 * DAY_MS,
            retention_ms: Some(7 * DAY_MS),
            retention_bytes: None,
            index_interval_bytes: 4096,
            flush: FlushPolicy::EveryBatch,
            checkpoint_interval_bytes: 64 << 20,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushPolicy {
    /// Group commit: an append is durable once one fsync covers it (acks wait for it).
    EveryBatch,
    /// fsync on a timer; `wait_durable` returns at once (a crash may lose up to one interval).
    Interval(Duration),
}

impl LogConfig {
    /// Rejects settings the on-disk format cannot represent.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.segment_bytes < crate::BATCH_HEADER_LEN as u64
            || self.segment_bytes > u64::from(u32::MAX)
        {
            return Err(format!(
                "segment_bytes {} must be between {} and {} (index positions are u32)",
                self.segment_bytes,
                crate::BATCH_HEADER_LEN,
                u32::MAX
            ));
        }
        if let FlushPolicy::Interval(d) = self.flush {
            if d.is_zero() {
                return Err("flush interval must be positive".to_string());
            }
        }
        Ok(())
    }
}
