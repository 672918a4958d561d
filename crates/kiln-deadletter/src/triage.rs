//! A dead letter (what the agent put on `kiln.nodes.dlq`) made into a triage record: the
//! cycle's failure window, the failing checks of the last failed attempt with their measured
//! values and how many attempts each failed, and the suggested action class.

use std::collections::HashMap;

use kiln_agent::DeadLetter;
use kiln_store::triage::{FailingCheck, TriageRecord};
use kiln_store::{CheckVerdict, NodeHistory, RunVerdict};

use crate::classify::{classify_check, classify_node};

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

    let failing = |r: &kiln_store::RunRecord| -> Vec<kiln_store::CheckResult> {
        r.checks
            .iter()
            .filter(|c| matches!(c.verdict, CheckVerdict::Fail | CheckVerdict::Error))
            .cloned()
            .collect()
    };
    let mut failed_in: HashMap<&str, u32> = HashMap::new();
    for r in &failed_runs {
        for c in r
            .checks
            .iter()
            .filter(|c| matches!(c.verdict, CheckVerdict::Fail | CheckVerdict::Error))
        {
            *failed_in.entry(c.name.as_str()).or_default() += 1;
        }
    }
    let last_run = failed_runs.iter().max_by_key(|r| r.attempt);
    let failing_checks: Vec<FailingCheck> = last_run
        .map(|r| failing(r))
        .unwrap_or_default()
        .into_iter()
        .map(|c| FailingCheck {
            action: classify_check(&c.name, &c.message, &c.measured)
                .as_str()
                .to_string(),
            failed_attempts: failed_in.get(c.name.as_str()).copied().unwrap_or(1),
            verdict: c.verdict.as_str().to_string(),
            name: c.name,
            message: c.message,
            measured: c.measured,
        })
        .collect();
    let action = if failing_checks.is_empty() {
        // No check results (e.g. the whole run timed out): the last error's words decide.
        classify_check("", &dl.last_error, &serde_json::Value::Null)
    } else {
        node_action(&failing_checks)
    };
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
        recorded_at_ms: now_ms,
        first_reported_day: None,
    }
}

/// The node's class. Checks that measured something wrong (`fail`) decide; checks that could
/// not run (`error`: unreachable, timed out) only decide when nothing was measured at all. A
/// node on which nothing could be measured while its BMC did not answer either is a BMC (or
/// its network) problem first: every GPU or NIC check erroring then says nothing of the GPUs.
fn node_action(checks: &[FailingCheck]) -> crate::classify::ActionClass {
    use crate::classify::ActionClass;
    let classes = |verdict: Option<&str>| {
        classify_node(
            checks
                .iter()
                .filter(|c| verdict.is_none_or(|v| c.verdict == v))
                .map(|c| ActionClass::parse(&c.action)),
        )
    };
    if checks
        .iter()
        .any(|c| c.verdict == CheckVerdict::Fail.as_str())
    {
        return classes(Some(CheckVerdict::Fail.as_str()));
    }
    let bmc_silent = checks
        .iter()
        .any(|c| c.name.starts_with("bmc") || c.name.starts_with("redfish"));
    if bmc_silent {
        ActionClass::Bmc
    } else {
        classes(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_manifest::NodeSpec;
    use kiln_queue::NodeMessage;
    use kiln_store::{CheckResult, NodeEvent, NodeRecord, NodeState, RunRecord};
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
            }
            checks.push(check(
                "gpu_ecc",
                CheckVerdict::Fail,
                "GPU 3: 12 uncorrected",
            ));
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
        assert_eq!(r.failing_checks[0].failed_attempts, 5);
        assert_eq!(r.failing_checks[1].failed_attempts, 10);
        assert_eq!(r.failing_checks[1].measured, json!({"value": 3}));
        assert_eq!(r.failing_checks[0].action, "nic_cable");
        assert_eq!(r.action, "gpu");

        // Without any history the message still makes a record.
        let bare = triage_record(&dl, None, 3000);
        assert!(bare.failing_checks.is_empty());
        assert_eq!(bare.first_failure_at_ms, 2000);
        assert_eq!(bare.action, "gpu", "from the last error's words");
    }

    fn failing(name: &str, verdict: CheckVerdict, action: &str) -> FailingCheck {
        FailingCheck {
            name: name.into(),
            verdict: verdict.as_str().into(),
            message: "m".into(),
            measured: json!({}),
            failed_attempts: 1,
            action: action.into(),
        }
    }

    #[test]
    fn measured_failures_outrank_checks_that_could_not_run() {
        use crate::classify::ActionClass;
        // A timed-out GPU diag beside a measured link failure: the measurement decides.
        let mixed = [
            failing("dcgm_diag", CheckVerdict::Error, "gpu"),
            failing("infiniband", CheckVerdict::Fail, "nic_cable"),
        ];
        assert_eq!(node_action(&mixed), ActionClass::NicCable);
        // Nothing answered, BMC included: the BMC (or its network) first, not the GPUs.
        let unreachable = [
            failing("bmc_health", CheckVerdict::Error, "bmc"),
            failing("gpu_ecc", CheckVerdict::Error, "gpu"),
            failing("infiniband", CheckVerdict::Error, "nic_cable"),
        ];
        assert_eq!(node_action(&unreachable), ActionClass::Bmc);
        // Only errors, BMC fine: the usual order over the errors.
        let hung = [failing("dcgm_diag", CheckVerdict::Error, "gpu")];
        assert_eq!(node_action(&hung), ActionClass::Gpu);
    }
}
