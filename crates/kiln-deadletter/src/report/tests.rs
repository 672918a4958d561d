use super::*;
use kiln_findings::{
    analyze, Action, AttemptInput, CheckInput, Component, ComponentKind, Finding, NodeInput,
    Outcome,
};
use kiln_store::triage::{FailingCheck, Resolution};
use serde_json::json;

fn gpu3() -> Component {
    Component::new(ComponentKind::Gpu)
        .index(3)
        .serial(Some("1654922006537".into()))
        .slot(Some("SXM slot 3".into()))
        .pci(Some("00000000:9B:00.0".into()))
}

fn remap_finding() -> Finding {
    Finding::new(
        gpu3(),
        "row_remap_failure",
        Action::Rma,
        "GPU 3: row-remap failure (no spare rows left)",
    )
    .with_evidence("rows remapped: 0 correctable, 8 uncorrectable; pending false, failure true")
    .with_counter("rows_remapped_uncorrectable", 8)
}

fn record(host: &str, rack: &str, reported: Option<&str>) -> TriageRecord {
    let findings = [remap_finding()];
    let analysis = analyze(
        NodeInput {
            hostname: host,
            bmc_address: "10.0.0.9",
        },
        &[AttemptInput {
            attempt: 1,
            checks: vec![CheckInput {
                name: "gpu_row_remap",
                outcome: Outcome::Fail,
                message: "m",
                findings: &findings,
            }],
        }],
    );
    TriageRecord {
        hostname: host.into(),
        cycle: 1,
        rack: rack.into(),
        bmc_address: "10.0.0.9".into(),
        attempts: 1,
        first_failure_at_ms: 1_743_292_800_000, // 2025-03-30T00:00:00Z
        last_failure_at_ms: 1_743_296_400_000,  // 2025-03-30T01:00:00Z
        dead_lettered_at_ms: 1_743_296_400_000,
        action: "rma".into(),
        last_error: "x".into(),
        failing_checks: vec![FailingCheck {
            name: "gpu_row_remap".into(),
            verdict: "fail".into(),
            message: "GPU 3: row-remap failure".into(),
            measured: json!({"uncorrectable": 8}),
            failed_attempts: 1,
            error_attempts: 0,
            action: "rma".into(),
        }],
        labels: Default::default(),
        recorded_at_ms: 0,
        first_reported_day: reported.map(str::to_string),
        analysis: Some(analysis),
        resolution: None,
    }
}

fn berlin() -> Schedule {
    Schedule::parse("08:00", "Europe/Berlin").expect("schedule")
}

fn report(records: Vec<TriageRecord>) -> Report {
    let mut racks: BTreeMap<String, RackReport> = BTreeMap::new();
    for t in records {
        let r = racks.entry(t.rack.clone()).or_insert_with(|| RackReport {
            rack: t.rack.clone(),
            new: vec![],
            still_open: vec![],
            correlated: vec![],
        });
        if t.first_reported_day.is_some() {
            r.still_open.push(t);
        } else {
            r.new.push(t);
        }
    }
    for r in racks.values_mut() {
        r.correlated = correlate(r);
    }
    Report {
        day: "2025-03-30".into(),
        zone: "Europe/Berlin".into(),
        racks: racks.into_values().collect(),
        resolved: vec![],
        dashboard_url: "https://kiln.example.com/".into(),
    }
}

#[test]
fn text_lists_racks_nodes_components_evidence_and_times() {
    let mut r = report(vec![
        record("gpu-a-01", "rack-a", None),
        record("gpu-a-02", "rack-a", Some("2025-03-29")),
        record("gpu-b-01", "rack-b", None),
    ]);
    let mut resolved = record("gpu-c-09", "rack-c", Some("2025-03-28"));
    resolved.resolution = Some(Resolution {
        by: "ana".into(),
        note: "GPU 3 replaced, RMA 12345".into(),
        at_ms: 1_743_300_000_000,
    });
    r.resolved.push(resolved);
    let text = render_text(&r, &berlin());
    assert!(
        text.contains("2 new, 1 still open from earlier reports, 1 resolved"),
        "{text}"
    );
    assert!(text.contains("== Rack rack-a =="));
    assert!(text.contains("== Rack rack-b =="));
    let new_at = text.find("-- New --").expect("new");
    let open_at = text.find("-- Still open").expect("still open");
    let a1 = text.find("* gpu-a-01").expect("a1");
    let a2 = text.find("* gpu-a-02").expect("a2");
    assert!(new_at < a1 && a1 < open_at && open_at < a2, "{text}");
    assert!(text.contains("BMC 10.0.0.9"));
    assert!(
        text.contains("1 attempt: 1 failed, 0 could not run"),
        "{text}"
    );
    assert!(
        text.contains(
            "  RMA candidate: GPU 3, serial 1654922006537, SXM slot 3: row remap failure; run \
             NVIDIA field diagnostic, attach nvidia-bug-report.log.gz"
        ),
        "{text}"
    );
    assert!(text.contains("[GPU 3, serial 1654922006537, SXM slot 3, 00000000:9B:00.0]"));
    assert!(text.contains("| rows remapped: 0 correctable, 8 uncorrectable"));
    assert!(text.contains("attempts: 1 fail (row_remap_failure)"));
    assert!(text.contains("counter rows_remapped_uncorrectable 8 (attempt 1)"));
    assert!(text.contains("node page: https://kiln.example.com/nodes/gpu-a-01"));
    // Two nodes of rack-a share the fault.
    assert!(
        text.contains(
            "! rack rack-a: gpu_row_remap row remap failure on 2 nodes: gpu-a-01, gpu-a-02"
        ),
        "{text}"
    );
    assert!(!text.contains("! rack rack-b"));
    // Times in the report's zone: 00:00Z is 01:00 CET; 01:00Z is 03:00 CEST (after the change).
    assert!(
        text.contains("first 2025-03-30 01:00 CET, last 2025-03-30 03:00 CEST"),
        "{text}"
    );
    assert!(text.contains("== Resolved since the last report =="));
    assert!(text.contains("gpu-c-09 (cycle 1) resolved by ana at"));
    assert!(text.contains(": GPU 3 replaced, RMA 12345"));
    assert_eq!(
        r.subject("[kiln]"),
        "[kiln] 2025-03-30: 2 new, 1 still open, 1 resolved"
    );
    assert_eq!(r.listed().len(), 3);
    let html = render_html(&r, &berlin());
    assert!(html.contains("RMA candidate: GPU 3, serial 1654922006537, SXM slot 3"));
    assert!(html.contains("href=\"https://kiln.example.com/nodes/gpu-a-01\""));
    assert!(html.contains("resolved by ana"));
}

#[test]
fn records_without_an_analysis_show_their_failing_checks() {
    let mut t = record("gpu-a-01", "rack-a", None);
    t.analysis = None;
    t.attempts = 10;
    t.failing_checks[0].failed_attempts = 7;
    t.failing_checks[0].error_attempts = 3;
    let r = report(vec![t]);
    let text = render_text(&r, &berlin());
    assert!(
        text.contains("gpu_row_remap fail (failed 7/10 attempts, could not run in 3; rma)"),
        "{text}"
    );
    assert!(text.contains("measured: {\"uncorrectable\":8}"));
    assert!(render_html(&r, &berlin()).contains("could not run in 3"));
}

#[test]
fn switch_labels_correlate_nodes_behind_one_switch() {
    let mut a = record("gpu-a-01", "rack-a", None);
    let mut b = record("gpu-b-01", "rack-b", None);
    for t in [&mut a, &mut b] {
        t.labels.insert(SWITCH_LABEL.into(), "leaf-07".into());
    }
    let r = report(vec![a, b]);
    let all: Vec<&Correlation> = r.racks.iter().flat_map(|r| &r.correlated).collect();
    assert!(all.is_empty(), "one node per rack: {all:?}");
    // Correlation is per rack: two racks each see their own node only, but one rack holding
    // both sees the switch too.
    let mut c = record("gpu-a-02", "rack-a", None);
    c.labels.insert(SWITCH_LABEL.into(), "leaf-07".into());
    let mut d = record("gpu-a-03", "rack-a", None);
    d.labels.insert(SWITCH_LABEL.into(), "leaf-07".into());
    let r = report(vec![c, d]);
    let scopes: Vec<&str> = r.racks[0]
        .correlated
        .iter()
        .map(|c| c.scope.as_str())
        .collect();
    assert_eq!(scopes, ["switch leaf-07", "rack rack-a"]);
}

#[test]
fn hostile_strings_are_escaped_in_html_and_flattened_in_text() {
    let mut t = record("<script>alert(1)</script>", "r&d\"<b>", None);
    t.bmc_address = "10.0.0.1' onmouseover='x".into();
    let mut f = remap_finding();
    f.message = "line1\n* forged-host  BMC 1.2.3.4".into();
    f.evidence = vec!["</pre><img src=x onerror=alert(2)>".into()];
    f.component.serial = Some("<b>serial</b>".into());
    let findings = [f];
    t.analysis = Some(analyze(
        NodeInput {
            hostname: "h",
            bmc_address: "b",
        },
        &[AttemptInput {
            attempt: 1,
            checks: vec![CheckInput {
                name: "<img src=x onerror=alert(3)>",
                outcome: Outcome::Fail,
                message: "m",
                findings: &findings,
            }],
        }],
    ));
    t.failing_checks[0].measured = json!({"<k>": "</code><script>"});
    let r = report(vec![t.clone()]);
    let html = render_html(&r, &berlin());
    for raw in [
        "<script>",
        "<img",
        "</pre><img",
        "r&d\"<b>",
        "<b>serial</b>",
    ] {
        assert!(!html.contains(raw), "{raw} unescaped in:\n{html}");
    }
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(html.contains("r&amp;d&quot;&lt;b&gt;"), "{html}");
    // maud quotes attributes with `"` and escapes it; a `'` in text content is inert.
    assert!(html.contains("10.0.0.1' onmouseover='x"));
    assert!(html.contains("&lt;img src=x onerror=alert(3)&gt;"));
    let text = render_text(&r, &berlin());
    assert!(!text.contains("\n* forged-host"), "{text}");
    assert!(text.contains("line1 * forged-host"));

    // The older layout escapes too.
    t.analysis = None;
    let html = render_html(&report(vec![t]), &berlin());
    assert!(html.contains("{&quot;&lt;k&gt;&quot;:&quot;&lt;/code&gt;&lt;script&gt;&quot;}"));
    assert!(!html.contains("</code><script>"));
}

#[test]
fn empty_report_and_long_values() {
    let r = report(vec![]);
    assert!(render_text(&r, &berlin()).contains("No node is dead-lettered."));
    assert!(render_html(&r, &berlin()).contains("No node is dead-lettered."));
    let long = json!({"v": "x".repeat(1000)});
    let m = measured_text(&long);
    assert!(m.len() < 500 && m.ends_with("chars cut)"), "{m}");
}

#[test]
fn long_evidence_is_left_to_the_node_page() {
    let mut t = record("gpu-a-01", "rack-a", None);
    if let Some(a) = &mut t.analysis {
        a.components[0].findings[0].evidence = (0..8).map(|i| format!("line {i}")).collect();
    }
    let r = report(vec![t]);
    let text = render_text(&r, &berlin());
    assert!(text.contains("| line 3"));
    assert!(!text.contains("| line 4"));
    assert!(text.contains("... 4 more lines on the node page"));
    let html = render_html(&r, &berlin());
    assert!(html.contains("4 more lines on the node page"));
}
