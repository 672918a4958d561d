//! Stress steps and their output parsers.
//!
//! - `dcgm_diag`: `dcgmi diag -r 3 --json`; the verdict comes from the JSON (per test and
//!   per GPU `Pass`/`Fail`/`Warn`/`Skip`), not from the exit code.
//! - `gpu_burn`: gpu-burn always exits 0, so only its closing `Tested N GPUs:` summary with
//!   one `GPU i: OK|FAULTY` line per GPU decides; no summary is a failure.
//! - `command`: any command; passes on the expected exit code (e.g. stress-ng on CPU nodes).

use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};

use crate::check::{boxed, Check, CheckContext, CheckFuture, CheckResult};
use crate::gpu::tail;
use crate::yaml::{Fields, LoadError};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DcgmResult {
    pub category: String,
    pub test: String,
    /// `None` for node-wide tests (Deployment category).
    pub gpu: Option<String>,
    /// Lower case: `pass`, `fail`, `warn`, `skip`, or what DCGM wrote.
    pub status: String,
    /// Warning and info texts attached to the result.
    pub details: Vec<String>,
}

/// Parses `dcgmi diag --json` (DCGM 2.x/3.x layout: `"DCGM GPU Diagnostic"` ->
/// `test_categories[]` -> `tests[]` -> `results[]`).
pub fn parse_dcgm_json(text: &str) -> Result<Vec<DcgmResult>, String> {
    let doc: Value = serde_json::from_str(text.trim()).map_err(|e| format!("not JSON: {e}"))?;
    let categories = doc
        .get("DCGM GPU Diagnostic")
        .and_then(|d| d.get("test_categories"))
        .and_then(Value::as_array)
        .ok_or("no \"DCGM GPU Diagnostic\".test_categories in the JSON")?;
    let mut out = Vec::new();
    for c in categories {
        let category = str_of(c.get("category")).unwrap_or_else(|| "?".into());
        for t in c
            .get("tests")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let test = str_of(t.get("name")).unwrap_or_else(|| "?".into());
            for r in t
                .get("results")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let status = str_of(r.get("status"))
                    .unwrap_or_else(|| "missing".into())
                    .to_ascii_lowercase();
                let gpu = r
                    .get("gpu_ids")
                    .or_else(|| r.get("gpu_id"))
                    .and_then(|g| match g {
                        Value::String(s) => Some(s.clone()),
                        Value::Number(n) => Some(n.to_string()),
                        _ => None,
                    });
                let mut details = Vec::new();
                for key in ["warnings", "warning", "info"] {
                    collect_texts(r.get(key), &mut details);
                }
                out.push(DcgmResult {
                    category: category.clone(),
                    test: test.clone(),
                    gpu,
                    status,
                    details,
                });
            }
        }
    }
    if out.is_empty() {
        return Err("the JSON holds no test results".into());
    }
    Ok(out)
}

fn str_of(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str).map(str::to_string)
}

/// Info and warnings come as a string, a list of strings, or a list of
/// `{"warning"|"message": ..., "error_id": N}` objects.
fn collect_texts(v: Option<&Value>, out: &mut Vec<String>) {
    match v {
        Some(Value::String(s)) if !s.is_empty() => out.push(s.clone()),
        Some(Value::Array(items)) => {
            for i in items {
                match i {
                    Value::String(s) => out.push(s.clone()),
                    Value::Object(o) => {
                        let text = o
                            .get("warning")
                            .or_else(|| o.get("message"))
                            .and_then(Value::as_str)
                            .unwrap_or("");
                        let id = o.get("error_id").and_then(Value::as_i64);
                        out.push(match id {
                            Some(id) => format!("{text} (error {id})"),
                            None => text.to_string(),
                        });
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

/// Turns DCGM results into a verdict: any `fail` (or `warn` when `warn_fails`) fails and
/// is named by category, test, GPU and DCGM's text; a status this parser does not know is
/// an error.
pub fn evaluate_dcgm(name: &str, results: &[DcgmResult], warn_fails: bool) -> CheckResult {
    let mut problems = Vec::new();
    let mut unknown = Vec::new();
    let mut counts = std::collections::BTreeMap::<String, u64>::new();
    for r in results {
        *counts.entry(r.status.clone()).or_default() += 1;
        let who = match &r.gpu {
            Some(g) => format!("{} / {} / GPU {g}", r.category, r.test),
            None => format!("{} / {}", r.category, r.test),
        };
        let why = if r.details.is_empty() {
            String::new()
        } else {
            format!(": {}", r.details.join(" | "))
        };
        match r.status.as_str() {
            "pass" | "skip" => {}
            "fail" => problems.push(format!("{who}: Fail{why}")),
            "warn" if warn_fails => problems.push(format!("{who}: Warn{why}")),
            "warn" => {}
            other => unknown.push(format!("{who}: unrecognised status {other:?}")),
        }
    }
    let measured = json!({ "status_counts": counts });
    let evidence = serde_json::to_value(results).unwrap_or(Value::Null);
    if problems.is_empty() && !unknown.is_empty() {
        return CheckResult::error(name, unknown.join("; "))
            .measured(measured)
            .evidence(evidence);
    }
    CheckResult::from_problems(
        name,
        problems,
        format!("DCGM diagnostics passed ({} results)", results.len()),
        measured,
    )
    .evidence(evidence)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuBurnSummary {
    pub tested: u32,
    /// (GPU index, OK?)
    pub gpus: Vec<(u32, bool)>,
}

/// Parses gpu-burn's closing summary: `Tested 8 GPUs:` then `\tGPU 0: OK` / `GPU 1: FAULTY`
/// lines. `None` when the summary is absent (killed, crashed, CUDA init failed).
pub fn parse_gpu_burn(output: &str) -> Option<GpuBurnSummary> {
    let mut lines = output.lines();
    let tested = loop {
        let l = lines.next()?.trim();
        if let Some(rest) = l.strip_prefix("Tested ") {
            if let Some(n) = rest
                .strip_suffix("GPUs:")
                .or_else(|| rest.strip_suffix("GPU:"))
            {
                if let Ok(n) = n.trim().parse::<u32>() {
                    break n;
                }
            }
        }
    };
    let mut gpus = Vec::new();
    for l in lines {
        let l = l.trim();
        let Some(rest) = l.strip_prefix("GPU ") else {
            if l.is_empty() {
                continue;
            }
            break;
        };
        let Some((idx, verdict)) = rest.split_once(':') else {
            break;
        };
        let Ok(idx) = idx.trim().parse::<u32>() else {
            break;
        };
        gpus.push((idx, verdict.trim() == "OK"));
    }
    Some(GpuBurnSummary { tested, gpus })
}

pub fn evaluate_gpu_burn(name: &str, output: &str, expected_gpus: u32) -> CheckResult {
    let evidence = json!({ "output_tail": tail(output, 4000) });
    let Some(s) = parse_gpu_burn(output) else {
        return CheckResult::fail(
            name,
            "gpu-burn printed no `Tested N GPUs:` summary (killed, crashed or could not start); \
             its exit code is always 0, so this counts as a failure",
        )
        .evidence(evidence);
    };
    let mut problems = Vec::new();
    for (idx, ok) in &s.gpus {
        if !ok {
            problems.push(format!("GPU {idx}: FAULTY (computation errors under load)"));
        }
    }
    if s.gpus.len() as u32 != s.tested {
        problems.push(format!(
            "summary says {} GPUs tested but lists {}",
            s.tested,
            s.gpus.len()
        ));
    }
    if s.tested != expected_gpus {
        problems.push(format!(
            "gpu-burn tested {} GPUs, expected {expected_gpus}",
            s.tested
        ));
    }
    CheckResult::from_problems(
        name,
        problems,
        format!("gpu-burn: {} GPUs OK", s.tested),
        json!({ "tested": s.tested, "gpus": s.gpus.iter().map(|(i, ok)| json!({"index": i, "ok": ok})).collect::<Vec<_>>() }),
    )
    .evidence(evidence)
}

#[derive(Debug, Clone, PartialEq)]
pub enum StressSpec {
    Dcgm {
        command: String,
        warn_fails: bool,
    },
    GpuBurn {
        command: String,
        gpu_count: Option<u64>,
    },
    Command {
        command: String,
        expect_exit: i32,
    },
}

impl StressSpec {
    pub const KINDS: [&'static str; 3] = ["dcgm_diag", "gpu_burn", "command"];

    pub fn fields(kind: &str) -> &'static [&'static str] {
        match kind {
            "dcgm_diag" => &["command", "warn_fails"],
            "gpu_burn" => &["command", "gpu_count"],
            "command" => &["command", "expect_exit"],
            _ => &[],
        }
    }

    pub(crate) fn parse(
        kind: &str,
        f: &mut Fields<'_>,
        errors: &mut Vec<LoadError>,
    ) -> Option<StressSpec> {
        Some(match kind {
            "dcgm_diag" => StressSpec::Dcgm {
                command: f
                    .opt_str("command", errors)
                    .unwrap_or_else(|| "dcgmi diag -r 3 --json".into()),
                warn_fails: f.opt_bool("warn_fails", errors).unwrap_or(false),
            },
            "gpu_burn" => StressSpec::GpuBurn {
                command: f.req_str("command", errors)?,
                gpu_count: f.opt_u64("gpu_count", 1..=64, errors),
            },
            "command" => StressSpec::Command {
                command: f.req_str("command", errors)?,
                expect_exit: f.opt_u64("expect_exit", 0..=255, errors).unwrap_or(0) as i32,
            },
            _ => return None,
        })
    }
}

/// A stress step: runs its command on the node for up to `timeout`, then parses.
pub struct StressCheck {
    pub name: String,
    pub spec: StressSpec,
    pub timeout: Duration,
}

impl Check for StressCheck {
    fn name(&self) -> &str {
        &self.name
    }

    fn run<'a>(&'a self, ctx: &'a CheckContext) -> CheckFuture<'a> {
        boxed(async move {
            let shell = match ctx.shell() {
                Ok(s) => s,
                Err(e) => return CheckResult::error(&self.name, e),
            };
            let command = match &self.spec {
                StressSpec::Dcgm { command, .. }
                | StressSpec::GpuBurn { command, .. }
                | StressSpec::Command { command, .. } => command,
            };
            let out = shell.exec(command, self.timeout.min(ctx.remaining())).await;
            // Whatever happened, the GPUs are not what the last probe saw.
            ctx.invalidate_probe().await;
            let out = match out {
                Ok(o) => o,
                Err(e) => {
                    return CheckResult::error(
                        &self.name,
                        format!("{} on {}: {e}", self.name, shell.describe()),
                    )
                }
            };
            match &self.spec {
                StressSpec::Dcgm { warn_fails, .. } => match parse_dcgm_json(&out.stdout) {
                    Ok(results) => evaluate_dcgm(&self.name, &results, *warn_fails),
                    Err(e) => CheckResult::error(
                        &self.name,
                        format!(
                            "`{command}` (exit {:?}): {e}; stderr: {}",
                            out.exit_code,
                            tail(&out.stderr, 300)
                        ),
                    )
                    .evidence(json!({ "stdout": tail(&out.stdout, 4000) })),
                },
                StressSpec::GpuBurn { gpu_count, .. } => {
                    let expected = gpu_count.map(|c| c as u32).unwrap_or(ctx.node.gpu_count);
                    evaluate_gpu_burn(&self.name, &out.stdout, expected)
                }
                StressSpec::Command { expect_exit, .. } => {
                    let evidence = json!({
                        "exit_code": out.exit_code,
                        "stdout_tail": tail(&out.stdout, 4000),
                        "stderr_tail": tail(&out.stderr, 4000),
                    });
                    let measured = json!({ "exit_code": out.exit_code });
                    if out.exit_code == Some(*expect_exit) {
                        CheckResult::pass(&self.name, format!("`{command}` exited {expect_exit}"))
                            .measured(measured)
                            .evidence(evidence)
                    } else {
                        CheckResult::fail(
                            &self.name,
                            format!(
                                "`{command}` exited {:?}, expected {expect_exit}: {}",
                                out.exit_code,
                                tail(&out.stderr, 200)
                            ),
                        )
                        .measured(measured)
                        .evidence(evidence)
                    }
                }
            }
        })
    }
}
