//! Topic and storage families: produce and fetch counters per topic, partitions, log size and
//! offsets per partition, fsync latency, and replication.

use kiln_log::stats::{fsync_latency, FSYNC_BUCKETS_SECONDS};
use kiln_prom::{Exposition, HistogramData, Kind};

use crate::server::Broker;
use crate::traffic::TrafficSnapshot;

type Pick = fn(&TrafficSnapshot) -> u64;

/// Per-topic counters. They start at 0 when the broker starts or the topic is created.
pub(super) const TRAFFIC_FAMILIES: [(&str, &str, Pick); 6] = [
    (
        "kiln_produce_requests_total",
        "Produce requests naming the topic (once per request, however many partitions).",
        |t| t.produce_requests,
    ),
    (
        "kiln_produce_records_total",
        "Records appended to the topic's partitions.",
        |t| t.produce_records,
    ),
    (
        "kiln_produce_bytes_total",
        "Record-batch bytes appended to the topic's partitions.",
        |t| t.produce_bytes,
    ),
    (
        "kiln_produce_errors_total",
        "Partition appends refused (invalid or oversized batch, unknown partition, failed log).",
        |t| t.produce_errors,
    ),
    (
        "kiln_fetch_requests_total",
        "Fetch requests naming the topic (once per request, however long it polled).",
        |t| t.fetch_requests,
    ),
    (
        "kiln_fetch_bytes_total",
        "Record-batch bytes returned to consumers from the topic.",
        |t| t.fetch_bytes,
    ),
];

pub(super) fn render(out: &mut Exposition, broker: &Broker) {
    let mut topics = broker.catalog.list();
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    let traffic: Vec<TrafficSnapshot> = topics.iter().map(|t| t.traffic.snapshot()).collect();
    for (name, help, pick) in TRAFFIC_FAMILIES {
        out.family(name, Kind::Counter, help);
        for (t, snap) in topics.iter().zip(&traffic) {
            out.sample(name, &[("topic", &t.name)], pick(snap));
        }
    }

    out.family(
        "kiln_topic_partitions",
        Kind::Gauge,
        "Partitions of each topic.",
    );
    for t in &topics {
        out.sample(
            "kiln_topic_partitions",
            &[("topic", &t.name)],
            t.partitions.len(),
        );
    }
    out.single(
        "kiln_partitions",
        Kind::Gauge,
        "Partitions on this broker, all topics (the committed-offsets log not included).",
        topics.iter().map(|t| t.partitions.len()).sum::<usize>(),
    );

    type LogPick = fn(&kiln_log::PartitionLog) -> u64;
    let per_partition: [(&str, &str, LogPick); 3] = [
        (
            "kiln_log_size_bytes",
            "Bytes of segment files of the partition (what retention.bytes limits).",
            |l| l.size_bytes(),
        ),
        (
            "kiln_log_start_offset",
            "First offset still in the partition (moves up as retention deletes segments).",
            |l| u64::try_from(l.log_start_offset()).unwrap_or(0),
        ),
        (
            "kiln_log_high_watermark",
            "The partition's high watermark: every offset below it is fsynced and readable.",
            |l| u64::try_from(l.durable_offset()).unwrap_or(0),
        ),
    ];
    for (name, help, pick) in per_partition {
        out.family(name, Kind::Gauge, help);
        for t in &topics {
            for (i, log) in t.partitions.iter().enumerate() {
                let partition = i.to_string();
                out.sample(
                    name,
                    &[("topic", &t.name), ("partition", &partition)],
                    pick(log),
                );
            }
        }
    }

    render_fsync(out);

    // Standalone: one replica per partition, so these are structural zeros, not measurements
    // (cluster mode exports the real figures, metrics/cluster.rs). Exported so dashboards and
    // alerts work the same in both modes.
    out.single(
        "kiln_under_replicated_partitions",
        Kind::Gauge,
        "Partitions with fewer in-sync replicas than configured. Always 0 on a standalone broker (one replica per partition, on this broker).",
        0u64,
    );
    out.single(
        "kiln_leader_changes_total",
        Kind::Counter,
        "Partition leadership changes on this broker. Always 0 on a standalone broker, which leads every partition it holds.",
        0u64,
    );
}

/// The fsync histogram: segment files and, in cluster mode, replica log files.
pub(super) fn render_fsync(out: &mut Exposition) {
    let fsync = fsync_latency();
    out.family(
        "kiln_log_fsync_duration_seconds",
        Kind::Histogram,
        "Time of each data fdatasync (segment group commits, rolls, closes; replica log appends) in this broker process.",
    );
    out.histogram(
        "kiln_log_fsync_duration_seconds",
        &[],
        &HistogramData {
            bounds: &FSYNC_BUCKETS_SECONDS,
            cumulative: &fsync.cumulative,
            count: fsync.count,
            sum: fsync.sum_seconds,
        },
    );
}
