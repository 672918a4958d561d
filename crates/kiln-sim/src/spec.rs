//! What fleet to simulate: its size, GPU model and faults (`FleetSpec`), and the fault
//! kinds a node can be given (`Fault`), parsed from `HOST=KIND[:ARG]` flags.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use anyhow::{bail, Context as _};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Most nodes one fleet serves (each takes two loopback ports and their sockets).
pub const NODES_MAX: usize = 2_000;

/// The GPU model every node of the fleet has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuModel {
    H100Sxm,
    H200Sxm,
    /// CPU-only nodes (no GPUs, `gpu_count` 0).
    None,
}

impl GpuModel {
    /// The manifest's `gpu_model` label.
    pub fn label(self) -> &'static str {
        match self {
            GpuModel::H100Sxm => "H100-SXM",
            GpuModel::H200Sxm => "H200-SXM",
            GpuModel::None => "",
        }
    }

    pub fn gpu_count(self) -> u8 {
        match self {
            GpuModel::None => 0,
            _ => 8,
        }
    }

    /// What NVML calls the GPU.
    pub fn nvml_name(self) -> &'static str {
        match self {
            GpuModel::H100Sxm => "NVIDIA H100 80GB HBM3",
            GpuModel::H200Sxm => "NVIDIA H200",
            GpuModel::None => "",
        }
    }

    /// The VBIOS the simulated GPUs run (and the manifest's baseline). H100's is the recorded
    /// probe's; H200's is made up for the simulation.
    pub fn vbios(self) -> &'static str {
        match self {
            GpuModel::H100Sxm => "96.00.74.00.01",
            GpuModel::H200Sxm => "96.00.A5.00.01",
            GpuModel::None => "none",
        }
    }
}

impl FromStr for GpuModel {
    type Err = String;
    fn from_str(s: &str) -> Result<GpuModel, String> {
        match s.trim().to_ascii_uppercase().as_str() {
            "H100-SXM" => Ok(GpuModel::H100Sxm),
            "H200-SXM" => Ok(GpuModel::H200Sxm),
            "NONE" | "" => Ok(GpuModel::None),
            _ => Err(format!(
                "unknown GPU model {s:?}; expected H100-SXM, H200-SXM or none"
            )),
        }
    }
}

/// A fault injected into one simulated node, and the check it makes fail.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// GPU 3 reports 2 uncorrectable volatile ECC errors (`gpu_ecc` fails).
    Ecc,
    /// GPU 5 reports a row-remap failure (`gpu_row_remap` fails).
    RowRemap,
    /// Two InfiniBand ports stuck in INIT: the `learn_stuck_ib_intf` snapshot (`infiniband`).
    StuckIb,
    /// The BMC reports a BIOS version other than the manifest's (`bmc_firmware` fails).
    FirmwareDrift,
    /// The BMC logs a Critical SEL entry during burn-in (`bmc_sel` fails).
    SelCritical,
    /// Stress commands never finish (until killed): the stress steps end at their timeout.
    Hang,
    /// Nothing listens on the node's SSH and BMC ports: every check reports `Error`.
    Unreachable,
    /// DCGM (4.x layout) fails GPU 3's memory test with DCGM_FR_FAULTY_MEMORY (`dcgm_diag`).
    DcgmFail,
    /// HCA mlx5_3's netdev ib3 is down after 47 carrier changes while its port says ACTIVE
    /// (`infiniband`).
    IbFlap,
    /// The front end runs at half speed: the gcm `eth_learn_degraded_intf` snapshot
    /// (`ethernet`).
    EthSlow,
    /// GPU 6 throttles for heat under load: thermal violation time grows and
    /// `hw_thermal_slowdown` is set in every sample (`gpu_telemetry`).
    Throttle,
    /// GPU 2 logged Xid 79, fallen off the bus (`gpu_xid`).
    Xid79,
    /// GPU 4's NVLink 7 is inactive (`gpu_nvlink`).
    NvlinkDown,
    /// The BMC reports power supply Bay 1 failed and redundancy lost (`bmc_chassis`).
    PsuFail,
    /// NVMe drive nvme0 reports a critical warning (reliability degraded) and media errors
    /// (`disk_health`).
    SmartCritical,
    /// The first N runs (SSH connections) see a front-end interface down (`ethernet`).
    FlakyFirst(u32),
    /// Each run sees a front-end interface down with this probability (seeded).
    FlakyProbability(f64),
}

impl Fault {
    pub const KINDS: &'static str = "ecc, row-remap, stuck-ib, firmware-drift, sel-critical, \
                                     dcgm-fail, ib-flap, eth-slow, throttle, xid79, \
                                     nvlink-down, psu-fail, smart-critical, hang, unreachable, \
                                     flaky:N (first N runs fail), \
                                     flaky:P (each run fails with probability P, e.g. 0.3)";

    /// The check this fault is seen by (what a test expects to fail).
    pub fn failing_check(&self) -> &'static str {
        match self {
            Fault::Ecc => "gpu_ecc",
            Fault::RowRemap => "gpu_row_remap",
            Fault::StuckIb => "infiniband",
            Fault::FirmwareDrift => "bmc_firmware",
            Fault::SelCritical => "bmc_sel",
            Fault::DcgmFail => "dcgm_diag",
            Fault::IbFlap => "infiniband",
            Fault::EthSlow => "ethernet",
            Fault::Throttle => "gpu_telemetry",
            Fault::Xid79 => "gpu_xid",
            Fault::NvlinkDown => "gpu_nvlink",
            Fault::PsuFail => "bmc_chassis",
            Fault::SmartCritical => "disk_health",
            Fault::Hang => "dcgm_diag",
            Fault::Unreachable => "bmc_health",
            Fault::FlakyFirst(_) | Fault::FlakyProbability(_) => "ethernet",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Ecc => write!(f, "ecc"),
            Fault::RowRemap => write!(f, "row-remap"),
            Fault::StuckIb => write!(f, "stuck-ib"),
            Fault::FirmwareDrift => write!(f, "firmware-drift"),
            Fault::SelCritical => write!(f, "sel-critical"),
            Fault::DcgmFail => write!(f, "dcgm-fail"),
            Fault::IbFlap => write!(f, "ib-flap"),
            Fault::EthSlow => write!(f, "eth-slow"),
            Fault::Throttle => write!(f, "throttle"),
            Fault::Xid79 => write!(f, "xid79"),
            Fault::NvlinkDown => write!(f, "nvlink-down"),
            Fault::PsuFail => write!(f, "psu-fail"),
            Fault::SmartCritical => write!(f, "smart-critical"),
            Fault::Hang => write!(f, "hang"),
            Fault::Unreachable => write!(f, "unreachable"),
            Fault::FlakyFirst(n) => write!(f, "flaky:{n}"),
            Fault::FlakyProbability(p) => write!(f, "flaky:{p}"),
        }
    }
}

impl FromStr for Fault {
    type Err = String;
    fn from_str(s: &str) -> Result<Fault, String> {
        let s = s.trim().to_ascii_lowercase();
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (s.as_str(), None),
        };
        let plain = |f: Fault| match arg {
            None => Ok(f),
            Some(a) => Err(format!("fault {kind} takes no argument, got {a:?}")),
        };
        match kind {
            "ecc" => plain(Fault::Ecc),
            "row-remap" => plain(Fault::RowRemap),
            "stuck-ib" => plain(Fault::StuckIb),
            "firmware-drift" => plain(Fault::FirmwareDrift),
            "sel-critical" => plain(Fault::SelCritical),
            "dcgm-fail" => plain(Fault::DcgmFail),
            "ib-flap" => plain(Fault::IbFlap),
            "eth-slow" => plain(Fault::EthSlow),
            "throttle" => plain(Fault::Throttle),
            "xid79" => plain(Fault::Xid79),
            "nvlink-down" => plain(Fault::NvlinkDown),
            "psu-fail" => plain(Fault::PsuFail),
            "smart-critical" => plain(Fault::SmartCritical),
            "hang" => plain(Fault::Hang),
            "unreachable" => plain(Fault::Unreachable),
            "flaky" => {
                let a = arg.ok_or("fault flaky needs an argument: flaky:N or flaky:P")?;
                if a.contains('.') {
                    match a.parse::<f64>() {
                        Ok(p) if (0.0..=1.0).contains(&p) => Ok(Fault::FlakyProbability(p)),
                        _ => Err(format!("flaky:{a}: a probability must be 0.0 to 1.0")),
                    }
                } else {
                    match a.parse::<u32>() {
                        Ok(n) if (1..=100).contains(&n) => Ok(Fault::FlakyFirst(n)),
                        _ => Err(format!(
                            "flaky:{a}: expected a run count 1..=100 or a probability such as 0.3"
                        )),
                    }
                }
            }
            _ => Err(format!("unknown fault {kind:?}; known: {}", Fault::KINDS)),
        }
    }
}

/// Parses a `--fault HOST=KIND[:ARG]` flag.
pub fn parse_fault_flag(flag: &str) -> Result<(String, Fault), String> {
    let (host, kind) = flag
        .split_once('=')
        .ok_or_else(|| format!("--fault {flag:?}: expected HOST=KIND, e.g. host-0007=ecc"))?;
    let host = host.trim().to_ascii_lowercase();
    if host.is_empty() {
        return Err(format!("--fault {flag:?}: empty host name"));
    }
    Ok((
        host,
        kind.parse().map_err(|e| format!("--fault {flag:?}: {e}"))?,
    ))
}

/// What `fault_rate` draws from: every hardware fault, and an intermittent one.
pub const RANDOM_FAULTS: [Fault; 14] = [
    Fault::Ecc,
    Fault::RowRemap,
    Fault::StuckIb,
    Fault::FirmwareDrift,
    Fault::SelCritical,
    Fault::DcgmFail,
    Fault::IbFlap,
    Fault::EthSlow,
    Fault::Throttle,
    Fault::Xid79,
    Fault::NvlinkDown,
    Fault::PsuFail,
    Fault::SmartCritical,
    Fault::FlakyFirst(2),
];

/// The fleet to simulate.
#[derive(Debug, Clone)]
pub struct FleetSpec {
    pub racks: usize,
    pub nodes_per_rack: usize,
    pub gpu_model: GpuModel,
    /// Nodes are `<prefix>-0001`, `<prefix>-0002`, ... in rack order.
    pub hostname_prefix: String,
    /// Racks are `<prefix>-01`, `<prefix>-02`, ...
    pub rack_prefix: String,
    /// Faults by hostname (explicit; `fault_rate` adds random ones to the other nodes).
    pub faults: BTreeMap<String, Vec<Fault>>,
    /// Share of the other nodes given one random fault (a hardware fault of `RANDOM_FAULTS`
    /// or flaky:2), drawn with `seed`.
    pub fault_rate: f64,
    pub seed: u64,
    /// The fixtures (`redfish/`, `sysfs/`, `kiln/`); default: `KILN_FIXTURES`, else
    /// the repository's `fixtures/`.
    pub fixtures: Option<PathBuf>,
    /// Where the manifest, keys and agent settings are written (created if missing).
    pub out_dir: PathBuf,
}

impl FleetSpec {
    pub fn new(out_dir: PathBuf) -> FleetSpec {
        FleetSpec {
            racks: 3,
            nodes_per_rack: 8,
            gpu_model: GpuModel::H100Sxm,
            hostname_prefix: "host".into(),
            rack_prefix: "rack".into(),
            faults: BTreeMap::new(),
            fault_rate: 0.0,
            seed: 42,
            fixtures: None,
            out_dir,
        }
    }

    pub fn with_fault(mut self, host: &str, fault: Fault) -> FleetSpec {
        self.faults
            .entry(host.to_ascii_lowercase())
            .or_default()
            .push(fault);
        self
    }

    pub fn node_count(&self) -> usize {
        self.racks * self.nodes_per_rack
    }

    pub fn hostname(&self, index: usize) -> String {
        format!("{}-{:04}", self.hostname_prefix, index + 1)
    }

    pub fn rack(&self, index: usize) -> String {
        format!(
            "{}-{:02}",
            self.rack_prefix,
            index / self.nodes_per_rack + 1
        )
    }

    /// Every node's faults: the explicit ones, plus random ones at `fault_rate`.
    pub fn plan(&self) -> anyhow::Result<Vec<Vec<Fault>>> {
        if self.racks == 0 || self.nodes_per_rack == 0 {
            bail!("racks and nodes per rack must be at least 1");
        }
        if self.node_count() > NODES_MAX {
            bail!(
                "{} nodes asked for; one simulated fleet serves at most {NODES_MAX}",
                self.node_count()
            );
        }
        if !(0.0..=1.0).contains(&self.fault_rate) {
            bail!("fault rate must be 0.0 to 1.0, got {}", self.fault_rate);
        }
        kiln_manifest::validate_hostname(&self.hostname(0))
            .map_err(|e| anyhow::anyhow!("hostname prefix {:?}: {e}", self.hostname_prefix))?;
        kiln_manifest::validate_rack(&self.rack(0))
            .map_err(|e| anyhow::anyhow!("rack prefix {:?}: {e}", self.rack_prefix))?;
        let hosts: Vec<String> = (0..self.node_count()).map(|i| self.hostname(i)).collect();
        for h in self.faults.keys() {
            if !hosts.contains(h) {
                bail!(
                    "fault for {h}, which is not in the fleet ({} to {})",
                    hosts.first().map(String::as_str).unwrap_or_default(),
                    hosts.last().map(String::as_str).unwrap_or_default()
                );
            }
        }
        let mut rng = StdRng::seed_from_u64(self.seed);
        let random = RANDOM_FAULTS;
        let mut out = Vec::with_capacity(hosts.len());
        for h in &hosts {
            // Drawn for every node, so a node's random fault does not depend on others' flags.
            let hit = rng.random_bool(self.fault_rate);
            let pick = random[rng.random_range(0..random.len())].clone();
            match self.faults.get(h) {
                Some(f) => out.push(f.clone()),
                None if hit => out.push(vec![pick]),
                None => out.push(Vec::new()),
            }
        }
        Ok(out)
    }
}

/// Reads a fleet file: JSON `{"racks": 3, "nodes_per_rack": 8, "gpu_model": "H100-SXM",
/// "faults": {"host-0007": ["ecc"]}, "fault_rate": 0.1, "seed": 42}` (every key optional),
/// applied over `spec`.
pub fn apply_fleet_file(spec: &mut FleetSpec, path: &std::path::Path) -> anyhow::Result<()> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        racks: Option<usize>,
        nodes_per_rack: Option<usize>,
        gpu_model: Option<String>,
        hostname_prefix: Option<String>,
        rack_prefix: Option<String>,
        #[serde(default)]
        faults: BTreeMap<String, Vec<String>>,
        fault_rate: Option<f64>,
        seed: Option<u64>,
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("fleet file {}", path.display()))?;
    let f: File =
        serde_json::from_str(&text).with_context(|| format!("fleet file {}", path.display()))?;
    if let Some(v) = f.racks {
        spec.racks = v;
    }
    if let Some(v) = f.nodes_per_rack {
        spec.nodes_per_rack = v;
    }
    if let Some(v) = f.gpu_model {
        spec.gpu_model = v
            .parse()
            .map_err(|e| anyhow::anyhow!("fleet file {}: {e}", path.display()))?;
    }
    if let Some(v) = f.hostname_prefix {
        spec.hostname_prefix = v;
    }
    if let Some(v) = f.rack_prefix {
        spec.rack_prefix = v;
    }
    if let Some(v) = f.fault_rate {
        spec.fault_rate = v;
    }
    if let Some(v) = f.seed {
        spec.seed = v;
    }
    for (host, kinds) in f.faults {
        for k in kinds {
            let fault: Fault = k
                .parse()
                .map_err(|e| anyhow::anyhow!("fleet file {}: {host}: {e}", path.display()))?;
            spec.faults
                .entry(host.to_ascii_lowercase())
                .or_default()
                .push(fault);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_or_explain() {
        assert_eq!(
            parse_fault_flag("Host-0007=ecc"),
            Ok(("host-0007".into(), Fault::Ecc))
        );
        assert_eq!("flaky:3".parse(), Ok(Fault::FlakyFirst(3)));
        assert_eq!("flaky:0.25".parse(), Ok(Fault::FlakyProbability(0.25)));
        for (bad, why) in [
            ("eccc", "unknown fault \"eccc\""),
            ("flaky", "needs an argument"),
            ("flaky:1.5", "0.0 to 1.0"),
            ("flaky:0", "run count"),
            ("ecc:2", "takes no argument"),
        ] {
            let e = bad.parse::<Fault>().expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert!(parse_fault_flag("ecc").is_err());
        for f in [
            "ecc",
            "row-remap",
            "flaky:2",
            "flaky:0.5",
            "unreachable",
            "dcgm-fail",
            "ib-flap",
            "eth-slow",
            "throttle",
            "xid79",
            "nvlink-down",
            "psu-fail",
            "smart-critical",
        ] {
            assert_eq!(f.parse::<Fault>().expect(f).to_string(), f);
        }
    }

    #[test]
    fn plan_is_seeded_and_checks_hosts() {
        let mut spec = FleetSpec::new(PathBuf::from("x"));
        spec.fault_rate = 0.5;
        let a = spec.plan().expect("plan");
        let b = spec.plan().expect("plan");
        assert_eq!(a, b, "same seed, same faults");
        let faulty = a.iter().filter(|f| !f.is_empty()).count();
        assert!((4..=20).contains(&faulty), "{faulty} of 24 at rate 0.5");
        assert_eq!(spec.hostname(6), "host-0007");
        assert_eq!(spec.rack(8), "rack-02");

        let spec = FleetSpec::new(PathBuf::from("x")).with_fault("host-0100", Fault::Ecc);
        let e = spec.plan().expect_err("unknown host");
        assert!(e.to_string().contains("host-0001 to host-0024"), "{e}");
        let spec = FleetSpec::new(PathBuf::from("x")).with_fault("host-0002", Fault::Hang);
        assert_eq!(spec.plan().expect("plan")[1], vec![Fault::Hang]);
        let mut spec = FleetSpec::new(PathBuf::from("x"));
        spec.racks = 0;
        assert!(spec.plan().is_err());
    }

    #[test]
    fn gpu_models_parse() {
        assert_eq!("h200-sxm".parse(), Ok(GpuModel::H200Sxm));
        assert_eq!("none".parse(), Ok(GpuModel::None));
        assert!("B200".parse::<GpuModel>().is_err());
    }
}
