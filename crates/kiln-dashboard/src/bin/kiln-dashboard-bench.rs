//! `kiln-dashboard-bench`: seeds a SQLite results store with a fleet (10,000 nodes in racks of
//! 32 by default, mixed states, runs with check results written through the store's API), serves
//! the dashboard on loopback and times pages over HTTP: the overview, the dead-letter list, a
//! rack and a node, median and p99 over repeated requests, against the 200 ms target.
//!
//! `cargo run --release -p kiln-dashboard --bin kiln-dashboard-bench -- --help`

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use kiln_dashboard::seed::{hostname, planned_state, rack_name, seed_fleet, FleetSpec};
use kiln_dashboard::{serve, DashboardConfig};
use kiln_store::{NodeState, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TARGET_MS: f64 = 200.0;

#[derive(Parser, Debug)]
#[command(about = "Time the dashboard's pages over HTTP on a seeded SQLite store")]
struct Args {
    /// Nodes to seed.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// Nodes per rack.
    #[arg(long, default_value_t = 32)]
    rack_size: usize,
    /// Timed requests per page (after 5 untimed ones).
    #[arg(long, default_value_t = 200)]
    requests: usize,
    /// Directory for the SQLite file (default: a temporary directory, under /dev/shm when it
    /// exists so seeding is not bound by fsync; the page timings read from the page cache
    /// either way).
    #[arg(long)]
    dir: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.nodes == 0 || args.rack_size == 0 || args.requests == 0 {
        bail!("--nodes, --rack-size and --requests must be at least 1");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let base = match &args.dir {
        Some(d) => d.clone(),
        None if std::path::Path::new("/dev/shm").is_dir() => PathBuf::from("/dev/shm"),
        None => std::env::temp_dir(),
    };
    let dir = tempfile::Builder::new()
        .prefix("kiln-dashboard-bench")
        .tempdir_in(&base)
        .with_context(|| format!("temporary directory under {}", base.display()))?;
    let url = format!("sqlite://{}", dir.path().join("kiln.db").display());
    let store = Store::connect(&url).await?;

    let t0 = Instant::now();
    let seeded = seed_fleet(
        &store,
        &FleetSpec {
            nodes: args.nodes,
            rack_size: args.rack_size,
            start_ms: kiln_dashboard::now_ms() - 86_400_000,
        },
    )
    .await?;
    println!(
        "seeded {} nodes in {} racks, {} runs, {} check results in {:.1} s ({})",
        args.nodes,
        seeded.racks.len(),
        seeded.runs,
        seeded.checks,
        t0.elapsed().as_secs_f64(),
        dir.path().display()
    );
    println!(
        "states: {}",
        seeded
            .counts
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        listener,
        store.clone(),
        DashboardConfig::new(None),
        async move {
            let _ = stop_rx.await;
        },
    ));

    let dead = (0..args.nodes)
        .find(|i| planned_state(*i) == NodeState::DeadLettered)
        .map_or_else(|| hostname(0), hostname);
    let pages = [
        ("overview /".to_string(), "/".to_string()),
        ("dead letters".to_string(), "/dead-letters".to_string()),
        (
            format!("rack page ({} nodes)", args.rack_size.min(args.nodes)),
            format!("/racks/{}", rack_name(0, args.rack_size)),
        ),
        (
            format!("node page ({dead}, 10 runs)"),
            format!("/nodes/{dead}"),
        ),
    ];
    println!(
        "\n{:<32} {:>8} {:>11} {:>11} {:>11} {:>10}  target {TARGET_MS} ms",
        "page", "requests", "median ms", "p99 ms", "max ms", "bytes"
    );
    let mut all_ok = true;
    for (name, path) in &pages {
        for _ in 0..5 {
            get(&addr.to_string(), path).await?;
        }
        let mut times = Vec::with_capacity(args.requests);
        let mut bytes = 0;
        for _ in 0..args.requests {
            let t = Instant::now();
            bytes = get(&addr.to_string(), path).await?;
            times.push(t.elapsed());
        }
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let median = ms(times[times.len() / 2]);
        let p99 = ms(times[(times.len() * 99).div_ceil(100).saturating_sub(1)]);
        let max = ms(times[times.len() - 1]);
        let ok = median <= TARGET_MS && p99 <= TARGET_MS;
        all_ok &= ok;
        println!(
            "{name:<32} {:>8} {median:>11.2} {p99:>11.2} {max:>11.2} {bytes:>10}  {}",
            args.requests,
            if ok { "ok" } else { "OVER" }
        );
    }
    let _ = stop_tx.send(());
    server.await.context("dashboard task")??;
    store.close().await;
    println!(
        "\n{}",
        if all_ok {
            "every page's median and p99 within the target"
        } else {
            "some page is over the target"
        }
    );
    Ok(())
}

/// One `GET` over a fresh connection; the body's length. Fails on anything but 200.
async fn get(addr: &str, path: &str) -> anyhow::Result<usize> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut buf = Vec::with_capacity(256 * 1024);
    s.read_to_end(&mut buf).await?;
    let head_end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of the HTTP header")?;
    let status = String::from_utf8_lossy(&buf[..buf.len().min(12)]).to_string();
    if !status.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {status}");
    }
    Ok(buf.len() - head_end - 4)
}
