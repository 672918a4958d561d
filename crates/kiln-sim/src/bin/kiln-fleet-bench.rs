//! kiln-fleet-bench: one agent burning in a whole simulated fleet at once with the real
//! checks (sim H100 playbook: Redfish over TLS with sessions, SSH with known_hosts, the
//! probe, sysfs, `ip -j link`, DCGM and gpu-burn output).
//!
//! A real `kiln broker` process; `kiln.nodes` with `--partitions`; a healthy simulated fleet
//! of `--nodes` (8 per rack) in this process; intake registers its manifest; one in-process
//! agent with every node in flight at once (`max_in_flight_per_partition` = nodes, `[ssh]
//! max_sessions` = `--max-sessions`). Reports nodes per minute (all nodes registered to
//! all passed), per-run latency, peak memory (VmHWM of this process: fleet, agent and
//! their runtimes together), peak open file descriptors (sampled every 50 ms) and the most
//! SSH connections and Redfish sessions open at once on the simulated nodes.
//!
//!   cargo build -p kiln -p kiln-sim
//!   target/debug/kiln-fleet-bench [--nodes 200] [--partitions 8] [--max-sessions 256]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kiln_agent::{run_agent, AgentConfig};
use kiln_intake::testkit::{kiln_bin, BrokerProcess};
use kiln_intake::{Intake, NoProgress};
use kiln_queue::{NodeProducer, ProducerConfig};
use kiln_sim::{Fleet, FleetSpec};
use kiln_store::{NodeState, Store};

fn arg(args: &mut impl Iterator<Item = String>, name: &str) -> anyhow::Result<usize> {
    args.next()
        .with_context(|| format!("{name} needs a value"))?
        .parse()
        .with_context(|| name.to_string())
}

/// Open file descriptors of this process.
fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0)
}

/// VmHWM (peak resident memory) of this process, KiB.
fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (mut nodes, mut partitions, mut max_sessions) = (200usize, 8usize, 256usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--nodes" => nodes = arg(&mut args, "--nodes")?,
            "--partitions" => partitions = arg(&mut args, "--partitions")?,
            "--max-sessions" => max_sessions = arg(&mut args, "--max-sessions")?,
            "-h" | "--help" => {
                println!("kiln-fleet-bench [--nodes N] [--partitions P] [--max-sessions S]");
                return Ok(());
            }
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    if nodes == 0 || nodes % 8 != 0 {
        bail!("--nodes must be a positive multiple of 8 (8 nodes per rack)");
    }
    let fds_before = open_fds();
    let kiln = kiln_bin()?;
    let broker = BrokerProcess::start(&kiln)?;
    let p = i32::try_from(partitions).context("--partitions")?;
    kiln_queue::create_topic(&broker.addr, kiln_queue::NODES_TOPIC, p, 1).await?;
    kiln_queue::create_topic(&broker.addr, "kiln.nodes.dlq", 1, 1).await?;
    let dir = tempfile::tempdir()?;
    let db_url = format!("sqlite://{}", dir.path().join("kiln.db").display());

    let mut spec = FleetSpec::new(dir.path().join("sim"));
    spec.racks = nodes / 8;
    spec.nodes_per_rack = 8;
    let t = Instant::now();
    let fleet = Fleet::start(spec).await?;
    let fleet_start = t.elapsed();

    let store = Store::connect(&db_url).await?;
    let intake = Intake::new(store, NodeProducer::new(ProducerConfig::new(&broker.addr))?);
    let manifest = kiln_manifest::Manifest {
        nodes: fleet.manifest(),
    };
    let registered = Instant::now();
    let reg = intake.register(&manifest, &NoProgress).await?;
    if reg.queued.len() != nodes {
        bail!("intake queued {} of {nodes} nodes", reg.queued.len());
    }

    let mut config = fleet.agent_config(AgentConfig {
        bootstrap: broker.addr.clone(),
        database_url: db_url.clone(),
        agent_id: "fleet-bench".into(),
        max_in_flight_per_partition: nodes,
        metrics_listen: "off".into(),
        ..AgentConfig::default()
    });
    config.ssh.max_sessions = max_sessions;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(run_agent(config, async {
        let _ = stop_rx.await;
    }));

    let peak_fds = Arc::new(AtomicU64::new(0));
    let sampler = {
        let peak = peak_fds.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(open_fds(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    let hosts: Vec<String> = manifest.nodes.iter().map(|n| n.hostname.clone()).collect();
    let host_refs: Vec<&str> = hosts.iter().map(String::as_str).collect();
    loop {
        if registered.elapsed() > Duration::from_secs(900) {
            bail!("not all {nodes} nodes passed within 900 s");
        }
        if agent.is_finished() {
            bail!("agent stopped early: {:?}", agent.await);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        let states = intake.store().node_states(&host_refs).await?;
        let not_passed: Vec<_> = states
            .iter()
            .filter(|(_, s)| s.state != NodeState::Passed)
            .collect();
        if let Some((h, s)) = not_passed
            .iter()
            .find(|(_, s)| matches!(s.state, NodeState::Retrying | NodeState::DeadLettered))
        {
            let hist = intake.store().node_history(h).await?;
            bail!(
                "{h} did not pass ({}): {:?}",
                s.state,
                hist.map(|x| x.runs.last().map(|r| r
                    .checks
                    .iter()
                    .filter(|c| c.verdict != kiln_store::CheckVerdict::Pass)
                    .map(|c| format!("{}: {}", c.name, c.message))
                    .collect::<Vec<_>>()))
            );
        }
        if states.len() == nodes && not_passed.is_empty() {
            break;
        }
    }
    let wall = registered.elapsed();
    sampler.abort();
    let _ = stop_tx.send(());
    agent.await.context("agent task")??;

    let mut run_ms = Vec::with_capacity(nodes);
    for h in &hosts {
        if let Some(hist) = intake.store().node_history(h).await? {
            for r in &hist.runs {
                if let Some(end) = r.finished_at_ms {
                    run_ms.push((end - r.started_at_ms) as f64);
                }
            }
        }
    }
    run_ms.sort_by(f64::total_cmp);
    let stats = fleet.stats();
    let per_minute = nodes as f64 / wall.as_secs_f64() * 60.0;
    println!(
        "fleet benchmark: {nodes} simulated H100 nodes ({} racks), {partitions} partitions, one agent, all nodes in flight, SSH max_sessions {max_sessions}, {} build",
        nodes / 8,
        if cfg!(debug_assertions) { "debug" } else { "release" }
    );
    println!(
        "fleet start (listeners, keys, TLS, files): {:.2} s",
        fleet_start.as_secs_f64()
    );
    println!(
        "registered to all passed: {:.2} s = {per_minute:.0} nodes/minute",
        wall.as_secs_f64()
    );
    println!(
        "per run (begin_run to finish_run, {} steps each): median {:.0} ms, p90 {:.0} ms, max {:.0} ms",
        kiln_checks::Playbook::load_file(&fleet.playbooks()[0])
            .map(|p| p.steps.len())
            .unwrap_or(0),
        percentile(&run_ms, 0.5),
        percentile(&run_ms, 0.9),
        run_ms.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "peak memory (VmHWM, whole process): {:.0} MiB",
        vm_hwm_kib() as f64 / 1024.0
    );
    println!(
        "open file descriptors: {fds_before} before, peak {} (both ends of every connection are in this process)",
        peak_fds.load(Ordering::Relaxed)
    );
    println!(
        "SSH connections: peak {} open at once, {} in all, {} commands; Redfish: peak {} sessions at once, {} in all, {} requests",
        stats.ssh_connections_peak,
        stats.ssh_connections_total,
        stats.commands,
        stats.redfish_sessions_peak,
        stats.redfish_sessions_total,
        stats.redfish_requests
    );
    let (open_ssh, open_rf) = (stats.ssh_connections_open, fleet.open_redfish_sessions());
    println!(
        "left open after the agent stopped: {open_ssh} SSH connections, {open_rf} Redfish sessions"
    );
    intake.store().close().await;
    fleet.stop().await;
    Ok(())
}
