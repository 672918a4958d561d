//! What Kiln's checks find, and what a hardware engineer does about it.
//!
//! - `finding`: a finding is one fault on one component (kind, index, serial, UUID, PCI
//!   address, slot) with a machine-readable code, an action, its evidence lines and counters.
//! - `tables`: NVIDIA's Xid catalog and DCGM's failure codes, versioned, with Kiln's action
//!   for each entry; the checks take Xid and DCGM actions from them.
//! - `analysis`: a node's attempts of one cycle made into a per-component view (action and
//!   headline per component, evidence, each attempt's result, counters across attempts),
//!   with suspects no single finding names (different GPUs failing in different attempts) and
//!   the unreachable case folded into one finding. The dead-letter report, the dashboard and
//!   the `kiln dlq` commands all read this one view.
//!
//! No I/O here: the checks (kiln-checks) build findings, the store keeps them, and the triage
//! service and dashboard analyze them.

pub mod analysis;
pub mod finding;
pub mod tables;

pub use analysis::{
    analyze, Analysis, AttemptInput, AttemptSummary, CheckInput, ComponentAttempt, ComponentReport,
    ComponentResult, CounterTrend, FindingReport, NodeInput, Outcome, Suspect,
};
pub use finding::{
    worst_action, Action, Component, ComponentKind, Finding, FINDING_COUNTERS_MAX,
    FINDING_EVIDENCE_LINES_MAX, FINDING_EVIDENCE_LINE_CHARS_MAX,
};
pub use tables::{
    dcgm_category_name, dcgm_code, dcgm_severity_name, dcgm_table_version, xid_class,
    xid_table_version, DcgmCode, XidClass,
};
