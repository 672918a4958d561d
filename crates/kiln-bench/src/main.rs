//! `kiln-bench`: measures the broker against the disk it runs on.
//!
//! - `disk`: the disk's own fsync'd sequential bandwidth and small-append fsync latency.
//! - `produce`: a broker with fsync-before-ack, 1 KiB records, pipelined produce requests;
//!   throughput and latency percentiles, printed beside `disk` measured in the same run.
//! - `recovery`: fill a partition, `kill -9` the writer, time the reopen.
//! - `all`: the three, in that order, in one directory.
//! - `cluster`: three `kiln broker` processes with replication factor 3 beside one standalone
//!   broker, the same librdkafka producer (acks=all) against each; throughput, latency, ratio.
//! - `soak`: three brokers under sustained load (throughput beside the disk, memory over
//!   time), then one killed with SIGKILL and restarted (time to listen, to rejoin every ISR).
//! - `retention`: what replicas hold once retention has run, and where partitions start.
//! - `offsets`: a broker's restart time to serve committed offsets, few vs many commits.
//! - `idempotence`: librdkafka's idempotent producer against the same producer with it off.
//! - `partitions`: thousands of RF 3 partitions on three brokers: time to create, idle CPU,
//!   memory, threads and descriptors, produce throughput, failover of a third of the leaders.
//! - `moves`: a partition's replica moved to a new broker under live producers, beside the disk.
//! - `failover`: leader changes in a loaded minute with nothing failing, then leaders killed one
//!   after another: each kill to the first write a new leader acknowledges.
//!
//! `scripts/bench-produce-vs REV` runs `produce` with this tree's build and an earlier
//! commit's, alternating, for a ratio measured in one sitting.
//!
//! Figures go to stdout as a table; docs/benchmarks.md records a run.

mod brokers;
mod cluster;
mod disk;
mod failover;
mod idempotence;
mod moves;
mod offsets;
mod partitions;
mod produce;
mod recovery;
mod retention;
mod sasl;
mod soak;

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
    /// Three brokers (RF 3) under sustained acks=all load: throughput beside the disk, memory
    /// over time, then a broker killed with SIGKILL and restarted.
    Soak(soak::SoakArgs),
    /// Retention on three brokers: a topic with short retention and small segments, written,
    /// left alone, then what each replica still holds and where each partition now starts.
    Retention(retention::RetentionArgs),
    /// Restart time of a broker's committed offsets after few and after many commits.
    Offsets(offsets::OffsetsArgs),
    /// librdkafka's idempotent producer beside the same producer with it off.
    Idempotence(idempotence::IdempotenceArgs),
    /// N partitions at RF 3 on three brokers (N = 300, 1,000, 3,000): creation, idle cost,
    /// throughput over all of them, and failover when a broker leading a third is killed.
    Partitions(partitions::PartitionsArgs),
    /// One partition's log copied to a broker that did not hold it (a replica move), with a
    /// producer writing meanwhile at several rates: MiB/s beside the disk's bandwidth.
    Moves(moves::MovesArgs),
    /// Three brokers (RF 3): leader changes while merely loaded, then partition leaders killed
    /// with SIGKILL one after another, each kill to the first write acknowledged by a new one.
    Failover(failover::FailoverArgs),
    /// `produce` over plain TCP and over mutual TLS, alternated: the throughput ratio.
    Tls(produce::ProduceArgs),
    /// New connections with and without a SCRAM login: what the login costs.
    Sasl(sasl::SaslArgs),
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
    // The broker's own runtime: the produce benchmarks run the broker in this process.
    let runtime = kiln_broker::runtime::builder().build()?;
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
        Command::Soak(args) => soak::run(&cli.dir, &args, &runtime)?,
        Command::Retention(args) => retention::run(&cli.dir, &args, &runtime)?,
        Command::Offsets(args) => offsets::run(&cli.dir, &args, &runtime)?,
        Command::Idempotence(args) => idempotence::run(&cli.dir, &args, &runtime)?,
        Command::Partitions(args) => partitions::run(&cli.dir, &args, &runtime)?,
        Command::Moves(args) => moves::run(&cli.dir, &args, &runtime)?,
        Command::Failover(args) => failover::run(&cli.dir, &args, &runtime)?,
        Command::Tls(args) => runtime.block_on(produce::compare_tls(&cli.dir, &args))?,
        Command::Sasl(args) => runtime.block_on(sasl::run(&cli.dir, &args))?,
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
