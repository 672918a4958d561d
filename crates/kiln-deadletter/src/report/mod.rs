//! The daily report: every open triage record, by rack, split into nodes new in this report
//! and nodes an earlier report already listed that are still dead-lettered, each node with its
//! components (action, evidence, attempts, counters) from the record's analysis; per rack the
//! failures several of its nodes share; and the records people resolved since the previous
//! report. Rendered as plain text (`text`) and as HTML (`html`, maud: every value from the
//! store is escaped; hostnames, messages and evidence come from manifests and from the nodes).
//!
//! Size-bounded: each finding inlines at most `EVIDENCE_LINES_INLINE_MAX` evidence lines, a
//! node's details stop at `NODE_DETAIL_BYTES_MAX`, and after `REPORT_DETAIL_BYTES_MAX` of
//! details the remaining nodes get their headline alone; each cut names the node's dashboard
//! page, where everything is shown.

use std::collections::{BTreeMap, BTreeSet};

use jiff::civil::Date;
use kiln_findings::analysis::code_words;
use kiln_store::triage::TriageRecord;
use kiln_store::Store;
use serde::Serialize;

use crate::config::ReportConfig;
use crate::schedule::Schedule;

mod html;
mod text;

pub use html::render_html;
pub use text::render_text;

/// Measured values longer than this are cut in the report (the store keeps them whole).
const MEASURED_CHARS_MAX: usize = 400;
/// Evidence lines shown per finding; the rest are on the dashboard.
pub const EVIDENCE_LINES_INLINE_MAX: usize = 4;
/// A node's component details in one part, bytes; past it, components get their headline only.
pub const NODE_DETAIL_BYTES_MAX: usize = 8 * 1024;
/// Node details in one part, bytes; past it, nodes get their headline and link only.
pub const REPORT_DETAIL_BYTES_MAX: usize = 2 * 1024 * 1024;
/// Correlated failures listed per rack.
const CORRELATIONS_MAX: usize = 20;
/// The manifest label that names the switch a node hangs off (its InfiniBand leaf).
pub const SWITCH_LABEL: &str = "switch";

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The report day, `YYYY-MM-DD` in `zone`.
    pub day: String,
    pub zone: String,
    pub racks: Vec<RackReport>,
    /// Records resolved (`kiln dlq resolve`) since the previous report's send time.
    pub resolved: Vec<TriageRecord>,
    /// The dashboard's address for node links; empty for none.
    pub dashboard_url: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct RackReport {
    pub rack: String,
    /// Not listed by an earlier report.
    pub new: Vec<TriageRecord>,
    /// Listed by an earlier report and still dead-lettered.
    pub still_open: Vec<TriageRecord>,
    /// The same fault on several of the rack's nodes (or behind one switch).
    pub correlated: Vec<Correlation>,
}

/// One fault shared by several nodes of a rack, or of one switch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Correlation {
    /// `rack r07` or `switch leaf-07`.
    pub scope: String,
    pub check: String,
    /// The fault in words (`Xid 79`, `ib link flapping`).
    pub what: String,
    pub hosts: Vec<String>,
}

impl Report {
    pub fn count_new(&self) -> usize {
        self.racks.iter().map(|r| r.new.len()).sum()
    }

    pub fn count_still_open(&self) -> usize {
        self.racks.iter().map(|r| r.still_open.len()).sum()
    }

    /// Nothing dead-lettered and nothing resolved.
    pub fn is_empty(&self) -> bool {
        self.racks.is_empty() && self.resolved.is_empty()
    }

    /// (hostname, cycle) of every listed open record.
    pub fn listed(&self) -> Vec<(String, u32)> {
        self.racks
            .iter()
            .flat_map(|r| r.new.iter().chain(&r.still_open))
            .map(|t| (t.hostname.clone(), t.cycle))
            .collect()
    }

    pub fn subject(&self, prefix: &str) -> String {
        let mut s = format!(
            "{prefix} {}: {} new, {} still open",
            self.day,
            self.count_new(),
            self.count_still_open()
        );
        if !self.resolved.is_empty() {
            s.push_str(&format!(", {} resolved", self.resolved.len()));
        }
        s
    }

    /// The node's dashboard page, if the report has a dashboard address. Hostnames are RFC
    /// 1123 names (the manifest checks them), so they need no encoding in a path.
    pub fn node_link(&self, hostname: &str) -> Option<String> {
        let base = self.dashboard_url.trim_end_matches('/');
        (!base.is_empty()).then(|| format!("{base}/nodes/{hostname}"))
    }
}

/// The report of `day` from the store's open triage records. A record first listed on `day`
/// (or later) counts as new, so building the report again after it was sent shows what was sent.
pub async fn build_report(
    store: &Store,
    day: Date,
    schedule: &Schedule,
    config: &ReportConfig,
) -> kiln_store::Result<Report> {
    let day_s = day.to_string();
    let mut racks: BTreeMap<String, RackReport> = BTreeMap::new();
    for t in store.open_triage().await? {
        let rack = racks.entry(t.rack.clone()).or_insert_with(|| RackReport {
            rack: t.rack.clone(),
            new: Vec::new(),
            still_open: Vec::new(),
            correlated: Vec::new(),
        });
        match &t.first_reported_day {
            Some(d) if d.as_str() < day_s.as_str() => rack.still_open.push(t),
            _ => rack.new.push(t),
        }
    }
    for rack in racks.values_mut() {
        rack.correlated = correlate(rack);
    }
    // Resolved since the previous day's send instant (a day without a report is covered by
    // the next one, as its dead-lettered nodes are).
    let since = day
        .yesterday()
        .ok()
        .and_then(|d| schedule.send_at(d).ok())
        .map_or(0, |t| t.as_millisecond());
    let resolved = store.resolved_since(since).await?;
    Ok(Report {
        day: day_s,
        zone: schedule.zone_name.clone(),
        racks: racks.into_values().collect(),
        resolved,
        dashboard_url: config.dashboard_url.clone(),
    })
}

/// (check, code) of every failing finding of a record: from its analysis, else its failing
/// checks' names.
fn faults(t: &TriageRecord) -> BTreeSet<(String, String)> {
    match &t.analysis {
        Some(a) => a
            .components
            .iter()
            .flat_map(|c| c.findings.iter())
            .map(|f| (f.check.clone(), f.code.clone()))
            .collect(),
        None => t
            .failing_checks
            .iter()
            .map(|c| (c.name.clone(), c.verdict.clone()))
            .collect(),
    }
}

/// Faults that two or more of the rack's open nodes share, per rack and per switch label.
pub fn correlate(rack: &RackReport) -> Vec<Correlation> {
    let mut groups: BTreeMap<(String, String, String), BTreeSet<String>> = BTreeMap::new();
    for t in rack.new.iter().chain(&rack.still_open) {
        let switch = t.labels.get(SWITCH_LABEL);
        for (check, code) in faults(t) {
            groups
                .entry((format!("rack {}", rack.rack), check.clone(), code.clone()))
                .or_default()
                .insert(t.hostname.clone());
            if let Some(sw) = switch {
                groups
                    .entry((format!("switch {sw}"), check, code))
                    .or_default()
                    .insert(t.hostname.clone());
            }
        }
    }
    let mut out: Vec<Correlation> = groups
        .into_iter()
        .filter(|(_, hosts)| hosts.len() >= 2)
        .map(|((scope, check, code), hosts)| Correlation {
            scope,
            check,
            what: code_words(&code),
            hosts: hosts.into_iter().collect(),
        })
        .collect();
    // Most nodes first; a switch before its rack when they name the same nodes.
    out.sort_by(|a, b| {
        b.hosts
            .len()
            .cmp(&a.hosts.len())
            .then_with(|| {
                b.scope
                    .starts_with("switch")
                    .cmp(&a.scope.starts_with("switch"))
            })
            .then_with(|| a.check.cmp(&b.check))
    });
    out.truncate(CORRELATIONS_MAX);
    out
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

/// `1 failed, 2 could not run` over a record's attempts, from its analysis.
fn attempts_words(t: &TriageRecord) -> String {
    let Some(a) = &t.analysis else {
        return format!("{} attempts", t.attempts);
    };
    let failed = a.attempts.iter().filter(|x| !x.failed.is_empty()).count();
    let errored = a
        .attempts
        .iter()
        .filter(|x| x.failed.is_empty() && !x.errored.is_empty())
        .count();
    format!(
        "{} attempt{}: {failed} failed, {errored} could not run",
        t.attempts,
        if t.attempts == 1 { "" } else { "s" }
    )
}

/// Every identifier a component has: what a person matches against the part in hand.
fn identity(c: &kiln_findings::Component) -> String {
    let mut parts = vec![kiln_findings::analysis::component_words(c)];
    if c.serial.is_some() || c.slot.is_some() {
        if let Some(p) = &c.pci_address {
            parts.push(p.clone());
        }
    }
    if let Some(u) = &c.uuid {
        parts.push(u.clone());
    }
    parts.join(", ")
}

/// `attempt 1 fail (xid_79) | 2 clear`.
fn component_attempts(c: &kiln_findings::ComponentReport) -> String {
    use kiln_findings::ComponentResult;
    c.attempts
        .iter()
        .map(|a| match a.result {
            ComponentResult::Fail => format!("{} fail ({})", a.attempt, a.codes.join(", ")),
            ComponentResult::Error => format!("{} could not run", a.attempt),
            ComponentResult::Clear => format!("{} clear", a.attempt),
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// `ecc_volatile_uncorrected 4 (1) -> 9 (3), growing`.
fn counter_words(t: &kiln_findings::CounterTrend) -> String {
    let values = t
        .values
        .iter()
        .map(|(a, v)| format!("{v} (attempt {a})"))
        .collect::<Vec<_>>()
        .join(" -> ");
    let trend = if t.values.len() < 2 {
        ""
    } else if t.growing() {
        ", growing"
    } else {
        ", steady"
    };
    format!("{} {values}{trend}", t.name)
}

#[cfg(test)]
mod tests;
