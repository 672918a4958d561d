//! kiln-intake-bench: intake of a generated N-node manifest (default 10,000) against a real
//! `kiln broker` process (spawned on a scratch directory) and a SQLite store file. Prints the
//! seconds spent validating, looking up, queueing (acks=all, every delivery report awaited)
//! and recording, and the total. Target: under 5 s for 10,000 nodes.
//! `--database-url postgres://...` measures against PostgreSQL instead (use an empty database).
//!
//!   cargo build --release -p kiln -p kiln-intake
//!   target/release/kiln-intake-bench [--nodes N] [--racks R] [--partitions P] [--format csv|json|yaml]
//!                                    [--database-url URL]
//!
//! The broker binary is $KILN_BIN or `kiln` next to this executable.

use std::time::Instant;

use anyhow::{bail, Context};
use kiln_intake::testkit::{kiln_bin, BrokerProcess};
use kiln_intake::{Intake, NoProgress};
use kiln_manifest::{Format, NodeSpec};
use kiln_queue::{NodeProducer, ProducerConfig};
use kiln_store::Store;

const TARGET_S: f64 = 5.0;

struct Opts {
    nodes: usize,
    racks: usize,
    partitions: i32,
    format: Format,
    database_url: Option<String>,
}

fn parse_args() -> anyhow::Result<Opts> {
    let mut o = Opts {
        nodes: 10_000,
        racks: 250,
        partitions: 6,
        format: Format::Csv,
        database_url: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match a.as_str() {
            "--nodes" => o.nodes = value("--nodes")?.parse().context("--nodes")?,
            "--racks" => o.racks = value("--racks")?.parse().context("--racks")?,
            "--partitions" => {
                o.partitions = value("--partitions")?.parse().context("--partitions")?
            }
            "--format" => o.format = value("--format")?.parse().map_err(anyhow::Error::msg)?,
            "--database-url" => o.database_url = Some(value("--database-url")?),
            "-h" | "--help" => {
                println!(
                    "kiln-intake-bench [--nodes N] [--racks R] [--partitions P] [--format csv|json|yaml] [--database-url URL]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    if o.nodes == 0 || o.racks == 0 || o.partitions <= 0 {
        bail!("--nodes, --racks and --partitions must be positive");
    }
    Ok(o)
}

fn generate(nodes: usize, racks: usize) -> Vec<NodeSpec> {
    (0..nodes)
        .map(|i| {
            let rack = format!("r{:04}", i % racks);
            NodeSpec {
                hostname: format!("gpu-{rack}-{:05}.dc1.example.net", i / racks),
                bmc_address: format!("10.{}.{}.{}:443", (i >> 16) & 255, (i >> 8) & 255, i & 255),
                rack,
                gpu_model: "NVIDIA H100 80GB HBM3".into(),
                gpu_count: 8,
                firmware_bmc: "1.10.2".into(),
                firmware_bios: "2.3.1".into(),
                firmware_gpu_vbios: "96.00.74.00.01".into(),
                firmware_nic: "28.39.1002".into(),
                labels: [
                    ("row".to_string(), format!("{}", i % 40)),
                    ("pod".to_string(), "p1".to_string()),
                ]
                .into(),
            }
        })
        .collect()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = parse_args()?;
    let kiln = kiln_bin()?;
    let broker = BrokerProcess::start(&kiln)?;
    kiln_queue::create_topic(&broker.addr, kiln_queue::NODES_TOPIC, o.partitions, 1).await?;
    let dir = tempfile::tempdir()?;
    let db_url = o
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", dir.path().join("kiln.db").display()));

    let text = kiln_manifest::write(&generate(o.nodes, o.racks), o.format);
    println!(
        "intake benchmark: {} nodes in {} racks, {} manifest of {:.1} MiB, broker {} ({} partitions), store {}",
        o.nodes,
        o.racks,
        o.format,
        text.len() as f64 / (1 << 20) as f64,
        kiln.display(),
        o.partitions,
        kiln_store::redact_url(&db_url)
    );

    let store = Store::connect(&db_url).await?;
    let producer = NodeProducer::new(ProducerConfig::new(&broker.addr))?;
    let intake = Intake::new(store, producer);
    // Connect and fetch metadata once so the run below measures intake, not client start-up.
    intake.producer().check_topic().await?;

    let t_total = Instant::now();
    let t = Instant::now();
    let manifest = match kiln_manifest::parse(&text, o.format, None) {
        Ok(m) => m,
        Err(e) => bail!("generated manifest refused: {e}"),
    };
    let validate_s = t.elapsed().as_secs_f64();
    let reg = intake.register(&manifest, &NoProgress).await?;
    let total_s = t_total.elapsed().as_secs_f64();
    if reg.queued.len() != o.nodes || !reg.failed.is_empty() {
        bail!(
            "queued {} of {} nodes ({} failed)\n{}",
            reg.queued.len(),
            o.nodes,
            reg.failed.len(),
            broker.log_tail()
        );
    }

    let t = Instant::now();
    let again = intake.register(&manifest, &NoProgress).await?;
    let again_s = t.elapsed().as_secs_f64();
    if again.already_in_progress.len() != o.nodes || !again.queued.is_empty() {
        bail!("re-registration queued {} nodes", again.queued.len());
    }

    println!("{:<44} {:>9}", "phase", "seconds");
    println!("{:<44} {:>9.3}", "parse + validate", validate_s);
    println!(
        "{:<44} {:>9.3}",
        "store lookup (already registered?)",
        reg.timings.lookup_ms / 1e3
    );
    println!(
        "{:<44} {:>9.3}",
        "queue (produce, acks=all, all reports)",
        reg.timings.produce_ms / 1e3
    );
    println!(
        "{:<44} {:>9.3}",
        "record as queued (one transaction)",
        reg.timings.record_ms / 1e3
    );
    println!("{:<44} {:>9.3}", "total", total_s);
    println!(
        "{:<44} {:>9.3}",
        "re-register same manifest (all reported)", again_s
    );
    println!(
        "intake of {} nodes: {:.2} s ({:.0} nodes/s); target < {TARGET_S} s: {}",
        o.nodes,
        total_s,
        o.nodes as f64 / total_s,
        if total_s < TARGET_S { "met" } else { "NOT met" }
    );
    intake.store().close().await;
    Ok(())
}
