//! Playbook loading: the shipped playbooks load with the thresholds the design asks for;
//! every bad playbook is refused with the line, the field and the reason.

use std::path::PathBuf;
use std::time::Duration;

use kiln_checks::gpu::GpuThresholds;
use kiln_checks::playbook::Spec;
use kiln_checks::{LoadError, Playbook};

fn playbook_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../playbooks")
}

fn load(name: &str) -> Playbook {
    let path = playbook_dir().join(name);
    Playbook::load_file(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn step<'p>(p: &'p Playbook, name: &str) -> &'p Spec {
    &p.steps
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no step {name} in {}", p.name))
        .spec
}

/// The single error of a bad playbook (asserting there is exactly one).
fn only_error(text: &str) -> LoadError {
    let err = Playbook::parse(text).expect_err("must be refused");
    assert_eq!(err.errors.len(), 1, "expected one error, got: {err}");
    err.errors[0].clone()
}

fn assert_error(text: &str, line: usize, field: &str, reason_has: &str) {
    let e = only_error(text);
    assert_eq!(e.line, line, "line of: {e}");
    assert_eq!(e.field, field, "field of: {e}");
    assert!(
        e.reason.contains(reason_has),
        "reason of: {e} (wanted {reason_has:?})"
    );
    // The display form names all three too.
    let shown = e.to_string();
    let prefix = if field.is_empty() {
        format!("line {line}: ")
    } else {
        format!("line {line}: {field}: ")
    };
    assert!(shown.starts_with(&prefix), "{shown}");
}

#[test]
fn h100_playbook_loads_with_design_thresholds() {
    let p = load("h100-sxm.yaml");
    assert_eq!(p.name, "h100-sxm");
    assert_eq!(p.gpu_models, vec!["H100-SXM".to_string()]);
    // 12 h burn-in; the run's budget is the sum of its steps.
    assert_eq!(p.burn_in, Duration::from_secs(43_200));
    let sum: Duration = p.steps.iter().map(|s| s.timeout).sum();
    assert_eq!(p.timeout, sum);
    assert!(
        p.timeout > Duration::from_secs(2 * 43_200),
        "{:?}",
        p.timeout
    );
    assert_eq!(p.probe.command, "kiln probe");
    match step(&p, "gpu_ecc") {
        Spec::Gpu(GpuThresholds::Ecc(e)) => {
            assert_eq!(e.uncorrected_volatile_max, 0);
            assert_eq!(e.uncorrected_aggregate_max, Some(0));
            assert_eq!(e.sram_uncorrected_max, Some(0));
        }
        other => panic!("{other:?}"),
    }
    match step(&p, "gpu_row_remap") {
        Spec::Gpu(GpuThresholds::RowRemap(r)) => {
            assert!(!r.pending_allowed);
            assert!(!r.failure_allowed);
        }
        other => panic!("{other:?}"),
    }
    match step(&p, "gpu_retired_pages") {
        Spec::Gpu(GpuThresholds::RetiredPages(r)) => assert_eq!(r.max, 10),
        other => panic!("{other:?}"),
    }
    match step(&p, "gpu_xid") {
        Spec::Gpu(GpuThresholds::Xid(x)) => assert!(x.allowed.is_empty()),
        other => panic!("{other:?}"),
    }
    match step(&p, "gpu_nvlink") {
        Spec::Gpu(GpuThresholds::Nvlink(n)) => {
            assert!(n.all_active);
            assert_eq!(n.links_min, Some(18));
            assert_eq!(
                (n.replay_errors_max, n.recovery_errors_max, n.crc_errors_max),
                (Some(0), Some(0), Some(0))
            );
        }
        other => panic!("{other:?}"),
    }
    match step(&p, "gpu_pcie") {
        Spec::Gpu(GpuThresholds::Pcie(x)) => {
            assert_eq!((x.generation_min, x.width_min), (Some(5), Some(16)));
            assert!(x.width_equal_max);
        }
        other => panic!("{other:?}"),
    }
    match step(&p, "infiniband") {
        Spec::Infiniband(ib) => assert_eq!((ib.hca_count, ib.rate_gbps), (8, 400)),
        other => panic!("{other:?}"),
    }
    match step(&p, "gpu_burn") {
        Spec::Stress(kiln_checks::stress::StressSpec::GpuBurn { command, .. }) => {
            assert_eq!(command, "cd /opt/gpu-burn && ./gpu_burn -tc 43200")
        }
        other => panic!("{other:?}"),
    }
    let gpu_burn = p
        .steps
        .iter()
        .find(|s| s.name == "gpu_burn")
        .expect("gpu_burn");
    assert_eq!(gpu_burn.timeout, Duration::from_secs(43_200 + 3_600));
    match step(&p, "gpu_telemetry") {
        Spec::Telemetry(t) => {
            assert_eq!(
                t.during,
                vec!["dcgm_diag".to_string(), "gpu_burn".to_string()]
            );
            assert_eq!(t.power_limit_min_w, Some(700));
        }
        other => panic!("{other:?}"),
    }
    for kind in [
        "bmc_chassis",
        "disk_health",
        "fio_verify",
        "gpu_fabric",
        "stress_ng",
    ] {
        assert!(
            p.steps.iter().any(|s| s.name == kind),
            "{kind} in the GPU playbook"
        );
    }
    // Order: BMC first, stress before the after-stress checks.
    let names: Vec<&str> = p.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names[0], "bmc_health");
    let pos = |n: &str| names.iter().position(|x| *x == n).expect("present");
    assert!(pos("dcgm_diag") < pos("gpu_ecc_after_stress"));
    assert!(pos("gpu_ecc") < pos("dcgm_diag"));
    assert_eq!(p.checks().len(), p.steps.len());
}

#[test]
fn h200_and_cpu_playbooks_load() {
    let p = load("h200-sxm.yaml");
    assert_eq!(p.gpu_models, vec!["H200-SXM".to_string()]);
    match step(&p, "gpu_inventory") {
        Spec::Gpu(GpuThresholds::Inventory(i)) => {
            assert_eq!(i.count, Some(8));
            assert_eq!(i.names, vec!["NVIDIA H200".to_string()]);
        }
        other => panic!("{other:?}"),
    }
    let c = load("cpu-smoke.yaml");
    assert!(c.gpu_models.is_empty());
    assert!(
        c.steps.iter().all(|s| !s.kind.starts_with("gpu_")),
        "no GPU checks on CPU nodes"
    );
    assert!(c.steps.iter().any(|s| s.name == "stress_ng"));
    // The simulated fleet's playbooks load too.
    for sim in [
        "sim/h100-sxm.yaml",
        "sim/h200-sxm.yaml",
        "sim/cpu-smoke.yaml",
    ] {
        load(sim);
    }
}

#[test]
fn burn_in_duration_is_substituted_and_sizes_the_step() {
    let p = Playbook::parse(
        "playbook: t\nburn_in_s: 600\nchecks:\n - check: command\n   command: stress-ng --timeout {burn_in_s}s\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.steps[0].timeout, Duration::from_secs(600 + 3600));
    assert_eq!(p.timeout, p.steps[0].timeout);
    match &p.steps[0].spec {
        Spec::Stress(kiln_checks::stress::StressSpec::Command { command, .. }) => {
            assert_eq!(command, "stress-ng --timeout 600s")
        }
        other => panic!("{other:?}"),
    }
    assert_error(
        "playbook: t\nburn_in_s: 5\nchecks:\n - check: gpu_ecc\n",
        2,
        "burn_in_s",
        "out of range: 5",
    );
}

const GOOD_HEAD: &str = "playbook: t\ntimeout_s: 600\nchecks:\n";

#[test]
fn unknown_check_is_refused_with_line_and_field() {
    let text = format!("{GOOD_HEAD}  - check: gpu_ecc\n  - check: gpu_eccc\n    max: 1\n");
    assert_error(&text, 5, "checks[1].check", "unknown check \"gpu_eccc\"");
}

#[test]
fn unknown_field_is_refused_with_line_and_field() {
    let text = format!("{GOOD_HEAD}  - check: gpu_ecc\n    uncorrected_volatile_mx: 0\n");
    assert_error(
        &text,
        5,
        "checks[0].uncorrected_volatile_mx",
        "unknown field",
    );
    let e = only_error(&text);
    assert!(
        e.reason.contains("uncorrected_volatile_max"),
        "lists the known fields: {e}"
    );
}

#[test]
fn unknown_top_level_field_is_refused() {
    let text = format!("playbok: x\n{GOOD_HEAD}  - check: gpu_ecc\n");
    assert_error(&text, 1, "playbok", "unknown field");
}

#[test]
fn wrong_threshold_type_is_refused() {
    let text = format!("{GOOD_HEAD}  - check: gpu_retired_pages\n    max: ten\n");
    assert_error(
        &text,
        5,
        "checks[0].max",
        "expected an integer from 0 to 1000, got a string \"ten\"",
    );
    let text = format!("{GOOD_HEAD}  - check: gpu_nvlink\n    all_active: yes\n");
    assert_error(&text, 5, "checks[0].all_active", "expected true or false");
    let text = format!("{GOOD_HEAD}  - check: gpu_xid\n    allowed: 13\n");
    assert_error(&text, 5, "checks[0].allowed", "expected a list of integers");
    let text = format!("{GOOD_HEAD}  - check: gpu_retired_pages\n    max: 2.5\n");
    assert_error(&text, 5, "checks[0].max", "got a number \"2.5\"");
}

#[test]
fn threshold_out_of_range_is_refused() {
    let text = format!("{GOOD_HEAD}  - check: gpu_retired_pages\n    max: -1\n");
    assert_error(&text, 5, "checks[0].max", "out of range: -1");
    let text = format!("{GOOD_HEAD}  - check: gpu_thermal\n    temperature_c_max: 500\n");
    assert_error(
        &text,
        5,
        "checks[0].temperature_c_max",
        "out of range: 500, expected an integer from 30 to 120",
    );
    let text = format!("{GOOD_HEAD}  - check: gpu_pcie\n    generation_min: 9\n");
    assert_error(&text, 5, "checks[0].generation_min", "out of range");
}

#[test]
fn list_items_are_checked_one_by_one() {
    let text = format!(
        "{GOOD_HEAD}  - check: gpu_thermal\n    temperature_c_max: 85\n    throttle_forbidden:\n      - hw_slowdown\n      - hw_slow\n"
    );
    assert_error(
        &text,
        8,
        "checks[0].throttle_forbidden[1]",
        "unknown value \"hw_slow\"",
    );
    let text = format!("{GOOD_HEAD}  - check: gpu_xid\n    allowed: [13, 31, x]\n");
    assert_error(&text, 5, "checks[0].allowed[2]", "expected an integer");
}

#[test]
fn missing_required_field_names_the_step() {
    let text =
        format!("{GOOD_HEAD}  - check: gpu_ecc\n  - check: gpu_thermal\n    power_w_max: 700\n");
    assert_error(
        &text,
        5,
        "checks[1].temperature_c_max",
        "required field is missing",
    );
    let text = format!("{GOOD_HEAD}  - name: x\n");
    assert_error(&text, 4, "checks[0].check", "required field is missing");
    let text = "playbook: t\n".to_string();
    assert_error(&text, 1, "checks", "required field is missing");
}

#[test]
fn duplicate_step_names_are_refused() {
    let text = format!("{GOOD_HEAD}  - check: gpu_ecc\n  - check: gpu_ecc\n");
    assert_error(
        &text,
        5,
        "checks[1].name",
        "duplicate step name \"gpu_ecc\" (first at line 4)",
    );
}

#[test]
fn duplicate_keys_are_refused() {
    let text = format!("{GOOD_HEAD}  - check: gpu_retired_pages\n    max: 1\n    max: 2\n");
    assert_error(&text, 6, "max", "duplicate key");
}

#[test]
fn step_timeout_cannot_exceed_the_run() {
    let text = format!("{GOOD_HEAD}  - check: dcgm_diag\n    timeout_s: 3600\n");
    assert_error(
        &text,
        5,
        "checks[0].timeout_s",
        "out of range: 3600, expected an integer from 1 to 600",
    );
}

#[test]
fn structural_problems_are_refused() {
    assert_error(
        "- just\n- a list\n",
        1,
        "",
        "expected a mapping, got a list",
    );
    assert_error(
        "playbook: t\nchecks: gpu_ecc\n",
        2,
        "checks",
        "expected a list of checks",
    );
    assert_error(
        "playbook: t\nchecks: []\n",
        2,
        "checks",
        "at least one check",
    );
    assert_error("playbook: t\nchecks:\n  - [1, 2\n", 4, "", "not valid YAML");
    assert_error("", 1, "", "empty playbook");
    let text = format!("{GOOD_HEAD}  - check: scripted\n    outcome: maybe\n");
    assert_error(
        &text,
        5,
        "checks[0].outcome",
        "unknown value \"maybe\"; expected one of: pass, fail, error, hang, panic",
    );
}

#[test]
fn every_problem_is_reported_in_line_order() {
    let text = format!(
        "{GOOD_HEAD}  - check: gpu_ecc\n    bogus: 1\n  - check: nope\n  - check: gpu_retired_pages\n    max: 99999\n"
    );
    let err = Playbook::parse(&text).expect_err("refused");
    let got: Vec<(usize, &str)> = err
        .errors
        .iter()
        .map(|e| (e.line, e.field.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (5, "checks[0].bogus"),
            (6, "checks[1].check"),
            (8, "checks[2].max")
        ]
    );
}

#[test]
fn load_file_names_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, format!("{GOOD_HEAD}  - check: gpu_eccc\n")).expect("write");
    let err = Playbook::load_file(&path).expect_err("refused");
    let shown = err.to_string();
    assert!(shown.contains("bad.yaml"), "{shown}");
    assert!(
        shown.contains("line 4: checks[0].check: unknown check"),
        "{shown}"
    );
    let missing = Playbook::load_file(&dir.path().join("absent.yaml")).expect_err("missing");
    assert!(missing.to_string().contains("cannot read"), "{missing}");
}
