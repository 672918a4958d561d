//! A dead letter (what the agent put on `kiln.nodes.dlq`) made into a triage record: the
//! cycle's failure window, the per-component analysis of its attempts (kiln-findings), the
//! failing checks of the last failed attempt with how many attempts each failed and could not
//! run, and the node's action.

use std::collections::HashMap;

use kiln_agent::DeadLetter;
use kiln_findings::analysis::fallback_finding;
use kiln_findings::{worst_action, Action};
use kiln_store::triage::{FailingCheck, TriageRecord};
use kiln_store::{CheckResult, CheckVerdict, NodeHistory, RunVerdict};

/// Builds the record. `history` is the node's history from the message, or from the store when
/// the message had none; without any, the record keeps what the message itself says.
pub fn triage_record(dl: &DeadLetter, history: Option<&NodeHistory>, now_ms: i64) -> TriageRecord {
    let msg = &dl.message;
    let failed_runs: Vec<_> = history
        .map(|h| {
            h.runs
                .iter()
                .filter(|r| r.cycle == msg.cycle && r.verdict == Some(RunVerdict::Fail))
                .collect()
        })
        .unwrap_or_default();
    let finished = |r: &&kiln_store::RunRecord| r.finished_at_ms.unwrap_or(r.started_at_ms);
    let first_failure = failed_runs.iter().map(finished).min();
    let last_failure = failed_runs.iter().map(finished).max();

    // check name -> (attempts failed, attempts errored)
    let mut counts: HashMap<&str, (u32, u32)> = HashMap::new();
    for r in &failed_runs {
        for c in &r.checks {
            let e = counts.entry(c.name.as_str()).or_default();
            match c.verdict {
                CheckVerdict::Fail => e.0 += 1,
                CheckVerdict::Error => e.1 += 1,
                _ => {}
            }
        }
    }
    let last_run = failed_runs.iter().max_by_key(|r| r.attempt);
    let failing_checks: Vec<FailingCheck> = last_run
        .map(|r| {
            r.checks
                .iter()
                .filter(|c| matches!(c.verdict, CheckVerdict::Fail | CheckVerdict::Error))
                .map(|c| {
                    let (failed, errored) = counts.get(c.name.as_str()).copied().unwrap_or((0, 0));
                    FailingCheck {
                        action: check_action(c).as_str().to_string(),
                        failed_attempts: failed,
                        error_attempts: errored,
                        verdict: c.verdict.as_str().to_string(),
                        name: c.name.clone(),
                        message: c.message.clone(),
                        measured: c.measured.clone(),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let analysis = history
        .filter(|_| !failed_runs.is_empty())
        .map(|h| h.analysis(msg.cycle));
    // No check results (e.g. the whole run timed out): the last error's words decide.
    let action = analysis
        .as_ref()
        .and_then(|a| a.action)
        .unwrap_or_else(|| fallback_finding("", &dl.last_error).action);
    TriageRecord {
        hostname: msg.node.hostname.clone(),
        cycle: msg.cycle,
        rack: msg.node.rack.clone(),
        bmc_address: msg.node.bmc_address.clone(),
        attempts: msg.attempt,
        first_failure_at_ms: first_failure.unwrap_or(dl.dead_lettered_at_ms),
        last_failure_at_ms: last_failure.unwrap_or(dl.dead_lettered_at_ms),
        dead_lettered_at_ms: dl.dead_lettered_at_ms,
        action: action.as_str().to_string(),
        last_error: dl.last_error.clone(),
        failing_checks,
        labels: msg.node.labels.clone(),
        recorded_at_ms: now_ms,
        first_reported_day: None,
        analysis,
        resolution: None,
    }
}

/// A check's own action: its findings' most severe, else what its name and words say.
fn check_action(c: &CheckResult) -> Action {
    worst_action(&c.findings).unwrap_or_else(|| fallback_finding(&c.name, &c.message).action)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_findings::{Component, ComponentKind, Finding};
    use kiln_manifest::NodeSpec;
    use kiln_queue::NodeMessage;
    use kiln_store::{NodeEvent, NodeRecord, NodeState, RunRecord};
    use serde_json::json;

    pub(crate) fn spec(host: &str, rack: &str) -> NodeSpec {
        NodeSpec {
            hostname: host.into(),
            rack: rack.into(),
            bmc_address: "10.1.0.7".into(),
            gpu_model: "H100-SXM".into(),
            gpu_count: 8,
            firmware_bmc: "1".into(),
            firmware_bios: "2".into(),
            firmware_gpu_vbios: "3".into(),
            firmware_nic: "4".into(),
            labels: Default::default(),
        }
    }

    fn run(cycle: u32, attempt: u32, at: i64, checks: Vec<CheckResult>) -> RunRecord {
        RunRecord {
            id: i64::from(attempt),
            cycle,
            attempt,
            agent: "a".into(),
            started_at_ms: at - 10,
            finished_at_ms: Some(at),
            verdict: Some(RunVerdict::Fail),
            checks,
        }
    }

    fn check(name: &str, verdict: CheckVerdict, msg: &str) -> CheckResult {
        CheckResult {
            name: name.into(),
            verdict,
            measured: json!({"value": 3}),
            message: msg.into(),
            evidence: String::new(),
            findings: Vec::new(),
        }
    }

    #[test]
    fn record_from_a_dead_letter() {
        let node = spec("gpu-a-01", "a");
        let mut runs = vec![run(
            1,
            1,
            50,
            vec![check("gpu_ecc", CheckVerdict::Fail, "x")],
        )];
        for attempt in 1..=10 {
            let mut checks = vec![check("warmup", CheckVerdict::Pass, "")];
            if attempt % 2 == 0 {
                checks.push(check("infiniband", CheckVerdict::Fail, "port down"));
            } else {
                checks.push(check("infiniband", CheckVerdict::Error, "timed out"));
            }
            let mut ecc = check("gpu_ecc", CheckVerdict::Fail, "GPU 3: 12 uncorrected");
            ecc.findings = vec![Finding::new(
                Component::new(ComponentKind::Gpu).index(3),
                "ecc_uncorrected_volatile",
                Action::ResetGpu,
                "GPU 3: 12 uncorrected",
            )];
            checks.push(ecc);
            runs.push(run(2, attempt, 1000 + i64::from(attempt), checks));
        }
        let history = NodeHistory {
            node: NodeRecord {
                spec: node.clone(),
                state: NodeState::DeadLettered,
                state_reason: "attempt 10 failed".into(),
                cycle: 2,
                attempt: 10,
                registered_at_ms: 0,
                updated_at_ms: 0,
            },
            events: Vec::<NodeEvent>::new(),
            runs,
        };
        let mut msg = NodeMessage::first(node, 2, 0);
        msg.attempt = 10;
        let dl = DeadLetter {
            v: 1,
            message: msg,
            last_error: "gpu_ecc: GPU 3: 12 uncorrected".into(),
            history: None,
            agent: "a".into(),
            dead_lettered_at_ms: 2000,
        };
        let r = triage_record(&dl, Some(&history), 3000);
        assert_eq!(
            (r.hostname.as_str(), r.cycle, r.attempts),
            ("gpu-a-01", 2, 10)
        );
        assert_eq!(r.bmc_address, "10.1.0.7");
        // Cycle 1's failure is not part of this cycle's window.
        assert_eq!((r.first_failure_at_ms, r.last_failure_at_ms), (1001, 1010));
        let names: Vec<_> = r.failing_checks.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["infiniband", "gpu_ecc"]);
        // Failed and could-not-run attempts are counted apart.
        assert_eq!(
            (
                r.failing_checks[0].failed_attempts,
                r.failing_checks[0].error_attempts
            ),
            (5, 5)
        );
        assert_eq!(r.failing_checks[1].failed_attempts, 10);
        assert_eq!(r.failing_checks[1].measured, json!({"value": 3}));
        assert_eq!(r.failing_checks[0].action, "reseat_cable");
        assert_eq!(r.failing_checks[1].action, "reset_gpu");
        assert_eq!(r.action, "reseat_cable");
        let a = r.analysis.as_ref().expect("analysis");
        assert_eq!(a.attempts.len(), 10, "cycle 2 only");
        let gpu = a
            .components
            .iter()
            .find(|c| c.component.kind == ComponentKind::Gpu)
            .expect("GPU 3");
        assert_eq!(gpu.findings[0].attempts.len(), 10);

        // Without any history the message still makes a record.
        let bare = triage_record(&dl, None, 3000);
        assert!(bare.failing_checks.is_empty());
        assert_eq!(bare.first_failure_at_ms, 2000);
        assert_eq!(bare.action, "investigate", "from the last error's words");
        assert!(bare.analysis.is_none());
    }
}
