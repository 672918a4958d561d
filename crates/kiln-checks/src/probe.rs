//! The `kiln probe` document: what NVML and the kernel log say about a node's GPUs.
//!
//! `kiln probe` runs on the node (the agent starts it over SSH) and prints one
//! `ProbeReport` as JSON; the GPU checks (`gpu.rs`) evaluate that document on the agent.
//! Readings come from a `GpuSource`: NVML on a real node (`nvml.rs`, feature `nvml`),
//! or `RecordedGpus` (a JSON recording) in tests.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::xid::{parse_kernel_log, parse_sxid_log, SxidEvent, XidEvent};

/// Version of the `ProbeReport` layout. 2 added the readings under load (power limits,
/// violation counters, clocks, memory temperature, PCIe replays), SRAM ECC, the fabric state,
/// the SXM module and SXid events; every addition is optional, so a schema-1 report still reads.
pub const PROBE_SCHEMA: u32 = 2;

/// `run_probe` exit codes.
pub const EXIT_OK: i32 = 0;
/// NVML loaded, but some readings failed with something other than "not supported".
pub const EXIT_PARTIAL: i32 = 1;
/// NVML could not be loaded or initialised (no driver, no libnvidia-ml.so): no GPU data.
pub const EXIT_NVML_UNAVAILABLE: i32 = 2;

/// Reason recorded for a reading the GPU does not support (e.g. retired pages on a GPU
/// that uses row remapping). Checks treat it as "nothing to check", not as an error.
pub const NOT_SUPPORTED: &str = "not_supported";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeReport {
    pub schema: u32,
    pub nvml: NvmlStatus,
    pub driver_version: Option<String>,
    pub nvml_version: Option<String>,
    /// e.g. 12040 for CUDA 12.4.
    pub cuda_driver_version: Option<i32>,
    pub gpus: Vec<GpuReport>,
    /// Xid events found in the kernel log since boot.
    pub xid_events: Vec<XidEvent>,
    /// NVSwitch SXid events found in the kernel log since boot.
    #[serde(default)]
    pub sxid_events: Vec<SxidEvent>,
    /// The Fabric Manager service (`nvidia-fabricmanager`), where the probe could ask.
    #[serde(default)]
    pub fabric_manager: Option<ServiceStatus>,
    /// Where the kernel log came from (`/dev/kmsg`, `dmesg`), or why it could not be read.
    pub kernel_log: KernelLogStatus,
    /// Readings that failed for a reason other than "not supported", one line each.
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlStatus {
    pub available: bool,
    /// Why NVML is unavailable (`available == false`).
    pub error: Option<String>,
}

/// A systemd unit as `systemctl is-active` saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceStatus {
    pub unit: String,
    /// `active`, `inactive`, `failed`, ... as systemctl printed it.
    pub state: String,
}

impl ServiceStatus {
    pub fn active(&self) -> bool {
        self.state == "active"
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelLogStatus {
    pub source: Option<String>,
    pub error: Option<String>,
    pub lines: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuReport {
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub serial: Option<String>,
    pub vbios_version: Option<String>,
    /// e.g. `00000000:3B:00.0`, as NVML writes it.
    pub pci_bus_id: Option<String>,
    /// The SXM module (baseboard slot) the GPU sits in, 1-based, as `nvidia-smi -q` reports it.
    pub module_id: Option<u32>,
    pub pcie: Option<PcieLink>,
    pub ecc: Option<EccCounts>,
    /// ECC errors in on-chip SRAM (caches, register files), as opposed to HBM.
    pub ecc_sram: Option<EccCounts>,
    pub retired_pages: Option<RetiredPages>,
    pub row_remap: Option<RowRemap>,
    /// One entry per NVLink the GPU has (empty for PCIe cards without NVLink).
    pub nvlinks: Vec<NvLinkState>,
    pub temperature_c: Option<u32>,
    /// HBM temperature.
    pub memory_temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    /// The power limit in force (the lowest of every limit that applies).
    pub power_limit_enforced_mw: Option<u32>,
    /// The board's default power limit (700 W for H100/H200 SXM5).
    pub power_limit_default_mw: Option<u32>,
    pub clocks_mhz: Option<Clocks>,
    /// Time spent throttled since the driver loaded, by cause: cumulative counters, so a
    /// difference between two samples is the time throttled in between.
    pub violations_ns: Option<Violations>,
    /// PCIe replays since the driver loaded (link-level retransmissions).
    pub pcie_replays: Option<u64>,
    /// The GPU's NVLink fabric registration (HGX: Fabric Manager must have trained it).
    pub fabric: Option<FabricState>,
    /// Current clock throttle reasons, by name (see `THROTTLE_REASONS`).
    pub throttle_reasons: Option<Vec<String>>,
    /// Field -> why it is missing (`not_supported` or the NVML error).
    pub unavailable: std::collections::BTreeMap<String, String>,
}

impl GpuReport {
    /// The finding component for this GPU: index, serial, UUID, PCI address, SXM slot.
    pub fn component(&self) -> crate::finding::Component {
        crate::finding::Component::new(crate::finding::ComponentKind::Gpu)
            .index(self.index)
            .serial(self.serial.clone())
            .uuid(self.uuid.clone())
            .pci(self.pci_bus_id.clone())
            .slot(self.module_id.map(|m| format!("SXM slot {m}")))
    }

    /// `GPU 3 (GPU-8f1c…, 00000000:3B:00.0)`: how messages name a GPU.
    pub fn label(&self) -> String {
        let mut parts = Vec::new();
        if let Some(u) = &self.uuid {
            parts.push(u.clone());
        }
        if let Some(p) = &self.pci_bus_id {
            parts.push(p.clone());
        }
        if parts.is_empty() {
            format!("GPU {}", self.index)
        } else {
            format!("GPU {} ({})", self.index, parts.join(", "))
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PcieLink {
    pub generation_current: u32,
    pub generation_max: u32,
    pub width_current: u32,
    pub width_max: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Clocks {
    pub sm: u32,
    pub memory: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violations {
    pub power: u64,
    pub thermal: u64,
}

/// `nvidia-smi -q`'s Fabric section: `State` (`Completed` once trained) and `Status`
/// (`Success`, or the reason it failed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricState {
    pub state: String,
    pub status: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EccCounts {
    pub volatile_corrected: u64,
    pub volatile_uncorrected: u64,
    pub aggregate_corrected: u64,
    pub aggregate_uncorrected: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredPages {
    pub multiple_single_bit: u64,
    pub double_bit: u64,
    pub pending: bool,
}

impl RetiredPages {
    pub fn total(&self) -> u64 {
        self.multiple_single_bit.saturating_add(self.double_bit)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowRemap {
    pub correctable: u64,
    pub uncorrectable: u64,
    pub pending: bool,
    pub failure: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLinkState {
    pub link: u32,
    pub active: bool,
    pub replay_errors: Option<u64>,
    pub recovery_errors: Option<u64>,
    pub crc_flit_errors: Option<u64>,
    pub crc_data_errors: Option<u64>,
}

/// NVML's clock throttle reasons, by the names the probe writes and playbooks use.
pub const THROTTLE_REASONS: [&str; 10] = [
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
    "none",
];

/// What a `GpuSource` read: the NVML part of a report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuSnapshot {
    pub driver_version: Option<String>,
    pub nvml_version: Option<String>,
    pub cuda_driver_version: Option<i32>,
    pub gpus: Vec<GpuReport>,
    pub errors: Vec<String>,
    pub fabric_manager: Option<ServiceStatus>,
}

/// Where GPU readings come from.
pub trait GpuSource {
    /// Reads every GPU. `Err` means NVML itself is unavailable (not loaded, no driver);
    /// a reading that fails on one GPU goes in that GPU's `unavailable` map instead.
    fn snapshot(&self) -> Result<GpuSnapshot, String>;
    /// The kernel log since boot, and where it came from.
    fn kernel_log(&self) -> Result<(String, String), String>;
}

/// What the probe reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeMode {
    /// NVML and the kernel log since boot (`kiln probe`).
    Full,
    /// NVML only (`kiln probe --sample`): what the telemetry step samples every few seconds
    /// while stress runs, without re-reading the whole kernel log each time.
    Sample,
}

/// Runs the probe: reads the source, parses Xid events out of the kernel log, and returns
/// the report with the process exit code `kiln probe` should use (`EXIT_*`).
pub fn run_probe(source: &dyn GpuSource) -> (ProbeReport, i32) {
    run_probe_mode(source, ProbeMode::Full)
}

pub fn run_probe_mode(source: &dyn GpuSource, mode: ProbeMode) -> (ProbeReport, i32) {
    let (log_text, kernel_log) = match mode {
        ProbeMode::Sample => (
            String::new(),
            KernelLogStatus {
                source: Some("not read (sample)".into()),
                error: None,
                lines: 0,
            },
        ),
        ProbeMode::Full => match source.kernel_log() {
            Ok((text, from)) => {
                let lines = text.lines().count() as u64;
                (
                    text,
                    KernelLogStatus {
                        source: Some(from),
                        error: None,
                        lines,
                    },
                )
            }
            Err(e) => (
                String::new(),
                KernelLogStatus {
                    source: None,
                    error: Some(e),
                    lines: 0,
                },
            ),
        },
    };
    let xid_events = parse_kernel_log(&log_text);
    let sxid_events = parse_sxid_log(&log_text);
    match source.snapshot() {
        Ok(snap) => {
            let mut errors = snap.errors;
            if let Some(e) = &kernel_log.error {
                errors.push(format!("kernel log: {e}"));
            }
            let code = if errors.is_empty() {
                EXIT_OK
            } else {
                EXIT_PARTIAL
            };
            (
                ProbeReport {
                    schema: PROBE_SCHEMA,
                    nvml: NvmlStatus {
                        available: true,
                        error: None,
                    },
                    driver_version: snap.driver_version,
                    nvml_version: snap.nvml_version,
                    cuda_driver_version: snap.cuda_driver_version,
                    gpus: snap.gpus,
                    xid_events,
                    sxid_events,
                    fabric_manager: snap.fabric_manager,
                    kernel_log,
                    errors,
                },
                code,
            )
        }
        Err(e) => (
            ProbeReport {
                schema: PROBE_SCHEMA,
                nvml: NvmlStatus {
                    available: false,
                    error: Some(format!("NVML unavailable: {e}")),
                },
                driver_version: None,
                nvml_version: None,
                cuda_driver_version: None,
                gpus: Vec::new(),
                xid_events,
                sxid_events,
                fabric_manager: None,
                kernel_log,
                errors: vec![format!("NVML unavailable: {e}")],
            },
            EXIT_NVML_UNAVAILABLE,
        ),
    }
}

/// What `nvidia-smi -q` adds to NVML for one GPU (NVML has both, but nvml-wrapper 0.13 wraps
/// neither and the workspace forbids `unsafe`): the SXM module and the fabric state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmiQuery {
    pub module_id: Option<u32>,
    pub fabric: Option<FabricState>,
}

/// Parses `nvidia-smi -q`: per `GPU 00000000:18:00.0` section, its `Module ID` (or `Module Id`)
/// and the `State`/`Status` under `Fabric`. Keyed by the normalised PCI address
/// (`crate::xid::normalize_pci`).
pub fn parse_smi_query(text: &str) -> std::collections::BTreeMap<String, SmiQuery> {
    let mut out = std::collections::BTreeMap::new();
    let mut current: Option<String> = None;
    let mut in_fabric: Option<usize> = None;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let t = line.trim();
        if let Some(addr) = t.strip_prefix("GPU ").filter(|_| indent == 0) {
            let key = crate::xid::normalize_pci(addr);
            out.entry(key.clone()).or_insert_with(SmiQuery::default);
            current = Some(key);
            in_fabric = None;
            continue;
        }
        let Some(key) = &current else { continue };
        if let Some(fi) = in_fabric {
            if indent <= fi {
                in_fabric = None;
            }
        }
        if t == "Fabric" {
            in_fabric = Some(indent);
            continue;
        }
        let Some((k, v)) = t.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim().to_string());
        let Some(entry) = out.get_mut(key) else {
            continue;
        };
        if in_fabric.is_some() {
            let f = entry.fabric.get_or_insert(FabricState {
                state: String::new(),
                status: String::new(),
            });
            match k {
                "State" => f.state = v,
                "Status" => f.status = v,
                _ => {}
            }
        } else if k.eq_ignore_ascii_case("module id") {
            entry.module_id = v.parse().ok();
        }
    }
    out
}

/// A recorded source for tests: `{"snapshot": {...}}` or `{"nvml_error": "..."}`, plus an
/// optional `"kernel_log": "..."`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecordedGpus {
    pub snapshot: Option<GpuSnapshot>,
    pub nvml_error: Option<String>,
    pub kernel_log: Option<String>,
}

impl RecordedGpus {
    pub fn from_json(text: &str) -> Result<RecordedGpus, serde_json::Error> {
        serde_json::from_str(text)
    }
}

impl GpuSource for RecordedGpus {
    fn snapshot(&self) -> Result<GpuSnapshot, String> {
        match (&self.snapshot, &self.nvml_error) {
            (_, Some(e)) => Err(e.clone()),
            (Some(s), None) => Ok(s.clone()),
            (None, None) => Err("recording has no snapshot".into()),
        }
    }

    fn kernel_log(&self) -> Result<(String, String), String> {
        self.kernel_log
            .clone()
            .map(|t| (t, "recorded".to_string()))
            .ok_or_else(|| "recording has no kernel log".into())
    }
}

/// Most kernel log bytes read: a log this large is already a problem in itself.
pub const KERNEL_LOG_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Reads the kernel log since boot: `/dev/kmsg` (non-blocking, one record per read),
/// else `dmesg`. Returns the text and its source.
pub fn read_kernel_log() -> Result<(String, String), String> {
    match read_kmsg() {
        Ok(text) => Ok((text, "/dev/kmsg".into())),
        Err(kmsg_err) => {
            let out = std::process::Command::new("dmesg")
                .output()
                .map_err(|e| format!("/dev/kmsg: {kmsg_err}; dmesg: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "/dev/kmsg: {kmsg_err}; dmesg exited with {}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.truncate(KERNEL_LOG_BYTES_MAX.min(text.len()));
            Ok((text, "dmesg".into()))
        }
    }
}

fn read_kmsg() -> Result<String, String> {
    use std::io::{ErrorKind, Read};
    use std::os::unix::fs::OpenOptionsExt;
    const O_NONBLOCK: i32 = 0o4000; // Linux, all architectures Kiln builds for
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_NONBLOCK)
        .open("/dev/kmsg")
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    let mut record = vec![0u8; 16 * 1024];
    let started = std::time::Instant::now();
    loop {
        match f.read(&mut record) {
            Ok(0) => break,
            Ok(n) => {
                text.push_str(&String::from_utf8_lossy(&record[..n]));
                if !text.ends_with('\n') {
                    text.push('\n');
                }
                if text.len() >= KERNEL_LOG_BYTES_MAX {
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            // A record overwritten while reading: the next read continues.
            Err(e) if e.raw_os_error() == Some(32) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.to_string()),
        }
        if started.elapsed() > Duration::from_secs(10) {
            break;
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_nvml_is_reported_in_the_json_with_exit_2() {
        let src = RecordedGpus {
            nvml_error: Some("libnvidia-ml.so: cannot open shared object file".into()),
            kernel_log: Some(String::new()),
            ..Default::default()
        };
        let (report, code) = run_probe(&src);
        assert_eq!(code, EXIT_NVML_UNAVAILABLE);
        assert!(!report.nvml.available);
        let json = serde_json::to_string(&report).expect("serialises");
        assert!(json.contains("NVML unavailable: libnvidia-ml.so"), "{json}");
    }

    #[test]
    fn smi_query_gives_module_and_fabric_per_gpu() {
        let text = "\n==============NVSMI LOG==============\n\nAttached GPUs                             : 2\nGPU 00000000:18:00.0\n    Product Name                          : NVIDIA H100 80GB HBM3\n    Module ID                             : 4\n    Fabric\n        State                             : Completed\n        Status                            : Success\n    Inforom Version\n        Image Version                     : G520.0200.00.05\n        State                             : N/A\nGPU 00000000:2A:00.0\n    Module ID                             : 2\n    Fabric\n        State                             : In Progress\n        Status                            : N/A\n";
        let q = parse_smi_query(text);
        assert_eq!(q.len(), 2);
        let a = &q["0000:18:00"];
        assert_eq!(a.module_id, Some(4));
        assert_eq!(
            a.fabric,
            Some(FabricState {
                state: "Completed".into(),
                status: "Success".into()
            })
        );
        let b = &q["0000:2a:00"];
        assert_eq!(
            b.fabric.as_ref().map(|f| f.state.as_str()),
            Some("In Progress")
        );
    }

    #[test]
    fn report_round_trips_through_json() {
        let src = RecordedGpus {
            snapshot: Some(GpuSnapshot {
                driver_version: Some("550.90.07".into()),
                gpus: vec![GpuReport {
                    index: 0,
                    uuid: Some("GPU-1".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            kernel_log: Some(
                "[ 12.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
                    .into(),
            ),
            ..Default::default()
        };
        let (report, code) = run_probe(&src);
        assert_eq!(code, EXIT_OK);
        assert_eq!(report.xid_events.len(), 1);
        let back: ProbeReport =
            serde_json::from_str(&serde_json::to_string(&report).expect("ser")).expect("de");
        assert_eq!(back, report);
    }
}
