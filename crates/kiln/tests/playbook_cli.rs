//! `kiln playbook check|run`: validation with line and field, and a local run of the GPU
//! steps of the shipped H100 playbook on probe reports made by the real probe code from a
//! recorded NVML reading (healthy, then with uncorrectable ECC errors on one GPU).
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kiln_checks::{run_probe, RecordedGpus};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap()
}

/// A `kiln probe` report of the recorded H100 node, after `edit` changed the recording.
fn probe_file(dir: &Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let text =
        std::fs::read_to_string(repo().join("fixtures/kiln/probe-h100-healthy.json")).unwrap();
    let mut recording: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut recording);
    let gpus = RecordedGpus::from_json(&recording.to_string()).unwrap();
    let (report, _) = run_probe(&gpus);
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec(&report).unwrap()).unwrap();
    path
}

const GPU_STEPS: [&str; 12] = [
    "run",
    "playbooks/h100-sxm.yaml",
    "--only",
    "gpu_inventory",
    "--only",
    "gpu_ecc",
    "--only",
    "gpu_row_remap",
    "--only",
    "gpu_firmware",
    "--gpu-vbios",
    "96.00.74.00.01",
];

#[test]
fn gpu_steps_pass_on_a_healthy_report_and_fail_on_ecc_errors() {
    let dir = tempfile::tempdir().unwrap();
    let healthy = probe_file(dir.path(), "healthy.json", |_| {});
    let probe = format!("cat {}", healthy.display());
    let mut args = vec!["playbook"];
    args.extend(GPU_STEPS);
    args.extend(["--probe-command", &probe, "--gpu-count", "8"]);
    let out = kiln(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    for step in ["gpu_inventory", "gpu_ecc", "gpu_row_remap", "gpu_firmware"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("pass") && l.contains(step)),
            "{step}: {stdout}"
        );
    }
    // gpu_ecc_after_stress also starts with gpu_ecc: --only is a prefix, as documented.
    assert!(stdout.contains("gpu_ecc_after_stress"), "{stdout}");

    let broken = probe_file(dir.path(), "ecc.json", |r| {
        r["snapshot"]["gpus"][3]["ecc"]["volatile_uncorrected"] = serde_json::json!(2);
    });
    let probe = format!("cat {}", broken.display());
    let mut args = vec!["playbook"];
    args.extend(GPU_STEPS);
    args.extend(["--probe-command", &probe, "--gpu-count", "8", "--json"]);
    let out = kiln(&args);
    assert_eq!(out.status.code(), Some(2), "a failed check exits 2");
    let run: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(run["verdict"], "fail");
    let ecc = run["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "gpu_ecc")
        .unwrap();
    assert_eq!(ecc["verdict"], "fail");
    assert!(ecc["message"].as_str().unwrap().contains("GPU 3"), "{ecc}");
    assert!(
        !ecc["measured"].is_null(),
        "measured values are kept: {ecc}"
    );
}

#[test]
fn a_probe_that_cannot_run_is_an_error_not_a_failure() {
    let out = kiln(&[
        "playbook",
        "run",
        "playbooks/h100-sxm.yaml",
        "--only",
        "gpu_ecc",
        "--probe-command",
        "/nonexistent/kiln-probe",
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ERROR"));
}

#[test]
fn check_validates_shipped_playbooks_and_refuses_bad_ones_with_line_and_field() {
    let out = kiln(&[
        "playbook",
        "check",
        "playbooks/h100-sxm.yaml",
        "playbooks/h200-sxm.yaml",
        "playbooks/cpu-smoke.yaml",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).matches(": ok").count(),
        3
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "playbook: x\ntimeout_s: 0\nchecks:\n  - check: nope\n",
    )
    .unwrap();
    let out = kiln(&["playbook", "check", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2: timeout_s"), "{err}");
    assert!(err.contains("line 4: checks[0].check"), "{err}");

    let out = kiln(&[
        "playbook",
        "run",
        "playbooks/h100-sxm.yaml",
        "--only",
        "zzz",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no step"));
}
