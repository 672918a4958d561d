//! Failover: how long a partition takes no write after its leader dies, and whether a cluster
//! that is merely loaded elects anyone it need not.
//!
//! On a fresh cluster of three `kiln broker` processes (the shipped Raft timings), one topic of
//! `--partitions` partitions at RF 3 (10 s retention looked at every 5 s, 64 MiB segments, so
//! that a loaded minute does not fill the disk), with a live producer (librdkafka, acks=all, idempotent,
//! 1 KiB records) writing to it throughout:
//! 1. **Loaded, nothing failing.** For `--quiet-s` seconds the live producer writes at
//!    `--quiet-rate` records/s (`max`: as fast as it goes). Printed: records/s, and the sum over
//!    the brokers of `kiln_leader_changes_total` and `kiln_leader_lease_lapses_total` at the
//!    start and the end. Every leader change in that window is needless: nothing failed.
//! 2. **Kills.** `--kills` times, with the live producer at `--kill-rate`: the leader of
//!    partition `k mod partitions` (per Metadata) is killed with SIGKILL, and two probes time
//!    the kill to the first write a new leader acknowledges on that partition:
//!    * the cluster's figure: a client of Kiln's own (`kiln-client`) asks the survivors'
//!      Metadata every 10 ms and, once one names another leader, writes one record there
//!      (acks=all) until one is acknowledged; it also notes when a leader was first named;
//!    * a client's figure: a librdkafka producer with its default settings, which wrote to the
//!      partition just before the kill, writes one record at a time until one is acknowledged.
//!      librdkafka finds a new leader on its own schedule (a partition whose leader is down is
//!      looked up again on its once-a-second topic scan), which this figure includes.
//!
//!    The victim is then restarted on its directory, and the next kill waits until every
//!    partition is led with every replica in sync.
//!
//! Printed: the median, p90, p99 and max (nearest rank) of each.
//! The run fails if a partition takes no write within `--probe-timeout-s` of a kill, a broker
//! exits, or the live producer loses a record.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Args;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    MetadataRequest, ProduceRequest, RequestKind, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use crate::brokers::{self, Brokers, TopicSpec};
use crate::cluster::{self, BenchContext, Live, LoadArgs};

const TOPIC: &str = "failover";
const RECORD_BYTES: usize = 1024;
/// How often the direct probe asks the survivors' Metadata after a kill.
const DIRECT_POLL: Duration = Duration::from_millis(10);
/// Longest one request of the direct probe may take.
const DIRECT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the probe polls its producer for the delivery report.
const PROBE_POLL: Duration = Duration::from_millis(1);
/// Longest wait, after a restart, for every partition to be led with every replica in sync.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause after the cluster settled, before the next kill: the leader balance may still hand a
/// partition back to the restarted broker, and a kill in the middle of a handover measures
/// the handover.
const SETTLE_PAUSE: Duration = Duration::from_secs(2);
/// The leader changes metric (every replica's changes of leader, summed per broker).
const LEADER_CHANGES: &str = "kiln_leader_changes_total";
const LEASE_LAPSES: &str = "kiln_leader_lease_lapses_total";

#[derive(Args, Debug, Clone)]
pub struct FailoverArgs {
    /// The `kiln` binary the brokers run.
    #[arg(long, default_value = "target/release/kiln")]
    pub kiln_bin: std::path::PathBuf,
    #[arg(long, default_value_t = 3)]
    pub partitions: i32,
    /// Seconds of load with nothing failing, over which leader changes are counted (0: skip).
    #[arg(long, default_value_t = 60)]
    pub quiet_s: u64,
    /// The live producer's rate while nothing fails, records/s (`max`: unpaced).
    #[arg(long, default_value = "max")]
    pub quiet_rate: String,
    /// Leaders killed.
    #[arg(long, default_value_t = 30)]
    pub kills: u32,
    /// The live producer's rate during the kills, records/s (`max`: unpaced).
    #[arg(long, default_value = "10000")]
    pub kill_rate: String,
    /// A partition that took no write this long after its leader's kill fails the run.
    #[arg(long, default_value_t = 20)]
    pub probe_timeout_s: u64,
    /// Longest wait for the brokers to listen, the cluster to form and the topic to be led.
    #[arg(long, default_value_t = 60)]
    pub ready_timeout_s: u64,
    /// Keep the run's directory (the brokers' data and logs) instead of removing it; its path
    /// is printed.
    #[arg(long)]
    pub keep: bool,
}

/// One kill's figures, each from the kill.
struct Kill {
    victim: i32,
    partition: i32,
    /// The direct probe's first acknowledged write, and when Metadata first named a leader.
    direct: Duration,
    named: Duration,
    /// librdkafka's first acknowledged write.
    rdkafka: Duration,
}

pub fn run(
    dir: &Path,
    args: &FailoverArgs,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    let quiet_rate = rate(&args.quiet_rate, "--quiet-rate")?;
    let kill_rate = rate(&args.kill_rate, "--kill-rate")?;
    if args.partitions < 1 || args.probe_timeout_s == 0 {
        bail!("--partitions and --probe-timeout-s must be at least 1");
    }
    let kiln_bin = cluster::kiln_bin(&args.kiln_bin)?;
    let tmp = tempfile::tempdir_in(dir)?;
    // Retention looked at every 5 s (30 s by default), so the disk holds at most seconds of
    // the load.
    let mut brokers = Brokers::start_cluster(
        &kiln_bin,
        tmp.path(),
        3,
        "retention_check_interval_ms = 5000\n",
    )?;
    let result = measure(&mut brokers, args, quiet_rate, kill_rate, runtime);
    brokers.kill_all();
    if args.keep {
        println!("kept {}", tmp.keep().display());
    }
    result
}

fn rate(text: &str, flag: &str) -> anyhow::Result<Option<u64>> {
    match text.trim() {
        "max" => Ok(None),
        n => match n.parse::<u64>() {
            Ok(r) if r > 0 => Ok(Some(r)),
            _ => bail!("{flag}: {n:?} is neither a positive number nor max"),
        },
    }
}

fn measure(
    brokers: &mut Brokers,
    args: &FailoverArgs,
    quiet_rate: Option<u64>,
    kill_rate: Option<u64>,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(args.ready_timeout_s);
    brokers.wait_listening(deadline)?;
    let bootstrap = brokers.bootstrap();
    brokers::wait_brokers_listed(brokers, &bootstrap, deadline)?;
    brokers::wait_formed(brokers, runtime, deadline)?;
    let spec = TopicSpec {
        name: TOPIC,
        partitions: args.partitions,
        replication_factor: 3,
        // A loaded minute writes about 12 GiB over the three replicas: retention keeps the
        // disk from filling (a full disk stalls every write, which is not what is measured).
        configs: &[("retention.ms", "10000"), ("segment.bytes", "67108864")],
    };
    brokers::create_topic(brokers, runtime, &bootstrap, &spec, deadline)?;
    brokers::wait_leaders(brokers, &bootstrap, TOPIC, args.partitions, deadline)?;
    settle(brokers, &bootstrap, args.partitions)?;

    if args.quiet_s > 0 {
        quiet(brokers, &bootstrap, args, quiet_rate)?;
    }
    if args.kills > 0 {
        let kills = kill_leaders(brokers, &bootstrap, args, kill_rate, runtime)?;
        print_kills(&kills, kill_rate);
    }
    Ok(())
}

fn live_load(partitions: i32) -> LoadArgs {
    LoadArgs {
        kiln_bin: std::path::PathBuf::new(),
        record_bytes: RECORD_BYTES,
        partitions,
        linger_ms: 5,
        batch_bytes: 1_000_000,
        in_flight: 10_000,
        ready_timeout_s: 60,
        idempotence: true,
    }
}

fn rate_name(rate: Option<u64>) -> String {
    rate.map_or_else(|| "max".to_string(), |r| r.to_string())
}

/// Phase 1: load with nothing failing; every leader change counted is needless.
fn quiet(
    brokers: &mut Brokers,
    bootstrap: &str,
    args: &FailoverArgs,
    rate: Option<u64>,
) -> anyhow::Result<()> {
    let live = Live::start(bootstrap, TOPIC, live_load(args.partitions), rate)?;
    // The first second is the producer's start; the window begins once it writes.
    std::thread::sleep(Duration::from_secs(1));
    let ids: Vec<i32> = brokers.procs.iter().map(|p| p.id).collect();
    let count = |brokers: &Brokers, family: &str| -> anyhow::Result<Vec<f64>> {
        ids.iter().map(|&id| brokers.scrape(id, family)).collect()
    };
    let changes_before = count(brokers, LEADER_CHANGES)?;
    let lapses_before = count(brokers, LEASE_LAPSES)?;
    let acked_before = live.acknowledged();
    let started = Instant::now();
    let window = Duration::from_secs(args.quiet_s);
    while started.elapsed() < window {
        brokers.check_alive()?;
        std::thread::sleep(Duration::from_millis(500));
    }
    let seconds = started.elapsed().as_secs_f64();
    let acked = live.acknowledged() - acked_before;
    let changes_after = count(brokers, LEADER_CHANGES)?;
    let lapses_after = count(brokers, LEASE_LAPSES)?;
    live.stop(brokers)?;
    let delta = |a: &[f64], b: &[f64]| -> Vec<i64> {
        a.iter()
            .zip(b)
            .map(|(x, y)| (y - x).round() as i64)
            .collect()
    };
    let changes = delta(&changes_before, &changes_after);
    let lapses = delta(&lapses_before, &lapses_after);
    println!(
        "loaded, nothing failing: {seconds:.0} s at rate {} ({:.0} records/s acknowledged); \
         leader changes per broker {changes:?} (total {}), lease lapses per broker {lapses:?} \
         (total {})",
        rate_name(rate),
        acked as f64 / seconds,
        changes.iter().sum::<i64>(),
        lapses.iter().sum::<i64>(),
    );
    Ok(())
}

/// Phase 2: kill the leader of each partition in turn; returns each kill's figures.
fn kill_leaders(
    brokers: &mut Brokers,
    bootstrap: &str,
    args: &FailoverArgs,
    rate: Option<u64>,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<Vec<Kill>> {
    let live = Live::start(bootstrap, TOPIC, live_load(args.partitions), rate)?;
    let probe = probe_producer(bootstrap)?;
    let limit = Duration::from_secs(args.probe_timeout_s);
    let batch = crate::produce::encode_batch(1, 64)?;
    let addrs: BTreeMap<i32, String> = brokers
        .procs
        .iter()
        .map(|p| (p.id, p.kafka.clone()))
        .collect();
    let mut kills = Vec::new();
    for k in 0..args.kills {
        let partition = i32::try_from(k).unwrap_or(0) % args.partitions;
        let victim = leader_of(&metadata_client(bootstrap)?, partition)?;
        // Connected, leader known, one write taken: the figure holds no client start-up.
        let warm = write_one(&probe, partition, Instant::now(), limit)
            .with_context(|| format!("kill {}: the probe's write before the kill", k + 1))?;
        if warm.is_none() {
            bail!(
                "kill {}: the probe could not write to partition {partition}",
                k + 1
            );
        }
        let mut survivors = addrs.clone();
        survivors.remove(&victim);
        let (t_kill, killed_at) = (Instant::now(), unix_s());
        brokers.kill(victim)?;
        let direct = runtime.spawn(direct_probe(
            survivors,
            partition,
            victim,
            batch.clone(),
            t_kill,
            limit,
        ));
        let rdkafka = write_one(&probe, partition, t_kill, limit)?;
        let direct = runtime
            .block_on(direct)
            .context("the direct probe panicked")?;
        let (Some(rdkafka), Some((named, direct))) = (rdkafka, direct) else {
            bail!(
                "kill {}: partition {partition} took no write within {limit:?} of broker {victim}'s kill\n{}",
                k + 1,
                brokers.log_tails()
            );
        };
        println!(
            "  kill {:>2} at {killed_at:.3} (Unix s): broker {victim}, leader of {TOPIC}/{partition}: leader named after {:.3} s, write acknowledged after {:.3} s (kiln-client), {:.3} s (librdkafka)",
            k + 1,
            named.as_secs_f64(),
            direct.as_secs_f64(),
            rdkafka.as_secs_f64(),
        );
        kills.push(Kill {
            victim,
            partition,
            direct,
            named,
            rdkafka,
        });
        brokers.restart(victim)?;
        brokers.wait_listening_one(victim, Instant::now() + SETTLE_TIMEOUT)?;
        settle(brokers, bootstrap, args.partitions)?;
    }
    live.stop(brokers)?;
    Ok(kills)
}

/// Waits until every partition is led and every replica in sync (asked of every broker in
/// turn, through the bootstrap list), then [`SETTLE_PAUSE`].
fn settle(brokers: &mut Brokers, bootstrap: &str, partitions: i32) -> anyhow::Result<()> {
    let client = metadata_client(bootstrap)?;
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        brokers.check_alive()?;
        let last = match client.fetch_metadata(Some(TOPIC), Duration::from_secs(5)) {
            Ok(md) => {
                let settled = md.topics().first().is_some_and(|t| {
                    t.partitions().len() == usize::try_from(partitions).unwrap_or(0)
                        && t.partitions()
                            .iter()
                            .all(|p| p.leader() >= 0 && p.isr().len() == p.replicas().len())
                });
                if settled {
                    std::thread::sleep(SETTLE_PAUSE);
                    return Ok(());
                }
                format!("{:?}", md.topics().first().map(|t| t.partitions().len()))
            }
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            bail!(
                "partitions not led with every replica in sync within {SETTLE_TIMEOUT:?} ({last})\n{}",
                brokers.log_tails()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn metadata_client(bootstrap: &str) -> anyhow::Result<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .create()
        .context("creating a metadata client")
}

fn leader_of(client: &BaseConsumer, partition: i32) -> anyhow::Result<i32> {
    let md = client
        .fetch_metadata(Some(TOPIC), Duration::from_secs(5))
        .context("fetching metadata")?;
    let leader = md
        .topics()
        .first()
        .and_then(|t| t.partitions().iter().find(|p| p.id() == partition))
        .map(|p| p.leader())
        .context("partition not in the metadata")?;
    if leader < 0 {
        bail!("{TOPIC}/{partition} has no leader");
    }
    Ok(leader)
}

/// A producer with librdkafka's default settings: what a client meets.
fn probe_producer(bootstrap: &str) -> anyhow::Result<BaseProducer<BenchContext>> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .create_with_context(BenchContext::new()?)
        .context("creating the probe producer")
}

/// Writes one record at a time to `partition` until one is acknowledged or `limit` passed
/// since `t0`; the time from `t0` to that acknowledgement.
fn write_one(
    probe: &BaseProducer<BenchContext>,
    partition: i32,
    t0: Instant,
    limit: Duration,
) -> anyhow::Result<Option<Duration>> {
    let payload = [0x70u8; 64];
    let ctx = probe.context();
    while t0.elapsed() < limit {
        let (ok, reported) = (ctx.ok.load(Ordering::Relaxed), ctx.reported());
        let record = BaseRecord::<(), [u8], usize>::with_opaque_to(TOPIC, 0)
            .payload(&payload[..])
            .partition(partition);
        if let Err((e, _)) = probe.send(record) {
            bail!("probe produce to {TOPIC}/{partition}: {e}");
        }
        while ctx.reported() == reported && t0.elapsed() < limit {
            probe.poll(PROBE_POLL);
        }
        if ctx.ok.load(Ordering::Relaxed) > ok {
            return Ok(Some(t0.elapsed()));
        }
    }
    // What is still queued must not land after the next kill's clock starts.
    let _ = probe.flush(Duration::from_secs(30));
    Ok(None)
}

/// The cluster's side of a failover: every [`DIRECT_POLL`], the survivors' Metadata is asked
/// for the partition's leader; once one names a broker other than the victim, one record is
/// written there (acks=all). Returns, from `t0`, when a leader was first named and when a
/// write was first acknowledged (None: not within `limit`).
async fn direct_probe(
    survivors: BTreeMap<i32, String>,
    partition: i32,
    victim: i32,
    batch: Bytes,
    t0: Instant,
    limit: Duration,
) -> Option<(Duration, Duration)> {
    let bootstrap: Vec<&str> = survivors.values().map(String::as_str).collect();
    let mut client = kiln_client::admin::Cluster::new(bootstrap.join(","), DIRECT_REQUEST_TIMEOUT);
    let topic = TopicName(StrBytes::from_static_str(TOPIC));
    let mut named = None;
    while t0.elapsed() < limit {
        for addr in survivors.values() {
            let asked = client
                .call(
                    addr,
                    RequestKind::Metadata(MetadataRequest::default().with_topics(Some(vec![
                        MetadataRequestTopic::default().with_name(Some(topic.clone())),
                    ]))),
                )
                .await;
            let Ok(ResponseKind::Metadata(m)) = asked else {
                continue;
            };
            let leader = m
                .topics
                .iter()
                .flat_map(|t| t.partitions.iter())
                .find(|p| p.partition_index == partition)
                .map_or(-1, |p| p.leader_id.0);
            let Some(at) = survivors.get(&leader).filter(|_| leader != victim) else {
                continue;
            };
            let named_at = *named.get_or_insert_with(|| t0.elapsed());
            let request = ProduceRequest::default()
                .with_acks(-1)
                .with_timeout_ms(
                    i32::try_from(DIRECT_REQUEST_TIMEOUT.as_millis()).unwrap_or(i32::MAX),
                )
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(topic.clone())
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(partition)
                        .with_records(Some(batch.clone()))])]);
            if let Ok(ResponseKind::Produce(r)) =
                client.call(at, RequestKind::Produce(request)).await
            {
                let ok = r
                    .responses
                    .iter()
                    .flat_map(|t| t.partition_responses.iter())
                    .all(|p| p.error_code == 0);
                if ok {
                    return Some((named_at, t0.elapsed()));
                }
            }
        }
        tokio::time::sleep(DIRECT_POLL).await;
    }
    None
}

/// Seconds since the Unix epoch, to find a kill in the brokers' logs.
fn unix_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The value at quantile `q` of sorted `v` (nearest rank).
fn nearest_rank(v: &[Duration], q: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

fn print_kills(kills: &[Kill], rate: Option<u64>) {
    let s = |d: Duration| format!("{:.3}", d.as_secs_f64());
    let row = |name: &str, pick: &dyn Fn(&Kill) -> Duration| {
        let mut v: Vec<Duration> = kills.iter().map(pick).collect();
        v.sort();
        println!(
            "  {name:<34} {:>7} {:>7} {:>7} {:>7}",
            s(nearest_rank(&v, 0.5)),
            s(nearest_rank(&v, 0.9)),
            s(nearest_rank(&v, 0.99)),
            s(v.last().copied().unwrap_or_default())
        );
    };
    let mut victims = [0u32; 3];
    for k in kills {
        if let Some(n) = usize::try_from(k.victim - 1)
            .ok()
            .and_then(|i| victims.get_mut(i))
        {
            *n += 1;
        }
    }
    let partitions: std::collections::BTreeSet<i32> = kills.iter().map(|k| k.partition).collect();
    println!(
        "failover over {} kills (live producer at rate {}; brokers killed {:?} times; partitions {:?}), seconds from the kill:",
        kills.len(),
        rate_name(rate),
        victims,
        partitions
    );
    println!(
        "  {:<34} {:>7} {:>7} {:>7} {:>7}",
        "", "median", "p90", "p99", "max"
    );
    row("leader named in Metadata", &|k| k.named);
    row("write acknowledged (kiln-client)", &|k| k.direct);
    row("write acknowledged (librdkafka)", &|k| k.rdkafka);
}
