//! Stress steps and their output parsers.
//!
//! - `dcgm_diag`: `dcgmi diag -r LEVEL --json`; the verdict comes from the JSON (`dcgm.rs`:
//!   both the 4.x and 3.x layouts), never the exit code (dcgmi exits non-zero on failures).
//! - `gpu_burn`: gpu-burn always exits 0, so only its closing `Tested N GPUs:` summary with
//!   one `GPU i: OK|FAULTY` line per GPU decides; no summary is a failure.
//! - `command`: any command; passes on the expected exit code (stress-ng `--verify`, which
//!   exits non-zero when a verification fails).

use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use crate::check::{boxed, Check, CheckContext, CheckFuture, CheckResult};
use crate::dcgm::{evaluate_dcgm, parse_dcgm_json, required_tests, DcgmExpect};
use crate::finding::{Action, Component, ComponentKind, Finding};
use crate::gpu::tail;
use crate::yaml::{Fields, LoadError};

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
        let f = Finding::new(
            Component::node(),
            "gpu_burn_no_summary",
            Action::Investigate,
            "gpu-burn printed no `Tested N GPUs:` summary (killed, crashed or could not start); \
             its exit code is always 0, so this counts as a failure",
        )
        .with_evidence(tail(output, 400));
        return CheckResult::from_findings(name, vec![f], "", json!({})).evidence(evidence);
    };
    let mut findings = Vec::new();
    for (idx, ok) in &s.gpus {
        if !ok {
            // Wrong results under full load: NVIDIA's field diagnostic decides the RMA.
            findings.push(Finding::new(
                Component::new(ComponentKind::Gpu).index(*idx),
                "gpu_burn_faulty",
                Action::Rma,
                format!("GPU {idx}: FAULTY (computation errors under load); run NVIDIA field diagnostic"),
            ));
        }
    }
    if s.gpus.len() as u32 != s.tested {
        findings.push(Finding::new(
            Component::node(),
            "gpu_burn_summary",
            Action::Investigate,
            format!(
                "summary says {} GPUs tested but lists {}",
                s.tested,
                s.gpus.len()
            ),
        ));
    }
    if s.tested != expected_gpus {
        findings.push(Finding::new(
            Component::new(ComponentKind::Board),
            "gpu_burn_gpu_count",
            Action::Reboot,
            format!(
                "gpu-burn tested {} GPUs, expected {expected_gpus}",
                s.tested
            ),
        ));
    }
    CheckResult::from_findings(
        name,
        findings,
        format!("gpu-burn: {} GPUs OK", s.tested),
        json!({ "tested": s.tested, "gpus": s.gpus.iter().map(|(i, ok)| json!({"index": i, "ok": ok})).collect::<Vec<_>>() }),
    )
    .evidence(evidence)
}

#[derive(Debug, Clone, PartialEq)]
pub enum StressSpec {
    Dcgm {
        command: String,
        /// `-r` level: 1 quick, 2 medium, 3 long, 4 extra long (adds memtest and pulse test).
        level: u64,
        /// Canonical test names that must have run (default: the level's set).
        tests: Vec<String>,
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
    /// The command the step runs.
    pub(crate) fn command_mut(&mut self) -> &mut String {
        match self {
            StressSpec::Dcgm { command, .. }
            | StressSpec::GpuBurn { command, .. }
            | StressSpec::Command { command, .. } => command,
        }
    }

    pub const KINDS: [&'static str; 3] = ["dcgm_diag", "gpu_burn", "command"];

    pub fn fields(kind: &str) -> &'static [&'static str] {
        match kind {
            "dcgm_diag" => &["command", "level", "tests", "warn_fails"],
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
            "dcgm_diag" => {
                let level = f.opt_u64("level", 1..=4, errors).unwrap_or(3);
                StressSpec::Dcgm {
                    command: f
                        .opt_str("command", errors)
                        .unwrap_or_else(|| format!("dcgmi diag -r {level} --json")),
                    level,
                    tests: f
                        .opt_str_list("tests", None, errors)
                        .unwrap_or_else(|| required_tests(level)),
                    warn_fails: f.opt_bool("warn_fails", errors).unwrap_or(false),
                }
            }
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
                StressSpec::Dcgm {
                    warn_fails, tests, ..
                } => match parse_dcgm_json(&out.stdout) {
                    Ok(report) => evaluate_dcgm(
                        &self.name,
                        &report,
                        &DcgmExpect {
                            required_tests: tests.clone(),
                            gpu_count: ctx.node.gpu_count,
                            warn_fails: *warn_fails,
                        },
                    ),
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
                        let f = Finding::new(
                            Component::node(),
                            "command_exit",
                            Action::Investigate,
                            format!(
                                "`{command}` exited {:?}, expected {expect_exit}: {}",
                                out.exit_code,
                                tail(&out.stderr, 200)
                            ),
                        )
                        .with_evidence(tail(&out.stderr, 400))
                        .with_evidence(tail(&out.stdout, 400));
                        CheckResult::from_findings(&self.name, vec![f], "", measured)
                            .evidence(evidence)
                    }
                }
            }
        })
    }
}
