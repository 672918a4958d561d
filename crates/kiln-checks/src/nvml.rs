//! The real `GpuSource`: NVML through nvml-wrapper. `libnvidia-ml.so` is loaded at run
//! time (dlopen), so this compiles everywhere; on a machine without the driver
//! `NvmlGpus::snapshot` returns `Err` and `run_probe` reports NVML unavailable.
//!
//! Row remapping is read through NVML field values (`NVML_FI_DEV_REMAPPED_*`), since
//! nvml-wrapper 0.13 has no safe wrapper for `nvmlDeviceGetRemappedRows` and the workspace
//! forbids `unsafe`.

use std::collections::BTreeMap;

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, MemoryLocation, PerformancePolicy, RetirementCause,
    TemperatureSensor,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_MEMORY_TEMP, NVML_FI_DEV_REMAPPED_COR, NVML_FI_DEV_REMAPPED_FAILURE,
    NVML_FI_DEV_REMAPPED_PENDING, NVML_FI_DEV_REMAPPED_UNC,
};
use nvml_wrapper::{Device, Nvml};

use crate::probe::{
    parse_smi_query, read_kernel_log, Clocks, EccCounts, GpuReport, GpuSnapshot, GpuSource,
    NvLinkState, PcieLink, RetiredPages, RowRemap, ServiceStatus, SmiQuery, Violations,
    NOT_SUPPORTED,
};

/// NVLinks probed per GPU (NVML_NVLINK_MAX_LINKS in current drivers).
const NVLINKS_MAX: u32 = 18;
/// The NVSwitch fabric's service on HGX nodes.
const FABRIC_MANAGER_UNIT: &str = "nvidia-fabricmanager";
/// How long a helper command (`nvidia-smi -q`, `systemctl`) may take, through coreutils'
/// `timeout`: the probe itself has a deadline on the agent's side, but a hung helper would
/// leave the probe's process behind on the node.
const HELPER_TIMEOUT_S: &str = "20";
/// Most helper output read (nvidia-smi -q prints some 20 KiB per GPU).
const HELPER_OUTPUT_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Runs `program args` under `timeout`; stdout on exit 0, else stdout or the error.
fn run_bounded(program: &str, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("timeout")
        .arg(HELPER_TIMEOUT_S)
        .arg(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    if text.len() > HELPER_OUTPUT_BYTES_MAX {
        let mut cut = HELPER_OUTPUT_BYTES_MAX;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    if out.status.success() {
        Ok(text)
    } else if !text.trim().is_empty() {
        Err(text)
    } else {
        Err(format!(
            "{program} exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// NVML, loaded lazily by `snapshot`.
#[derive(Debug, Default)]
pub struct NvmlGpus;

impl NvmlGpus {
    pub fn new() -> NvmlGpus {
        NvmlGpus
    }
}

impl GpuSource for NvmlGpus {
    fn snapshot(&self) -> Result<GpuSnapshot, String> {
        let nvml = Nvml::init().map_err(|e| e.to_string())?;
        let mut snap = GpuSnapshot {
            driver_version: nvml.sys_driver_version().ok(),
            nvml_version: nvml.sys_nvml_version().ok(),
            cuda_driver_version: nvml.sys_cuda_driver_version().ok(),
            ..Default::default()
        };
        let count = nvml
            .device_count()
            .map_err(|e| format!("device count: {e}"))?;
        let smi = match run_bounded("nvidia-smi", &["-q"]) {
            Ok(text) => parse_smi_query(&text),
            Err(e) => {
                snap.errors.push(format!("nvidia-smi -q: {e}"));
                Default::default()
            }
        };
        for index in 0..count {
            match nvml.device_by_index(index) {
                Ok(dev) => {
                    let mut g = read_gpu(index, &dev, &mut snap.errors);
                    let q = g
                        .pci_bus_id
                        .as_deref()
                        .and_then(|p| smi.get(&crate::xid::normalize_pci(p)))
                        .cloned()
                        .unwrap_or_default();
                    let SmiQuery { module_id, fabric } = q;
                    g.module_id = module_id;
                    g.fabric = fabric;
                    snap.gpus.push(g);
                }
                Err(e) => snap.errors.push(format!("GPU {index}: cannot open: {e}")),
            }
        }
        snap.fabric_manager = match run_bounded("systemctl", &["is-active", FABRIC_MANAGER_UNIT]) {
            // is-active exits non-zero for anything but active; its stdout names the state.
            Ok(state) | Err(state) => Some(ServiceStatus {
                unit: FABRIC_MANAGER_UNIT.into(),
                state: state.trim().lines().last().unwrap_or("unknown").to_string(),
            }),
        };
        Ok(snap)
    }

    fn kernel_log(&self) -> Result<(String, String), String> {
        read_kernel_log()
    }
}

/// Records a failed reading: "not supported" quietly, anything else also in `errors`.
struct Reader<'e> {
    index: u32,
    unavailable: BTreeMap<String, String>,
    errors: &'e mut Vec<String>,
}

impl Reader<'_> {
    fn get<T>(&mut self, field: &str, r: Result<T, NvmlError>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(NvmlError::NotSupported) => {
                self.unavailable.insert(field.into(), NOT_SUPPORTED.into());
                None
            }
            Err(e) => {
                let msg = e.to_string();
                self.errors
                    .push(format!("GPU {}: {field}: {msg}", self.index));
                self.unavailable.insert(field.into(), msg);
                None
            }
        }
    }
}

fn read_gpu(index: u32, dev: &Device<'_>, errors: &mut Vec<String>) -> GpuReport {
    let mut r = Reader {
        index,
        unavailable: BTreeMap::new(),
        errors,
    };
    let name = r.get("name", dev.name());
    let uuid = r.get("uuid", dev.uuid());
    let serial = r.get("serial", dev.serial());
    let vbios_version = r.get("vbios_version", dev.vbios_version());
    let pci_bus_id = r.get("pci_bus_id", dev.pci_info()).map(|p| p.bus_id);
    let pcie = (|| {
        Some(PcieLink {
            generation_current: r.get("pcie", dev.current_pcie_link_gen())?,
            generation_max: r.get("pcie", dev.max_pcie_link_gen())?,
            width_current: r.get("pcie", dev.current_pcie_link_width())?,
            width_max: r.get("pcie", dev.max_pcie_link_width())?,
        })
    })();
    let ecc = (|| {
        Some(EccCounts {
            volatile_corrected: r.get(
                "ecc",
                dev.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile),
            )?,
            volatile_uncorrected: r.get(
                "ecc",
                dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile),
            )?,
            aggregate_corrected: r.get(
                "ecc",
                dev.total_ecc_errors(MemoryError::Corrected, EccCounter::Aggregate),
            )?,
            aggregate_uncorrected: r.get(
                "ecc",
                dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate),
            )?,
        })
    })();
    let retired_pages = (|| {
        Some(RetiredPages {
            multiple_single_bit: r
                .get(
                    "retired_pages",
                    dev.retired_pages(RetirementCause::MultipleSingleBitEccErrors),
                )?
                .len() as u64,
            double_bit: r
                .get(
                    "retired_pages",
                    dev.retired_pages(RetirementCause::DoubleBitEccError),
                )?
                .len() as u64,
            pending: r.get("retired_pages", dev.are_pages_pending_retired())?,
        })
    })();
    let ecc_sram = (|| {
        let c = |e, k| dev.memory_error_counter(e, k, MemoryLocation::SRAM);
        Some(EccCounts {
            volatile_corrected: r
                .get("ecc_sram", c(MemoryError::Corrected, EccCounter::Volatile))?,
            volatile_uncorrected: r.get(
                "ecc_sram",
                c(MemoryError::Uncorrected, EccCounter::Volatile),
            )?,
            aggregate_corrected: r
                .get("ecc_sram", c(MemoryError::Corrected, EccCounter::Aggregate))?,
            aggregate_uncorrected: r.get(
                "ecc_sram",
                c(MemoryError::Uncorrected, EccCounter::Aggregate),
            )?,
        })
    })();
    let row_remap = read_row_remap(dev, &mut r);
    let nvlinks = read_nvlinks(dev, &mut r);
    let temperature_c = r.get("temperature_c", dev.temperature(TemperatureSensor::Gpu));
    let memory_temperature_c =
        read_field_u64(dev, NVML_FI_DEV_MEMORY_TEMP, "memory_temperature_c", &mut r)
            .and_then(|v| u32::try_from(v).ok());
    let power_mw = r.get("power_mw", dev.power_usage());
    let power_limit_enforced_mw = r.get("power_limit_enforced_mw", dev.enforced_power_limit());
    let power_limit_default_mw = r.get(
        "power_limit_default_mw",
        dev.power_management_limit_default(),
    );
    let clocks_mhz = (|| {
        Some(Clocks {
            sm: r.get("clocks_mhz", dev.clock_info(Clock::SM))?,
            memory: r.get("clocks_mhz", dev.clock_info(Clock::Memory))?,
        })
    })();
    let violations_ns = (|| {
        Some(Violations {
            power: r
                .get(
                    "violations_ns",
                    dev.violation_status(PerformancePolicy::Power),
                )?
                .violation_time,
            thermal: r
                .get(
                    "violations_ns",
                    dev.violation_status(PerformancePolicy::Thermal),
                )?
                .violation_time,
        })
    })();
    let pcie_replays = r
        .get("pcie_replays", dev.pcie_replay_counter())
        .map(u64::from);
    let throttle_reasons = r
        .get("throttle_reasons", dev.current_throttle_reasons())
        .map(throttle_names);
    GpuReport {
        index,
        name,
        uuid,
        serial,
        vbios_version,
        pci_bus_id,
        module_id: None,
        pcie,
        ecc,
        ecc_sram,
        retired_pages,
        row_remap,
        nvlinks,
        temperature_c,
        memory_temperature_c,
        power_mw,
        power_limit_enforced_mw,
        power_limit_default_mw,
        clocks_mhz,
        violations_ns,
        pcie_replays,
        fabric: None,
        throttle_reasons,
        unavailable: r.unavailable,
    }
}

/// One NVML field value as an integer.
fn read_field_u64(dev: &Device<'_>, id: u32, field: &str, r: &mut Reader<'_>) -> Option<u64> {
    let samples = r.get(field, dev.field_values_for(&[FieldId(id)]))?;
    let sample = r.get(field, samples.into_iter().next()?)?;
    Some(match r.get(field, sample.value)? {
        SampleValue::U32(v) => u64::from(v),
        SampleValue::U64(v) => v,
        SampleValue::I64(v) => u64::try_from(v).unwrap_or(0),
        SampleValue::F64(v) => v as u64,
    })
}

fn read_row_remap(dev: &Device<'_>, r: &mut Reader<'_>) -> Option<RowRemap> {
    let ids = [
        NVML_FI_DEV_REMAPPED_COR,
        NVML_FI_DEV_REMAPPED_UNC,
        NVML_FI_DEV_REMAPPED_PENDING,
        NVML_FI_DEV_REMAPPED_FAILURE,
    ]
    .map(FieldId);
    let samples = r.get("row_remap", dev.field_values_for(&ids))?;
    let mut values = [0u64; 4];
    for (slot, sample) in values.iter_mut().zip(samples) {
        let sample = r.get("row_remap", sample)?;
        *slot = match r.get("row_remap", sample.value)? {
            SampleValue::U32(v) => u64::from(v),
            SampleValue::U64(v) => v,
            SampleValue::I64(v) => u64::try_from(v).unwrap_or(0),
            SampleValue::F64(v) => v as u64,
        };
    }
    Some(RowRemap {
        correctable: values[0],
        uncorrectable: values[1],
        pending: values[2] != 0,
        failure: values[3] != 0,
    })
}

fn read_nvlinks(dev: &Device<'_>, r: &mut Reader<'_>) -> Vec<NvLinkState> {
    let mut links = Vec::new();
    for link in 0..NVLINKS_MAX {
        let w = dev.link_wrapper_for(link);
        let active = match w.is_active() {
            Ok(a) => a,
            // Links past the GPU's count answer NotSupported / InvalidArg: stop there.
            Err(NvmlError::NotSupported) | Err(NvmlError::InvalidArg) => break,
            Err(e) => {
                r.get::<()>("nvlinks", Err(e));
                break;
            }
        };
        let counter = |c| w.error_counter(c).ok();
        links.push(NvLinkState {
            link,
            active,
            replay_errors: counter(ErrorCounter::DlReplay),
            recovery_errors: counter(ErrorCounter::DlRecovery),
            crc_flit_errors: counter(ErrorCounter::DlCrcFlit),
            crc_data_errors: counter(ErrorCounter::DlCrcData),
        });
    }
    if links.is_empty() && !r.unavailable.contains_key("nvlinks") {
        r.unavailable.insert("nvlinks".into(), NOT_SUPPORTED.into());
    }
    links
}

fn throttle_names(t: ThrottleReasons) -> Vec<String> {
    const NAMED: [(ThrottleReasons, &str); 9] = [
        (ThrottleReasons::GPU_IDLE, "gpu_idle"),
        (
            ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
            "applications_clocks_setting",
        ),
        (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
        (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
        (ThrottleReasons::SYNC_BOOST, "sync_boost"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            "hw_power_brake_slowdown",
        ),
        (
            ThrottleReasons::DISPLAY_CLOCK_SETTING,
            "display_clock_setting",
        ),
    ];
    NAMED
        .iter()
        .filter(|(bit, _)| t.contains(*bit))
        .map(|(_, n)| n.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::{run_probe, EXIT_NVML_UNAVAILABLE, EXIT_OK, EXIT_PARTIAL};

    /// On this machine NVML is usually missing: the probe must say so in the JSON and exit
    /// non-zero. Where a GPU and driver exist, the same call must read them.
    #[test]
    fn real_nvml_probe_reports_what_it_finds() {
        let (report, code) = run_probe(&NvmlGpus::new());
        let json = serde_json::to_string(&report).expect("serialises");
        if report.nvml.available {
            assert!(code == EXIT_OK || code == EXIT_PARTIAL, "{json}");
            assert!(report.driver_version.is_some(), "{json}");
        } else {
            assert_eq!(code, EXIT_NVML_UNAVAILABLE);
            assert!(json.contains("NVML unavailable"), "{json}");
            assert!(report.gpus.is_empty());
        }
    }
}
