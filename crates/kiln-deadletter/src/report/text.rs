//! The plain-text part. Every value is flattened to one line (control characters become
//! spaces), so a hostile message cannot forge lines of the report.

use std::fmt::Write as _;

use kiln_store::triage::TriageRecord;

use super::{
    attempts_words, component_attempts, counter_words, identity, measured_text, Report,
    EVIDENCE_LINES_INLINE_MAX, NODE_DETAIL_BYTES_MAX, REPORT_DETAIL_BYTES_MAX,
};
use crate::schedule::Schedule;

/// One line of text: control characters (a newline in a hostile message) become spaces.
pub(super) fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The plain-text part.
pub fn render_text(report: &Report, schedule: &Schedule) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Kiln dead-lettered nodes, report of {} ({})",
        report.day, report.zone
    );
    let _ = writeln!(
        out,
        "{} new, {} still open from earlier reports, {} resolved since the last report.\n",
        report.count_new(),
        report.count_still_open(),
        report.resolved.len()
    );
    if report.racks.is_empty() {
        let _ = writeln!(out, "No node is dead-lettered.");
    }
    let mut detail_left = REPORT_DETAIL_BYTES_MAX;
    for rack in &report.racks {
        let _ = writeln!(out, "== Rack {} ==", one_line(&rack.rack));
        if !rack.correlated.is_empty() {
            let _ = writeln!(out, "Correlated failures:");
            for c in &rack.correlated {
                let _ = writeln!(
                    out,
                    "  ! {}: {} {} on {} nodes: {}",
                    one_line(&c.scope),
                    one_line(&c.check),
                    one_line(&c.what),
                    c.hosts.len(),
                    one_line(&c.hosts.join(", "))
                );
            }
        }
        for (title, list) in [
            ("New", &rack.new),
            ("Still open (reported before)", &rack.still_open),
        ] {
            if list.is_empty() {
                continue;
            }
            let _ = writeln!(out, "-- {title} --");
            for t in list {
                let before = out.len();
                node_text(&mut out, report, t, schedule, detail_left > 0);
                detail_left = detail_left.saturating_sub(out.len() - before);
            }
        }
        out.push('\n');
    }
    if !report.resolved.is_empty() {
        let _ = writeln!(out, "== Resolved since the last report ==");
        for t in &report.resolved {
            if let Some(r) = &t.resolution {
                let _ = writeln!(
                    out,
                    "* {} (cycle {}) resolved by {} at {}: {}",
                    one_line(&t.hostname),
                    t.cycle,
                    one_line(&r.by),
                    schedule.local(r.at_ms),
                    one_line(&r.note)
                );
            }
        }
    }
    out
}

fn node_text(
    out: &mut String,
    report: &Report,
    t: &TriageRecord,
    schedule: &Schedule,
    details: bool,
) {
    let _ = writeln!(
        out,
        "* {}  BMC {}  cycle {}  {}",
        one_line(&t.hostname),
        one_line(&t.bmc_address),
        t.cycle,
        attempts_words(t)
    );
    let headline = t
        .analysis
        .as_ref()
        .map(|a| a.headline.clone())
        .unwrap_or_else(|| format!("action {}", t.action));
    let _ = writeln!(out, "  {}", one_line(&headline));
    let _ = writeln!(
        out,
        "  failures: first {}, last {}{}",
        schedule.local(t.first_failure_at_ms),
        schedule.local(t.last_failure_at_ms),
        t.first_reported_day
            .as_ref()
            .map(|d| format!("; first reported {d}"))
            .unwrap_or_default()
    );
    let link = report.node_link(&t.hostname);
    if let Some(l) = &link {
        let _ = writeln!(out, "  node page: {}", one_line(l));
    }
    if !details {
        let _ = writeln!(out, "  (details left out: the report is at its size bound)");
        return;
    }
    let Some(a) = &t.analysis else {
        checks_text(out, t);
        return;
    };
    for s in &a.suspects {
        let _ = writeln!(out, "  ! {}", one_line(&s.reason));
    }
    let start = out.len();
    let mut shown = 0;
    for c in &a.components {
        if out.len() - start > NODE_DETAIL_BYTES_MAX {
            break;
        }
        shown += 1;
        let _ = writeln!(
            out,
            "  [{}] {}",
            one_line(&identity(&c.component)),
            c.action.label()
        );
        let _ = writeln!(out, "    {}", one_line(&c.headline));
        for f in &c.findings {
            let _ = writeln!(
                out,
                "    - {} {} (attempts {}): {}",
                one_line(&f.check),
                one_line(&f.code),
                f.attempts
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                one_line(&f.message)
            );
            for line in f.evidence.iter().take(EVIDENCE_LINES_INLINE_MAX) {
                let _ = writeln!(out, "        | {}", one_line(line));
            }
            if f.evidence.len() > EVIDENCE_LINES_INLINE_MAX {
                let _ = writeln!(
                    out,
                    "        | ... {} more lines on the node page",
                    f.evidence.len() - EVIDENCE_LINES_INLINE_MAX
                );
            }
        }
        let _ = writeln!(out, "    attempts: {}", component_attempts(c));
        for counter in &c.counters {
            let _ = writeln!(out, "    counter {}", one_line(&counter_words(counter)));
        }
    }
    let left = a.components.len() - shown + a.components_left_out;
    if left > 0 {
        let _ = writeln!(out, "  ... {left} more components on the node page:");
        for c in a.components.iter().skip(shown) {
            let _ = writeln!(out, "    {}", one_line(&c.headline));
        }
    }
}

/// A record from before analyses: its failing checks.
fn checks_text(out: &mut String, t: &TriageRecord) {
    if t.failing_checks.is_empty() {
        let _ = writeln!(out, "  last error: {}", one_line(&t.last_error));
    }
    for c in &t.failing_checks {
        let _ = writeln!(
            out,
            "  - {} {} (failed {}/{} attempts, could not run in {}; {}): {}",
            one_line(&c.name),
            c.verdict,
            c.failed_attempts,
            t.attempts,
            c.error_attempts,
            one_line(&c.action),
            one_line(&c.message)
        );
        let _ = writeln!(
            out,
            "    measured: {}",
            one_line(&measured_text(&c.measured))
        );
    }
}
