//! `kiln-bench`: measures the broker against the disk it runs on.
//!
//! - `disk`: the disk's own fsync'd sequential bandwidth and small-append fsync latency.
//! - `produce`: a broker with fsync-before-ack, 1 KiB records, pipelined produce requests;
//!   throughput and latency percentiles, printed beside `disk` measured in the same run.
//! - `recovery`: fill a partition, `kill -9` the writer, time the reopen.
//! - `all`: the three, in that order, in one directory.
//! - `cluster`: three `kiln broker` processes with replication factor 3 beside one standalone
//!   broker, the same librdkafka producer (acks=all) against each; throughput, latency, ratio.
//!
//! Figures go to stdout as a table; docs/benchmarks.md records a run.

mod cluster;
mod disk;
mod produce;
mod recovery;

pub use produce::encode_batch as produce_batch;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "kiln-bench", about = "Kiln benchmarks (run with --release)")]
struct Cli {
    /// Directory on the disk to measure (a temporary directory inside it is used and removed).
    #[arg(long, global = true, default_value = "target/bench-data")]
    dir: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Disk(disk::DiskArgs),
    Produce(produce::ProduceArgs),
    Recovery(recovery::RecoveryArgs),
    /// Three `kiln broker` processes (RF 3) beside one standalone broker, librdkafka acks=all.
    Cluster(cluster::ClusterArgs),
    /// Internal: the child process that `recovery` kills.
    #[command(hide = true)]
    RecoveryFill(recovery::FillArgs),
    All {
        #[command(flatten)]
        produce: produce::ProduceArgs,
        #[command(flatten)]
        recovery: recovery::RecoveryArgs,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    std::fs::create_dir_all(&cli.dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Command::Disk(args) => {
            let d = disk::measure(&cli.dir, &args)?;
            disk::print(&d);
        }
        Command::Produce(args) => {
            let d = disk::measure(&cli.dir, &disk::DiskArgs::default())?;
            disk::print(&d);
            let p = runtime.block_on(produce::run(&cli.dir, &args))?;
            produce::print(&p, &d);
        }
        Command::Recovery(args) => recovery::print(&recovery::run(&cli.dir, &args)?),
        Command::Cluster(args) => cluster::print(&cluster::run(&cli.dir, &args, &runtime)?),
        Command::RecoveryFill(args) => recovery::fill(&args)?,
        Command::All {
            produce: pa,
            recovery: ra,
        } => {
            let d = disk::measure(&cli.dir, &disk::DiskArgs::default())?;
            disk::print(&d);
            let p = runtime.block_on(produce::run(&cli.dir, &pa))?;
            produce::print(&p, &d);
            recovery::print(&recovery::run(&cli.dir, &ra)?);
        }
    }
    Ok(())
}
