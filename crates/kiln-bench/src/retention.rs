//! Retention on replicated partitions: three brokers, a topic created with short retention and
//! small segments, `--gib` written, then `--wait-s` seconds of no traffic. Printed: what each
//! broker's data directory held right after the writes and after the wait (beside what was
//! written: every broker holds a replica of every partition), and every partition's log start
//! offset (ListOffsets EARLIEST) and high watermark.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Args;
use rdkafka::producer::Producer;

use crate::brokers::{Brokers, TopicSpec};
use crate::cluster::{self, LoadArgs};

const TOPIC: &str = "aged";

#[derive(Args, Debug, Clone)]
pub struct RetentionArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// GiB of record values written.
    #[arg(long, default_value_t = 1.5)]
    pub gib: f64,
    /// The topic's `retention.ms`.
    #[arg(long, default_value_t = 20_000)]
    pub retention_ms: u64,
    /// The topic's `segment.bytes`.
    #[arg(long, default_value_t = 16 * 1024 * 1024)]
    pub segment_bytes: u64,
    /// Seconds waited after the last acknowledgement before measuring.
    #[arg(long, default_value_t = 60)]
    pub wait_s: u64,
}

pub fn run(
    dir: &Path,
    args: &RetentionArgs,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    cluster::check_load(&args.load)?;
    if args.gib.is_nan() || args.gib <= 0.0 {
        bail!("--gib must be above 0");
    }
    let kiln_bin = cluster::kiln_bin(&args.load.kiln_bin)?;
    let tmp = tempfile::tempdir_in(dir)?;
    let mut brokers = Brokers::start_cluster(&kiln_bin, tmp.path(), 3, "")?;
    let result = measure(&mut brokers, args, runtime);
    brokers.kill_all();
    result
}

fn measure(
    brokers: &mut Brokers,
    args: &RetentionArgs,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    let load = &args.load;
    let retention = args.retention_ms.to_string();
    let segment = args.segment_bytes.to_string();
    let configs = [
        ("retention.ms", retention.as_str()),
        ("segment.bytes", segment.as_str()),
    ];
    let spec = TopicSpec {
        name: TOPIC,
        partitions: load.partitions,
        replication_factor: 3,
        configs: &configs,
    };
    let ready = Duration::from_secs(load.ready_timeout_s);
    let (bootstrap, _) = cluster::prepare(brokers, &spec, ready, runtime)?;
    let producer = cluster::producer(&bootstrap, load)?;
    cluster::warm_up(&producer, brokers, TOPIC, load, Instant::now() + ready)?;
    producer.context().reset();
    let records = (args.gib * (1u64 << 30) as f64 / load.record_bytes as f64) as u64;
    let written = records * load.record_bytes as u64;
    let start = Instant::now();
    cluster::drive(&producer, TOPIC, load, "retention", &mut |sent, _| {
        sent >= records
    })?;
    cluster::finish(&producer, brokers, "retention", records)?;
    let acked = producer.context().ok.load(Ordering::Relaxed);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    println!(
        "retention  topic {TOPIC}: {} partitions, RF 3, retention.ms={}, segment.bytes={}; \
         {acked} records ({:.2} GiB) acknowledged in {:.1} s",
        load.partitions,
        args.retention_ms,
        args.segment_bytes,
        gib(written),
        start.elapsed().as_secs_f64()
    );
    let before: Vec<u64> = brokers
        .procs
        .iter()
        .map(|p| crate::disk::dir_bytes(&p.data_dir))
        .collect::<anyhow::Result<_>>()?;
    std::thread::sleep(Duration::from_secs(args.wait_s));
    brokers.check_alive()?;
    let mut worst = 0.0f64;
    for (p, held_before) in brokers.procs.iter().zip(&before) {
        let held = crate::disk::dir_bytes(&p.data_dir)?;
        let share = held as f64 / written as f64;
        worst = worst.max(share);
        println!(
            "retention  broker {}: data directory {:.2} GiB after the writes, {:.3} GiB {} s \
             later ({:.1}% of what was written)",
            p.id,
            gib(*held_before),
            gib(held),
            args.wait_s,
            100.0 * share
        );
    }
    let mut starts = Vec::new();
    for partition in 0..load.partitions {
        let (low, high) = producer
            .client()
            .fetch_watermarks(TOPIC, partition, Duration::from_secs(10))
            .map_err(|e| anyhow::anyhow!("ListOffsets of {TOPIC}/{partition}: {e}"))?;
        starts.push(low);
        println!("retention  {TOPIC}/{partition}: EARLIEST {low}, high watermark {high}");
    }
    println!(
        "retention  largest replica holds {:.1}% of what was written (target under 25%); \
         EARLIEST above 0 on {} of {} partitions",
        100.0 * worst,
        starts.iter().filter(|&&s| s > 0).count(),
        starts.len()
    );
    Ok(())
}
