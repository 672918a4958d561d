//! The results store against real databases: every test runs once on a SQLite file and once
//! on a PostgreSQL database of the server `scripts/test` starts (KILN_TEST_POSTGRES_URL).

use kiln_findings::{Action, Component, ComponentKind, Finding};
use kiln_manifest::NodeSpec;
use kiln_store::testing::fresh_postgres_database;
use kiln_store::{
    BeginRun, CheckResult, CheckVerdict, FinishOptions, NodeState, QueuedNode, RunVerdict, Store,
    StoreError, EVIDENCE_BYTES_MAX, MAX_ATTEMPTS,
};

struct Db {
    store: Store,
    url: String,
    _dir: Option<tempfile::TempDir>,
}

async fn sqlite() -> Option<Db> {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("kiln.db").display());
    let store = Store::connect(&url).await.expect("open sqlite store");
    Some(Db {
        store,
        url,
        _dir: Some(dir),
    })
}

async fn postgres() -> Option<Db> {
    let url = fresh_postgres_database().await?;
    let store = Store::connect(&url).await.expect("open postgres store");
    Some(Db {
        store,
        url,
        _dir: None,
    })
}

macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() {
                   let db = super::sqlite().await.expect("sqlite");
                   super::$name(&db).await;
                   db.store.close().await;
               } )*
        }
        mod postgres {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() {
                   let Some(db) = super::postgres().await else { return };
                   super::$name(&db).await;
                   db.store.close().await;
               } )*
        }
    };
}

on_both_backends!(
    migrations_are_applied_once_and_reopen_cleanly,
    record_queued_then_states_and_listing,
    record_queued_again_for_the_same_cycle_changes_nothing,
    a_passing_run_is_recorded_whole_and_redelivery_does_no_harm,
    ten_failed_attempts_dead_letter_then_a_new_cycle_starts,
    begin_run_records_a_node_intake_never_recorded,
    an_unfinished_run_is_resumed_by_the_next_agent,
    concurrent_begin_runs_of_one_attempt_make_one_run,
    the_database_itself_keeps_node_cycle_attempt_unique,
    unknown_runs_and_oversized_evidence,
    a_failed_run_can_dead_letter_at_once_and_keeps_its_findings,
    triage_records_keep_their_analysis_and_resolution,
);

fn spec(host: &str, rack: &str) -> NodeSpec {
    kiln_store::testing::sample_node(host, rack)
}

fn queued(host: &str, rack: &str, cycle: u32) -> QueuedNode {
    QueuedNode {
        spec: spec(host, rack),
        cycle,
    }
}

fn check(name: &str, verdict: CheckVerdict) -> CheckResult {
    CheckResult {
        name: name.into(),
        verdict,
        measured: serde_json::json!({"gpu_count": 8, "expected": 8, "temps_c": [41.5, 43.0]}),
        message: format!("{name} looked at 8 GPUs"),
        evidence: "nvidia-smi -q\n...raw output...".into(),
        findings: Vec::new(),
    }
}

async fn migrations_are_applied_once_and_reopen_cleanly(db: &Db) {
    db.store
        .record_queued(&[queued("n1", "a", 1)], 1000)
        .await
        .expect("record");
    let again = Store::connect(&db.url)
        .await
        .expect("reopen runs migrations again without error");
    let states = again.node_states(&["n1"]).await.expect("states");
    assert_eq!(
        states["n1"].state,
        NodeState::Queued,
        "data survives a reopen"
    );
    again.close().await;
}

async fn record_queued_then_states_and_listing(db: &Db) {
    let nodes = [
        queued("a1", "a", 1),
        queued("a2", "a", 1),
        queued("b1", "b", 1),
    ];
    assert_eq!(
        db.store.record_queued(&nodes, 1000).await.expect("record"),
        3
    );
    let states = db
        .store
        .node_states(&["a1", "a2", "b1", "zz"])
        .await
        .expect("states");
    assert_eq!(states.len(), 3, "unknown hostnames are left out");
    for s in states.values() {
        assert_eq!((s.state, s.cycle, s.attempt), (NodeState::Queued, 1, 1));
    }
    let by_state = db.store.nodes_by_state("a").await.expect("by state");
    assert_eq!(by_state[&NodeState::Queued], ["a1", "a2"]);
    assert!(by_state[&NodeState::Running].is_empty());
    let h = db
        .store
        .node_history("b1")
        .await
        .expect("history")
        .expect("known");
    assert_eq!(
        h.node.spec,
        spec("b1", "b"),
        "manifest data round-trips, labels included"
    );
    assert_eq!(h.node.registered_at_ms, 1000);
    assert_eq!(h.events.len(), 1);
    assert_eq!(h.events[0].state, NodeState::Queued);
    assert!(h.runs.is_empty());
    assert!(db
        .store
        .node_history("nope")
        .await
        .expect("history")
        .is_none());

    // Many nodes go in several multi-row statements, still one transaction.
    let many: Vec<QueuedNode> = (0..1234)
        .map(|i| queued(&format!("m{i}"), "m", 1))
        .collect();
    assert_eq!(
        db.store
            .record_queued(&many, 2000)
            .await
            .expect("record many"),
        1234
    );
    let names: Vec<String> = many.iter().map(|n| n.spec.hostname.clone()).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    assert_eq!(
        db.store.node_states(&refs).await.expect("states").len(),
        1234
    );
}

async fn record_queued_again_for_the_same_cycle_changes_nothing(db: &Db) {
    db.store
        .record_queued(&[queued("n1", "a", 1)], 1000)
        .await
        .expect("record");
    let mut moved = queued("n1", "b", 1);
    moved.spec.firmware_bios = "9.9".into();
    assert_eq!(
        db.store
            .record_queued(&[moved], 2000)
            .await
            .expect("record again"),
        0
    );
    let h = db
        .store
        .node_history("n1")
        .await
        .expect("history")
        .expect("known");
    assert_eq!(h.node.spec.rack, "a");
    assert_eq!(h.node.spec.firmware_bios, "2.3.1");
    assert_eq!(h.events.len(), 1, "no second event");
}

async fn a_passing_run_is_recorded_whole_and_redelivery_does_no_harm(db: &Db) {
    let s = &db.store;
    s.record_queued(&[queued("n1", "a", 1)], 1000)
        .await
        .expect("record");
    let run = match s
        .begin_run(&spec("n1", "a"), 1, 1, "agent-1", 2000)
        .await
        .expect("begin")
    {
        BeginRun::Started { run } => run,
        other => panic!("expected Started, got {other:?}"),
    };
    assert_eq!(
        s.node_states(&["n1"]).await.expect("st")["n1"].state,
        NodeState::Running
    );
    let checks = [
        check("gpu_count", CheckVerdict::Pass),
        check("redfish_health", CheckVerdict::Warn),
    ];
    let done = s
        .finish_run(run, RunVerdict::Pass, &checks, 3000)
        .await
        .expect("finish");
    assert_eq!(done.state, NodeState::Passed);
    assert!(!done.already_finished);

    // Redelivered message: the attempt is recognised, not run again.
    match s
        .begin_run(&spec("n1", "a"), 1, 1, "agent-2", 4000)
        .await
        .expect("begin again")
    {
        BeginRun::AlreadyFinished {
            run: r,
            verdict,
            state,
        } => {
            assert_eq!(
                (r, verdict, state),
                (run, RunVerdict::Pass, NodeState::Passed)
            );
        }
        other => panic!("expected AlreadyFinished, got {other:?}"),
    }
    let again = s
        .finish_run(run, RunVerdict::Fail, &checks, 5000)
        .await
        .expect("finish again");
    assert!(again.already_finished);
    assert_eq!(again.state, NodeState::Passed, "the first verdict stands");

    let h = s.node_history("n1").await.expect("history").expect("known");
    assert_eq!(h.node.state, NodeState::Passed);
    assert_eq!(h.runs.len(), 1);
    let r = &h.runs[0];
    assert_eq!((r.cycle, r.attempt, r.agent.as_str()), (1, 1, "agent-1"));
    assert_eq!(
        (r.started_at_ms, r.finished_at_ms, r.verdict),
        (2000, Some(3000), Some(RunVerdict::Pass))
    );
    assert_eq!(
        r.checks, checks,
        "checks stored once, measured JSON and evidence intact"
    );
    let states: Vec<NodeState> = h.events.iter().map(|e| e.state).collect();
    assert_eq!(
        states,
        [NodeState::Queued, NodeState::Running, NodeState::Passed]
    );
}

async fn ten_failed_attempts_dead_letter_then_a_new_cycle_starts(db: &Db) {
    let s = &db.store;
    let node = spec("n1", "a");
    s.record_queued(&[queued("n1", "a", 1)], 1000)
        .await
        .expect("record");
    for attempt in 1..=MAX_ATTEMPTS {
        let run = match s
            .begin_run(&node, 1, attempt, "agent", 1000)
            .await
            .expect("begin")
        {
            BeginRun::Started { run } => run,
            other => panic!("attempt {attempt}: {other:?}"),
        };
        let done = s
            .finish_run(
                run,
                RunVerdict::Fail,
                &[check("gpu_count", CheckVerdict::Fail)],
                1000,
            )
            .await
            .expect("finish");
        let want = if attempt < MAX_ATTEMPTS {
            NodeState::Retrying
        } else {
            NodeState::DeadLettered
        };
        assert_eq!(done.state, want, "after attempt {attempt}");
    }
    let h = s.node_history("n1").await.expect("history").expect("known");
    assert_eq!(h.node.state, NodeState::DeadLettered);
    assert!(
        h.node.state_reason.contains("gpu_count"),
        "{}",
        h.node.state_reason
    );
    assert_eq!(h.runs.len(), MAX_ATTEMPTS as usize);

    // Repaired and registered again: cycle 2, attempt 1, queued.
    assert_eq!(
        s.record_queued(&[queued("n1", "a", 2)], 9000)
            .await
            .expect("re-register"),
        1
    );
    let st = s.node_states(&["n1"]).await.expect("st")["n1"];
    assert_eq!((st.state, st.cycle, st.attempt), (NodeState::Queued, 2, 1));
    // A late duplicate of an unfinished-looking old message is stale news.
    match s
        .begin_run(&node, 1, 3, "agent", 9500)
        .await
        .expect("old message")
    {
        BeginRun::AlreadyFinished {
            verdict: RunVerdict::Fail,
            state: NodeState::Retrying,
            ..
        } => {}
        other => panic!("old finished attempt: {other:?}"),
    }
    match s
        .begin_run(&node, 2, 1, "agent", 9600)
        .await
        .expect("new cycle")
    {
        BeginRun::Started { .. } => {}
        other => panic!("new cycle: {other:?}"),
    }
    assert_eq!(
        s.node_history("n1")
            .await
            .expect("h")
            .expect("k")
            .runs
            .len(),
        MAX_ATTEMPTS as usize + 1
    );
}

async fn begin_run_records_a_node_intake_never_recorded(db: &Db) {
    // Intake produced the message and died before recording it: the agent's begin_run
    // creates the node from the message, and intake's late record changes nothing.
    let s = &db.store;
    let node = spec("ghost", "g");
    assert!(matches!(
        s.begin_run(&node, 1, 1, "agent", 1000)
            .await
            .expect("begin"),
        BeginRun::Started { .. }
    ));
    assert_eq!(
        s.record_queued(&[queued("ghost", "g", 1)], 1100)
            .await
            .expect("late record"),
        0
    );
    let h = s.node_history("ghost").await.expect("h").expect("known");
    assert_eq!(
        h.node.state,
        NodeState::Running,
        "the late record did not move it back to queued"
    );
    assert_eq!(h.node.spec, node);
    assert_eq!(
        s.nodes_by_state("g").await.expect("by state")[&NodeState::Running],
        ["ghost"]
    );
}

async fn an_unfinished_run_is_resumed_by_the_next_agent(db: &Db) {
    let s = &db.store;
    s.record_queued(&[queued("n1", "a", 1)], 1000)
        .await
        .expect("record");
    let BeginRun::Started { run } = s
        .begin_run(&spec("n1", "a"), 1, 1, "agent-1", 1000)
        .await
        .expect("b")
    else {
        panic!("not started");
    };
    match s
        .begin_run(&spec("n1", "a"), 1, 1, "agent-2", 2000)
        .await
        .expect("again")
    {
        BeginRun::Resumed {
            run: r,
            previous_agent,
        } => {
            assert_eq!(r, run);
            assert_eq!(previous_agent, "agent-1");
        }
        other => panic!("expected Resumed, got {other:?}"),
    }
    let h = s.node_history("n1").await.expect("h").expect("k");
    assert_eq!(h.runs.len(), 1);
    assert_eq!(h.runs[0].agent, "agent-2");
    assert_eq!(h.runs[0].finished_at_ms, None);
}

async fn concurrent_begin_runs_of_one_attempt_make_one_run(db: &Db) {
    let s = &db.store;
    s.record_queued(&[queued("n1", "a", 1)], 1000)
        .await
        .expect("record");
    let mut tasks = Vec::new();
    for i in 0..8 {
        let store = s.clone();
        tasks.push(tokio::spawn(async move {
            store
                .begin_run(&spec("n1", "a"), 1, 1, &format!("agent-{i}"), 1000)
                .await
        }));
    }
    let mut started = 0;
    for t in tasks {
        match t
            .await
            .expect("join")
            .expect("no database error under contention")
        {
            BeginRun::Started { .. } => started += 1,
            BeginRun::Resumed { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(started, 1, "exactly one run started");
    assert_eq!(
        s.node_history("n1")
            .await
            .expect("h")
            .expect("k")
            .runs
            .len(),
        1
    );
}

async fn the_database_itself_keeps_node_cycle_attempt_unique(db: &Db) {
    db.store
        .record_queued(&[queued("n1", "a", 1)], 1000)
        .await
        .expect("record");
    let sql = "INSERT INTO runs (hostname, cycle, attempt, agent, started_at_ms) VALUES ('n1', 1, 1, 'x', 0)";
    let result = match &db.store {
        Store::Sqlite(p) => {
            sqlx::query(sql).execute(p).await.expect("first insert");
            sqlx::query(sql).execute(p).await.map(|_| ())
        }
        Store::Postgres(p) => {
            sqlx::query(sql).execute(p).await.expect("first insert");
            sqlx::query(sql).execute(p).await.map(|_| ())
        }
    };
    let err = result.expect_err("second (n1, 1, 1) run must be refused by the schema");
    assert!(err.to_string().to_lowercase().contains("unique"), "{err}");
}

async fn unknown_runs_and_oversized_evidence(db: &Db) {
    let s = &db.store;
    assert!(matches!(
        s.finish_run(424242, RunVerdict::Pass, &[], 0).await,
        Err(StoreError::UnknownRun(424242))
    ));
    s.record_queued(&[queued("n1", "a", 1)], 1000)
        .await
        .expect("record");
    let BeginRun::Started { run } = s
        .begin_run(&spec("n1", "a"), 1, 1, "a", 1)
        .await
        .expect("b")
    else {
        panic!("not started");
    };
    let mut big = check("sel", CheckVerdict::Fail);
    big.evidence = "é".repeat(EVIDENCE_BYTES_MAX); // 2 bytes each: twice the limit
    s.finish_run(run, RunVerdict::Fail, &[big], 2)
        .await
        .expect("finish");
    let h = s.node_history("n1").await.expect("h").expect("k");
    let ev = &h.runs[0].checks[0].evidence;
    assert!(ev.len() < EVIDENCE_BYTES_MAX + 100, "cut to the limit");
    assert!(
        ev.ends_with(&format!(
            "[... {} bytes cut by kiln-store]",
            EVIDENCE_BYTES_MAX
        )),
        "says what was cut"
    );
}

async fn a_failed_run_can_dead_letter_at_once_and_keeps_its_findings(db: &Db) {
    let s = &db.store;
    let node = spec("n1", "a");
    let run = match s
        .begin_run(&node, 1, 1, "agent", 1000)
        .await
        .expect("begin")
    {
        BeginRun::Started { run } => run,
        other => panic!("{other:?}"),
    };
    let mut c = check("gpu_row_remap", CheckVerdict::Fail);
    c.findings = vec![Finding::new(
        Component::new(ComponentKind::Gpu)
            .index(3)
            .serial(Some("1654922006537".into())),
        "row_remap_failure",
        Action::Rma,
        "GPU 3: row-remap failure",
    )
    .with_evidence("rows remapped: 0 correctable, 8 uncorrectable")
    .with_counter("rows_remapped_uncorrectable", 8)];
    let early = FinishOptions {
        dead_letter_now: Some("RMA candidate: GPU 3".into()),
    };
    let done = s
        .finish_run_with(
            run,
            RunVerdict::Fail,
            std::slice::from_ref(&c),
            1500,
            &early,
        )
        .await
        .expect("finish");
    assert_eq!(
        (done.state, done.already_finished),
        (NodeState::DeadLettered, false)
    );
    // A redelivered attempt finds it finished, and dead-lettered, not retrying.
    let again = s
        .finish_run_with(
            run,
            RunVerdict::Fail,
            std::slice::from_ref(&c),
            1600,
            &early,
        )
        .await
        .expect("again");
    assert_eq!(
        (again.state, again.already_finished),
        (NodeState::DeadLettered, true)
    );
    assert!(s
        .add_event("n1", "remediation reset_gpu: exit Some(0)", 1700)
        .await
        .expect("event"));
    assert!(!s.add_event("nobody", "x", 1700).await.expect("unknown"));
    let h = s.node_history("n1").await.expect("history").expect("known");
    assert!(
        h.node
            .state_reason
            .contains("dead-lettered at once: RMA candidate"),
        "{}",
        h.node.state_reason
    );
    assert_eq!(
        h.runs[0].checks[0].findings, c.findings,
        "findings round-trip"
    );
    assert!(h.events.iter().any(|e| e.reason.starts_with("remediation")));
    let a = h.analysis(1);
    assert_eq!(a.action, Some(Action::Rma));
    assert_eq!(
        a.components[0].component.serial.as_deref(),
        Some("1654922006537")
    );
}

async fn triage_records_keep_their_analysis_and_resolution(db: &Db) {
    use kiln_store::triage::TriageRecord;
    let s = &db.store;
    let node = spec("n2", "b");
    let run = match s
        .begin_run(&node, 1, 1, "agent", 1000)
        .await
        .expect("begin")
    {
        BeginRun::Started { run } => run,
        other => panic!("{other:?}"),
    };
    let early = FinishOptions {
        dead_letter_now: Some("x".into()),
    };
    s.finish_run_with(
        run,
        RunVerdict::Fail,
        &[check("gpu_ecc", CheckVerdict::Fail)],
        1100,
        &early,
    )
    .await
    .expect("finish");
    let h = s.node_history("n2").await.expect("h").expect("known");
    let record = TriageRecord {
        hostname: "n2".into(),
        cycle: 1,
        rack: "b".into(),
        bmc_address: node.bmc_address.clone(),
        attempts: 1,
        first_failure_at_ms: 1100,
        last_failure_at_ms: 1100,
        dead_lettered_at_ms: 1100,
        action: "investigate".into(),
        last_error: "gpu_ecc failed".into(),
        failing_checks: vec![],
        labels: [("switch".to_string(), "leaf-3".to_string())].into(),
        recorded_at_ms: 1200,
        first_reported_day: None,
        analysis: Some(h.analysis(1)),
        resolution: None,
    };
    assert!(s.record_triage(&record).await.expect("record"));
    let open = s.open_triage().await.expect("open");
    assert_eq!(open, vec![record.clone()], "analysis and labels round-trip");
    assert_eq!(
        s.open_triage_by_action(Some("investigate"))
            .await
            .expect("by action")
            .len(),
        1
    );
    assert!(s
        .open_triage_by_action(Some("rma"))
        .await
        .expect("rma")
        .is_empty());
    let resolved = s
        .resolve_triage("n2", "ana", "GPU 3 replaced, RMA 12345", 5000)
        .await
        .expect("resolve")
        .expect("open record");
    assert_eq!(
        resolved.resolution.as_ref().map(|r| r.by.as_str()),
        Some("ana")
    );
    assert!(s
        .resolve_triage("nobody", "ana", "x", 5000)
        .await
        .expect("none")
        .is_none());
    let since = s.resolved_since(4000).await.expect("since");
    assert_eq!(since.len(), 1);
    assert_eq!(
        since[0].resolution.as_ref().map(|r| r.note.as_str()),
        Some("GPU 3 replaced, RMA 12345")
    );
    assert!(s.resolved_since(6000).await.expect("later").is_empty());
}

#[tokio::test]
async fn unsupported_urls_are_refused_with_a_clear_message() {
    let err = Store::connect("mysql://root:secret@localhost/db")
        .await
        .expect_err("mysql");
    let msg = err.to_string();
    assert!(msg.contains("unsupported database URL"), "{msg}");
    assert!(!msg.contains("secret"), "password leaked: {msg}");
    let err = Store::connect("sqlite:///nonexistent-dir-kiln/x/kiln.db")
        .await
        .expect_err("no dir");
    assert!(
        err.to_string().contains("cannot open the database"),
        "{err}"
    );
}
