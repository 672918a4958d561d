//! The invariant checker, run once the replicas of both groups have converged (see the module
//! docs of `sim`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::batch::unstamped;
use super::offsets::OffsetsShared;
use super::{lock, split, Ack, ReadBatch, SimReport, World, DATA, OFFSETS};
use crate::partition::ReplicatedPartition;
use crate::types::NodeId;

/// The idempotent producer's batches: never refused, and each in the leader's log at most once
/// (the no-loss check covers the acknowledged ones, which are among the client's acks).
fn check_idempotent(leader: &ReplicatedPartition, refusals: &[String], v: &mut Vec<String>) {
    for r in refusals {
        v.push(format!("IDEMPOTENCE: {r}"));
    }
    let Ok(log) = committed(leader) else { return };
    let mut seen: BTreeMap<(i64, i32), i64> = BTreeMap::new();
    for b in &log {
        let Ok(h) = kiln_log::BatchHeader::parse(&b.bytes) else {
            continue;
        };
        if h.producer_id < 0 {
            continue;
        }
        if let Some(first) = seen.insert((h.producer_id, h.base_sequence), b.base_offset) {
            v.push(format!(
                "DUPLICATE: producer {} sequence {} written at offsets {first} and {}",
                h.producer_id, h.base_sequence, b.base_offset
            ));
        }
    }
}

pub(super) fn check(
    world: &World,
    leader: &ReplicatedPartition,
    off_leader: &ReplicatedPartition,
    report: &mut SimReport,
) {
    let mut s = lock(&world.shared);
    let mut v: Vec<String> = Vec::new();
    let data = check_group(
        "",
        leader,
        &world.up_in(DATA),
        &s.acks,
        &s.reads,
        false,
        &mut v,
    );
    report.final_high_watermark = data.high_watermark;
    check_idempotent(leader, &s.idempotent_refusals, &mut v);
    report.idempotent_acknowledged = s.idempotent_acked;
    report.reads_checked = s.reads.len();
    let off = check_group(
        " (offsets group)",
        off_leader,
        &world.up_in(OFFSETS),
        &s.off.acks,
        &s.off.reads,
        true,
        &mut v,
    );
    check_tables(&s.off, off_leader, &world.up_in(OFFSETS), &mut v);
    report.offsets_high_watermark = off.high_watermark;
    check_offsets(&s.off, &mut v);
    report.lease_reads_checked = super::stale::check_lease_reads(&s, world.start, &mut v);
    report.acknowledged = s.acks.len();
    report.failed_appends = s.failed;
    report.leaders = s.leaders[DATA].len();
    report.commits_acknowledged = s.off.commits.len();
    report.failed_commits = s.off.failed;
    report.rebuilds = s.off.rebuilds.len();
    report.offsets_leaders = s.leaders[OFFSETS].len();
    let mut summary = String::new();
    let _ = write!(
        summary,
        "check: {} acknowledged, {} failed, log end {}, {} leaders, {} reads; offsets: {} commits acknowledged, {} failed, {} rebuilds, log end {}, {} leaders; {} violations",
        s.acks.len(),
        s.failed,
        data.end,
        s.leaders[DATA].len(),
        s.reads.len(),
        s.off.commits.len(),
        s.off.failed,
        s.off.rebuilds.len(),
        off.end,
        s.leaders[OFFSETS].len(),
        v.len() + s.violations.len()
    );
    let ms = world.start.elapsed().as_millis();
    s.trace.push(format!("{ms:>6}ms {summary}"));
    s.violations.extend(v);
    report.trace = std::mem::take(&mut s.trace);
    report.violations = std::mem::take(&mut s.violations);
}

/// Where one group's final log ends.
struct GroupEnd {
    end: i64,
    high_watermark: i64,
}

/// Every replica of the offsets group applied the same table as its leader (each compacts its
/// own log, so their logs differ; their tables may not).
fn check_tables(
    off: &OffsetsShared,
    leader: &ReplicatedPartition,
    replicas: &[ReplicatedPartition],
    v: &mut Vec<String>,
) {
    let Some(want) = off.tables.get(&leader.id()).map(|t| t.values()) else {
        v.push("CONVERGENCE (offsets group): the leader has no table".to_string());
        return;
    };
    for r in replicas {
        let got = off.tables.get(&r.id()).map(|t| t.values());
        if got.as_ref() != Some(&want) {
            v.push(format!(
                "CONVERGENCE (offsets group): replica {} applied {got:?}, the leader {want:?}",
                r.id()
            ));
        }
    }
}

/// Every committed batch of `r` from its log start.
fn committed(r: &ReplicatedPartition) -> Result<Vec<ReadBatch>, String> {
    let mut out = Vec::new();
    let mut offset = r.log_start_offset();
    loop {
        let read = r.read(offset, 1 << 20).map_err(|e| e.to_string())?;
        if read.records.is_empty() {
            return Ok(out);
        }
        offset = read.next_offset;
        out.extend(split(&read.records));
    }
}

/// The invariants every group keeps: no acknowledged record lost (unless retention removed it),
/// order, no read of data not in the final log, convergence, one log start on every replica.
/// `tag` names the group in violations.
fn check_group(
    tag: &str,
    leader: &ReplicatedPartition,
    replicas: &[ReplicatedPartition],
    acks: &[Ack],
    reads: &[(NodeId, ReadBatch)],
    compacted: bool,
    v: &mut Vec<String>,
) -> GroupEnd {
    let log_start = leader.log_start_offset();
    let final_log = match committed(leader) {
        Ok(b) => b,
        Err(e) => {
            v.push(format!("leader read failed{tag}: {e}"));
            Vec::new()
        }
    };
    // Order: contiguous offsets from the log start, every batch valid.
    let mut expect = final_log.first().map_or(log_start, |b| b.base_offset);
    if expect > log_start {
        v.push(format!(
            "ORDER{tag}: the log starts at {log_start} but the first batch is at {expect}"
        ));
    }
    let mut by_offset: BTreeMap<i64, &ReadBatch> = BTreeMap::new();
    for b in &final_log {
        if b.base_offset != expect {
            v.push(format!(
                "ORDER{tag}: batch at {} but expected {expect}",
                b.base_offset
            ));
        }
        match kiln_log::batch::validate_batches(&b.bytes) {
            Ok(batches) => {
                let count = batches.first().map_or(0, |x| x.header.record_count);
                expect = b.base_offset + i64::from(count);
            }
            Err(e) => v.push(format!("CORRUPT{tag}: batch at {}: {e}", b.base_offset)),
        }
        by_offset.insert(b.base_offset, b);
    }
    let hw = leader.high_watermark();
    if expect != hw {
        v.push(format!(
            "HW{tag}: log ends at {expect} but the high watermark is {hw}"
        ));
    }
    // No acknowledged record lost.
    let mut seen_offsets = BTreeMap::new();
    for (n, ack, _, _, sent) in acks {
        if ack.base_offset < log_start {
            // Retention removed it (after it was acknowledged and committed).
            continue;
        }
        match by_offset.get(&ack.base_offset) {
            Some(b) if unstamped(&b.bytes) == unstamped(sent) => {}
            Some(_) => v.push(format!(
                "LOST acknowledged append {n}{tag}: offset {} holds other bytes",
                ack.base_offset
            )),
            None => v.push(format!(
                "LOST acknowledged append {n}{tag}: nothing at offset {} (log ends at {expect})",
                ack.base_offset
            )),
        }
        if let Some(other) = seen_offsets.insert(ack.base_offset, *n) {
            v.push(format!(
                "ORDER{tag}: appends {other} and {n} both acknowledged at offset {}",
                ack.base_offset
            ));
        }
    }
    // Real-time order of acknowledgements.
    for (n1, a1, _, done1, _) in acks {
        for (n2, a2, began2, _, _) in acks {
            if done1 < began2 && a1.base_offset >= a2.base_offset {
                v.push(format!(
                    "ORDER{tag}: append {n1} acknowledged before append {n2} started, but offsets {} >= {}",
                    a1.base_offset, a2.base_offset
                ));
            }
        }
    }
    // Every read served only data that is in the final log.
    for (node, b) in reads {
        if b.base_offset < log_start {
            continue;
        }
        match by_offset.get(&b.base_offset) {
            Some(f) if unstamped(&f.bytes) == unstamped(&b.bytes) => {}
            _ => v.push(format!(
                "READ of data not in the final log{tag}: replica {node} served offset {}",
                b.base_offset
            )),
        }
    }
    // Convergence (a compacted group's logs differ by design: its tables are compared).
    for r in replicas.iter().filter(|_| !compacted) {
        if r.log_start_offset() != log_start {
            v.push(format!(
                "CONVERGENCE{tag}: replica {} starts its log at {}, the leader at {log_start}",
                r.id(),
                r.log_start_offset()
            ));
        }
        match committed(r) {
            Ok(batches) => {
                let same = batches.len() == final_log.len()
                    && batches.iter().zip(&final_log).all(|(a, b)| {
                        a.base_offset == b.base_offset && unstamped(&a.bytes) == unstamped(&b.bytes)
                    });
                if !same {
                    v.push(format!(
                        "CONVERGENCE{tag}: replica {} holds {} committed batches, the leader {}",
                        r.id(),
                        batches.len(),
                        final_log.len()
                    ));
                }
            }
            Err(e) => v.push(format!("replica {}{tag} read failed: {e}", r.id())),
        }
    }
    GroupEnd {
        end: expect,
        high_watermark: hw,
    }
}

/// Committed offsets: no acknowledged commit lost, and monotonic over the rebuilds (the last
/// rebuild is the final one, after healing).
fn check_offsets(off: &OffsetsShared, v: &mut Vec<String>) {
    if off.undecodable > 0 {
        v.push(format!(
            "CORRUPT (offsets group): rebuilds met {} undecodable batches or records",
            off.undecodable
        ));
    }
    let Some(last) = off.rebuilds.last() else {
        v.push("LIVENESS: no rebuild of the committed offsets".to_string());
        return;
    };
    // No acknowledged commit lost: in the final rebuild, and in every rebuild that began
    // after the acknowledgement.
    for (key, offset, acked_at) in &off.commits {
        let fin = last.values.get(key).copied().unwrap_or(-1);
        if fin < *offset {
            v.push(format!(
                "LOST COMMIT: {key}={offset} was acknowledged, the final rebuild has {fin}"
            ));
        }
        for r in off.rebuilds.iter().filter(|r| r.began >= *acked_at) {
            let seen = r.values.get(key).copied().unwrap_or(-1);
            if seen < *offset {
                v.push(format!(
                    "LOST COMMIT: {key}={offset} was acknowledged before rebuild {} (by replica {}, hw {}) began, which has {seen}",
                    r.n, r.by, r.high_watermark
                ));
            }
        }
    }
    // Monotonic, and never beyond what was submitted.
    for (key, &submitted) in &off.submitted {
        let mut prev: Option<(usize, i64)> = None;
        for r in &off.rebuilds {
            let seen = r.values.get(key).copied().unwrap_or(-1);
            if seen > submitted {
                v.push(format!(
                    "MONOTONIC: rebuild {} saw {key}={seen}, above the highest submitted ({submitted})",
                    r.n
                ));
            }
            if let Some((pn, pv)) = prev {
                if seen < pv {
                    v.push(format!(
                        "MONOTONIC: {key} went back from {pv} (rebuild {pn}) to {seen} (rebuild {} by replica {}, hw {})",
                        r.n, r.by, r.high_watermark
                    ));
                }
            }
            prev = Some((r.n, seen));
        }
    }
    for key in last.values.keys() {
        if !off.submitted.contains_key(key) {
            v.push(format!(
                "MONOTONIC: the final rebuild has {key}, which was never submitted"
            ));
        }
    }
}
