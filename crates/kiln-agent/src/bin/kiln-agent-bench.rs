//! kiln-agent-bench: orchestration overhead per node — fetch, store writes, commit — with the
//! checks themselves taking no time (one scripted check that passes at once).
//!
//! A real `kiln broker` process, `kiln.nodes` with one partition, N nodes registered through
//! intake, and one in-process agent (`--in-flight`, default 1: nodes one after another). Two figures:
//! per node, `begin_run` to `finish_run` (both store writes, one of them the result transaction,
//! around the instant check), from the store's own timestamps; and per node amortized, the
//! span from the first run's start to the last run's end divided by N, which also carries the
//! fetches and the offset commits. With more in flight the store's writes queue behind each
//! other (SQLite has one writer), so a node's own latency grows while the amortized cost falls.
//!
//!   cargo build --release -p kiln -p kiln-agent
//!   target/release/kiln-agent-bench [--nodes N]          # broker: $KILN_BIN or `kiln` beside this binary
//!
//! Target: under 10 ms at the median.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kiln_agent::{run_agent, AgentConfig};
use kiln_intake::testkit::{kiln_bin, BrokerProcess};
use kiln_intake::{Intake, NoProgress};
use kiln_manifest::NodeSpec;
use kiln_queue::{NodeProducer, ProducerConfig};
use kiln_store::Store;

const TARGET_MS: f64 = 10.0;

fn node(i: usize) -> NodeSpec {
    NodeSpec {
        hostname: format!("gpu-r0001-{i:05}.dc1.example.net"),
        bmc_address: format!("10.0.{}.{}:443", (i >> 8) & 255, i & 255),
        rack: "r0001".into(),
        gpu_model: "NVIDIA H100 80GB HBM3".into(),
        gpu_count: 8,
        firmware_bmc: "1.10.2".into(),
        firmware_bios: "2.3.1".into(),
        firmware_gpu_vbios: "96.00.74.00.01".into(),
        firmware_nic: "28.39.1002".into(),
        labels: Default::default(),
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut nodes = 300usize;
    let mut in_flight = 1usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--nodes" => {
                nodes = args
                    .next()
                    .context("--nodes needs a value")?
                    .parse()
                    .context("--nodes")?
            }
            "--in-flight" => {
                in_flight = args
                    .next()
                    .context("--in-flight needs a value")?
                    .parse()
                    .context("--in-flight")?
            }
            "-h" | "--help" => {
                println!("kiln-agent-bench [--nodes N] [--in-flight K]");
                return Ok(());
            }
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    if nodes < 2 {
        bail!("--nodes must be at least 2");
    }
    let kiln = kiln_bin()?;
    let broker = BrokerProcess::start(&kiln)?;
    kiln_queue::create_topic(&broker.addr, kiln_queue::NODES_TOPIC, 1, 1).await?;
    kiln_queue::create_topic(&broker.addr, "kiln.nodes.dlq", 1, 1).await?;
    let dir = tempfile::tempdir()?;
    let db_url = format!("sqlite://{}", dir.path().join("kiln.db").display());
    let store = Store::connect(&db_url).await?;
    let intake = Intake::new(store, NodeProducer::new(ProducerConfig::new(&broker.addr))?);
    let specs: Vec<NodeSpec> = (0..nodes).map(node).collect();
    let manifest = kiln_manifest::Manifest {
        nodes: specs.clone(),
    };
    let reg = intake.register(&manifest, &NoProgress).await?;
    if reg.queued.len() != nodes {
        bail!("intake queued {} of {nodes} nodes", reg.queued.len());
    }

    let playbook = dir.path().join("playbook.yaml");
    std::fs::write(
        &playbook,
        "playbook: overhead\ntimeout_s: 30\nchecks:\n - check: scripted\n   name: instant\n   outcome: pass\n",
    )?;
    let config = AgentConfig {
        bootstrap: broker.addr.clone(),
        database_url: db_url.clone(),
        agent_id: "bench".into(),
        playbook: Some(playbook),
        max_in_flight_per_partition: in_flight,
        ..AgentConfig::default()
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(run_agent(config, async {
        let _ = stop_rx.await;
    }));

    let started = Instant::now();
    let hosts: Vec<String> = specs.iter().map(|s| s.hostname.clone()).collect();
    let mut runs: Vec<(i64, i64)> = Vec::with_capacity(nodes);
    loop {
        if started.elapsed() > Duration::from_secs(300) {
            bail!(
                "agent did not finish {nodes} nodes within 300 s\n{}",
                broker.log_tail()
            );
        }
        if agent.is_finished() {
            bail!("agent stopped early: {:?}", agent.await);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        runs.clear();
        for h in &hosts {
            let Some(history) = intake.store().node_history(h).await? else {
                break;
            };
            let Some(run) = history.runs.iter().find(|r| r.finished_at_ms.is_some()) else {
                break;
            };
            runs.push((
                run.started_at_ms,
                run.finished_at_ms.unwrap_or(run.started_at_ms),
            ));
        }
        if runs.len() == nodes {
            break;
        }
    }
    let wall = started.elapsed();
    let _ = stop_tx.send(());
    agent.await.context("agent task")??;

    runs.sort_unstable();
    let first_start = runs.first().map_or(0, |r| r.0);
    let last_end = runs.iter().map(|r| r.1).max().unwrap_or(first_start);
    let amortized_ms = (last_end - first_start) as f64 / nodes as f64;
    let mut run_ms: Vec<f64> = runs.iter().map(|(s, f)| (f - s) as f64).collect();
    run_ms.sort_by(f64::total_cmp);
    let median = percentile(&run_ms, 0.5);
    println!(
        "agent overhead benchmark: {nodes} nodes, 1 partition, {in_flight} in flight, instant check, SQLite store, broker {}",
        kiln.display()
    );
    println!(
        "per node, begin_run to finish_run (store writes + result transaction): median {median:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        percentile(&run_ms, 0.9),
        percentile(&run_ms, 0.99),
        run_ms.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "per node amortized over the whole run (fetch + store + commit): {amortized_ms:.1} ms ({:.0} nodes/s)",
        1000.0 / amortized_ms.max(f64::MIN_POSITIVE)
    );
    println!(
        "wall time from start of polling: {:.2} s; target median < {TARGET_MS} ms: {}",
        wall.as_secs_f64(),
        if median < TARGET_MS && amortized_ms < TARGET_MS {
            "met"
        } else {
            "NOT met"
        }
    );
    intake.store().close().await;
    Ok(())
}
