//! The dashboard over real HTTP on a SQLite store written through the store's API: every page
//! renders what the store holds, hostile strings (in hostnames, racks, labels, check messages,
//! measured values and evidence) come out escaped, unknown names are 404s, and a broker that
//! is not there shows up as a lag sampling error rather than a failed page.

use std::collections::BTreeMap;
use std::time::Duration;

use kiln_dashboard::seed::{seed_fleet, FleetSpec};
use kiln_dashboard::{serve, DashboardConfig};
use kiln_manifest::NodeSpec;
use kiln_store::{BeginRun, CheckResult, CheckVerdict, NodeState, QueuedNode, RunVerdict, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const EVIL: &str = "<script>alert('x')</script>\"><img src=x onerror=alert(1)>&amp;";

struct Dashboard {
    addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Dashboard {
    async fn start(store: Store, dir: tempfile::TempDir, config: DashboardConfig) -> Dashboard {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, store, config, async move {
            let _ = rx.await;
        }));
        Dashboard {
            addr,
            stop: Some(tx),
            task,
            _dir: dir,
        }
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let mut s = TcpStream::connect(&self.addr).await.expect("connect");
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("send");
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.expect("read");
        let text = String::from_utf8(buf).expect("utf-8 response");
        let status = text[9..12].parse().expect("status code");
        let body = text
            .split_once("\r\n\r\n")
            .expect("header end")
            .1
            .to_string();
        (status, body)
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("dashboard stops on shutdown")
            .expect("task")
            .expect("serve");
    }
}

async fn store() -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("kiln.db").display());
    (Store::connect(&url).await.expect("store"), dir)
}

fn evil_spec(host: &str, rack: &str) -> NodeSpec {
    NodeSpec {
        hostname: host.into(),
        rack: rack.into(),
        bmc_address: format!("{EVIL}:443"),
        gpu_model: format!("H100 {EVIL}"),
        gpu_count: 8,
        firmware_bmc: EVIL.into(),
        firmware_bios: "2.3.1".into(),
        firmware_gpu_vbios: "96.00".into(),
        firmware_nic: "28.39".into(),
        labels: BTreeMap::from([(EVIL.to_string(), EVIL.to_string())]),
    }
}

/// No raw hostile markup anywhere in `body`, and its escaped form is there (maud escapes
/// `& < > "`; a `'` is inert because every attribute is double-quoted).
fn assert_escaped(body: &str) {
    assert!(!body.contains("<script>alert"), "unescaped script: {body}");
    assert!(!body.contains("<img src=x"), "unescaped img: {body}");
    assert!(
        body.contains("&lt;script&gt;alert('x')&lt;/script&gt;"),
        "escaped form missing: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_show_the_store_and_escape_hostile_strings() {
    let (store, dir) = store().await;
    let host = format!("evil-{EVIL}");
    let rack = format!("rack {EVIL}/..");
    let spec = evil_spec(&host, &rack);
    store
        .record_queued(
            &[
                QueuedNode {
                    spec: spec.clone(),
                    cycle: 1,
                },
                QueuedNode {
                    spec: evil_spec("plain-1", &rack),
                    cycle: 1,
                },
            ],
            1_714_564_800_000,
        )
        .await
        .expect("record");
    let BeginRun::Started { run } = store
        .begin_run(&spec, 1, 1, EVIL, 1_714_564_801_000)
        .await
        .expect("begin")
    else {
        panic!("run did not start");
    };
    let checks = vec![
        CheckResult {
            name: format!("gpu_count {EVIL}"),
            verdict: CheckVerdict::Fail,
            measured: serde_json::json!({ "gpu_count": 7, "expected": 8, "note": EVIL }),
            message: format!("GPU 3 missing {EVIL}"),
            evidence: format!("nvidia-smi -L\nGPU 0: H100 {EVIL}\n"),
            findings: Vec::new(),
        },
        CheckResult {
            name: "nic".into(),
            verdict: CheckVerdict::Pass,
            measured: serde_json::json!({ "ports_up": 8 }),
            message: "8 ports up".into(),
            evidence: String::new(),
            findings: Vec::new(),
        },
    ];
    store
        .finish_run(run, RunVerdict::Fail, &checks, 1_714_564_802_000)
        .await
        .expect("finish");

    let d = Dashboard::start(store, dir, DashboardConfig::new(None)).await;

    let (status, body) = d.get("/").await;
    assert_eq!(status, 200);
    assert_escaped(&body);
    assert!(
        body.contains("<strong>2</strong> nodes in <strong>1</strong> racks"),
        "{body}"
    );
    assert!(body.contains("id=\"total-retrying\">1<") && body.contains("id=\"total-queued\">1<"));
    assert!(
        body.contains("<svg id=\"lag-chart\""),
        "lag chart always present"
    );
    // The rack link is percent-encoded, so the hostile name cannot break out of the URL.
    assert!(
        body.contains("href=\"/racks/rack%20%3Cscript%3Ealert%28%27x%27%29"),
        "{body}"
    );

    let rack_path = format!("/racks/{}", kiln_dashboard::html::path_segment(&rack));
    let (status, body) = d.get(&rack_path).await;
    assert_eq!(status, 200, "{body}");
    assert_escaped(&body);
    assert!(
        body.contains("plain-1") && body.contains("retrying"),
        "{body}"
    );

    let node_path = format!("/nodes/{}", kiln_dashboard::html::path_segment(&host));
    let (status, body) = d.get(&node_path).await;
    assert_eq!(status, 200, "{body}");
    assert_escaped(&body);
    for want in [
        "GPU 3 missing &lt;script&gt;",
        "&quot;gpu_count&quot;: 7",
        "nvidia-smi -L",
        "evidence (",
        "8 ports up",
        "Cycle 1 attempt 1: <span class=\"v-fail\">fail</span>",
        "attempt 1 failed: gpu_count &lt;script&gt;",
    ] {
        assert!(body.contains(want), "node page lacks {want:?}:\n{body}");
    }

    let (status, body) = d.get("/nodes/no-such-host").await;
    assert_eq!(status, 404);
    assert!(body.contains("No node no-such-host"));
    let (status, body) = d
        .get(&format!(
            "/racks/{}",
            kiln_dashboard::html::path_segment(EVIL)
        ))
        .await;
    assert_eq!(status, 404);
    assert_escaped(&body);
    let (status, _) = d.get("/no/such/page").await;
    assert_eq!(status, 404);

    let (status, body) = d.get("/lag").await;
    assert_eq!(status, 200);
    assert!(body.contains("lag is not sampled"), "{body}");
    let (status, body) = d.get("/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_page_lists_the_last_failing_checks() {
    let (store, dir) = store().await;
    // 40 nodes: nodes 16 and 36 end dead-lettered (see seed::planned_state).
    let seeded = seed_fleet(
        &store,
        &FleetSpec {
            nodes: 40,
            rack_size: 32,
            start_ms: 1_714_564_800_000,
        },
    )
    .await
    .expect("seed");
    assert_eq!(seeded.counts[&NodeState::DeadLettered], 2);
    let d = Dashboard::start(store, dir, DashboardConfig::new(None)).await;
    let (status, body) = d.get("/dead-letters").await;
    assert_eq!(status, 200);
    assert!(body.contains("2 node(s) dead-lettered"), "{body}");
    for host in ["gpu-00016", "gpu-00036"] {
        assert!(
            body.contains(&format!("href=\"/nodes/{host}\"")),
            "{host}: {body}"
        );
        assert!(
            body.contains(&format!("GPU 3 of {host} missing from NVML")),
            "{body}"
        );
    }
    assert!(body.contains("data-action=\"reboot\""), "{body}");
    assert!(body.contains("reboot the node: board: gpu count"), "{body}");
    // Filtered by action: the two are reboots, none an RMA; an unknown action is refused.
    let (status, body) = d.get("/dead-letters?action=reboot").await;
    assert_eq!(status, 200);
    assert_eq!(body.matches("data-action=\"reboot\"").count(), 2, "{body}");
    let (_, body) = d.get("/dead-letters?action=rma").await;
    assert!(body.contains("No dead-lettered nodes.") && !body.contains("data-action=\"reboot\""));
    let (status, body) = d.get("/dead-letters?action=%3Cb%3E").await;
    assert_eq!(status, 400);
    assert!(
        body.contains("unknown action") && body.contains("rma, reseat_cable"),
        "{body}"
    );
    // The node page shows the component view of the cycle, attempt by attempt.
    let (_, node) = d.get("/nodes/gpu-00016").await;
    assert!(node.contains("id=\"components\""), "{node}");
    assert!(
        node.contains("nvidia-smi -L lists 7 GPUs, expected 8"),
        "{node}"
    );
    assert!(
        node.contains("<td class=\"v-fail\" title=\"gpu_count\">fail</td>"),
        "{node}"
    );

    let (_, overview) = d.get("/").await;
    assert!(
        overview.contains("data-rack=\"rack-0000\"")
            && overview.contains("data-rack=\"rack-0001\"")
    );
    assert!(overview.contains("<strong>40</strong> nodes in <strong>2</strong> racks"));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_is_reported_on_the_lag_page() {
    let (store, dir) = store().await;
    // A port bound but never listened on refuses connections, and stays ours (no other test's
    // listener can be given it) until the test ends.
    let refusing = tokio::net::TcpSocket::new_v4().expect("socket");
    refusing.bind(([127, 0, 0, 1], 0).into()).expect("bind");
    let port = refusing.local_addr().expect("addr").port();
    let mut config = DashboardConfig::new(Some(format!("127.0.0.1:{port}")));
    config.lag_interval = Duration::from_millis(100);
    config.broker_timeout = Duration::from_millis(500);
    let d = Dashboard::start(store, dir, config).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = d.get("/lag").await;
        assert_eq!(status, 200);
        if body.contains("The last sample (") {
            assert!(body.contains(&format!("127.0.0.1:{port}")), "{body}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no sampling error shown: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, _) = d.get("/").await;
    assert_eq!(status, 200, "the overview does not depend on the broker");
    d.stop().await;
    drop(refusing);
}
