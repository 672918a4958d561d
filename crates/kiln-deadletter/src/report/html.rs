//! The HTML part (maud: every interpolated value is escaped). Inline styles only: mail
//! clients drop `<style>` elements.

use maud::{html, Markup, DOCTYPE};

use kiln_findings::{Action, ComponentReport};
use kiln_store::triage::TriageRecord;

use super::{
    attempts_words, component_attempts, counter_words, identity, measured_text, RackReport, Report,
    EVIDENCE_LINES_INLINE_MAX, NODE_DETAIL_BYTES_MAX, REPORT_DETAIL_BYTES_MAX,
};
use crate::schedule::Schedule;

const TABLE: &str = "border-collapse:collapse;margin:.3em 0 1em";
const CELL: &str = "border:1px solid #ccc;padding:4px;vertical-align:top;text-align:left";
const NODE: &str = "border-left:4px solid #c8322d;padding:.2em .8em;margin:.8em 0";
const PRE: &str =
    "margin:.2em 0;padding:.3em;background:#f4f4f4;white-space:pre-wrap;font-size:90%";

/// The colour of an action's label: red for hardware to replace, amber for hands at the rack.
fn action_style(a: Action) -> &'static str {
    match a {
        Action::Rma => "color:#fff;background:#c8322d;padding:0 .3em",
        Action::ReseatCable | Action::Cooling => "color:#000;background:#f0c040;padding:0 .3em",
        _ => "color:#fff;background:#5a6b7d;padding:0 .3em",
    }
}

/// The HTML part.
pub fn render_html(report: &Report, schedule: &Schedule) -> String {
    let mut detail_left = REPORT_DETAIL_BYTES_MAX;
    let racks: Vec<Markup> = report
        .racks
        .iter()
        .map(|rack| rack_html(report, rack, schedule, &mut detail_left))
        .collect();
    let page = html! {
        (DOCTYPE)
        html {
            head {
                meta charset="utf-8";
                title { (report.subject("Kiln dead-lettered nodes")) }
            }
            body style="font-family:sans-serif" {
                h1 { "Kiln dead-lettered nodes, " (report.day) " (" (report.zone) ")" }
                p {
                    (report.count_new()) " new, " (report.count_still_open())
                    " still open from earlier reports, " (report.resolved.len())
                    " resolved since the last report."
                }
                @if report.racks.is_empty() {
                    p { "No node is dead-lettered." }
                }
                @for r in racks { (r) }
                @if !report.resolved.is_empty() {
                    (resolved_html(report, schedule))
                }
            }
        }
    };
    page.into_string()
}

fn rack_html(
    report: &Report,
    rack: &RackReport,
    schedule: &Schedule,
    detail_left: &mut usize,
) -> Markup {
    let mut groups = Vec::new();
    for (title, list) in [
        ("New", &rack.new),
        ("Still open (reported before)", &rack.still_open),
    ] {
        if list.is_empty() {
            continue;
        }
        let mut nodes = Vec::new();
        for t in list {
            let m = node_html(report, t, schedule, *detail_left > 0);
            *detail_left = detail_left.saturating_sub(m.0.len());
            nodes.push(m);
        }
        groups.push((title, nodes));
    }
    html! {
        h2 { "Rack " (rack.rack) }
        @if !rack.correlated.is_empty() {
            p { b { "Correlated failures" } }
            ul {
                @for c in &rack.correlated {
                    li {
                        b { (c.scope) } ": " (c.check) " " (c.what) " on " (c.hosts.len())
                        " nodes: " (c.hosts.join(", "))
                    }
                }
            }
        }
        @for (title, nodes) in groups {
            h3 { (title) }
            @for n in nodes { (n) }
        }
    }
}

fn node_html(report: &Report, t: &TriageRecord, schedule: &Schedule, details: bool) -> Markup {
    let link = report.node_link(&t.hostname);
    let headline = t
        .analysis
        .as_ref()
        .map(|a| a.headline.clone())
        .unwrap_or_else(|| format!("action {}", t.action));
    let body = match (&t.analysis, details) {
        (_, false) => html! { p { i { "Details left out: the report is at its size bound." } } },
        (None, true) => checks_html(t),
        (Some(a), true) => {
            let mut rows = Vec::new();
            let mut used = 0;
            let mut rest: Vec<&ComponentReport> = Vec::new();
            for c in &a.components {
                if used > NODE_DETAIL_BYTES_MAX {
                    rest.push(c);
                    continue;
                }
                let row = component_html(c);
                used += row.0.len();
                rows.push(row);
            }
            let left_out = rest.len() + a.components_left_out;
            html! {
                @for s in &a.suspects {
                    p style="color:#c8322d" { b { "Suspect: " } (s.reason) }
                }
                table style=(TABLE) {
                    tr {
                        th style=(CELL) { "Component" }
                        th style=(CELL) { "Action" }
                        th style=(CELL) { "Findings and evidence" }
                        th style=(CELL) { "Attempts" }
                    }
                    @for r in rows { (r) }
                }
                @if left_out > 0 {
                    p {
                        (left_out) " more components"
                        @if let Some(l) = &link { " on the " a href=(l) { "node page" } }
                        ":"
                    }
                    ul { @for c in rest { li { (c.headline) } } }
                }
            }
        }
    };
    html! {
        div style=(NODE) {
            p {
                b {
                    @if let Some(l) = &link { a href=(l) { (t.hostname) } } @else { (t.hostname) }
                }
                " · BMC " (t.bmc_address) " · cycle " (t.cycle) " · " (attempts_words(t))
                br;
                b { (headline) }
                br;
                small {
                    "failures: first " (schedule.local(t.first_failure_at_ms))
                    ", last " (schedule.local(t.last_failure_at_ms))
                    @if let Some(d) = &t.first_reported_day { "; first reported " (d) }
                }
            }
            (body)
        }
    }
}

fn component_html(c: &ComponentReport) -> Markup {
    html! {
        tr {
            td style=(CELL) { (identity(&c.component)) }
            td style=(CELL) { span style=(action_style(c.action)) { (c.action.label()) } }
            td style=(CELL) {
                (c.headline)
                ul {
                    @for f in &c.findings {
                        li {
                            code { (f.check) " " (f.code) } " (attempts "
                            (f.attempts.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
                            "): " (f.message)
                            @if !f.evidence.is_empty() {
                                pre style=(PRE) {
                                    @for line in f.evidence.iter().take(EVIDENCE_LINES_INLINE_MAX) {
                                        (line) "\n"
                                    }
                                    @if f.evidence.len() > EVIDENCE_LINES_INLINE_MAX {
                                        "... " (f.evidence.len() - EVIDENCE_LINES_INLINE_MAX)
                                        " more lines on the node page"
                                    }
                                }
                            }
                        }
                    }
                }
                @for counter in &c.counters {
                    small { "counter " (counter_words(counter)) } br;
                }
            }
            td style=(CELL) { (component_attempts(c)) }
        }
    }
}

/// A record from before analyses: its failing checks.
fn checks_html(t: &TriageRecord) -> Markup {
    html! {
        @if t.failing_checks.is_empty() {
            p { "last error: " (t.last_error) }
        }
        ul {
            @for c in &t.failing_checks {
                li {
                    b { (c.name) } " " (c.verdict) " (failed " (c.failed_attempts) "/" (t.attempts)
                    " attempts, could not run in " (c.error_attempts) "; " (c.action) "): "
                    (c.message) br;
                    code { (measured_text(&c.measured)) }
                }
            }
        }
    }
}

fn resolved_html(report: &Report, schedule: &Schedule) -> Markup {
    html! {
        h2 { "Resolved since the last report" }
        ul {
            @for t in &report.resolved {
                @if let Some(r) = &t.resolution {
                    li {
                        b { (t.hostname) } " (cycle " (t.cycle) ") resolved by " (r.by) " at "
                        (schedule.local(r.at_ms)) ": " (r.note)
                    }
                }
            }
        }
    }
}
