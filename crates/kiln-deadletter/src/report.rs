//! The daily report: every open triage record, by rack, split into nodes new in this report
//! and nodes an earlier report already listed that are still dead-lettered; rendered as plain
//! text and as HTML (every value from the store is escaped: hostnames, messages and measured
//! values come from manifests and from the nodes themselves).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use jiff::civil::Date;
use kiln_store::triage::TriageRecord;
use kiln_store::Store;
use serde::Serialize;

use crate::classify::ActionClass;
use crate::schedule::Schedule;

/// Measured values longer than this are cut in the report (the store keeps them whole).
const MEASURED_CHARS_MAX: usize = 400;

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The report day, `YYYY-MM-DD` in `zone`.
    pub day: String,
    pub zone: String,
    pub racks: Vec<RackReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RackReport {
    pub rack: String,
    /// Not listed by an earlier report.
    pub new: Vec<TriageRecord>,
    /// Listed by an earlier report and still dead-lettered.
    pub still_open: Vec<TriageRecord>,
}

impl Report {
    pub fn count_new(&self) -> usize {
        self.racks.iter().map(|r| r.new.len()).sum()
    }

    pub fn count_still_open(&self) -> usize {
        self.racks.iter().map(|r| r.still_open.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.racks.is_empty()
    }

    /// (hostname, cycle) of every listed record.
    pub fn listed(&self) -> Vec<(String, u32)> {
        self.racks
            .iter()
            .flat_map(|r| r.new.iter().chain(&r.still_open))
            .map(|t| (t.hostname.clone(), t.cycle))
            .collect()
    }

    pub fn subject(&self, prefix: &str) -> String {
        format!(
            "{prefix} {}: {} new, {} still open",
            self.day,
            self.count_new(),
            self.count_still_open()
        )
    }
}

/// The report of `day` from the store's open triage records. A record first listed on `day`
/// (or later) counts as new, so building the report again after it was sent shows what was sent.
pub async fn build_report(
    store: &Store,
    day: Date,
    schedule: &Schedule,
) -> kiln_store::Result<Report> {
    let day_s = day.to_string();
    let mut racks: BTreeMap<String, RackReport> = BTreeMap::new();
    for t in store.open_triage().await? {
        let rack = racks.entry(t.rack.clone()).or_insert_with(|| RackReport {
            rack: t.rack.clone(),
            new: Vec::new(),
            still_open: Vec::new(),
        });
        match &t.first_reported_day {
            Some(d) if d.as_str() < day_s.as_str() => rack.still_open.push(t),
            _ => rack.new.push(t),
        }
    }
    Ok(Report {
        day: day_s,
        zone: schedule.zone_name.clone(),
        racks: racks.into_values().collect(),
    })
}

fn measured_text(v: &serde_json::Value) -> String {
    let s = v.to_string();
    if s.chars().count() <= MEASURED_CHARS_MAX {
        return s;
    }
    let cut: String = s.chars().take(MEASURED_CHARS_MAX).collect();
    format!(
        "{cut}... ({} chars cut)",
        s.chars().count() - MEASURED_CHARS_MAX
    )
}

/// One line of text: control characters (a newline in a hostile message) become spaces, so a
/// value cannot forge lines of the plain-text report.
fn one_line(s: &str) -> String {
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
        "{} new, {} still open from earlier reports.\n",
        report.count_new(),
        report.count_still_open()
    );
    if report.is_empty() {
        let _ = writeln!(out, "No node is dead-lettered.");
    }
    for rack in &report.racks {
        let _ = writeln!(out, "== Rack {} ==", one_line(&rack.rack));
        for (title, list) in [
            ("New", &rack.new),
            ("Still open (reported before)", &rack.still_open),
        ] {
            if list.is_empty() {
                continue;
            }
            let _ = writeln!(out, "-- {title} --");
            for t in list {
                node_text(&mut out, t, schedule);
            }
        }
        out.push('\n');
    }
    out
}

fn node_text(out: &mut String, t: &TriageRecord, schedule: &Schedule) {
    let action = ActionClass::parse(&t.action);
    let _ = writeln!(
        out,
        "* {}  BMC {}  cycle {}  attempts {}",
        one_line(&t.hostname),
        one_line(&t.bmc_address),
        t.cycle,
        t.attempts
    );
    let _ = writeln!(out, "  action: {}", action.label());
    let _ = writeln!(
        out,
        "  failures: first {}, last {}",
        schedule.local(t.first_failure_at_ms),
        schedule.local(t.last_failure_at_ms)
    );
    if let Some(day) = &t.first_reported_day {
        let _ = writeln!(out, "  first reported: {day}");
    }
    if t.failing_checks.is_empty() {
        let _ = writeln!(out, "  last error: {}", one_line(&t.last_error));
    }
    for c in &t.failing_checks {
        let _ = writeln!(
            out,
            "  - {} {} (failed {}/{} attempts; {}): {}",
            one_line(&c.name),
            c.verdict,
            c.failed_attempts,
            t.attempts,
            ActionClass::parse(&c.action).label(),
            one_line(&c.message)
        );
        let _ = writeln!(
            out,
            "    measured: {}",
            one_line(&measured_text(&c.measured))
        );
    }
}

/// Escapes text for HTML element content and quoted attribute values.
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The HTML part: one table per rack and group, inline styles only (mail clients drop `<style>`).
pub fn render_html(report: &Report, schedule: &Schedule) -> String {
    let e = escape_html;
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{}</title></head>\
         <body style=\"font-family:sans-serif\">\n<h1>Kiln dead-lettered nodes, {} ({})</h1>\n\
         <p>{} new, {} still open from earlier reports.</p>\n",
        e(&report.subject("Kiln dead-lettered nodes")),
        e(&report.day),
        e(&report.zone),
        report.count_new(),
        report.count_still_open()
    );
    if report.is_empty() {
        out.push_str("<p>No node is dead-lettered.</p>\n");
    }
    for rack in &report.racks {
        let _ = writeln!(out, "<h2>Rack {}</h2>", e(&rack.rack));
        for (title, list) in [
            ("New", &rack.new),
            ("Still open (reported before)", &rack.still_open),
        ] {
            if list.is_empty() {
                continue;
            }
            let _ = writeln!(
                out,
                "<h3>{title}</h3>\n<table border=\"1\" cellpadding=\"4\" style=\"border-collapse:collapse\">\n\
                 <tr><th>Node</th><th>BMC</th><th>Attempts</th><th>First failure</th>\
                 <th>Last failure</th><th>Action</th><th>Failing checks</th></tr>"
            );
            for t in list {
                node_html(&mut out, t, schedule);
            }
            out.push_str("</table>\n");
        }
    }
    out.push_str("</body></html>\n");
    out
}

fn node_html(out: &mut String, t: &TriageRecord, schedule: &Schedule) {
    let e = escape_html;
    let mut checks = String::new();
    if t.failing_checks.is_empty() {
        let _ = write!(checks, "last error: {}", e(&t.last_error));
    } else {
        checks.push_str("<ul>");
        for c in &t.failing_checks {
            let _ = write!(
                checks,
                "<li><b>{}</b> {} (failed {}/{} attempts; {}): {}<br><code>{}</code></li>",
                e(&c.name),
                e(&c.verdict),
                c.failed_attempts,
                t.attempts,
                e(ActionClass::parse(&c.action).label()),
                e(&c.message),
                e(&measured_text(&c.measured))
            );
        }
        checks.push_str("</ul>");
    }
    let _ = writeln!(
        out,
        "<tr><td>{}<br><small>cycle {}</small></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
         <td><b>{}</b></td><td>{}</td></tr>",
        e(&t.hostname),
        t.cycle,
        e(&t.bmc_address),
        t.attempts,
        e(&schedule.local(t.first_failure_at_ms)),
        e(&schedule.local(t.last_failure_at_ms)),
        e(ActionClass::parse(&t.action).label()),
        checks
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_store::triage::FailingCheck;
    use serde_json::json;

    fn record(host: &str, rack: &str, reported: Option<&str>) -> TriageRecord {
        TriageRecord {
            hostname: host.into(),
            cycle: 1,
            rack: rack.into(),
            bmc_address: "10.0.0.9".into(),
            attempts: 10,
            first_failure_at_ms: 1_743_292_800_000, // 2025-03-30T00:00:00Z
            last_failure_at_ms: 1_743_296_400_000,  // 2025-03-30T01:00:00Z
            dead_lettered_at_ms: 1_743_296_400_000,
            action: "gpu".into(),
            last_error: "x".into(),
            failing_checks: vec![FailingCheck {
                name: "gpu_ecc".into(),
                verdict: "fail".into(),
                message: "GPU 3: 12 uncorrected".into(),
                measured: json!({"uncorrected_volatile": 12}),
                failed_attempts: 10,
                action: "gpu".into(),
            }],
            recorded_at_ms: 0,
            first_reported_day: reported.map(str::to_string),
        }
    }

    fn berlin() -> Schedule {
        Schedule::parse("08:00", "Europe/Berlin").expect("schedule")
    }

    fn report(records: Vec<TriageRecord>) -> Report {
        let mut racks: BTreeMap<String, RackReport> = BTreeMap::new();
        for t in records {
            let r = racks.entry(t.rack.clone()).or_insert_with(|| RackReport {
                rack: t.rack.clone(),
                new: vec![],
                still_open: vec![],
            });
            if t.first_reported_day.is_some() {
                r.still_open.push(t);
            } else {
                r.new.push(t);
            }
        }
        Report {
            day: "2025-03-30".into(),
            zone: "Europe/Berlin".into(),
            racks: racks.into_values().collect(),
        }
    }

    #[test]
    fn text_lists_racks_nodes_checks_and_times() {
        let r = report(vec![
            record("gpu-a-01", "rack-a", None),
            record("gpu-a-02", "rack-a", Some("2025-03-29")),
            record("gpu-b-01", "rack-b", None),
        ]);
        let text = render_text(&r, &berlin());
        assert!(text.contains("2 new, 1 still open"), "{text}");
        assert!(text.contains("== Rack rack-a =="));
        assert!(text.contains("== Rack rack-b =="));
        let new_at = text.find("-- New --").expect("new");
        let open_at = text.find("-- Still open").expect("still open");
        let a1 = text.find("gpu-a-01").expect("a1");
        let a2 = text.find("gpu-a-02").expect("a2");
        assert!(new_at < a1 && a1 < open_at && open_at < a2, "{text}");
        assert!(text.contains("BMC 10.0.0.9"));
        assert!(text.contains("action: reseat/replace GPU"));
        // Times in the report's zone: 00:00Z is 01:00 CET; 01:00Z is 03:00 CEST (after the change).
        assert!(
            text.contains("first 2025-03-30 01:00 CET, last 2025-03-30 03:00 CEST"),
            "{text}"
        );
        assert!(text.contains("gpu_ecc fail (failed 10/10 attempts; reseat/replace GPU)"));
        assert!(text.contains("measured: {\"uncorrected_volatile\":12}"));
        assert_eq!(
            r.subject("[kiln]"),
            "[kiln] 2025-03-30: 2 new, 1 still open"
        );
        assert_eq!(r.listed().len(), 3);
    }

    #[test]
    fn hostile_strings_are_escaped_in_html_and_flattened_in_text() {
        let mut t = record("<script>alert(1)</script>", "r&d\"<b>", None);
        t.bmc_address = "10.0.0.1' onmouseover='x".into();
        t.failing_checks[0].name = "<img src=x onerror=alert(2)>".into();
        t.failing_checks[0].message = "line1\n* forged-host  BMC 1.2.3.4".into();
        t.failing_checks[0].measured = json!({"<k>": "</code><script>"});
        let r = report(vec![t]);
        let html = render_html(&r, &berlin());
        for raw in [
            "<script>",
            "<img",
            "</code><script>",
            "' onmouseover='",
            "r&d\"<b>",
        ] {
            assert!(!html.contains(raw), "{raw} unescaped in:\n{html}");
        }
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("r&amp;d&quot;&lt;b&gt;"));
        assert!(html.contains("10.0.0.1&#39; onmouseover=&#39;x"));
        assert!(html.contains("&lt;img src=x onerror=alert(2)&gt;"));
        assert!(html.contains("{&quot;&lt;k&gt;&quot;:&quot;&lt;/code&gt;&lt;script&gt;&quot;}"));
        let text = render_text(&r, &berlin());
        assert!(!text.contains("\n* forged-host"), "{text}");
        assert!(text.contains("line1 * forged-host"));
        assert_eq!(escape_html("a&b<c>\"'"), "a&amp;b&lt;c&gt;&quot;&#39;");
    }

    #[test]
    fn empty_report_and_long_values() {
        let r = report(vec![]);
        assert!(render_text(&r, &berlin()).contains("No node is dead-lettered."));
        assert!(render_html(&r, &berlin()).contains("No node is dead-lettered."));
        let long = json!({"v": "x".repeat(1000)});
        let m = measured_text(&long);
        assert!(m.len() < 500 && m.ends_with("chars cut)"), "{m}");
    }
}
