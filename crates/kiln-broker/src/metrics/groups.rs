//! Consumer-group families: lag in records and seconds, retention risk, committed offsets,
//! members, and the committed-offsets log.

use kiln_prom::{Exposition, Kind};

use crate::groups::lag::PartitionLag;
use crate::server::Broker;

type Pick = fn(&PartitionLag) -> Option<f64>;

/// Lag families: (name, help, value). One series per (group, topic, partition) committed.
const LAG_FAMILIES: [(&str, &str, Pick); 5] = [
    (
        "kiln_group_lag_records",
        "Records between the group's committed offset and the high watermark.",
        |l| Some(l.lag_records as f64),
    ),
    (
        "kiln_group_lag_seconds",
        "Age of the group's first unconsumed record (0 when caught up).",
        |l| Some(l.lag_seconds),
    ),
    (
        "kiln_group_retention_fraction",
        "How far the first unconsumed record is through the topic's retention window; >= 1 means due for deletion or already deleted.",
        |l| l.retention_fraction,
    ),
    (
        "kiln_group_committed_offset",
        "The group's committed offset (the next record it will read).",
        |l| Some(l.committed as f64),
    ),
    (
        "kiln_group_offsets_lost",
        "1 when the committed offset is below the log start (records deleted before the group read them).",
        |l| Some(if l.lost { 1.0 } else { 0.0 }),
    ),
];

pub(super) fn render(out: &mut Exposition, broker: &Broker, lags: &[PartitionLag]) {
    for (name, help, pick) in LAG_FAMILIES {
        out.family(name, Kind::Gauge, help);
        for l in lags {
            if let Some(v) = pick(l) {
                let partition = l.partition.to_string();
                out.sample(
                    name,
                    &[
                        ("group", &l.group),
                        ("topic", &l.topic),
                        ("partition", &partition),
                    ],
                    v,
                );
            }
        }
    }
    out.family(
        "kiln_group_members",
        Kind::Gauge,
        "Live members of each group.",
    );
    for (group, members) in broker.groups.member_counts() {
        out.sample("kiln_group_members", &[("group", &group)], members);
    }
    let (records, live, skipped) = broker.groups.store().stats();
    out.single(
        "kiln_offsets_log_records",
        Kind::Gauge,
        "Commit records applied to this broker's committed-offsets table since it started or last restored a snapshot.",
        records,
    );
    out.single(
        "kiln_offsets_live_keys",
        Kind::Gauge,
        "Committed offsets held (group, topic, partition).",
        live,
    );
    out.single(
        "kiln_offsets_records_skipped",
        Kind::Gauge,
        "Records of the committed-offsets log that did not parse (written by a newer version) and were skipped.",
        skipped,
    );
}
