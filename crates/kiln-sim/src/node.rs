//! One simulated node: its manifest row, its faults, and what it answers — the probe report,
//! sysfs reads, `ip -j link`, stress output — built from the shared recordings and changed
//! only where a fault says so.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kiln_checks::{run_probe, RecordedGpus};
use kiln_manifest::NodeSpec;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::fixtures::Fixtures;
use crate::spec::{Fault, GpuModel};

/// BMC and BIOS versions of every healthy simulated node (the mockup's own).
pub const FIRMWARE_BMC: &str = "1.45.455b66-rev4";
pub const FIRMWARE_BIOS: &str = "P79 v1.45";
/// The BIOS a node with `firmware-drift` reports.
pub const FIRMWARE_BIOS_DRIFTED: &str = "P79 v1.44";
/// The recorded HCAs' firmware.
pub const FIRMWARE_NIC: &str = "20.31.2354";

pub struct SimNode {
    pub spec: NodeSpec,
    pub index: usize,
    pub model: GpuModel,
    pub faults: Vec<Fault>,
    pub ssh_addr: SocketAddr,
    pub bmc_addr: SocketAddr,
    pub(crate) fixtures: Arc<Fixtures>,
    /// SSH connections accepted so far: the agent opens one per run.
    pub(crate) runs: AtomicU64,
    /// `kiln probe --sample` answers so far (the throttle fault's violation time grows with it).
    samples: AtomicU64,
    pub(crate) next_pgid: AtomicU32,
    rng: Mutex<StdRng>,
}

impl SimNode {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        spec: NodeSpec,
        index: usize,
        model: GpuModel,
        faults: Vec<Fault>,
        ssh_addr: SocketAddr,
        bmc_addr: SocketAddr,
        fixtures: Arc<Fixtures>,
        seed: u64,
    ) -> SimNode {
        SimNode {
            spec,
            index,
            model,
            faults,
            ssh_addr,
            bmc_addr,
            fixtures,
            runs: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            next_pgid: AtomicU32::new(4000),
            rng: Mutex::new(StdRng::seed_from_u64(
                seed ^ (index as u64).wrapping_mul(0x9e37_79b9),
            )),
        }
    }

    pub fn has(&self, f: &Fault) -> bool {
        self.faults.contains(f)
    }

    pub fn hostname(&self) -> &str {
        &self.spec.hostname
    }

    /// Starts a run (an SSH connection): whether a flaky fault shows in it.
    pub(crate) fn begin_run(&self) -> bool {
        let run = self.runs.fetch_add(1, Ordering::Relaxed) + 1;
        let mut flaky = false;
        for f in &self.faults {
            match f {
                Fault::FlakyFirst(n) => flaky |= run <= u64::from(*n),
                Fault::FlakyProbability(p) => {
                    let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
                    flaky |= rng.random_bool(*p);
                }
                _ => {}
            }
        }
        flaky
    }

    /// Serial number of the chassis and system.
    pub fn serial(&self) -> String {
        format!("KSIM{:08}", self.index + 1)
    }

    /// The BIOS version the BMC reports.
    pub fn bios_reported(&self) -> &str {
        if self.has(&Fault::FirmwareDrift) {
            FIRMWARE_BIOS_DRIFTED
        } else {
            &self.spec.firmware_bios
        }
    }

    /// `kiln probe`: the report JSON and the exit code, from the recording with this node's
    /// identity (GPU names, serials, UUIDs, VBIOS) and faults applied, through the real
    /// `run_probe`.
    pub fn probe(&self) -> (String, i32) {
        let recorded = if self.model == GpuModel::None {
            RecordedGpus {
                snapshot: None,
                nvml_error: Some(
                    "a libloading error occurred: libnvidia-ml.so: cannot open shared object \
                     file: No such file or directory"
                        .into(),
                ),
                kernel_log: self.fixtures.probe.kernel_log.clone(),
            }
        } else {
            let mut r = self.fixtures.probe.clone();
            if let Some(snap) = r.snapshot.as_mut() {
                for g in &mut snap.gpus {
                    g.name = Some(self.model.nvml_name().to_string());
                    g.vbios_version = Some(self.spec.firmware_gpu_vbios.clone());
                    g.serial = Some(self.gpu_serial(g.index));
                    g.uuid = Some(format!(
                        "GPU-5d6c2b1e-8f0a-4c3e-9b7d-{:08x}{:04x}",
                        self.index + 1,
                        g.index
                    ));
                    if self.has(&Fault::Ecc) && g.index == 3 {
                        if let Some(e) = g.ecc.as_mut() {
                            e.volatile_uncorrected = 2;
                            e.aggregate_uncorrected += 2;
                        }
                    }
                    if self.has(&Fault::RowRemap) && g.index == 5 {
                        if let Some(rr) = g.row_remap.as_mut() {
                            rr.uncorrectable = 1;
                            rr.failure = true;
                        }
                    }
                    if self.has(&Fault::NvlinkDown) && g.index == 4 {
                        if let Some(l) = g.nvlinks.get_mut(7) {
                            l.active = false;
                        }
                    }
                }
            }
            if self.has(&Fault::Xid79) {
                let pci = r
                    .snapshot
                    .as_ref()
                    .and_then(|s| s.gpus.get(2))
                    .and_then(|g| g.pci_bus_id.clone())
                    .unwrap_or_default();
                let short = kiln_checks::xid::normalize_pci(&pci);
                let log = r.kernel_log.get_or_insert_with(String::new);
                log.push_str(&format!(
                    "[ 5012.337204] NVRM: Xid (PCI:{short}): 79, pid=2877, name=gpu_burn, GPU has fallen off the bus.\n"
                ));
            }
            r
        };
        let (report, code) = run_probe(&recorded);
        let text = serde_json::to_string(&report).unwrap_or_else(|e| {
            json!({"schema": 1, "error": format!("cannot encode the report: {e}")}).to_string()
        });
        (text, code)
    }

    /// `kiln probe --sample`: the recording as it reads under load (Gen5 links, near the power
    /// limit, no idle flag); with `throttle`, GPU 6 throttled for heat with its thermal
    /// violation time growing 2.5 s per sample.
    pub fn probe_sample(&self) -> (String, i32) {
        let n = self.samples.fetch_add(1, Ordering::Relaxed);
        let (full, code) = self.probe();
        let Ok(mut report) = serde_json::from_str::<kiln_checks::ProbeReport>(&full) else {
            return (full, code);
        };
        report.xid_events.clear();
        report.sxid_events.clear();
        report.kernel_log.source = Some("not read (sample)".into());
        report.kernel_log.lines = 0;
        for g in &mut report.gpus {
            g.throttle_reasons = Some(Vec::new());
            if let Some(p) = g.pcie.as_mut() {
                p.generation_current = p.generation_max;
            }
            g.power_mw = Some(655_000 + 1_000 * g.index);
            g.temperature_c = Some(68 + g.index);
            g.memory_temperature_c = Some(74 + g.index);
            if self.has(&Fault::Throttle) && g.index == 6 {
                g.throttle_reasons = Some(vec!["hw_thermal_slowdown".into()]);
                g.temperature_c = Some(91);
                if let Some(v) = g.violations_ns.as_mut() {
                    v.thermal = (n + 1) * 2_500_000_000;
                }
            }
        }
        let text = serde_json::to_string(&report).unwrap_or(full);
        (text, code)
    }

    /// The sysfs snapshot this node's `/sys` is.
    fn sysfs(&self) -> Option<&std::collections::BTreeMap<String, String>> {
        if self.model == GpuModel::None {
            return None; // CPU nodes have no HCAs
        }
        let name = if self.has(&Fault::StuckIb) {
            "learn_stuck_ib_intf"
        } else {
            "learn_good"
        };
        self.fixtures.sysfs.get(name)
    }

    /// The first line of a sysfs file, if the node has it.
    pub fn read_sysfs(&self, path: &str) -> Option<String> {
        let content = self.sysfs()?.get(path)?;
        // ib-flap: HCA mlx5_3's netdev ib3 went down after flapping, its port still ACTIVE.
        if self.has(&Fault::IbFlap) && path.contains("/0000:54:00.0/net/ib3/") {
            if path.ends_with("/operstate") {
                return Some("down".into());
            }
            if path.ends_with("/carrier_changes") {
                return Some("47".into());
            }
        }
        Some(content.lines().next().unwrap_or_default().to_string())
    }

    /// Every sysfs file path matching a glob (`*` matches within one path segment).
    pub fn glob_sysfs(&self, pattern: &str) -> Vec<String> {
        let Some(files) = self.sysfs() else {
            return Vec::new();
        };
        files
            .keys()
            .filter(|p| glob_match(pattern, p))
            .cloned()
            .collect()
    }

    /// The Ethernet snapshot this run sees: interfaces down on a flaky run, half speed with
    /// `eth-slow`, else the good one.
    fn eth_snapshot(&self, flaky: bool) -> &'static str {
        if flaky {
            "eth_learn_down_intf"
        } else if self.has(&Fault::EthSlow) {
            "eth_learn_degraded_intf"
        } else {
            "eth_learn_good"
        }
    }

    /// `ip -j link`.
    pub fn ip_link(&self, flaky: bool) -> String {
        self.fixtures
            .ip_link
            .get(self.eth_snapshot(flaky))
            .cloned()
            .unwrap_or_default()
    }

    /// The Ethernet step's sysfs loop over `interfaces`: speed and permanent MAC per interface.
    pub fn eth_sysfs(&self, flaky: bool, interfaces: &[String]) -> String {
        let table = self.fixtures.eth_sysfs.get(self.eth_snapshot(flaky));
        let mut out = String::new();
        for i in interfaces {
            let (speed, mac) = table.and_then(|t| t.get(i)).cloned().unwrap_or_default();
            out.push_str(&format!(
                "speed\t{i}\t{speed}\npermaddr\t{i}\t{mac}\naddress\t{i}\t\n"
            ));
        }
        out
    }

    /// `dcgmi diag -r 3 --json` in DCGM 4.x's layout: every test passes on every GPU, or
    /// with `dcgm-fail` GPU 3 fails the memory test with DCGM_FR_FAULTY_MEMORY (error 52).
    pub fn dcgm_json(&self) -> String {
        let gpus = u32::from(self.spec.gpu_count);
        let tests = [
            ("Deployment", "software"),
            ("Integration", "pcie"),
            ("Hardware", "memory"),
            ("Hardware", "diagnostic"),
            ("Stress", "memory_bandwidth"),
            ("Stress", "targeted_stress"),
            ("Stress", "targeted_power"),
        ];
        let mut categories: Vec<(&str, Vec<serde_json::Value>)> = Vec::new();
        for (cat, test) in tests {
            let mut any_fail = false;
            let results: Vec<serde_json::Value> = (0..gpus)
                .map(|g| {
                    let mut r = json!({"entity_group": "GPU", "entity_group_id": 1, "entity_id": g, "status": "Pass"});
                    if self.has(&Fault::DcgmFail) && test == "memory" && g == 3 {
                        any_fail = true;
                        r["status"] = "Fail".into();
                        r["warnings"] = json!([{"warning": "Found 4 faulty memory elements on GPU 3", "error_id": 52, "error_category": 10, "error_severity": 2}]);
                    }
                    r
                })
                .collect();
            let summary = if any_fail { "Fail" } else { "Pass" };
            let entry =
                json!({"name": test, "results": results, "test_summary": {"status": summary}});
            match categories.iter_mut().find(|(c, _)| *c == cat) {
                Some((_, t)) => t.push(entry),
                None => categories.push((cat, vec![entry])),
            }
        }
        let serials: Vec<serde_json::Value> = (0..gpus)
            .map(|g| json!({"entity_id": g, "serial_num": self.gpu_serial(g), "device_id": "2330"}))
            .collect();
        json!({
            "DCGM Diagnostic": {"test_categories": categories.iter().map(|(c, t)| json!({"category": c, "tests": t})).collect::<Vec<_>>()},
            "entity_groups": [{"entity_group": "GPU", "entity_group_id": 1, "entities": serials}],
            "metadata": {"version": "4.6.0", "Driver Version Detected": "550.90.07"},
        })
        .to_string()
    }

    /// A simulated GPU's serial number (the probe reports the same).
    pub fn gpu_serial(&self, gpu: u32) -> String {
        format!("{}{:02}", 1_652_400_000 + self.index, gpu)
    }

    /// `smartctl -x --json` of every drive: the recorded ten healthy NVMe drives, or with
    /// `smart-critical` nvme0 reporting reliability degraded (critical warning bit 2) and
    /// media errors.
    pub fn smartctl(&self) -> String {
        let mut out = String::new();
        for (i, doc) in self.fixtures.smartctl.iter().enumerate() {
            let mut d = doc.clone();
            if self.has(&Fault::SmartCritical) && i == 0 {
                d["nvme_smart_health_information_log"]["critical_warning"] = 0x04.into();
                d["nvme_smart_health_information_log"]["media_errors"] = 3.into();
            }
            out.push_str(&d.to_string());
            out.push('\n');
        }
        out
    }

    /// gpu-burn's closing summary, every GPU OK.
    pub fn gpu_burn_output(&self) -> String {
        let mut s = String::from("Burning for 1800 seconds.\n100.0%  proc'd: 53421 (44012 Gflop/s)   errors: 0   temps: 71 C\nKilling processes.. done\n\n");
        s.push_str(&format!("Tested {} GPUs:\n", self.spec.gpu_count));
        for i in 0..self.spec.gpu_count {
            s.push_str(&format!("\tGPU {i}: OK\n"));
        }
        s
    }
}

/// Shell-style glob over `/`-separated paths: `*` matches any run of characters other than
/// `/`; everything else literally.
pub fn glob_match(pattern: &str, path: &str) -> bool {
    let ps: Vec<&str> = pattern.split('/').collect();
    let xs: Vec<&str> = path.split('/').collect();
    ps.len() == xs.len() && ps.iter().zip(&xs).all(|(p, x)| segment_match(p, x))
}

fn segment_match(p: &str, x: &str) -> bool {
    match p.split_once('*') {
        None => p == x,
        Some((head, rest)) => {
            let Some(x) = x.strip_prefix(head) else {
                return false;
            };
            if x.starts_with('.') && head.is_empty() {
                return false; // like sh: * does not match a leading dot
            }
            (0..=x.len())
                .filter(|i| x.is_char_boundary(*i))
                .any(|i| segment_match(rest, &x[i..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_within_segments() {
        assert!(glob_match(
            "/sys/bus/pci/devices/*/infiniband/*/ports/*/state",
            "/sys/bus/pci/devices/0000:ba:00.0/infiniband/mlx5_8/ports/1/state"
        ));
        assert!(!glob_match(
            "/sys/class/infiniband/*/fw_ver",
            "/sys/bus/pci/devices/x/infiniband/mlx5_8/fw_ver"
        ));
        assert!(glob_match("/a/b*c/d", "/a/bxxc/d"));
        assert!(!glob_match("/a/*", "/a/.hidden"));
        assert!(!glob_match("/a/*", "/a/b/c"));
    }
}
