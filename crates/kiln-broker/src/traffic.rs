//! Per-topic traffic counters, read by `metrics`. They live in the topic itself, so only topics
//! that exist get series (a client naming random topics cannot grow them), a deleted topic's
//! series end with it, and the hot paths pay a few relaxed atomic adds and no lookup.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct TopicTraffic {
    /// Produce requests that named this topic (counted once per request, not per partition).
    pub produce_requests: AtomicU64,
    /// Records and record-batch bytes appended to the log.
    pub produce_records: AtomicU64,
    pub produce_bytes: AtomicU64,
    /// Partition appends refused (bad batch, too large, unknown partition, poisoned log...).
    pub produce_errors: AtomicU64,
    /// Fetch requests that named this topic (counted once per request, however long it polled).
    pub fetch_requests: AtomicU64,
    /// Record-batch bytes returned to consumers.
    pub fetch_bytes: AtomicU64,
}

/// A copy of one topic's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrafficSnapshot {
    pub produce_requests: u64,
    pub produce_records: u64,
    pub produce_bytes: u64,
    pub produce_errors: u64,
    pub fetch_requests: u64,
    pub fetch_bytes: u64,
}

impl TopicTraffic {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> TrafficSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TrafficSnapshot {
            produce_requests: get(&self.produce_requests),
            produce_records: get(&self.produce_records),
            produce_bytes: get(&self.produce_bytes),
            produce_errors: get(&self.produce_errors),
            fetch_requests: get(&self.fetch_requests),
            fetch_bytes: get(&self.fetch_bytes),
        }
    }
}
