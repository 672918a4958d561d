//! Page bodies, as pure functions of what the store (and the lag history) returned, so they
//! can be tested without a server. Every store-supplied string is escaped with [`esc`].

use std::fmt::Write as _;

use kiln_store::dashboard::{totals, DeadLetter, NodeSummary, RackSummary};
use kiln_store::{CheckVerdict, NodeHistory, NodeState};

use crate::chart::{colour, lag_chart};
use crate::html::{esc, node_href, percent, rack_href, state_bar, state_class, utc, STATE_ORDER};
use crate::lag::LagHistory;

/// Evidence longer than this is shown cut (the store keeps up to 1 MiB per check; `kiln nodes
/// show --json` prints all of it).
pub const EVIDENCE_SHOWN_MAX: usize = 64 * 1024;

fn chip(state: NodeState) -> String {
    format!(
        "<span class=\"chip {}\">{}</span>",
        state_class(state),
        state.as_str()
    )
}

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
pub fn overview(racks: &[RackSummary], lag: &LagHistory, now_ms: i64) -> String {
    let all = totals(racks);
    let mut b = String::new();
    let _ = write!(
        b,
        "<h1>Racks</h1><p id=\"totals\"><strong>{}</strong> nodes in <strong>{}</strong> racks; \
         <strong>{}%</strong> finished (passed or dead-lettered).</p>{}<p>",
        all.total(),
        racks.len(),
        percent(all.finished(), all.total()),
        state_bar(&all)
    );
    for state in STATE_ORDER {
        let _ = write!(
            b,
            "{} <span id=\"total-{}\">{}</span> &nbsp; ",
            chip(state),
            state.as_str(),
            all.count(state)
        );
    }
    b.push_str("</p><table id=\"racks\"><thead><tr><th>Rack</th><th>Progress</th>");
    for state in STATE_ORDER {
        let _ = write!(b, "<th class=\"num\">{}</th>", state.as_str());
    }
    b.push_str("<th class=\"num\">total</th><th class=\"num\">finished</th></tr></thead><tbody>");
    for r in racks {
        let _ = write!(
            b,
            "<tr data-rack=\"{}\"><td><a href=\"{}\">{}</a></td><td>{}</td>",
            esc(&r.rack),
            esc(&rack_href(&r.rack)),
            esc(&r.rack),
            state_bar(r)
        );
        for state in STATE_ORDER {
            let _ = write!(
                b,
                "<td class=\"num\" data-state=\"{}\">{}</td>",
                state.as_str(),
                r.count(state)
            );
        }
        let _ = write!(
            b,
            "<td class=\"num\">{}</td><td class=\"num\">{}%</td></tr>",
            r.total(),
            percent(r.finished(), r.total())
        );
    }
    if racks.is_empty() {
        b.push_str("<tr><td colspan=\"9\" class=\"muted\">No racks registered yet.</td></tr>");
    }
    b.push_str("</tbody></table><h2>Consumer lag</h2>");
    b.push_str(&lag_chart(lag, now_ms));
    b.push_str("<p><a href=\"/lag\">Lag per partition, and how it is sampled</a></p>");
    b
}

pub fn rack(rack: &str, nodes: &[NodeSummary]) -> String {
    let mut summary = RackSummary::new(rack);
    for n in nodes {
        *summary.counts.entry(n.state).or_default() += 1;
    }
    let mut b = format!(
        "<h1>Rack {}</h1><p>{} nodes, {}% finished.</p>{}",
        esc(rack),
        summary.total(),
        percent(summary.finished(), summary.total()),
        state_bar(&summary)
    );
    b.push_str(
        "<table id=\"nodes\"><thead><tr><th>Node</th><th>State</th><th class=\"num\">Cycle</th>\
         <th class=\"num\">Attempt</th><th>GPUs</th><th>Why</th><th>Changed</th></tr></thead><tbody>",
    );
    for n in nodes {
        let _ = write!(
            b,
            "<tr><td><a href=\"{}\">{}</a></td><td>{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td>{} × {}</td><td>{}</td><td>{}</td></tr>",
            esc(&node_href(&n.hostname)),
            esc(&n.hostname),
            chip(n.state),
            n.cycle,
            n.attempt,
            n.gpu_count,
            esc(&n.gpu_model),
            esc(&n.state_reason),
            utc(n.updated_at_ms)
        );
    }
    if nodes.is_empty() {
        b.push_str("<tr><td colspan=\"7\" class=\"muted\">No nodes in this rack.</td></tr>");
    }
    b.push_str("</tbody></table>");
    b
}

fn evidence_block(evidence: &str) -> String {
    if evidence.is_empty() {
        return "<span class=\"muted\">none</span>".into();
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
    let note = if cut > 0 {
        format!(
            "<p class=\"muted\">{cut} more bytes not shown; `kiln nodes show --json` prints them.</p>"
        )
    } else {
        String::new()
    };
    format!(
        "<details class=\"evidence\"><summary>evidence ({} bytes)</summary><pre>{}</pre>{note}</details>",
        evidence.len(),
        esc(shown)
    )
}

pub fn node(h: &NodeHistory) -> String {
    let n = &h.node;
    let s = &n.spec;
    let mut b = format!(
        "<h1>Node {}</h1><table class=\"kv\"><tbody>\
         <tr><th>Rack</th><td><a href=\"{}\">{}</a></td></tr>\
         <tr><th>State</th><td>{} cycle {}, attempt {}</td></tr>\
         <tr><th>Why</th><td>{}</td></tr>\
         <tr><th>BMC</th><td>{}</td></tr>\
         <tr><th>GPUs</th><td>{} × {}</td></tr>\
         <tr><th>Firmware</th><td>BMC {}, BIOS {}, GPU VBIOS {}, NIC {}</td></tr>",
        esc(&s.hostname),
        esc(&rack_href(&s.rack)),
        esc(&s.rack),
        chip(n.state),
        n.cycle,
        n.attempt,
        esc(&n.state_reason),
        esc(&s.bmc_address),
        s.gpu_count,
        esc(&s.gpu_model),
        esc(&s.firmware_bmc),
        esc(&s.firmware_bios),
        esc(&s.firmware_gpu_vbios),
        esc(&s.firmware_nic),
    );
    let labels: Vec<String> = s
        .labels
        .iter()
        .map(|(k, v)| format!("{}={}", esc(k), esc(v)))
        .collect();
    let _ = write!(
        b,
        "<tr><th>Labels</th><td>{}</td></tr><tr><th>Registered</th><td>{}</td></tr></tbody></table>",
        if labels.is_empty() { "-".to_string() } else { labels.join(", ") },
        utc(n.registered_at_ms)
    );
    let _ = write!(b, "<h2>Runs ({})</h2>", h.runs.len());
    if h.runs.is_empty() {
        b.push_str("<p class=\"muted\">No burn-in run yet.</p>");
    }
    // Newest first: the attempt an engineer wants is usually the last.
    for r in h.runs.iter().rev() {
        let verdict = r.verdict.map_or("unfinished", |v| v.as_str());
        let took = r
            .finished_at_ms
            .map(|f| format!(", took {:.1} s", (f - r.started_at_ms) as f64 / 1000.0))
            .unwrap_or_default();
        let _ = write!(
            b,
            "<section class=\"run\" id=\"run-{}\"><h3>Cycle {} attempt {}: \
             <span class=\"v-{verdict}\">{verdict}</span></h3>\
             <p class=\"muted\">agent {}, started {}{took}</p>\
             <table class=\"checks\"><thead><tr><th>Check</th><th>Verdict</th><th>Message</th>\
             <th>Measured</th><th>Evidence</th></tr></thead><tbody>",
            r.id,
            r.cycle,
            r.attempt,
            esc(&r.agent),
            utc(r.started_at_ms),
        );
        for c in &r.checks {
            let measured = serde_json::to_string_pretty(&c.measured)
                .unwrap_or_else(|_| c.measured.to_string());
            let _ = write!(
                b,
                "<tr><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td><pre>{}</pre></td><td>{}</td></tr>",
                esc(&c.name),
                verdict_class(c.verdict),
                c.verdict.as_str(),
                esc(&c.message),
                esc(&measured),
                evidence_block(&c.evidence)
            );
        }
        if r.checks.is_empty() {
            b.push_str("<tr><td colspan=\"5\" class=\"muted\">No check results.</td></tr>");
        }
        b.push_str("</tbody></table></section>");
    }
    b.push_str(
        "<h2>State changes</h2><table id=\"events\"><thead><tr><th>When</th><th>Cycle</th>\
         <th>Attempt</th><th>State</th><th>Why</th></tr></thead><tbody>",
    );
    for e in &h.events {
        let _ = write!(
            b,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td></tr>",
            utc(e.at_ms),
            e.cycle,
            e.attempt,
            chip(e.state),
            esc(&e.reason)
        );
    }
    b.push_str("</tbody></table>");
    b
}

pub fn dead_letters(list: &[DeadLetter], total: u64) -> String {
    let mut b = format!(
        "<h1>Dead letters</h1><p>{total} node(s) dead-lettered: every attempt of their cycle \
         failed. Showing the {} most recent, with the failing checks of the last attempt. After \
         repair, <code>kiln dlq requeue HOST</code> queues a node again.</p>\
         <table id=\"dead-letters\"><thead><tr><th>Node</th><th>Rack</th><th class=\"num\">Cycle</th>\
         <th class=\"num\">Attempts</th><th>Dead-lettered</th><th>Failing checks</th></tr></thead><tbody>",
        list.len()
    );
    for d in list {
        let checks: Vec<String> = d
            .failed_checks
            .iter()
            .map(|c| {
                format!(
                    "<li><strong>{}</strong> <span class=\"{}\">{}</span>: {}</li>",
                    esc(&c.name),
                    verdict_class(c.verdict),
                    c.verdict.as_str(),
                    esc(&c.message)
                )
            })
            .collect();
        let checks = if checks.is_empty() {
            format!("<span class=\"muted\">{}</span>", esc(&d.state_reason))
        } else {
            format!("<ul>{}</ul>", checks.concat())
        };
        let _ = write!(
            b,
            "<tr><td><a href=\"{}\">{}</a></td><td><a href=\"{}\">{}</a></td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td>{}</td><td>{checks}</td></tr>",
            esc(&node_href(&d.hostname)),
            esc(&d.hostname),
            esc(&rack_href(&d.rack)),
            esc(&d.rack),
            d.cycle,
            d.attempt,
            utc(d.updated_at_ms)
        );
    }
    if list.is_empty() {
        b.push_str("<tr><td colspan=\"6\" class=\"muted\">No dead-lettered nodes.</td></tr>");
    }
    b.push_str("</tbody></table>");
    b
}

/// Where lag comes from, shown on the lag page.
pub struct LagSource<'a> {
    pub bootstrap: Option<&'a str>,
    pub interval_s: f64,
}

pub fn lag(h: &LagHistory, src: &LagSource<'_>, now_ms: i64) -> String {
    let mut b = String::from("<h1>Consumer lag</h1>");
    match src.bootstrap {
        None => b.push_str(
            "<p class=\"error\">No broker given (<code>--bootstrap</code>): lag is not sampled.</p>",
        ),
        Some(bootstrap) => {
            let _ = write!(
                b,
                "<p>Lag = log end offset − committed offset, in records, per group and \
                 partition, sampled from {} every {:.0} s. History is kept in memory since the \
                 dashboard started ({}); at most {} samples per partition.</p>",
                esc(bootstrap),
                src.interval_s,
                utc(h.started_ms),
                h.points_per_series
            );
        }
    }
    if let Some((at, e)) = &h.last_error {
        let _ = write!(
            b,
            "<p class=\"error\">The last sample ({}) failed: {}</p>",
            utc(*at),
            esc(e)
        );
    }
    b.push_str(&lag_chart(h, now_ms));
    b.push_str(
        "<table id=\"lag\"><thead><tr><th></th><th>Group</th><th>Topic</th>\
         <th class=\"num\">Partition</th><th class=\"num\">Committed</th>\
         <th class=\"num\">Log end</th><th class=\"num\">Lag</th></tr></thead><tbody>",
    );
    for (i, (key, r)) in h.latest.iter().enumerate() {
        let swatch = if i < crate::chart::MAX_LINES {
            format!(
                "<i style=\"display:inline-block;width:.8rem;height:.8rem;background:{}\"></i>",
                colour(i)
            )
        } else {
            String::new()
        };
        let _ = write!(
            b,
            "<tr><td>{swatch}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            esc(&key.group),
            esc(&key.topic),
            key.partition,
            r.committed.map_or("none (from log start)".to_string(), |c| c.to_string()),
            r.log_end,
            r.lag
        );
    }
    if h.latest.is_empty() {
        b.push_str("<tr><td colspan=\"7\" class=\"muted\">No samples yet.</td></tr>");
    }
    b.push_str("</tbody></table>");
    if h.dropped_series > 0 {
        let _ = write!(
            b,
            "<p class=\"muted\">{} readings of series beyond the first {} were not kept.</p>",
            h.dropped_series, h.max_series
        );
    }
    b
}
