//! NIC checks on real node snapshots (fixtures/sysfs, from facebookresearch/gcm):
//! each InfiniBand snapshot is laid out as a directory tree and read through a real
//! shell, exactly as the agent reads /sys over SSH; Ethernet runs `ip -j` output through
//! the ethernet step's command.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kiln_checks::nic::parse_ib_dump;
use kiln_checks::{CheckContext, CheckResult, LocalShell, Playbook, Verdict};
use serde_json::Value;

fn snapshot(name: &str) -> Value {
    let path = common::fixtures()
        .join("sysfs")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture is JSON")
}

/// Writes every `"/sys/..."` entry of a snapshot under `root` (`/sys` -> `root`).
fn lay_out(name: &str, root: &Path) {
    let snap = snapshot(name);
    let files = snap.as_object().expect("path -> content");
    assert!(files.len() > 100, "{name}: suspiciously small snapshot");
    for (path, content) in files {
        let rel = path.strip_prefix("/sys/").expect("sysfs path");
        let dest = root.join(rel);
        std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
        std::fs::write(&dest, content.as_str().expect("text content")).expect("write");
    }
}

async fn run_step(playbook: &str) -> CheckResult {
    let p = Playbook::parse(playbook).unwrap_or_else(|e| panic!("{e}"));
    let ctx = CheckContext::new(
        common::node(8),
        tokio::time::Instant::now() + Duration::from_secs(20),
    )
    .with_shell(Arc::new(LocalShell::default()));
    let mut run = p.run(&ctx).await;
    assert_eq!(run.results.len(), 1);
    run.results.remove(0)
}

async fn ib(name: &str, hca_count: u32) -> CheckResult {
    let dir = tempfile::tempdir().expect("tempdir");
    lay_out(name, dir.path());
    run_step(&format!(
        "playbook: t\nchecks:\n - check: infiniband\n   hca_count: {hca_count}\n   rate_gbps: 200\n   fw_versions: [\"20.31.2354\"]\n   sysfs_root: {}\n",
        dir.path().display()
    ))
    .await
}

#[tokio::test]
async fn infiniband_learn_good_passes() {
    let r = ib("learn_good", 8).await;
    assert_eq!(r.verdict, Verdict::Pass, "{}", r.message);
    assert_eq!(r.measured["hca_count"], 8);
    assert_eq!(r.measured["ports_checked"], 8);
    assert_eq!(r.evidence["mlx5_8"]["fw_ver"], "20.31.2354");
    assert_eq!(
        r.evidence["mlx5_8"]["ports"]["1"]["rate"],
        "200 Gb/sec (4X HDR)"
    );
}

#[tokio::test]
async fn infiniband_wrong_hca_count_fails() {
    let r = ib("learn_good", 9).await;
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(r.message.contains("8 InfiniBand HCAs found (mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_6, mlx5_7, mlx5_8, mlx5_9), expected 9"), "{}", r.message);
}

#[tokio::test]
async fn infiniband_bad_rate_fails_naming_port_and_rate() {
    let r = ib("learn_ib_intf_bad_rate", 8).await;
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(
        r.message
            .contains("mlx5_0 port 1: rate \"100 Gb/sec (4X EDR)\", expected 200 Gb/sec"),
        "{}",
        r.message
    );
    let problems: Vec<&str> = r.measured["problems"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    // Every one of the 8 ports is slow (and the anonymised fw_ver is not an allowed version).
    assert_eq!(
        problems
            .iter()
            .filter(|p| p.contains("expected 200 Gb/sec"))
            .count(),
        8
    );
    assert!(
        problems.contains(&"mlx5_9: firmware \"fw_ver\", expected one of [\"20.31.2354\"]"),
        "{problems:?}"
    );
}

#[tokio::test]
async fn infiniband_stuck_port_fails_naming_port_and_state() {
    let r = ib("learn_stuck_ib_intf", 8).await;
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(
        r.message
            .contains("mlx5_6 port 1: state \"2: INIT\", expected ACTIVE"),
        "{}",
        r.message
    );
    assert!(
        r.message
            .contains("mlx5_8 port 1: state \"2: INIT\", expected ACTIVE"),
        "{}",
        r.message
    );
    assert_eq!(r.measured["problems"].as_array().map(Vec::len), Some(2));
}

#[test]
fn class_and_pci_paths_of_one_hca_merge() {
    let dump = "/sys/class/infiniband/mlx5_0/fw_ver\t28.39.1002\n\
                /sys/bus/pci/devices/0000:0c:00.0/infiniband/mlx5_0/fw_ver\t28.39.1002\n\
                /sys/class/infiniband/mlx5_0/ports/1/state\t4: ACTIVE\n\
                /sys/bus/pci/devices/0000:0c:00.0/infiniband/mlx5_0/ports/1/rate\t400 Gb/sec (4X NDR)\n\
                garbage line\n";
    let hcas = parse_ib_dump(dump);
    assert_eq!(hcas.len(), 1);
    let port = &hcas["mlx5_0"].ports[&1];
    assert_eq!(port.state.as_deref(), Some("4: ACTIVE"));
    assert_eq!(port.rate_gbps(), Some(400.0));
}

async fn eth(name: &str) -> CheckResult {
    let dir = tempfile::tempdir().expect("tempdir");
    let links = dir.path().join("ip-link.json");
    let snap = snapshot(name);
    std::fs::write(
        &links,
        serde_json::to_string(&snap["intf_status"]).expect("json"),
    )
    .expect("write");
    run_step(&format!(
        "playbook: t\nchecks:\n - check: ethernet\n   interfaces: [front0, enp97s0f0, enp225s0f0]\n   mtu: 9192\n   command: cat {}\n",
        links.display()
    ))
    .await
}

#[tokio::test]
async fn ethernet_learn_good_passes() {
    let r = eth("eth_learn_good").await;
    assert_eq!(r.verdict, Verdict::Pass, "{}", r.message);
    assert_eq!(r.measured["interfaces"].as_array().map(Vec::len), Some(3));
    assert_eq!(r.message, "3 interfaces UP with MTU 9192");
}

#[tokio::test]
async fn ethernet_down_interface_fails_naming_it() {
    let r = eth("eth_learn_down_intf").await;
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(
        r.message
            .contains("enp225s0f0: operstate DOWN, expected UP"),
        "{}",
        r.message
    );
    assert!(
        r.message.contains("enp225s0f0: MTU 1500, expected 9192"),
        "{}",
        r.message
    );
    assert!(!r.message.contains("enp97s0f0"), "{}", r.message);
}

#[tokio::test]
async fn ethernet_bad_mtu_fails_naming_interface_and_value() {
    let r = eth("eth_learn_mtu_bad").await;
    assert_eq!(r.verdict, Verdict::Fail);
    for i in ["front0", "enp97s0f0", "enp225s0f0"] {
        assert!(
            r.message.contains(&format!("{i}: MTU 1500, expected 9192")),
            "{}",
            r.message
        );
    }
}

#[tokio::test]
async fn ethernet_missing_interface_and_bad_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let links = dir.path().join("ip.json");
    std::fs::write(
        &links,
        r#"[{"ifname":"lo","operstate":"UNKNOWN","mtu":65536}]"#,
    )
    .expect("write");
    let r = run_step(&format!(
        "playbook: t\nchecks:\n - check: ethernet\n   interfaces: [eth0]\n   mtu: 1500\n   command: cat {}\n",
        links.display()
    ))
    .await;
    assert_eq!(r.verdict, Verdict::Fail);
    assert_eq!(r.message, "eth0: interface missing");
    let r = run_step("playbook: t\nchecks:\n - check: ethernet\n   interfaces: [eth0]\n   mtu: 1500\n   command: echo not json\n").await;
    assert_eq!(r.verdict, Verdict::Error);
    assert!(r.message.contains("not `ip -j link` JSON"), "{}", r.message);
}
