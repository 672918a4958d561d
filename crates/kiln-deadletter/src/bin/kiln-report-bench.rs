//! `kiln-report-bench`: the daily report for many dead-lettered nodes. Writes N triage records
//! (500 by default) into a SQLite store, each with an analysis made by kiln-findings from
//! findings shaped like the checks' (a row-remap GPU with its counters, a GPU with Xid lines,
//! a flapping HCA, over two attempts), then times building the report from the store and
//! rendering both parts and the whole email, and prints the sizes, against the targets (under
//! 1 s, under 5 MB).
//!
//! `cargo run --release -p kiln-deadletter --bin kiln-report-bench -- --help`

use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use kiln_deadletter::mail::build_message;
use kiln_deadletter::{build_report, render_html, render_text, DeadletterConfig, Schedule};
use kiln_findings::{
    analyze, Action, AttemptInput, CheckInput, Component, ComponentKind, Finding, NodeInput,
    Outcome,
};
use kiln_store::triage::{FailingCheck, TriageRecord};
use kiln_store::Store;

const TARGET_S: f64 = 1.0;
const TARGET_BYTES: usize = 5_000_000;

#[derive(Parser, Debug)]
#[command(about = "Time the dead-letter report for many nodes on a SQLite store")]
struct Args {
    /// Dead-lettered nodes.
    #[arg(long, default_value_t = 500)]
    nodes: usize,
    /// Nodes per rack.
    #[arg(long, default_value_t = 32)]
    rack_size: usize,
    /// Timed repetitions (the median is reported).
    #[arg(long, default_value_t = 5)]
    repeat: usize,
}

fn gpu(node: usize, i: u32) -> Component {
    Component::new(ComponentKind::Gpu)
        .index(i)
        .serial(Some(format!("1654922{node:06}{i}")))
        .uuid(Some(format!("GPU-5d6c2b1e-8f0a-4c3e-9b7d-{node:08}{i:04}")))
        .pci(Some(format!("00000000:{:02X}:00.0", 0x18 + i * 0x10)))
        .slot(Some(format!("SXM slot {}", i + 1)))
}

/// One attempt's findings, as the real checks make them.
fn findings(node: usize, attempt: u32) -> [(&'static str, Vec<Finding>); 3] {
    let remap = Finding::new(
        gpu(node, 3),
        "row_remap_failure",
        Action::Rma,
        "GPU 3 (GPU-…, 00000000:48:00.0): row-remap failure (no spare rows left): run NVIDIA \
         field diagnostic, attach nvidia-bug-report",
    )
    .with_evidence("rows remapped: 0 correctable, 8 uncorrectable; pending false, failure true")
    .with_counter("rows_remapped_uncorrectable", 8)
    .with_counter("rows_remapped_correctable", 0);
    let mut xid = Finding::new(
        gpu(node, 5),
        "xid_79",
        Action::Reboot,
        "GPU 5: Xid 79 (GPU has fallen off the bus; NVIDIA: RESTART_BM, reboot the node) x6",
    );
    for k in 0..6 {
        xid.push_evidence(format!(
            "[ {}.337204] NVRM: Xid (PCI:0000:68:00): 79, pid={}, name=gpu_burn, GPU has fallen \
             off the bus.",
            5012 + k,
            2877 + k
        ));
    }
    let ib = Finding::new(
        Component::new(ComponentKind::Hca)
            .name("mlx5_3 (ib3)")
            .pci(Some("0000:54:00.0".into()))
            .slot(Some("HCA-4".into())),
        "ib_symbol_error",
        Action::ReseatCable,
        "mlx5_3 port 1: symbol_error grew by 412 since the run's first InfiniBand check (max 0)",
    )
    .with_evidence(format!(
        "symbol_error: {} -> {}",
        100 * attempt,
        100 * attempt + 412
    ))
    .with_counter("symbol_error_after", u64::from(100 * attempt + 412));
    [
        ("gpu_row_remap", vec![remap]),
        ("gpu_xid", vec![xid]),
        ("infiniband", vec![ib]),
    ]
}

fn record(node: usize, rack_size: usize) -> TriageRecord {
    let hostname = format!("gpu-{node:05}");
    let attempts: Vec<[(&str, Vec<Finding>); 3]> = (1..=2).map(|a| findings(node, a)).collect();
    let inputs: Vec<AttemptInput<'_>> = attempts
        .iter()
        .zip(1..)
        .map(|(checks, attempt)| AttemptInput {
            attempt,
            checks: checks
                .iter()
                .map(|(name, f)| CheckInput {
                    name,
                    outcome: Outcome::Fail,
                    message: "m",
                    findings: f,
                })
                .collect(),
        })
        .collect();
    let analysis = analyze(
        NodeInput {
            hostname: &hostname,
            bmc_address: "10.1.0.7",
        },
        &inputs,
    );
    TriageRecord {
        hostname: hostname.clone(),
        cycle: 1,
        rack: format!("rack-{:04}", node / rack_size),
        bmc_address: format!("10.1.{}.{}", node / 250, node % 250),
        attempts: 2,
        first_failure_at_ms: 1_743_292_800_000,
        last_failure_at_ms: 1_743_296_400_000,
        dead_lettered_at_ms: 1_743_296_400_000,
        action: analysis.action.map_or("investigate", Action::as_str).into(),
        last_error: "gpu_row_remap: row-remap failure".into(),
        failing_checks: ["gpu_row_remap", "gpu_xid", "infiniband"]
            .iter()
            .map(|n| FailingCheck {
                name: (*n).into(),
                verdict: "fail".into(),
                message: "m".into(),
                measured: serde_json::json!({"gpus": [{"index": 3, "row_remap": {"uncorrectable": 8}}]}),
                failed_attempts: 2,
                error_attempts: 0,
                action: "rma".into(),
            })
            .collect(),
        labels: [("switch".to_string(), format!("leaf-{:02}", node / 16))].into(),
        recorded_at_ms: 0,
        first_reported_day: None,
        analysis: Some(analysis),
        resolution: None,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.nodes > 0 && args.rack_size > 0 && args.repeat > 0,
        "all counts > 0"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("kiln.db").display());
    let mut config = DeadletterConfig::default();
    config.report.to = vec!["hw-oncall@example.com".into()];
    config.report.dashboard_url = "https://kiln.example.com".into();
    let schedule = Schedule::parse("08:00", "UTC")?;
    let day: jiff::civil::Date = "2025-03-30".parse()?;
    rt.block_on(async {
        let store = Store::connect(&url).await?;
        for i in 0..args.nodes {
            store.record_triage(&record(i, args.rack_size)).await?;
        }
        let (mut build, mut text_s, mut html_s, mut mail_s) = (vec![], vec![], vec![], vec![]);
        let mut sizes = (0, 0, 0);
        for _ in 0..args.repeat {
            let t = Instant::now();
            let report = build_report(&store, day, &schedule, &config.report).await?;
            build.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let text = render_text(&report, &schedule);
            text_s.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let html = render_html(&report, &schedule);
            html_s.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let (message, _) = build_message(&config, &report, &schedule, 0)?;
            let raw = message.formatted();
            mail_s.push(t.elapsed().as_secs_f64());
            anyhow::ensure!(report.count_new() == args.nodes, "every node in the report");
            sizes = (text.len(), html.len(), raw.len());
        }
        store.close().await;
        let (b, t, h, m) = (
            median(build),
            median(text_s),
            median(html_s),
            median(mail_s),
        );
        let total = b + m;
        println!(
            "{} dead-lettered nodes in {} racks, 3 components and 2 attempts each",
            args.nodes,
            args.nodes.div_ceil(args.rack_size)
        );
        println!("build from the store  {:>8.1} ms", b * 1000.0);
        println!("render text           {:>8.1} ms  {:>9} bytes", t * 1000.0, sizes.0);
        println!("render HTML           {:>8.1} ms  {:>9} bytes", h * 1000.0, sizes.1);
        println!(
            "whole email           {:>8.1} ms  {:>9} bytes (both parts, encoded)",
            m * 1000.0,
            sizes.2
        );
        println!(
            "build + email {:.3} s (target under {TARGET_S} s: {}), email {:.2} MB (target under {} MB: {})",
            total,
            if total < TARGET_S { "met" } else { "MISSED" },
            sizes.2 as f64 / 1e6,
            TARGET_BYTES / 1_000_000,
            if sizes.2 < TARGET_BYTES { "met" } else { "MISSED" }
        );
        Ok::<_, anyhow::Error>(())
    })
    .context("report benchmark")
}
