//! GPU checks: each evaluates the node's `ProbeReport` against playbook thresholds.
//!
//! The report is fetched once per run (the first GPU check runs the probe command over the
//! node's shell; the rest reuse it, see `CheckContext::probe_with`). Evaluation (`eval`) is a
//! pure function of (report, node, thresholds), so it is tested without a GPU. `telemetry` is
//! the step that samples the probe while stress runs.

mod eval;
pub mod telemetry;

use std::sync::Arc;
use std::time::Duration;

use crate::check::{boxed, Check, CheckContext, CheckFuture, CheckResult, NodeTarget, Verdict};
use crate::probe::ProbeReport;
use crate::yaml::{Fields, LoadError};

/// Xids that an application causes (illegal address, MMU fault from user code, ...). Seen on
/// healthy hardware in production, but during burn-in only DCGM and gpu-burn run, so the
/// shipped playbooks allow none of them (`gpu_xid.allowed` defaults to empty).
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
    Fabric(Fabric),
}

/// GPU count and model. `count` defaults to the node's manifest count.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Inventory {
    pub count: Option<u64>,
    /// Accepted NVML names (`NVIDIA H100 80GB HBM3`); empty accepts any.
    pub names: Vec<String>,
}

/// ECC counters. Volatile counts reset when the driver reloads; aggregate counts are the GPU's
/// lifetime (kept in its InfoROM), so a GPU that had uncorrectable errors before a reboot is
/// still seen. SRAM counts are the on-chip memories (caches, register files), not HBM.
#[derive(Debug, Clone, PartialEq)]
pub struct Ecc {
    pub uncorrected_volatile_max: u64,
    pub uncorrected_aggregate_max: Option<u64>,
    pub corrected_volatile_max: Option<u64>,
    pub sram_uncorrected_max: Option<u64>,
    pub sram_corrected_max: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RowRemapLimits {
    pub pending_allowed: bool,
    pub failure_allowed: bool,
    pub uncorrectable_max: Option<u64>,
    /// Row remapping must be readable (true on Ampere and newer: "not supported" there means
    /// the reading failed, so it is an Error rather than a pass).
    pub required: bool,
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
    /// Xids that do not fail the node.
    pub allowed: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Thermal {
    pub temperature_c_max: u64,
    pub memory_temperature_c_max: Option<u64>,
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

/// The NVLink fabric of an HGX node: Fabric Manager running, every GPU's fabric registration
/// completed, no NVSwitch error (SXid) in the kernel log.
#[derive(Debug, Clone, PartialEq)]
pub struct Fabric {
    pub fabric_manager_required: bool,
    /// SXids that do not fail the node (none by default: fatal ones leave the fabric unusable,
    /// non-fatal ones during burn-in point at a link).
    pub sxid_allowed: Vec<u64>,
}

pub const DEFAULT_THROTTLE_FORBIDDEN: [&str; 4] = [
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
];

/// A count threshold's largest value in a playbook.
const COUNT_MAX: u64 = 1_000_000_000;

impl GpuThresholds {
    /// The playbook check kinds this module provides (besides `gpu_telemetry`).
    pub const KINDS: [&'static str; 10] = [
        "gpu_inventory",
        "gpu_ecc",
        "gpu_row_remap",
        "gpu_retired_pages",
        "gpu_pcie",
        "gpu_nvlink",
        "gpu_xid",
        "gpu_thermal",
        "gpu_firmware",
        "gpu_fabric",
    ];

    /// The fields of `kind` (besides the common `check`, `name`, `timeout_s`).
    pub fn fields(kind: &str) -> &'static [&'static str] {
        match kind {
            "gpu_inventory" => &["count", "names"],
            "gpu_ecc" => &[
                "uncorrected_volatile_max",
                "uncorrected_aggregate_max",
                "corrected_volatile_max",
                "sram_uncorrected_max",
                "sram_corrected_max",
            ],
            "gpu_row_remap" => &[
                "pending_allowed",
                "failure_allowed",
                "uncorrectable_max",
                "required",
            ],
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
            "gpu_thermal" => &[
                "temperature_c_max",
                "memory_temperature_c_max",
                "power_w_max",
                "throttle_forbidden",
            ],
            "gpu_firmware" => &["vbios_equal_baseline", "driver_versions"],
            "gpu_fabric" => &["fabric_manager_required", "sxid_allowed"],
            _ => &[],
        }
    }

    /// Reads the thresholds of `kind` from a playbook step; problems go to `errors`.
    pub(crate) fn parse(
        kind: &str,
        f: &mut Fields<'_>,
        errors: &mut Vec<LoadError>,
    ) -> Option<GpuThresholds> {
        let count = |f: &mut Fields<'_>, key: &str, errors: &mut Vec<LoadError>| {
            f.opt_u64(key, 0..=COUNT_MAX, errors)
        };
        Some(match kind {
            "gpu_inventory" => GpuThresholds::Inventory(Inventory {
                count: f.opt_u64("count", 1..=64, errors),
                names: f.opt_str_list("names", None, errors).unwrap_or_default(),
            }),
            // Zero is the default for every uncorrected count: during burn-in of a new GPU any
            // uncorrectable error is a fault. Corrected counts are unlimited unless set.
            "gpu_ecc" => GpuThresholds::Ecc(Ecc {
                uncorrected_volatile_max: count(f, "uncorrected_volatile_max", errors).unwrap_or(0),
                uncorrected_aggregate_max: Some(
                    count(f, "uncorrected_aggregate_max", errors).unwrap_or(0),
                ),
                corrected_volatile_max: count(f, "corrected_volatile_max", errors),
                sram_uncorrected_max: Some(count(f, "sram_uncorrected_max", errors).unwrap_or(0)),
                sram_corrected_max: count(f, "sram_corrected_max", errors),
            }),
            "gpu_row_remap" => GpuThresholds::RowRemap(RowRemapLimits {
                pending_allowed: f.opt_bool("pending_allowed", errors).unwrap_or(false),
                failure_allowed: f.opt_bool("failure_allowed", errors).unwrap_or(false),
                uncorrectable_max: count(f, "uncorrectable_max", errors),
                required: f.opt_bool("required", errors).unwrap_or(true),
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
            // NVLink counters of a healthy link stay at 0 through a burn-in (DCGM's NVLink
            // health watch fails on any replay, recovery or CRC error growth): 0 by default.
            "gpu_nvlink" => GpuThresholds::Nvlink(Nvlink {
                links_min: f.opt_u64("links_min", 0..=64, errors),
                all_active: f.opt_bool("all_active", errors).unwrap_or(true),
                replay_errors_max: Some(count(f, "replay_errors_max", errors).unwrap_or(0)),
                recovery_errors_max: Some(count(f, "recovery_errors_max", errors).unwrap_or(0)),
                crc_errors_max: Some(count(f, "crc_errors_max", errors).unwrap_or(0)),
            }),
            "gpu_xid" => GpuThresholds::Xid(Xid {
                allowed: f
                    .opt_u64_list("allowed", 1..=1000, errors)
                    .unwrap_or_default(),
            }),
            "gpu_thermal" => {
                let temperature_c_max = f.req_u64("temperature_c_max", 30..=120, errors);
                let memory_temperature_c_max =
                    f.opt_u64("memory_temperature_c_max", 30..=120, errors);
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
                    memory_temperature_c_max,
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
            "gpu_fabric" => GpuThresholds::Fabric(Fabric {
                fabric_manager_required: f
                    .opt_bool("fabric_manager_required", errors)
                    .unwrap_or(true),
                sxid_allowed: f
                    .opt_u64_list("sxid_allowed", 1..=99_999, errors)
                    .unwrap_or_default(),
            }),
            _ => return None,
        })
    }

    /// Evaluates the report. Fail when a reading is outside a threshold (each fault a finding
    /// on its GPU or NVSwitch); Error when a needed reading is missing.
    pub fn evaluate(&self, name: &str, report: &ProbeReport, node: &NodeTarget) -> CheckResult {
        eval::evaluate(self, name, report, node)
    }
}

/// Fetches the probe report over the node's shell: runs the command and parses its stdout
/// (whatever the exit code: the report says what went wrong). Unavailable NVML is an error.
pub async fn fetch_probe(
    ctx: &CheckContext,
    settings: &ProbeSettings,
) -> Result<ProbeReport, String> {
    probe_command(ctx, &settings.command, settings.timeout).await
}

/// Runs a probe command (`kiln probe`, `kiln probe --sample`) and parses its report.
pub(crate) async fn probe_command(
    ctx: &CheckContext,
    command: &str,
    timeout: Duration,
) -> Result<ProbeReport, String> {
    let shell = ctx.shell()?;
    let timeout = timeout.min(ctx.remaining());
    let out = shell
        .exec(command, timeout)
        .await
        .map_err(|e| format!("probe on {}: {e}", shell.describe()))?;
    let report: ProbeReport = serde_json::from_str(out.stdout.trim()).map_err(|e| {
        format!(
            "`{command}` printed no probe report (exit {:?}: {}); {e}",
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
            debug_assert!(r.verdict != Verdict::Fail || !r.findings.is_empty());
            r
        })
    }
}
