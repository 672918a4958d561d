//! Sustained load on three brokers (RF 3, acks=all), memory over time, and a restart after
//! `kill -9` with everything written still on disk.
//!
//! 1. The disk's own fsync'd bandwidth (1 and 4 streams), measured in the same directory.
//! 2. One librdkafka producer writes 1 KiB records as fast as the cluster takes them until
//!    `--seconds` have passed and at least `--total-gib` are acknowledged; every
//!    `--sample-ms` the bench reads each broker's resident memory from `/proc`, and prints the
//!    throughput and memory of every 10 s window. The sustained figure is the records
//!    acknowledged in the first `--seconds`, beside one third of the disk's 4-stream figure
//!    (each record is written and fsynced by all three replicas on this one disk).
//! 3. Broker 3 is killed with SIGKILL; the producer writes for `--down-s` more seconds to the
//!    two that are left; broker 3 starts again on its directory. Printed: how long until it
//!    listens, and until Metadata names it in the in-sync replicas of every partition (it has
//!    fetched what it missed). Then every partition's high watermark is checked to hold every
//!    acknowledged record.
//!
//! The disk must hold three replicas of everything written, checked before the run and while it
//! writes. `--retention-bytes` gives the topic a size limit (and the brokers a 5 s retention
//! pass), so a long run at a high rate fits, and retention's deletions run under the load.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Args;
use rdkafka::producer::Producer;

use crate::brokers::{self, Brokers, Memory, TopicSpec};
use crate::cluster::{self, LoadArgs};
use crate::disk::{self, DiskFigures};

const TOPIC: &str = "soak";
/// Seconds per printed window.
const WINDOW_S: u64 = 10;
/// The broker killed and restarted.
const RESTARTED: i32 = 3;
/// Longest wait for the restarted broker to rejoin every partition's ISR.
const REJOIN_TIMEOUT: Duration = Duration::from_secs(120);
/// The soak stops writing, with an error, when less than this is free on the disk: the
/// writes while broker 3 is down and its restart need room, and a disk that fills would
/// measure the brokers' full-disk path instead of their sustained rate.
const FREE_BYTES_MIN: u64 = 6 << 30;
/// The three replicas' logs take a little more than three times the record values (batch
/// and segment headers, indexes).
const STORED_PER_VALUE_BYTE: f64 = 3.3;
/// `segment.bytes` of the topic when `--retention-bytes` is set.
const SEGMENT_BYTES: u64 = 64 << 20;
/// The brokers' retention pass interval when `--retention-bytes` is set (the default, 30 s, would
/// let each replica hold 30 s of writes beyond its retention).
const RETENTION_CHECK_MS: u64 = 5_000;
/// Writes a replica takes per second at most, for the space a retention interval needs: more than
/// a third of any disk this bench has met (every replica shares the one disk).
const REPLICA_BYTES_PER_S_MAX: u64 = 600 << 20;

#[derive(Args, Debug, Clone)]
pub struct SoakArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// The sustained window: throughput is reported over these first seconds.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Keep writing until at least this much is acknowledged (GiB of record values).
    #[arg(long, default_value_t = 10.0)]
    pub total_gib: f64,
    /// How often each broker's memory is read.
    #[arg(long, default_value_t = 1000)]
    pub sample_ms: u64,
    /// Seconds the producer keeps writing while broker 3 is down.
    #[arg(long, default_value_t = 5)]
    pub down_s: u64,
    /// The topic's `retention.bytes` (per partition replica; 0: none), so a run at a rate the
    /// disk cannot hold for `--seconds` still fits: retention deletes whole segments meanwhile
    /// (the topic's segments are then `SEGMENT_BYTES`).
    #[arg(long, default_value_t = 0)]
    pub retention_bytes: u64,
}

struct Window {
    end_s: f64,
    records: u64,
    memory: Vec<(i32, Memory)>,
}

pub fn run(dir: &Path, args: &SoakArgs, runtime: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    cluster::check_load(&args.load)?;
    if args.seconds == 0 || args.sample_ms == 0 || args.total_gib.is_nan() || args.total_gib < 0.0 {
        bail!("--seconds and --sample-ms must be at least 1 and --total-gib not negative");
    }
    let kiln_bin = cluster::kiln_bin(&args.load.kiln_bin)?;
    let free = disk::free_bytes(dir)?;
    let stored = if args.retention_bytes > 0 {
        // Every replica of every partition keeps its retention, the segment being written and
        // one not yet deleted, and a broker's writes between two retention passes on top.
        3 * (args.load.partitions as u64 * (args.retention_bytes + 2 * SEGMENT_BYTES)
            + REPLICA_BYTES_PER_S_MAX * RETENTION_CHECK_MS / 1000)
    } else {
        (args.total_gib * (1u64 << 30) as f64 * STORED_PER_VALUE_BYTE) as u64
    };
    let needed = stored + FREE_BYTES_MIN;
    if free < needed {
        bail!(
            "--total-gib {} with --retention-bytes {} needs about {:.1} GiB free in {} (three \
             replicas, and {} GiB to spare); {:.1} GiB are free: lower --total-gib, set \
             --retention-bytes or use --dir on a larger disk",
            args.total_gib,
            args.retention_bytes,
            needed as f64 / (1u64 << 30) as f64,
            dir.display(),
            FREE_BYTES_MIN >> 30,
            free as f64 / (1u64 << 30) as f64
        );
    }
    let d = disk::measure(dir, &disk::DiskArgs::default())?;
    disk::print(&d);

    let tmp = tempfile::tempdir_in(dir)?;
    let extra = if args.retention_bytes > 0 {
        format!("retention_check_interval_ms = {RETENTION_CHECK_MS}\n")
    } else {
        String::new()
    };
    let mut brokers = Brokers::start_cluster(&kiln_bin, tmp.path(), 3, &extra)?;
    let result = soak(&mut brokers, args, &d, dir, runtime);
    brokers.kill_all();
    result
}

fn soak(
    brokers: &mut Brokers,
    args: &SoakArgs,
    d: &DiskFigures,
    dir: &Path,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    let load = &args.load;
    let retention = args.retention_bytes.to_string();
    let segment = SEGMENT_BYTES.to_string();
    let configs: Vec<(&str, &str)> = if args.retention_bytes > 0 {
        vec![("retention.bytes", &retention), ("segment.bytes", &segment)]
    } else {
        Vec::new()
    };
    let spec = TopicSpec {
        name: TOPIC,
        partitions: load.partitions,
        replication_factor: 3,
        configs: &configs,
    };
    let ready = Duration::from_secs(load.ready_timeout_s);
    let (bootstrap, leaders) = cluster::prepare(brokers, &spec, ready, runtime)?;
    let producer = cluster::producer(&bootstrap, load)?;
    cluster::warm_up(&producer, brokers, TOPIC, load, Instant::now() + ready)?;
    producer.context().reset();
    println!(
        "soak  3 brokers, RF 3, {} partitions (leaders {leaders:?}), {} B records, acks=all, \
         idempotence {}, at most {} in flight",
        load.partitions, load.record_bytes, load.idempotence, load.in_flight
    );
    let start = Instant::now();
    let total_records = (args.total_gib * (1u64 << 30) as f64 / load.record_bytes as f64) as u64;
    let sustained = Duration::from_secs(args.seconds);
    let sample = Duration::from_millis(args.sample_ms);
    let mut next_sample = start;
    let mut windows: Vec<Window> = Vec::new();
    let mut acked_at_sustained: Option<u64> = None;
    let mut peak_rss = vec![0u64; brokers.procs.len()];
    let mut failure: Option<anyhow::Error> = None;
    let sent = cluster::drive(&producer, TOPIC, load, "soak", &mut |sent, ctx| {
        if !sent.is_multiple_of(256) {
            return false;
        }
        let now = Instant::now();
        if now < next_sample {
            return false;
        }
        next_sample = now + sample;
        let acked = ctx.ok.load(Ordering::Relaxed);
        let memory = brokers.memory_kib();
        for (slot, (_, m)) in peak_rss.iter_mut().zip(&memory) {
            *slot = (*slot).max(m.rss_kib);
        }
        if let Err(e) = brokers.check_alive() {
            failure = Some(e);
            return true;
        }
        match disk::free_bytes(dir) {
            Ok(free) if free < FREE_BYTES_MIN => {
                failure = Some(anyhow::anyhow!(
                    "stopped writing with {:.1} GiB free in {} after {:.2} GiB acknowledged (the \
                     rate was higher than --total-gib allowed for): lower --seconds or use a \
                     larger disk",
                    free as f64 / (1u64 << 30) as f64,
                    dir.display(),
                    (acked * load.record_bytes as u64) as f64 / (1u64 << 30) as f64
                ));
                return true;
            }
            Ok(_) => {}
            Err(e) => {
                failure = Some(e);
                return true;
            }
        }
        let elapsed = now - start;
        if acked_at_sustained.is_none() && elapsed >= sustained {
            acked_at_sustained = Some(acked);
        }
        let window_end = (windows.len() as u64 + 1) * WINDOW_S;
        if elapsed.as_secs() >= window_end {
            let before: u64 = windows.iter().map(|w| w.records).sum();
            let w = Window {
                end_s: elapsed.as_secs_f64(),
                records: acked - before,
                memory,
            };
            print_window(&w, windows.last().map_or(0.0, |l| l.end_s));
            windows.push(w);
        }
        elapsed >= sustained && acked >= total_records
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    cluster::finish(&producer, brokers, "soak", sent)?;
    let elapsed = start.elapsed().as_secs_f64();
    let acked = producer.context().ok.load(Ordering::Relaxed);
    let mib = |records: u64| (records * load.record_bytes as u64) as f64 / (1u64 << 20) as f64;
    let in_window = acked_at_sustained.unwrap_or(acked);
    let window_s = args.seconds as f64;
    let third = d.parallel_bandwidth_mib_s / 3.0;
    println!(
        "soak  first {} s: {:.0} records/s, {:.1} MiB/s; one third of the disk's {}-stream \
         fsync'd bandwidth is {:.1} MiB/s: ratio {:.0}%",
        args.seconds,
        in_window as f64 / window_s,
        mib(in_window) / window_s,
        d.streams,
        third,
        100.0 * mib(in_window) / window_s / third
    );
    println!(
        "soak  in all: {acked} records ({:.2} GiB) acknowledged in {elapsed:.1} s ({:.0} records/s)",
        mib(acked) / 1024.0,
        acked as f64 / elapsed
    );
    for ((id, m), sampled) in brokers.memory_kib().into_iter().zip(&peak_rss) {
        println!(
            "soak  broker {id}: RSS now {:.0} MiB, peak sampled {:.0} MiB, peak (VmHWM) {:.0} MiB, \
             data {:.2} GiB",
            m.rss_kib as f64 / 1024.0,
            *sampled as f64 / 1024.0,
            m.peak_kib as f64 / 1024.0,
            crate::disk::dir_bytes(&brokers.procs[brokers.index_of(id)?].data_dir)? as f64
                / (1u64 << 30) as f64
        );
    }

    let down_acked = restart(brokers, &producer, args, &bootstrap)?;
    let expected = load.partitions as u64 + acked + down_acked;
    check_watermarks(
        &producer,
        load.partitions,
        expected,
        args.retention_bytes > 0,
    )
}

fn print_window(w: &Window, from_s: f64) {
    let memory: Vec<String> = w
        .memory
        .iter()
        .map(|(id, m)| format!("b{id} {:.0} MiB", m.rss_kib as f64 / 1024.0))
        .collect();
    println!(
        "soak  {:>5.0}-{:<5.0} s {:>9.0} records/s   RSS {}",
        from_s,
        w.end_s,
        w.records as f64 / (w.end_s - from_s).max(1e-3),
        memory.join(", ")
    );
}

/// Kills broker 3, writes `--down-s` seconds without it, restarts it and times its return;
/// returns the records acknowledged while it was down.
fn restart(
    brokers: &mut Brokers,
    producer: &rdkafka::producer::BaseProducer<cluster::BenchContext>,
    args: &SoakArgs,
    bootstrap: &str,
) -> anyhow::Result<u64> {
    let load = &args.load;
    let held = crate::disk::dir_bytes(&brokers.procs[brokers.index_of(RESTARTED)?].data_dir)?;
    brokers.kill(RESTARTED)?;
    println!(
        "soak  broker {RESTARTED} killed (SIGKILL) holding {:.2} GiB; writing {} s without it",
        held as f64 / (1u64 << 30) as f64,
        args.down_s
    );
    producer.context().reset();
    let until = Instant::now() + Duration::from_secs(args.down_s);
    let sent = cluster::drive(
        producer,
        TOPIC,
        load,
        "soak (one broker down)",
        &mut |_, _| Instant::now() >= until,
    )?;
    let down_acked = {
        producer
            .flush(Duration::from_secs(120))
            .map_err(|e| anyhow::anyhow!("flushing while broker {RESTARTED} is down: {e}"))?;
        producer.context().ok.load(Ordering::Relaxed)
    };
    if down_acked != sent {
        bail!(
            "with broker {RESTARTED} down, {down_acked} of {sent} records acknowledged (first \
             error: {})",
            producer
                .context()
                .first_error()
                .unwrap_or_else(|| "none".into())
        );
    }
    println!("soak  {down_acked} records acknowledged by the other two");
    let started = Instant::now();
    brokers.restart(RESTARTED)?;
    brokers.wait_listening_one(RESTARTED, started + REJOIN_TIMEOUT)?;
    let listening = started.elapsed();
    let admin = brokers::admin_client(bootstrap)?;
    let rejoined = loop {
        brokers.check_alive()?;
        let md = admin
            .inner()
            .fetch_metadata(Some(TOPIC), Duration::from_secs(5));
        let in_every = md.ok().is_some_and(|md| {
            md.topics().iter().any(|t| {
                t.name() == TOPIC
                    && t.partitions().len() == load.partitions as usize
                    && t.partitions().iter().all(|p| p.isr().contains(&RESTARTED))
            })
        });
        if in_every {
            break started.elapsed();
        }
        if started.elapsed() >= REJOIN_TIMEOUT {
            bail!(
                "broker {RESTARTED} was not back in every partition's ISR after {} s\n{}",
                REJOIN_TIMEOUT.as_secs(),
                brokers.log_tails()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    println!(
        "soak  restart of broker {RESTARTED}: listening after {:.3} s, in the ISR of all {} \
         partitions after {:.3} s",
        listening.as_secs_f64(),
        load.partitions,
        rejoined.as_secs_f64()
    );
    Ok(down_acked)
}

/// The partitions' high watermarks together cover every acknowledged record (`expected`, the
/// warm-up's included); more only if the producer's retries wrote some twice (idempotence
/// off).
fn check_watermarks(
    producer: &rdkafka::producer::BaseProducer<cluster::BenchContext>,
    partitions: i32,
    expected: u64,
    retention: bool,
) -> anyhow::Result<()> {
    let mut total = 0i64;
    for p in 0..partitions {
        let (low, high) = producer
            .client()
            .fetch_watermarks(TOPIC, p, Duration::from_secs(10))
            .map_err(|e| anyhow::anyhow!("ListOffsets of {TOPIC}/{p}: {e}"))?;
        // Without retention nothing may be gone; with it the log start moves, and the high
        // watermark still counts every record ever written.
        if low != 0 && !retention {
            bail!("{TOPIC}/{p}: log start {low}, but nothing was deleted");
        }
        if low < 0 || low > high {
            bail!("{TOPIC}/{p}: log start {low} is not within 0..={high}");
        }
        total += high;
    }
    let total = u64::try_from(total).unwrap_or(0);
    if total < expected {
        bail!("the high watermarks sum to {total} records, but {expected} were acknowledged");
    }
    println!(
        "soak  high watermarks sum to {total} records; {expected} were acknowledged (warm-up \
         included): none lost, {} written more than once",
        total - expected
    );
    Ok(())
}
