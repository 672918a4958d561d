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
                    g.serial = Some(format!("{}{:02}", 1_652_400_000 + self.index, g.index));
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
                }
            }
            r
        };
        let (report, code) = run_probe(&recorded);
        let text = serde_json::to_string(&report).unwrap_or_else(|e| {
            json!({"schema": 1, "error": format!("cannot encode the report: {e}")}).to_string()
        });
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

    /// `ip -j link`: the recorded front end, or with interfaces down on a flaky run.
    pub fn ip_link(&self, flaky: bool) -> String {
        let name = if flaky {
            "eth_learn_down_intf"
        } else {
            "eth_learn_good"
        };
        self.fixtures.ip_link.get(name).cloned().unwrap_or_default()
    }

    /// `dcgmi diag -r 3 --json`: every test passes on every GPU (DCGM 2.x/3.x layout).
    pub fn dcgm_json(&self) -> String {
        let gpus: Vec<String> = (0..self.spec.gpu_count).map(|i| i.to_string()).collect();
        let per_gpu = |name: &str| json!({"name": name, "results": gpus.iter().map(|g| json!({"gpu_ids": g, "status": "Pass"})).collect::<Vec<_>>()});
        let node_wide = |name: &str| json!({"name": name, "results": [{"status": "Pass"}]});
        json!({"DCGM GPU Diagnostic": {"test_categories": [
            {"category": "Deployment", "tests": [node_wide("Denylist"), node_wide("NVML Library"),
                node_wide("CUDA Main Library"), node_wide("Persistence Mode"),
                node_wide("Page Retirement/Row Remap")]},
            {"category": "Integration", "tests": [per_gpu("PCIe")]},
            {"category": "Hardware", "tests": [per_gpu("GPU Memory")]},
            {"category": "Stress", "tests": [per_gpu("Targeted Stress"), per_gpu("Targeted Power")]},
        ]}})
        .to_string()
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
