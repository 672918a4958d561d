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
    EccCounter, MemoryError, RetirementCause, TemperatureSensor,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_REMAPPED_COR, NVML_FI_DEV_REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_PENDING,
    NVML_FI_DEV_REMAPPED_UNC,
};
use nvml_wrapper::{Device, Nvml};

use crate::probe::{
    read_kernel_log, EccCounts, GpuReport, GpuSnapshot, GpuSource, NvLinkState, PcieLink,
    RetiredPages, RowRemap, NOT_SUPPORTED,
};

/// NVLinks probed per GPU (NVML_NVLINK_MAX_LINKS in current drivers).
const NVLINKS_MAX: u32 = 18;

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
        for index in 0..count {
            match nvml.device_by_index(index) {
                Ok(dev) => snap.gpus.push(read_gpu(index, &dev, &mut snap.errors)),
                Err(e) => snap.errors.push(format!("GPU {index}: cannot open: {e}")),
            }
        }
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
    let row_remap = read_row_remap(dev, &mut r);
    let nvlinks = read_nvlinks(dev, &mut r);
    let temperature_c = r.get("temperature_c", dev.temperature(TemperatureSensor::Gpu));
    let power_mw = r.get("power_mw", dev.power_usage());
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
        pcie,
        ecc,
        retired_pages,
        row_remap,
        nvlinks,
        temperature_c,
        power_mw,
        throttle_reasons,
        unavailable: r.unavailable,
    }
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
