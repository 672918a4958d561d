//! Per-partition tuning knobs.

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
    /// At most this much fsynced data lies past a segment's checkpoint, which bounds the scan
    /// on open.
    pub checkpoint_interval_bytes: u64,
    /// CRC-check every segment on open, not only what lies past the checkpoints (also done
    /// once after a read found damage: see `Log::read`).
    pub verify_all_on_open: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            segment_ms: 7 * DAY_MS,
            retention_ms: Some(7 * DAY_MS),
            retention_bytes: None,
            index_interval_bytes: 4096,
            checkpoint_interval_bytes: 64 << 20,
            verify_all_on_open: false,
        }
    }
}

impl LogConfig {
    /// Rejects settings the on-disk format cannot represent.
    pub(crate) fn check(&self) -> Result<(), String> {
        let min = crate::header::HEADER_LEN + crate::BATCH_HEADER_LEN as u64;
        if self.segment_bytes < min || self.segment_bytes > u64::from(u32::MAX) {
            return Err(format!(
                "segment_bytes {} must be between {min} and {} (index positions are u32)",
                self.segment_bytes,
                u32::MAX
            ));
        }
        if self.index_interval_bytes == 0 {
            return Err("index_interval_bytes must be positive".to_string());
        }
        Ok(())
    }
}
