//! Process-wide fsync timing, for the broker's `/metrics`.
//!
//! Every data fsync of a segment (group commit, roll, close) is timed into one fixed-bucket
//! histogram shared by all logs in the process: the question an operator asks is "is this
//! disk slow", not "which partition". Plain atomics, so recording never blocks a flusher.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the histogram buckets, in seconds (0.1 ms … 1 s). A `+Inf` bucket is implied.
pub const FSYNC_BUCKETS_SECONDS: [f64; 13] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// The same bounds in nanoseconds, so recording compares integers.
const BUCKET_NANOS: [u64; 13] = [
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
];

struct Histogram {
    /// Non-cumulative: `buckets[i]` counts fsyncs in (bound[i-1], bound[i]]; the last slot is +Inf.
    buckets: [AtomicU64; 14],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

static FSYNC: Histogram = Histogram {
    buckets: [const { AtomicU64::new(0) }; 14],
    count: AtomicU64::new(0),
    sum_nanos: AtomicU64::new(0),
};

/// A copy of the fsync histogram at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct FsyncSnapshot {
    /// Cumulative counts, one per bound in [`FSYNC_BUCKETS_SECONDS`] (Prometheus `le` buckets).
    pub cumulative: [u64; 13],
    /// Every fsync timed (the `+Inf` bucket).
    pub count: u64,
    pub sum_seconds: f64,
}

/// Records one fsync's duration (also called by kiln-raft's replica log files).
pub fn record_fsync(took: Duration) {
    let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
    let slot = BUCKET_NANOS
        .iter()
        .position(|&bound| nanos <= bound)
        .unwrap_or(BUCKET_NANOS.len());
    FSYNC.buckets[slot].fetch_add(1, Ordering::Relaxed);
    FSYNC.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    // Count last: a concurrent snapshot may miss this fsync, but never counts it in `count`
    // without its bucket (it reads `count` first).
    FSYNC.count.fetch_add(1, Ordering::Release);
}

/// The fsync latency histogram of every log in this process since it started.
pub fn fsync_latency() -> FsyncSnapshot {
    let count = FSYNC.count.load(Ordering::Acquire);
    let mut cumulative = [0u64; 13];
    let mut running = 0u64;
    for (i, slot) in cumulative.iter_mut().enumerate() {
        running += FSYNC.buckets[i].load(Ordering::Relaxed);
        // Buckets read after `count` may hold newer fsyncs; keep `le` buckets <= count so the
        // exposition stays monotonic.
        *slot = running.min(count);
    }
    FsyncSnapshot {
        cumulative,
        count,
        sum_seconds: FSYNC.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_agree_and_buckets_are_cumulative() {
        for (s, n) in FSYNC_BUCKETS_SECONDS.iter().zip(BUCKET_NANOS) {
            assert_eq!((s * 1e9).round() as u64, n);
        }
        let before = fsync_latency();
        record_fsync(Duration::from_micros(50)); // first bucket
        record_fsync(Duration::from_millis(3)); // le=0.005
        record_fsync(Duration::from_secs(2)); // only +Inf
        let after = fsync_latency();
        // Other tests in this process fsync too, so compare at least the deltas we caused.
        assert!(after.count >= before.count + 3);
        assert!(after.cumulative[0] > before.cumulative[0]);
        assert!(after.cumulative[5] >= before.cumulative[5] + 2);
        assert!(after.sum_seconds >= before.sum_seconds + 2.0);
        assert!(after.cumulative.windows(2).all(|w| w[0] <= w[1]));
        assert!(after.cumulative[12] <= after.count);
    }
}
