//! Burn-in agents (`kiln agent`): members of consumer group `burnin` on `kiln.nodes`. For
//! each node: run the playbook, write the run and its results to the store in one
//! transaction, re-enqueue (attempt + 1, back-off) or dead-letter a failure, and only then
//! commit the partition's contiguous watermark. See docs/platform.md, "Agents".
//!
//! - `watermark`: the pure per-partition tracker of in-flight offsets.
//! - `config`: the agent's TOML settings.
//! - `access`: SSH and Redfish settings, and each run's shell and BMC client.
//! - `playbooks`: the playbook a node runs, chosen by its `gpu_model`.
//! - `agent`: the consumer loop and the work on one node.
//! - `decide`: what a failed attempt leads to besides a retry (dead-letter at once, a
//!   remediation command first).
//! - `metrics`: the agent's `GET /metrics` (outcomes, check durations and failures, offsets).

pub mod access;
pub mod agent;
pub mod config;
pub mod decide;
pub mod metrics;
pub mod playbooks;
pub mod watermark;

pub use access::{RedfishAuthKind, RedfishSettings, SshSettings};
pub use agent::{run_agent, DeadLetter, DLQ_SCHEMA_VERSION};
pub use config::AgentConfig;
pub use decide::{FailFastSettings, RemediationSettings};
pub use watermark::Watermark;
