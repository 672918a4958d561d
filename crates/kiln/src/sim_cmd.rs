//! `kiln sim`: serve a simulated GPU fleet on loopback (crates/kiln-sim) until Ctrl-C, and
//! write its manifest and agent settings to `--out`.

use std::path::PathBuf;

use clap::Args;
use kiln_sim::{apply_fleet_file, parse_fault_flag, Fleet, FleetSpec, GpuModel};

#[derive(Args)]
pub struct SimArgs {
    /// Racks in the fleet.
    #[arg(long, default_value_t = 3)]
    pub racks: usize,
    /// Nodes per rack.
    #[arg(long, default_value_t = 8)]
    pub nodes_per_rack: usize,
    /// GPU model of every node: H100-SXM, H200-SXM or none (CPU nodes).
    #[arg(long, default_value = "H100-SXM", value_parser = parse_model)]
    pub gpu_model: GpuModel,
    /// Inject a fault: HOST=KIND, KIND one of ecc, row-remap, stuck-ib, firmware-drift,
    /// sel-critical, dcgm-fail, ib-flap, eth-slow, throttle, xid79, nvlink-down, psu-fail,
    /// smart-critical, hang, unreachable, flaky:N (first N runs fail), flaky:P (probability P,
    /// e.g. 0.3). Repeatable.
    #[arg(long = "fault", value_name = "HOST=KIND")]
    pub faults: Vec<String>,
    /// Share of the other nodes given one random fault (0.0 to 1.0).
    #[arg(long, default_value_t = 0.0)]
    pub fault_rate: f64,
    /// Seed for random faults and flaky:P.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// A JSON fleet file (racks, nodes_per_rack, gpu_model, faults, fault_rate, seed); flags
    /// given on the command line for faults add to it.
    #[arg(long)]
    pub fleet: Option<PathBuf>,
    /// Hostnames are PREFIX-0001, PREFIX-0002, ...
    #[arg(long, default_value = "host")]
    pub hostname_prefix: String,
    /// Directory for the manifest, keys and agent settings.
    #[arg(long, default_value = "kiln-sim")]
    pub out: PathBuf,
    /// The shared fixtures directory (default: KILN_FIXTURES or the repository's fixtures/).
    #[arg(long)]
    pub fixtures: Option<PathBuf>,
}

fn parse_model(s: &str) -> Result<GpuModel, String> {
    s.parse()
}

pub async fn run(args: SimArgs) -> anyhow::Result<()> {
    let mut spec = FleetSpec::new(args.out.clone());
    spec.racks = args.racks;
    spec.nodes_per_rack = args.nodes_per_rack;
    spec.gpu_model = args.gpu_model;
    spec.fault_rate = args.fault_rate;
    spec.seed = args.seed;
    spec.hostname_prefix = args.hostname_prefix;
    spec.fixtures = args.fixtures;
    if let Some(f) = &args.fleet {
        apply_fleet_file(&mut spec, f)?;
    }
    for flag in &args.faults {
        let (host, fault) = parse_fault_flag(flag).map_err(anyhow::Error::msg)?;
        spec = spec.with_fault(&host, fault);
    }
    let fleet = Fleet::start(spec).await?;
    let dir = fleet.out_dir().display().to_string();
    println!("simulated fleet: {} nodes", fleet.manifest().len());
    for (host, faults) in fleet.faults() {
        if !faults.is_empty() {
            let kinds: Vec<String> = faults.iter().map(|f| f.to_string()).collect();
            println!("  {host}: {}", kinds.join(", "));
        }
    }
    println!("manifest:        {}", fleet.manifest_path().display());
    println!("agent settings:  {}", fleet.agent_config_path().display());
    println!("nodes and ports: {dir}/fleet.json");
    println!(
        "next: kiln intake register {} ; kiln agent --config {}",
        fleet.manifest_path().display(),
        fleet.agent_config_path().display()
    );
    println!("serving until Ctrl-C");
    tokio::signal::ctrl_c().await?;
    let s = fleet.stats();
    fleet.stop().await;
    println!(
        "stopped: {} SSH connections ({} at most at once), {} commands, {} Redfish requests",
        s.ssh_connections_total, s.ssh_connections_peak, s.commands, s.redfish_requests
    );
    Ok(())
}
