//! A node's attempts (one burn-in cycle) made into what a hardware engineer acts on: one entry
//! per component with its action, a one-line headline, the evidence, each attempt's result and
//! the counters across attempts.
//!
//! Beside the findings the checks made, three cases are decided here, so the report, the
//! dashboard and the CLI agree on them:
//! - a failed check without findings (a custom `command` step, a run that timed out) gets one
//!   finding from its name and words (`fallback_finding`);
//! - checks that could not run because nothing answered (SSH and BMC refusing connections)
//!   are one `unreachable` finding on the node, with the addresses tried, not one per step;
//!   other checks that could not run are grouped by their message;
//! - different GPUs failing in different attempts point at what they share (baseboard,
//!   NVSwitch, power, cooling), not at one GPU: a board suspect.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::finding::{Action, Component, ComponentKind, Finding};

/// Bumped when the stored shape changes in a way older readers would misread.
pub const ANALYSIS_VERSION: u32 = 1;
/// Most components one analysis lists (the rest are counted in `components_left_out`).
pub const COMPONENTS_MAX: usize = 64;
/// Most distinct (check, code) findings kept per component.
pub const COMPONENT_FINDINGS_MAX: usize = 16;
/// Most distinct error messages an `unreachable` or `check_error` finding keeps as evidence.
pub const ERROR_LINES_MAX: usize = 8;

/// A check's verdict as the analysis needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    /// Measured, and out of bounds.
    Fail,
    /// Could not measure (unreachable, timed out, unreadable).
    Error,
    /// Warn or skip: neither counts against the node.
    Other,
}

/// One check of one attempt.
#[derive(Debug, Clone, Copy)]
pub struct CheckInput<'a> {
    pub name: &'a str,
    pub outcome: Outcome,
    pub message: &'a str,
    pub findings: &'a [Finding],
}

/// One attempt of the cycle.
#[derive(Debug, Clone)]
pub struct AttemptInput<'a> {
    pub attempt: u32,
    pub checks: Vec<CheckInput<'a>>,
}

/// Which node: the addresses an unreachable finding names.
#[derive(Debug, Clone, Copy)]
pub struct NodeInput<'a> {
    pub hostname: &'a str,
    pub bmc_address: &'a str,
}

/// The per-component view of a node's cycle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Analysis {
    pub version: u32,
    /// The most severe action over all components and suspects; `None` when nothing failed.
    pub action: Option<Action>,
    /// One line: the most severe component's headline, and how many more there are.
    pub headline: String,
    /// Most severe first.
    pub components: Vec<ComponentReport>,
    #[serde(default)]
    pub components_left_out: usize,
    #[serde(default)]
    pub suspects: Vec<Suspect>,
    pub attempts: Vec<AttemptSummary>,
}

/// One attempt in a line: which checks failed (measured out of bounds) and which could not
/// run, counted apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptSummary {
    pub attempt: u32,
    pub failed: Vec<String>,
    pub errored: Vec<String>,
}

/// One component and everything found on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComponentReport {
    pub component: Component,
    pub action: Action,
    /// `RMA candidate: GPU 3, serial 1654922006537, SXM slot 3: row remap failure; run NVIDIA
    /// field diagnostic, attach nvidia-bug-report.log.gz`.
    pub headline: String,
    pub findings: Vec<FindingReport>,
    /// Every attempt of the cycle, in order, with this component's result in it.
    pub attempts: Vec<ComponentAttempt>,
    #[serde(default)]
    pub counters: Vec<CounterTrend>,
}

/// One (check, code) on a component, with the attempts it was found in; message and evidence
/// are the latest attempt's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FindingReport {
    pub check: String,
    pub code: String,
    pub action: Action,
    pub message: String,
    #[serde(default)]
    pub evidence: Vec<String>,
    pub attempts: Vec<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComponentResult {
    /// Found faulty in this attempt.
    Fail,
    /// A check that found it faulty elsewhere could not run in this attempt.
    Error,
    /// Not found faulty in this attempt.
    Clear,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentAttempt {
    pub attempt: u32,
    pub result: ComponentResult,
    #[serde(default)]
    pub codes: Vec<String>,
}

/// A counter's values in the attempts that reported it: `[[attempt, value], ...]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterTrend {
    pub name: String,
    pub values: Vec<(u32, u64)>,
}

impl CounterTrend {
    /// Whether the last value is above the first: errors still accumulating.
    pub fn growing(&self) -> bool {
        matches!((self.values.first(), self.values.last()), (Some(a), Some(b)) if b.1 > a.1)
    }
}

/// Something no single finding names, inferred from the pattern of findings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Suspect {
    pub component: Component,
    pub action: Action,
    pub reason: String,
}

/// Analyzes one cycle's attempts (any order; passed attempts may be included).
pub fn analyze(node: NodeInput<'_>, attempts: &[AttemptInput<'_>]) -> Analysis {
    let mut ordered: Vec<&AttemptInput<'_>> = attempts.iter().collect();
    ordered.sort_by_key(|a| a.attempt);

    let mut components: Vec<Building> = Vec::new();
    let mut summaries = Vec::new();
    for a in &ordered {
        let mut summary = AttemptSummary {
            attempt: a.attempt,
            failed: Vec::new(),
            errored: Vec::new(),
        };
        for (check, finding) in attempt_findings(node, a, &mut summary) {
            add(&mut components, a.attempt, &check, finding);
        }
        summaries.push(summary);
    }

    let mut reports: Vec<ComponentReport> = components
        .into_iter()
        .map(|b| b.finish(&summaries))
        .collect();
    reports.sort_by(|a, b| {
        (
            a.action.rank(),
            a.component.kind,
            a.component.index,
            &a.component.name,
        )
            .cmp(&(
                b.action.rank(),
                b.component.kind,
                b.component.index,
                &b.component.name,
            ))
    });
    let suspects = board_suspects(&reports);
    let components_left_out = reports.len().saturating_sub(COMPONENTS_MAX);
    reports.truncate(COMPONENTS_MAX);

    let action = reports
        .iter()
        .map(|c| c.action)
        .chain(suspects.iter().map(|s| s.action))
        .min_by_key(|a| a.rank());
    let headline = match reports.first() {
        None => "no findings".to_string(),
        Some(first) => {
            let more = reports.len() - 1 + components_left_out;
            if more == 0 {
                first.headline.clone()
            } else {
                format!(
                    "{} (and {more} more component{})",
                    first.headline,
                    if more == 1 { "" } else { "s" }
                )
            }
        }
    };
    Analysis {
        version: ANALYSIS_VERSION,
        action,
        headline,
        components: reports,
        components_left_out,
        suspects,
        attempts: summaries,
    }
}

/// The findings of one attempt with the check each came from: the checks' own, fallbacks for
/// failed checks without any, and the could-not-run errors folded.
fn attempt_findings(
    node: NodeInput<'_>,
    a: &AttemptInput<'_>,
    summary: &mut AttemptSummary,
) -> Vec<(String, Finding)> {
    let mut out = Vec::new();
    let mut refused: Vec<&CheckInput<'_>> = Vec::new();
    // (component key, message) -> (component, checks, message)
    let mut errors: BTreeMap<(String, String), (Component, Vec<&str>, String)> = BTreeMap::new();
    for c in &a.checks {
        match c.outcome {
            Outcome::Pass | Outcome::Other => {}
            Outcome::Fail => {
                summary.failed.push(c.name.to_string());
                if c.findings.is_empty() {
                    out.push((c.name.to_string(), fallback_finding(c.name, c.message)));
                } else {
                    out.extend(c.findings.iter().map(|f| (c.name.to_string(), f.clone())));
                }
            }
            Outcome::Error => {
                summary.errored.push(c.name.to_string());
                if is_connection_failure(c.message) {
                    refused.push(c);
                } else {
                    let component = component_of_check(c.name);
                    let message = strip_name(c.name, c.message).to_string();
                    errors
                        .entry((component.key(), message.clone()))
                        .or_insert_with(|| (component, Vec::new(), message))
                        .1
                        .push(c.name);
                }
            }
        }
    }
    if !refused.is_empty() {
        out.push((
            "node_access".to_string(),
            unreachable_finding(node, &refused),
        ));
    }
    for (component, checks, message) in errors.into_values() {
        let what = if checks.len() == 1 {
            format!("{} could not run: {message}", checks[0])
        } else {
            format!("{} checks could not run: {message}", checks.len())
        };
        let mut f = Finding::new(component, "check_error", Action::Investigate, what);
        if checks.len() > 1 {
            f.push_evidence(format!("checks: {}", checks.join(", ")));
        }
        let check = if checks.len() == 1 {
            checks[0].to_string()
        } else {
            "checks".to_string()
        };
        out.push((check, f));
    }
    out
}

/// Words of errors that mean nothing answered: the node (or its BMC) is off, off the network,
/// or refusing, so every check of the attempt fails the same way.
const CONNECTION_WORDS: [&str; 9] = [
    "connection refused",
    "cannot connect",
    "could not connect",
    "no route to host",
    "host is unreachable",
    "network is unreachable",
    "no connection within",
    "connection reset",
    "node unreachable",
];

fn is_connection_failure(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    CONNECTION_WORDS.iter().any(|w| m.contains(w))
}

/// `gpu_ecc: ssh ...` -> `ssh ...`: the check name is in the finding already.
fn strip_name<'m>(name: &str, message: &'m str) -> &'m str {
    message
        .strip_prefix(name)
        .and_then(|m| m.strip_prefix(": "))
        .unwrap_or(message)
}

/// One finding for an attempt in which nothing answered: which addresses were tried and what
/// each said, instead of one near-identical error per check.
fn unreachable_finding(node: NodeInput<'_>, refused: &[&CheckInput<'_>]) -> Finding {
    let mut tried = BTreeSet::new();
    let mut lines: Vec<String> = Vec::new();
    for c in refused {
        let m = strip_name(c.name, c.message);
        let lower = m.to_ascii_lowercase();
        if let Some(target) = ssh_target(m) {
            tried.insert(format!("SSH {target}"));
        } else if lower.contains("bmc") || lower.contains("redfish") || lower.starts_with("get ") {
            tried.insert(format!("BMC {}", node.bmc_address));
        } else {
            tried.insert(format!("node {}", node.hostname));
        }
        if !lines.iter().any(|l| l == m) {
            lines.push(m.to_string());
        }
    }
    let tried: Vec<String> = tried.into_iter().collect();
    let mut f = Finding::new(
        Component::node().name(node.hostname),
        "unreachable",
        Action::Investigate,
        format!(
            "unreachable: {} refused or did not answer ({} checks could not run); check power, \
             cabling and the management network",
            tried.join(" and "),
            refused.len()
        ),
    );
    const NAMES_SHOWN: usize = 12;
    let names: Vec<&str> = refused.iter().map(|c| c.name).collect();
    let mut checks = names
        .iter()
        .take(NAMES_SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > NAMES_SHOWN {
        checks.push_str(&format!(" and {} more", names.len() - NAMES_SHOWN));
    }
    f.push_evidence(format!("checks that could not run: {checks}"));
    for l in lines.into_iter().take(ERROR_LINES_MAX - 1) {
        f.push_evidence(l);
    }
    f
}

/// `ssh root@10.0.0.7:22: Connection refused` (possibly after `node unreachable: `) ->
/// `root@10.0.0.7:22`.
fn ssh_target(message: &str) -> Option<&str> {
    let at = message.find("ssh ")?;
    let rest = &message[at + 4..];
    let end = rest.find(": ").unwrap_or(rest.len());
    let target = &rest[..end];
    (!target.is_empty() && !target.contains(' ')).then_some(target)
}

/// The component a check is about, from its name (playbook step names default to the kind).
pub fn component_of_check(name: &str) -> Component {
    let n = name.to_ascii_lowercase();
    let kind = if n.starts_with("gpu") || n.starts_with("dcgm") || n.starts_with("nvlink") {
        ComponentKind::Gpu
    } else if n.starts_with("infiniband") || n.starts_with("ib_") {
        ComponentKind::Hca
    } else if n.starts_with("ethernet") || n.starts_with("eth") || n.starts_with("nic") {
        ComponentKind::Nic
    } else if n.starts_with("bmc") || n.starts_with("redfish") {
        ComponentKind::Bmc
    } else if n.starts_with("disk") || n.starts_with("fio") || n.starts_with("nvme") {
        ComponentKind::Disk
    } else {
        ComponentKind::Node
    };
    Component::new(kind)
}

/// Words in a message that point at firmware levels.
const FIRMWARE_WORDS: [&str; 4] = ["firmware", "fw_ver", "vbios", "bios version"];

/// The finding for a failed check that made none (custom steps, timeouts, older results):
/// component from the check's name, action from its name and message.
pub fn fallback_finding(check: &str, message: &str) -> Finding {
    let component = component_of_check(check);
    let name = check.to_ascii_lowercase();
    let text = message.to_ascii_lowercase();
    let action = if name.contains("firmware") || FIRMWARE_WORDS.iter().any(|w| text.contains(w)) {
        Action::ReflashFirmware
    } else if ["temperature", "thermal", "overheat"]
        .iter()
        .any(|w| text.contains(w) || name.contains(w))
    {
        Action::Cooling
    } else if matches!(component.kind, ComponentKind::Hca | ComponentKind::Nic)
        || ["link down", "operstate", "cable", "carrier"]
            .iter()
            .any(|w| text.contains(w))
    {
        Action::ReseatCable
    } else {
        Action::Investigate
    };
    Finding::new(
        component,
        "check_failed",
        action,
        format!("{check}: {}", strip_name(check, message)),
    )
}

/// A component being assembled from findings.
struct Building {
    component: Component,
    findings: Vec<FindingReport>,
    /// attempt -> codes found then.
    by_attempt: BTreeMap<u32, BTreeSet<String>>,
    checks: BTreeSet<String>,
    counters: BTreeMap<String, BTreeMap<u32, u64>>,
}

/// Whether two components are the same part: same kind, no identifier that both know differs,
/// and at least one that both know agrees (a DCGM finding knows the GPU index, an Xid finding
/// the PCI address, the probe all of them). Two parts with nothing to compare (the node) are
/// the same when neither names anything.
fn same_part(a: &Component, b: &Component) -> bool {
    if a.kind != b.kind {
        return false;
    }
    // One node per analysis: its findings (unreachable, driver, services) are one entry.
    if a.kind == ComponentKind::Node {
        return true;
    }
    let pci = |c: &Component| c.pci_address.as_deref().map(normalize_pci);
    let mut agree = 0;
    let mut known_a = 0;
    let mut known_b = 0;
    let mut compare = |x: Option<String>, y: Option<String>| -> bool {
        known_a += usize::from(x.is_some());
        known_b += usize::from(y.is_some());
        match (x, y) {
            (Some(x), Some(y)) if x != y => false,
            (Some(_), Some(_)) => {
                agree += 1;
                true
            }
            _ => true,
        }
    };
    let consistent = compare(
        a.index.map(|i| i.to_string()),
        b.index.map(|i| i.to_string()),
    ) && compare(a.serial.clone(), b.serial.clone())
        && compare(a.uuid.clone(), b.uuid.clone())
        && compare(pci(a), pci(b))
        && compare(a.name.clone(), b.name.clone())
        && compare(a.slot.clone(), b.slot.clone());
    consistent && (agree > 0 || (known_a == 0 && known_b == 0))
}

/// `00000000:3B:00.0` (NVML) and `0000:3b:00.0` (sysfs, kernel log) are the same address.
fn normalize_pci(p: &str) -> String {
    let lower = p.to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if rest.contains(':') => {
            let d = domain.trim_start_matches('0');
            format!("{}:{rest}", if d.is_empty() { "0" } else { d })
        }
        _ => format!("0:{lower}"),
    }
}

/// Fills what `into` does not know from `from`.
fn merge_identity(into: &mut Component, from: &Component) {
    fn fill<T: Clone>(a: &mut Option<T>, b: &Option<T>) {
        if a.is_none() {
            a.clone_from(b);
        }
    }
    fill(&mut into.index, &from.index);
    fill(&mut into.name, &from.name);
    fill(&mut into.serial, &from.serial);
    fill(&mut into.uuid, &from.uuid);
    fill(&mut into.pci_address, &from.pci_address);
    fill(&mut into.slot, &from.slot);
}

fn add(components: &mut Vec<Building>, attempt: u32, check: &str, f: Finding) {
    let at = match components
        .iter()
        .position(|b| same_part(&b.component, &f.component))
    {
        Some(i) => {
            merge_identity(&mut components[i].component, &f.component);
            i
        }
        None => {
            components.push(Building {
                component: f.component.clone(),
                findings: Vec::new(),
                by_attempt: BTreeMap::new(),
                checks: BTreeSet::new(),
                counters: BTreeMap::new(),
            });
            components.len() - 1
        }
    };
    let b = &mut components[at];
    b.checks.insert(check.to_string());
    b.by_attempt
        .entry(attempt)
        .or_default()
        .insert(f.code.clone());
    for (name, v) in &f.counters {
        let slot = b
            .counters
            .entry(name.clone())
            .or_default()
            .entry(attempt)
            .or_insert(*v);
        *slot = (*slot).max(*v);
    }
    let known = b
        .findings
        .iter()
        .position(|r| r.check == check && r.code == f.code);
    match known {
        Some(i) => {
            let r = &mut b.findings[i];
            // Attempts arrive in order: the latest attempt's words and evidence win.
            if r.attempts.last() != Some(&attempt) {
                r.attempts.push(attempt);
            }
            if f.action.rank() < r.action.rank() {
                r.action = f.action;
            }
            r.message = f.message;
            r.evidence = f.evidence;
        }
        None if b.findings.len() < COMPONENT_FINDINGS_MAX => b.findings.push(FindingReport {
            check: check.to_string(),
            code: f.code,
            action: f.action,
            message: f.message,
            evidence: f.evidence,
            attempts: vec![attempt],
        }),
        None => {}
    }
}

impl Building {
    fn finish(self, attempts: &[AttemptSummary]) -> ComponentReport {
        let mut findings = self.findings;
        findings.sort_by_key(|f| f.action.rank());
        let action = findings
            .first()
            .map(|f| f.action)
            .unwrap_or(Action::Investigate);
        let per_attempt = attempts
            .iter()
            .map(|a| match self.by_attempt.get(&a.attempt) {
                Some(codes) => ComponentAttempt {
                    attempt: a.attempt,
                    result: ComponentResult::Fail,
                    codes: codes.iter().cloned().collect(),
                },
                None => ComponentAttempt {
                    attempt: a.attempt,
                    result: if a.errored.iter().any(|c| self.checks.contains(c)) {
                        ComponentResult::Error
                    } else {
                        ComponentResult::Clear
                    },
                    codes: Vec::new(),
                },
            })
            .collect();
        let counters = self
            .counters
            .into_iter()
            .map(|(name, values)| CounterTrend {
                name,
                values: values.into_iter().collect(),
            })
            .collect();
        let headline = headline(&self.component, action, &findings);
        ComponentReport {
            component: self.component,
            action,
            headline,
            findings,
            attempts: per_attempt,
            counters,
        }
    }
}

/// `GPU 3, serial 1654922006537, SXM slot 3`: the component as a person finds it in the rack.
pub fn component_words(c: &Component) -> String {
    let mut first = c.kind.label().to_string();
    if let Some(i) = c.index {
        first.push_str(&format!(" {i}"));
    }
    if let Some(n) = &c.name {
        first.push_str(&format!(" {n}"));
    }
    let mut parts = vec![first];
    if let Some(s) = &c.serial {
        parts.push(format!("serial {s}"));
    }
    if let Some(s) = &c.slot {
        parts.push(s.clone());
    }
    if c.serial.is_none() && c.slot.is_none() {
        if let Some(p) = &c.pci_address {
            parts.push(p.clone());
        }
    }
    parts.join(", ")
}

/// `xid_79` -> `Xid 79`, `row_remap_failure` -> `row remap failure`; DCGM's codes as they are.
pub fn code_words(code: &str) -> String {
    if let Some(n) = code.strip_prefix("xid_") {
        return format!("Xid {n}");
    }
    if let Some(n) = code.strip_prefix("sxid_") {
        return format!("SXid {n}");
    }
    if code.starts_with("DCGM_FR_") {
        return code.to_string();
    }
    code.replace('_', " ")
}

/// What to do, for the headline's tail.
pub fn instruction(action: Action, kind: ComponentKind) -> &'static str {
    match (action, kind) {
        (Action::Rma, ComponentKind::Gpu | ComponentKind::Nvswitch) => {
            "run NVIDIA field diagnostic, attach nvidia-bug-report.log.gz"
        }
        (Action::Rma, _) => "replace the part",
        (Action::ResetGpu, _) => "reset the GPU (nvidia-smi -r) and burn in again",
        (Action::Reboot, _) => "reboot the node and burn in again",
        (Action::ReflashFirmware, _) => "flash the baseline firmware and burn in again",
        (Action::ReseatCable, _) => "reseat the cable and transceiver; replace them if it recurs",
        (Action::Config, _) => "fix the configuration (driver, services, settings)",
        (Action::Cooling, _) => "check airflow, fans and inlet temperature",
        (Action::Investigate, _) => "read the evidence",
    }
}

fn headline(c: &Component, action: Action, findings: &[FindingReport]) -> String {
    let mut titles: Vec<String> = Vec::new();
    for f in findings.iter().filter(|f| f.action == action) {
        let t = code_words(&f.code);
        if !titles.contains(&t) {
            titles.push(t);
        }
    }
    // A fault only the checks' own words describe (fallbacks, errors): its message.
    let what = match findings.first() {
        Some(f)
            if titles.len() == 1
                && matches!(
                    f.code.as_str(),
                    "check_failed" | "check_error" | "unreachable"
                ) =>
        {
            f.message.clone()
        }
        _ => titles.join(" + "),
    };
    format!(
        "{}: {}: {what}; {}",
        action.label(),
        component_words(c),
        instruction(action, c.kind)
    )
}

/// Different GPUs failing in different attempts: what they share is the suspect.
fn board_suspects(components: &[ComponentReport]) -> Vec<Suspect> {
    // attempt -> GPUs (their display) that failed in it.
    let mut failing: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
    for c in components
        .iter()
        .filter(|c| c.component.kind == ComponentKind::Gpu && c.action != Action::Config)
    {
        for a in c
            .attempts
            .iter()
            .filter(|a| a.result == ComponentResult::Fail)
        {
            failing
                .entry(a.attempt)
                .or_default()
                .insert(component_words(&c.component));
        }
    }
    let sets: Vec<&BTreeSet<String>> = failing.values().collect();
    let union: BTreeSet<&String> = sets.iter().flat_map(|s| s.iter()).collect();
    let varies = sets.windows(2).any(|w| w[0] != w[1]);
    if sets.len() < 2 || union.len() < 2 || !varies {
        return Vec::new();
    }
    let pattern = failing
        .iter()
        .map(|(a, gpus)| {
            format!(
                "attempt {a}: {}",
                gpus.iter().cloned().collect::<Vec<_>>().join("; ")
            )
        })
        .collect::<Vec<_>>()
        .join(" | ");
    vec![Suspect {
        component: Component::new(ComponentKind::Board),
        action: Action::Investigate,
        reason: format!(
            "board/power suspect: different GPUs failed in different attempts ({pattern}); \
             look at what they share (baseboard, NVSwitch, power, cooling) before replacing a GPU"
        ),
    }]
}

#[cfg(test)]
mod tests;
