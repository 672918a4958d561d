//! Redfish checks against a real emulator: `sushy-static` (sushy-tools, installed into
//! .venv by scripts/install-test-deps) serving the DMTF public mockups in
//! fixtures/redfish. Each test starts its own emulator on a free loopback port and
//! kills it at the end. Client behaviour the emulator cannot show (basic and session auth,
//! retries, timeouts) is tested against a small scripted HTTP server on loopback.
//!
//! Env: KILN_SUSHY_STATIC (path to sushy-static; default .venv/bin/sushy-static),
//! KILN_ALLOW_NO_SUSHY=1 (skip the emulator tests instead of failing when it is missing),
//! (the mockups are read from the repository's fixtures/).

mod common;

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln_checks::redfish::{Auth, RedfishClient, RedfishConfig, RedfishError, TlsTrust};
use kiln_checks::{CheckContext, NodeTarget, Playbook, PlaybookRun, Verdict};
use time::macros::datetime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn sushy_bin() -> Option<PathBuf> {
    let path = match std::env::var_os("KILN_SUSHY_STATIC") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/sushy-static"),
    };
    if path.exists() {
        return Some(path);
    }
    if std::env::var("KILN_ALLOW_NO_SUSHY").as_deref() == Ok("1") {
        eprintln!(
            "SKIPPED: no sushy-static at {} (KILN_ALLOW_NO_SUSHY=1)",
            path.display()
        );
        return None;
    }
    panic!(
        "no sushy-static at {}: run scripts/install-test-deps (or set KILN_SUSHY_STATIC, \
         or KILN_ALLOW_NO_SUSHY=1 to skip these tests)",
        path.display()
    );
}

fn free_port() -> u16 {
    let l = StdListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// A running emulator; killed (by its pid) and reaped on drop.
struct Sushy {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Sushy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sushy {
    fn start(mockup: &str, tls: Option<(&Path, &Path)>) -> Option<Sushy> {
        let bin = sushy_bin()?;
        let mockups = common::fixtures().join("redfish").join(mockup);
        assert!(
            mockups.join("index.json").exists(),
            "missing mockup {}",
            mockups.display()
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let mut cmd = Command::new(&bin);
        cmd.args(["-i", "127.0.0.1", "-p", &port.to_string(), "-m"])
            .arg(&mockups)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("sushy.err")).expect("log"));
        if let Some((cert, key)) = tls {
            cmd.arg("-c").arg(cert).arg("-k").arg(key);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        let mut s = Sushy {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(s);
            }
            if let Ok(Some(status)) = s.child.try_wait() {
                let err =
                    std::fs::read_to_string(s._dir.path().join("sushy.err")).unwrap_or_default();
                panic!("sushy-static exited with {status}: {err}");
            }
            assert!(
                Instant::now() < deadline,
                "sushy-static did not listen on {port} within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn config(&self, scheme: &str, tls: TlsTrust) -> RedfishConfig {
        RedfishConfig {
            base_url: format!("{scheme}://127.0.0.1:{}", self.port),
            auth: Auth::None,
            tls,
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
            retries: 1,
            retry_backoff: Duration::from_millis(50),
        }
    }

    fn client(&self) -> Arc<RedfishClient> {
        Arc::new(RedfishClient::new(self.config("http", TlsTrust::SystemRoots)).expect("client"))
    }
}

const ALL_BMC: &str = "playbook: t\nchecks:\n - check: bmc_health\n - check: bmc_firmware\n - check: bmc_sel\n - check: bmc_chassis\n - check: bmc_inventory\n";

async fn run_bmc(playbook: &str, node: NodeTarget, bmc: Arc<RedfishClient>) -> PlaybookRun {
    let p = Playbook::parse(playbook).unwrap_or_else(|e| panic!("{e}"));
    let ctx = CheckContext::new(node, tokio::time::Instant::now() + Duration::from_secs(60))
        .with_bmc(bmc);
    p.run(&ctx).await
}

fn result<'r>(run: &'r PlaybookRun, name: &str) -> &'r kiln_checks::CheckResult {
    run.results.iter().find(|r| r.name == name).expect("result")
}

fn has(msg: &str, part: &str) {
    assert!(msg.contains(part), "message {msg:?} lacks {part:?}");
}

#[tokio::test]
async fn rackmount1_fails_on_its_rollup_its_critical_log_entries_and_its_psu() {
    let Some(sushy) = Sushy::start("public-rackmount1", None) else {
        return;
    };
    let run = run_bmc(ALL_BMC, common::node(0), sushy.client()).await;
    assert_eq!(run.verdict, Verdict::Fail);

    let health = result(&run, "bmc_health");
    assert_eq!(health.verdict, Verdict::Fail, "{}", health.message);
    has(
        &health.message,
        "system 437XR1138R2: HealthRollup Warning (allowed [\"OK\"]): Sensor 'CPU1 Temp' reading of 44 (Cel) is above the 42 upper caution threshold.",
    );
    assert!(!health.message.contains("PowerState"), "{}", health.message);

    let sel = result(&run, "bmc_sel");
    assert_eq!(sel.verdict, Verdict::Fail);
    has(&sel.message, "log 437XR1138R2/Log1 entry 1 at 2012-03-07T14:44:00Z: Critical: Temperature threshold exceeded");
    has(
        &sel.message,
        "log 437XR1138R2/Log1 entry 2 at 2012-03-07T14:45:00Z: Critical",
    );
    // The Manager's own log, with an `Event` entry, is read too.
    has(
        &sel.message,
        "log Managers/BMC/Log entry 1 at 2012-03-07T14:44:00Z: Critical: System May be Melting (Event.1.0.TempWayTooHot)",
    );
    assert_eq!(sel.measured["entries_scanned"], 3);
    assert_eq!(
        sel.evidence["entries"][0]["EntryCode"],
        "Upper Critical - going high"
    );
    let melt = sel
        .findings
        .iter()
        .find(|f| f.message.contains("Melting"))
        .expect("manager entry");
    assert_eq!(melt.action, kiln_checks::Action::Cooling);

    // PSU 1 has a predicted failure and PSU 2 is absent, so redundancy is lost.
    let chassis = result(&run, "bmc_chassis");
    assert_eq!(chassis.verdict, Verdict::Fail, "{}", chassis.message);
    has(
        &chassis.message,
        "chassis 1U: PSU 1 Health Warning (Power supply 'PSU 1' has a predicted failure condition.): replace the power supply",
    );
    has(
        &chassis.message,
        "chassis 1U: power supply redundancy Failover is UnavailableOffline / OK",
    );
    let psu = &chassis.findings[0];
    assert_eq!(psu.component.kind, kiln_checks::ComponentKind::Psu);
    assert_eq!(psu.component.serial.as_deref(), Some("3488247"));
    assert_eq!(psu.component.slot.as_deref(), Some("PSU 1"));
    assert_eq!(psu.action, kiln_checks::Action::Rma);
    // Every sensor was read; none is past a critical threshold (CPU1 Temp is past caution).
    assert!(chassis.measured["sensors_read"].as_u64() > Some(40));
    assert!(!chassis.message.contains("sensor"), "{}", chassis.message);

    // FirmwareInventory says `Members@odata.count: 2` but lists 3; BIOS is the third.
    let fw = result(&run, "bmc_firmware");
    assert_eq!(fw.verdict, Verdict::Pass, "{}", fw.message);
    assert_eq!(fw.measured["members_listed"], 3);
    assert_eq!(fw.measured["members_odata_count"], 2);
    assert_eq!(fw.measured["compared"][1]["id"], "BIOS");

    // No GPU processors and no PCIe devices exposed: noted, not failed, for a 0-GPU node.
    let inv = result(&run, "bmc_inventory");
    assert_eq!(inv.verdict, Verdict::Pass, "{}", inv.message);
    has(&inv.message, "0 GPU(s), 0 PCIe device(s)");
    has(&inv.message, "the BMC exposes no GPU processors");
}

#[tokio::test]
async fn firmware_differing_from_the_baseline_fails_naming_component_and_versions() {
    let Some(sushy) = Sushy::start("public-rackmount1", None) else {
        return;
    };
    let mut node = common::node(0);
    node.firmware.bios = Some("P79 v1.46".into());
    node.firmware.nic = None;
    let run = run_bmc(
        "playbook: t\nchecks:\n - check: bmc_firmware\n - check: bmc_firmware\n   name: nic_fw\n   inventory_ids:\n     nic: SS\n",
        node,
        sushy.client(),
    )
    .await;
    let fw = result(&run, "bmc_firmware");
    assert_eq!(fw.verdict, Verdict::Fail);
    assert_eq!(
        fw.message,
        "bios (Contoso BIOS Firmware): version \"P79 v1.45\", baseline \"P79 v1.46\""
    );
    // No baseline in the manifest: cannot judge, so Error (retry), not Fail.
    let nic = result(&run, "nic_fw");
    assert_eq!(nic.verdict, Verdict::Error);
    has(&nic.message, "no nic firmware baseline");
}

#[tokio::test]
async fn firmware_of_any_inventory_id_is_compared_with_the_playbook_version() {
    let Some(sushy) = Sushy::start("public-rackmount1", None) else {
        return;
    };
    // The rackmount lists BMC, SS (a storage subsystem) and BIOS; a prefix matches any.
    let run = run_bmc(
        "playbook: t\nchecks:\n - check: bmc_firmware\n   inventory_ids: {}\n   versions:\n     SS: \"9.9.9\"\n     \"BI*\": \"P79 v1.45\"\n     HGX_FW_NVSwitch_0: \"96.10.5A.00.01\"\n",
        common::node(0),
        sushy.client(),
    )
    .await;
    let fw = &run.results[0];
    assert_eq!(fw.verdict, Verdict::Fail);
    has(&fw.message, "SS (Contoso Simple Storage Firmware): version");
    has(&fw.message, "baseline \"9.9.9\"");
    has(
        &fw.message,
        "HGX_FW_NVSwitch_0: no FirmwareInventory member \"HGX_FW_NVSwitch_0\"",
    );
    assert!(
        !fw.message.contains("BIOS ("),
        "BIOS matches its baseline: {}",
        fw.message
    );
    assert_eq!(fw.findings.len(), 2);
    assert_eq!(fw.findings[0].action, kiln_checks::Action::ReflashFirmware);
}

#[tokio::test]
async fn sel_entries_before_registration_are_history() {
    let Some(sushy) = Sushy::start("public-rackmount1", None) else {
        return;
    };
    let mut node = common::node(0);
    node.registered_at = datetime!(2020-06-01 00:00 UTC);
    let run = run_bmc(
        "playbook: t\nchecks:\n - check: bmc_sel\n",
        node,
        sushy.client(),
    )
    .await;
    let sel = &run.results[0];
    assert_eq!(sel.verdict, Verdict::Pass, "{}", sel.message);
    assert_eq!(sel.measured["forbidden_before_registration"], 3);
    assert_eq!(sel.measured["entries_scanned"], 3);
}

#[tokio::test]
async fn tower_is_healthy_but_has_downtrained_pcie_links() {
    let Some(sushy) = Sushy::start("public-tower", None) else {
        return;
    };
    let mut node = common::node(2);
    node.registered_at = datetime!(2020-06-01 00:00 UTC);
    let run = run_bmc(ALL_BMC, node.clone(), sushy.client()).await;
    for name in ["bmc_health", "bmc_firmware", "bmc_sel"] {
        let r = result(&run, name);
        assert_eq!(r.verdict, Verdict::Pass, "{name}: {}", r.message);
    }
    // Its PSU 1 reports Warning; both bays are populated and redundancy holds.
    let chassis = result(&run, "bmc_chassis");
    assert_eq!(chassis.verdict, Verdict::Fail);
    assert_eq!(
        chassis.message,
        "chassis Tower: PSU 1 Health Warning: replace the power supply"
    );
    assert_eq!(chassis.measured["psus_present"], 2);
    assert_eq!(
        result(&run, "bmc_health").measured["systems"][0]["health_rollup"],
        "OK"
    );
    assert_eq!(result(&run, "bmc_firmware").measured["members_listed"], 2);

    // Judged on what the links support: lanes in use below MaxLanes fail; a current
    // generation below the maximum (Gen2 of Gen3 at idle) does not.
    let inv = result(&run, "bmc_inventory");
    assert_eq!(inv.verdict, Verdict::Fail);
    has(
        &inv.message,
        "PCIe device Slot3 (PCI Device in Slot 3): x2 lanes in use, max x4",
    );
    has(&inv.message, "PCIe device Slot4");
    assert!(!inv.message.contains("Gen2"), "{}", inv.message);
    assert!(
        !inv.message.contains("GPU"),
        "both GPUs are present and OK: {}",
        inv.message
    );
    assert_eq!(inv.measured["gpus"].as_array().map(Vec::len), Some(2));
    assert_eq!(inv.measured["gpus"][0]["model"], "Nvidia(R) TU102");
    // System and chassis list the same 9 devices: counted once.
    assert_eq!(
        inv.measured["pcie_devices"].as_array().map(Vec::len),
        Some(9)
    );

    // Expecting 8 GPUs, or not caring about link width: the verdict follows.
    let mut eight = node.clone();
    eight.gpu_count = 8;
    let run8 = run_bmc(
        "playbook: t\nchecks:\n - check: bmc_inventory\n   pcie_at_max: false\n",
        eight,
        sushy.client(),
    )
    .await;
    assert_eq!(run8.results[0].verdict, Verdict::Fail);
    assert_eq!(
        run8.results[0].message,
        "the BMC lists 2 GPU(s) (GPU1, GPU2), expected 8"
    );
    let ok = run_bmc(
        "playbook: t\nchecks:\n - check: bmc_inventory\n   pcie_at_max: false\n",
        node.clone(),
        sushy.client(),
    )
    .await;
    assert_eq!(
        ok.results[0].verdict,
        Verdict::Pass,
        "{}",
        ok.results[0].message
    );

    // A minimum generation is compared with what each device supports.
    let gen = run_bmc(
        "playbook: t\nchecks:\n - check: bmc_inventory\n   pcie_at_max: false\n   pcie_generation_min: 4\n",
        node.clone(),
        sushy.client(),
    )
    .await;
    assert_eq!(gen.results[0].verdict, Verdict::Fail);
    has(
        &gen.results[0].message,
        "PCIe device IntegratedNIC (Simple Two-Port NIC): supports Gen3 at most (min Gen4)",
    );

    // Registered before the 2012 entries: the tower's Critical SEL entries count.
    let mut old = node;
    old.registered_at = datetime!(2012-01-01 00:00 UTC);
    let sel = run_bmc(
        "playbook: t\nchecks:\n - check: bmc_sel\n",
        old,
        sushy.client(),
    )
    .await;
    assert_eq!(sel.results[0].verdict, Verdict::Fail);
    has(
        &sel.results[0].message,
        "log 437XR1238R2/Log1 entry 1 at 2012-03-07T14:44:00Z: Critical",
    );
}

/// A throwaway CA and a BMC certificate it signed (SAN IP:127.0.0.1), made with openssl(1).
/// Returns (CA certificate, BMC certificate, BMC key).
fn site_ca_and_bmc_cert(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let p = |n: &str| dir.join(n);
    let ext = p("bmc.ext");
    std::fs::write(
        &ext,
        "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext");
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let steps: Vec<Vec<std::ffi::OsString>> = vec![
        [
            &["req", "-x509"][..],
            &ec[..],
            &["-days", "2", "-subj", "/CN=kiln test BMC CA", "-keyout"],
        ]
        .concat()
        .iter()
        .map(Into::into)
        .chain([p("ca.key").into(), "-out".into(), p("ca.crt").into()])
        .collect(),
        [
            &["req"][..],
            &ec[..],
            &["-subj", "/CN=127.0.0.1", "-keyout"],
        ]
        .concat()
        .iter()
        .map(Into::into)
        .chain([p("bmc.key").into(), "-out".into(), p("bmc.csr").into()])
        .collect(),
        ["x509", "-req", "-days", "2", "-CAcreateserial", "-in"]
            .iter()
            .map(Into::into)
            .chain([
                p("bmc.csr").into(),
                "-CA".into(),
                p("ca.crt").into(),
                "-CAkey".into(),
                p("ca.key").into(),
                "-extfile".into(),
                ext.clone().into(),
                "-out".into(),
                p("bmc.crt").into(),
            ])
            .collect(),
    ];
    for args in steps {
        let out = Command::new("openssl")
            .args(&args)
            .output()
            .expect("openssl(1) is installed by scripts/install-test-deps");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (p("ca.crt"), p("bmc.crt"), p("bmc.key"))
}

#[tokio::test]
async fn tls_trusts_the_given_ca_refuses_unknown_certs_and_can_opt_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, cert, key) = site_ca_and_bmc_cert(dir.path());
    let Some(sushy) = Sushy::start("public-tower", Some((&cert, &key))) else {
        return;
    };
    let pem = std::fs::read(&ca).expect("ca");
    let ca = RedfishClient::new(sushy.config("https", TlsTrust::CaPem(pem))).expect("client");
    let root = ca
        .get("/redfish/v1/")
        .await
        .expect("trusted by the given CA");
    assert_eq!(root["RedfishVersion"], "1.15.0");

    let strict =
        Arc::new(RedfishClient::new(sushy.config("https", TlsTrust::SystemRoots)).expect("client"));
    let run = run_bmc(
        "playbook: t\nchecks:\n - check: bmc_health\n",
        common::node(2),
        strict,
    )
    .await;
    assert_eq!(run.results[0].verdict, Verdict::Error);
    has(&run.results[0].message, "cannot connect to the BMC");
    has(&run.results[0].message.to_lowercase(), "certificate");

    let insecure = Arc::new(
        RedfishClient::new(sushy.config("https", TlsTrust::InsecureAcceptAny)).expect("client"),
    );
    let run = run_bmc(
        "playbook: t\nchecks:\n - check: bmc_health\n",
        common::node(2),
        insecure,
    )
    .await;
    assert_eq!(
        run.results[0].verdict,
        Verdict::Pass,
        "{}",
        run.results[0].message
    );
}

#[tokio::test]
async fn an_unreachable_bmc_is_an_error_not_a_failure() {
    let port = free_port(); // nothing listens here
    let cfg = RedfishConfig {
        base_url: format!("http://127.0.0.1:{port}"),
        auth: Auth::None,
        tls: TlsTrust::SystemRoots,
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(2),
        retries: 2,
        retry_backoff: Duration::from_millis(20),
    };
    let started = Instant::now();
    let run = run_bmc(
        ALL_BMC,
        common::node(0),
        Arc::new(RedfishClient::new(cfg).expect("client")),
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(run.verdict, Verdict::Error);
    for r in &run.results {
        assert_eq!(r.verdict, Verdict::Error);
        has(&r.message, "cannot connect to the BMC");
    }
}

#[test]
fn bad_client_settings_are_refused() {
    let mut cfg = RedfishConfig::for_address("10.0.0.11", Auth::None, TlsTrust::SystemRoots);
    assert_eq!(cfg.base_url, "https://10.0.0.11");
    cfg.base_url = "ftp://x".into();
    assert!(matches!(
        RedfishClient::new(cfg.clone()),
        Err(RedfishError::Config(_))
    ));
    cfg.base_url = "https://x".into();
    cfg.tls = TlsTrust::CaPem(b"not a certificate".to_vec());
    assert!(matches!(
        RedfishClient::new(cfg),
        Err(RedfishError::Config(_))
    ));
}

// ---------------------------------------------------------------------------------------
// A scripted HTTP/1.1 server on loopback, for auth, retries and timeouts.

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// (status, extra headers, body); `None` = hold the connection and never answer.
type Reply = Option<(u16, Vec<(String, String)>, String)>;

async fn scripted_server<F>(reply: F) -> (u16, Arc<Mutex<Vec<Seen>>>)
where
    F: Fn(&Seen, usize) -> Reply + Send + Sync + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let reply = Arc::new(reply);
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let log = log.clone();
            let reply = reply.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let head_end = loop {
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i;
                    }
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                let mut lines = head.lines();
                let mut first = lines.next().unwrap_or("").split_whitespace();
                let method = first.next().unwrap_or("").to_string();
                let path = first.next().unwrap_or("").to_string();
                let headers: Vec<(String, String)> = lines
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                    .collect();
                let req = Seen {
                    method,
                    path,
                    headers,
                };
                let n = {
                    let mut g = log.lock().unwrap_or_else(|p| p.into_inner());
                    g.push(req.clone());
                    g.len()
                };
                match reply(&req, n) {
                    None => tokio::time::sleep(Duration::from_secs(30)).await,
                    Some((status, extra, body)) => {
                        let mut resp = format!(
                            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
                            body.len()
                        );
                        for (k, v) in extra {
                            resp.push_str(&format!("{k}: {v}\r\n"));
                        }
                        resp.push_str("\r\n");
                        resp.push_str(&body);
                        let _ = sock.write_all(resp.as_bytes()).await;
                        let _ = sock.shutdown().await;
                    }
                }
            });
        }
    });
    (port, seen)
}

fn cfg(port: u16, auth: Auth) -> RedfishConfig {
    RedfishConfig {
        base_url: format!("http://127.0.0.1:{port}"),
        auth,
        tls: TlsTrust::SystemRoots,
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_millis(500),
        retries: 2,
        retry_backoff: Duration::from_millis(20),
    }
}

#[tokio::test]
async fn basic_auth_is_sent_on_every_request() {
    let (port, seen) = scripted_server(|req, _| match req.header("Authorization") {
        // "kiln:s3cret" in base64
        Some("Basic a2lsbjpzM2NyZXQ=") => Some((200, vec![], r#"{"Id": "RootService"}"#.into())),
        _ => Some((401, vec![], "{}".into())),
    })
    .await;
    let auth = Auth::Basic {
        user: "kiln".into(),
        password: "s3cret".into(),
    };
    let c = RedfishClient::new(cfg(port, auth)).expect("client");
    assert_eq!(
        c.get("/redfish/v1/").await.expect("ok")["Id"],
        "RootService"
    );
    let wrong = RedfishClient::new(cfg(
        port,
        Auth::Basic {
            user: "kiln".into(),
            password: "nope".into(),
        },
    ))
    .expect("client");
    let e = wrong.get("/redfish/v1/").await.expect_err("401");
    assert!(matches!(e, RedfishError::Http { status: 401, .. }), "{e}");
    assert_eq!(
        seen.lock().unwrap_or_else(|p| p.into_inner()).len(),
        2,
        "a 401 is not retried"
    );
}

#[tokio::test]
async fn session_auth_logs_in_relogs_on_401_and_logs_out() {
    let (port, seen) = scripted_server(|req, n| {
        let token_hdr = |t: &str| {
            vec![
                ("X-Auth-Token".to_string(), t.to_string()),
                (
                    "Location".to_string(),
                    format!("/redfish/v1/SessionService/Sessions/{t}"),
                ),
            ]
        };
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/redfish/v1/SessionService/Sessions") => {
                let t = if n == 1 { "tok1" } else { "tok2" };
                Some((201, token_hdr(t), "{}".into()))
            }
            ("GET", _) => match req.header("X-Auth-Token") {
                // The first token "expires" after one use.
                Some("tok1") if n == 2 => Some((200, vec![], r#"{"n": 1}"#.into())),
                Some("tok2") => Some((200, vec![], r#"{"n": 2}"#.into())),
                _ => Some((401, vec![], "{}".into())),
            },
            ("DELETE", _) => Some((204, vec![], String::new())),
            _ => Some((404, vec![], "{}".into())),
        }
    })
    .await;
    let c = RedfishClient::new(cfg(
        port,
        Auth::Session {
            user: "kiln".into(),
            password: "s3cret".into(),
        },
    ))
    .expect("client");
    assert_eq!(c.get("/redfish/v1/Systems").await.expect("first")["n"], 1);
    assert_eq!(
        c.get("/redfish/v1/Systems").await.expect("after relogin")["n"],
        2
    );
    c.logout().await;
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let calls: Vec<(String, String)> = seen
        .iter()
        .map(|s| (s.method.clone(), s.path.clone()))
        .collect();
    assert_eq!(
        calls,
        vec![
            ("POST".into(), "/redfish/v1/SessionService/Sessions".into()),
            ("GET".into(), "/redfish/v1/Systems".into()),
            ("GET".into(), "/redfish/v1/Systems".into()),
            ("POST".into(), "/redfish/v1/SessionService/Sessions".into()),
            ("GET".into(), "/redfish/v1/Systems".into()),
            (
                "DELETE".into(),
                "/redfish/v1/SessionService/Sessions/tok2".into()
            ),
        ]
    );
    assert_eq!(seen[5].header("X-Auth-Token"), Some("tok2"));
}

#[tokio::test]
async fn server_errors_are_retried_with_backoff() {
    let (port, seen) = scripted_server(|_, n| {
        if n < 3 {
            Some((503, vec![], r#"{"error": "busy"}"#.into()))
        } else {
            Some((200, vec![], r#"{"ok": true}"#.into()))
        }
    })
    .await;
    let c = RedfishClient::new(cfg(port, Auth::None)).expect("client");
    assert_eq!(c.get("/redfish/v1/").await.expect("third try")["ok"], true);
    assert_eq!(seen.lock().unwrap_or_else(|p| p.into_inner()).len(), 3);
    // One more failure than the retries allow: the last error is reported.
    let (port, _) = scripted_server(|_, _| Some((500, vec![], "boom".into()))).await;
    let c = RedfishClient::new(cfg(port, Auth::None)).expect("client");
    let e = c.get("/redfish/v1/").await.expect_err("gives up");
    assert_eq!(e.to_string(), "GET /redfish/v1/: HTTP 500: boom");
}

#[tokio::test]
async fn a_bmc_that_never_answers_times_out() {
    let (port, seen) = scripted_server(|_, _| None).await;
    let c = RedfishClient::new(cfg(port, Auth::None)).expect("client");
    let started = Instant::now();
    let e = c.get("/redfish/v1/").await.expect_err("times out");
    let took = started.elapsed();
    assert!(matches!(e, RedfishError::Timeout { .. }), "{e}");
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(10),
        "{took:?}"
    );
    assert_eq!(
        seen.lock().unwrap_or_else(|p| p.into_inner()).len(),
        3,
        "1 try + 2 retries"
    );
}

#[tokio::test]
async fn collections_are_expanded_in_one_request_where_the_service_can() {
    const ROOT: &str = r#"{"ProtocolFeaturesSupported": {"ExpandQuery": {"Levels": true}}}"#;
    let (port, seen) = scripted_server(|req, _| match req.path.as_str() {
        "/redfish/v1" => Some((200, vec![], ROOT.into())),
        "/redfish/v1/Chassis?$expand=.($levels=1)" => Some((
            200,
            vec![],
            r#"{"Members": [{"@odata.id": "/redfish/v1/Chassis/A", "Id": "A"}, {"@odata.id": "/redfish/v1/Chassis/B", "Id": "B"}]}"#.into(),
        )),
        _ => Some((404, vec![], "{}".into())),
    })
    .await;
    let c = RedfishClient::new(cfg(port, Auth::None)).expect("client");
    let m = c
        .members("/redfish/v1/Chassis", true)
        .await
        .expect("members");
    assert_eq!(m.len(), 2);
    assert_eq!(m[1]["Id"], "B");
    assert_eq!(
        seen.lock().unwrap_or_else(|p| p.into_inner()).len(),
        2,
        "root + one collection"
    );

    // A service that claims it and then refuses: the plain collection and each member.
    let (port, seen) = scripted_server(|req, _| match req.path.as_str() {
        "/redfish/v1" => Some((200, vec![], ROOT.into())),
        "/redfish/v1/Chassis" => Some((
            200,
            vec![],
            r#"{"Members": [{"@odata.id": "/redfish/v1/Chassis/A"}]}"#.into(),
        )),
        "/redfish/v1/Chassis/A" => Some((200, vec![], r#"{"Id": "A"}"#.into())),
        _ => Some((501, vec![], "{}".into())),
    })
    .await;
    let c = RedfishClient::new(cfg(port, Auth::None)).expect("client");
    let m = c
        .members("/redfish/v1/Chassis", true)
        .await
        .expect("members");
    assert_eq!(m[0]["Id"], "A");
    let m = c.members("/redfish/v1/Chassis", true).await.expect("again");
    assert_eq!(m.len(), 1);
    let paths: Vec<String> = seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|s| s.path.clone())
        .collect();
    assert_eq!(
        paths.iter().filter(|p| p.contains("$expand")).count(),
        1,
        "asked once: {paths:?}"
    );
}
