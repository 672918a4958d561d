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

/// sushy-static (scripts/install-test-deps) serving a DMTF mockup on a free port; killed on drop.
struct Sushy(std::process::Child, u16);

impl Drop for Sushy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sushy(mockup: &str) -> Sushy {
    let bin = repo().join(".venv/bin/sushy-static");
    assert!(
        bin.exists(),
        "no {}: run scripts/install-test-deps",
        bin.display()
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(&bin)
        .args(["-i", "127.0.0.1", "-p", &port.to_string(), "-m"])
        .arg(repo().join("fixtures/redfish").join(mockup))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let s = Sushy(child, port);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "sushy-static did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    s
}

#[test]
fn redfish_steps_run_by_hand_against_a_bmc() {
    let s = sushy("public-rackmount1");
    let url = format!("http://127.0.0.1:{}", s.1);
    let out = kiln(&[
        "playbook",
        "run",
        "playbooks/cpu-smoke.yaml",
        "--only",
        "bmc",
        "--bmc",
        &url,
        "--firmware-bmc",
        "1.45.455b66-rev4",
        "--firmware-bios",
        "P79 v1.45",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "pass   bmc_firmware",
        "FAIL   bmc_sel",
        "System May be Melting",
        "FAIL   bmc_chassis",
        "PSU 1 Health Warning",
    ] {
        assert!(stdout.contains(line), "{line:?} not in:\n{stdout}");
    }
    // A user needs a password file; a bad CA file is refused before anything runs.
    let out = kiln(&[
        "playbook",
        "run",
        "playbooks/cpu-smoke.yaml",
        "--bmc",
        &url,
        "--bmc-user",
        "x",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--bmc-password-file"));
}

#[test]
fn nic_steps_run_by_hand_on_a_saved_sysfs_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let snap: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("fixtures/sysfs/learn_stuck_ib_intf.json")).unwrap(),
    )
    .unwrap();
    for (path, content) in snap.as_object().unwrap() {
        let dest = dir.path().join(path.strip_prefix("/sys/").unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::write(dest, content.as_str().unwrap()).unwrap();
    }
    let out = kiln(&[
        "playbook",
        "run",
        "playbooks/sim/h100-sxm.yaml",
        "--only",
        "infiniband",
        "--sysfs-root",
        dir.path().to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    assert!(
        stdout.contains(
            "mlx5_6 port 1: state \"2: INIT\", expected ACTIVE (link up, but the subnet manager"
        ),
        "{stdout}"
    );
}
