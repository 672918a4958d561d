//! The check runner: deadlines, step timeouts and panics become `Verdict::Error` with a
//! clear message; a run's verdict combines its steps.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_checks::{run_check, CheckContext, LocalShell, Outcome, Playbook, ScriptedCheck, Verdict};

#[tokio::test]
async fn a_hang_becomes_error_at_the_step_timeout() {
    let ctx = common::ctx(0, Duration::from_secs(60));
    let hang = ScriptedCheck::new("stuck", Outcome::Hang);
    let started = Instant::now();
    let r = run_check(&hang, &ctx, Some(Duration::from_millis(200))).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(r.verdict, Verdict::Error);
    assert_eq!(r.name, "stuck");
    assert!(
        r.message
            .contains("stuck: did not finish within 0.2 s (its timeout)"),
        "{}",
        r.message
    );
    assert_eq!(r.measured["timed_out"], true);
    assert!(r.duration >= Duration::from_millis(200));
}

#[tokio::test]
async fn the_run_deadline_bounds_every_step() {
    let ctx = common::ctx(0, Duration::from_millis(300));
    let hang = ScriptedCheck::new("stuck", Outcome::Hang);
    let r = run_check(&hang, &ctx, Some(Duration::from_secs(3600))).await;
    assert_eq!(r.verdict, Verdict::Error);
    assert!(r.message.contains("(the run's deadline)"), "{}", r.message);
    // Past the deadline the next step is not even started.
    let next = ScriptedCheck::new("next", Outcome::Pass);
    let r = run_check(&next, &ctx, None).await;
    assert_eq!(r.verdict, Verdict::Error);
    assert!(r.message.contains("next: not started"), "{}", r.message);
}

#[tokio::test]
async fn a_panicking_check_becomes_error() {
    let ctx = common::ctx(0, Duration::from_secs(5));
    let r = run_check(&ScriptedCheck::new("boom", Outcome::Panic), &ctx, None).await;
    assert_eq!(r.verdict, Verdict::Error);
    assert!(
        r.message.contains("panicked: scripted panic in boom"),
        "{}",
        r.message
    );
}

#[tokio::test]
async fn a_playbook_of_scripted_checks_runs_in_order() {
    let p = Playbook::parse(
        "playbook: scripted\ntimeout_s: 60\nchecks:\n\
         - check: scripted\n  name: one\n  outcome: pass\n  delay_ms: 10\n\
         - check: scripted\n  name: two\n  outcome: fail\n  message: PSU 2 input lost\n\
         - check: scripted\n  name: three\n  outcome: hang\n  timeout_s: 1\n\
         - check: scripted\n  name: four\n  outcome: error\n",
    )
    .expect("valid");
    let ctx = common::ctx(0, p.timeout);
    let run = p.run(&ctx).await;
    let got: Vec<(&str, Verdict)> = run
        .results
        .iter()
        .map(|r| (r.name.as_str(), r.verdict))
        .collect();
    assert_eq!(
        got,
        vec![
            ("one", Verdict::Pass),
            ("two", Verdict::Fail),
            ("three", Verdict::Error),
            ("four", Verdict::Error)
        ]
    );
    assert_eq!(run.results[1].message, "PSU 2 input lost");
    assert!(
        run.results[2].message.contains("within 1.0 s"),
        "{}",
        run.results[2].message
    );
    assert_eq!(run.verdict, Verdict::Fail);
    // Results serialise for the store with the verdict in lower case and ms durations.
    let json = serde_json::to_value(&run).expect("json");
    assert_eq!(json["results"][1]["verdict"], "fail");
    assert!(json["results"][0]["duration_ms"].as_u64().expect("ms") >= 10);
}

#[test]
fn verdicts_combine_fail_over_error_over_pass() {
    use Verdict::*;
    assert_eq!(Verdict::combine([Pass, Pass]), Pass);
    assert_eq!(Verdict::combine([Pass, Error]), Error);
    assert_eq!(Verdict::combine([Error, Fail, Pass]), Fail);
    assert_eq!(Verdict::combine([]), Pass);
}

#[tokio::test]
async fn a_hung_command_is_killed_at_the_step_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("survived");
    let p = Playbook::parse(&format!(
        "playbook: t\ntimeout_s: 60\nchecks:\n - check: command\n   command: sleep 1.5; touch {}\n   timeout_s: 1\n",
        marker.display()
    ))
    .expect("valid");
    let ctx = CheckContext::new(common::node(0), tokio::time::Instant::now() + p.timeout)
        .with_shell(Arc::new(LocalShell::default()));
    let started = Instant::now();
    let run = p.run(&ctx).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(run.verdict, Verdict::Error);
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(!marker.exists(), "the command outlived its step");
}

#[tokio::test]
async fn a_command_step_passes_and_fails_on_exit_code() {
    let p = Playbook::parse(
        "playbook: t\nchecks:\n - check: command\n   name: ok\n   command: echo fine\n - check: command\n   name: bad\n   command: \"echo 'EDAC MC0: 1 UE' >&2; exit 3\"\n",
    )
    .expect("valid");
    let ctx = CheckContext::new(
        common::node(0),
        tokio::time::Instant::now() + Duration::from_secs(30),
    )
    .with_shell(Arc::new(LocalShell::default()));
    let run = p.run(&ctx).await;
    assert_eq!(run.results[0].verdict, Verdict::Pass);
    assert_eq!(run.results[0].evidence["stdout_tail"], "fine");
    assert_eq!(run.results[1].verdict, Verdict::Fail);
    assert!(
        run.results[1]
            .message
            .contains("exited Some(3), expected 0: EDAC MC0: 1 UE"),
        "{}",
        run.results[1].message
    );
}

#[tokio::test]
async fn checks_without_a_shell_or_bmc_report_error() {
    let p = Playbook::parse(
        "playbook: t\nchecks:\n - check: ethernet\n   interfaces: [eth0]\n   mtu: 1500\n - check: bmc_health\n",
    )
    .expect("valid");
    let ctx = common::ctx(0, Duration::from_secs(5));
    let run = p.run(&ctx).await;
    assert!(run.results.iter().all(|r| r.verdict == Verdict::Error));
    assert!(
        run.results[0].message.contains("no shell to node gpu-a-01"),
        "{}",
        run.results[0].message
    );
    assert!(
        run.results[1].message.contains("no BMC client"),
        "{}",
        run.results[1].message
    );
}

#[test]
fn scripted_hosts_and_percent_limit_the_outcome() {
    let p = Playbook::parse(
        "playbook: fleet\nchecks:\n\
         - check: scripted\n  name: bad\n  outcome: fail\n  hosts: [n1, n2]\n\
         - check: scripted\n  name: flaky\n  outcome: fail\n  percent: 50\n\
         - check: scripted\n  name: never\n  outcome: fail\n  percent: 0\n",
    )
    .expect("parse");
    let kiln_checks::playbook::Spec::Scripted(bad) = &p.steps[0].spec else {
        panic!("scripted")
    };
    assert!(bad.applies_to("n1") && bad.applies_to("n2") && !bad.applies_to("n3"));
    let kiln_checks::playbook::Spec::Scripted(flaky) = &p.steps[1].spec else {
        panic!("scripted")
    };
    let hits = (0..400).filter(|_| flaky.applies_to("n3")).count();
    assert!((100..=300).contains(&hits), "50% came up {hits}/400");
    let kiln_checks::playbook::Spec::Scripted(never) = &p.steps[2].spec else {
        panic!("scripted")
    };
    assert!((0..100).all(|_| !never.applies_to("n1")));
    let err = Playbook::parse(
        "playbook: x\nchecks:\n- check: scripted\n  outcome: fail\n  percent: 101\n",
    )
    .expect_err("percent over 100");
    assert!(err.to_string().contains("percent"), "{err}");
}
