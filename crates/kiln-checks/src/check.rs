//! The check interface: what a check is given (`CheckContext`), what it returns
//! (`CheckResult`), and `run_check`, which runs one under its deadline so that a hang,
//! a panic or an unreachable node becomes `Verdict::Error`, never a stuck agent.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::finding::Finding;
use crate::gpu::telemetry::Window;
use crate::probe::ProbeReport;
use crate::redfish::RedfishClient;
use crate::shell::NodeShell;

/// What a burn-in run is checking: one node, as the manifest described it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTarget {
    pub hostname: String,
    pub rack: String,
    /// Host or IP (optionally `host:port`) of the node's BMC.
    pub bmc_address: String,
    /// The manifest's model label (e.g. `H100-SXM`); empty for a node without GPUs.
    pub gpu_model: String,
    pub gpu_count: u32,
    pub firmware: FirmwareBaseline,
    /// When intake registered the node: BMC log entries older than this are history.
    #[serde(with = "time::serde::rfc3339")]
    pub registered_at: OffsetDateTime,
    /// The manifest's free-form labels (e.g. `mac.enp97s0f0`: the NIC's expected MAC).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// The firmware versions the manifest says the node must run. `None` (or empty) means the
/// manifest gave no baseline for that component; a check that needs it reports `Error`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirmwareBaseline {
    pub bmc: Option<String>,
    pub bios: Option<String>,
    pub gpu_vbios: Option<String>,
    pub nic: Option<String>,
}

impl FirmwareBaseline {
    /// The baseline for a component by its playbook name (`bmc`, `bios`, `gpu_vbios`, `nic`).
    pub fn get(&self, component: &str) -> Option<&str> {
        let v = match component {
            "bmc" => &self.bmc,
            "bios" => &self.bios,
            "gpu_vbios" => &self.gpu_vbios,
            "nic" => &self.nic,
            _ => return None,
        };
        v.as_deref().map(str::trim).filter(|s| !s.is_empty())
    }
}

/// Everything a check may use. Built by the agent once per run; shared by all its checks.
pub struct CheckContext {
    pub node: NodeTarget,
    /// No check of this run may go past this instant (`run_check` enforces it).
    pub deadline: Instant,
    /// Commands on the node (SSH in production, a local shell or a recording in tests).
    /// `None`: checks that need the node's shell report `Error`.
    pub shell: Option<Arc<dyn NodeShell>>,
    /// The node's BMC. `None`: Redfish checks report `Error`.
    pub bmc: Option<Arc<RedfishClient>>,
    /// The NVML probe, fetched by the first GPU check that needs it and shared until a
    /// stress step changes the GPUs' state (`invalidate_probe`).
    probe: Mutex<Option<Result<Arc<ProbeReport>, String>>>,
    /// Readings one step leaves for a later one (InfiniBand counters before stress, telemetry
    /// sampled during it), by key; at most `MEMO_ENTRIES_MAX`.
    memo: Mutex<BTreeMap<String, Value>>,
    /// What `gpu_telemetry` steps sampled while their stress steps ran, by telemetry step.
    telemetry: Mutex<BTreeMap<String, Vec<Window>>>,
}

/// Most readings one run keeps for its later steps (a playbook has at most 200 steps).
pub const MEMO_ENTRIES_MAX: usize = 256;

impl CheckContext {
    pub fn new(node: NodeTarget, deadline: Instant) -> CheckContext {
        CheckContext {
            node,
            deadline,
            shell: None,
            bmc: None,
            probe: Mutex::new(None),
            memo: Mutex::new(BTreeMap::new()),
            telemetry: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn with_shell(mut self, shell: Arc<dyn NodeShell>) -> CheckContext {
        self.shell = Some(shell);
        self
    }

    pub fn with_bmc(mut self, bmc: Arc<RedfishClient>) -> CheckContext {
        self.bmc = Some(bmc);
        self
    }

    /// Supplies the probe up front (the agent already has it, or a test).
    pub fn with_probe(self, report: ProbeReport) -> CheckContext {
        let probe = Mutex::new(Some(Ok(Arc::new(report))));
        CheckContext { probe, ..self }
    }

    /// The node's shell, or the error message a check reports without one.
    pub fn shell(&self) -> Result<&Arc<dyn NodeShell>, String> {
        self.shell
            .as_ref()
            .ok_or_else(|| format!("no shell to node {} in this run", self.node.hostname))
    }

    /// The probe report, fetched with `fetch` the first time and shared afterwards.
    /// A failed fetch is remembered too: the GPU checks that follow report the same error
    /// instead of each waiting out the probe's timeout again.
    pub async fn probe_with<F, Fut>(&self, fetch: F) -> Result<Arc<ProbeReport>, String>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<ProbeReport, String>>,
    {
        let mut slot = self.probe.lock().await;
        if let Some(r) = slot.as_ref() {
            return r.clone();
        }
        let r = fetch().await.map(Arc::new);
        *slot = Some(r.clone());
        r
    }

    /// Forgets the probe report: the next GPU check probes again. Stress steps call this,
    /// so checks after them see the GPUs as the stress left them (new Xids, ECC errors).
    pub async fn invalidate_probe(&self) {
        *self.probe.lock().await = None;
    }

    /// Keeps `value` under `key` for a later step of this run (replacing an earlier one).
    /// Returns false, keeping nothing, when the run already holds `MEMO_ENTRIES_MAX` keys.
    pub async fn remember(&self, key: &str, value: Value) -> bool {
        let mut memo = self.memo.lock().await;
        if memo.len() >= MEMO_ENTRIES_MAX && !memo.contains_key(key) {
            return false;
        }
        memo.insert(key.to_string(), value);
        true
    }

    /// What an earlier step of this run kept under `key`.
    pub async fn recall(&self, key: &str) -> Option<Value> {
        self.memo.lock().await.get(key).cloned()
    }

    /// Keeps a sampling window for telemetry step `step` (one per stress step it names, so at
    /// most a playbook's step count: the loader checks `during` names earlier steps).
    pub async fn add_telemetry_window(&self, step: &str, window: Window) {
        self.telemetry
            .lock()
            .await
            .entry(step.to_string())
            .or_default()
            .push(window);
    }

    /// The windows sampled for telemetry step `step`.
    pub async fn telemetry_windows(&self, step: &str) -> Vec<Window> {
        self.telemetry
            .lock()
            .await
            .get(step)
            .cloned()
            .unwrap_or_default()
    }

    /// Time left before the deadline (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Measured and within every threshold.
    Pass,
    /// Measured, and something is outside a threshold: the hardware is at fault.
    Fail,
    /// Could not measure (unreachable, timeout, tool missing, unreadable output):
    /// nothing is known about the hardware. Retry, do not blame the node yet.
    Error,
}

impl Verdict {
    /// The verdict of a whole run: any `Fail` fails it; otherwise any `Error` makes it
    /// `Error`; only all-`Pass` passes.
    pub fn combine(verdicts: impl IntoIterator<Item = Verdict>) -> Verdict {
        let mut out = Verdict::Pass;
        for v in verdicts {
            match v {
                Verdict::Fail => return Verdict::Fail,
                Verdict::Error => out = Verdict::Error,
                Verdict::Pass => {}
            }
        }
        out
    }
}

/// What a check found. `measured` holds the values the verdict was computed from;
/// `evidence` the raw readings (command output, Redfish documents) an engineer needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    pub name: String,
    pub verdict: Verdict,
    pub measured: Value,
    /// One line for a person: on `Fail` it names the component and the value that failed.
    pub message: String,
    pub evidence: Value,
    /// On `Fail`: every fault found, each on its component with the action to take.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
    #[serde(rename = "duration_ms", with = "duration_ms")]
    pub duration: Duration,
}

impl CheckResult {
    pub fn new(name: &str, verdict: Verdict, message: impl Into<String>) -> CheckResult {
        CheckResult {
            name: name.to_string(),
            verdict,
            measured: Value::Null,
            message: message.into(),
            evidence: Value::Null,
            findings: Vec::new(),
            duration: Duration::ZERO,
        }
    }
    pub fn pass(name: &str, message: impl Into<String>) -> CheckResult {
        CheckResult::new(name, Verdict::Pass, message)
    }
    pub fn fail(name: &str, message: impl Into<String>) -> CheckResult {
        CheckResult::new(name, Verdict::Fail, message)
    }
    pub fn error(name: &str, message: impl Into<String>) -> CheckResult {
        CheckResult::new(name, Verdict::Error, message)
    }
    pub fn measured(mut self, measured: Value) -> CheckResult {
        self.measured = measured;
        self
    }
    pub fn evidence(mut self, evidence: Value) -> CheckResult {
        self.evidence = evidence;
        self
    }

    /// Pass when `findings` is empty, else Fail with the findings' messages joined into the
    /// message (the first few; `measured.problems` keeps every message, `findings` the rest).
    pub fn from_findings(
        name: &str,
        findings: Vec<Finding>,
        pass_message: impl Into<String>,
        mut measured: Value,
    ) -> CheckResult {
        if findings.is_empty() {
            return CheckResult::pass(name, pass_message).measured(measured);
        }
        const SHOWN_MAX: usize = 6;
        let problems: Vec<String> = findings.iter().map(|f| f.message.clone()).collect();
        let mut message = problems
            .iter()
            .take(SHOWN_MAX)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ");
        if problems.len() > SHOWN_MAX {
            message.push_str(&format!("; and {} more", problems.len() - SHOWN_MAX));
        }
        if let Value::Object(map) = &mut measured {
            map.insert("problems".into(), Value::from(problems));
        }
        let mut r = CheckResult::fail(name, message).measured(measured);
        r.findings = findings;
        r
    }
}

mod duration_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

/// The future a check returns. Boxed so checks can live in a `Vec<Box<dyn Check>>`.
pub type CheckFuture<'a> = Pin<Box<dyn Future<Output = CheckResult> + Send + 'a>>;

/// A hardware check. Implementations measure, compare with their thresholds and say why.
///
/// A check need not time itself or watch the deadline: `run_check` does both, and drops the
/// check's future when time is up (so the check's own resources must clean up on drop:
/// local child processes are killed, SSH channels closed, HTTP requests cancelled).
pub trait Check: Send + Sync {
    /// The result name, unique within a playbook (e.g. `gpu_ecc`).
    fn name(&self) -> &str;
    fn run<'a>(&'a self, ctx: &'a CheckContext) -> CheckFuture<'a>;
}

/// Runs `check` until it finishes, `timeout` passes, or the context's deadline passes,
/// whichever is first. Timeouts and panics become `Verdict::Error` with a message saying
/// which; the result always carries the check's name and the time it took.
pub async fn run_check(
    check: &dyn Check,
    ctx: &CheckContext,
    timeout: Option<Duration>,
) -> CheckResult {
    let name = check.name().to_string();
    let started = Instant::now();
    let step_deadline = timeout.map(|t| started + t);
    let (until, why) = match step_deadline {
        Some(d) if d < ctx.deadline => (d, "its timeout"),
        _ => (ctx.deadline, "the run's deadline"),
    };
    if until <= started {
        let mut r = CheckResult::error(
            &name,
            format!("{name}: not started: {why} had already passed"),
        );
        r.measured = serde_json::json!({ "timed_out": true });
        return r;
    }
    let fut = AssertUnwindSafe(check.run(ctx)).catch_unwind();
    let mut result = match tokio::time::timeout_at(until, fut).await {
        Ok(Ok(mut r)) => {
            if r.name != name {
                r.name = name.clone();
            }
            r
        }
        Ok(Err(panic)) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            CheckResult::error(&name, format!("{name}: the check panicked: {what}"))
        }
        Err(_) => {
            let limit = until.saturating_duration_since(started);
            CheckResult::error(
                &name,
                format!(
                    "{name}: did not finish within {:.1} s ({why}); stopped",
                    limit.as_secs_f64()
                ),
            )
            .measured(
                serde_json::json!({ "timed_out": true, "limit_ms": limit.as_millis() as u64 }),
            )
        }
    };
    result.duration = started.elapsed();
    result
}

/// Helper for implementations: boxes an async block as a `CheckFuture`.
pub fn boxed<'a, F>(f: F) -> CheckFuture<'a>
where
    F: Future<Output = CheckResult> + Send + 'a,
{
    Box::pin(f)
}
