//! A simulated GPU fleet on loopback, for end-to-end tests, benchmarks and demos of the
//! burn-in platform with its real checks.
//!
//! Every node gets an SSH server (russh; it answers the commands the real checks send from
//! recorded node data) and an HTTPS Redfish endpoint (the DMTF rackmount mockup, rewritten
//! per node), each on its own `127.0.0.1` port, and any of a set of injected faults (ECC
//! errors, a row-remap failure, a stuck InfiniBand port, firmware drift, a Critical SEL
//! entry, a hanging stress command, an unreachable node, intermittent failures).
//!
//! ```ignore
//! let fleet = kiln_sim::Fleet::start(FleetSpec::new(dir).with_fault("host-0003", Fault::Ecc)).await?;
//! intake.register(&Manifest { nodes: fleet.manifest() }, &NoProgress).await?;
//! let config = fleet.agent_config(AgentConfig { bootstrap, database_url, ..Default::default() });
//! kiln_agent::run_agent(config, shutdown).await?;
//! fleet.stop().await;
//! ```
//!
//! - `spec`: the fleet to simulate and the faults (`FleetSpec`, `Fault`, `GpuModel`).
//! - `fleet`: starting and stopping it, and the files the rest of Kiln needs.
//! - `node`, `commands`: what a node answers; `sshd`, `bmc`, `tls`: its servers.
//! - `fixtures`: the recordings (the repository's fixtures/); `stats`: fleet-wide counters.

mod bmc;
pub mod commands;
mod fixtures;
mod fleet;
pub mod node;
pub mod spec;
mod sshd;
mod stats;
mod tls;

pub use fixtures::locate as locate_fixtures;
pub use fleet::{Fleet, USER};
pub use spec::{apply_fleet_file, parse_fault_flag, Fault, FleetSpec, GpuModel, NODES_MAX};
pub use stats::StatsSnapshot;
