//! Replica moves: how fast a partition's log is copied to a broker that did not hold it
//! (docs/replication.md, "Moving replicas"), with producers writing meanwhile and without.
//!
//! On a fresh cluster of three `kiln broker` processes:
//! 1. the disk's own 4-stream fsync'd bandwidth is measured (`disk.rs`);
//! 2. one partition at RF 2 is filled with `--fill-mib` MiB of 64 KiB records;
//! 3. for each rate in `--live-rates` (records of 1 KiB per second to another topic of three
//!    partitions at RF 3, acks=all, idempotent; `max`: as fast as the producer goes), the
//!    partition's second replica moves to the broker that holds none
//!    (AlterPartitionReassignments), and the move is followed (ListPartitionReassignments,
//!    every 50 ms) until it ends.
//!
//! Printed per rate: the seconds the move took, the partition's size on its leader
//! (DescribeLogDirs) over that time in MiB/s, the ratio to the disk's bandwidth, and the live
//! records per second acknowledged meanwhile. The run fails if a move does not end within
//! `--move-timeout-s` or the live producer loses a record.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use kafka_protocol::messages::alter_partition_reassignments_request::{
    ReassignablePartition, ReassignableTopic,
};
use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, BrokerId, DescribeLogDirsRequest,
    ListPartitionReassignmentsRequest, RequestKind, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kiln_client::Connection;

use crate::brokers::{self, Brokers, TopicSpec};
use crate::cluster::{self, Live, LoadArgs};
use crate::disk::{self, DiskArgs};

const BULK: &str = "bulk";
const LIVE: &str = "live";
const BULK_RECORD_BYTES: usize = 64 << 10;
const LIVE_RECORD_BYTES: usize = 1024;
const LIVE_PARTITIONS: i32 = 3;
/// How often a move under way is looked at.
const POLL: Duration = Duration::from_millis(50);
/// One request to one broker.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Args, Debug, Clone)]
pub struct MovesArgs {
    /// The `kiln` binary the brokers run.
    #[arg(long, default_value = "target/release/kiln")]
    pub kiln_bin: std::path::PathBuf,
    /// MiB written to the partition that moves.
    #[arg(long, default_value_t = 1024)]
    pub fill_mib: u64,
    /// Live producer rates during the moves, records/s (`max`: unpaced), one move each.
    #[arg(long, value_delimiter = ',', default_value = "0,10000,30000,max")]
    pub live_rates: Vec<String>,
    /// Longest one move may take.
    #[arg(long, default_value_t = 600)]
    pub move_timeout_s: u64,
    /// Longest wait for the brokers to listen, the cluster to form and the topics to be led.
    #[arg(long, default_value_t = 60)]
    pub ready_timeout_s: u64,
}

struct Figures {
    /// Records/s asked of the live producer (`None`: unpaced).
    rate: Option<u64>,
    seconds: f64,
    mib: f64,
    live_per_s: f64,
}

pub fn run(dir: &Path, args: &MovesArgs, runtime: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let rates = args
        .live_rates
        .iter()
        .map(|r| match r.trim() {
            "max" => Ok(None),
            n => n
                .parse::<u64>()
                .map(Some)
                .with_context(|| format!("--live-rates: {n:?} is neither a number nor max")),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if rates.is_empty() || args.fill_mib == 0 || args.move_timeout_s == 0 {
        bail!("--live-rates needs a rate; --fill-mib and --move-timeout-s must be at least 1");
    }
    let disk = disk::measure(dir, &DiskArgs::default())?;
    let kiln_bin = cluster::kiln_bin(&args.kiln_bin)?;
    let tmp = tempfile::tempdir_in(dir)?;
    let mut brokers = Brokers::start_cluster(&kiln_bin, tmp.path(), 3, "")?;
    let figures = measure(&mut brokers, args, &rates, runtime);
    brokers.kill_all();
    let figures = figures?;
    println!(
        "disk: {:.0} MiB/s fsync'd with {} streams",
        disk.parallel_bandwidth_mib_s, disk.streams
    );
    println!("live_rate  live_records/s  moved_mib  seconds  mib/s  ratio_to_disk");
    for f in &figures {
        let rate = f.rate.map_or_else(|| "max".to_string(), |r| r.to_string());
        let mib_s = f.mib / f.seconds;
        println!(
            "{rate:>9}  {:>14.0}  {:>9.0}  {:>7.2}  {:>5.0}  {:>13.2}",
            f.live_per_s,
            f.mib,
            f.seconds,
            mib_s,
            mib_s / disk.parallel_bandwidth_mib_s
        );
    }
    Ok(())
}

fn measure(
    brokers: &mut Brokers,
    args: &MovesArgs,
    rates: &[Option<u64>],
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<Vec<Figures>> {
    let deadline = Instant::now() + Duration::from_secs(args.ready_timeout_s);
    brokers.wait_listening(deadline)?;
    let bootstrap = brokers.bootstrap();
    brokers::wait_brokers_listed(brokers, &bootstrap, deadline)?;
    brokers::wait_formed(brokers, runtime, deadline)?;
    for (name, partitions, replication_factor) in [(BULK, 1, 2), (LIVE, LIVE_PARTITIONS, 3)] {
        let spec = TopicSpec {
            name,
            partitions,
            replication_factor,
            configs: &[],
        };
        brokers::create_topic(brokers, runtime, &bootstrap, &spec, deadline)?;
        brokers::wait_leaders(brokers, &bootstrap, name, partitions, deadline)?;
    }
    fill(brokers, &bootstrap, args.fill_mib)?;
    let addr = |id: i32| -> anyhow::Result<String> {
        let i = brokers.index_of(id)?;
        Ok(brokers.procs[i].kafka.clone())
    };
    let addrs: Vec<(i32, String)> = (1..=3)
        .map(|id| addr(id).map(|a| (id, a)))
        .collect::<anyhow::Result<_>>()?;
    let mut out = Vec::new();
    for &rate in rates {
        let live = Live::start(&bootstrap, LIVE, live_load(), rate)?;
        std::thread::sleep(Duration::from_secs(2));
        let before = live.acknowledged();
        let (replicas, size) = runtime.block_on(bulk_replicas(&addrs))?;
        let Some(&keep) = replicas.first() else {
            bail!("the partition names no replica");
        };
        let to = (1..=3)
            .find(|b| !replicas.contains(b))
            .context("no broker is free")?;
        let target = vec![keep, to];
        let started = Instant::now();
        runtime.block_on(move_and_wait(
            &addrs[0].1,
            &target,
            Duration::from_secs(args.move_timeout_s),
        ))?;
        let seconds = started.elapsed().as_secs_f64();
        let live_per_s = (live.acknowledged() - before) as f64 / seconds;
        live.stop(brokers)?;
        println!(
            "moved {:.0} MiB of {BULK}/0 from broker {} to {to} in {seconds:.2} s with the live producer at {}",
            size as f64 / f64::from(1 << 20),
            replicas.get(1).copied().unwrap_or(-1),
            rate.map_or_else(|| "its fastest".to_string(), |r| format!("{r} records/s")),
        );
        out.push(Figures {
            rate,
            seconds,
            mib: size as f64 / f64::from(1 << 20),
            live_per_s,
        });
    }
    Ok(out)
}

/// Writes `mib` MiB of 64 KiB records to the partition that moves.
fn fill(brokers: &mut Brokers, bootstrap: &str, mib: u64) -> anyhow::Result<()> {
    let load = LoadArgs {
        record_bytes: BULK_RECORD_BYTES,
        partitions: 1,
        in_flight: 256,
        ..live_load()
    };
    let producer = cluster::producer(bootstrap, &load)?;
    let records = mib * (1 << 20) / BULK_RECORD_BYTES as u64;
    let sent = cluster::drive(&producer, BULK, &load, "fill", &mut |i, _| i >= records)?;
    cluster::finish(&producer, brokers, "fill", sent)
}

/// The live producer's load (1 KiB records over the live topic, idempotent); the fill
/// overrides the record size and partitions.
fn live_load() -> LoadArgs {
    LoadArgs {
        kiln_bin: std::path::PathBuf::new(),
        record_bytes: LIVE_RECORD_BYTES,
        partitions: LIVE_PARTITIONS,
        linger_ms: 5,
        batch_bytes: 1_000_000,
        in_flight: 10_000,
        ready_timeout_s: 60,
        idempotence: true,
    }
}

fn topic(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

/// The moving partition's replicas (as broker 1 sees them: Metadata) and its size on its
/// first replica (DescribeLogDirs).
async fn bulk_replicas(addrs: &[(i32, String)]) -> anyhow::Result<(Vec<i32>, i64)> {
    let (_, first) = addrs.first().context("no broker")?;
    let mut conn = Connection::connect(first, REQUEST_TIMEOUT).await?;
    let request = kafka_protocol::messages::MetadataRequest::default().with_topics(Some(vec![
        kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
            .with_name(Some(topic(BULK))),
    ]));
    let ResponseKind::Metadata(m) = conn
        .call(RequestKind::Metadata(request), REQUEST_TIMEOUT)
        .await?
    else {
        bail!("unexpected response to Metadata");
    };
    let replicas: Vec<i32> = m
        .topics
        .first()
        .and_then(|t| t.partitions.first())
        .map(|p| p.replica_nodes.iter().map(|b| b.0).collect())
        .unwrap_or_default();
    let holder = replicas.first().copied().context("no replica")?;
    let (_, addr) = addrs
        .iter()
        .find(|(id, _)| *id == holder)
        .context("the first replica is not a broker")?;
    let mut conn = Connection::connect(addr, REQUEST_TIMEOUT).await?;
    let request =
        DescribeLogDirsRequest::default()
            .with_topics(Some(vec![DescribableLogDirTopic::default()
                .with_topic(topic(BULK))
                .with_partitions(vec![0])]));
    let ResponseKind::DescribeLogDirs(d) = conn
        .call(RequestKind::DescribeLogDirs(request), REQUEST_TIMEOUT)
        .await?
    else {
        bail!("unexpected response to DescribeLogDirs");
    };
    let size = d
        .results
        .iter()
        .flat_map(|r| &r.topics)
        .flat_map(|t| &t.partitions)
        .map(|p| p.partition_size)
        .max()
        .context("broker holds no replica of the partition")?;
    Ok((replicas, size))
}

/// Moves the partition to `target` and waits until no move is under way.
async fn move_and_wait(addr: &str, target: &[i32], timeout: Duration) -> anyhow::Result<()> {
    let mut conn = Connection::connect(addr, REQUEST_TIMEOUT).await?;
    let request = AlterPartitionReassignmentsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(vec![ReassignableTopic::default()
            .with_name(topic(BULK))
            .with_partitions(vec![ReassignablePartition::default()
                .with_partition_index(0)
                .with_replicas(Some(
                    target.iter().map(|b| BrokerId(*b)).collect(),
                ))])]);
    let ResponseKind::AlterPartitionReassignments(r) = conn
        .call(
            RequestKind::AlterPartitionReassignments(request),
            REQUEST_TIMEOUT,
        )
        .await?
    else {
        bail!("unexpected response to AlterPartitionReassignments");
    };
    let refused = r
        .responses
        .iter()
        .flat_map(|t| &t.partitions)
        .find(|p| p.error_code != 0);
    if r.error_code != 0 || refused.is_some() {
        bail!("the move was refused: {r:?}");
    }
    let deadline = Instant::now() + timeout;
    loop {
        let request = ListPartitionReassignmentsRequest::default().with_timeout_ms(10_000);
        let ResponseKind::ListPartitionReassignments(l) = conn
            .call(
                RequestKind::ListPartitionReassignments(request),
                REQUEST_TIMEOUT,
            )
            .await?
        else {
            bail!("unexpected response to ListPartitionReassignments");
        };
        if l.topics.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("the move did not end within {timeout:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}
