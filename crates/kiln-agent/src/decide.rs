//! What a failed attempt leads to besides a retry: dead-lettering at once (a fault no retry
//! fixes) and a remediation command to run before the next attempt. Pure functions of the
//! attempt's check results and the cycle's earlier ones, so they are tested without a fleet.
//!
//! - An RMA candidate (a finding whose action is `rma`: a row-remap failure, faulty memory in
//!   DCGM's words, a failed PSU) is hardware to replace; ten attempts with back-off up to half
//!   an hour only delay the ticket by a day.
//! - The same fault (finding code) on the same component in two attempts is deterministic:
//!   it will be there in the third.
//! - A `reset_gpu` or `reboot` finding may clear with that action (a pending row remap is
//!   applied at the next GPU reset); a site can have the agent run it before the next attempt.

use std::collections::BTreeSet;

use kiln_checks::{Action, Finding};
use kiln_store::{CheckResult, CheckVerdict, RunRecord};
use serde::{Deserialize, Serialize};

/// `[fail_fast]`: when a failed attempt dead-letters its node at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FailFastSettings {
    /// A finding whose action is `rma`.
    pub rma: bool,
    /// The same finding code on the same component as in an earlier attempt of the cycle.
    pub repeated: bool,
}

impl Default for FailFastSettings {
    fn default() -> Self {
        FailFastSettings {
            rma: true,
            repeated: true,
        }
    }
}

/// `[remediation]`: commands run on the node over SSH after a failed attempt, before the next
/// one, for the findings whose action they fix. Empty (the default) runs nothing. `{gpus}` is
/// replaced by the indices of the GPUs concerned, comma-separated (`nvidia-smi -r -i {gpus}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemediationSettings {
    pub reset_gpu: String,
    pub reboot: String,
    /// Bound on one remediation command, ms.
    pub timeout_ms: u64,
}

impl Default for RemediationSettings {
    fn default() -> Self {
        RemediationSettings {
            reset_gpu: String::new(),
            reboot: String::new(),
            timeout_ms: 300_000,
        }
    }
}

/// (check name, component key, code) of every finding of the failed checks of `checks`.
fn faults(checks: &[CheckResult]) -> BTreeSet<(String, String, String)> {
    checks
        .iter()
        .filter(|c| c.verdict == CheckVerdict::Fail)
        .flat_map(|c| {
            c.findings
                .iter()
                .map(move |f| (c.name.clone(), f.component.key(), f.code.clone()))
        })
        .collect()
}

/// Why this failed attempt dead-letters its node now, if it does. `earlier`: the cycle's
/// earlier failed runs (from the store).
pub fn dead_letter_now(
    settings: &FailFastSettings,
    checks: &[CheckResult],
    earlier: &[RunRecord],
) -> Option<String> {
    if settings.rma {
        for c in checks.iter().filter(|c| c.verdict == CheckVerdict::Fail) {
            if let Some(f) = c.findings.iter().find(|f| f.action == Action::Rma) {
                return Some(format!(
                    "RMA candidate: {} in {} ({})",
                    f.component, c.name, f.code
                ));
            }
        }
    }
    if settings.repeated {
        let now = faults(checks);
        for run in earlier {
            let before = faults(&run.checks);
            if let Some((check, component, code)) = now.intersection(&before).next() {
                return Some(format!(
                    "the same fault twice: {code} on {component} in {check}, attempts {} and this one",
                    run.attempt
                ));
            }
        }
    }
    None
}

/// A remediation to run before the next attempt: the command with `{gpus}` filled in, and
/// which action it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remediation {
    pub action: Action,
    pub command: String,
}

/// The remediation the failed checks call for, if the settings name one: a reboot wins over a
/// GPU reset (it resets every GPU too).
pub fn remediation(settings: &RemediationSettings, checks: &[CheckResult]) -> Option<Remediation> {
    let found: Vec<&Finding> = checks
        .iter()
        .filter(|c| c.verdict == CheckVerdict::Fail)
        .flat_map(|c| c.findings.iter())
        .collect();
    for (action, template) in [
        (Action::Reboot, &settings.reboot),
        (Action::ResetGpu, &settings.reset_gpu),
    ] {
        if template.trim().is_empty() {
            continue;
        }
        let gpus: BTreeSet<u32> = found
            .iter()
            .filter(|f| f.action == action)
            .filter_map(|f| f.component.index)
            .collect();
        if found.iter().any(|f| f.action == action) {
            let list = gpus
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",");
            return Some(Remediation {
                action,
                command: template.replace("{gpus}", &list),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_checks::{Component, ComponentKind};

    fn check(name: &str, findings: &[Finding]) -> CheckResult {
        CheckResult {
            name: name.into(),
            verdict: CheckVerdict::Fail,
            measured: serde_json::Value::Null,
            message: String::new(),
            evidence: String::new(),
            findings: findings.to_vec(),
        }
    }

    fn gpu(i: u32, code: &str, action: Action) -> Finding {
        Finding::new(
            Component::new(ComponentKind::Gpu)
                .index(i)
                .serial(Some(format!("S{i}"))),
            code,
            action,
            "m",
        )
    }

    fn run(attempt: u32, checks: Vec<CheckResult>) -> RunRecord {
        RunRecord {
            id: i64::from(attempt),
            cycle: 1,
            attempt,
            agent: "a".into(),
            started_at_ms: 0,
            finished_at_ms: Some(1),
            verdict: Some(kiln_store::RunVerdict::Fail),
            checks,
        }
    }

    #[test]
    fn an_rma_candidate_or_a_repeated_fault_dead_letters_at_once() {
        let s = FailFastSettings::default();
        let remap = check("gpu_row_remap", &[gpu(5, "row_remap_failure", Action::Rma)]);
        let why = dead_letter_now(&s, std::slice::from_ref(&remap), &[]).expect("rma");
        assert!(why.starts_with("RMA candidate: GPU 5 (serial S5)"), "{why}");
        let off = FailFastSettings {
            rma: false,
            repeated: false,
        };
        assert_eq!(dead_letter_now(&off, &[remap], &[]), None);

        let ecc = check(
            "gpu_ecc",
            &[gpu(3, "ecc_uncorrected_volatile", Action::ResetGpu)],
        );
        assert_eq!(
            dead_letter_now(&s, std::slice::from_ref(&ecc), &[]),
            None,
            "first time: retry"
        );
        let why = dead_letter_now(&s, std::slice::from_ref(&ecc), &[run(1, vec![ecc.clone()])])
            .expect("repeated");
        assert!(why.contains("ecc_uncorrected_volatile on gpu:S3"), "{why}");
        // Another GPU, or another fault, is not the same fault.
        let other = check(
            "gpu_ecc",
            &[gpu(4, "ecc_uncorrected_volatile", Action::ResetGpu)],
        );
        assert_eq!(dead_letter_now(&s, &[other], &[run(1, vec![ecc])]), None);
    }

    #[test]
    fn remediation_runs_only_when_configured() {
        let checks = [check(
            "gpu_row_remap",
            &[
                gpu(2, "row_remap_pending", Action::ResetGpu),
                gpu(6, "row_remap_pending", Action::ResetGpu),
            ],
        )];
        assert_eq!(remediation(&RemediationSettings::default(), &checks), None);
        let s = RemediationSettings {
            reset_gpu: "nvidia-smi -r -i {gpus}".into(),
            ..RemediationSettings::default()
        };
        assert_eq!(
            remediation(&s, &checks),
            Some(Remediation {
                action: Action::ResetGpu,
                command: "nvidia-smi -r -i 2,6".into()
            })
        );
    }
}
