//! Telemetry under load: a `gpu_telemetry` step samples `kiln probe --sample` while the stress
//! step it names runs (here `sleep` through a real local shell), then judges the samples.
//! The samples are the recorded H100 probe as it reads under load (fixtures/kiln), changed
//! where a case says.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kiln_checks::probe::{run_probe_mode, ProbeMode, ProbeReport, RecordedGpus, Violations};
use kiln_checks::{Action, CheckContext, CheckResult, LocalShell, Playbook, Verdict};

fn loaded() -> ProbeReport {
    let rec = RecordedGpus::from_json(&common::own_fixture("probe-h100-healthy.json"))
        .expect("fixture parses");
    let (mut r, _) = run_probe_mode(&rec, ProbeMode::Sample);
    for g in &mut r.gpus {
        // Under gpu-burn: Gen5 x16, near the power limit, no idle flag.
        g.throttle_reasons = Some(vec![]);
        if let Some(p) = g.pcie.as_mut() {
            p.generation_current = 5;
        }
        g.power_mw = Some(655_000);
        g.temperature_c = Some(71);
    }
    r
}

/// Writes the samples and a script that prints the next one each time it runs (the last
/// repeats), so successive samples differ as a real node's would.
fn sampler(dir: &Path, samples: &[ProbeReport]) -> String {
    for (i, s) in samples.iter().enumerate() {
        std::fs::write(
            dir.join(format!("s{i}.json")),
            serde_json::to_string(s).expect("json"),
        )
        .expect("write");
    }
    let last = samples.len() - 1;
    let script = format!(
        "n=$(cat {d}/n 2>/dev/null || echo 0); [ \"$n\" -gt {last} ] && n={last}; cat {d}/s$n.json; echo $((n+1)) > {d}/n\n",
        d = dir.display()
    );
    std::fs::write(dir.join("sample.sh"), script).expect("script");
    format!("sh {}/sample.sh", dir.display())
}

async fn run(samples: &[ProbeReport], extra: &str) -> CheckResult {
    let dir = tempfile::tempdir().expect("tempdir");
    let command = sampler(dir.path(), samples);
    let text = format!(
        "playbook: t\nchecks:\n - check: command\n   name: burn\n   command: sleep 2.2\n - check: gpu_telemetry\n   during: [burn]\n   interval_s: 1\n   command: {command}\n   power_limit_min_w: 700\n   pcie_generation_min: 5\n   pcie_width_min: 16\n{extra}"
    );
    let p = Playbook::parse(&text).unwrap_or_else(|e| panic!("{e}"));
    let ctx = CheckContext::new(
        common::node(8),
        tokio::time::Instant::now() + Duration::from_secs(30),
    )
    .with_shell(Arc::new(LocalShell::default()));
    let mut r = p.run(&ctx).await;
    assert_eq!(
        r.results[0].verdict,
        Verdict::Pass,
        "{}",
        r.results[0].message
    );
    r.results.remove(1)
}

#[tokio::test]
async fn steady_load_passes_and_keeps_the_samples() {
    let r = run(&[loaded()], "").await;
    assert_eq!(r.verdict, Verdict::Pass, "{}", r.message);
    let w = &r.measured["windows"][0];
    assert_eq!(w["step"], "burn");
    let taken = w["samples"].as_u64().expect("samples");
    assert!(
        (3..=5).contains(&taken),
        "a first, one a second, a last: {taken}"
    );
    assert_eq!(w["loaded_samples"], w["samples"]);
    assert_eq!(
        r.evidence["windows"][0]["kept"].as_array().map(Vec::len),
        Some(taken as usize)
    );
}

#[tokio::test]
async fn thermal_throttling_under_load_fails_with_the_violation_time() {
    let first = loaded();
    let mut hot = loaded();
    for g in &mut hot.gpus {
        if g.index == 4 {
            g.throttle_reasons = Some(vec!["hw_thermal_slowdown".into()]);
            g.violations_ns = Some(Violations {
                power: 0,
                thermal: 3_500_000_000,
            });
            g.temperature_c = Some(92);
        }
    }
    let r = run(&[first, hot], "   temperature_c_max: 87\n").await;
    assert_eq!(r.verdict, Verdict::Fail);
    let codes: Vec<&str> = r.findings.iter().map(|f| f.code.as_str()).collect();
    assert_eq!(
        codes,
        vec![
            "thermal_violation",
            "throttle_under_load",
            "gpu_temperature_under_load"
        ]
    );
    assert!(
        r.findings[0]
            .message
            .contains("thermal violation 3500 ms during burn (max 0 ms)"),
        "{}",
        r.findings[0].message
    );
    assert!(r.findings.iter().all(|f| f.action == Action::Cooling));
    assert!(r.findings.iter().all(|f| f.component.index == Some(4)));
}

#[tokio::test]
async fn a_power_cap_replays_and_a_slow_link_under_load_fail() {
    let first = loaded();
    let mut later = loaded();
    for g in &mut later.gpus {
        if g.index == 2 {
            g.power_limit_enforced_mw = Some(500_000);
            g.pcie_replays = Some(17);
            if let Some(p) = g.pcie.as_mut() {
                p.generation_current = 4;
            }
            g.nvlinks[3].replay_errors = Some(2);
        }
    }
    let r = run(&[first, later], "").await;
    assert_eq!(r.verdict, Verdict::Fail);
    let by = |code: &str| {
        r.findings
            .iter()
            .find(|f| f.code == code)
            .unwrap_or_else(|| panic!("no {code} in {:?}", r.findings))
    };
    assert_eq!(by("power_limit_low").action, Action::Config);
    assert!(by("power_limit_low")
        .message
        .contains("enforced power limit 500 W under load (burn), below 700 W"));
    assert!(by("pcie_replays_under_load").message.contains("grew by 17"));
    assert!(by("nvlink_errors_under_load").message.contains("grew by 2"));
    assert!(by("pcie_generation_under_load")
        .message
        .contains("PCIe Gen4 under load (burn) (min Gen5)"));
}

#[tokio::test]
async fn no_sample_under_load_is_an_error() {
    let mut idle = loaded();
    for g in &mut idle.gpus {
        g.throttle_reasons = Some(vec!["gpu_idle".into()]);
    }
    let r = run(&[idle], "").await;
    assert_eq!(r.verdict, Verdict::Error, "{}", r.message);
    assert!(
        r.message.contains("burn: no sample under load"),
        "{}",
        r.message
    );
}

#[test]
fn during_must_name_an_earlier_stress_step() {
    let e = Playbook::parse(
        "playbook: t\nchecks:\n - check: gpu_telemetry\n   during: [burn]\n - check: command\n   name: burn\n   command: sleep 1\n",
    )
    .expect_err("later step");
    assert_eq!(e.errors[0].field, "checks[0].during[0]");
    assert!(
        e.errors[0]
            .reason
            .contains("no earlier step named \"burn\""),
        "{e}"
    );
    let e = Playbook::parse(
        "playbook: t\nchecks:\n - check: gpu_ecc\n - check: gpu_telemetry\n   during: [gpu_ecc]\n",
    )
    .expect_err("not stress");
    assert!(e.errors[0].reason.contains("not a stress step"), "{e}");
}
