//! Partition scale: what thousands of replicated partitions cost three brokers.
//!
//! For each N in `--counts` (300, 1,000 and 3,000 unless told), on a fresh cluster of three
//! `kiln broker` processes:
//! 1. one topic of N partitions at RF 3 is created; printed: the time from CreateTopics to
//!    every partition led;
//! 2. the cluster is left idle for `--idle-s` seconds; printed per broker: CPU % over that time
//!    (`/proc/<pid>/stat`, user plus system, of one core), resident memory, threads and open
//!    file descriptors;
//! 3. one librdkafka producer (acks=all) writes 1 KiB records round-robin over all N
//!    partitions for `--produce-s` seconds; printed: records and MiB per second;
//! 4. the broker leading the most partitions (about a third) is killed with SIGKILL; printed:
//!    for its partitions, the time until Metadata names another leader (median and max);
//! 5. every partition's high watermark, read from the two survivors, is checked to hold every
//!    record acknowledged to it (the run fails otherwise).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::Producer;

use crate::brokers::{self, Brokers, TopicSpec};
use crate::cluster::{self, LoadArgs};

const TOPIC: &str = "scale";
/// Longest wait for every partition of the killed broker to be led elsewhere.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(60);
/// How often Metadata is asked during the failover.
const FAILOVER_POLL: Duration = Duration::from_millis(50);
/// Longest a partition's high watermark is asked for after the kill.
const WATERMARK_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Args, Debug, Clone)]
pub struct PartitionsArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// Partition counts to measure, each on a fresh cluster.
    #[arg(long, value_delimiter = ',', default_value = "300,1000,3000")]
    pub counts: Vec<i32>,
    /// Seconds the cluster is left idle while its CPU is measured.
    #[arg(long, default_value_t = 30)]
    pub idle_s: u64,
    /// Seconds of produce load spread over all partitions.
    #[arg(long, default_value_t = 10)]
    pub produce_s: u64,
    /// Keep each run's directory (the brokers' data and logs) instead of removing it; its path
    /// is printed.
    #[arg(long)]
    pub keep: bool,
}

/// One broker process's cost, read from `/proc`.
#[derive(Debug, Clone, Copy, Default)]
struct ProcessCost {
    cpu_percent: f64,
    rss_mib: f64,
    threads: u64,
    fds: u64,
}

struct Figures {
    partitions: i32,
    create: Duration,
    /// From every partition led to every partition led by its preferred replica, and how many
    /// were led by another broker at first.
    balance: Duration,
    unbalanced: usize,
    idle: Vec<(i32, ProcessCost)>,
    records_per_s: f64,
    mib_per_s: f64,
    killed: i32,
    moved: usize,
    failover_median: Duration,
    failover_max: Duration,
    /// Records acknowledged (the warm-up's included), all found after the kill.
    acknowledged: u64,
}

pub fn run(
    dir: &Path,
    args: &PartitionsArgs,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    if args.counts.is_empty() || args.counts.iter().any(|&n| n < 1) {
        bail!("--counts needs at least one partition count, each at least 1");
    }
    if args.idle_s == 0 || args.produce_s == 0 {
        bail!("--idle-s and --produce-s must be at least 1");
    }
    let kiln_bin = cluster::kiln_bin(&args.load.kiln_bin)?;
    let mut all = Vec::new();
    for &n in &args.counts {
        let tmp = tempfile::tempdir_in(dir)?;
        let mut brokers = Brokers::start_cluster(&kiln_bin, tmp.path(), 3, "")?;
        let figures = measure(&mut brokers, args, n, runtime);
        brokers.kill_all();
        if args.keep {
            println!("kept {}", tmp.keep().display());
        }
        let figures = figures?;
        print_one(&figures);
        all.push(figures);
    }
    println!();
    println!("partitions  create_s  idle_cpu_%_max  rss_mib_max  threads_max  fds_max  records/s  failover_median_s  failover_max_s");
    for f in &all {
        let max = |g: fn(&ProcessCost) -> f64| f.idle.iter().map(|(_, c)| g(c)).fold(0.0, f64::max);
        println!(
            "{:>10}  {:>8.2}  {:>14.1}  {:>11.0}  {:>11.0}  {:>7.0}  {:>9.0}  {:>17.2}  {:>14.2}",
            f.partitions,
            f.create.as_secs_f64(),
            max(|c| c.cpu_percent),
            max(|c| c.rss_mib),
            max(|c| c.threads as f64),
            max(|c| c.fds as f64),
            f.records_per_s,
            f.failover_median.as_secs_f64(),
            f.failover_max.as_secs_f64(),
        );
    }
    Ok(())
}

fn measure(
    brokers: &mut Brokers,
    args: &PartitionsArgs,
    partitions: i32,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<Figures> {
    let ready = Duration::from_secs(args.load.ready_timeout_s);
    let deadline = Instant::now() + ready;
    brokers.wait_listening(deadline)?;
    let bootstrap = brokers.bootstrap();
    brokers::wait_brokers_listed(brokers, &bootstrap, deadline)?;
    brokers::wait_formed(brokers, runtime, deadline)?;
    let spec = TopicSpec {
        name: TOPIC,
        partitions,
        replication_factor: 3,
        configs: &[],
    };
    let started = Instant::now();
    let deadline = started + ready;
    brokers::create_topic(brokers, runtime, &bootstrap, &spec, deadline)?;
    brokers::wait_leaders(brokers, &bootstrap, TOPIC, partitions, deadline)?;
    let create = started.elapsed();
    // Idle cost and failover are measured with the leaders where the topic put them, a third
    // on each broker: the leader balance hands back any partition whose first election went
    // to another replica (after `leader_rebalance_interval_ms`).
    let (leaders, balance, unbalanced) = wait_balanced(&bootstrap, partitions)?;

    let idle = idle_cost(brokers, Duration::from_secs(args.idle_s))?;

    let load = LoadArgs {
        partitions,
        ..args.load.clone()
    };
    let producer = cluster::producer(&bootstrap, &load)?;
    cluster::warm_up(&producer, brokers, TOPIC, &load, Instant::now() + ready)?;
    producer.context().reset();
    let produce_for = Duration::from_secs(args.produce_s);
    let produce_start = Instant::now();
    let sent = cluster::drive(&producer, TOPIC, &load, "partitions", &mut |_, _| {
        produce_start.elapsed() >= produce_for
    })?;
    cluster::finish(&producer, brokers, "partitions", sent)?;
    let elapsed = produce_start.elapsed().as_secs_f64();
    let ok = producer.context().ok.load(Ordering::Relaxed);
    drop(producer);
    let records_per_s = ok as f64 / elapsed;
    let mib_per_s = records_per_s * load.record_bytes as f64 / f64::from(1u32 << 20);

    // The leaders may have moved since creation; ask again.
    let leaders = current_leaders(&bootstrap, partitions).unwrap_or(leaders);
    let killed = busiest(&leaders);
    let (moved, failover_median, failover_max) = failover(brokers, &leaders, killed, partitions)?;
    check_nothing_lost(brokers, killed, partitions, sent)?;
    Ok(Figures {
        partitions,
        create,
        balance,
        unbalanced,
        idle,
        records_per_s,
        mib_per_s,
        killed,
        moved,
        failover_median,
        failover_max,
        acknowledged: sent + partitions as u64,
    })
}

/// Longest wait for every partition to be led by its preferred replica: the leader balance's
/// default interval (30 s) and a second per 64 handovers, with room to spare.
const BALANCE_TIMEOUT: Duration = Duration::from_secs(180);

/// Waits until every partition is led by its preferred replica (the first listed); returns
/// the leaders, the wait, and how many partitions had another leader at first.
fn wait_balanced(bootstrap: &str, partitions: i32) -> anyhow::Result<(Vec<i32>, Duration, usize)> {
    let client = metadata_client(bootstrap)?;
    let start = Instant::now();
    let mut first: Option<usize> = None;
    loop {
        let Leadership {
            leaders,
            elsewhere,
            listed,
        } = leadership(&client, partitions)?;
        let unbalanced = *first.get_or_insert(elsewhere);
        if elsewhere == 0 && listed == leaders.len() {
            return Ok((leaders, start.elapsed(), unbalanced));
        }
        if start.elapsed() >= BALANCE_TIMEOUT {
            bail!(
                "{elsewhere} of {partitions} partitions still led by a broker other than their \
                 preferred replica after {BALANCE_TIMEOUT:?} (the leader balance)"
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The broker id that leads the most partitions.
fn busiest(leaders: &[i32]) -> i32 {
    let mut counts = std::collections::BTreeMap::<i32, usize>::new();
    for &l in leaders {
        *counts.entry(l).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|&(_, n)| n)
        .map(|(id, _)| id)
        .unwrap_or(1)
}

/// Each broker's CPU over `window` of idleness, and its memory, threads and descriptors at
/// the end.
fn idle_cost(brokers: &mut Brokers, window: Duration) -> anyhow::Result<Vec<(i32, ProcessCost)>> {
    let pids = brokers.pids();
    let before: Vec<u64> = pids
        .iter()
        .map(|&(_, pid)| cpu_ticks(pid))
        .collect::<anyhow::Result<_>>()?;
    let started = Instant::now();
    std::thread::sleep(window);
    let seconds = started.elapsed().as_secs_f64();
    brokers.check_alive()?;
    let ticks_per_s = clock_ticks_per_second()?;
    pids.iter()
        .zip(before)
        .map(|(&(id, pid), before)| {
            let used = cpu_ticks(pid)?.saturating_sub(before) as f64 / ticks_per_s;
            let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64;
            Ok((
                id,
                ProcessCost {
                    cpu_percent: 100.0 * used / seconds,
                    rss_mib: field("VmRSS:") as f64 / 1024.0,
                    threads: field("Threads:"),
                    fds,
                },
            ))
        })
        .collect()
}

/// User plus system CPU of a process, in clock ticks (`/proc/<pid>/stat` fields 14 and 15).
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let after = stat
        .rfind(')')
        .map(|at| &stat[at + 1..])
        .context("no command name in /proc/<pid>/stat")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name, field 3 is at 0: utime (14) is at 11 and stime (15) at 12.
    let field = |at: usize| -> anyhow::Result<u64> {
        fields
            .get(at)
            .context("short /proc/<pid>/stat")?
            .parse()
            .context("a non-numeric CPU time in /proc/<pid>/stat")
    };
    Ok(field(11)? + field(12)?)
}

fn clock_ticks_per_second() -> anyhow::Result<f64> {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .context("running getconf CLK_TCK")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse::<f64>()
        .with_context(|| format!("getconf CLK_TCK printed {text:?}"))
}

fn metadata_client(bootstrap: &str) -> anyhow::Result<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .create()
        .context("creating a metadata client")
}

/// The leader of each partition (-1 where none), per Metadata.
fn leaders_from(client: &BaseConsumer, partitions: i32) -> anyhow::Result<Vec<i32>> {
    Ok(leadership(client, partitions)?.leaders)
}

/// What one Metadata answer says of the topic's leadership.
struct Leadership {
    /// Per partition, its leader (-1: none named, or the partition not listed).
    leaders: Vec<i32>,
    /// Partitions led by a broker other than their preferred replica (the first listed).
    elsewhere: usize,
    /// Partitions the answer listed.
    listed: usize,
}

fn leadership(client: &BaseConsumer, partitions: i32) -> anyhow::Result<Leadership> {
    let md = client
        .fetch_metadata(Some(TOPIC), Duration::from_secs(5))
        .context("fetching metadata")?;
    let topic = md.topics().first().context("no topic in the metadata")?;
    let mut leaders = vec![-1; usize::try_from(partitions).unwrap_or(0)];
    let mut elsewhere = 0;
    for p in topic.partitions() {
        if p.replicas().first() != Some(&p.leader()) {
            elsewhere += 1;
        }
        if let Some(slot) = usize::try_from(p.id())
            .ok()
            .and_then(|i| leaders.get_mut(i))
        {
            *slot = p.leader();
        }
    }
    Ok(Leadership {
        leaders,
        elsewhere,
        listed: topic.partitions().len(),
    })
}

/// One broker's Metadata for `partition`, and its high watermark read through that broker
/// alone, as one line.
fn describe_partition(addr: &str, partition: i32) -> String {
    let client = match metadata_client(addr) {
        Ok(c) => c,
        Err(e) => return format!("{e:#}"),
    };
    let md = match client.fetch_metadata(Some(TOPIC), Duration::from_secs(5)) {
        Ok(md) => md,
        Err(e) => return format!("metadata: {e}"),
    };
    let Some(topic) = md.topics().first() else {
        return "no topic in the metadata".to_string();
    };
    let part = topic
        .partitions()
        .iter()
        .find(|p| p.id() == partition)
        .map_or_else(
            || format!("absent ({} partitions listed)", topic.partitions().len()),
            |p| {
                format!(
                    "leader {} error {:?} isr {:?} replicas {:?}",
                    p.leader(),
                    p.error(),
                    p.isr(),
                    p.replicas()
                )
            },
        );
    let brokers: Vec<i32> = md.brokers().iter().map(|b| b.id()).collect();
    let watermarks = client.fetch_watermarks(TOPIC, partition, Duration::from_secs(5));
    format!(
        "topic error {:?}; {part}; brokers {brokers:?}; watermarks {watermarks:?}",
        topic.error()
    )
}

fn current_leaders(bootstrap: &str, partitions: i32) -> anyhow::Result<Vec<i32>> {
    leaders_from(&metadata_client(bootstrap)?, partitions)
}

/// Kills `killed` and waits until each partition it led names another leader; returns how
/// many moved, and the median and longest time to a new leader.
fn failover(
    brokers: &mut Brokers,
    leaders: &[i32],
    killed: i32,
    partitions: i32,
) -> anyhow::Result<(usize, Duration, Duration)> {
    // Ask only the brokers that stay up.
    let survivors: Vec<&str> = brokers
        .procs
        .iter()
        .filter(|p| p.id != killed)
        .map(|p| p.kafka.as_str())
        .collect();
    let client = metadata_client(&survivors.join(","))?;
    let led: Vec<usize> = (0..leaders.len())
        .filter(|&i| leaders[i] == killed)
        .collect();
    let mut moved_at: Vec<Option<Duration>> = vec![None; leaders.len()];
    let start = Instant::now();
    brokers.kill(killed)?;
    loop {
        if let Ok(now) = leaders_from(&client, partitions) {
            let at = start.elapsed();
            for &i in &led {
                if moved_at[i].is_none() && now[i] >= 0 && now[i] != killed {
                    moved_at[i] = Some(at);
                }
            }
        }
        if led.iter().all(|&i| moved_at[i].is_some()) {
            break;
        }
        if start.elapsed() >= FAILOVER_TIMEOUT {
            let left = led.iter().filter(|&&i| moved_at[i].is_none()).count();
            bail!(
                "{left} of {} partitions led by broker {killed} had no new leader after {FAILOVER_TIMEOUT:?}",
                led.len()
            );
        }
        std::thread::sleep(FAILOVER_POLL);
    }
    let mut times: Vec<Duration> = led.iter().filter_map(|&i| moved_at[i]).collect();
    times.sort();
    // The shape, not only the middle and the end: when the last groups elect tells whether
    // elections queue behind each other.
    let deciles: Vec<String> = (1..10)
        .filter_map(|d| times.get(times.len() * d / 10))
        .map(|t| format!("{:.2}", t.as_secs_f64()))
        .collect();
    println!(
        "  failover of {} partitions, deciles (s): {}",
        times.len(),
        deciles.join(" ")
    );
    let median = times.get(times.len() / 2).copied().unwrap_or_default();
    let max = times.last().copied().unwrap_or_default();
    Ok((led.len(), median, max))
}

/// Checks that every partition's high watermark covers what was acknowledged to it: the
/// warm-up's one record and its share of the `sent` records, which went round-robin.
fn check_nothing_lost(
    brokers: &Brokers,
    killed: i32,
    partitions: i32,
    sent: u64,
) -> anyhow::Result<()> {
    let survivors: Vec<&str> = brokers
        .procs
        .iter()
        .filter(|p| p.id != killed)
        .map(|p| p.kafka.as_str())
        .collect();
    let client = metadata_client(&survivors.join(","))?;
    let n = partitions as u64;
    let mut short = Vec::new();
    let (mut retried, mut last_retry) = (0u64, String::new());
    for p in 0..partitions {
        let i = p as u64;
        let acknowledged = 1 + sent / n + u64::from(i < sent % n);
        // A partition between leaders answers with an error for a moment (a client retries):
        // asked again until WATERMARK_TIMEOUT, and how often that happened is printed.
        let asked = Instant::now();
        let high = loop {
            match client.fetch_watermarks(TOPIC, p, Duration::from_secs(10)) {
                Ok((_, high)) => break high,
                Err(e) if asked.elapsed() < WATERMARK_TIMEOUT => {
                    retried += 1;
                    last_retry = format!("partition {p}: {e}");
                    std::thread::sleep(FAILOVER_POLL);
                    // librdkafka's watermark query takes a cached "no leader" (a survivor
                    // that had not yet heard from the new leader when the topic was first
                    // asked) as final and never asks again; it answers UNKNOWN_PARTITION for
                    // as long as the cache lives (`metadata.max.age.ms`, 15 minutes). A
                    // producer refreshes such a partition's metadata itself; this asks for it
                    // the same way. Its errors are the next try's to report.
                    let _ = client.fetch_metadata(Some(TOPIC), Duration::from_secs(10));
                }
                Err(e) => {
                    // What each survivor says of the partition, asked alone: which of them
                    // does not name a leader, or names one that will not answer.
                    for addr in &survivors {
                        println!("  {addr} on partition {p}: {}", describe_partition(addr, p));
                    }
                    return Err(e).with_context(|| {
                        format!("reading partition {p}'s high watermark for {WATERMARK_TIMEOUT:?}")
                    });
                }
            }
        };
        if u64::try_from(high).unwrap_or(0) < acknowledged {
            short.push(format!("{p}: {high} < {acknowledged}"));
        }
    }
    if retried > 0 {
        println!(
            "  reading the high watermarks after the kill: {retried} retries (last: {last_retry})"
        );
    }
    if !short.is_empty() {
        bail!(
            "{} partitions lost acknowledged records after the kill: {}",
            short.len(),
            short.join(", ")
        );
    }
    Ok(())
}

fn print_one(f: &Figures) {
    println!(
        "partitions {}  RF 3 on 3 brokers: created and led in {:.2} s",
        f.partitions,
        f.create.as_secs_f64()
    );
    println!(
        "  leader balance: {} partitions first led by another replica, all on their preferred replica {:.1} s later",
        f.unbalanced,
        f.balance.as_secs_f64()
    );
    for (id, c) in &f.idle {
        println!(
            "  broker {id} idle: cpu {:.1} %  rss {:.0} MiB  threads {}  fds {}",
            c.cpu_percent, c.rss_mib, c.threads, c.fds
        );
    }
    println!(
        "  produce over all partitions: {:.0} records/s ({:.1} MiB/s)",
        f.records_per_s, f.mib_per_s
    );
    println!(
        "  kill -9 broker {} (leading {}): new leader median {:.2} s, max {:.2} s",
        f.killed,
        f.moved,
        f.failover_median.as_secs_f64(),
        f.failover_max.as_secs_f64()
    );
    println!(
        "  after the kill: all {} acknowledged records are below the partitions' high watermarks",
        f.acknowledged
    );
}
