//! NIC checks on real node snapshots (fixtures/sysfs, from facebookresearch/gcm):
//! each InfiniBand snapshot is laid out as a directory tree and read through a real
//! shell, exactly as the agent reads /sys over SSH; Ethernet runs `ip -j` output through
//! the ethernet step's command.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kiln_checks::nic::parse_ib_dump;
use kiln_checks::{Action, CheckContext, CheckResult, LocalShell, Playbook, Verdict};
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
    ib_with(name, hca_count, "   fw_versions: [\"20.31.2354\"]\n").await
}

/// The infiniband step on a laid-out snapshot, with `extra` fields.
async fn ib_with(name: &str, hca_count: u32, extra: &str) -> CheckResult {
    let dir = tempfile::tempdir().expect("tempdir");
    lay_out(name, dir.path());
    run_step(&format!(
        "playbook: t\nchecks:\n - check: infiniband\n   hca_count: {hca_count}\n   rate_gbps: 200\n   sysfs_root: {}\n{extra}",
        dir.path().display()
    ))
    .await
}

/// The recorded node's slots (learn_good): PCI address -> HCA and netdev.
const BINDINGS: &str = "   bindings:\n     \"0000:0c:00.0\": {hca: mlx5_0, netdev: ib0, slot: HCA-1}\n     \"0000:12:00.0\": {hca: mlx5_1, netdev: ib1, slot: HCA-2}\n     \"0000:4b:00.0\": {hca: mlx5_2, netdev: ib2}\n";

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
    // INIT is the subnet manager's, not the cable's: its own state and action.
    assert!(r
        .message
        .contains("the subnet manager has not configured the port"));
    assert!(r
        .findings
        .iter()
        .all(|f| f.code == "ib_port_init" && f.action == Action::Config));
    let f = &r.findings[0];
    assert_eq!(f.component.name.as_deref(), Some("mlx5_6"));
    assert_eq!(f.component.pci_address.as_deref(), Some("0000:8d:00.0"));
}

#[tokio::test]
async fn infiniband_flapping_netdev_behind_an_active_port_fails() {
    // gcm's learn_ib_intf_operstate_down: mlx5_6 port 1 ACTIVE/LinkUp, its netdev ib4 down
    // after 98 carrier changes. (Its fw_ver is anonymised, so no firmware list here.)
    let r = ib_with("learn_ib_intf_operstate_down", 8, "").await;
    assert_eq!(r.verdict, Verdict::Fail);
    assert_eq!(
        r.message,
        "mlx5_6 (ib4): port ACTIVE but netdev operstate down, 98 carrier changes: a flapping link"
    );
    assert_eq!(r.findings[0].action, Action::ReseatCable);
    assert_eq!(
        r.findings[0].evidence[0],
        "ib4: operstate down, carrier_changes 98"
    );
    // The good snapshot's 3 carrier changes are within the limit; a stricter one fails.
    let r = ib_with("learn_good", 8, "   carrier_changes_max: 2\n").await;
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(
        r.message
            .contains("mlx5_0 (ib0): 3 carrier changes (max 2)"),
        "{}",
        r.message
    );
}

#[tokio::test]
async fn infiniband_slot_bound_to_another_hca_fails() {
    let r = ib_with("learn_good", 8, BINDINGS).await;
    assert_eq!(r.verdict, Verdict::Pass, "{}", r.message);
    // gcm's learn_ib_misbound_if: the HCA in 0000:0c:00.0 is mlx5_1 (netdev ib1) and the one
    // in 0000:12:00.0 is mlx5_0 (ib0); 0000:4b:00.0 holds mlx5_12.
    let r = ib_with("learn_ib_misbound_if", 8, BINDINGS).await;
    assert_eq!(r.verdict, Verdict::Fail);
    for part in [
        "slot HCA-1 (0000:0c:00.0) is bound to mlx5_1, expected mlx5_0",
        "slot HCA-1 (0000:0c:00.0): mlx5_1 has netdev ib1, expected ib0",
        "slot HCA-2 (0000:12:00.0) is bound to mlx5_0, expected mlx5_1",
        "slot 0000:4b:00.0 (0000:4b:00.0) is bound to mlx5_12, expected mlx5_2",
    ] {
        assert!(r.message.contains(part), "{part:?} not in {}", r.message);
    }
    let misbind = r
        .findings
        .iter()
        .find(|f| f.code == "ib_misbind")
        .expect("misbind");
    assert_eq!(misbind.component.slot.as_deref(), Some("HCA-1"));
}

#[tokio::test]
async fn infiniband_port_errors_growing_during_the_run_fail() {
    // Two infiniband steps in one run with a command between them that raises a counter, as
    // stress would: the second compares with the first.
    let dir = tempfile::tempdir().expect("tempdir");
    lay_out("learn_good", dir.path());
    let counters = dir
        .path()
        .join("bus/pci/devices/0000:0c:00.0/infiniband/mlx5_0/ports/1/counters");
    std::fs::create_dir_all(&counters).expect("mkdir");
    for c in [
        "symbol_error",
        "link_downed",
        "link_error_recovery",
        "port_rcv_errors",
    ] {
        std::fs::write(counters.join(c), "0\n").expect("write");
    }
    let root = dir.path().display();
    let text = format!(
        "playbook: t\nchecks:\n - check: infiniband\n   hca_count: 8\n   rate_gbps: 200\n   sysfs_root: {root}\n - check: command\n   name: stress\n   command: echo 7 > {}/symbol_error\n - check: infiniband\n   name: infiniband_after_stress\n   hca_count: 8\n   rate_gbps: 200\n   sysfs_root: {root}\n",
        counters.display()
    );
    let p = Playbook::parse(&text).unwrap_or_else(|e| panic!("{e}"));
    let ctx = CheckContext::new(
        common::node(8),
        tokio::time::Instant::now() + Duration::from_secs(20),
    )
    .with_shell(Arc::new(LocalShell::default()));
    let run = p.run(&ctx).await;
    assert_eq!(
        run.results[0].verdict,
        Verdict::Pass,
        "{}",
        run.results[0].message
    );
    let after = &run.results[2];
    assert_eq!(after.verdict, Verdict::Fail);
    assert_eq!(
        after.message,
        "mlx5_0 port 1: symbol_error grew by 7 since the run's first InfiniBand check (max 0)"
    );
    assert_eq!(after.findings[0].evidence[0], "symbol_error: 0 -> 7");
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

/// The ethernet step on a gcm Ethernet snapshot: `ip -j link` from `intf_status`, and a sysfs
/// tree with each interface's speed (`link_speed`) and permanent MAC (`phys_macaddr`).
async fn eth_with(name: &str, extra: &str) -> CheckResult {
    let dir = tempfile::tempdir().expect("tempdir");
    let links = dir.path().join("ip-link.json");
    let snap = snapshot(name);
    std::fs::write(
        &links,
        serde_json::to_string(&snap["intf_status"]).expect("json"),
    )
    .expect("write");
    let sys = dir.path().join("sys");
    for (key, file) in [
        ("link_speed", "speed"),
        ("phys_macaddr", "bonding_slave/perm_hwaddr"),
    ] {
        for (ifname, v) in snap[key].as_object().into_iter().flatten() {
            let path = sys.join("class/net").join(ifname).join(file);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&path, format!("{}\n", v.as_str().expect("text"))).expect("write");
        }
    }
    run_step(&format!(
        "playbook: t\nchecks:\n - check: ethernet\n   interfaces: [front0, enp97s0f0, enp225s0f0]\n   mtu: 9192\n   command: cat {}\n   sysfs_root: {}\n{extra}",
        links.display(),
        sys.display()
    ))
    .await
}

async fn eth(name: &str) -> CheckResult {
    eth_with(name, "").await
}

/// Speeds and MACs as the gcm manifest (`intf_ifcfg`) of the learn nodes gives them.
const ETH_EXPECT: &str = "   speeds_mbps: {front0: 400000, enp97s0f0: 200000, enp225s0f0: 200000}\n   macs: {enp97s0f0: HWADDR1, enp225s0f0: HWADDR2}\n";

#[tokio::test]
async fn ethernet_good_passes_on_speed_carrier_and_mac() {
    let r = eth_with("eth_learn_good", ETH_EXPECT).await;
    assert_eq!(r.verdict, Verdict::Pass, "{}", r.message);
    assert_eq!(r.measured["interfaces"][1]["speed_mbps"], 200000);
    assert_eq!(r.measured["interfaces"][1]["mac"], "hwaddr1");
}

#[tokio::test]
async fn ethernet_degraded_speed_fails() {
    let r = eth_with(
        "eth_learn_degraded_intf",
        "   speeds_mbps: {front0: 400000, enp97s0f0: 200000, enp225s0f0: 200000}\n",
    )
    .await;
    assert_eq!(r.verdict, Verdict::Fail);
    for part in [
        "front0: link speed 200000 Mb/s, expected 400000 Mb/s",
        "enp97s0f0: link speed 100000 Mb/s, expected 200000 Mb/s",
        "enp225s0f0: link speed 100000 Mb/s, expected 200000 Mb/s",
    ] {
        assert!(r.message.contains(part), "{part:?} not in {}", r.message);
    }
    assert!(r.findings.iter().all(|f| f.action == Action::ReseatCable));
}

#[tokio::test]
async fn ethernet_swapped_nic_fails_on_its_mac_and_missing_carrier() {
    let r = eth_with("eth_learn_nic_swap", ETH_EXPECT).await;
    assert_eq!(r.verdict, Verdict::Fail);
    for part in [
        "front0: operstate DOWN, expected UP",
        "enp97s0f0: MAC address, expected HWADDR1 (a swapped NIC or cable)",
        "enp225s0f0: MAC address, expected HWADDR2",
    ] {
        assert!(r.message.contains(part), "{part:?} not in {}", r.message);
    }
    // A manifest label names the expected MAC per node, over the playbook's.
    let mut ctx_node = common::node(8);
    ctx_node
        .labels
        .insert("mac.enp97s0f0".into(), "address".into());
    let dump = kiln_checks::nic::eth::parse_eth_dump(
        "[{\"ifname\": \"enp97s0f0\", \"operstate\": \"UP\", \"mtu\": 9192, \"flags\": [\"UP\", \"LOWER_UP\"]}]\npermaddr\tenp97s0f0\taddress\n",
    )
    .expect("dump");
    let expect = match &Playbook::parse("playbook: t\nchecks:\n - check: ethernet\n   interfaces: [enp97s0f0]\n   mtu: 9192\n   macs: {enp97s0f0: HWADDR1}\n").expect("pb").steps[0].spec {
        kiln_checks::playbook::Spec::Ethernet(e) => e.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        expect.evaluate("ethernet", &dump, &ctx_node.labels).verdict,
        Verdict::Pass
    );
}

#[tokio::test]
async fn ethernet_missing_member_fails() {
    let r = eth("eth_learn_missing_intf").await;
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(
        r.message.contains("enp225s0f0: interface missing"),
        "{}",
        r.message
    );
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
