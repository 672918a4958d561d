//! The operators' read queries (`kiln_store::dashboard`) on a SQLite file and on PostgreSQL
//! (KILN_TEST_POSTGRES_URL, as in tests/store.rs): per-rack counts, a rack's nodes, the
//! dead-letter list with the failing checks of the last attempt.

use std::collections::BTreeMap;

use kiln_manifest::NodeSpec;
use kiln_store::dashboard::totals;
use kiln_store::testing::fresh_postgres_database;
use kiln_store::{
    BeginRun, CheckResult, CheckVerdict, NodeState, QueuedNode, RunVerdict, Store, MAX_ATTEMPTS,
};

async fn sqlite() -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("kiln.db").display());
    (Store::connect(&url).await.expect("open sqlite store"), dir)
}

fn queued(host: &str, rack: &str) -> QueuedNode {
    QueuedNode {
        spec: NodeSpec {
            hostname: host.into(),
            rack: rack.into(),
            bmc_address: "10.0.0.1".into(),
            gpu_model: "H100-SXM".into(),
            gpu_count: 8,
            firmware_bmc: "1.10".into(),
            firmware_bios: "2.3.1".into(),
            firmware_gpu_vbios: "96.00".into(),
            firmware_nic: "28.39".into(),
            labels: BTreeMap::new(),
        },
        cycle: 1,
    }
}

fn check(name: &str, verdict: CheckVerdict) -> CheckResult {
    CheckResult {
        name: name.into(),
        verdict,
        measured: serde_json::json!({"gpu_count": 7}),
        message: format!("{name}: {}", verdict.as_str()),
        evidence: String::new(),
        findings: Vec::new(),
    }
}

async fn run(store: &Store, host: &str, attempt: u32, verdict: RunVerdict, checks: &[CheckResult]) {
    let spec = queued(host, "unused").spec;
    let BeginRun::Started { run } = store
        .begin_run(&spec, 1, attempt, "agent-t", 10 + i64::from(attempt))
        .await
        .expect("begin")
    else {
        panic!("run of {host} attempt {attempt} did not start");
    };
    store
        .finish_run(run, verdict, checks, 20 + i64::from(attempt))
        .await
        .expect("finish");
}

async fn scenario(store: &Store) {
    let nodes: Vec<QueuedNode> = [
        ("a-1", "rack-a"),
        ("a-2", "rack-a"),
        ("a-3", "rack-a"),
        ("b-1", "rack-b"),
    ]
    .iter()
    .map(|(h, r)| queued(h, r))
    .collect();
    store.record_queued(&nodes, 1).await.expect("record");
    // a-1 passes, a-2 fails once (retrying), b-1 is dead-lettered after MAX_ATTEMPTS.
    run(
        store,
        "a-1",
        1,
        RunVerdict::Pass,
        &[check("gpu", CheckVerdict::Pass)],
    )
    .await;
    run(
        store,
        "a-2",
        1,
        RunVerdict::Fail,
        &[check("gpu", CheckVerdict::Fail)],
    )
    .await;
    for attempt in 1..=MAX_ATTEMPTS {
        let checks = if attempt == MAX_ATTEMPTS {
            vec![
                check("warmup", CheckVerdict::Pass),
                check("gpu_count", CheckVerdict::Fail),
                check("bmc", CheckVerdict::Error),
            ]
        } else {
            vec![check("early", CheckVerdict::Fail)]
        };
        run(store, "b-1", attempt, RunVerdict::Fail, &checks).await;
    }

    let racks = store.rack_summaries().await.expect("summaries");
    assert_eq!(
        racks.iter().map(|r| r.rack.as_str()).collect::<Vec<_>>(),
        ["rack-a", "rack-b"]
    );
    let a = &racks[0];
    assert_eq!(a.count(NodeState::Passed), 1);
    assert_eq!(a.count(NodeState::Retrying), 1);
    assert_eq!(a.count(NodeState::Queued), 1);
    assert_eq!((a.total(), a.finished()), (3, 1));
    assert_eq!(racks[1].count(NodeState::DeadLettered), 1);
    let all = totals(&racks);
    assert_eq!((all.total(), all.finished()), (4, 2));

    let nodes = store
        .rack_nodes("rack-a")
        .await
        .expect("nodes")
        .expect("rack-a known");
    assert_eq!(
        nodes
            .iter()
            .map(|n| (n.hostname.as_str(), n.state))
            .collect::<Vec<_>>(),
        [
            ("a-1", NodeState::Passed),
            ("a-2", NodeState::Retrying),
            ("a-3", NodeState::Queued)
        ]
    );
    assert_eq!(nodes[1].attempt, 1);
    assert!(store
        .rack_nodes("no-such-rack")
        .await
        .expect("query")
        .is_none());

    let (dead, total) = store.dead_letters(50).await.expect("dead letters");
    assert_eq!(total, 1);
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert_eq!(
        (d.hostname.as_str(), d.rack.as_str(), d.attempt),
        ("b-1", "rack-b", MAX_ATTEMPTS)
    );
    // Only the last attempt's failing checks, in the order they ran; passes left out.
    assert_eq!(
        d.failed_checks
            .iter()
            .map(|c| (c.name.as_str(), c.verdict))
            .collect::<Vec<_>>(),
        [
            ("gpu_count", CheckVerdict::Fail),
            ("bmc", CheckVerdict::Error)
        ]
    );
    let (none, total) = store.dead_letters(0).await.expect("limit 0");
    assert!(none.is_empty() && total == 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_dashboard_queries() {
    let (store, _dir) = sqlite().await;
    scenario(&store).await;
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_dashboard_queries() {
    let Some(url) = fresh_postgres_database().await else {
        return;
    };
    let store = Store::connect(&url).await.expect("open postgres store");
    scenario(&store).await;
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_store_and_an_empty_rack() {
    let (store, _dir) = sqlite().await;
    assert!(store.rack_summaries().await.expect("summaries").is_empty());
    assert_eq!(store.dead_letters(10).await.expect("dlq").1, 0);
    store.close().await;
}
