//! GPU checks against a recorded probe (8 x H100, hand-written in the shape `kiln probe`
//! prints; tests/fixtures/README.md). Each check: the healthy recording passes under the
//! shipped h100-sxm playbook; a recording with one fault fails with a message naming the
//! GPU and the value, and the raw reading in the evidence.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kiln_checks::gpu::GpuThresholds;
use kiln_checks::playbook::Spec;
use kiln_checks::probe::{run_probe, ProbeReport, RecordedGpus, EXIT_NVML_UNAVAILABLE, EXIT_OK};
use kiln_checks::{CheckContext, CheckResult, CommandOutput, Playbook, RecordedShell, Verdict};

fn recording() -> RecordedGpus {
    RecordedGpus::from_json(&common::own_fixture("probe-h100-healthy.json"))
        .expect("fixture parses")
}

fn healthy() -> ProbeReport {
    let (report, code) = run_probe(&recording());
    assert_eq!(code, EXIT_OK, "{:?}", report.errors);
    report
}

fn h100() -> Playbook {
    Playbook::load_file(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../playbooks/h100-sxm.yaml"),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn thresholds(step: &str) -> GpuThresholds {
    let p = h100();
    match &p.steps.iter().find(|s| s.name == step).expect("step").spec {
        Spec::Gpu(t) => t.clone(),
        other => panic!("{other:?}"),
    }
}

fn eval(step: &str, report: &ProbeReport) -> CheckResult {
    thresholds(step).evaluate(step, report, &common::node(8))
}

fn assert_fail(r: &CheckResult, parts: &[&str]) {
    assert_eq!(r.verdict, Verdict::Fail, "{}: {}", r.name, r.message);
    for p in parts {
        assert!(r.message.contains(p), "message {:?} lacks {p:?}", r.message);
    }
}

#[test]
fn the_recorded_probe_reads_every_gpu_and_the_xids() {
    let r = healthy();
    assert_eq!(r.gpus.len(), 8);
    assert_eq!(r.driver_version.as_deref(), Some("550.90.07"));
    let xids: Vec<u32> = r.xid_events.iter().map(|e| e.xid).collect();
    assert_eq!(xids, vec![13, 43]);
    assert_eq!(r.kernel_log.lines, 5);
}

#[test]
fn every_gpu_step_of_the_h100_playbook_passes_on_a_healthy_node() {
    let report = healthy();
    let p = h100();
    let mut n = 0;
    for s in &p.steps {
        if let Spec::Gpu(t) = &s.spec {
            let r = t.evaluate(&s.name, &report, &common::node(8));
            assert_eq!(r.verdict, Verdict::Pass, "{}: {}", s.name, r.message);
            n += 1;
        }
    }
    assert_eq!(n, 13);
}

#[test]
fn gpu_inventory_fails_on_a_missing_gpu_or_wrong_model() {
    let mut r = healthy();
    r.gpus.remove(3);
    assert_fail(
        &eval("gpu_inventory", &r),
        &["GPU count 7, expected 8", "00000000:18:00.0"],
    );
    let mut r = healthy();
    r.gpus[6].name = Some("NVIDIA H100 PCIe".into());
    assert_fail(
        &eval("gpu_inventory", &r),
        &["GPU 6 (GPU-3f4e5d6c", "model \"NVIDIA H100 PCIe\""],
    );
}

#[test]
fn gpu_ecc_fails_on_a_volatile_uncorrected_error() {
    let mut r = healthy();
    if let Some(e) = r.gpus[2].ecc.as_mut() {
        e.volatile_uncorrected = 2;
    }
    let res = eval("gpu_ecc", &r);
    assert_fail(
        &res,
        &[
            "GPU 2 (GPU-0f1e2d3c",
            "00000000:3A:00.0",
            "ECC volatile uncorrected = 2 (max 0)",
        ],
    );
    assert_eq!(res.evidence["gpus"][2]["ecc"]["volatile_uncorrected"], 2);
    assert_eq!(res.measured["gpus"][2]["volatile_uncorrected"], 2);
}

#[test]
fn gpu_ecc_unreadable_is_an_error_and_unsupported_is_a_failure() {
    let mut r = healthy();
    r.gpus[1].ecc = None;
    r.gpus[1]
        .unavailable
        .insert("ecc".into(), "Unknown Error".into());
    let res = eval("gpu_ecc", &r);
    assert_eq!(res.verdict, Verdict::Error, "{}", res.message);
    assert!(
        res.message.contains("GPU 1 (GPU-9a8b7c6d"),
        "{}",
        res.message
    );
    r.gpus[1]
        .unavailable
        .insert("ecc".into(), "not_supported".into());
    assert_fail(
        &eval("gpu_ecc", &r),
        &["GPU 1", "ECC not supported or disabled"],
    );
}

#[test]
fn gpu_row_remap_fails_on_pending_or_failure() {
    let mut r = healthy();
    if let Some(x) = r.gpus[4].row_remap.as_mut() {
        x.pending = true;
    }
    if let Some(x) = r.gpus[7].row_remap.as_mut() {
        x.failure = true;
    }
    let res = eval("gpu_row_remap", &r);
    assert_fail(
        &res,
        &[
            "GPU 4 (GPU-1b2c3d4e",
            "row remapping pending",
            "GPU 7 (GPU-a1b2c3d4",
            "row remapping failure",
        ],
    );
    assert_eq!(res.evidence["gpus"][4]["row_remap"]["pending"], true);
    assert_eq!(res.measured["problems"].as_array().map(Vec::len), Some(2));
}

#[test]
fn gpu_retired_pages_passes_when_unsupported_and_fails_above_the_limit() {
    let res = eval("gpu_retired_pages", &healthy());
    assert_eq!(res.verdict, Verdict::Pass);
    assert!(
        res.message.contains("retired_pages not supported"),
        "{}",
        res.message
    );
    let mut r = healthy();
    r.gpus[0].retired_pages = Some(kiln_checks::probe::RetiredPages {
        multiple_single_bit: 9,
        double_bit: 3,
        pending: false,
    });
    let res = eval("gpu_retired_pages", &r);
    assert_fail(
        &res,
        &["GPU 0 (GPU-5d6c2b1e", "retired pages = 12", "max 10"],
    );
    assert_eq!(res.evidence["gpus"][0]["retired_pages"]["double_bit"], 3);
}

#[test]
fn gpu_pcie_fails_on_narrow_or_slow_links() {
    let mut r = healthy();
    if let Some(l) = r.gpus[5].pcie.as_mut() {
        l.width_current = 8;
    }
    if let Some(l) = r.gpus[1].pcie.as_mut() {
        l.generation_max = 4;
    }
    let res = eval("gpu_pcie", &r);
    assert_fail(&res, &[
        "GPU 5 (GPU-8e7d6c5b-8f0a-4c3e-9b7d-1a2b3c4d5e65, 00000000:AB:00.0): PCIe width x8 below max x16",
        "GPU 1 (GPU-9a8b7c6d-8f0a-4c3e-9b7d-1a2b3c4d5e61, 00000000:2A:00.0): PCIe link can reach generation 4 at most (min 5)",
    ]);
    assert_eq!(res.evidence["gpus"][5]["pcie"]["width_current"], 8);
}

#[test]
fn gpu_nvlink_fails_on_an_inactive_link_or_too_many_errors() {
    let mut r = healthy();
    r.gpus[3].nvlinks[7].active = false;
    r.gpus[3].nvlinks[11].active = false;
    let res = eval("gpu_nvlink", &r);
    assert_fail(&res, &["GPU 3 (GPU-7c6b5a49", "NVLink(s) [7, 11] inactive"]);
    assert_eq!(
        res.measured["gpus"][3]["inactive"],
        serde_json::json!([7, 11])
    );
    // Error counters, when the playbook sets a limit.
    let t = GpuThresholds::Nvlink(kiln_checks::gpu::Nvlink {
        links_min: Some(18),
        all_active: true,
        replay_errors_max: None,
        recovery_errors_max: None,
        crc_errors_max: Some(100),
    });
    let mut r = healthy();
    r.gpus[0].nvlinks[2].crc_flit_errors = Some(90);
    r.gpus[0].nvlinks[2].crc_data_errors = Some(20);
    assert_fail(
        &t.evaluate("nv", &r, &common::node(8)),
        &["GPU 0", "NVLink 2 CRC errors = 110 (max 100)"],
    );
    let mut r = healthy();
    r.gpus[2].nvlinks.truncate(12);
    assert_fail(
        &eval("gpu_nvlink", &r),
        &["GPU 2", "12 NVLinks reported (min 18)"],
    );
}

#[test]
fn gpu_xid_allows_application_xids_and_fails_on_others() {
    let res = eval("gpu_xid", &healthy());
    assert_eq!(res.verdict, Verdict::Pass, "{}", res.message);
    assert_eq!(res.measured["gpus"][0]["xid_events"], 2);
    let mut rec = recording();
    if let Some(log) = rec.kernel_log.as_mut() {
        log.push_str("[ 7200.000001] NVRM: Xid (PCI:0000:ab:00): 79, pid=1911, name=gpu_burn, GPU has fallen off the bus.\n");
        log.push_str("[ 7201.5] NVRM: Xid (PCI:0000:3a:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n");
    }
    let (r, _) = run_probe(&rec);
    let res = eval("gpu_xid", &r);
    assert_fail(&res, &[
        "GPU 5 (GPU-8e7d6c5b-8f0a-4c3e-9b7d-1a2b3c4d5e65, 00000000:AB:00.0): Xid 79 (pid=1911, name=gpu_burn, GPU has fallen off the bus.)",
        "GPU 2 (GPU-0f1e2d3c-8f0a-4c3e-9b7d-1a2b3c4d5e62, 00000000:3A:00.0): Xid 48",
    ]);
    let evidence = res.evidence["gpus"].as_array().expect("list");
    assert_eq!(evidence.len(), 4);
    assert_eq!(evidence[2]["xid"]["xid"], 79);
    assert_eq!(evidence[2]["allowed"], false);
}

#[test]
fn gpu_xid_without_a_kernel_log_is_an_error() {
    let mut rec = recording();
    rec.kernel_log = None;
    let (r, code) = run_probe(&rec);
    assert_eq!(code, kiln_checks::probe::EXIT_PARTIAL);
    let res = eval("gpu_xid", &r);
    assert_eq!(res.verdict, Verdict::Error);
    assert!(
        res.message.contains("kernel log unreadable"),
        "{}",
        res.message
    );
}

#[test]
fn gpu_thermal_fails_on_temperature_power_and_throttling() {
    let mut r = healthy();
    r.gpus[6].temperature_c = Some(91);
    r.gpus[2].throttle_reasons = Some(vec!["sw_power_cap".into(), "hw_slowdown".into()]);
    r.gpus[0].power_mw = Some(735_500);
    let res = eval("gpu_thermal", &r);
    assert_fail(
        &res,
        &[
            "GPU 6 (GPU-3f4e5d6c-8f0a-4c3e-9b7d-1a2b3c4d5e66, 00000000:BA:00.0): temperature 91 °C (max 85)",
            "GPU 2 (GPU-0f1e2d3c-8f0a-4c3e-9b7d-1a2b3c4d5e62, 00000000:3A:00.0): throttled by hw_slowdown",
            "GPU 0 (GPU-5d6c2b1e-8f0a-4c3e-9b7d-1a2b3c4d5e60, 00000000:18:00.0): power 735.5 W (max 720)",
        ],
    );
    assert!(
        !res.message.contains("sw_power_cap"),
        "power capping is not forbidden: {}",
        res.message
    );
    assert_eq!(res.measured["gpus"][6]["temperature_c"], 91);
}

#[test]
fn gpu_firmware_compares_vbios_with_the_baseline() {
    let mut r = healthy();
    r.gpus[3].vbios_version = Some("96.00.61.00.01".into());
    assert_fail(
        &eval("gpu_firmware", &r),
        &[
            "GPU 3 (GPU-7c6b5a49",
            "VBIOS 96.00.61.00.01, baseline 96.00.74.00.01",
        ],
    );
    let mut node = common::node(8);
    node.firmware.gpu_vbios = None;
    let res = thresholds("gpu_firmware").evaluate("gpu_firmware", &healthy(), &node);
    assert_eq!(res.verdict, Verdict::Error);
    assert!(
        res.message.contains("no gpu_vbios baseline"),
        "{}",
        res.message
    );
}

fn probe_shell(report: &ProbeReport, exit: i32) -> RecordedShell {
    let out = CommandOutput {
        exit_code: Some(exit),
        stdout: serde_json::to_string(report).expect("json"),
        stderr: String::new(),
        truncated: false,
    };
    RecordedShell::new().answer("kiln probe", out)
}

#[tokio::test]
async fn gpu_steps_share_one_probe_until_a_stress_step() {
    let shell = probe_shell(&healthy(), 0).answer(
        "gpu_burn 10",
        CommandOutput::ok("Tested 8 GPUs:\n\tGPU 0: OK\n\tGPU 1: OK\n\tGPU 2: OK\n\tGPU 3: OK\n\tGPU 4: OK\n\tGPU 5: OK\n\tGPU 6: OK\n\tGPU 7: OK\n"),
    );
    let p = Playbook::parse(
        "playbook: t\nchecks:\n - check: gpu_ecc\n - check: gpu_xid\n - check: gpu_burn\n   command: gpu_burn 10\n - check: gpu_ecc\n   name: after\n",
    )
    .expect("valid");
    let ctx = CheckContext::new(
        common::node(8),
        tokio::time::Instant::now() + Duration::from_secs(30),
    )
    .with_shell(Arc::new(shell.clone()));
    let run = p.run(&ctx).await;
    assert_eq!(run.verdict, Verdict::Pass, "{:?}", run.results);
    assert_eq!(
        shell.calls(),
        vec!["kiln probe", "gpu_burn 10", "kiln probe"]
    );
}

#[tokio::test]
async fn missing_nvml_on_the_node_makes_gpu_steps_error() {
    let rec = RecordedGpus {
        nvml_error: Some(
            "a libloading error occurred: libnvidia-ml.so: cannot open shared object file".into(),
        ),
        kernel_log: Some(String::new()),
        ..Default::default()
    };
    let (report, code) = run_probe(&rec);
    assert_eq!(code, EXIT_NVML_UNAVAILABLE);
    let ctx = CheckContext::new(
        common::node(8),
        tokio::time::Instant::now() + Duration::from_secs(30),
    )
    .with_shell(Arc::new(probe_shell(&report, code)));
    let p = Playbook::parse("playbook: t\nchecks:\n - check: gpu_ecc\n - check: gpu_pcie\n")
        .expect("valid");
    let run = p.run(&ctx).await;
    assert_eq!(run.verdict, Verdict::Error);
    for r in &run.results {
        assert!(
            r.message.contains("NVML unavailable: a libloading error"),
            "{}",
            r.message
        );
    }
    // A probe that prints no report at all.
    let shell = RecordedShell::new().answer(
        "kiln probe",
        CommandOutput {
            exit_code: Some(127),
            stdout: String::new(),
            stderr: "sh: kiln: not found".into(),
            truncated: false,
        },
    );
    let ctx = CheckContext::new(
        common::node(8),
        tokio::time::Instant::now() + Duration::from_secs(30),
    )
    .with_shell(Arc::new(shell));
    let run = p.run(&ctx).await;
    assert!(
        run.results[0]
            .message
            .contains("printed no probe report (exit Some(127): sh: kiln: not found)"),
        "{}",
        run.results[0].message
    );
}
