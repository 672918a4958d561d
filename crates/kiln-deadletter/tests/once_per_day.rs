//! Triage records and the once-per-day rule against a real SQLite file and a real PostgreSQL
//! server (`KILN_TEST_POSTGRES_URL`, see kiln_store::testing): nodes are dead-lettered through
//! the store's own run API, reports go through the file transport into a directory, and every
//! email is counted there. "Restart" is a fresh connection to the same database.

use std::path::Path;

use jiff::civil::{date, Date};
use kiln_agent::DeadLetter;
use kiln_deadletter::config::TransportKind;
use kiln_deadletter::triage::triage_record;
use kiln_deadletter::{build_report, send_report, DeadletterConfig, Mailer, Schedule, SendOutcome};
use kiln_manifest::NodeSpec;
use kiln_queue::NodeMessage;
use kiln_store::triage::ReportClaim;
use kiln_store::{BeginRun, CheckResult, CheckVerdict, QueuedNode, RunVerdict, Store};
use serde_json::json;

fn spec(host: &str, rack: &str) -> NodeSpec {
    kiln_store::testing::sample_node(host, rack)
}

/// Runs `node` through ten failing attempts of `cycle` (the agent's store calls) and returns
/// the dead letter an agent would produce.
async fn dead_letter(store: &Store, node: &NodeSpec, cycle: u32, check: &str) -> DeadLetter {
    for attempt in 1..=10 {
        let at = 1_000_000 + i64::from(attempt) * 1000;
        let run = match store
            .begin_run(node, cycle, attempt, "agent-t", at)
            .await
            .expect("begin")
        {
            BeginRun::Started { run } => run,
            other => panic!("begin_run: {other:?}"),
        };
        let checks = [CheckResult {
            name: check.into(),
            verdict: CheckVerdict::Fail,
            measured: json!({"attempt": attempt}),
            message: format!("{check} failed"),
            evidence: String::new(),
            findings: Vec::new(),
        }];
        store
            .finish_run(run, RunVerdict::Fail, &checks, at + 500)
            .await
            .expect("finish");
    }
    let mut message = NodeMessage::first(node.clone(), cycle, 0);
    message.attempt = 10;
    DeadLetter {
        v: 1,
        message,
        last_error: format!("{check} failed"),
        history: store.node_history(&node.hostname).await.expect("history"),
        agent: "agent-t".into(),
        dead_lettered_at_ms: 1_020_000,
    }
}

fn emails(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .expect("mail dir")
        .map(|e| std::fs::read_to_string(e.expect("entry").path()).expect("eml"))
        .collect();
    out.sort();
    out
}

async fn send(store: &Store, config: &DeadletterConfig, day: Date) -> SendOutcome {
    let mailer = Mailer::new(config).expect("mailer");
    let schedule = config.schedule().expect("schedule");
    match send_report(store, &mailer, config, &schedule, day, false).await {
        Ok(o) => o,
        Err(f) => panic!("send_report: {:#}", f.error),
    }
}

async fn scenario(url: &str, mail_dir: &Path) {
    let mut config = DeadletterConfig {
        database_url: url.to_string(),
        transport: TransportKind::File,
        ..DeadletterConfig::default()
    };
    config.file.dir = mail_dir.to_path_buf();
    config.report.to = vec!["ops@example.com".into()];
    config.report.timezone = "Europe/Berlin".into();
    config.instance_id = "sender-1".into();
    let schedule: Schedule = config.schedule().expect("schedule");
    let (day1, day2, day3) = (date(2025, 3, 29), date(2025, 3, 30), date(2025, 3, 31));

    let store = Store::connect(url).await.expect("connect");
    let a = spec("gpu-a-01", "rack-a");
    let b = spec("gpu-b-07", "rack-b");
    let queued: Vec<QueuedNode> = [&a, &b]
        .into_iter()
        .map(|s| QueuedNode {
            spec: s.clone(),
            cycle: 1,
        })
        .collect();
    store.record_queued(&queued, 1).await.expect("queued");

    // Nothing dead-lettered yet: an empty day is not sent (and not claimed).
    assert_eq!(
        send(&store, &config, day1).await,
        SendOutcome::Empty {
            day: "2025-03-29".into()
        }
    );
    assert!(store.report_day("2025-03-29").await.expect("row").is_none());

    for (node, check) in [(&a, "gpu_ecc"), (&b, "infiniband")] {
        let dl = dead_letter(&store, node, 1, check).await;
        let record = triage_record(&dl, dl.history.as_ref(), 2_000_000);
        assert!(store.record_triage(&record).await.expect("record"));
        // A redelivered dead letter changes nothing.
        assert!(!store.record_triage(&record).await.expect("record again"));
    }
    let report = build_report(&store, day1, &schedule, &config.report)
        .await
        .expect("report");
    assert_eq!((report.count_new(), report.count_still_open()), (2, 0));
    assert_eq!(report.racks[0].new[0].action, "investigate");
    assert_eq!(report.racks[1].new[0].action, "reseat_cable");
    assert_eq!(report.racks[1].new[0].failing_checks[0].failed_attempts, 10);

    // Day 1: sent once; again, and after a "restart", not again.
    let sent = send(&store, &config, day1).await;
    assert!(
        matches!(
            &sent,
            SendOutcome::Sent {
                new: 2,
                still_open: 0,
                ..
            }
        ),
        "{sent:?}"
    );
    assert_eq!(emails(mail_dir).len(), 1);
    assert!(matches!(
        send(&store, &config, day1).await,
        SendOutcome::AlreadySent { .. }
    ));
    store.close().await;
    let store = Store::connect(url).await.expect("reconnect");
    assert!(matches!(
        send(&store, &config, day1).await,
        SendOutcome::AlreadySent { .. }
    ));
    assert_eq!(emails(mail_dir).len(), 1, "no second email for day 1");
    let row = store
        .report_day("2025-03-29")
        .await
        .expect("row")
        .expect("sent");
    assert_eq!(
        (row.status.as_str(), row.nodes_new, row.nodes_open),
        ("sent", Some(2), Some(2))
    );
    assert!(emails(mail_dir)[0].contains(row.message_id.as_deref().expect("id")));

    // Day 2: a sender claimed the day and died before recording (crash between claim/send and
    // record). Nobody sends day 2 again: at most once.
    assert_eq!(
        store
            .claim_report_day("2025-03-30", "crashed-sender", 5)
            .await
            .expect("claim"),
        ReportClaim::Claimed
    );
    assert!(matches!(
        store.claim_report_day("2025-03-30", "sender-1", 6).await.expect("claim"),
        ReportClaim::InFlight { ref by, at_ms: 5 } if by == "crashed-sender"
    ));
    assert!(matches!(
        send(&store, &config, day2).await,
        SendOutcome::Unfinished { .. }
    ));
    assert!(!store
        .release_report_day("2025-03-30", "sender-1")
        .await
        .expect("release"));
    assert_eq!(emails(mail_dir).len(), 1);

    // Day 3: node a was requeued (next cycle): resolved. Node b is listed as still open.
    store
        .record_queued(
            &[QueuedNode {
                spec: a.clone(),
                cycle: 2,
            }],
            3,
        )
        .await
        .expect("requeue");
    let report = build_report(&store, day3, &schedule, &config.report)
        .await
        .expect("report");
    assert_eq!((report.count_new(), report.count_still_open()), (0, 1));
    assert_eq!(report.racks.len(), 1);
    assert_eq!(report.racks[0].still_open[0].hostname, "gpu-b-07");
    assert_eq!(
        report.racks[0].still_open[0].first_reported_day.as_deref(),
        Some("2025-03-29")
    );
    assert!(matches!(
        send(&store, &config, day3).await,
        SendOutcome::Sent {
            new: 0,
            still_open: 1,
            ..
        }
    ));
    let all = emails(mail_dir);
    assert_eq!(all.len(), 2);
    assert!(all
        .iter()
        .any(|m| m.contains("2025-03-31: 0 new, 1 still open")));

    // A mail server that is down is found before the day is claimed: the day stays free.
    let mut smtp = config.clone();
    smtp.transport = TransportKind::Smtp;
    smtp.smtp.host = "127.0.0.1".into();
    smtp.smtp.port = 1; // nothing listens there
    smtp.smtp.security = kiln_deadletter::config::Security::Plain;
    smtp.smtp.timeout_ms = 2000;
    let mailer = Mailer::new(&smtp).expect("mailer");
    let day4 = date(2025, 4, 1);
    let failure = send_report(&store, &mailer, &smtp, &schedule, day4, false)
        .await
        .expect_err("no server");
    assert!(failure.retryable);
    assert!(store.report_day("2025-04-01").await.expect("row").is_none());
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_per_day_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("kiln.db").display());
    let mail = dir.path().join("mail");
    scenario(&url, &mail).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_per_day_on_postgres() {
    let Some(url) = kiln_store::testing::fresh_postgres_database().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    scenario(&url, &dir.path().join("mail")).await;
}
