//! A synthetic fleet for the dashboard benchmark and tests: nodes registered, then runs begun
//! and finished through the store's own API (the calls intake and the agents make), so the
//! rows are exactly what production writes. Not used by the dashboard itself.

use std::collections::{BTreeMap, BTreeSet};

use kiln_manifest::NodeSpec;
use kiln_store::{
    BeginRun, CheckResult, CheckVerdict, NodeState, QueuedNode, RunVerdict, Store, StoreError,
    MAX_ATTEMPTS,
};

/// What to seed.
#[derive(Debug, Clone)]
pub struct FleetSpec {
    pub nodes: usize,
    pub rack_size: usize,
    /// Registration time; runs follow at one-second steps.
    pub start_ms: i64,
}

/// What was seeded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seeded {
    pub racks: BTreeSet<String>,
    pub counts: BTreeMap<NodeState, u64>,
    pub runs: u64,
    pub checks: u64,
}

pub fn rack_name(i: usize, rack_size: usize) -> String {
    format!("rack-{:04}", i / rack_size.max(1))
}

pub fn hostname(i: usize) -> String {
    format!("gpu-{i:05}")
}

/// The state node `i` ends in: 60 % passed, 10 % running, 10 % retrying, 5 % dead-lettered,
/// 15 % queued, interleaved so every rack has a mix.
pub fn planned_state(i: usize) -> NodeState {
    match i % 20 {
        0..=11 => NodeState::Passed,
        12 | 13 => NodeState::Running,
        14 | 15 => NodeState::Retrying,
        16 => NodeState::DeadLettered,
        _ => NodeState::Queued,
    }
}

fn spec(i: usize, rack_size: usize) -> NodeSpec {
    NodeSpec {
        hostname: hostname(i),
        rack: rack_name(i, rack_size),
        bmc_address: format!("10.{}.{}.{}", i / 65_536 % 256, i / 256 % 256, i % 256),
        gpu_model: "H100-SXM".into(),
        gpu_count: 8,
        firmware_bmc: "1.10".into(),
        firmware_bios: "2.3.1".into(),
        firmware_gpu_vbios: "96.00.74".into(),
        firmware_nic: "28.39".into(),
        labels: BTreeMap::from([("row".to_string(), (i % 7).to_string())]),
    }
}

fn checks(i: usize, attempt: u32, fail: bool) -> Vec<CheckResult> {
    let gpus = if fail { 7 } else { 8 };
    vec![
        CheckResult {
            name: "gpu_health".into(),
            verdict: if fail {
                CheckVerdict::Fail
            } else {
                CheckVerdict::Pass
            },
            measured: serde_json::json!({ "gpu_count": gpus, "expected": 8, "attempt": attempt }),
            message: if fail {
                format!("GPU 3 of {} missing from NVML", hostname(i))
            } else {
                "8 GPUs healthy".into()
            },
            evidence: format!(
                "nvidia-smi -L\n{}",
                (0..gpus)
                    .map(|g| format!("GPU {g}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:05}-{g})"))
                    .collect::<Vec<_>>()
                    .join("\n")
            ),
            findings: if fail {
                vec![kiln_findings::Finding::new(
                    kiln_findings::Component::new(kiln_findings::ComponentKind::Board),
                    "gpu_count",
                    kiln_findings::Action::Reboot,
                    format!("GPU 3 of {} missing from NVML", hostname(i)),
                )
                .with_evidence(format!("nvidia-smi -L lists {gpus} GPUs, expected 8"))]
            } else {
                Vec::new()
            },
        },
        CheckResult {
            name: "nic_link".into(),
            verdict: CheckVerdict::Pass,
            measured: serde_json::json!({ "ports_up": 8, "rate_gbps": 400 }),
            message: "8 InfiniBand ports up at 400 Gb/s".into(),
            evidence: String::new(),
            findings: Vec::new(),
        },
        CheckResult {
            name: "gpu_burn".into(),
            verdict: CheckVerdict::Pass,
            measured: serde_json::json!({ "gflops_min": 51_200.5, "errors": 0 }),
            message: "no compute errors in 600 s".into(),
            evidence: "gpu_burn summary: OK OK OK OK OK OK OK OK".into(),
            findings: Vec::new(),
        },
    ]
}

/// Seeds the fleet. Every node is registered in one transaction, then each node's runs are
/// begun and finished in order (one transaction each, as the agents do).
pub async fn seed_fleet(store: &Store, spec_: &FleetSpec) -> Result<Seeded, StoreError> {
    let mut out = Seeded::default();
    let nodes: Vec<QueuedNode> = (0..spec_.nodes)
        .map(|i| QueuedNode {
            spec: spec(i, spec_.rack_size),
            cycle: 1,
        })
        .collect();
    store.record_queued(&nodes, spec_.start_ms).await?;
    let mut t = spec_.start_ms;
    for (i, node) in nodes.iter().enumerate() {
        let state = planned_state(i);
        out.racks.insert(node.spec.rack.clone());
        *out.counts.entry(state).or_default() += 1;
        // (failed attempts before the last, whether the last attempt is finished and passes)
        let (failures, last): (u32, Option<bool>) = match state {
            NodeState::Queued => continue,
            NodeState::Passed => (u32::from(i % 3 == 0), Some(true)),
            NodeState::Running => (u32::from(i % 2 == 0), None),
            NodeState::Retrying => (1 + u32::from(i % 3 == 0), Some(false)),
            NodeState::DeadLettered => (MAX_ATTEMPTS - 1, Some(false)),
        };
        let attempts = failures + 1;
        for attempt in 1..=attempts {
            t += 1000;
            let run = match store
                .begin_run(&node.spec, 1, attempt, "agent-bench", t)
                .await?
            {
                BeginRun::Started { run } => run,
                other => {
                    return Err(StoreError::Corrupt(format!(
                        "seeding {}: attempt {attempt} did not start: {other:?}",
                        node.spec.hostname
                    )))
                }
            };
            out.runs += 1;
            let pass = match (attempt == attempts, last) {
                (true, None) => break, // running: begun, not finished
                (true, Some(pass)) => pass,
                (false, _) => false,
            };
            let results = checks(i, attempt, !pass);
            out.checks += results.len() as u64;
            let verdict = if pass {
                RunVerdict::Pass
            } else {
                RunVerdict::Fail
            };
            store.finish_run(run, verdict, &results, t + 500).await?;
        }
    }
    Ok(out)
}
