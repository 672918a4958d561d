//! `dcgmi diag --json`: both layouts DCGM has written, and the verdict.
//!
//! - DCGM 4.x (`dcgmi/Diag.cpp`, `HelperJsonBuildOutput`): root `"DCGM Diagnostic"` ->
//!   `test_categories[]` -> `tests[]` (`name` such as `memory`, `test_summary`) -> `results[]`
//!   with `entity_group` (`GPU`, `CPU`), `entity_group_id`, `entity_id`, `status`, `warnings[]`
//!   of `{warning, error_id, error_category, error_severity}` and `info[]`; beside it
//!   `entity_groups[]` (entities with `serial_num`) and `metadata` (`version`, driver); a run
//!   that could not start has `"DCGM Diagnostic".runtime_error`. Warn is written as `Fail`.
//! - DCGM 2.x/3.x: root `"DCGM GPU Diagnostic"`, tests with human names (`GPU Memory`,
//!   `Targeted Stress`) and `results[]` with `gpu_ids`; Deployment checks are separate tests.
//!
//! Test names are made canonical (`GPU Memory` -> `memory`, every Deployment test ->
//! `software`), so one required-test list serves both layouts.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{json, Value};

use crate::check::CheckResult;
use crate::finding::{
    dcgm_category_name, dcgm_code, dcgm_severity_name, Action, Component, ComponentKind, Finding,
};

/// The tests `dcgmi diag -r LEVEL` runs that a burn-in requires, by level (DCGM 4.6.0
/// `NvidiaValidationSuite::FillTestVectors`: medium adds pcie and memory; long adds
/// diagnostic, memory_bandwidth, targeted_stress and targeted_power; xlong adds memtest and
/// pulse_test). Plugins a node may legitimately skip (eud without root, nvbandwidth, nccl)
/// are not required.
pub fn required_tests(level: u64) -> Vec<String> {
    let mut t = vec!["software"];
    if level >= 2 {
        t.extend(["pcie", "memory"]);
    }
    if level >= 3 {
        t.extend([
            "diagnostic",
            "memory_bandwidth",
            "targeted_stress",
            "targeted_power",
        ]);
    }
    if level >= 4 {
        t.extend(["memtest", "pulse_test"]);
    }
    t.into_iter().map(String::from).collect()
}

/// A warning DCGM attached to a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DcgmWarning {
    pub text: String,
    pub error_id: Option<u32>,
    pub category: Option<i64>,
    pub severity: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DcgmResult {
    pub category: String,
    /// The test's name as DCGM wrote it.
    pub test: String,
    /// `software`, `pcie`, `memory`, `targeted_stress`, ...
    pub canonical: String,
    /// `("GPU", 3)`; `None` for node-wide results (3.x Deployment, or several GPUs at once).
    pub entity: Option<(String, u32)>,
    /// Lower case: `pass`, `fail`, `warn`, `skip`, or what DCGM wrote.
    pub status: String,
    pub warnings: Vec<DcgmWarning>,
    pub info: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DcgmReport {
    /// `4.x` or `3.x`.
    pub layout: String,
    pub version: Option<String>,
    pub driver_version: Option<String>,
    pub results: Vec<DcgmResult>,
    /// GPU entity id -> serial number (4.x `entity_groups`).
    pub serials: BTreeMap<u32, String>,
    /// Why the diagnostic did not run (4.x `runtime_error`).
    pub runtime_error: Option<String>,
}

fn str_of(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str).map(str::to_string)
}

/// `GPU Memory` -> `memory`, `Targeted Stress` -> `targeted_stress`; a Deployment-category
/// test of 3.x -> `software` (4.x runs them as one test of that name).
pub fn canonical_test(category: &str, name: &str) -> String {
    if category.eq_ignore_ascii_case("deployment") {
        return "software".into();
    }
    let n = name.trim().to_ascii_lowercase().replace([' ', '-'], "_");
    match n.as_str() {
        "gpu_memory" => "memory".into(),
        _ => n,
    }
}

/// Parses either layout. A report with neither root key, or with no results and no
/// runtime error, is an error (the text is not a DCGM report).
pub fn parse_dcgm_json(text: &str) -> Result<DcgmReport, String> {
    let doc: Value = serde_json::from_str(text.trim()).map_err(|e| format!("not JSON: {e}"))?;
    let (root, layout) = if let Some(r) = doc.get("DCGM Diagnostic") {
        (r, "4.x")
    } else if let Some(r) = doc.get("DCGM GPU Diagnostic") {
        (r, "3.x")
    } else {
        return Err(
            "neither \"DCGM Diagnostic\" (DCGM 4.x) nor \"DCGM GPU Diagnostic\" (3.x) in the JSON"
                .into(),
        );
    };
    let mut report = DcgmReport {
        layout: layout.into(),
        version: str_of(doc.pointer("/metadata/version")).or_else(|| str_of(root.get("version"))),
        driver_version: str_of(doc.pointer("/metadata/Driver Version Detected"))
            .or_else(|| str_of(root.get("Driver Version Detected"))),
        runtime_error: str_of(root.get("runtime_error")).filter(|e| !e.is_empty()),
        ..DcgmReport::default()
    };
    for g in doc
        .get("entity_groups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if g.get("entity_group").and_then(Value::as_str) != Some("GPU") {
            continue;
        }
        for e in g
            .get("entities")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let (Some(id), Some(serial)) = (
                e.get("entity_id").and_then(Value::as_u64),
                str_of(e.get("serial_num")),
            ) {
                if let Ok(id) = u32::try_from(id) {
                    report.serials.insert(id, serial);
                }
            }
        }
    }
    for c in root
        .get("test_categories")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let category = str_of(c.get("category")).unwrap_or_else(|| "?".into());
        for t in c
            .get("tests")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let test = str_of(t.get("name")).unwrap_or_else(|| "?".into());
            let canonical = canonical_test(&category, &test);
            for r in t
                .get("results")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                report.results.push(DcgmResult {
                    category: category.clone(),
                    test: test.clone(),
                    canonical: canonical.clone(),
                    entity: entity_of(r),
                    status: str_of(r.get("status"))
                        .unwrap_or_else(|| "missing".into())
                        .to_ascii_lowercase(),
                    warnings: warnings_of(r),
                    info: texts_of(r.get("info")),
                });
            }
        }
    }
    if report.results.is_empty() && report.runtime_error.is_none() {
        return Err("the JSON holds no test results".into());
    }
    Ok(report)
}

/// 4.x: `entity_group` + `entity_id`; 3.x: `gpu_ids` ("3", or "0,1,2" for a node-wide test).
fn entity_of(r: &Value) -> Option<(String, u32)> {
    if let (Some(group), Some(id)) = (
        str_of(r.get("entity_group")),
        r.get("entity_id").and_then(Value::as_u64),
    ) {
        return u32::try_from(id).ok().map(|id| (group, id));
    }
    let ids = r.get("gpu_ids").or_else(|| r.get("gpu_id"))?;
    let text = match ids {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    if text.contains(',') {
        return None;
    }
    text.trim().parse().ok().map(|id| ("GPU".to_string(), id))
}

fn warnings_of(r: &Value) -> Vec<DcgmWarning> {
    let mut out = Vec::new();
    for key in ["warnings", "warning"] {
        match r.get(key) {
            Some(Value::String(s)) if !s.is_empty() => out.push(DcgmWarning {
                text: s.clone(),
                error_id: None,
                category: None,
                severity: None,
            }),
            Some(Value::Array(items)) => {
                for i in items {
                    match i {
                        Value::String(s) => out.push(DcgmWarning {
                            text: s.clone(),
                            error_id: None,
                            category: None,
                            severity: None,
                        }),
                        Value::Object(o) => out.push(DcgmWarning {
                            text: o
                                .get("warning")
                                .or_else(|| o.get("message"))
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string(),
                            error_id: o
                                .get("error_id")
                                .and_then(Value::as_u64)
                                .and_then(|v| u32::try_from(v).ok()),
                            category: o.get("error_category").and_then(Value::as_i64),
                            severity: o.get("error_severity").and_then(Value::as_i64),
                        }),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    out
}

fn texts_of(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) if !s.is_empty() => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|i| i.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

impl DcgmWarning {
    /// `Sensor ... (DCGM_FR_FAULTY_MEMORY, error 52, severity ISOLATE, category HARDWARE_MEMORY)`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(id) = self.error_id {
            match dcgm_code(id) {
                Some(c) => parts.push(format!("{}, error {id}", c.name)),
                None => parts.push(format!("error {id}")),
            }
        }
        if let Some(s) = self.severity {
            parts.push(format!("severity {}", dcgm_severity_name(s)));
        }
        if let Some(c) = self.category {
            parts.push(format!("category {}", dcgm_category_name(c)));
        }
        if parts.is_empty() {
            self.text.clone()
        } else {
            format!("{} ({})", self.text, parts.join(", "))
        }
    }
}

/// What the verdict is judged against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DcgmExpect {
    /// Canonical names of the tests that must have run (not skipped, not absent).
    pub required_tests: Vec<String>,
    /// Every required per-GPU test must have covered this many GPUs.
    pub gpu_count: u32,
    pub warn_fails: bool,
}

/// The verdict: Fail on any failed result (each DCGM warning a finding with its
/// `DCGM_FR_*` code and the action the DCGM table gives it), on a required test skipped or
/// absent, and on a required test that covered fewer GPUs than the node has; Error when the
/// run did not happen or a status is unknown.
pub fn evaluate_dcgm(name: &str, report: &DcgmReport, expect: &DcgmExpect) -> CheckResult {
    let evidence = serde_json::to_value(report).unwrap_or(Value::Null);
    if let Some(e) = &report.runtime_error {
        return CheckResult::error(name, format!("DCGM diagnostic did not run: {e}"))
            .evidence(evidence);
    }
    let mut findings = Vec::new();
    let mut unknown = Vec::new();
    let mut counts = BTreeMap::<String, u64>::new();
    // (test) -> GPUs with a real result; and tests seen at all / only skipped.
    let mut covered: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    let mut ran: BTreeSet<&str> = BTreeSet::new();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let mut per_gpu_test: BTreeSet<&str> = BTreeSet::new();
    for r in &report.results {
        *counts.entry(r.status.clone()).or_default() += 1;
        seen.insert(&r.canonical);
        let is_gpu = r.entity.as_ref().is_some_and(|(g, _)| g == "GPU");
        if is_gpu {
            per_gpu_test.insert(&r.canonical);
        }
        match r.status.as_str() {
            "pass" | "fail" | "warn" => {
                ran.insert(&r.canonical);
                if let (true, Some((_, id))) = (is_gpu, &r.entity) {
                    covered.entry(&r.canonical).or_default().insert(*id);
                }
            }
            "skip" => {}
            other => unknown.push(format!(
                "{} / {}{}: unrecognised status {other:?}",
                r.category,
                r.test,
                entity_label(r)
            )),
        }
        let failed = r.status == "fail" || (r.status == "warn" && expect.warn_fails);
        if failed {
            findings.extend(result_findings(r, report));
        }
    }
    for t in &expect.required_tests {
        let t = t.as_str();
        if !seen.contains(t) {
            findings.push(Finding::new(
                Component::node(),
                format!("dcgm_{t}_absent"),
                Action::Config,
                format!("required DCGM test {t} is absent from the report (not run: check the run level, DCGM's SKU allowlist and that it runs as root)"),
            ));
        } else if !ran.contains(t) {
            findings.push(Finding::new(
                Component::node(),
                format!("dcgm_{t}_skipped"),
                Action::Config,
                format!("required DCGM test {t} was skipped on every entity"),
            ));
        } else if per_gpu_test.contains(t) {
            let gpus = covered.get(t).map(BTreeSet::len).unwrap_or(0);
            if (gpus as u32) < expect.gpu_count {
                let ids: Vec<String> = covered
                    .get(t)
                    .into_iter()
                    .flatten()
                    .map(u32::to_string)
                    .collect();
                findings.push(Finding::new(
                    Component::new(ComponentKind::Board),
                    format!("dcgm_{t}_gpus"),
                    Action::Investigate,
                    format!(
                        "DCGM test {t} covered {gpus} GPUs ({}), the node has {}",
                        ids.join(", "),
                        expect.gpu_count
                    ),
                ));
            }
        }
    }
    let measured = json!({
        "layout": report.layout,
        "dcgm_version": report.version,
        "status_counts": counts,
        "required_tests": expect.required_tests,
        "gpus_covered": covered.iter().map(|(t, g)| (t.to_string(), g.len())).collect::<BTreeMap<_, _>>(),
    });
    if findings.is_empty() && !unknown.is_empty() {
        return CheckResult::error(name, unknown.join("; "))
            .measured(measured)
            .evidence(evidence);
    }
    CheckResult::from_findings(
        name,
        findings,
        format!(
            "DCGM {} diagnostics passed: {} required tests on {} GPUs ({} results)",
            report.layout,
            expect.required_tests.len(),
            expect.gpu_count,
            report.results.len()
        ),
        measured,
    )
    .evidence(evidence)
}

fn entity_label(r: &DcgmResult) -> String {
    match &r.entity {
        Some((g, id)) => format!(" / {g} {id}"),
        None => String::new(),
    }
}

/// Findings of one failed result: one per DCGM warning (its code decides the action), or
/// one for the result when DCGM said no more.
fn result_findings(r: &DcgmResult, report: &DcgmReport) -> Vec<Finding> {
    let component = match &r.entity {
        Some((g, id)) if g == "GPU" => Component::new(ComponentKind::Gpu)
            .index(*id)
            .serial(report.serials.get(id).cloned()),
        Some((g, id)) if g == "CPU" => Component::new(ComponentKind::Cpu).index(*id),
        _ => Component::node(),
    };
    let who = format!("{} / {}{}", r.category, r.test, entity_label(r));
    let status = if r.status == "warn" { "Warn" } else { "Fail" };
    if r.warnings.is_empty() {
        let mut f = Finding::new(
            component,
            format!("dcgm_{}", r.canonical),
            Action::Investigate,
            format!("{who}: {status}"),
        );
        for i in &r.info {
            f.push_evidence(i.clone());
        }
        return vec![f];
    }
    r.warnings
        .iter()
        .map(|w| {
            let (code, action) = match w.error_id.and_then(dcgm_code) {
                Some(c) => (c.name.clone(), c.action),
                None => (format!("dcgm_{}", r.canonical), Action::Investigate),
            };
            let mut f = Finding::new(
                component.clone(),
                code,
                action,
                format!("{who}: {status}: {}", w.describe()),
            )
            .with_evidence(w.text.clone());
            for i in &r.info {
                f.push_evidence(i.clone());
            }
            f
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_canonical_in_both_layouts() {
        assert_eq!(canonical_test("Hardware", "GPU Memory"), "memory");
        assert_eq!(
            canonical_test("Stress", "Targeted Stress"),
            "targeted_stress"
        );
        assert_eq!(canonical_test("Deployment", "Denylist"), "software");
        assert_eq!(canonical_test("Hardware", "memory"), "memory");
        assert_eq!(canonical_test("Hardware", "Pulse Test"), "pulse_test");
        assert_eq!(required_tests(1), vec!["software"]);
        assert_eq!(required_tests(3).len(), 7);
        assert!(required_tests(4).contains(&"memtest".to_string()));
    }

    #[test]
    fn a_runtime_error_is_an_error() {
        let r = parse_dcgm_json(
            r#"{"DCGM Diagnostic": {"version": "4.6.0", "runtime_error": "Error: unable to establish a connection to the specified host: localhost"}}"#,
        )
        .expect("parses");
        let res = evaluate_dcgm(
            "dcgm_diag",
            &r,
            &DcgmExpect {
                required_tests: required_tests(3),
                gpu_count: 8,
                warn_fails: false,
            },
        );
        assert_eq!(res.verdict, crate::Verdict::Error);
        assert!(
            res.message.contains("unable to establish a connection"),
            "{}",
            res.message
        );
        assert!(parse_dcgm_json("{\"x\": 1}").is_err());
    }
}
