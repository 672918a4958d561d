//! Stress output parsers: DCGM diag JSON and gpu-burn's summary (never its exit code).

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kiln_checks::stress::{evaluate_dcgm, evaluate_gpu_burn, parse_dcgm_json, parse_gpu_burn};
use kiln_checks::{CheckContext, CheckResult, LocalShell, Playbook, Verdict};

fn fixture_path(name: &str) -> PathBuf {
    common::fixtures().join("kiln").join(name)
}

#[test]
fn dcgm_passing_run_passes_and_counts_skips() {
    let results = parse_dcgm_json(&common::own_fixture("dcgm3-diag-r3-pass.json")).expect("parses");
    // 9 deployment tests + 6 per-GPU tests on 2 GPUs.
    assert_eq!(results.len(), 9 + 6 * 2);
    let r = evaluate_dcgm("dcgm_diag", &results, false);
    assert_eq!(r.verdict, Verdict::Pass, "{}", r.message);
    assert_eq!(r.message, "DCGM diagnostics passed (21 results)");
    assert_eq!(r.measured["status_counts"]["skip"], 2);
    assert_eq!(
        r.evidence[9]["details"][0],
        "GPU 0 GPU to Host bandwidth: 51.79 GB/s"
    );
}

#[test]
fn dcgm_failure_names_category_test_gpu_and_dcgm_text() {
    let results = parse_dcgm_json(&common::own_fixture("dcgm3-diag-r3-fail.json")).expect("parses");
    let r = evaluate_dcgm("dcgm_diag", &results, false);
    assert_eq!(r.verdict, Verdict::Fail);
    assert_eq!(
        r.message,
        "Hardware / GPU Memory / GPU 1: Fail: Error using CUDA API cudaMalloc Detected 2 double-bit ECC error(s) on GPU 1. (error 35) | Allocated 81046290432 bytes (99.9%)"
    );
    // A Warn fails only when the playbook says so.
    let r = evaluate_dcgm("dcgm_diag", &results, true);
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
    assert!(
        e.contains("no \"DCGM GPU Diagnostic\".test_categories"),
        "{e}"
    );
    let e =
        parse_dcgm_json(r#"{"DCGM GPU Diagnostic": {"test_categories": []}}"#).expect_err("empty");
    assert!(e.contains("no test results"), "{e}");
    let odd = parse_dcgm_json(
        r#"{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name": "Diagnostic", "results": [{"gpu_ids": "0", "status": "Exploded"}]}]}]}}"#,
    )
    .expect("parses");
    let r = evaluate_dcgm("dcgm_diag", &odd, false);
    assert_eq!(r.verdict, Verdict::Error);
    assert!(
        r.message.contains("unrecognised status \"exploded\""),
        "{}",
        r.message
    );
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
            fixture_path("dcgm3-diag-r3-fail.json").display()
        ),
        2,
    )
    .await;
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(
        r.message.starts_with("Hardware / GPU Memory / GPU 1: Fail"),
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
    assert_eq!(r.message, "GPU 1: FAULTY (computation errors under load)");
    assert_eq!(r.measured["gpus"][1]["ok"], false);

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
    assert_eq!(r.message, "GPU 0: FAULTY (computation errors under load)");
}
