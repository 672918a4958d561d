//! GPU checks: each evaluates the node's `ProbeReport` against playbook thresholds.
//!
//! The report is fetched once per run (the first GPU check runs the probe command over the
//! node's shell; the rest reuse it, see `CheckContext::probe_with`). Evaluation is a pure
//! function of (report, node, thresholds), so it is tested without a GPU.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::check::{boxed, Check, CheckContext, CheckFuture, CheckResult, NodeTarget, Verdict};
use crate::probe::{GpuReport, ProbeReport, NOT_SUPPORTED};
use crate::yaml::{Fields, LoadError};

/// Xids that an application causes (illegal address, MMU fault from user code, ...):
/// seen on healthy hardware, not a reason to fail burn-in.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// How the probe is run on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSettings {
    pub command: String,
    pub timeout: Duration,
}

impl Default for ProbeSettings {
    fn default() -> Self {
        ProbeSettings {
            command: "kiln probe".into(),
            timeout: Duration::from_secs(120),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum GpuThresholds {
    Inventory(Inventory),
    Ecc(Ecc),
    RowRemap(RowRemapLimits),
    RetiredPages(RetiredPagesLimits),
    Pcie(Pcie),
    Nvlink(Nvlink),
    Xid(Xid),
    Thermal(Thermal),
    Firmware(GpuFirmware),
}

/// GPU count and model. `count` defaults to the node's manifest count.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Inventory {
    pub count: Option<u64>,
    /// Accepted NVML names (`NVIDIA H100 80GB HBM3`); empty accepts any.
    pub names: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Ecc {
    pub uncorrected_volatile_max: u64,
    pub uncorrected_aggregate_max: Option<u64>,
    pub corrected_volatile_max: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RowRemapLimits {
    pub pending_allowed: bool,
    pub failure_allowed: bool,
    pub uncorrectable_max: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RetiredPagesLimits {
    pub max: u64,
    pub pending_allowed: bool,
}

/// PCIe link thresholds. NVML reports the current link and the maximum "possible with
/// this device and system". The current *generation* drops at idle on power-managed links
/// (a healthy H100 shows Gen1 when idle), so `generation_min` is compared with the maximum
/// (catching a slot, riser or switch that cannot reach the expected generation) and
/// `generation_equal_max` (current == max) is only meaningful when the probe runs under
/// load. Width does not drop at idle: `width_min` and `width_equal_max` use the current.
#[derive(Debug, Clone, PartialEq)]
pub struct Pcie {
    pub generation_min: Option<u64>,
    pub width_min: Option<u64>,
    pub generation_equal_max: bool,
    pub width_equal_max: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Nvlink {
    /// Each GPU must report at least this many links.
    pub links_min: Option<u64>,
    pub all_active: bool,
    pub replay_errors_max: Option<u64>,
    pub recovery_errors_max: Option<u64>,
    /// Applies to CRC flit plus CRC data errors.
    pub crc_errors_max: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Xid {
    /// Xids that do not fail the node (application errors).
    pub allowed: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Thermal {
    pub temperature_c_max: u64,
    pub power_w_max: Option<u64>,
    /// Throttle reasons that fail the node when active (names from `THROTTLE_REASONS`).
    pub throttle_forbidden: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GpuFirmware {
    /// Compare every GPU's VBIOS with the manifest's `gpu_vbios` baseline.
    pub vbios_equal_baseline: bool,
    /// Accepted driver versions; empty accepts any.
    pub driver_versions: Vec<String>,
}

pub const DEFAULT_THROTTLE_FORBIDDEN: [&str; 4] = [
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
];

impl GpuThresholds {
    /// The playbook check kinds this module provides.
    pub const KINDS: [&'static str; 9] = [
        "gpu_inventory",
        "gpu_ecc",
        "gpu_row_remap",
        "gpu_retired_pages",
        "gpu_pcie",
        "gpu_nvlink",
        "gpu_xid",
        "gpu_thermal",
        "gpu_firmware",
    ];

    /// The fields of `kind` (besides the common `check`, `name`, `timeout_s`).
    pub fn fields(kind: &str) -> &'static [&'static str] {
        match kind {
            "gpu_inventory" => &["count", "names"],
            "gpu_ecc" => &[
                "uncorrected_volatile_max",
                "uncorrected_aggregate_max",
                "corrected_volatile_max",
            ],
            "gpu_row_remap" => &["pending_allowed", "failure_allowed", "uncorrectable_max"],
            "gpu_retired_pages" => &["max", "pending_allowed"],
            "gpu_pcie" => &[
                "generation_min",
                "width_min",
                "generation_equal_max",
                "width_equal_max",
            ],
            "gpu_nvlink" => &[
                "links_min",
                "all_active",
                "replay_errors_max",
                "recovery_errors_max",
                "crc_errors_max",
            ],
            "gpu_xid" => &["allowed"],
            "gpu_thermal" => &["temperature_c_max", "power_w_max", "throttle_forbidden"],
            "gpu_firmware" => &["vbios_equal_baseline", "driver_versions"],
            _ => &[],
        }
    }

    /// Reads the thresholds of `kind` from a playbook step; problems go to `errors`.
    pub(crate) fn parse(
        kind: &str,
        f: &mut Fields<'_>,
        errors: &mut Vec<LoadError>,
    ) -> Option<GpuThresholds> {
        const COUNT: u64 = 1_000_000_000;
        Some(match kind {
            "gpu_inventory" => GpuThresholds::Inventory(Inventory {
                count: f.opt_u64("count", 1..=64, errors),
                names: f.opt_str_list("names", None, errors).unwrap_or_default(),
            }),
            "gpu_ecc" => GpuThresholds::Ecc(Ecc {
                uncorrected_volatile_max: f
                    .opt_u64("uncorrected_volatile_max", 0..=COUNT, errors)
                    .unwrap_or(0),
                uncorrected_aggregate_max: f.opt_u64(
                    "uncorrected_aggregate_max",
                    0..=COUNT,
                    errors,
                ),
                corrected_volatile_max: f.opt_u64("corrected_volatile_max", 0..=COUNT, errors),
            }),
            "gpu_row_remap" => GpuThresholds::RowRemap(RowRemapLimits {
                pending_allowed: f.opt_bool("pending_allowed", errors).unwrap_or(false),
                failure_allowed: f.opt_bool("failure_allowed", errors).unwrap_or(false),
                uncorrectable_max: f.opt_u64("uncorrectable_max", 0..=COUNT, errors),
            }),
            "gpu_retired_pages" => GpuThresholds::RetiredPages(RetiredPagesLimits {
                max: f.opt_u64("max", 0..=1000, errors).unwrap_or(10),
                pending_allowed: f.opt_bool("pending_allowed", errors).unwrap_or(false),
            }),
            "gpu_pcie" => GpuThresholds::Pcie(Pcie {
                generation_min: f.opt_u64("generation_min", 1..=6, errors),
                width_min: f.opt_u64("width_min", 1..=32, errors),
                generation_equal_max: f.opt_bool("generation_equal_max", errors).unwrap_or(false),
                width_equal_max: f.opt_bool("width_equal_max", errors).unwrap_or(true),
            }),
            "gpu_nvlink" => GpuThresholds::Nvlink(Nvlink {
                links_min: f.opt_u64("links_min", 0..=64, errors),
                all_active: f.opt_bool("all_active", errors).unwrap_or(true),
                replay_errors_max: f.opt_u64("replay_errors_max", 0..=COUNT, errors),
                recovery_errors_max: f.opt_u64("recovery_errors_max", 0..=COUNT, errors),
                crc_errors_max: f.opt_u64("crc_errors_max", 0..=COUNT, errors),
            }),
            "gpu_xid" => GpuThresholds::Xid(Xid {
                allowed: f
                    .opt_u64_list("allowed", 1..=1000, errors)
                    .unwrap_or_else(|| APPLICATION_XIDS.to_vec()),
            }),
            "gpu_thermal" => {
                let temperature_c_max = f.req_u64("temperature_c_max", 30..=120, errors);
                let power_w_max = f.opt_u64("power_w_max", 1..=5000, errors);
                let throttle_forbidden = f
                    .opt_str_list(
                        "throttle_forbidden",
                        Some(&crate::probe::THROTTLE_REASONS),
                        errors,
                    )
                    .unwrap_or_else(|| DEFAULT_THROTTLE_FORBIDDEN.map(String::from).to_vec());
                GpuThresholds::Thermal(Thermal {
                    temperature_c_max: temperature_c_max?,
                    power_w_max,
                    throttle_forbidden,
                })
            }
            "gpu_firmware" => GpuThresholds::Firmware(GpuFirmware {
                vbios_equal_baseline: f.opt_bool("vbios_equal_baseline", errors).unwrap_or(true),
                driver_versions: f
                    .opt_str_list("driver_versions", None, errors)
                    .unwrap_or_default(),
            }),
            _ => return None,
        })
    }

    /// Evaluates the report. Fail when a reading is outside a threshold; Error when a
    /// needed reading is missing for a reason other than "not supported".
    pub fn evaluate(&self, name: &str, report: &ProbeReport, node: &NodeTarget) -> CheckResult {
        let mut ev = Eval::default();
        match self {
            GpuThresholds::Inventory(t) => inventory(t, report, node, &mut ev),
            GpuThresholds::Ecc(t) => ecc(t, report, &mut ev),
            GpuThresholds::RowRemap(t) => row_remap(t, report, &mut ev),
            GpuThresholds::RetiredPages(t) => retired_pages(t, report, &mut ev),
            GpuThresholds::Pcie(t) => pcie(t, report, &mut ev),
            GpuThresholds::Nvlink(t) => nvlink(t, report, &mut ev),
            GpuThresholds::Xid(t) => xid(t, report, &mut ev),
            GpuThresholds::Thermal(t) => thermal(t, report, &mut ev),
            GpuThresholds::Firmware(t) => firmware(t, report, node, &mut ev),
        }
        ev.finish(name, report)
    }
}

/// Findings of one evaluation.
#[derive(Default)]
struct Eval {
    problems: Vec<String>,
    unknown: Vec<String>,
    notes: Vec<String>,
    measured: Vec<Value>,
    evidence: Vec<Value>,
    summary: String,
}

impl Eval {
    /// A GPU reading that is absent: "not supported" is a note, anything else unknown.
    fn missing(&mut self, gpu: &GpuReport, field: &str) {
        match gpu.unavailable.get(field).map(String::as_str) {
            Some(NOT_SUPPORTED) => self
                .notes
                .push(format!("{}: {field} not supported", gpu.label())),
            Some(reason) => self
                .unknown
                .push(format!("{}: {field} unreadable: {reason}", gpu.label())),
            None => self
                .unknown
                .push(format!("{}: {field} missing from the probe", gpu.label())),
        }
    }

    fn finish(self, name: &str, report: &ProbeReport) -> CheckResult {
        let measured = json!({
            "gpus": self.measured,
            "notes": self.notes,
            "unknown": self.unknown,
        });
        let evidence = json!({
            "driver_version": report.driver_version,
            "gpus": self.evidence,
        });
        if !self.problems.is_empty() {
            return CheckResult::from_problems(name, self.problems, "", measured)
                .evidence(evidence);
        }
        if !self.unknown.is_empty() {
            let msg = self.unknown.join("; ");
            return CheckResult::error(name, msg)
                .measured(measured)
                .evidence(evidence);
        }
        let mut msg = if self.summary.is_empty() {
            format!("{} GPUs within thresholds", report.gpus.len())
        } else {
            self.summary
        };
        if !self.notes.is_empty() {
            msg.push_str(&format!(" ({})", self.notes.join("; ")));
        }
        CheckResult::pass(name, msg)
            .measured(measured)
            .evidence(evidence)
    }
}

fn inventory(t: &Inventory, report: &ProbeReport, node: &NodeTarget, ev: &mut Eval) {
    let expected = t.count.unwrap_or(u64::from(node.gpu_count));
    let found = report.gpus.len() as u64;
    if found != expected {
        let present: Vec<String> = report
            .gpus
            .iter()
            .map(|g| {
                g.pci_bus_id
                    .clone()
                    .unwrap_or_else(|| format!("#{}", g.index))
            })
            .collect();
        ev.problems.push(format!(
            "GPU count {found}, expected {expected} (NVML sees: {})",
            present.join(", ")
        ));
    }
    for g in &report.gpus {
        let name = g.name.clone().unwrap_or_default();
        if !t.names.is_empty() && !t.names.contains(&name) {
            ev.problems.push(format!(
                "{}: model {name:?}, expected one of {:?}",
                g.label(),
                t.names
            ));
        }
        ev.measured.push(json!({
            "index": g.index, "name": g.name, "uuid": g.uuid, "serial": g.serial,
            "pci_bus_id": g.pci_bus_id,
        }));
    }
    ev.summary = format!("{found} GPUs, as expected");
}

fn ecc(t: &Ecc, report: &ProbeReport, ev: &mut Eval) {
    for g in &report.gpus {
        let Some(e) = &g.ecc else {
            // A burn-in GPU without ECC counts is not a datacenter GPU in ECC mode.
            match g.unavailable.get("ecc").map(String::as_str) {
                Some(NOT_SUPPORTED) => ev
                    .problems
                    .push(format!("{}: ECC not supported or disabled", g.label())),
                _ => ev.missing(g, "ecc"),
            }
            continue;
        };
        ev.evidence.push(json!({ "gpu": g.index, "ecc": e }));
        ev.measured.push(json!({
            "index": g.index,
            "volatile_uncorrected": e.volatile_uncorrected,
            "aggregate_uncorrected": e.aggregate_uncorrected,
            "volatile_corrected": e.volatile_corrected,
        }));
        if e.volatile_uncorrected > t.uncorrected_volatile_max {
            ev.problems.push(format!(
                "{}: ECC volatile uncorrected = {} (max {})",
                g.label(),
                e.volatile_uncorrected,
                t.uncorrected_volatile_max
            ));
        }
        if let Some(max) = t.uncorrected_aggregate_max {
            if e.aggregate_uncorrected > max {
                ev.problems.push(format!(
                    "{}: ECC aggregate uncorrected = {} (max {max})",
                    g.label(),
                    e.aggregate_uncorrected
                ));
            }
        }
        if let Some(max) = t.corrected_volatile_max {
            if e.volatile_corrected > max {
                ev.problems.push(format!(
                    "{}: ECC volatile corrected = {} (max {max})",
                    g.label(),
                    e.volatile_corrected
                ));
            }
        }
    }
}

fn row_remap(t: &RowRemapLimits, report: &ProbeReport, ev: &mut Eval) {
    for g in &report.gpus {
        let Some(r) = &g.row_remap else {
            ev.missing(g, "row_remap");
            continue;
        };
        ev.evidence.push(json!({ "gpu": g.index, "row_remap": r }));
        ev.measured
            .push(json!({ "index": g.index, "row_remap": r }));
        if r.pending && !t.pending_allowed {
            ev.problems.push(format!(
                "{}: row remapping pending (reset the GPU to apply; then re-test)",
                g.label()
            ));
        }
        if r.failure && !t.failure_allowed {
            ev.problems.push(format!(
                "{}: row remapping failure (no spare rows left)",
                g.label()
            ));
        }
        if let Some(max) = t.uncorrectable_max {
            if r.uncorrectable > max {
                ev.problems.push(format!(
                    "{}: rows remapped for uncorrectable errors = {} (max {max})",
                    g.label(),
                    r.uncorrectable
                ));
            }
        }
    }
}

fn retired_pages(t: &RetiredPagesLimits, report: &ProbeReport, ev: &mut Eval) {
    for g in &report.gpus {
        let Some(p) = &g.retired_pages else {
            ev.missing(g, "retired_pages");
            continue;
        };
        ev.evidence
            .push(json!({ "gpu": g.index, "retired_pages": p }));
        ev.measured
            .push(json!({ "index": g.index, "retired": p.total(), "pending": p.pending }));
        if p.total() > t.max {
            ev.problems.push(format!(
                "{}: retired pages = {} ({} multiple single-bit, {} double-bit; max {})",
                g.label(),
                p.total(),
                p.multiple_single_bit,
                p.double_bit,
                t.max
            ));
        }
        if p.pending && !t.pending_allowed {
            ev.problems.push(format!(
                "{}: page retirement pending (reboot to apply)",
                g.label()
            ));
        }
    }
}

fn pcie(t: &Pcie, report: &ProbeReport, ev: &mut Eval) {
    for g in &report.gpus {
        let Some(l) = &g.pcie else {
            ev.missing(g, "pcie");
            continue;
        };
        ev.evidence.push(json!({ "gpu": g.index, "pcie": l }));
        ev.measured.push(json!({ "index": g.index, "pcie": l }));
        let label = g.label();
        if t.generation_equal_max && l.generation_current < l.generation_max {
            ev.problems.push(format!(
                "{label}: PCIe generation {} below max {}",
                l.generation_current, l.generation_max
            ));
        }
        if t.width_equal_max && l.width_current < l.width_max {
            ev.problems.push(format!(
                "{label}: PCIe width x{} below max x{}",
                l.width_current, l.width_max
            ));
        }
        if let Some(min) = t.generation_min {
            if u64::from(l.generation_max) < min {
                ev.problems.push(format!(
                    "{label}: PCIe link can reach generation {} at most (min {min})",
                    l.generation_max
                ));
            }
        }
        let below_max_reported = t.width_equal_max && l.width_current < l.width_max;
        if let Some(min) = t.width_min {
            if u64::from(l.width_current) < min && !below_max_reported {
                ev.problems.push(format!(
                    "{label}: PCIe width x{} (min x{min})",
                    l.width_current
                ));
            }
        }
    }
}

fn nvlink(t: &Nvlink, report: &ProbeReport, ev: &mut Eval) {
    for g in &report.gpus {
        let label = g.label();
        if g.nvlinks.is_empty() {
            if t.links_min.unwrap_or(0) > 0 {
                match g.unavailable.get("nvlinks") {
                    Some(reason) if reason != NOT_SUPPORTED => ev
                        .unknown
                        .push(format!("{label}: NVLink unreadable: {reason}")),
                    _ => ev.problems.push(format!(
                        "{label}: no NVLinks reported (min {})",
                        t.links_min.unwrap_or(0)
                    )),
                }
            }
            continue;
        }
        ev.evidence
            .push(json!({ "gpu": g.index, "nvlinks": g.nvlinks }));
        let inactive: Vec<u32> = g
            .nvlinks
            .iter()
            .filter(|l| !l.active)
            .map(|l| l.link)
            .collect();
        let active = g.nvlinks.len() - inactive.len();
        ev.measured.push(json!({
            "index": g.index, "links": g.nvlinks.len(), "active": active, "inactive": inactive,
        }));
        if let Some(min) = t.links_min {
            if (g.nvlinks.len() as u64) < min {
                ev.problems.push(format!(
                    "{label}: {} NVLinks reported (min {min})",
                    g.nvlinks.len()
                ));
            }
        }
        if t.all_active && !inactive.is_empty() {
            ev.problems
                .push(format!("{label}: NVLink(s) {inactive:?} inactive"));
        }
        for l in &g.nvlinks {
            let crc = match (l.crc_flit_errors, l.crc_data_errors) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
            };
            for (what, value, max) in [
                ("replay errors", l.replay_errors, t.replay_errors_max),
                ("recovery errors", l.recovery_errors, t.recovery_errors_max),
                ("CRC errors", crc, t.crc_errors_max),
            ] {
                if let (Some(v), Some(max)) = (value, max) {
                    if v > max {
                        ev.problems.push(format!(
                            "{label}: NVLink {} {what} = {v} (max {max})",
                            l.link
                        ));
                    }
                }
            }
        }
    }
}

fn xid(t: &Xid, report: &ProbeReport, ev: &mut Eval) {
    if let Some(e) = &report.kernel_log.error {
        ev.unknown.push(format!("kernel log unreadable: {e}"));
        return;
    }
    let mut counted = 0usize;
    for e in &report.xid_events {
        counted += 1;
        let gpu = report
            .gpus
            .iter()
            .find(|g| g.pci_bus_id.as_deref().is_some_and(|p| e.matches_gpu(p)));
        let who = gpu
            .map(GpuReport::label)
            .unwrap_or_else(|| format!("GPU at PCI {}", e.pci));
        let allowed = t.allowed.contains(&u64::from(e.xid));
        ev.evidence.push(json!({ "xid": e, "allowed": allowed }));
        if !allowed {
            ev.problems
                .push(format!("{who}: Xid {} ({})", e.xid, e.detail));
        }
    }
    ev.measured.push(json!({
        "xid_events": counted,
        "allowed": t.allowed,
        "kernel_log_lines": report.kernel_log.lines,
    }));
    ev.summary = format!(
        "no Xid outside {:?} since boot ({counted} events in {} log lines)",
        t.allowed, report.kernel_log.lines
    );
}

fn thermal(t: &Thermal, report: &ProbeReport, ev: &mut Eval) {
    for g in &report.gpus {
        let label = g.label();
        match g.temperature_c {
            Some(c) if u64::from(c) > t.temperature_c_max => ev.problems.push(format!(
                "{label}: temperature {c} °C (max {})",
                t.temperature_c_max
            )),
            Some(_) => {}
            None => ev.missing(g, "temperature_c"),
        }
        if let Some(max) = t.power_w_max {
            match g.power_mw {
                Some(mw) if u64::from(mw) > max * 1000 => ev.problems.push(format!(
                    "{label}: power {:.1} W (max {max})",
                    f64::from(mw) / 1000.0
                )),
                Some(_) => {}
                None => ev.missing(g, "power_mw"),
            }
        }
        match &g.throttle_reasons {
            Some(reasons) => {
                let bad: Vec<&String> = reasons
                    .iter()
                    .filter(|r| t.throttle_forbidden.contains(r))
                    .collect();
                if !bad.is_empty() {
                    ev.problems
                        .push(format!("{label}: throttled by {}", join(&bad)));
                }
            }
            None => ev.missing(g, "throttle_reasons"),
        }
        ev.measured.push(json!({
            "index": g.index, "temperature_c": g.temperature_c, "power_mw": g.power_mw,
            "throttle_reasons": g.throttle_reasons,
        }));
    }
}

fn firmware(t: &GpuFirmware, report: &ProbeReport, node: &NodeTarget, ev: &mut Eval) {
    if !t.driver_versions.is_empty() {
        match &report.driver_version {
            Some(v) if t.driver_versions.contains(v) => {}
            Some(v) => ev.problems.push(format!(
                "driver {v}, expected one of {:?}",
                t.driver_versions
            )),
            None => ev
                .unknown
                .push("driver version missing from the probe".into()),
        }
    }
    if t.vbios_equal_baseline {
        let Some(want) = node.firmware.get("gpu_vbios") else {
            ev.unknown
                .push("no gpu_vbios baseline for this node in the manifest".into());
            return;
        };
        for g in &report.gpus {
            match &g.vbios_version {
                Some(v) if v.eq_ignore_ascii_case(want) => {}
                Some(v) => ev
                    .problems
                    .push(format!("{}: VBIOS {v}, baseline {want}", g.label())),
                None => ev.missing(g, "vbios_version"),
            }
            ev.measured
                .push(json!({ "index": g.index, "vbios_version": g.vbios_version }));
        }
        ev.summary = format!("{} GPUs on VBIOS {want}", report.gpus.len());
    }
}

fn join(items: &[&String]) -> String {
    items
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Fetches the probe report over the node's shell: runs the command and parses its stdout
/// (whatever the exit code: the report says what went wrong). Unavailable NVML is an error.
pub async fn fetch_probe(
    ctx: &CheckContext,
    settings: &ProbeSettings,
) -> Result<ProbeReport, String> {
    let shell = ctx.shell()?;
    let timeout = settings.timeout.min(ctx.remaining());
    let out = shell
        .exec(&settings.command, timeout)
        .await
        .map_err(|e| format!("probe on {}: {e}", shell.describe()))?;
    let report: ProbeReport = serde_json::from_str(out.stdout.trim()).map_err(|e| {
        format!(
            "`{}` printed no probe report (exit {:?}: {}); {e}",
            settings.command,
            out.exit_code,
            tail(&out.stderr, 300)
        )
    })?;
    if !report.nvml.available {
        return Err(report
            .nvml
            .error
            .clone()
            .unwrap_or_else(|| "NVML unavailable on the node".into()));
    }
    Ok(report)
}

pub(crate) fn tail(s: &str, max_chars: usize) -> String {
    let s = s.trim();
    let n = s.chars().count();
    if n <= max_chars {
        s.to_string()
    } else {
        format!("…{}", s.chars().skip(n - max_chars).collect::<String>())
    }
}

/// A GPU check as a playbook step.
pub struct GpuCheck {
    pub name: String,
    pub probe: ProbeSettings,
    pub thresholds: GpuThresholds,
}

impl Check for GpuCheck {
    fn name(&self) -> &str {
        &self.name
    }

    fn run<'a>(&'a self, ctx: &'a CheckContext) -> CheckFuture<'a> {
        boxed(async move {
            let report: Arc<ProbeReport> =
                match ctx.probe_with(|| fetch_probe(ctx, &self.probe)).await {
                    Ok(r) => r,
                    Err(e) => return CheckResult::error(&self.name, format!("{}: {e}", self.name)),
                };
            let r = self.thresholds.evaluate(&self.name, &report, &ctx.node);
            debug_assert!(r.verdict != Verdict::Fail || !r.message.is_empty());
            r
        })
    }
}
