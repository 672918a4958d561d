//! GPU checks against a recorded probe (8 x H100, hand-written in the shape `kiln probe`
//! prints; fixtures/kiln/README.md). Each check: the healthy recording passes under the
//! shipped h100-sxm playbook; a recording with one fault fails with a message naming the
//! GPU and the value, and the raw reading in the evidence.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kiln_checks::gpu::GpuThresholds;
use kiln_checks::playbook::Spec;
use kiln_checks::probe::{run_probe, ProbeReport, RecordedGpus, EXIT_NVML_UNAVAILABLE, EXIT_OK};
use kiln_checks::{
    Action, CheckContext, CheckResult, CommandOutput, ComponentKind, Playbook, RecordedShell,
    Verdict,
};

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
fn the_recorded_probe_reads_every_gpu_and_the_fabric() {
    let r = healthy();
    assert_eq!(r.gpus.len(), 8);
    assert_eq!(r.driver_version.as_deref(), Some("550.90.07"));
    assert!(r.xid_events.is_empty(), "a burn-in node has no Xid");
    assert_eq!(r.kernel_log.lines, 3);
    assert_eq!(r.gpus[0].module_id, Some(2));
    assert_eq!(r.gpus[0].power_limit_default_mw, Some(700_000));
    assert!(r.fabric_manager.as_ref().is_some_and(|f| f.active()));
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
    assert_eq!(n, 15);
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
            "row-remap failure (no spare rows left): run NVIDIA field diagnostic",
        ],
    );
    assert_eq!(res.evidence["gpus"][4]["row_remap"]["pending"], true);
    assert_eq!(res.measured["problems"].as_array().map(Vec::len), Some(2));
    // A pending remap needs a reset; a failure is an RMA candidate, on the GPU by serial and
    // SXM slot.
    assert_eq!(res.findings[0].action, Action::ResetGpu);
    let fail = &res.findings[1];
    assert_eq!(
        (fail.code.as_str(), fail.action),
        ("row_remap_failure", Action::Rma)
    );
    assert_eq!(fail.component.serial.as_deref(), Some("1652323000007"));
    assert_eq!(fail.component.slot.as_deref(), Some("SXM slot 6"));
    assert!(
        fail.evidence[0].contains("failure true"),
        "{:?}",
        fail.evidence
    );
}

#[test]
fn gpu_row_remap_not_supported_on_hopper_is_an_error() {
    let mut r = healthy();
    r.gpus[2].row_remap = None;
    r.gpus[2]
        .unavailable
        .insert("row_remap".into(), "not_supported".into());
    let res = eval("gpu_row_remap", &r);
    assert_eq!(res.verdict, Verdict::Error, "{}", res.message);
    assert!(
        res.message.contains("row remapping reported not supported"),
        "{}",
        res.message
    );
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
    // Error counters: 0 unless the playbook allows more.
    let mut r = healthy();
    r.gpus[6].nvlinks[4].replay_errors = Some(3);
    assert_fail(
        &eval("gpu_nvlink", &r),
        &["GPU 6", "NVLink 4 replay errors = 3 (max 0)"],
    );
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
fn gpu_xid_fails_on_any_xid_with_nvidia_class_and_action() {
    let res = eval("gpu_xid", &healthy());
    assert_eq!(res.verdict, Verdict::Pass, "{}", res.message);
    assert_eq!(res.measured["gpus"][0]["xid_events"], 0);
    let mut rec = recording();
    if let Some(log) = rec.kernel_log.as_mut() {
        log.push_str("[ 3605.123456] NVRM: Xid (PCI:0000:2a:00): 13, pid=48213, name=python3, Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address\n");
        log.push_str("[ 7200.000001] NVRM: Xid (PCI:0000:ab:00): 79, pid=1911, name=gpu_burn, GPU has fallen off the bus.\n");
        log.push_str("[ 7201.5] NVRM: Xid (PCI:0000:3a:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n");
        log.push_str("[ 7202.5] NVRM: Xid (PCI:0000:3a:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 1.\n");
    }
    let (r, _) = run_probe(&rec);
    let res = eval("gpu_xid", &r);
    assert_fail(&res, &[
        "GPU 5 (GPU-8e7d6c5b-8f0a-4c3e-9b7d-1a2b3c4d5e65, 00000000:AB:00.0): Xid 79 (GPU has fallen off the bus; NVIDIA: RESTART_BM, reboot the node): pid=1911, name=gpu_burn, GPU has fallen off the bus.",
        "GPU 2 (GPU-0f1e2d3c-8f0a-4c3e-9b7d-1a2b3c4d5e62, 00000000:3A:00.0): Xid 48 (Double Bit ECC Error; NVIDIA: RESET_GPU, reset the GPU) x2",
        "Xid 13 (Graphics Engine Exception; NVIDIA: RESTART_APP, investigate)",
    ]);
    // One finding per GPU and Xid, with the log lines as evidence and the catalog's action.
    let x79 = res
        .findings
        .iter()
        .find(|f| f.code == "xid_79")
        .expect("79");
    assert_eq!(x79.action, Action::Reboot);
    assert_eq!(x79.component.index, Some(5));
    assert!(
        x79.evidence[0].contains("NVRM: Xid (PCI:0000:ab:00): 79"),
        "{:?}",
        x79.evidence
    );
    let x48 = res
        .findings
        .iter()
        .find(|f| f.code == "xid_48")
        .expect("48");
    assert_eq!((x48.action, x48.evidence.len()), (Action::ResetGpu, 2));
    let evidence = res.evidence["gpus"].as_array().expect("list");
    assert_eq!(evidence.len(), 4);
    assert_eq!(evidence[1]["xid"]["xid"], 79);
    assert_eq!(evidence[1]["allowed"], false);
    // An allow-list still works for sites that want one.
    let t = GpuThresholds::Xid(kiln_checks::gpu::Xid {
        allowed: vec![13, 48, 79],
    });
    assert_eq!(t.evaluate("x", &r, &common::node(8)).verdict, Verdict::Pass);
}

#[test]
fn gpu_fabric_fails_on_fabric_manager_state_and_sxids() {
    let res = eval("gpu_fabric", &healthy());
    assert_eq!(res.verdict, Verdict::Pass, "{}", res.message);
    let mut r = healthy();
    if let Some(fm) = r.fabric_manager.as_mut() {
        fm.state = "failed".into();
    }
    r.gpus[1].fabric = Some(kiln_checks::probe::FabricState {
        state: "In Progress".into(),
        status: "N/A".into(),
    });
    r.sxid_events = kiln_checks::xid::parse_sxid_log(
        "[ 1234.5] nvidia-nvswitch2: SXid (PCI:0000:a6:00.0): 24007, Fatal, Link 44 sourcetrack TCEN0 crumbstore ECC DBE Error\n",
    );
    let res = eval("gpu_fabric", &r);
    assert_fail(
        &res,
        &[
            "nvidia-fabricmanager is failed (must be active on an NVSwitch system)",
            "GPU 1 (GPU-",
            "NVLink fabric state \"In Progress\", status \"N/A\"",
            "NVSwitch 0000:a6:00.0: SXid 24007: Fatal, Link 44",
        ],
    );
    let sxid = res
        .findings
        .iter()
        .find(|f| f.code == "sxid_24007")
        .expect("sxid");
    assert_eq!(
        (sxid.action, sxid.component.kind),
        (Action::Reboot, ComponentKind::Nvswitch)
    );
}

#[test]
fn gpu_ecc_fails_on_aggregate_and_sram_errors() {
    let mut r = healthy();
    if let Some(e) = r.gpus[1].ecc.as_mut() {
        e.aggregate_uncorrected = 3;
    }
    if let Some(e) = r.gpus[6].ecc_sram.as_mut() {
        e.aggregate_uncorrected = 1;
    }
    let res = eval("gpu_ecc", &r);
    assert_fail(
        &res,
        &[
            "GPU 1 (GPU-",
            "ECC aggregate (lifetime) uncorrected = 3 (max 0)",
            "GPU 6 (GPU-",
            "SRAM ECC aggregate uncorrected = 1 (max 0)",
        ],
    );
    assert_eq!(res.findings[1].action, Action::Rma);
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
