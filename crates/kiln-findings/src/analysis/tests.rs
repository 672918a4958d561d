use super::*;

const NODE: NodeInput<'static> = NodeInput {
    hostname: "gpu-a-07",
    bmc_address: "10.1.0.7",
};

fn gpu(i: u32) -> Component {
    Component::new(ComponentKind::Gpu)
        .index(i)
        .serial(Some(format!("16549220065{i:02}")))
        .uuid(Some(format!("GPU-{i}")))
        .pci(Some(format!("00000000:{:02X}:00.0", 0x18 + i)))
        .slot(Some(format!("SXM slot {}", i + 1)))
}

fn fail<'a>(name: &'a str, findings: &'a [Finding]) -> CheckInput<'a> {
    CheckInput {
        name,
        outcome: Outcome::Fail,
        message: "m",
        findings,
    }
}

fn error<'a>(name: &'a str, message: &'a str) -> CheckInput<'a> {
    CheckInput {
        name,
        outcome: Outcome::Error,
        message,
        findings: &[],
    }
}

fn pass(name: &str) -> CheckInput<'_> {
    CheckInput {
        name,
        outcome: Outcome::Pass,
        message: "",
        findings: &[],
    }
}

#[test]
fn findings_of_several_checks_on_one_gpu_are_one_component() {
    let remap = [Finding::new(
        gpu(3),
        "row_remap_failure",
        Action::Rma,
        "GPU 3: row-remap failure",
    )
    .with_evidence("rows remapped: 0 correctable, 8 uncorrectable; pending false, failure true")
    .with_counter("rows_remapped_uncorrectable", 8)];
    // DCGM names the GPU by index only, the kernel log by a sysfs-style PCI address.
    let dcgm = [Finding::new(
        Component::new(ComponentKind::Gpu).index(3),
        "DCGM_FR_FAULTY_MEMORY",
        Action::Rma,
        "GPU 3: faulty memory",
    )
    .with_evidence("DCGM_FR_FAULTY_MEMORY (52): Memory test found 3 faulty addresses")];
    let xid = [Finding::new(
        Component::new(ComponentKind::Gpu).pci(Some("0000:1b:00.0".into())),
        "xid_48",
        Action::ResetGpu,
        "GPU 0000:1b:00.0: Xid 48",
    )];
    let other = [Finding::new(
        gpu(5),
        "gpu_temperature",
        Action::Cooling,
        "GPU 5: 91 °C",
    )];
    let a = analyze(
        NODE,
        &[AttemptInput {
            attempt: 1,
            checks: vec![
                fail("gpu_row_remap", &remap),
                fail("dcgm_diag", &dcgm),
                fail("gpu_xid", &xid),
                fail("gpu_thermal", &other),
                pass("gpu_ecc"),
            ],
        }],
    );
    assert_eq!(a.components.len(), 2, "{:#?}", a.components);
    let g3 = &a.components[0];
    assert_eq!(g3.component.index, Some(3));
    assert_eq!(g3.component.serial.as_deref(), Some("1654922006503"));
    assert_eq!(g3.action, Action::Rma);
    assert_eq!(g3.findings.len(), 3);
    assert_eq!(
        g3.headline,
        "RMA candidate: GPU 3, serial 1654922006503, SXM slot 4: row remap failure + \
         DCGM_FR_FAULTY_MEMORY; run NVIDIA field diagnostic, attach nvidia-bug-report.log.gz"
    );
    assert_eq!(a.action, Some(Action::Rma));
    assert!(
        a.headline.ends_with("(and 1 more component)"),
        "{}",
        a.headline
    );
    assert_eq!(a.components[1].action, Action::Cooling);
    assert_eq!(a.attempts[0].failed.len(), 4);
}

#[test]
fn an_unreachable_node_is_one_finding_with_the_addresses_tried() {
    let mut checks = vec![error(
        "bmc_health",
        "bmc_health: GET /redfish/v1/Systems: cannot connect to the BMC: Connection refused",
    )];
    let ssh = "node unreachable: ssh root@10.0.0.7:22: Connection refused (os error 111)";
    let names: Vec<String> = (0..20).map(|i| format!("step{i}")).collect();
    for n in &names {
        checks.push(error(n, ssh));
    }
    let attempts: Vec<AttemptInput<'_>> = (1..=3)
        .map(|attempt| AttemptInput {
            attempt,
            checks: checks.clone(),
        })
        .collect();
    let a = analyze(NODE, &attempts);
    assert_eq!(a.components.len(), 1, "{:#?}", a.components);
    let node = &a.components[0];
    assert_eq!(node.component.kind, ComponentKind::Node);
    assert_eq!(node.findings.len(), 1);
    let f = &node.findings[0];
    assert_eq!(f.code, "unreachable");
    assert_eq!(f.attempts, [1, 2, 3]);
    assert!(
        f.message
            .starts_with("unreachable: BMC 10.1.0.7 and SSH root@10.0.0.7:22 refused"),
        "{}",
        f.message
    );
    assert!(
        f.message.contains("21 checks could not run"),
        "{}",
        f.message
    );
    assert_eq!(
        f.evidence.len(),
        3,
        "checks, then distinct errors: {:?}",
        f.evidence
    );
    assert!(
        f.evidence[0].starts_with("checks that could not run: bmc_health, step0,")
            && f.evidence[0].ends_with("and 9 more"),
        "{}",
        f.evidence[0]
    );
    // Fail and error are counted apart.
    assert_eq!(a.attempts[0].failed.len(), 0);
    assert_eq!(a.attempts[0].errored.len(), 21);
}

#[test]
fn different_gpus_failing_in_different_attempts_make_a_board_suspect() {
    let ecc = |i| {
        [
            Finding::new(gpu(i), "ecc_uncorrected_volatile", Action::ResetGpu, "ECC")
                .with_counter("ecc_volatile_uncorrected", u64::from(i) * 3),
        ]
    };
    let (e1, e5, e6) = (ecc(1), ecc(5), ecc(6));
    let a = analyze(
        NODE,
        &[
            AttemptInput {
                attempt: 1,
                checks: vec![fail("gpu_ecc", &e1)],
            },
            AttemptInput {
                attempt: 2,
                checks: vec![fail("gpu_ecc", &e5)],
            },
            AttemptInput {
                attempt: 3,
                checks: vec![fail("gpu_ecc", &e6)],
            },
        ],
    );
    assert_eq!(a.suspects.len(), 1);
    let s = &a.suspects[0];
    assert_eq!(s.component.kind, ComponentKind::Board);
    assert!(s.reason.starts_with("board/power suspect"), "{}", s.reason);
    assert!(s.reason.contains("attempt 2: GPU 5"), "{}", s.reason);
    let g1 = a
        .components
        .iter()
        .find(|c| c.component.index == Some(1))
        .expect("GPU 1");
    let results: Vec<_> = g1.attempts.iter().map(|a| a.result).collect();
    assert_eq!(
        results,
        [
            ComponentResult::Fail,
            ComponentResult::Clear,
            ComponentResult::Clear
        ]
    );

    // The same GPU each time is that GPU, not the board; its counters are a trend.
    let grow = |n| {
        [
            Finding::new(gpu(2), "ecc_uncorrected_volatile", Action::ResetGpu, "ECC")
                .with_counter("ecc_volatile_uncorrected", n),
        ]
    };
    let (g_a, g_b) = (grow(4), grow(9));
    let same = analyze(
        NODE,
        &[
            AttemptInput {
                attempt: 1,
                checks: vec![fail("gpu_ecc", &g_a)],
            },
            AttemptInput {
                attempt: 2,
                checks: vec![fail("gpu_ecc", &g_b)],
            },
        ],
    );
    assert!(same.suspects.is_empty());
    let trend = &same.components[0].counters[0];
    assert_eq!(trend.name, "ecc_volatile_uncorrected");
    assert_eq!(trend.values, [(1, 4), (2, 9)]);
    assert!(trend.growing());
    assert_eq!(same.components[0].findings[0].attempts, [1, 2]);
}

#[test]
fn checks_without_findings_get_one_from_their_name_and_words() {
    let f = fallback_finding("infiniband", "infiniband: mlx5_2 fw_ver 28.1 not allowed");
    assert_eq!(
        (f.component.kind, f.action),
        (ComponentKind::Hca, Action::ReflashFirmware)
    );
    assert_eq!(f.message, "infiniband: mlx5_2 fw_ver 28.1 not allowed");
    let f = fallback_finding("ethernet", "enp225s0f0: operstate DOWN");
    assert_eq!(
        (f.component.kind, f.action),
        (ComponentKind::Nic, Action::ReseatCable)
    );
    let f = fallback_finding("command", "stress-ng exited 1");
    assert_eq!(
        (f.component.kind, f.action),
        (ComponentKind::Node, Action::Investigate)
    );
    assert_eq!(
        fallback_finding("custom", "inlet temperature 45 C").action,
        Action::Cooling
    );

    // Errors other than connection failures are grouped by message.
    let timed_out = "run exceeded its timeout";
    let a = analyze(
        NODE,
        &[AttemptInput {
            attempt: 1,
            checks: vec![
                error(
                    "dcgm_diag",
                    "dcgm_diag: `dcgmi diag -r 3` did not finish within 900.0 s",
                ),
                error("command", timed_out),
                error("stress", timed_out),
            ],
        }],
    );
    let messages: Vec<&str> = a
        .components
        .iter()
        .flat_map(|c| c.findings.iter().map(|f| f.message.as_str()))
        .collect();
    assert_eq!(
        messages,
        [
            "dcgm_diag could not run: `dcgmi diag -r 3` did not finish within 900.0 s",
            "2 checks could not run: run exceeded its timeout"
        ]
    );
    assert_eq!(analyze(NODE, &[]).headline, "no findings");
}

#[test]
fn analyses_round_trip_through_json() {
    let f = [Finding::new(
        gpu(0),
        "xid_79",
        Action::Reboot,
        "fell off the bus",
    )];
    let a = analyze(
        NODE,
        &[AttemptInput {
            attempt: 1,
            checks: vec![fail("gpu_xid", &f)],
        }],
    );
    let back: Analysis =
        serde_json::from_str(&serde_json::to_string(&a).expect("ser")).expect("de");
    assert_eq!(back, a);
    assert_eq!(
        normalize_pci("00000000:3B:00.0"),
        normalize_pci("0000:3b:00.0")
    );
}
