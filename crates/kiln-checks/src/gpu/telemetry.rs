//! Telemetry under load: the `gpu_telemetry` step samples the probe (`kiln probe --sample`,
//! NVML only) every few seconds while the stress steps it names run, then judges the samples:
//! thermal or power violation time, clock throttling other than idle, the PCIe link below its
//! expected generation or width, NVLink or PCIe replay counters growing, the enforced power
//! limit below the board's default, temperatures. An idle snapshot cannot see any of these.
//!
//! The playbook runner (`Playbook::run`) starts a `Window` when a named stress step starts,
//! samples into it until the step ends, and keeps it in the run's context; the telemetry step
//! itself runs later, in its place in the playbook, and evaluates its windows.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::check::{boxed, Check, CheckContext, CheckFuture, CheckResult};
use crate::finding::{Action, Finding};
use crate::probe::{GpuReport, ProbeReport};
use crate::yaml::{Fields, LoadError};

/// Samples kept per window as evidence: the first half and the most recent half.
pub const SAMPLES_KEPT_MAX: usize = 64;
/// Sampling errors kept per window (a node that cannot be sampled says so once per try).
pub const SAMPLE_ERRORS_MAX: usize = 16;
/// The board default power limit of H100 and H200 SXM5 (NVIDIA H100/H200 Tensor Core GPU
/// datasheets: max TDP 700 W); the shipped playbooks set `power_limit_min_w` to it.
pub const SXM5_POWER_LIMIT_W: u64 = 700;

#[derive(Debug, Clone, PartialEq)]
pub struct TelemetrySpec {
    /// Names of the stress steps to sample during (earlier steps of the playbook).
    pub during: Vec<String>,
    pub interval: Duration,
    pub command: String,
    pub thermal_violation_ms_max: u64,
    pub power_violation_ms_max: u64,
    /// Throttle reasons allowed under load (`gpu_idle` marks an idle sample, never load).
    pub throttle_allowed: Vec<String>,
    pub pcie_generation_min: Option<u64>,
    pub pcie_width_min: Option<u64>,
    /// Growth allowed in NVLink replay + recovery + CRC counters and in PCIe replays, per GPU.
    pub replay_delta_max: u64,
    /// The enforced power limit must be at least this; unset: the board's default limit.
    pub power_limit_min_w: Option<u64>,
    pub temperature_c_max: Option<u64>,
    pub memory_temperature_c_max: Option<u64>,
}

impl TelemetrySpec {
    pub const FIELDS: [&'static str; 12] = [
        "during",
        "interval_s",
        "command",
        "thermal_violation_ms_max",
        "power_violation_ms_max",
        "throttle_allowed",
        "pcie_generation_min",
        "pcie_width_min",
        "replay_delta_max",
        "power_limit_min_w",
        "temperature_c_max",
        "memory_temperature_c_max",
    ];

    pub(crate) fn parse(f: &mut Fields<'_>, errors: &mut Vec<LoadError>) -> Option<TelemetrySpec> {
        const MS_MAX: u64 = 86_400_000;
        let during = f.opt_str_list("during", None, errors);
        if during.is_none() {
            f.missing("during", errors);
        }
        Some(TelemetrySpec {
            during: during?,
            interval: Duration::from_secs(f.opt_u64("interval_s", 1..=300, errors).unwrap_or(5)),
            command: f
                .opt_str("command", errors)
                .unwrap_or_else(|| "kiln probe --sample".into()),
            thermal_violation_ms_max: f
                .opt_u64("thermal_violation_ms_max", 0..=MS_MAX, errors)
                .unwrap_or(0),
            power_violation_ms_max: f
                .opt_u64("power_violation_ms_max", 0..=MS_MAX, errors)
                .unwrap_or(0),
            throttle_allowed: f
                .opt_str_list(
                    "throttle_allowed",
                    Some(&crate::probe::THROTTLE_REASONS),
                    errors,
                )
                .unwrap_or_else(|| vec!["gpu_idle".into()]),
            pcie_generation_min: f.opt_u64("pcie_generation_min", 1..=6, errors),
            pcie_width_min: f.opt_u64("pcie_width_min", 1..=32, errors),
            replay_delta_max: f
                .opt_u64("replay_delta_max", 0..=1_000_000_000, errors)
                .unwrap_or(0),
            power_limit_min_w: f.opt_u64("power_limit_min_w", 1..=5000, errors),
            temperature_c_max: f.opt_u64("temperature_c_max", 30..=120, errors),
            memory_temperature_c_max: f.opt_u64("memory_temperature_c_max", 30..=120, errors),
        })
    }
}

/// A compact sample kept as evidence.
#[derive(Debug, Clone, Serialize)]
pub struct SampleRecord {
    /// Milliseconds since the window opened.
    pub t_ms: u64,
    pub loaded: bool,
    pub gpus: Vec<Value>,
}

/// The samples of one stress step.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Window {
    /// The stress step sampled.
    pub step: String,
    pub samples_taken: u64,
    /// Samples in which no GPU reported `gpu_idle`: the ones load is judged on.
    pub loaded_samples: u64,
    pub errors: Vec<String>,
    pub duration_ms: u64,
    #[serde(skip)]
    first: Option<ProbeReport>,
    #[serde(skip)]
    last: Option<ProbeReport>,
    #[serde(skip)]
    gpus: BTreeMap<u32, GpuLoad>,
    pub kept: Vec<SampleRecord>,
    #[serde(skip)]
    opened: Option<Instant>,
}

/// What the loaded samples of one GPU showed.
#[derive(Debug, Clone, Default)]
struct GpuLoad {
    gpu: GpuReport,
    temperature_c_max: Option<u32>,
    memory_temperature_c_max: Option<u32>,
    pcie_generation_min: Option<u32>,
    pcie_width_min: Option<u32>,
    power_limit_min_mw: Option<u32>,
    throttle: BTreeMap<String, u64>,
}

fn gpu_loaded(g: &GpuReport) -> bool {
    g.throttle_reasons
        .as_ref()
        .is_some_and(|r| !r.iter().any(|x| x == "gpu_idle"))
}

/// NVLink replay + recovery + CRC errors of a GPU, and its PCIe replays.
fn replay_counts(g: &GpuReport) -> (u64, Option<u64>) {
    let nvlink = g
        .nvlinks
        .iter()
        .map(|l| {
            l.replay_errors.unwrap_or(0)
                + l.recovery_errors.unwrap_or(0)
                + l.crc_flit_errors.unwrap_or(0)
                + l.crc_data_errors.unwrap_or(0)
        })
        .sum();
    (nvlink, g.pcie_replays)
}

impl Window {
    pub fn open(step: &str) -> Window {
        Window {
            step: step.to_string(),
            opened: Some(Instant::now()),
            ..Window::default()
        }
    }

    pub fn close(&mut self) {
        if let Some(o) = self.opened {
            self.duration_ms = u64::try_from(o.elapsed().as_millis()).unwrap_or(u64::MAX);
        }
    }

    fn error(&mut self, e: String) {
        if self.errors.len() < SAMPLE_ERRORS_MAX {
            self.errors.push(e);
        }
    }

    /// Adds one sample.
    pub fn add(&mut self, report: ProbeReport) {
        self.samples_taken += 1;
        let loaded = !report.gpus.is_empty() && report.gpus.iter().all(gpu_loaded);
        if loaded {
            self.loaded_samples += 1;
            for g in &report.gpus {
                let e = self.gpus.entry(g.index).or_default();
                e.gpu = g.clone();
                let up = |slot: &mut Option<u32>, v: Option<u32>, max: bool| {
                    if let Some(v) = v {
                        *slot = Some(match *slot {
                            Some(s) if max => s.max(v),
                            Some(s) => s.min(v),
                            None => v,
                        });
                    }
                };
                up(&mut e.temperature_c_max, g.temperature_c, true);
                up(
                    &mut e.memory_temperature_c_max,
                    g.memory_temperature_c,
                    true,
                );
                up(
                    &mut e.pcie_generation_min,
                    g.pcie.map(|l| l.generation_current),
                    false,
                );
                up(
                    &mut e.pcie_width_min,
                    g.pcie.map(|l| l.width_current),
                    false,
                );
                up(&mut e.power_limit_min_mw, g.power_limit_enforced_mw, false);
                for r in g.throttle_reasons.iter().flatten() {
                    *e.throttle.entry(r.clone()).or_default() += 1;
                }
            }
        }
        let t_ms = self
            .opened
            .map(|o| u64::try_from(o.elapsed().as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let record = SampleRecord {
            t_ms,
            loaded,
            gpus: report
                .gpus
                .iter()
                .map(|g| {
                    json!({
                        "index": g.index, "temperature_c": g.temperature_c,
                        "memory_temperature_c": g.memory_temperature_c,
                        "power_mw": g.power_mw, "power_limit_enforced_mw": g.power_limit_enforced_mw,
                        "clocks_mhz": g.clocks_mhz, "pcie": g.pcie, "violations_ns": g.violations_ns,
                        "pcie_replays": g.pcie_replays, "nvlink_errors": replay_counts(g).0,
                        "throttle_reasons": g.throttle_reasons,
                    })
                })
                .collect(),
        };
        // Keep the first half and a ring of the latest half.
        if self.kept.len() < SAMPLES_KEPT_MAX {
            self.kept.push(record);
        } else {
            let half = SAMPLES_KEPT_MAX / 2;
            self.kept.remove(half);
            self.kept.push(record);
        }
        if self.first.is_none() {
            self.first = Some(report.clone());
        }
        self.last = Some(report);
    }
}

/// Takes one sample into `window` over the node's shell.
pub(crate) async fn sample(ctx: &CheckContext, spec: &TelemetrySpec, window: &mut Window) {
    // A sample may take a few seconds on a busy node; never longer than the run has left.
    let timeout = spec
        .interval
        .max(Duration::from_secs(10))
        .min(ctx.remaining());
    match super::probe_command(ctx, &spec.command, timeout).await {
        Ok(r) => window.add(r),
        Err(e) => window.error(e),
    }
}

/// Samples every `spec.interval` until `stop` says the stress step ended; a first sample at
/// once (the counters' baseline) and a last one after the end (their final value).
pub(crate) async fn sample_until(
    ctx: &CheckContext,
    spec: &TelemetrySpec,
    step: &str,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Window {
    let mut window = Window::open(step);
    sample(ctx, spec, &mut window).await;
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = tokio::time::sleep(spec.interval) => {
                if *stop.borrow() {
                    break;
                }
                sample(ctx, spec, &mut window).await;
            }
        }
    }
    sample(ctx, spec, &mut window).await;
    window.close();
    window
}

/// Judges the windows of one telemetry step.
pub fn evaluate(name: &str, spec: &TelemetrySpec, windows: &[Window]) -> CheckResult {
    let mut findings: Vec<Finding> = Vec::new();
    let mut unknown: Vec<String> = Vec::new();
    let mut measured_windows = Vec::new();
    for step in &spec.during {
        if !windows.iter().any(|w| &w.step == step) {
            unknown.push(format!("{step}: not sampled (the step did not run)"));
        }
    }
    for w in windows {
        let label = &w.step;
        if w.loaded_samples == 0 {
            unknown.push(format!(
                "{label}: no sample under load ({} taken in {:.1} s, every {} s{})",
                w.samples_taken,
                w.duration_ms as f64 / 1000.0,
                spec.interval.as_secs(),
                w.errors
                    .first()
                    .map(|e| format!("; {e}"))
                    .unwrap_or_default()
            ));
        }
        let mut per_gpu = Vec::new();
        if let (Some(first), Some(last)) = (&w.first, &w.last) {
            for g in &last.gpus {
                let Some(g0) = first.gpus.iter().find(|x| x.index == g.index) else {
                    continue;
                };
                let during = format!("during {label}");
                if let (Some(v0), Some(v1)) = (g0.violations_ns, g.violations_ns) {
                    let thermal_ms = v1.thermal.saturating_sub(v0.thermal) / 1_000_000;
                    let power_ms = v1.power.saturating_sub(v0.power) / 1_000_000;
                    if thermal_ms > spec.thermal_violation_ms_max {
                        findings.push(
                            Finding::new(
                                g.component(),
                                "thermal_violation",
                                Action::Cooling,
                                format!(
                                    "{}: thermal violation {thermal_ms} ms {during} (max {} ms)",
                                    g.label(),
                                    spec.thermal_violation_ms_max
                                ),
                            )
                            .with_evidence(format!(
                                "thermal violation counter {} ns -> {} ns",
                                v0.thermal, v1.thermal
                            )),
                        );
                    }
                    if power_ms > spec.power_violation_ms_max {
                        findings.push(
                            Finding::new(
                                g.component(),
                                "power_violation",
                                Action::Investigate,
                                format!(
                                    "{}: power violation {power_ms} ms {during} (max {} ms)",
                                    g.label(),
                                    spec.power_violation_ms_max
                                ),
                            )
                            .with_evidence(format!(
                                "power violation counter {} ns -> {} ns",
                                v0.power, v1.power
                            )),
                        );
                    }
                    per_gpu.push(json!({"index": g.index, "thermal_violation_ms": thermal_ms, "power_violation_ms": power_ms}));
                } else {
                    unknown.push(format!("{}: violation counters missing", g.label()));
                }
                let (nv0, pc0) = replay_counts(g0);
                let (nv1, pc1) = replay_counts(g);
                let nv = nv1.saturating_sub(nv0);
                if nv > spec.replay_delta_max {
                    findings.push(
                        Finding::new(
                            g.component(),
                            "nvlink_errors_under_load",
                            Action::ResetGpu,
                            format!(
                                "{}: NVLink replay/recovery/CRC errors grew by {nv} {during} (max {})",
                                g.label(),
                                spec.replay_delta_max
                            ),
                        )
                        .with_evidence(format!("NVLink error counters {nv0} -> {nv1}")),
                    );
                }
                if let (Some(a), Some(b)) = (pc0, pc1) {
                    let d = b.saturating_sub(a);
                    if d > spec.replay_delta_max {
                        findings.push(
                            Finding::new(
                                g.component(),
                                "pcie_replays_under_load",
                                Action::Investigate,
                                format!(
                                    "{}: PCIe replays grew by {d} {during} (max {}); check riser, retimer and baseboard",
                                    g.label(),
                                    spec.replay_delta_max
                                ),
                            )
                            .with_evidence(format!("PCIe replay counter {a} -> {b}")),
                        );
                    }
                }
            }
        }
        for load in w.gpus.values() {
            let g = &load.gpu;
            let during = format!("under load ({label})");
            let bad: Vec<String> = load
                .throttle
                .iter()
                .filter(|(r, _)| !spec.throttle_allowed.contains(r))
                .map(|(r, n)| format!("{r} in {n}/{} samples", w.loaded_samples))
                .collect();
            if !bad.is_empty() {
                let names: Vec<&String> = load
                    .throttle
                    .keys()
                    .filter(|r| !spec.throttle_allowed.contains(r))
                    .collect();
                findings.push(Finding::new(
                    g.component(),
                    "throttle_under_load",
                    super::eval::throttle_action(&names),
                    format!(
                        "{}: clocks throttled {during}: {}",
                        g.label(),
                        bad.join(", ")
                    ),
                ));
            }
            if let (Some(min), Some(v)) = (spec.pcie_generation_min, load.pcie_generation_min) {
                if u64::from(v) < min {
                    findings.push(Finding::new(
                        g.component(),
                        "pcie_generation_under_load",
                        Action::Investigate,
                        format!(
                            "{}: PCIe Gen{v} {during} (min Gen{min}); check riser, retimer and baseboard",
                            g.label()
                        ),
                    ));
                }
            }
            if let (Some(min), Some(v)) = (spec.pcie_width_min, load.pcie_width_min) {
                if u64::from(v) < min {
                    findings.push(Finding::new(
                        g.component(),
                        "pcie_width_under_load",
                        Action::Investigate,
                        format!(
                            "{}: PCIe x{v} {during} (min x{min}); check riser, retimer and baseboard",
                            g.label()
                        ),
                    ));
                }
            }
            let limit_min_mw = spec
                .power_limit_min_w
                .map(|w| w * 1000)
                .or(g.power_limit_default_mw.map(u64::from));
            match (limit_min_mw, load.power_limit_min_mw) {
                (Some(min), Some(v)) if u64::from(v) < min => findings.push(Finding::new(
                    g.component(),
                    "power_limit_low",
                    Action::Config,
                    format!(
                        "{}: enforced power limit {} W {during}, below {} W (a power cap is set: nvidia-smi -pl, BMC or DCGM policy)",
                        g.label(),
                        v / 1000,
                        min / 1000
                    ),
                )),
                (Some(_), Some(_)) => {}
                _ => unknown.push(format!("{}: enforced power limit or its default missing", g.label())),
            }
            for (code, what, max, v, action) in [
                (
                    "gpu_temperature_under_load",
                    "temperature",
                    spec.temperature_c_max,
                    load.temperature_c_max,
                    Action::Cooling,
                ),
                (
                    "hbm_temperature_under_load",
                    "HBM temperature",
                    spec.memory_temperature_c_max,
                    load.memory_temperature_c_max,
                    Action::Cooling,
                ),
            ] {
                if let (Some(max), Some(v)) = (max, v) {
                    if u64::from(v) > max {
                        findings.push(Finding::new(
                            g.component(),
                            code,
                            action,
                            format!("{}: {what} {v} °C {during} (max {max} °C)", g.label()),
                        ));
                    }
                }
            }
            per_gpu.push(json!({
                "index": g.index, "temperature_c_max": load.temperature_c_max,
                "memory_temperature_c_max": load.memory_temperature_c_max,
                "pcie_generation_min": load.pcie_generation_min, "pcie_width_min": load.pcie_width_min,
                "power_limit_min_mw": load.power_limit_min_mw,
                "throttle_reasons": load.throttle,
            }));
        }
        measured_windows.push(json!({
            "step": w.step, "samples": w.samples_taken, "loaded_samples": w.loaded_samples,
            "duration_ms": w.duration_ms, "errors": w.errors, "gpus": per_gpu,
        }));
    }
    // One finding per (GPU, code): several windows may see the same fault.
    let mut seen = BTreeSet::new();
    findings.retain(|f| seen.insert((f.component.key(), f.code.clone())));
    let measured = json!({ "windows": measured_windows, "unknown": unknown });
    let evidence = json!({ "windows": windows });
    if !findings.is_empty() {
        return CheckResult::from_findings(name, findings, "", measured).evidence(evidence);
    }
    if !unknown.is_empty() {
        return CheckResult::error(name, unknown.join("; "))
            .measured(measured)
            .evidence(evidence);
    }
    let samples: u64 = windows.iter().map(|w| w.loaded_samples).sum();
    CheckResult::pass(
        name,
        format!(
            "no throttling, violation, replay or low power limit in {samples} samples under load ({})",
            spec.during.join(", ")
        ),
    )
    .measured(measured)
    .evidence(evidence)
}

/// The telemetry step in its place in the playbook: judges what was sampled earlier.
pub struct TelemetryCheck {
    pub name: String,
    pub spec: TelemetrySpec,
}

impl Check for TelemetryCheck {
    fn name(&self) -> &str {
        &self.name
    }

    fn run<'a>(&'a self, ctx: &'a CheckContext) -> CheckFuture<'a> {
        boxed(async move {
            let windows = ctx.telemetry_windows(&self.name).await;
            evaluate(&self.name, &self.spec, &windows)
        })
    }
}
