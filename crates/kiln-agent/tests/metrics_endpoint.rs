//! The agent's `GET /metrics` after real runs: a `kiln broker` process, two nodes registered
//! through intake, and an agent (in this process) whose scripted playbook passes one node and
//! fails the other until it is dead-lettered. The endpoint must then report exactly those
//! outcomes, check failures and durations, and the offset the broker confirmed.

use std::time::{Duration, Instant};

use kiln_agent::AgentConfig;
use kiln_intake::testkit::{free_port, kiln_bin, BrokerProcess};
use kiln_intake::{Intake, NoProgress};
use kiln_queue::{NodeProducer, ProducerConfig, NODES_TOPIC};
use kiln_store::Store;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DLQ: &str = "kiln.nodes.dlq";

async fn scrape(addr: &str) -> std::io::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await?;
    Ok(raw)
}

/// The group's committed offset of kiln.nodes partition 0, asked of the broker (OffsetFetch).
fn broker_committed(addr: &str) -> i64 {
    use kiln_queue::rdkafka::consumer::{BaseConsumer, Consumer};
    use kiln_queue::rdkafka::{ClientConfig, Offset, TopicPartitionList};
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", addr)
        .set("group.id", "burnin")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(NODES_TOPIC, 0);
    let got = c
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("OffsetFetch");
    match got.elements()[0].offset() {
        Offset::Offset(o) => o,
        other => panic!("no committed offset: {other:?}"),
    }
}

/// The value of the sample line that starts with `series ` (exact series text).
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn metrics_endpoint_reports_outcomes_checks_and_offsets() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let broker = BrokerProcess::start(&kiln_bin().expect("kiln binary")).expect("broker");
    let addr = broker.addr.clone();
    let dir = tempfile::tempdir().expect("tempdir");
    let db_url = format!("sqlite://{}", dir.path().join("kiln.db").display());
    let playbook = dir.path().join("playbook.yaml");
    std::fs::write(
        &playbook,
        "playbook: metrics\ntimeout_s: 30\nchecks:\n\
         - check: scripted\n  name: warmup\n  outcome: pass\n  delay_ms: 20\n\
         - check: scripted\n  name: broken\n  outcome: fail\n  hosts: [gpu-bad]\n  message: GPU 3 missing\n",
    )
    .expect("playbook");
    let manifest = kiln_manifest::parse(
        "hostname,rack,bmc_address,gpu_model,gpu_count,firmware_bmc,firmware_bios,firmware_gpu_vbios,firmware_nic\n\
         gpu-good,r1,10.0.0.1,H100-SXM,8,1.10,2.3.1,96.00,28.39\n\
         gpu-bad,r1,10.0.0.2,H100-SXM,8,1.10,2.3.1,96.00,28.39\n",
        kiln_manifest::Format::Csv,
        None,
    )
    .expect("manifest");
    let metrics_addr = format!("127.0.0.1:{}", free_port().expect("port"));

    rt.block_on(async {
        kiln_queue::create_topic(&addr, NODES_TOPIC, 1, 1)
            .await
            .expect("kiln.nodes");
        kiln_queue::create_topic(&addr, DLQ, 1, 1)
            .await
            .expect("dlq");
        let store = Store::connect(&db_url).await.expect("store");
        let producer = NodeProducer::new(ProducerConfig::new(addr.clone())).expect("producer");
        let reg = Intake::new(store.clone(), producer)
            .register(&manifest, &NoProgress)
            .await
            .expect("register");
        assert!(reg.failed.is_empty(), "{:?}", reg.failed);
        store.close().await;

        let config = AgentConfig {
            bootstrap: addr.clone(),
            database_url: db_url.clone(),
            agent_id: "metrics-agent".into(),
            playbook: Some(playbook.clone()),
            retry_backoff_ms: 10,
            retry_backoff_max_ms: 20,
            session_timeout_ms: 6000,
            metrics_listen: metrics_addr.clone(),
            ..AgentConfig::default()
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let agent = tokio::spawn(kiln_agent::run_agent(config, async {
            let _ = stop_rx.await;
        }));

        // 1 pass + 10 failed attempts of gpu-bad = 11 messages on kiln.nodes, all committed.
        let deadline = Instant::now() + Duration::from_secs(120);
        let body = loop {
            let body = scrape(&metrics_addr).await.unwrap_or_default();
            let committed = sample(
                &body,
                "kiln_agent_committed_offset{topic=\"kiln.nodes\",partition=\"0\"}",
            );
            let dead = sample(
                &body,
                "kiln_agent_node_outcomes_total{outcome=\"dead_lettered\"}",
            );
            if committed == Some(11.0) && dead == Some(1.0) {
                break body;
            }
            assert!(
                Instant::now() < deadline,
                "agent did not finish both nodes; last scrape:\n{body}\n{}",
                broker.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let _ = stop_tx.send(());
        agent.await.expect("agent task").expect("agent");
        assert_eq!(
            broker_committed(&addr),
            11,
            "the broker has the offset the agent reports"
        );

        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(body.contains("content-type: text/plain; version=0.0.4"));
        let get =
            |series: &str| sample(&body, series).unwrap_or_else(|| panic!("{series}\n{body}"));
        assert_eq!(
            get("kiln_agent_node_outcomes_total{outcome=\"passed\"}"),
            1.0
        );
        assert_eq!(
            get("kiln_agent_node_outcomes_total{outcome=\"retrying\"}"),
            9.0
        );
        assert_eq!(
            get("kiln_agent_node_outcomes_total{outcome=\"dead_lettered\"}"),
            1.0
        );
        assert_eq!(
            get("kiln_agent_check_failures_total{check=\"broken\",verdict=\"fail\"}"),
            10.0
        );
        assert!(!body.contains("kiln_agent_check_failures_total{check=\"warmup\""));
        // Every run ran both steps; warmup sleeps 20 ms, so none is in the 10 ms bucket.
        assert_eq!(
            get("kiln_agent_check_duration_seconds_count{check=\"warmup\"}"),
            11.0
        );
        assert_eq!(
            get("kiln_agent_check_duration_seconds_count{check=\"broken\"}"),
            11.0
        );
        assert_eq!(
            get("kiln_agent_check_duration_seconds_bucket{check=\"warmup\",le=\"0.01\"}"),
            0.0
        );
        assert_eq!(
            get("kiln_agent_check_duration_seconds_bucket{check=\"warmup\",le=\"+Inf\"}"),
            11.0
        );
        assert!(get("kiln_agent_check_duration_seconds_sum{check=\"warmup\"}") >= 0.22);
        assert_eq!(get("kiln_agent_runs_in_flight"), 0.0);
        assert_eq!(get("kiln_agent_nodes_running"), 0.0);
        assert_eq!(
            get("kiln_agent_info{agent=\"metrics-agent\",group=\"burnin\"}"),
            1.0
        );
    });
    drop(broker);
}
