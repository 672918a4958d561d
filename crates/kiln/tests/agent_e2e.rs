//! Burn-in agents end to end, with real processes: a `kiln broker`, `kiln intake register` of
//! 12 nodes in 3 racks, and two `kiln agent` processes in group `burnin` running a playbook of
//! scripted checks (some nodes always fail, some fail intermittently, one hangs past its step
//! timeout). One agent is killed with SIGKILL while it has a run in progress. At the end every
//! node is passed or dead-lettered, the failing ones after exactly 10 attempts and on
//! kiln.nodes.dlq, and every message below a committed offset has its result in the store.
//! Then `kiln nodes show`, `kiln dlq list` and `kiln dlq resolve` send a dead-lettered node through a second cycle.

mod common;
use common::java_partition;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kiln_agent::DeadLetter;
use kiln_intake::testkit::BrokerProcess;
use kiln_queue::rdkafka::config::ClientConfig;
use kiln_queue::rdkafka::consumer::{BaseConsumer, Consumer};
use kiln_queue::rdkafka::{Message, Offset, TopicPartitionList};
use kiln_queue::{NodeMessage, NODES_TOPIC};
use kiln_store::{NodeHistory, NodeState, Store};

const KILN: &str = env!("CARGO_BIN_EXE_kiln");
const PARTITIONS: i32 = 3;
const DLQ: &str = "kiln.nodes.dlq";
const ALWAYS_FAIL: [&str; 2] = ["gpu-a-00", "gpu-c-03"];
const HANGS: &str = "gpu-b-01";
const FLAKY: [&str; 3] = ["gpu-a-02", "gpu-b-02", "gpu-c-01"];

struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(6000);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(text.len());
        format!("--- {} ---\n{}", self.log.display(), &text[start..])
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn hosts() -> Vec<String> {
    let mut v = Vec::new();
    for r in ["a", "b", "c"] {
        for i in 0..4 {
            v.push(format!("gpu-{r}-{i:02}"));
        }
    }
    v
}

/// Three rack names that land on partitions 0, 1 and 2, so both agents get work.
fn racks() -> [String; 3] {
    let mut out: [Option<String>; 3] = [None, None, None];
    for i in 0..1000 {
        let name = format!("rack{i}");
        let p = java_partition(name.as_bytes(), PARTITIONS) as usize;
        if out[p].is_none() {
            out[p] = Some(name);
        }
        if out.iter().all(Option::is_some) {
            break;
        }
    }
    out.map(|r| r.expect("three racks on three partitions"))
}

/// A node with a run of `agent` that has no verdict yet.
fn open_run_of(hist: &HashMap<String, NodeHistory>, agent: &str) -> Option<String> {
    hist.iter().find_map(|(host, h)| {
        h.runs
            .iter()
            .any(|r| r.agent == agent && r.verdict.is_none())
            .then(|| host.clone())
    })
}

fn start_agent(dir: &Path, name: &str, broker: &str, db_url: &str, playbook: &Path) -> Agent {
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "bootstrap = \"{broker}\"\ndatabase_url = \"{db_url}\"\nagent_id = \"{name}\"\n\
             playbook = \"{}\"\nmax_in_flight_per_partition = 2\nretry_backoff_ms = 50\n\
             retry_backoff_max_ms = 200\nstep_timeout_ms = 15000\nrun_grace_ms = 2000\n\
             session_timeout_ms = 6000\n\n[kafka]\n\"heartbeat.interval.ms\" = \"500\"\n",
            playbook.display()
        ),
    )
    .expect("write agent config");
    let log = dir.join(format!("{name}.log"));
    let f = std::fs::File::create(&log).expect("agent log");
    let child = Command::new(KILN)
        .args(["agent", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "info,kiln_agent=debug")
        .env_remove("KILN_AGENT_CONFIG")
        .stdin(Stdio::null())
        .stdout(f.try_clone().expect("log"))
        .stderr(f)
        .spawn()
        .expect("start kiln agent");
    Agent { child, log }
}

fn consumer(broker: &str, group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer")
}

/// Every record of `topic` (all partitions), read with manual assignment.
fn read_all(broker: &str, topic: &str, partitions: i32) -> Vec<(i32, i64, Vec<u8>)> {
    let c = consumer(broker, "kiln-e2e-reader");
    let mut want = 0i64;
    for p in 0..partitions {
        want += c
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .expect("watermarks")
            .1;
    }
    common::read_records(&c, topic, partitions, want, &String::new)
        .into_iter()
        .map(|m| {
            (
                m.partition(),
                m.offset(),
                m.payload().unwrap_or_default().to_vec(),
            )
        })
        .collect()
}

/// The group's committed offset per partition of kiln.nodes (OffsetFetch).
fn committed(broker: &str) -> BTreeMap<i32, i64> {
    let c = consumer(broker, "burnin");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition(NODES_TOPIC, p);
    }
    let got = c
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("OffsetFetch");
    got.elements()
        .iter()
        .map(|e| {
            let o = match e.offset() {
                Offset::Offset(o) => o,
                _ => 0,
            };
            (e.partition(), o)
        })
        .collect()
}

fn histories(rt: &tokio::runtime::Runtime, db_url: &str) -> HashMap<String, NodeHistory> {
    rt.block_on(async {
        let store = Store::connect(db_url).await.expect("store");
        let mut out = HashMap::new();
        for h in hosts() {
            if let Some(hist) = store.node_history(&h).await.expect("history") {
                out.insert(h, hist);
            }
        }
        store.close().await;
        out
    })
}

/// Every message below a committed offset has a finished run for its (host, cycle, attempt).
fn assert_committed_have_results(
    rt: &tokio::runtime::Runtime,
    broker: &str,
    db_url: &str,
) -> usize {
    let committed = committed(broker);
    let records = read_all(broker, NODES_TOPIC, PARTITIONS);
    let hist = histories(rt, db_url);
    let mut checked = 0;
    for (p, off, payload) in records {
        if off >= committed.get(&p).copied().unwrap_or(0) {
            continue;
        }
        let m = NodeMessage::decode(&payload).expect("node message");
        let h = hist.get(&m.node.hostname).unwrap_or_else(|| {
            panic!(
                "committed {p}/{off} but {} not in the store",
                m.node.hostname
            )
        });
        assert!(
            h.runs
                .iter()
                .any(|r| r.cycle == m.cycle && r.attempt == m.attempt && r.verdict.is_some()),
            "offset {off} of partition {p} committed ({} attempt {}) without a finished run: {:?}",
            m.node.hostname,
            m.attempt,
            h.runs
        );
        checked += 1;
    }
    checked
}

#[test]
fn agents_burn_in_retry_dead_letter_and_survive_a_kill() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let broker = BrokerProcess::start(Path::new(KILN)).expect("start kiln broker");
    let addr = broker.addr.clone();
    rt.block_on(kiln_queue::create_topic(&addr, NODES_TOPIC, PARTITIONS, 1))
        .expect("create kiln.nodes");
    rt.block_on(kiln_queue::create_topic(&addr, DLQ, 1, 1))
        .expect("create dlq");
    let dir = tempfile::tempdir().expect("tempdir");
    let db_url = format!("sqlite://{}", dir.path().join("kiln.db").display());

    let mut csv = String::from(
        "hostname,rack,bmc_address,gpu_model,gpu_count,firmware_bmc,firmware_bios,firmware_gpu_vbios,firmware_nic\n",
    );
    let racks = racks();
    for h in hosts() {
        let rack = &racks[usize::from(h.as_bytes()[4] - b'a')];
        csv.push_str(&format!(
            "{h},{rack},10.0.0.1,H100-SXM,8,1.10,2.3.1,96.00,28.39\n"
        ));
    }
    let manifest = dir.path().join("fleet.csv");
    std::fs::write(&manifest, csv).expect("manifest");
    let list = |v: &[&str]| format!("[{}]", v.join(", "));
    let playbook = dir.path().join("playbook.yaml");
    std::fs::write(
        &playbook,
        format!(
            "playbook: e2e\ntimeout_s: 30\nchecks:\n\
             - check: scripted\n  name: warmup\n  outcome: pass\n  delay_ms: 300\n\
             - check: scripted\n  name: broken\n  outcome: fail\n  hosts: {}\n  message: GPU 3 missing\n\
             - check: scripted\n  name: flaky\n  outcome: fail\n  percent: 40\n  hosts: {}\n\
             - check: scripted\n  name: stuck\n  outcome: hang\n  timeout_s: 1\n  hosts: [{HANGS}]\n",
            list(&ALWAYS_FAIL),
            list(&FLAKY)
        ),
    )
    .expect("playbook");

    common::register_manifest(&manifest, &addr, &db_url);

    let mut a = start_agent(dir.path(), "agent-a", &addr, &db_url, &playbook);
    let b = start_agent(dir.path(), "agent-b", &addr, &db_url, &playbook);

    // Kill agent-a with SIGKILL while it has a run in progress.
    let deadline = Instant::now() + Duration::from_secs(60);
    let killed_host = loop {
        assert!(
            Instant::now() < deadline,
            "agent-a never had a run in progress\n{}\n{}",
            a.log_tail(),
            b.log_tail()
        );
        let hist = histories(&rt, &db_url);
        let finished: usize = hist
            .values()
            .map(|h| h.runs.iter().filter(|r| r.verdict.is_some()).count())
            .sum();
        if finished >= 1 && open_run_of(&hist, "agent-a").is_some() {
            a.child.kill().expect("SIGKILL agent-a");
            let _ = a.child.wait();
            // A run may finish between the read above and the kill landing: only a run still
            // open in the store now was interrupted. Otherwise start agent-a again and retry.
            if let Some(host) = open_run_of(&histories(&rt, &db_url), "agent-a") {
                break host;
            }
            eprintln!("agent-a finished its run before the kill landed; restarting it");
            a = start_agent(dir.path(), "agent-a", &addr, &db_url, &playbook);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Mid-run: whatever is committed already has its result.
    let checked_mid = assert_committed_have_results(&rt, &addr, &db_url);
    eprintln!(
        "killed agent-a during a run of {killed_host}; {checked_mid} committed records checked"
    );

    // Agent-b finishes everything.
    let deadline = Instant::now() + Duration::from_secs(240);
    let final_hist = loop {
        let hist = histories(&rt, &db_url);
        let done = hist.len() == 12
            && hist
                .values()
                .all(|h| matches!(h.node.state, NodeState::Passed | NodeState::DeadLettered));
        if done {
            break hist;
        }
        assert!(
            Instant::now() < deadline,
            "not all nodes finished: {:?}\n{}\n{}",
            hist.iter()
                .map(|(h, x)| (h.clone(), (x.node.state, x.node.attempt)))
                .collect::<BTreeMap<_, _>>(),
            a.log_tail(),
            b.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    };

    // The node agent-a was running when killed was resumed by agent-b: both starts are recorded.
    let h = &final_hist[&killed_host];
    let attempt_started_by = |agent: &str| {
        h.events
            .iter()
            .filter(|e| e.reason.contains(&format!("started by agent {agent}")))
            .map(|e| (e.cycle, e.attempt))
            .collect::<BTreeSet<_>>()
    };
    assert!(
        !attempt_started_by("agent-a")
            .intersection(&attempt_started_by("agent-b"))
            .collect::<Vec<_>>()
            .is_empty(),
        "{killed_host}: no attempt started by both agents: {:?}",
        h.events
    );

    let mut dead: BTreeSet<String> = ALWAYS_FAIL.iter().map(|s| s.to_string()).collect();
    dead.insert(HANGS.to_string());
    for (host, h) in &final_hist {
        if dead.contains(host) {
            assert_eq!(h.node.state, NodeState::DeadLettered, "{host}");
            let attempts: Vec<u32> = h.runs.iter().map(|r| r.attempt).collect();
            assert_eq!(
                attempts,
                (1..=10).collect::<Vec<_>>(),
                "{host}: exactly 10 attempts"
            );
            assert!(h
                .runs
                .iter()
                .all(|r| r.verdict == Some(kiln_store::RunVerdict::Fail)));
            if host == HANGS {
                assert!(
                    h.runs
                        .iter()
                        .all(|r| r.checks.iter().any(|c| c.name == "stuck"
                            && c.verdict == kiln_store::CheckVerdict::Error
                            && c.message.contains("did not finish within 1.0 s"))),
                    "{host}: the hang must end at its step timeout"
                );
            }
        } else if FLAKY.contains(&host.as_str()) {
            // Fails about 40% of runs: passed, or (rarely, 0.4^10) dead-lettered.
            assert!(matches!(
                h.node.state,
                NodeState::Passed | NodeState::DeadLettered
            ));
        } else {
            assert_eq!(h.node.state, NodeState::Passed, "{host}: {:?}", h.events);
            assert_eq!(h.runs.len(), 1, "{host}: one attempt");
        }
    }

    // Per partition (= rack here) agent-b never ran more than max_in_flight_per_partition (2)
    // runs at once.
    for (i, rack) in racks.iter().enumerate() {
        let prefix = format!("gpu-{}-", (b'a' + i as u8) as char);
        let mut edges: Vec<(i64, i32)> = Vec::new();
        for (host, h) in &final_hist {
            if !host.starts_with(&prefix) {
                continue;
            }
            for r in h.runs.iter().filter(|r| r.agent == "agent-b") {
                edges.push((r.started_at_ms, 1));
                edges.push((r.finished_at_ms.unwrap_or(i64::MAX), -1));
            }
        }
        edges.sort();
        let (mut now, mut most) = (0, 0);
        for (_, d) in edges {
            now += d;
            most = most.max(now);
        }
        assert!(
            most <= 2,
            "rack {rack}: {most} runs at once on one partition"
        );
    }
    // The hanging node does not hold back its partition: the rest of its rack passed
    // long before its tenth attempt ended.
    let hang_end = final_hist[HANGS]
        .runs
        .iter()
        .filter_map(|r| r.finished_at_ms)
        .max()
        .expect("finished runs");
    for host in ["gpu-b-00", "gpu-b-03"] {
        let end = final_hist[host]
            .runs
            .iter()
            .filter_map(|r| r.finished_at_ms)
            .max();
        assert!(
            end.is_some_and(|e| e + 3000 < hang_end),
            "{host} waited for {HANGS}"
        );
    }

    // Every dead-lettered node is on kiln.nodes.dlq with its history and last error.
    let dead_final: BTreeSet<String> = final_hist
        .iter()
        .filter(|(_, h)| h.node.state == NodeState::DeadLettered)
        .map(|(host, _)| host.clone())
        .collect();
    assert!(dead.is_subset(&dead_final));
    let deadline = Instant::now() + Duration::from_secs(20);
    let letters = loop {
        let letters: Vec<DeadLetter> = read_all(&addr, DLQ, 1)
            .into_iter()
            .map(|(_, _, p)| serde_json::from_slice(&p).expect("dead letter JSON"))
            .collect();
        let on_dlq: BTreeSet<String> = letters
            .iter()
            .map(|l| l.message.node.hostname.clone())
            .collect();
        if on_dlq == dead_final {
            break letters;
        }
        assert!(
            Instant::now() < deadline,
            "dlq holds {on_dlq:?}, want {dead_final:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    for l in &letters {
        assert_eq!(l.message.attempt, 10);
        let hist = l.history.as_ref().expect("history in the dead letter");
        assert_eq!(hist.runs.len(), 10);
        assert!(!l.last_error.is_empty());
        if ALWAYS_FAIL.contains(&l.message.node.hostname.as_str()) {
            assert!(l.last_error.contains("GPU 3 missing"), "{}", l.last_error);
        }
    }

    // At the end the group has committed everything, and every committed record has its result.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = committed(&addr);
        let probe = consumer(&addr, "kiln-e2e-reader");
        let highs: BTreeMap<i32, i64> = (0..PARTITIONS)
            .map(|p| {
                (
                    p,
                    probe
                        .fetch_watermarks(NODES_TOPIC, p, Duration::from_secs(10))
                        .expect("watermarks")
                        .1,
                )
            })
            .collect();
        if c == highs {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "committed {c:?} never reached the end {highs:?}\n{}",
            b.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let checked = assert_committed_have_results(&rt, &addr, &db_url);
    assert!(checked >= 12 + 3 * 9, "checked {checked} committed records");

    // `kiln nodes show`, `kiln dlq list` and `kiln dlq resolve`: a repaired node goes through a second cycle.
    let kiln = |args: &[&str]| {
        Command::new(KILN)
            .args(args)
            .args(["--database-url", &db_url])
            .env_remove("KILN_BOOTSTRAP")
            .env_remove("KILN_DATABASE_URL")
            .stdin(Stdio::null())
            .output()
            .expect("run kiln")
    };
    let show = kiln(&["nodes", "show", "gpu-a-00"]);
    let out = String::from_utf8_lossy(&show.stdout);
    assert!(
        show.status.success(),
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );
    assert!(
        out.contains("dead_lettered") && out.contains("fail broken: GPU 3 missing"),
        "{out}"
    );
    let refused = kiln(&["dlq", "requeue", "gpu-b-00", "--bootstrap", &addr]);
    assert!(!refused.status.success(), "a passed node is not requeued");
    let listed = kiln(&["dlq", "list", "--action", "investigate"]);
    let out = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success() && out.contains("gpu-a-00") && out.contains("investigate"),
        "{out}{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let none = kiln(&["dlq", "list", "--action", "rma"]);
    assert!(!String::from_utf8_lossy(&none.stdout).contains("gpu-a-00"));
    assert!(!kiln(&["dlq", "list", "--action", "pray"]).status.success());
    let resolve = kiln(&[
        "dlq",
        "resolve",
        "gpu-a-00",
        "--note",
        "GPU 3 reseated",
        "--by",
        "ana",
        "--bootstrap",
        &addr,
    ]);
    assert!(
        resolve.status.success(),
        "{}",
        String::from_utf8_lossy(&resolve.stderr)
    );
    assert!(String::from_utf8_lossy(&resolve.stdout).contains("requeued as cycle 2"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let h = &histories(&rt, &db_url)["gpu-a-00"];
        if h.node.cycle == 2 && h.node.state == NodeState::DeadLettered {
            assert_eq!(h.runs.len(), 20, "ten attempts in each cycle");
            assert!(
                h.events
                    .iter()
                    .any(|e| e.reason == "resolved by ana: GPU 3 reseated"),
                "the resolution is in the history"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "second cycle of gpu-a-00: {:?}\n{}",
            h.node,
            b.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(b);
}
