//! Topic, storage and replication families: produce and fetch counters per topic, partitions,
//! log size and offsets per partition replica held here, fsync latency, under-replicated
//! partitions, leader changes, leadership and the controller.

use kiln_log::stats::{fsync_latency, FSYNC_BUCKETS_SECONDS};
use kiln_prom::{Exposition, HistogramData, Kind};

use crate::cluster::Cluster;
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

pub(super) fn render(out: &mut Exposition, cluster: &Cluster) {
    let topics = cluster.topics();
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
            t.assignments.len(),
        );
    }
    // (topic, partition, replica) for every topic partition held here.
    let mut held = Vec::new();
    for t in &topics {
        for index in 0..t.partition_count() {
            if let Some(r) = cluster.partition(t, index) {
                held.push((t.name.clone(), index.to_string(), r));
            }
        }
    }
    out.single(
        "kiln_partitions",
        Kind::Gauge,
        "Partition replicas on this broker, all topics (internal groups not included).",
        held.len(),
    );
    out.family(
        "kiln_log_size_bytes",
        Kind::Gauge,
        "Bytes of the partition replica's segment files on this broker (what retention.bytes limits).",
    );
    for (topic, partition, r) in &held {
        out.sample(
            "kiln_log_size_bytes",
            &[("topic", topic), ("partition", partition)],
            r.partition.size_bytes(),
        );
    }
    out.family(
        "kiln_log_start_offset",
        Kind::Gauge,
        "First offset still in the partition (retention moves it, the same on every replica once applied).",
    );
    for (topic, partition, r) in &held {
        out.sample(
            "kiln_log_start_offset",
            &[("topic", topic), ("partition", partition)],
            u64::try_from(r.partition.log_start_offset()).unwrap_or(0),
        );
    }
    out.family(
        "kiln_log_high_watermark",
        Kind::Gauge,
        "The partition's high watermark as this replica knows it: every offset below it is fsynced on a majority.",
    );
    for (topic, partition, r) in &held {
        out.sample(
            "kiln_log_high_watermark",
            &[("topic", topic), ("partition", partition)],
            u64::try_from(r.partition.high_watermark()).unwrap_or(0),
        );
    }
    out.family(
        "kiln_partition_leader",
        Kind::Gauge,
        "1 when this broker leads the partition, else 0.",
    );
    for (topic, partition, r) in &held {
        out.sample(
            "kiln_partition_leader",
            &[("topic", topic), ("partition", partition)],
            u64::from(r.is_leader()),
        );
    }
    render_fsync(out);
    let under = held
        .iter()
        .filter(|(_, _, r)| r.is_leader() && r.in_sync().len() < r.members().len())
        .count();
    out.single(
        "kiln_under_replicated_partitions",
        Kind::Gauge,
        "Partitions this broker leads whose in-sync replicas are fewer than their replicas.",
        under,
    );
    let not_preferred = held
        .iter()
        .filter(|(_, _, r)| r.is_leader() && r.members().first() != Some(&r.node_id))
        .count();
    out.single(
        "kiln_preferred_leader_imbalance",
        Kind::Gauge,
        "Partitions this broker leads whose preferred replica (their first) is another broker: leadership the leader balance (cluster.auto_leader_rebalance) hands back once that broker is in sync.",
        not_preferred,
    );
    render_moves(out, cluster);
    let changes: u64 = cluster.replicas().iter().map(|r| r.leader_changes()).sum();
    out.single(
        "kiln_leader_changes_total",
        Kind::Counter,
        "Leader changes seen by this broker's replicas (partitions, the metadata and the offsets groups) since it started.",
        changes,
    );
    let lapses: u64 = cluster.replicas().iter().map(|r| r.lease_lapses()).sum();
    out.single(
        "kiln_leader_lease_lapses_total",
        Kind::Counter,
        "Times a replica of this broker, leading, lost its lease in its term: no quorum acknowledged it within the lease, so it stopped serving clients until one did.",
        lapses,
    );
    out.single(
        "kiln_controller",
        Kind::Gauge,
        "1 when this broker is the controller (leader of the cluster metadata group), else 0.",
        u64::from(cluster.metadata.is_leader()),
    );
}

/// The fsync histogram: every segment, index, vote and state file fsync of the process.
pub(super) fn render_fsync(out: &mut Exposition) {
    let fsync = fsync_latency();
    out.family(
        "kiln_log_fsync_duration_seconds",
        Kind::Histogram,
        "Time of each fdatasync of a log segment, index, vote or state file in this broker process.",
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

/// Replica moves (`cluster/moves.rs`): how many are under way, and on the leader of each, how
/// many entries each replica being added still lacks.
fn render_moves(out: &mut Exposition, cluster: &Cluster) {
    let moves = cluster.moves_under_way();
    out.single(
        "kiln_replica_moves",
        Kind::Gauge,
        "Replica moves under way in the cluster (AlterPartitionReassignments, decommissions).",
        moves.len(),
    );
    out.family(
        "kiln_replica_move_entries_behind",
        Kind::Gauge,
        "On the leader of a group being moved: Raft entries a replica being added still lacks (its learner's matched entry against the leader's last).",
    );
    for m in &moves {
        let Some(replica) = cluster.replica_of(&m.topic, m.partition) else {
            continue;
        };
        if !replica.is_leader() {
            continue;
        }
        let metrics = replica.partition.raft().metrics();
        let metrics = metrics.borrow();
        let (Some(last), Some(progress)) = (metrics.last_log_index, &metrics.replication) else {
            continue;
        };
        let partition = m.partition.to_string();
        for broker in m.adding() {
            let Some(node) = crate::cluster::replica::node(broker) else {
                continue;
            };
            let matched = progress.get(&node).copied().flatten().map(|l| l.index);
            let behind = matched.map_or(last + 1, |i| last.saturating_sub(i));
            out.sample(
                "kiln_replica_move_entries_behind",
                &[
                    ("topic", &m.topic),
                    ("partition", &partition),
                    ("broker", &broker.to_string()),
                ],
                behind,
            );
        }
    }
}
