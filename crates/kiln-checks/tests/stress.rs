//! Stress output parsers: DCGM diag JSON and gpu-burn's summary (never its exit code).

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kiln_checks::dcgm::{evaluate_dcgm, parse_dcgm_json, required_tests, DcgmExpect, DcgmReport};
use kiln_checks::stress::{evaluate_gpu_burn, parse_gpu_burn, StressSpec};
use kiln_checks::{Action, CheckContext, CheckResult, LocalShell, Playbook, Verdict};

fn fixture_path(name: &str) -> PathBuf {
    common::fixtures().join("kiln").join(name)
}

fn expect(gpus: u32) -> DcgmExpect {
    DcgmExpect {
        required_tests: required_tests(3),
        gpu_count: gpus,
        warn_fails: false,
    }
}

fn dcgm(name: &str) -> DcgmReport {
    parse_dcgm_json(&common::own_fixture(name)).expect("parses")
}

#[test]
fn dcgm4_passing_run_passes_with_every_required_test_on_every_gpu() {
    let report = dcgm("dcgm4-diag-r3-pass.json");
    assert_eq!(report.layout, "4.x");
    assert_eq!(report.version.as_deref(), Some("4.6.0"));
    assert_eq!(report.results.len(), 7 * 8);
    assert_eq!(report.serials[&3], "1652323000003");
    let r = evaluate_dcgm("dcgm_diag", &report, &expect(8));
    assert_eq!(r.verdict, Verdict::Pass, "{}", r.message);
    assert_eq!(
        r.message,
        "DCGM 4.x diagnostics passed: 7 required tests on 8 GPUs (56 results)"
    );
    assert_eq!(r.measured["gpus_covered"]["targeted_power"], 8);
}

#[test]
fn dcgm4_failure_keeps_error_id_category_and_severity_and_names_the_gpu() {
    let report = dcgm("dcgm4-diag-r3-fail.json");
    let r = evaluate_dcgm("dcgm_diag", &report, &expect(8));
    assert_eq!(r.verdict, Verdict::Fail);
    assert_eq!(r.findings.len(), 2, "{:?}", r.findings);
    let mem = &r.findings[0];
    assert_eq!(
        mem.message,
        "Hardware / memory / GPU 3: Fail: Found 4 faulty memory elements on GPU 3 (DCGM_FR_FAULTY_MEMORY, error 52, severity ISOLATE, category HARDWARE_MEMORY)"
    );
    assert_eq!(mem.code, "DCGM_FR_FAULTY_MEMORY");
    assert_eq!(mem.action, Action::Rma);
    assert_eq!(mem.component.index, Some(3));
    assert_eq!(mem.component.serial.as_deref(), Some("1652323000003"));
    assert_eq!(mem.evidence[0], "Found 4 faulty memory elements on GPU 3");
    let power = &r.findings[1];
    assert_eq!(power.code, "DCGM_FR_THERMAL_VIOLATIONS");
    assert_eq!(power.action, Action::Cooling);
    // The raw warnings stay in the evidence with their numbers.
    let warnings = &r.evidence["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|x| x["canonical"] == "memory" && x["status"] == "fail")
        .expect("failed memory result")["warnings"][0];
    assert_eq!(
        (
            warnings["error_id"].as_u64(),
            warnings["category"].as_i64(),
            warnings["severity"].as_i64()
        ),
        (Some(52), Some(10), Some(2))
    );
}

#[test]
fn dcgm4_required_test_skipped_or_absent_fails() {
    let r = evaluate_dcgm("dcgm_diag", &dcgm("dcgm4-diag-r3-skip.json"), &expect(8));
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(
        r.message
            .contains("required DCGM test targeted_power was skipped on every entity"),
        "{}",
        r.message
    );
    assert!(
        r.message
            .contains("required DCGM test memory_bandwidth is absent from the report"),
        "{}",
        r.message
    );
    // Required tests are the playbook's to choose.
    let lenient = DcgmExpect {
        required_tests: vec!["software".into(), "memory".into()],
        ..expect(8)
    };
    let r = evaluate_dcgm("dcgm_diag", &dcgm("dcgm4-diag-r3-skip.json"), &lenient);
    assert_eq!(r.verdict, Verdict::Pass, "{}", r.message);
}

#[test]
fn dcgm4_fewer_gpus_covered_than_the_node_has_fails() {
    let r = evaluate_dcgm("dcgm_diag", &dcgm("dcgm4-diag-r3-7gpus.json"), &expect(8));
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(
        r.message
            .contains("DCGM test software covered 7 GPUs (0, 1, 2, 3, 5, 6, 7), the node has 8"),
        "{}",
        r.message
    );
    assert_eq!(r.findings.len(), 7, "every required test is short of GPU 4");
}

#[test]
fn dcgm3_layout_still_reads_and_fails_on_its_skip_and_failure() {
    let report = dcgm("dcgm3-diag-r3-pass.json");
    assert_eq!(report.layout, "3.x");
    // 9 deployment tests + 6 per-GPU tests on 2 GPUs.
    assert_eq!(report.results.len(), 9 + 6 * 2);
    // Memory Bandwidth was skipped on both GPUs: the r3 set requires it.
    let r = evaluate_dcgm("dcgm_diag", &report, &expect(2));
    assert_eq!(r.verdict, Verdict::Fail);
    assert_eq!(
        r.message,
        "required DCGM test memory_bandwidth was skipped on every entity"
    );
    let without_bw = DcgmExpect {
        required_tests: required_tests(3)
            .into_iter()
            .filter(|t| t != "memory_bandwidth")
            .collect(),
        ..expect(2)
    };
    let r = evaluate_dcgm("dcgm_diag", &report, &without_bw);
    assert_eq!(r.verdict, Verdict::Pass, "{}", r.message);
    assert_eq!(r.measured["status_counts"]["skip"], 2);

    let r = evaluate_dcgm("dcgm_diag", &dcgm("dcgm3-diag-r3-fail.json"), &without_bw);
    assert_eq!(r.verdict, Verdict::Fail);
    assert_eq!(
        r.findings[0].message,
        "Hardware / GPU Memory / GPU 1: Fail: Error using CUDA API cudaMalloc Detected 2 double-bit ECC error(s) on GPU 1. (DCGM_FR_FIELD_VIOLATION_DBL, error 35, severity ISOLATE, category SOFTWARE_LIBRARY)"
    );
    assert_eq!(
        r.findings.len(),
        1,
        "a Warn fails only when the playbook says so"
    );
    let strict = DcgmExpect {
        warn_fails: true,
        ..without_bw
    };
    let r = evaluate_dcgm("dcgm_diag", &dcgm("dcgm3-diag-r3-fail.json"), &strict);
    assert!(
        r.message
            .contains("Stress / Targeted Power / GPU 1: Warn: Clocks throttled by power capping"),
        "{}",
        r.message
    );
}

#[test]
fn dcgm_output_that_is_not_a_diag_report_is_refused() {
    assert!(parse_dcgm_json("Error: unable to connect to host engine")
        .expect_err("not json")
        .contains("not JSON"));
    let e = parse_dcgm_json(r#"{"version": "3.3.7"}"#).expect_err("wrong shape");
    assert!(e.contains("neither \"DCGM Diagnostic\""), "{e}");
    let e =
        parse_dcgm_json(r#"{"DCGM GPU Diagnostic": {"test_categories": []}}"#).expect_err("empty");
    assert!(e.contains("no test results"), "{e}");
    let odd = parse_dcgm_json(
        r#"{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name": "diagnostic", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Exploded"}]}]}]}}"#,
    )
    .expect("parses");
    let r = evaluate_dcgm(
        "dcgm_diag",
        &odd,
        &DcgmExpect {
            required_tests: vec![],
            gpu_count: 1,
            warn_fails: false,
        },
    );
    assert_eq!(r.verdict, Verdict::Error);
    assert!(
        r.message.contains("unrecognised status \"exploded\""),
        "{}",
        r.message
    );
}

#[test]
fn dcgm_level_sets_the_command_and_the_required_tests() {
    let p = Playbook::parse("playbook: t\nchecks:\n - check: dcgm_diag\n   level: 4\n")
        .unwrap_or_else(|e| panic!("{e}"));
    match &p.steps[0].spec {
        kiln_checks::playbook::Spec::Stress(StressSpec::Dcgm { command, tests, .. }) => {
            assert_eq!(command, "dcgmi diag -r 4 --json");
            assert!(tests.contains(&"memtest".to_string()));
            assert!(tests.contains(&"pulse_test".to_string()));
        }
        other => panic!("{other:?}"),
    }
}

async fn run_one(playbook: &str, gpus: u32) -> CheckResult {
    let p = Playbook::parse(playbook).unwrap_or_else(|e| panic!("{e}"));
    let ctx = CheckContext::new(
        common::node(gpus),
        tokio::time::Instant::now() + Duration::from_secs(20),
    )
    .with_shell(Arc::new(LocalShell::default()));
    p.run(&ctx).await.results.remove(0)
}

#[tokio::test]
async fn dcgm_step_parses_the_json_whatever_the_exit_code() {
    // dcgmi exits non-zero when a test fails; the verdict still comes from the JSON.
    let r = run_one(
        &format!(
            "playbook: t\nchecks:\n - check: dcgm_diag\n   command: cat {}; exit 226\n",
            fixture_path("dcgm4-diag-r3-fail.json").display()
        ),
        8,
    )
    .await;
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(
        r.message.starts_with("Hardware / memory / GPU 3: Fail"),
        "{}",
        r.message
    );
    // dcgmi not installed: no JSON at all is an error, with dcgmi's own words.
    let r = run_one("playbook: t\nchecks:\n - check: dcgm_diag\n   command: \"echo 'dcgmi: command not found' >&2; exit 127\"\n", 2).await;
    assert_eq!(r.verdict, Verdict::Error);
    assert!(
        r.message.contains("dcgmi: command not found"),
        "{}",
        r.message
    );
}

const BURN_OK: &str = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5d6c2b1e-8f0a-4c3e-9b7d-1a2b3c4d5e60)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-9a8b7c6d-8f0a-4c3e-9b7d-1a2b3c4d5e61)
Initialized device 0 with 81079 MB of memory (80484 MB available, using 72436 MB of it), using FLOATS, using Tensor Cores
Initialized device 1 with 81079 MB of memory (80484 MB available, using 72436 MB of it), using FLOATS, using Tensor Cores
Results are 268435456 bytes each, thus performing 280 iterations
10.0%  proc'd: 2520 (386423 Gflop/s) - 2520 (385911 Gflop/s)   errors: 0 - 0   temps: 61 C - 59 C
100.0%  proc'd: 25200 (388012 Gflop/s) - 25200 (387640 Gflop/s)   errors: 0 - 0   temps: 74 C - 72 C
Killing processes with SIGTERM (soft kill)
Freed memory for dev 0
Uninitted cublas
Freed memory for dev 1
Uninitted cublas
done

Tested 2 GPUs:
\tGPU 0: OK
\tGPU 1: OK
";

#[test]
fn gpu_burn_summary_decides() {
    let s = parse_gpu_burn(BURN_OK).expect("summary");
    assert_eq!(s.tested, 2);
    assert_eq!(s.gpus, vec![(0, true), (1, true)]);
    let r = evaluate_gpu_burn("gpu_burn", BURN_OK, 2);
    assert_eq!(r.verdict, Verdict::Pass);
    assert_eq!(r.message, "gpu-burn: 2 GPUs OK");

    let faulty = BURN_OK.replace("\tGPU 1: OK", "\tGPU 1: FAULTY");
    let r = evaluate_gpu_burn("gpu_burn", &faulty, 2);
    assert_eq!(r.verdict, Verdict::Fail);
    assert_eq!(
        r.message,
        "GPU 1: FAULTY (computation errors under load); run NVIDIA field diagnostic"
    );
    assert_eq!(r.measured["gpus"][1]["ok"], false);
    assert_eq!(r.findings[0].action, Action::Rma);
    assert_eq!(r.findings[0].component.index, Some(1));

    let r = evaluate_gpu_burn("gpu_burn", BURN_OK, 8);
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(
        r.message.contains("gpu-burn tested 2 GPUs, expected 8"),
        "{}",
        r.message
    );
}

#[test]
fn gpu_burn_without_a_summary_fails() {
    let cut = BURN_OK.split("done").next().expect("head");
    let r = evaluate_gpu_burn("gpu_burn", cut, 2);
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(
        r.message.contains("no `Tested N GPUs:` summary"),
        "{}",
        r.message
    );
    assert!(r.message.contains("exit code is always 0"), "{}", r.message);
    assert!(r.evidence["output_tail"]
        .as_str()
        .expect("tail")
        .contains("Freed memory for dev 1"));
    // The per-GPU lines at the top are not a summary.
    assert!(parse_gpu_burn("GPU 0: NVIDIA H100 80GB HBM3 (UUID: x)\n").is_none());
}

#[tokio::test]
async fn gpu_burn_step_ignores_its_exit_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("burn.txt");
    std::fs::write(&out, BURN_OK.replace("\tGPU 0: OK", "\tGPU 0: FAULTY")).expect("write");
    let r = run_one(
        &format!(
            "playbook: t\nchecks:\n - check: gpu_burn\n   command: cat {}; exit 0\n",
            out.display()
        ),
        2,
    )
    .await;
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(r.message.starts_with("GPU 0: FAULTY"), "{}", r.message);
}
