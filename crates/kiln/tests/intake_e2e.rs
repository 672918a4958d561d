//! Intake end to end, with real processes: a `kiln broker` (topic kiln.nodes, 6 partitions),
//! `kiln intake register` and `kiln intake serve` (this build's binary), a real store (a
//! SQLite file; and a PostgreSQL database when KILN_TEST_POSTGRES_URL is set, as scripts/test
//! does), and librdkafka reading kiln.nodes back with manual partition assignment.

mod common;
use common::java_partition;
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use kiln_intake::testkit::{free_port, BrokerProcess};
use kiln_manifest::{Format, NodeSpec};
use kiln_queue::rdkafka::config::ClientConfig;
use kiln_queue::rdkafka::consumer::{BaseConsumer, Consumer};
use kiln_queue::rdkafka::Message;
use kiln_queue::{NodeMessage, NODES_TOPIC};
use kiln_store::{NodeState, Store};

const PARTITIONS: i32 = 6;
const KILN: &str = env!("CARGO_BIN_EXE_kiln");

struct Env {
    broker: BrokerProcess,
    db_url: String,
    dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
}

impl Env {
    fn new(db_url: Option<String>) -> Env {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let broker = BrokerProcess::start(Path::new(KILN)).expect("start kiln broker");
        rt.block_on(kiln_queue::create_topic(
            &broker.addr,
            NODES_TOPIC,
            PARTITIONS,
            1,
        ))
        .expect("create kiln.nodes");
        let dir = tempfile::tempdir().expect("tempdir");
        let db_url =
            db_url.unwrap_or_else(|| format!("sqlite://{}", dir.path().join("kiln.db").display()));
        Env {
            broker,
            db_url,
            dir,
            rt,
        }
    }

    fn kiln(&self, args: &[&str]) -> Output {
        Command::new(KILN)
            .args(args)
            .args([
                "--bootstrap",
                &self.broker.addr,
                "--database-url",
                &self.db_url,
            ])
            .env_remove("KILN_BOOTSTRAP")
            .env_remove("KILN_DATABASE_URL")
            .stdin(Stdio::null())
            .output()
            .expect("run kiln")
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).expect("write manifest");
        p
    }

    fn store(&self) -> Store {
        self.rt
            .block_on(Store::connect(&self.db_url))
            .expect("open store")
    }

    fn states(&self, hosts: &[&str]) -> HashMap<String, NodeState> {
        let store = self.store();
        let st = self.rt.block_on(store.node_states(hosts)).expect("states");
        self.rt.block_on(store.close());
        st.into_iter().map(|(h, s)| (h, s.state)).collect()
    }

    fn consumer(&self) -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", &self.broker.addr)
            .set("group.id", "kiln-e2e-unused") // librdkafka wants one; assign() uses no group
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer")
    }

    fn high_watermarks(&self) -> Vec<i64> {
        let c = self.consumer();
        (0..PARTITIONS)
            .map(|p| {
                c.fetch_watermarks(NODES_TOPIC, p, Duration::from_secs(10))
                    .expect("watermarks")
                    .1
            })
            .collect()
    }

    /// Every record on kiln.nodes: (partition, offset, key, message), in offset order per partition.
    fn read_all(&self) -> Vec<(i32, i64, String, NodeMessage)> {
        let want: i64 = self.high_watermarks().iter().sum();
        let c = self.consumer();
        let mut out: Vec<_> = common::read_records(&c, NODES_TOPIC, PARTITIONS, want, &|| {
            self.broker.log_tail()
        })
        .into_iter()
        .map(|m| {
            let key = String::from_utf8(m.key().expect("every node message has a key").to_vec())
                .expect("utf-8 key");
            let msg =
                NodeMessage::decode(m.payload().expect("payload")).expect("a v1 node message");
            (m.partition(), m.offset(), key, msg)
        })
        .collect();
        out.sort_by_key(|(p, o, _, _)| (*p, *o));
        out
    }
}

fn node(host: &str, rack: &str) -> NodeSpec {
    kiln_store::testing::sample_node(host, rack)
}

/// Nodes of several racks, interleaved row by row (so order within a rack is a real check).
fn multi_rack(racks: &[&str], per_rack: usize) -> Vec<NodeSpec> {
    let mut v = Vec::new();
    for i in 0..per_rack {
        for r in racks {
            v.push(node(&format!("gpu-{r}-{i:02}"), r));
        }
    }
    v
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A minimal HTTP/1.1 client (Connection: close): returns status and body.
fn http(
    addr: &str,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, serde_json::Value) {
    let mut s = TcpStream::connect(addr).expect("connect to intake");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|_| s.write_all(body))
        .expect("send request");
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).expect("read response");
    let resp = String::from_utf8(resp).expect("utf-8 response");
    let status: u16 = resp
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (
        status,
        serde_json::from_str(body).unwrap_or_else(|e| panic!("JSON body ({e}): {resp}")),
    )
}

struct Server(Child, String);

impl Server {
    fn start(env: &Env) -> Server {
        let addr = format!("127.0.0.1:{}", free_port().expect("port"));
        let child = Command::new(KILN)
            .args([
                "intake",
                "serve",
                "--listen",
                &addr,
                "--bootstrap",
                &env.broker.addr,
                "--database-url",
                &env.db_url,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start kiln intake serve");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(&addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "intake server did not listen on {addr}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Server(child, addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Checks kiln.nodes holds exactly `expected` (each once), a rack's nodes in one partition
/// (the Java-compatible one for its key) in manifest order.
fn assert_queue_holds(env: &Env, expected: &[NodeSpec]) {
    let records = env.read_all();
    assert_eq!(
        records.len(),
        expected.len(),
        "one message per node, no duplicates"
    );
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut by_rack: BTreeMap<&str, Vec<(i32, i64, &str)>> = BTreeMap::new();
    for (p, o, key, msg) in &records {
        *seen.entry(msg.node.hostname.as_str()).or_default() += 1;
        assert_eq!(key, &msg.node.rack, "keyed by rack");
        assert_eq!((msg.v, msg.cycle, msg.attempt), (1, 1, 1));
        assert!(msg.not_before_ms > 0 && msg.not_before_ms <= msg.enqueued_at_ms);
        by_rack.entry(msg.node.rack.as_str()).or_default().push((
            *p,
            *o,
            msg.node.hostname.as_str(),
        ));
    }
    for n in expected {
        assert_eq!(
            seen.get(n.hostname.as_str()),
            Some(&1),
            "{} present exactly once",
            n.hostname
        );
        let msg = &records
            .iter()
            .find(|r| r.3.node.hostname == n.hostname)
            .expect("present")
            .3;
        assert_eq!(&msg.node, n, "the message carries the manifest data");
    }
    for (rack, msgs) in by_rack {
        let partitions: std::collections::BTreeSet<i32> = msgs.iter().map(|m| m.0).collect();
        assert_eq!(
            partitions.len(),
            1,
            "rack {rack} spread over partitions {partitions:?}"
        );
        assert_eq!(
            msgs[0].0,
            java_partition(rack.as_bytes(), PARTITIONS),
            "rack {rack}: Java-compatible partition"
        );
        let order: Vec<&str> = msgs.iter().map(|m| m.2).collect();
        let want: Vec<&str> = expected
            .iter()
            .filter(|n| n.rack == rack)
            .map(|n| n.hostname.as_str())
            .collect();
        assert_eq!(order, want, "rack {rack} in manifest order");
    }
}

fn cli_and_http_end_to_end(db_url: Option<String>) {
    let env = Env::new(db_url);
    let racks = ["r1", "r2", "r3", "r4", "r5"];
    let nodes = multi_rack(&racks, 8);
    let csv = env.write("racks.csv", &kiln_manifest::write(&nodes, Format::Csv));

    // 1. CLI registration of 40 nodes in 5 racks.
    let out = env.kiln(&["intake", "register", csv.to_str().expect("path")]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("40 node(s) in 5 rack(s)") && stdout.contains("queued:              40"),
        "{stdout}"
    );
    assert_queue_holds(&env, &nodes);
    let hosts: Vec<&str> = nodes.iter().map(|n| n.hostname.as_str()).collect();
    let states = env.states(&hosts);
    assert_eq!(states.len(), 40);
    assert!(
        states.values().all(|s| *s == NodeState::Queued),
        "{states:?}"
    );

    // 2. Re-registering is reported, not duplicated.
    let before = env.high_watermarks();
    let out = env.kiln(&["intake", "register", csv.to_str().expect("path"), "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let reg: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json output");
    assert_eq!(reg["queued"].as_array().map(Vec::len), Some(0));
    assert_eq!(
        reg["already_in_progress"].as_array().map(Vec::len),
        Some(40)
    );
    assert_eq!(reg["already_in_progress"][0]["state"], "queued");
    assert_eq!(env.high_watermarks(), before, "nothing produced");

    // 3. Bad manifests (CSV and YAML) are refused whole: every error with line, field, reason;
    //    nothing produced, nothing recorded (the good rows in them included).
    let bad_csv = env.write(
        "bad.csv",
        "hostname,rack,bmc_address,gpu_model,gpu_count,firmware_bmc,firmware_bios,firmware_gpu_vbios,firmware_nic,labels\n\
         new-01,r9,10.0.0.1,H100,8,1,2,3,4,\n\
         bad_host,r9,10.0.0.2,H100,8,1,2,3,4,\n\
         new-03,r9,ftp://bmc,H100,99,1,2,3,4,\n",
    );
    let out = env.kiln(&["intake", "register", bad_csv.to_str().expect("path")]);
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for want in [
        "bad.csv:3: node 2: hostname: \"bad_host\" is not an RFC 1123 host name",
        "bad.csv:4: node 3: bmc_address:",
        "bad.csv:4: node 3: gpu_count: must be a whole number from 0 to 16",
    ] {
        assert!(stderr.contains(want), "missing {want:?} in:\n{stderr}");
    }
    let bad_yaml = env.write(
        "bad.yaml",
        "nodes:\n  - hostname: new-11\n    rack: r9\n    bmc_address: 10.0.0.11\n    gpu_model: H100\n    gpu_count: 8\n    firmware_bmc: 1\n    firmware_bios: 2\n    firmware_gpu_vbios: 3\n    firmware_nic: 4\n  - hostname: new-12\n    rack: r9\n    bmc_address: 10.0.0.12\n    gpu_count: 8\n    firmware_bmc: 1\n    firmware_bios: \"\"\n    firmware_gpu_vbios: 3\n    firmware_nic: 4\n",
    );
    let out = env.kiln(&["intake", "register", bad_yaml.to_str().expect("path")]);
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bad.yaml:16: node 2: firmware_bios: firmware version must not be empty"),
        "{stderr}"
    );
    assert!(
        stderr.contains("bad.yaml:11: node 2: gpu_model: required when gpu_count is 8"),
        "{stderr}"
    );
    assert_eq!(
        env.high_watermarks(),
        before,
        "a refused manifest produces nothing"
    );
    assert!(
        env.states(&["new-01", "new-11", "new-12"]).is_empty(),
        "a refused manifest records nothing"
    );

    // 4. The HTTP endpoint: YAML for rack h, then bad CSV and bad YAML bodies, then a repeat.
    let server = Server::start(&env);
    let (status, health) = http(&server.1, "GET", "/healthz", "text/plain", b"");
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));
    let rack_h = multi_rack(&["h"], 6);
    let yaml = kiln_manifest::write(&rack_h, Format::Yaml);
    let (status, reg) = http(
        &server.1,
        "POST",
        "/v1/racks/h/manifest",
        "application/yaml",
        yaml.as_bytes(),
    );
    assert_eq!(status, 200, "{reg}");
    assert_eq!(reg["queued"].as_array().map(Vec::len), Some(6), "{reg}");
    let mut all = nodes.clone();
    all.extend(rack_h.iter().cloned());
    assert_queue_holds(&env, &all);
    let after_h = env.high_watermarks();

    let csv_other_rack = kiln_manifest::write(&multi_rack(&["h", "x"], 1), Format::Csv);
    let (status, body) = http(
        &server.1,
        "POST",
        "/v1/racks/h/manifest",
        "text/csv",
        csv_other_rack.as_bytes(),
    );
    assert_eq!(status, 422, "{body}");
    let errs = body["errors"].as_array().expect("errors");
    assert_eq!(errs.len(), 1, "{body}");
    assert_eq!(
        (errs[0]["line"].as_u64(), errs[0]["field"].as_str()),
        (Some(3), Some("rack")),
        "{body}"
    );
    assert!(
        errs[0]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("does not match"),
        "{body}"
    );
    let (status, body) = http(
        &server.1,
        "POST",
        "/v1/racks/h/manifest",
        "application/yaml",
        b"- hostname: h-new\n  rack: h\n  gpu_count: 99\n",
    );
    assert_eq!(status, 422, "{body}");
    let fields: Vec<&str> = body["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .filter_map(|e| e["field"].as_str())
        .collect();
    for f in [
        "bmc_address",
        "gpu_count",
        "firmware_bmc",
        "firmware_bios",
        "firmware_gpu_vbios",
        "firmware_nic",
    ] {
        assert!(fields.contains(&f), "{f} not reported: {body}");
    }
    assert!(
        body["errors"]
            .as_array()
            .expect("e")
            .iter()
            .all(|e| e["line"].as_u64().is_some()),
        "{body}"
    );
    let (status, body) = http(
        &server.1,
        "POST",
        "/v1/racks/h/manifest",
        "text/plain",
        b"x",
    );
    // A form's content type: what a browser's cross-site post would send.
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("refuses writes from browsers")),
        "{body}"
    );
    let (status, body) = http(
        &server.1,
        "POST",
        "/v1/racks/h/manifest",
        "application/xml",
        b"x",
    );
    assert_eq!(status, 415, "{body}");
    let (status, reg) = http(
        &server.1,
        "POST",
        "/v1/racks/h/manifest",
        "application/yaml",
        yaml.as_bytes(),
    );
    assert_eq!(status, 200, "{reg}");
    assert_eq!(
        reg["already_in_progress"].as_array().map(Vec::len),
        Some(6),
        "{reg}"
    );
    assert_eq!(
        env.high_watermarks(),
        after_h,
        "refused and repeated manifests produce nothing"
    );
    let hosts: Vec<&str> = all.iter().map(|n| n.hostname.as_str()).collect();
    let states = env.states(&hosts);
    assert_eq!(states.len(), 46);
    assert!(states.values().all(|s| *s == NodeState::Queued));
    assert!(env.states(&["h-new", "x-00"]).is_empty());
}

#[test]
fn intake_end_to_end_sqlite() {
    cli_and_http_end_to_end(None);
}

#[test]
fn intake_end_to_end_postgres() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let Some(url) = rt.block_on(kiln_store::testing::fresh_postgres_database()) else {
        return;
    };
    cli_and_http_end_to_end(Some(url));
}

#[test]
fn intake_reports_a_missing_topic_and_an_unreachable_store_clearly() {
    let env = Env::new(None);
    let csv = env.write(
        "one.csv",
        &kiln_manifest::write(&[node("solo-01", "s")], Format::Csv),
    );
    let out = env.kiln(&[
        "intake",
        "register",
        csv.to_str().expect("path"),
        "--topic",
        "no.such.topic",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("topic no.such.topic does not exist")
            && stderr.contains("kiln topics create"),
        "{stderr}"
    );
    assert!(
        env.states(&["solo-01"]).is_empty(),
        "nothing recorded when nothing could be queued"
    );

    let out = Command::new(KILN)
        .args([
            "intake",
            "register",
            csv.to_str().expect("path"),
            "--bootstrap",
            &env.broker.addr,
        ])
        .args(["--database-url", "mysql://u:hunter2@localhost/db"])
        .output()
        .expect("run kiln");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unsupported database URL") && !stderr.contains("hunter2"),
        "{stderr}"
    );

    let out = env.kiln(&["intake", "register", "/nonexistent/m.csv"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot read manifest /nonexistent/m.csv")
    );
    let odd = env.write("m.txt", "x");
    let out = env.kiln(&["intake", "register", odd.to_str().expect("path")]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("pass --format csv|json|yaml"),
        "{}",
        text(&out)
    );
}
