//! Hardware checks and playbooks for Kiln's burn-in.
//!
//! - `finding`: kiln-findings (what a failing check found: component, code, action; the NVIDIA
//!   Xid and DCGM failure-code tables that name the actions), re-exported for the checks.
//! - `check`: the interface every check implements (`Check`, `CheckContext`, `CheckResult`,
//!   `Verdict`) and `run_check`, which enforces deadlines.
//! - `playbook`: YAML playbooks (which checks, in what order, with which thresholds) and
//!   their loader, which names the line and field of every problem.
//! - `probe`, `xid`, `nvml`: the `kiln probe` document (NVML readings + kernel-log Xids).
//! - `gpu`, `nic`, `stress` (with `dcgm`), `disk`, `redfish`: the checks.
//! - `shell`, `ssh`: how checks run commands on a node (`NodeShell`; SSH for agents);
//!   `scripted`: a check for tests.
//!
//! See docs/checks.md.

pub mod check;
pub mod dcgm;
pub mod disk;
pub mod gpu;
pub mod nic;
#[cfg(feature = "nvml")]
pub mod nvml;
pub mod playbook;
pub mod probe;
pub mod redfish;
pub mod scripted;
pub mod shell;
pub mod ssh;
pub mod stress;
pub mod xid;
mod yaml;

/// The finding model and NVIDIA tables live in kiln-findings; checks name them `finding::`.
pub use kiln_findings as finding;

pub use check::{
    run_check, Check, CheckContext, CheckFuture, CheckResult, FirmwareBaseline, NodeTarget, Verdict,
};
pub use finding::{Action, Component, ComponentKind, Finding};
pub use playbook::{Playbook, PlaybookError, PlaybookRun};
pub use probe::{run_probe, GpuSource, ProbeReport, RecordedGpus};
pub use scripted::{Outcome, ScriptedCheck};
pub use shell::{CommandOutput, LocalShell, NodeShell, RecordedShell, ShellError};
pub use yaml::LoadError;
