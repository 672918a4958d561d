//! The simulated fleet against the real checks, without a broker: each node's SSH server
//! and BMC reached through the agent's own access layer (`kiln_agent::access`: SshShell with
//! known_hosts, RedfishClient with a session and the fleet's CA) and the sim playbook run on
//! it. Healthy nodes pass every step; each fault fails exactly the step that should see it,
//! with the value in the message; a hung stress command is killed on the node; sessions are
//! closed afterwards.

use std::collections::BTreeMap;
use std::time::Duration;

use kiln_agent::access::NodeAccess;
use kiln_checks::{CheckContext, CheckResult, FirmwareBaseline, NodeTarget, Playbook, Verdict};
use kiln_manifest::NodeSpec;
use kiln_sim::{Fault, Fleet, FleetSpec, GpuModel};
use time::OffsetDateTime;

fn target(n: &NodeSpec) -> NodeTarget {
    NodeTarget {
        hostname: n.hostname.clone(),
        rack: n.rack.clone(),
        bmc_address: n.bmc_address.clone(),
        gpu_model: n.gpu_model.clone(),
        gpu_count: u32::from(n.gpu_count),
        firmware: FirmwareBaseline {
            bmc: Some(n.firmware_bmc.clone()),
            bios: Some(n.firmware_bios.clone()),
            gpu_vbios: Some(n.firmware_gpu_vbios.clone()),
            nic: Some(n.firmware_nic.clone()),
        },
        registered_at: OffsetDateTime::now_utc() - time::Duration::seconds(5),
        labels: Default::default(),
    }
}

async fn run(access: &NodeAccess, pb: &Playbook, n: &NodeSpec) -> BTreeMap<String, CheckResult> {
    let session = access
        .open(&n.hostname, &n.bmc_address, true, true)
        .await
        .expect("open");
    let mut ctx = CheckContext::new(target(n), tokio::time::Instant::now() + pb.timeout);
    ctx.shell = session.shell.clone();
    ctx.bmc = session.bmc.clone();
    let out = pb.run(&ctx).await;
    drop(ctx);
    session.close().await;
    out.results
        .into_iter()
        .map(|r| (r.name.clone(), r))
        .collect()
}

fn only_failing(results: &BTreeMap<String, CheckResult>) -> Vec<(&str, Verdict)> {
    results
        .iter()
        .filter(|(_, r)| r.verdict != Verdict::Pass)
        .map(|(n, r)| (n.as_str(), r.verdict))
        .collect()
}

/// The faults of a real H100/H200 node: (host, fault, the steps that fail, part of the first
/// one's message).
fn new_faults() -> Vec<(&'static str, Fault, Vec<&'static str>, &'static str)> {
    vec![
        (
            "host-0009",
            Fault::DcgmFail,
            vec!["dcgm_diag"],
            "Hardware / memory / GPU 3: Fail: Found 4 faulty memory elements on GPU 3 (DCGM_FR_FAULTY_MEMORY",
        ),
        (
            "host-0010",
            Fault::IbFlap,
            vec!["infiniband", "infiniband_after_stress"],
            "mlx5_3 (ib3): port ACTIVE but netdev operstate down, 47 carrier changes",
        ),
        (
            "host-0011",
            Fault::EthSlow,
            vec!["ethernet"],
            "enp97s0f0: link speed 100000 Mb/s, expected 200000 Mb/s",
        ),
        (
            "host-0012",
            Fault::Throttle,
            vec!["gpu_telemetry"],
            "GPU 6 (",
        ),
        (
            "host-0013",
            Fault::Xid79,
            vec!["gpu_xid", "gpu_xid_after_stress"],
            "Xid 79 (GPU has fallen off the bus; NVIDIA: RESTART_BM, reboot the node)",
        ),
        (
            "host-0014",
            Fault::NvlinkDown,
            vec!["gpu_nvlink", "gpu_nvlink_after_stress"],
            "NVLink(s) [7] inactive",
        ),
        (
            "host-0015",
            Fault::PsuFail,
            vec!["bmc_chassis"],
            "PSU 1 Health Critical (Power supply 'PSU 1' has failed.)",
        ),
        (
            "host-0016",
            Fault::SmartCritical,
            vec!["disk_health", "disk_health_after_stress"],
            "/dev/nvme0 (test model): critical warning 0x04 (reliability degraded)",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_checks_see_healthy_nodes_pass_and_each_fault_fail_its_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec = FleetSpec::new(dir.path().join("sim"))
        .with_fault("host-0002", Fault::Ecc)
        .with_fault("host-0003", Fault::StuckIb)
        .with_fault("host-0004", Fault::FirmwareDrift)
        .with_fault("host-0004", Fault::SelCritical)
        .with_fault("host-0005", Fault::Unreachable)
        .with_fault("host-0006", Fault::FlakyFirst(1))
        .with_fault("host-0007", Fault::RowRemap)
        .with_fault("host-0008", Fault::Hang);
    for (host, fault, _, _) in new_faults() {
        spec = spec.with_fault(host, fault);
    }
    spec.racks = 2;
    spec.nodes_per_rack = 8;
    let fleet = Fleet::start(spec).await.expect("fleet starts");
    let nodes = fleet.manifest();
    assert_eq!(nodes.len(), 16);
    for f in [
        "manifest.csv",
        "agent.toml",
        "agent_ed25519",
        "known_hosts",
        "bmc-ca.pem",
        "fleet.json",
    ] {
        assert!(fleet.out_dir().join(f).is_file(), "{f} written");
    }
    let toml = std::fs::read_to_string(fleet.agent_config_path()).expect("agent.toml");
    let cfg_path = dir.path().join("agent-check.toml");
    std::fs::write(&cfg_path, &toml).expect("copy");
    let cfg = kiln_agent::AgentConfig::load(&cfg_path).expect("agent.toml loads and validates");
    assert_eq!(cfg.playbooks.len(), 3);

    let access = NodeAccess::new(fleet.ssh_settings(), fleet.redfish_settings()).expect("access");
    let pb = Playbook::load_file(&fleet.playbooks()[0]).expect("sim h100 playbook");
    assert_eq!(pb.gpu_models, vec!["H100-SXM".to_string()]);

    let healthy = run(&access, &pb, &nodes[0]).await;
    assert_eq!(only_failing(&healthy), vec![], "{healthy:#?}");
    assert_eq!(healthy.len(), pb.steps.len());
    assert_eq!(healthy["infiniband"].measured["hca_count"], 8);
    assert_eq!(healthy["gpu_inventory"].verdict, Verdict::Pass);

    let ecc = run(&access, &pb, &nodes[1]).await;
    assert_eq!(
        only_failing(&ecc),
        vec![
            ("gpu_ecc", Verdict::Fail),
            ("gpu_ecc_after_stress", Verdict::Fail)
        ]
    );
    assert!(
        ecc["gpu_ecc"].message.contains("GPU 3") && ecc["gpu_ecc"].message.contains('2'),
        "{}",
        ecc["gpu_ecc"].message
    );

    let ib = run(&access, &pb, &nodes[2]).await;
    assert_eq!(
        only_failing(&ib),
        vec![
            ("infiniband", Verdict::Fail),
            ("infiniband_after_stress", Verdict::Fail)
        ]
    );
    assert!(
        ib["infiniband"]
            .message
            .contains("mlx5_8 port 1: state \"2: INIT\", expected ACTIVE"),
        "{}",
        ib["infiniband"].message
    );

    let bmc = run(&access, &pb, &nodes[3]).await;
    assert_eq!(
        only_failing(&bmc),
        vec![("bmc_firmware", Verdict::Fail), ("bmc_sel", Verdict::Fail)]
    );
    assert!(
        bmc["bmc_firmware"]
            .message
            .contains("version \"P79 v1.44\", baseline \"P79 v1.45\""),
        "{}",
        bmc["bmc_firmware"].message
    );
    assert!(
        bmc["bmc_sel"]
            .message
            .contains("Critical: Power supply PSU2 failure detected"),
        "{}",
        bmc["bmc_sel"].message
    );

    let gone = run(&access, &pb, &nodes[4]).await;
    assert!(
        gone.values().all(|r| r.verdict == Verdict::Error),
        "{gone:#?}"
    );
    assert!(
        gone["bmc_health"].message.contains("connect"),
        "{}",
        gone["bmc_health"].message
    );

    let flaky1 = run(&access, &pb, &nodes[5]).await;
    assert_eq!(only_failing(&flaky1), vec![("ethernet", Verdict::Fail)]);
    assert!(
        flaky1["ethernet"]
            .message
            .contains("enp225s0f0: operstate DOWN, expected UP"),
        "{}",
        flaky1["ethernet"].message
    );
    let flaky2 = run(&access, &pb, &nodes[5]).await;
    assert_eq!(only_failing(&flaky2), vec![], "the second run passes");

    let remap = run(&access, &pb, &nodes[6]).await;
    assert_eq!(
        only_failing(&remap),
        vec![
            ("gpu_row_remap", Verdict::Fail),
            ("gpu_row_remap_after_stress", Verdict::Fail)
        ]
    );

    // Each of the faults a real H100 node shows, on the check that sees it.
    for (i, (host, fault, failing, part)) in new_faults().into_iter().enumerate() {
        let r = run(&access, &pb, &nodes[8 + i]).await;
        let names: Vec<&str> = only_failing(&r).iter().map(|(n, _)| *n).collect();
        assert_eq!(names, failing, "{host} ({fault}): {r:#?}");
        let first = &r[failing[0]];
        assert_eq!(first.verdict, Verdict::Fail, "{host}: {}", first.message);
        assert!(
            first.message.contains(part),
            "{host}: {part:?} not in {}",
            first.message
        );
        assert!(!first.findings.is_empty(), "{host}: findings");
    }

    // The hanging node: a stress step with a 1 s timeout ends as Error, and the agent's
    // kill reaches the node.
    let hang_pb = Playbook::parse(
        "playbook: hang\ntimeout_s: 30\nchecks:\n - check: dcgm_diag\n   timeout_s: 1\n",
    )
    .expect("playbook");
    let hung = run(&access, &hang_pb, &nodes[7]).await;
    assert_eq!(hung["dcgm_diag"].verdict, Verdict::Error);
    assert!(
        hung["dcgm_diag"]
            .message
            .contains("did not finish within 1.0 s"),
        "{}",
        hung["dcgm_diag"].message
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fleet.stats().remote_kills == 0 {
        assert!(std::time::Instant::now() < deadline, "no remote kill seen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Everything the runs opened was closed.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = fleet.stats();
        if s.ssh_connections_open == 0 && fleet.open_redfish_sessions() == 0 {
            assert!(s.redfish_sessions_total >= 7, "{s:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "sessions left open: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_nodes_and_bad_input() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec = FleetSpec::new(dir.path().join("cpu"));
    spec.racks = 1;
    spec.nodes_per_rack = 2;
    spec.gpu_model = GpuModel::None;
    let fleet = Fleet::start(spec).await.expect("fleet");
    let nodes = fleet.manifest();
    assert_eq!((nodes[0].gpu_count, nodes[0].gpu_model.as_str()), (0, ""));
    let access = NodeAccess::new(fleet.ssh_settings(), fleet.redfish_settings()).expect("access");
    let pb = Playbook::load_file(&fleet.playbooks()[2]).expect("sim cpu playbook");
    assert!(pb.gpu_models.is_empty());
    let r = run(&access, &pb, &nodes[0]).await;
    assert_eq!(only_failing(&r), vec![], "{r:#?}");
    fleet.stop().await;

    let spec = FleetSpec::new(dir.path().join("bad")).with_fault("nope", Fault::Ecc);
    let err = Fleet::start(spec)
        .await
        .err()
        .expect("unknown host refused");
    assert!(err.to_string().contains("not in the fleet"), "{err}");
    let mut spec = FleetSpec::new(dir.path().join("bad2"));
    spec.fixtures = Some(dir.path().join("no-fixtures"));
    if std::env::var("KILN_FIXTURES").is_err() {
        let err = Fleet::start(spec)
            .await
            .err()
            .expect("missing fixtures refused");
        assert!(format!("{err:#}").contains("no-fixtures"), "{err:#}");
    }
}
