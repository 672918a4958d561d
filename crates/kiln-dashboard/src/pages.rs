//! Page bodies, as pure functions of what the store (and the lag history) returned, so they
//! can be tested without a server. maud templates: every interpolated value is escaped.

use kiln_findings::{Action, Analysis, ComponentReport, ComponentResult};
use kiln_store::dashboard::{totals, DeadLetter, NodeSummary, RackSummary};
use kiln_store::{CheckResult, CheckVerdict, NodeHistory};
use maud::{html, Markup};

use crate::chart::{colour, lag_chart};
use crate::html::{chip, node_href, percent, rack_href, state_bar, utc, STATE_ORDER};
use crate::lag::LagHistory;

/// Evidence longer than this is shown cut (the store keeps up to 1 MiB per check; `kiln nodes
/// show --json` prints all of it).
pub const EVIDENCE_SHOWN_MAX: usize = 64 * 1024;

fn verdict_class(v: CheckVerdict) -> &'static str {
    match v {
        CheckVerdict::Pass => "v-pass",
        CheckVerdict::Fail => "v-fail",
        CheckVerdict::Error => "v-error",
        CheckVerdict::Warn => "v-warn",
        CheckVerdict::Skip => "v-skip",
    }
}

/// The overview: totals, then one row per rack with its bar and counts.
pub fn overview(racks: &[RackSummary], lag: &LagHistory, now_ms: i64) -> Markup {
    let all = totals(racks);
    html! {
        h1 { "Racks" }
        p id="totals" {
            strong { (all.total()) } " nodes in " strong { (racks.len()) } " racks; "
            strong { (percent(all.finished(), all.total())) "%" } " finished (passed or dead-lettered)."
        }
        (state_bar(&all))
        p {
            @for state in STATE_ORDER {
                (chip(state)) " " span id={ "total-" (state.as_str()) } { (all.count(state)) } " \u{a0} "
            }
        }
        table id="racks" {
            thead { tr {
                th { "Rack" } th { "Progress" }
                @for state in STATE_ORDER { th class="num" { (state.as_str()) } }
                th class="num" { "total" } th class="num" { "finished" }
            } }
            tbody {
                @for r in racks {
                    tr data-rack=(r.rack) {
                        td { a href=(rack_href(&r.rack)) { (r.rack) } }
                        td { (state_bar(r)) }
                        @for state in STATE_ORDER {
                            td class="num" data-state=(state.as_str()) { (r.count(state)) }
                        }
                        td class="num" { (r.total()) }
                        td class="num" { (percent(r.finished(), r.total())) "%" }
                    }
                }
                @if racks.is_empty() {
                    tr { td colspan="9" class="muted" { "No racks registered yet." } }
                }
            }
        }
        h2 { "Consumer lag" }
        (lag_chart(lag, now_ms))
        p { a href="/lag" { "Lag per partition, and how it is sampled" } }
    }
}

pub fn rack(rack: &str, nodes: &[NodeSummary]) -> Markup {
    let mut summary = RackSummary::new(rack);
    for n in nodes {
        *summary.counts.entry(n.state).or_default() += 1;
    }
    html! {
        h1 { "Rack " (rack) }
        p { (summary.total()) " nodes, " (percent(summary.finished(), summary.total())) "% finished." }
        (state_bar(&summary))
        table id="nodes" {
            thead { tr {
                th { "Node" } th { "State" } th class="num" { "Cycle" } th class="num" { "Attempt" }
                th { "GPUs" } th { "Why" } th { "Changed" }
            } }
            tbody {
                @for n in nodes {
                    tr {
                        td { a href=(node_href(&n.hostname)) { (n.hostname) } }
                        td { (chip(n.state)) }
                        td class="num" { (n.cycle) }
                        td class="num" { (n.attempt) }
                        td { (n.gpu_count) " × " (n.gpu_model) }
                        td { (n.state_reason) }
                        td { (utc(n.updated_at_ms)) }
                    }
                }
                @if nodes.is_empty() {
                    tr { td colspan="7" class="muted" { "No nodes in this rack." } }
                }
            }
        }
    }
}

fn evidence_block(evidence: &str) -> Markup {
    if evidence.is_empty() {
        return html! { span class="muted" { "none" } };
    }
    let (shown, cut) = if evidence.len() > EVIDENCE_SHOWN_MAX {
        let mut end = EVIDENCE_SHOWN_MAX;
        while !evidence.is_char_boundary(end) {
            end -= 1;
        }
        (&evidence[..end], evidence.len() - end)
    } else {
        (evidence, 0)
    };
    html! {
        details class="evidence" {
            summary { "evidence (" (evidence.len()) " bytes)" }
            pre { (shown) }
            @if cut > 0 {
                p class="muted" { (cut) " more bytes not shown; `kiln nodes show --json` prints them." }
            }
        }
    }
}

/// The CSS class of an action's label.
fn action_class(a: Action) -> &'static str {
    match a {
        Action::Rma => "act act-rma",
        Action::ReseatCable | Action::Cooling => "act act-hands",
        _ => "act",
    }
}

/// The per-component view of a cycle: what the dead-letter report shows, with every evidence
/// line, and each component's result in every attempt.
pub fn components(a: &Analysis) -> Markup {
    html! {
        p id="headline" { strong { (a.headline) } }
        @for s in &a.suspects {
            p class="error suspect" { strong { "Suspect: " } (s.reason) }
        }
        table id="components" {
            thead { tr {
                th { "Component" } th { "Action" } th { "Findings and evidence" }
                @for at in &a.attempts { th class="num" { "#" (at.attempt) } }
            } }
            tbody {
                @for c in &a.components { (component_row(c)) }
                @if a.components.is_empty() {
                    tr { td colspan="3" class="muted" { "No findings in this cycle." } }
                }
            }
        }
        @if a.components_left_out > 0 {
            p class="muted" { (a.components_left_out) " more components not listed." }
        }
    }
}

fn component_row(c: &ComponentReport) -> Markup {
    let who = kiln_findings::analysis::component_words(&c.component);
    html! {
        tr class="component" data-kind=(c.component.kind.as_str()) {
            td {
                strong { (who) }
                @if let Some(p) = &c.component.pci_address { br; small { (p) } }
                @if let Some(u) = &c.component.uuid { br; small { (u) } }
            }
            td { span class=(action_class(c.action)) { (c.action.label()) } }
            td {
                (c.headline)
                ul {
                    @for f in &c.findings {
                        li {
                            code { (f.check) " " (f.code) } " (attempts "
                            (f.attempts.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
                            "): " (f.message)
                            @if !f.evidence.is_empty() {
                                pre { @for line in &f.evidence { (line) "\n" } }
                            }
                        }
                    }
                }
                @for t in &c.counters {
                    small {
                        "counter " (t.name) ": "
                        (t.values.iter().map(|(a, v)| format!("{v} (#{a})")).collect::<Vec<_>>().join(" → "))
                        @if t.values.len() > 1 { @if t.growing() { ", growing" } @else { ", steady" } }
                    }
                    br;
                }
            }
            @for at in &c.attempts {
                @match at.result {
                    ComponentResult::Fail => td class="v-fail" title=(at.codes.join(", ")) { "fail" },
                    ComponentResult::Error => td class="v-error" { "error" },
                    ComponentResult::Clear => td class="v-pass" { "clear" },
                }
            }
        }
    }
}

fn check_row(c: &CheckResult) -> Markup {
    let measured =
        serde_json::to_string_pretty(&c.measured).unwrap_or_else(|_| c.measured.to_string());
    html! {
        tr {
            td { (c.name) }
            td class=(verdict_class(c.verdict)) { (c.verdict.as_str()) }
            td { (c.message) }
            td { pre { (measured) } }
            td { (evidence_block(&c.evidence)) }
        }
    }
}

pub fn node(h: &NodeHistory) -> Markup {
    let n = &h.node;
    let s = &n.spec;
    let labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let analysis = h.analysis(n.cycle);
    html! {
        h1 { "Node " (s.hostname) }
        table class="kv" { tbody {
            tr { th { "Rack" } td { a href=(rack_href(&s.rack)) { (s.rack) } } }
            tr { th { "State" } td { (chip(n.state)) " cycle " (n.cycle) ", attempt " (n.attempt) } }
            tr { th { "Why" } td { (n.state_reason) } }
            tr { th { "BMC" } td { (s.bmc_address) } }
            tr { th { "GPUs" } td { (s.gpu_count) " × " (s.gpu_model) } }
            tr { th { "Firmware" } td {
                "BMC " (s.firmware_bmc) ", BIOS " (s.firmware_bios) ", GPU VBIOS "
                (s.firmware_gpu_vbios) ", NIC " (s.firmware_nic)
            } }
            tr { th { "Labels" } td { @if labels.is_empty() { "-" } @else { (labels.join(", ")) } } }
            tr { th { "Registered" } td { (utc(n.registered_at_ms)) } }
        } }
        h2 { "Components in cycle " (n.cycle) }
        (components(&analysis))
        h2 { "Runs (" (h.runs.len()) ")" }
        @if h.runs.is_empty() {
            p class="muted" { "No burn-in run yet." }
        }
        // Newest first: the attempt an engineer wants is usually the last.
        @for r in h.runs.iter().rev() {
            @let verdict = r.verdict.map_or("unfinished", |v| v.as_str());
            section class="run" id={ "run-" (r.id) } {
                h3 { "Cycle " (r.cycle) " attempt " (r.attempt) ": " span class={ "v-" (verdict) } { (verdict) } }
                p class="muted" {
                    "agent " (r.agent) ", started " (utc(r.started_at_ms))
                    @if let Some(f) = r.finished_at_ms {
                        ", took " (format!("{:.1}", (f - r.started_at_ms) as f64 / 1000.0)) " s"
                    }
                }
                table class="checks" {
                    thead { tr { th { "Check" } th { "Verdict" } th { "Message" } th { "Measured" } th { "Evidence" } } }
                    tbody {
                        @for c in &r.checks { (check_row(c)) }
                        @if r.checks.is_empty() {
                            tr { td colspan="5" class="muted" { "No check results." } }
                        }
                    }
                }
            }
        }
        h2 { "State changes and remediations" }
        table id="events" {
            thead { tr { th { "When" } th { "Cycle" } th { "Attempt" } th { "State" } th { "Why" } } }
            tbody {
                @for e in &h.events {
                    tr {
                        td { (utc(e.at_ms)) }
                        td class="num" { (e.cycle) }
                        td class="num" { (e.attempt) }
                        td { (chip(e.state)) }
                        td { (e.reason) }
                    }
                }
            }
        }
    }
}

/// The dead-letter list, each node with the action and headline of its last attempt's
/// findings; `action` keeps only the nodes with that action.
pub fn dead_letters(list: &[DeadLetter], total: u64, action: Option<Action>) -> Markup {
    let rows: Vec<(&DeadLetter, Analysis)> = list
        .iter()
        .map(|d| (d, d.last_attempt_analysis()))
        .filter(|(_, a)| action.is_none() || a.action == action)
        .collect();
    html! {
        h1 { "Dead letters" }
        p {
            (total) " node(s) dead-lettered: their cycle failed for good (every attempt, an RMA \
            candidate, or the same fault twice). Showing the " (list.len()) " most recent"
            @if let Some(a) = action { ", of which " (rows.len()) " with action " code { (a.as_str()) } }
            ", with the findings of the last attempt. After repair, "
            code { "kiln dlq resolve HOST --note …" } " records what was done and queues the node again."
        }
        p id="action-filter" {
            "Action: "
            @if action.is_none() { strong { "all" } } @else { a href="/dead-letters" { "all" } }
            @for a in Action::ORDER {
                " · "
                @if action == Some(a) { strong { (a.as_str()) } }
                @else { a href={ "/dead-letters?action=" (a.as_str()) } { (a.as_str()) } }
            }
        }
        table id="dead-letters" {
            thead { tr {
                th { "Node" } th { "Rack" } th class="num" { "Cycle" } th class="num" { "Attempts" }
                th { "Dead-lettered" } th { "Action" } th { "Findings" }
            } }
            tbody {
                @for (d, a) in &rows {
                    tr data-action=(a.action.map_or("none", Action::as_str)) {
                        td { a href=(node_href(&d.hostname)) { (d.hostname) } }
                        td { a href=(rack_href(&d.rack)) { (d.rack) } }
                        td class="num" { (d.cycle) }
                        td class="num" { (d.attempt) }
                        td { (utc(d.updated_at_ms)) }
                        td { @if let Some(x) = a.action { span class=(action_class(x)) { (x.label()) } } }
                        td {
                            @if a.components.is_empty() {
                                span class="muted" { (d.state_reason) }
                            } @else {
                                ul {
                                    @for c in &a.components {
                                        li {
                                            (c.headline)
                                            @for f in &c.findings { br; small { (f.message) } }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                @if rows.is_empty() {
                    tr { td colspan="7" class="muted" { "No dead-lettered nodes." } }
                }
            }
        }
    }
}

/// Where lag comes from, shown on the lag page.
pub struct LagSource<'a> {
    pub bootstrap: Option<&'a str>,
    pub interval_s: f64,
}

pub fn lag(h: &LagHistory, src: &LagSource<'_>, now_ms: i64) -> Markup {
    html! {
        h1 { "Consumer lag" }
        @match src.bootstrap {
            None => p class="error" { "No broker given (" code { "--bootstrap" } "): lag is not sampled." },
            Some(bootstrap) => p {
                "Lag = log end offset − committed offset, in records, per group and partition, \
                 sampled from " (bootstrap) " every " (format!("{:.0}", src.interval_s))
                " s. History is kept in memory since the dashboard started (" (utc(h.started_ms))
                "); at most " (h.points_per_series) " samples per partition."
            },
        }
        @if let Some((at, e)) = &h.last_error {
            p class="error" { "The last sample (" (utc(*at)) ") failed: " (e) }
        }
        (lag_chart(h, now_ms))
        table id="lag" {
            thead { tr {
                th {} th { "Group" } th { "Topic" } th class="num" { "Partition" }
                th class="num" { "Committed" } th class="num" { "Log end" } th class="num" { "Lag" }
            } }
            tbody {
                @for (i, (key, r)) in h.latest.iter().enumerate() {
                    tr {
                        td {
                            @if i < crate::chart::MAX_LINES {
                                i style=(format!("display:inline-block;width:.8rem;height:.8rem;background:{}", colour(i))) {}
                            }
                        }
                        td { (key.group) }
                        td { (key.topic) }
                        td class="num" { (key.partition) }
                        td class="num" {
                            @match r.committed { Some(c) => (c), None => "none (from log start)" }
                        }
                        td class="num" { (r.log_end) }
                        td class="num" { (r.lag) }
                    }
                }
                @if h.latest.is_empty() {
                    tr { td colspan="7" class="muted" { "No samples yet." } }
                }
            }
        }
        @if h.dropped_series > 0 {
            p class="muted" {
                (h.dropped_series) " readings of series beyond the first " (h.max_series) " were not kept."
            }
        }
    }
}
