//! Playbooks: YAML files that say which checks run on a kind of node, in what order, with
//! which thresholds. The loader refuses a bad playbook whole, naming the line, the field
//! and the reason for every problem it finds (unknown check, unknown field, wrong type,
//! value out of range, duplicate step name). See docs/checks.md for the format.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use crate::check::{run_check, Check, CheckContext, CheckResult, Verdict};
use crate::disk::{DiskCheck, DiskSpec};
use crate::gpu::telemetry::{self, TelemetryCheck, TelemetrySpec};
use crate::gpu::{GpuCheck, GpuThresholds, ProbeSettings};
use crate::nic::{EthernetExpect, InfinibandExpect, NicCheck, NicExpect};
use crate::redfish::{BmcCheck, BmcSpec};
use crate::scripted::ScriptedCheck;
use crate::stress::{StressCheck, StressSpec};
use crate::yaml::{self, Fields, LoadError};

/// Most steps in one playbook.
pub const STEPS_MAX: usize = 200;
/// Longest run a playbook may ask for (three days: a 24 h GPU burn, 24 h of CPU and memory
/// stress and the rest, as Ironic's defaults would add up).
pub const RUN_TIMEOUT_S_MAX: u64 = 259_200;
/// The burn-in duration of a playbook that names none: 12 hours, as MAAS's long stress-ng
/// tests (Ironic's burn-in steps default to 24 hours each). Commands use it as `{burn_in_s}`.
pub const BURN_IN_S_DEFAULT: u64 = 43_200;
/// Margin a step that runs for `{burn_in_s}` gets on top of it before its timeout.
const BURN_IN_MARGIN_S: u64 = 3_600;

const TOP_FIELDS: [&str; 7] = [
    "playbook",
    "description",
    "gpu_models",
    "timeout_s",
    "burn_in_s",
    "probe",
    "checks",
];
const STEP_FIELDS: [&str; 3] = ["check", "name", "timeout_s"];

#[derive(Debug, Clone, PartialEq)]
pub struct Playbook {
    pub name: String,
    pub description: String,
    /// Manifest `gpu_model` labels this playbook is for (empty: nodes without GPUs).
    pub gpu_models: Vec<String>,
    /// Budget for the whole run: the agent sets `CheckContext::deadline` to now + this.
    pub timeout: Duration,
    /// How long the stress steps that say `{burn_in_s}` run.
    pub burn_in: Duration,
    pub probe: ProbeSettings,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Result name, unique in the playbook (defaults to the check kind).
    pub name: String,
    pub kind: String,
    /// 1-based line of the step in the file.
    pub line: usize,
    pub timeout: Duration,
    pub spec: Spec,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    Gpu(GpuThresholds),
    Telemetry(TelemetrySpec),
    Infiniband(InfinibandExpect),
    Ethernet(EthernetExpect),
    Stress(StressSpec),
    Bmc(BmcSpec),
    Disk(DiskSpec),
    Scripted(ScriptedCheck),
}

/// Every check kind a playbook may name.
pub fn check_kinds() -> Vec<&'static str> {
    let mut k: Vec<&'static str> = GpuThresholds::KINDS.to_vec();
    k.push("gpu_telemetry");
    k.extend(["infiniband", "ethernet"]);
    k.extend(StressSpec::KINDS);
    k.extend(BmcSpec::KINDS);
    k.extend(DiskSpec::KINDS);
    k.push("scripted");
    k
}

/// Default per-step timeout by kind, seconds.
fn default_timeout_s(kind: &str) -> u64 {
    match kind {
        "dcgm_diag" | "gpu_burn" | "command" | "fio_verify" => 3600,
        k if k.starts_with("gpu_") => 180,
        k if k.starts_with("bmc_") => 120,
        _ => 60,
    }
}

/// All problems found in one playbook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaybookError {
    /// The file, when loaded from one.
    pub source: Option<String>,
    pub errors: Vec<LoadError>,
}

impl fmt::Display for PlaybookError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let src = self.source.as_deref().unwrap_or("playbook");
        write!(f, "{src}: {} problem(s)", self.errors.len())?;
        for e in &self.errors {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PlaybookError {}

impl Playbook {
    pub fn load_file(path: &Path) -> Result<Playbook, PlaybookError> {
        let source = Some(path.display().to_string());
        let text = std::fs::read_to_string(path).map_err(|e| PlaybookError {
            source: source.clone(),
            errors: vec![LoadError {
                line: 0,
                field: String::new(),
                reason: format!("cannot read: {e}"),
            }],
        })?;
        Playbook::parse(&text).map_err(|mut e| {
            e.source = source;
            e
        })
    }

    /// Parses and validates a playbook; every problem is reported, not just the first.
    pub fn parse(text: &str) -> Result<Playbook, PlaybookError> {
        let fail = |errors| PlaybookError {
            source: None,
            errors,
        };
        let root = yaml::parse(text).map_err(|e| fail(vec![e]))?;
        let mut errors = Vec::new();
        let Some(mut top) = Fields::of(&root, "", &mut errors) else {
            return Err(fail(errors));
        };
        let name = top.req_str("playbook", &mut errors);
        let description = top.opt_str("description", &mut errors).unwrap_or_default();
        let gpu_models = top
            .opt_str_list("gpu_models", None, &mut errors)
            .unwrap_or_default();
        let timeout_s = top.opt_u64("timeout_s", 1..=RUN_TIMEOUT_S_MAX, &mut errors);
        let burn_in_s = top
            .opt_u64("burn_in_s", 60..=RUN_TIMEOUT_S_MAX, &mut errors)
            .unwrap_or(BURN_IN_S_DEFAULT);
        let probe = match top.take("probe") {
            Some(node) => parse_probe(node, &mut errors),
            None => ProbeSettings::default(),
        };
        let steps = match top.take("checks") {
            Some(node) => parse_steps(node, timeout_s, burn_in_s, &mut errors),
            None => {
                top.missing("checks", &mut errors);
                Vec::new()
            }
        };
        // Without a `timeout_s`, the run may take as long as all its steps together.
        let timeout_s = timeout_s.unwrap_or_else(|| {
            steps
                .iter()
                .map(|s| s.timeout.as_secs())
                .sum::<u64>()
                .clamp(1, RUN_TIMEOUT_S_MAX)
        });
        top.finish(&TOP_FIELDS, &mut errors);
        if !errors.is_empty() {
            errors.sort_by_key(|e| e.line);
            return Err(fail(errors));
        }
        Ok(Playbook {
            name: name.unwrap_or_default(),
            description,
            gpu_models,
            timeout: Duration::from_secs(timeout_s),
            burn_in: Duration::from_secs(burn_in_s),
            probe,
            steps,
        })
    }

    /// The checks of this playbook, in order, each with its timeout.
    pub fn checks(&self) -> Vec<(Box<dyn Check>, Duration)> {
        self.steps
            .iter()
            .map(|s| (s.instantiate(&self.probe), s.timeout))
            .collect()
    }

    /// Runs every step in order under the context's deadline (and each step's timeout).
    /// Steps after the deadline are not started and report `Error`. A stress step that a
    /// `gpu_telemetry` step names in `during` runs with that step's sampler beside it; the
    /// samples wait in the context for the telemetry step's turn.
    pub async fn run(&self, ctx: &CheckContext) -> PlaybookRun {
        let mut results = Vec::with_capacity(self.steps.len());
        for (step, (check, timeout)) in self.steps.iter().zip(self.checks()) {
            let sampler = self.steps.iter().find_map(|s| match &s.spec {
                Spec::Telemetry(t) if t.during.contains(&step.name) => Some((s.name.as_str(), t)),
                _ => None,
            });
            let result = match sampler {
                None => run_check(check.as_ref(), ctx, Some(timeout)).await,
                Some((telemetry_step, spec)) => {
                    let (stop, stopped) = tokio::sync::watch::channel(false);
                    let stress = async {
                        let r = run_check(check.as_ref(), ctx, Some(timeout)).await;
                        let _ = stop.send(true);
                        r
                    };
                    let sampling = telemetry::sample_until(ctx, spec, &step.name, stopped);
                    let (r, window) = tokio::join!(stress, sampling);
                    ctx.add_telemetry_window(telemetry_step, window).await;
                    r
                }
            };
            results.push(result);
        }
        PlaybookRun {
            playbook: self.name.clone(),
            verdict: Verdict::combine(results.iter().map(|r| r.verdict)),
            results,
        }
    }
}

/// The results of one playbook run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlaybookRun {
    pub playbook: String,
    pub verdict: Verdict,
    pub results: Vec<CheckResult>,
}

impl Step {
    fn instantiate(&self, probe: &ProbeSettings) -> Box<dyn Check> {
        let name = self.name.clone();
        match &self.spec {
            Spec::Gpu(t) => Box::new(GpuCheck {
                name,
                probe: probe.clone(),
                thresholds: t.clone(),
            }),
            Spec::Telemetry(t) => Box::new(TelemetryCheck {
                name,
                spec: t.clone(),
            }),
            Spec::Infiniband(t) => Box::new(NicCheck {
                name,
                kind: NicExpect::Infiniband(t.clone()),
                command_timeout: self.timeout,
            }),
            Spec::Ethernet(t) => Box::new(NicCheck {
                name,
                kind: NicExpect::Ethernet(t.clone()),
                command_timeout: self.timeout,
            }),
            Spec::Stress(s) => Box::new(StressCheck {
                name,
                spec: s.clone(),
                timeout: self.timeout,
            }),
            Spec::Bmc(b) => Box::new(BmcCheck {
                name,
                spec: b.clone(),
            }),
            Spec::Disk(d) => Box::new(DiskCheck {
                name,
                spec: d.clone(),
                timeout: self.timeout,
            }),
            Spec::Scripted(s) => {
                let mut s = s.clone();
                s.name = name;
                Box::new(s)
            }
        }
    }
}

fn parse_probe(node: &yaml::Node, errors: &mut Vec<LoadError>) -> ProbeSettings {
    let mut out = ProbeSettings::default();
    let Some(mut f) = Fields::of(node, "probe", errors) else {
        return out;
    };
    if let Some(c) = f.opt_str("command", errors) {
        out.command = c;
    }
    if let Some(t) = f.opt_u64("timeout_s", 1..=3600, errors) {
        out.timeout = Duration::from_secs(t);
    }
    f.finish(&["command", "timeout_s"], errors);
    out
}

fn parse_steps(
    node: &yaml::Node,
    run_timeout_s: Option<u64>,
    burn_in_s: u64,
    errors: &mut Vec<LoadError>,
) -> Vec<Step> {
    let timeout_max = run_timeout_s.unwrap_or(RUN_TIMEOUT_S_MAX);
    let yaml::Value::Seq(items) = &node.value else {
        errors.push(LoadError {
            line: node.line,
            field: "checks".into(),
            reason: format!("expected a list of checks, got {}", node.kind()),
        });
        return Vec::new();
    };
    if items.is_empty() {
        errors.push(LoadError {
            line: node.line,
            field: "checks".into(),
            reason: "a playbook needs at least one check".into(),
        });
    }
    if items.len() > STEPS_MAX {
        errors.push(LoadError {
            line: node.line,
            field: "checks".into(),
            reason: format!("{} checks; at most {STEPS_MAX}", items.len()),
        });
        return Vec::new();
    }
    let kinds = check_kinds();
    let mut steps: Vec<Step> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("checks[{i}]");
        let Some(mut f) = Fields::of(item, &path, errors) else {
            continue;
        };
        let Some(kind) = f.req_str("check", errors) else {
            // Without a kind its other fields cannot be judged: report only the missing kind.
            continue;
        };
        if !kinds.contains(&kind.as_str()) {
            let line = item_key_line(item, "check");
            errors.push(LoadError {
                line,
                field: format!("{path}.check"),
                reason: format!("unknown check {kind:?}; known checks: {}", kinds.join(", ")),
            });
            continue;
        }
        let name = f.opt_str("name", errors).unwrap_or_else(|| kind.clone());
        let timeout_s = f.opt_u64("timeout_s", 1..=timeout_max, errors);
        let before = errors.len();
        let (spec, fields): (Option<Spec>, &[&str]) =
            if let Some(k) = GpuThresholds::KINDS.iter().find(|k| **k == kind) {
                (
                    GpuThresholds::parse(k, &mut f, errors).map(Spec::Gpu),
                    GpuThresholds::fields(k),
                )
            } else if kind == "gpu_telemetry" {
                let spec = TelemetrySpec::parse(&mut f, errors);
                if let Some(t) = &spec {
                    check_during(&path, item, t, &steps, errors);
                }
                (spec.map(Spec::Telemetry), &TelemetrySpec::FIELDS)
            } else if kind == "infiniband" {
                (
                    InfinibandExpect::parse(&mut f, errors).map(Spec::Infiniband),
                    &InfinibandExpect::FIELDS,
                )
            } else if kind == "ethernet" {
                (
                    EthernetExpect::parse(&mut f, errors).map(Spec::Ethernet),
                    &EthernetExpect::FIELDS,
                )
            } else if StressSpec::KINDS.contains(&kind.as_str()) {
                (
                    StressSpec::parse(&kind, &mut f, errors).map(Spec::Stress),
                    StressSpec::fields(&kind),
                )
            } else if DiskSpec::KINDS.contains(&kind.as_str()) {
                (
                    DiskSpec::parse(&kind, &mut f, errors).map(Spec::Disk),
                    DiskSpec::fields(&kind),
                )
            } else if BmcSpec::KINDS.contains(&kind.as_str()) {
                (
                    BmcSpec::parse(&kind, &mut f, errors).map(Spec::Bmc),
                    BmcSpec::fields(&kind),
                )
            } else {
                (
                    ScriptedCheck::parse(&name, &mut f, errors).map(Spec::Scripted),
                    &ScriptedCheck::FIELDS,
                )
            };
        let allowed: Vec<&str> = STEP_FIELDS.iter().chain(fields.iter()).copied().collect();
        f.finish(&allowed, errors);
        if let Some(prev) = steps.iter().find(|s| s.name == name) {
            errors.push(LoadError {
                line: item.line,
                field: format!("{path}.name"),
                reason: format!(
                    "duplicate step name {name:?} (first at line {}); give one a `name:`",
                    prev.line
                ),
            });
            continue;
        }
        if let (Some(mut spec), true) = (spec, errors.len() == before) {
            let long = spec.substitute_burn_in(burn_in_s);
            // A step that runs for the burn-in duration gets it plus a margin by default.
            let default = if long {
                burn_in_s + BURN_IN_MARGIN_S
            } else {
                default_timeout_s(&kind)
            };
            let timeout_s = timeout_s.unwrap_or(default.min(timeout_max));
            steps.push(Step {
                name,
                kind,
                line: item.line,
                timeout: Duration::from_secs(timeout_s),
                spec,
            });
        }
    }
    steps
}

/// A telemetry step samples during earlier stress steps, each sampled by one telemetry step.
fn check_during(
    path: &str,
    item: &yaml::Node,
    t: &TelemetrySpec,
    steps: &[Step],
    errors: &mut Vec<LoadError>,
) {
    let line = item_key_line(item, "during");
    if t.during.is_empty() {
        errors.push(LoadError {
            line,
            field: format!("{path}.during"),
            reason: "name at least one stress step to sample during".into(),
        });
    }
    for (i, d) in t.during.iter().enumerate() {
        let field = format!("{path}.during[{i}]");
        match steps.iter().find(|s| &s.name == d) {
            None => errors.push(LoadError {
                line,
                field,
                reason: format!("no earlier step named {d:?}; a telemetry step samples during stress steps that come before it"),
            }),
            Some(s) if !matches!(s.spec, Spec::Stress(_)) => errors.push(LoadError {
                line,
                field,
                reason: format!("{d:?} is a {} step, not a stress step (dcgm_diag, gpu_burn, command)", s.kind),
            }),
            Some(_) => {
                let other = steps.iter().find(|s| {
                    matches!(&s.spec, Spec::Telemetry(o) if o.during.contains(d))
                });
                if let Some(o) = other {
                    errors.push(LoadError {
                        line,
                        field,
                        reason: format!("{d:?} is already sampled by {:?} (line {})", o.name, o.line),
                    });
                }
            }
        }
    }
}

impl Spec {
    /// Replaces `{burn_in_s}` in the step's command; true when it was there (the step runs
    /// for the burn-in duration).
    fn substitute_burn_in(&mut self, burn_in_s: u64) -> bool {
        const MARK: &str = "{burn_in_s}";
        let command = match self {
            Spec::Stress(s) => s.command_mut(),
            Spec::Disk(d) => d.command_mut(),
            _ => return false,
        };
        if !command.contains(MARK) {
            return false;
        }
        *command = command.replace(MARK, &burn_in_s.to_string());
        true
    }
}

/// The line of `key` inside a mapping node (the node's own line if absent).
fn item_key_line(node: &yaml::Node, key: &str) -> usize {
    match &node.value {
        yaml::Value::Map(entries) => entries
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, line, _)| *line)
            .unwrap_or(node.line),
        _ => node.line,
    }
}
