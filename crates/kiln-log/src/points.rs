//! Deciding where the sparse index points go, for appends and for recovery scans alike.

use crate::batch::BatchHeader;
use crate::index::{OffsetPoint, TimePoint};
use crate::segment::Segment;
use crate::LogError;

/// Bytes of log since the last point of each index.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PointBuilder {
    pub since_offset_point: u64,
    pub since_time_point: u64,
}

impl PointBuilder {
    /// Records the stored batch `h` at `pos` of `seg`, belonging to the entry with relative index
    /// `rel_index` (`starts_entry`: its first batch), adding index points as they fall due.
    pub fn observe(
        &mut self,
        seg: &Segment,
        h: &BatchHeader,
        pos: u64,
        rel_index: u64,
        starts_entry: bool,
        interval: u64,
    ) -> Result<(), LogError> {
        let len = h.total_len() as u64;
        let (Ok(pos32), Ok(rel_index32), Some(rel_kafka)) = (
            u32::try_from(pos),
            u32::try_from(rel_index),
            seg.rel_kafka(h.base_offset),
        ) else {
            // The appender rolls before any of these could overflow.
            return Err(seg.corrupt(pos, "batch outside the segment's u32 range"));
        };
        if self.since_offset_point >= interval {
            seg.offsets.push(OffsetPoint {
                rel_kafka,
                rel_index: rel_index32,
                pos: pos32,
                starts_entry,
            })?;
            self.since_offset_point = 0;
        }
        self.since_offset_point += len;
        // Control batches carry the time they were appended, not a producer's: a retention
        // command or a leader's blank entry must not make an old segment look new.
        if !h.is_control() {
            seg.observe_ts(h.max_timestamp);
            let max = seg
                .time_index_max
                .load(std::sync::atomic::Ordering::Acquire);
            if h.max_timestamp > max {
                seg.time_index_max
                    .store(h.max_timestamp, std::sync::atomic::Ordering::Release);
                if seg.times.count() == 0 || self.since_time_point >= interval {
                    seg.times.push(TimePoint {
                        ts: h.max_timestamp,
                        rel_kafka,
                    })?;
                    self.since_time_point = 0;
                }
            }
        }
        self.since_time_point += len;
        Ok(())
    }
}
