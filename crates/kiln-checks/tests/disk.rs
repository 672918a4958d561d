//! Disk checks on recorded output: smartctl `--json` of ten NVMe drives (fixtures/smartctl,
//! from facebookresearch/gcm) and fio's JSON of a write/verify pass and of a verify failure
//! (fixtures/kiln, recorded with fio 3.33), each read through a real local shell.

mod common;

use std::sync::Arc;
use std::time::Duration;

use kiln_checks::{
    Action, CheckContext, CheckResult, ComponentKind, LocalShell, Playbook, Verdict,
};

async fn run(step: &str) -> CheckResult {
    let p =
        Playbook::parse(&format!("playbook: t\nchecks:\n{step}")).unwrap_or_else(|e| panic!("{e}"));
    let ctx = CheckContext::new(
        common::node(8),
        tokio::time::Instant::now() + Duration::from_secs(20),
    )
    .with_shell(Arc::new(LocalShell::default()));
    p.run(&ctx).await.results.remove(0)
}

async fn smart(dump: &str, extra: &str) -> CheckResult {
    let dir = common::fixtures().join("smartctl").join(dump);
    run(&format!(
        " - check: disk_health\n   command: cat {}/nvme*.json\n{extra}",
        dir.display()
    ))
    .await
}

#[tokio::test]
async fn ten_healthy_nvme_drives_pass() {
    let r = smart("learn_good", "   devices_min: 10\n").await;
    assert_eq!(r.verdict, Verdict::Pass, "{}", r.message);
    assert_eq!(r.message, "10 disks healthy");
    assert_eq!(r.measured["devices"][0]["available_spare"], 100);
}

#[tokio::test]
async fn a_drive_out_of_spare_fails_as_an_rma() {
    let r = smart("learn_bad_nvme9", "").await;
    assert_eq!(r.verdict, Verdict::Fail);
    assert_eq!(
        r.message,
        "/dev/nvme9 (test model): available spare 0% below its threshold 11%"
    );
    let f = &r.findings[0];
    assert_eq!(
        (f.component.kind, f.action),
        (ComponentKind::Disk, Action::Rma)
    );
    assert_eq!(f.component.name.as_deref(), Some("/dev/nvme9"));
    assert!(
        f.evidence[0].contains("available_spare 0% (threshold 11%)"),
        "{:?}",
        f.evidence
    );
}

#[tokio::test]
async fn missing_smart_data_and_missing_drives() {
    let r = smart("learn_missing_smartdata", "").await;
    assert_eq!(r.verdict, Verdict::Error, "{}", r.message);
    assert!(r.message.contains("no SMART health data"), "{}", r.message);
    let r = smart("learn_good", "   devices_min: 12\n").await;
    assert_eq!(r.verdict, Verdict::Fail);
    assert_eq!(r.message, "10 disks report SMART data, expected 12");
    let r = run(" - check: disk_health\n   command: \"echo 'smartctl: command not found' >&2\"\n")
        .await;
    assert_eq!(r.verdict, Verdict::Error);
}

#[tokio::test]
async fn a_critical_warning_fails_naming_its_bits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = std::fs::read_to_string(common::fixtures().join("smartctl/learn_good/nvme3.json"))
        .expect("fixture");
    let mut doc: serde_json::Value = serde_json::from_str(&text).expect("json");
    doc["nvme_smart_health_information_log"]["critical_warning"] = 0x04.into();
    doc["nvme_smart_health_information_log"]["media_errors"] = 12.into();
    let path = dir.path().join("nvme3.json");
    std::fs::write(&path, doc.to_string()).expect("write");
    let r = run(&format!(
        " - check: disk_health\n   command: cat {}\n",
        path.display()
    ))
    .await;
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(
        r.message
            .contains("/dev/nvme3 (test model): critical warning 0x04 (reliability degraded)"),
        "{}",
        r.message
    );
    assert!(
        r.message.contains("12 media errors (max 0)"),
        "{}",
        r.message
    );
}

#[tokio::test]
async fn fio_write_verify_passes_and_a_verify_mismatch_fails() {
    let kiln = common::fixtures().join("kiln");
    let r = run(&format!(
        " - check: fio_verify\n   command: cat {}\n",
        kiln.join("fio-verify-pass.json").display()
    ))
    .await;
    assert_eq!(r.verdict, Verdict::Pass, "{}", r.message);
    assert_eq!(r.measured["jobs"][0]["error"], 0);
    assert!(r.measured["jobs"][0]["bw_kib_s"].as_u64() > Some(0));
    // fio exits 1 on the mismatch and says why on stderr; the JSON carries error 84.
    let r = run(&format!(
        " - check: fio_verify\n   command: cat {}; cat {} >&2; exit 1\n",
        kiln.join("fio-verify-fail.json").display(),
        kiln.join("fio-verify-fail.stderr").display()
    ))
    .await;
    assert_eq!(r.verdict, Verdict::Fail);
    assert_eq!(
        r.message,
        "fio job kiln-verify on /tmp/fiot/target.dat: data read back differs from what was written (verify failed)"
    );
    assert!(r.findings[0].evidence[0].starts_with("crc32c: verify failed at file"));
    let r =
        run(" - check: fio_verify\n   command: \"echo 'fio: command not found' >&2; exit 127\"\n")
            .await;
    assert_eq!(r.verdict, Verdict::Error);
}
