//! Burn-in agents (`kiln agent`): members of consumer group `burnin` on `kiln.nodes`. For
//! each node: run the playbook, write the run and its results to the store in one
//! transaction, re-enqueue (attempt + 1, back-off) or dead-letter a failure, and only then
//! commit the partition's contiguous watermark. See docs/platform.md, "Agents".
//!
//! - `watermark`: the pure per-partition tracker of in-flight offsets.
//! - `config`: the agent's TOML settings.
//! - `agent`: the consumer loop and the work on one node.

pub mod agent;
pub mod config;
pub mod watermark;

pub use agent::{run_agent, DeadLetter, DLQ_SCHEMA_VERSION};
pub use config::AgentConfig;
pub use watermark::Watermark;
