//! The invariant checker, run once the replicas have converged (see the module docs of
//! `sim`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::batch::unstamped;
use super::{lock, SimReport, World};
use crate::partition::{ReadBatch, ReplicatedPartition};

pub(super) fn check(world: &World, leader: &ReplicatedPartition, report: &mut SimReport) {
    let mut s = lock(&world.shared);
    let mut v: Vec<String> = Vec::new();
    let final_log = match leader.read(0, usize::MAX) {
        Ok(b) => b,
        Err(e) => {
            v.push(format!("leader read failed: {e}"));
            Vec::new()
        }
    };
    // Order: contiguous offsets from 0, every batch valid.
    let mut expect = 0i64;
    let mut by_offset: BTreeMap<i64, &ReadBatch> = BTreeMap::new();
    for b in &final_log {
        if b.base_offset != expect {
            v.push(format!(
                "ORDER: batch at {} but expected {expect}",
                b.base_offset
            ));
        }
        match kiln_log::batch::validate_batches(&b.bytes) {
            Ok(batches) => {
                let count = batches.first().map_or(0, |x| x.header.record_count);
                expect = b.base_offset + i64::from(count);
            }
            Err(e) => v.push(format!("CORRUPT: batch at {}: {e}", b.base_offset)),
        }
        by_offset.insert(b.base_offset, b);
    }
    let hw = leader.high_watermark();
    if expect != hw {
        v.push(format!(
            "HW: log ends at {expect} but the high watermark is {hw}"
        ));
    }
    report.final_high_watermark = hw;
    // No acknowledged record lost.
    let mut seen_offsets = BTreeMap::new();
    for (n, ack, _, _, sent) in &s.acks {
        match by_offset.get(&ack.base_offset) {
            Some(b) if unstamped(&b.bytes) == unstamped(sent) => {}
            Some(_) => v.push(format!(
                "LOST acknowledged append {n}: offset {} holds other bytes",
                ack.base_offset
            )),
            None => v.push(format!(
                "LOST acknowledged append {n}: nothing at offset {} (log ends at {expect})",
                ack.base_offset
            )),
        }
        if let Some(other) = seen_offsets.insert(ack.base_offset, *n) {
            v.push(format!(
                "ORDER: appends {other} and {n} both acknowledged at offset {}",
                ack.base_offset
            ));
        }
    }
    // Real-time order of acknowledgements.
    for (n1, a1, _, done1, _) in &s.acks {
        for (n2, a2, began2, _, _) in &s.acks {
            if done1 < began2 && a1.base_offset >= a2.base_offset {
                v.push(format!(
                    "ORDER: append {n1} acknowledged before append {n2} started, but offsets {} >= {}",
                    a1.base_offset, a2.base_offset
                ));
            }
        }
    }
    // Every read served only data that is in the final log.
    for (node, b) in &s.reads {
        match by_offset.get(&b.base_offset) {
            Some(f) if unstamped(&f.bytes) == unstamped(&b.bytes) => {}
            _ => v.push(format!(
                "READ of data not in the final log: replica {node} served offset {}",
                b.base_offset
            )),
        }
    }
    report.reads_checked = s.reads.len();
    // Convergence.
    for r in world.up() {
        match r.read(0, usize::MAX) {
            Ok(batches) => {
                let same = batches.len() == final_log.len()
                    && batches.iter().zip(&final_log).all(|(a, b)| {
                        a.base_offset == b.base_offset && unstamped(&a.bytes) == unstamped(&b.bytes)
                    });
                if !same {
                    v.push(format!(
                        "CONVERGENCE: replica {} holds {} committed batches, the leader {}",
                        r.id(),
                        batches.len(),
                        final_log.len()
                    ));
                }
            }
            Err(e) => v.push(format!("replica {} read failed: {e}", r.id())),
        }
    }
    report.acknowledged = s.acks.len();
    report.failed_appends = s.failed;
    report.leaders = s.leaders.len();
    let mut summary = String::new();
    let _ = write!(
        summary,
        "check: {} acknowledged, {} failed, log end {expect}, {} leaders, {} reads, {} violations",
        s.acks.len(),
        s.failed,
        s.leaders.len(),
        s.reads.len(),
        v.len() + s.violations.len()
    );
    let ms = world.start.elapsed().as_millis();
    s.trace.push(format!("{ms:>6}ms {summary}"));
    s.violations.extend(v);
    report.trace = std::mem::take(&mut s.trace);
    report.violations = std::mem::take(&mut s.violations);
}
