//! Cluster-mode families: the same topic and storage families as standalone, computed from the
//! replicated partitions this broker holds, and the real replication figures.

use kiln_prom::{Exposition, Kind};

use super::topics::{render_fsync, TRAFFIC_FAMILIES};
use crate::cluster::Cluster;
use crate::traffic::TrafficSnapshot;

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
        "Bytes of the partition replica's Raft log file on this broker.",
    );
    for (topic, partition, r) in &held {
        let size = std::fs::metadata(r.dir.join("raft.log")).map_or(0, |m| m.len());
        out.sample(
            "kiln_log_size_bytes",
            &[("topic", topic), ("partition", partition)],
            size,
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
        .filter(|(_, _, r)| r.is_leader() && r.in_sync().len() < r.members.len())
        .count();
    out.single(
        "kiln_under_replicated_partitions",
        Kind::Gauge,
        "Partitions this broker leads whose in-sync replicas are fewer than their replicas.",
        under,
    );
    let changes: u64 = cluster.replicas().iter().map(|r| r.leader_changes()).sum();
    out.single(
        "kiln_leader_changes_total",
        Kind::Counter,
        "Leader changes seen by this broker's replicas (partitions, the metadata and the offsets groups) since it started.",
        changes,
    );
    out.single(
        "kiln_controller",
        Kind::Gauge,
        "1 when this broker is the controller (leader of the cluster metadata group), else 0.",
        u64::from(cluster.metadata.is_leader()),
    );
}
